package comm

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/kernels/device"
)

// exchangeCase runs one group on two ranks, each rank's side from its
// device's thread: rank g sends its first half to the other rank and its
// second to itself, plus a transfer of no bytes; it checks what each rank
// received.
func exchangeCase(t *testing.T, devs []device.Device) {
	t.Helper()
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	th := device.NewThreads(devs)
	defer th.Close()
	var s [2]device.Stream
	var src, dst [2]device.Addr
	for g, d := range devs {
		var err error
		s[g], err = d.NewStream()
		ok(err)
		src[g], err = d.Alloc(16)
		ok(err)
		dst[g], err = d.Alloc(16)
		ok(err)
	}
	c, err := OpenComm(th, devs, s[:])
	ok(err)
	ok(th.Each(func(g int) error {
		if err := devs[g].Upload(src[g], []int32{int32(10 * g), int32(10*g + 1), int32(10*g + 2), int32(10*g + 3)}, s[g]); err != nil {
			return err
		}
		sends := []PeerTransfer{{Peer: 1 - g, Buf: src[g], Bytes: 8}, {Peer: g, Buf: src[g] + 8, Bytes: 8}, {Peer: 1 - g}}
		recvs := []PeerTransfer{{Peer: 1 - g, Buf: dst[g], Bytes: 8}, {Peer: g, Buf: dst[g] + 8, Bytes: 8}, {Peer: 1 - g}}
		if err := c.Exchange(g, sends, recvs); err != nil {
			return err
		}
		// the device right after: in its own context (NCCL may have left
		// another current), an allocation is usable on its stream
		p, err := devs[g].Alloc(4)
		if err != nil {
			return err
		}
		return devs[g].Upload(p, []int32{7}, s[g])
	}))
	for g, want := range [][]int32{{10, 11, 2, 3}, {0, 1, 12, 13}} {
		got := make([]int32, 4)
		ok(devs[g].Download(got, dst[g], s[g]))
		if !slices.Equal(got, want) {
			t.Errorf("%s: rank %d received %v, want %v", c.Name(), g, got, want)
		}
	}
	if err := c.Exchange(0, []PeerTransfer{{Peer: 2, Bytes: 4}}, nil); err == nil || !strings.Contains(err.Error(), "rank 0 of 2: a send of 4 bytes with rank 2") {
		t.Errorf("%s: a transfer to a third rank: %v", c.Name(), err)
	}
	ok(c.Close())
}

// brokenExchange: a rank that never calls leaves its peer's receive
// without a send, which fails (the fake NCCL marks the GPU failed, so the
// next synchronization does; Emu says so at once) instead of hanging.
func brokenExchange(t *testing.T, devs []device.Device) error {
	t.Helper()
	th := device.NewThreads(devs)
	defer th.Close()
	var s [2]device.Stream
	var buf [2]device.Addr
	for g, d := range devs {
		var err error
		if s[g], err = d.NewStream(); err != nil {
			t.Fatal(err)
		}
		if buf[g], err = d.Alloc(16); err != nil {
			t.Fatal(err)
		}
	}
	c, err := OpenComm(th, devs, s[:])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return th.Each(func(g int) error {
		if g == 1 {
			return nil // rank 1 skips the group
		}
		if err := c.Exchange(0, nil, []PeerTransfer{{Peer: 1, Buf: buf[0], Bytes: 16}}); err != nil {
			return err
		}
		return devs[0].SyncStream(s[0])
	})
}

// TestCommOnTheFakeNCCL: two GPUs of the fake driver exchange through the
// fake NCCL (which refuses a stream or buffer of the wrong GPU and leaves
// another context current, see fakenccl.c); a device used after NCCL still
// works in its own context.
func TestCommOnTheFakeNCCL(t *testing.T) {
	drv := fakeDriver(t)
	fakeLib(t, "fakenccl", "libnccl.so.2", "MOEBENCH_NCCL")
	var devs []device.Device
	for i := range 2 {
		ctx, err := drv.PrimaryContext(i)
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, &device.CUDA{Drv: drv, Ordinal: i, Ctx: ctx, Allocs: map[device.Addr]bool{}, Peers: map[int]bool{}})
	}
	exchangeCase(t, devs)
	t.Setenv("FAKENCCL_TIMEOUT_S", "1")
	if err := brokenExchange(t, devs); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_LAUNCH_FAILED") {
		t.Errorf("a rank that skips the group: %v", err)
	}

	s, _ := devs[0].NewStream()
	th := device.NewThreads(devs)
	defer th.Close()
	var nc *NoCommError
	if _, err := OpenComm(th, []device.Device{devs[0], devs[0]}, []device.Stream{s, s}); !errors.As(err, &nc) || !strings.Contains(err.Error(), "ranks 0 and 1 share a device") {
		t.Errorf("two ranks on one GPU: %v", err)
	}
	t.Setenv("MOEBENCH_NCCL", "/nonexistent/libnccl.so.2")
	if _, err := OpenComm(th, devs[:1], []device.Stream{s}); !errors.As(err, &nc) || !strings.Contains(err.Error(), "does not load") {
		t.Errorf("no NCCL: %v", err)
	}
}

// TestCommOnEmu: the emulated communicator moves the same bytes, and
// refuses a stream of another rank's device.
func TestCommOnEmu(t *testing.T) {
	devs := []device.Device{&device.Emu{}, &device.Emu{}}
	exchangeCase(t, devs)
	th := device.NewThreads(devs)
	defer th.Close()
	s0, _ := devs[0].NewStream()
	if _, err := OpenComm(th, devs, []device.Stream{s0, s0}); err == nil || !strings.Contains(err.Error(), "rank 1: emu: a stream of another device") {
		t.Errorf("rank 1 with rank 0's stream: %v", err)
	}
	if _, err := OpenComm(th, devs, []device.Stream{s0}); err == nil {
		t.Error("two devices and one stream: accepted")
	}
}
