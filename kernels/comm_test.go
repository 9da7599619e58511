package kernels

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// exchangeCase runs one group on two ranks: rank g sends its first half to
// the other rank and its second to itself, plus a transfer of no bytes; it
// checks what each rank received.
func exchangeCase(t *testing.T, devs []Device) {
	t.Helper()
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var s [2]Stream
	var src, dst [2]Ptr
	for g, d := range devs {
		var err error
		s[g], err = d.NewStream()
		ok(err)
		src[g], err = d.Alloc(16)
		ok(err)
		dst[g], err = d.Alloc(16)
		ok(err)
	}
	c, err := OpenComm(devs, s[:])
	ok(err)
	for g := 1; g >= 0; g-- { // rank 0's device used last before the exchange
		ok(devs[g].Upload(src[g], []int32{int32(10 * g), int32(10*g + 1), int32(10*g + 2), int32(10*g + 3)}, s[g]))
	}
	var xs []Xfer
	for g := range 2 {
		xs = append(xs, Xfer{From: g, To: 1 - g, Src: src[g], Dst: dst[1-g], Bytes: 8},
			Xfer{From: g, To: g, Src: src[g] + 8, Dst: dst[g] + 8, Bytes: 8}, Xfer{From: g, To: 1 - g})
	}
	ok(c.Exchange(xs))
	// rank 0's device right after: in its own context (NCCL may have left
	// another current), an allocation is usable on its stream
	p, err := devs[0].Alloc(4)
	ok(err)
	ok(devs[0].Upload(p, []int32{7}, s[0]))
	for g, want := range [][]int32{{10, 11, 2, 3}, {0, 1, 12, 13}} {
		got := make([]int32, 4)
		ok(devs[g].Download(got, dst[g], s[g]))
		if !slices.Equal(got, want) {
			t.Errorf("%s: rank %d received %v, want %v", c.Name(), g, got, want)
		}
	}
	if err := c.Exchange([]Xfer{{From: 0, To: 2, Bytes: 4}}); err == nil || !strings.Contains(err.Error(), "rank 2 of 2") {
		t.Errorf("%s: a transfer to a third rank: %v", c.Name(), err)
	}
	ok(c.Close())
}

// TestCommOnTheFakeNCCL: two GPUs of the fake driver exchange through the
// fake NCCL (which refuses a stream or buffer of the wrong GPU and leaves
// another context current, see fakenccl.c); a device used after NCCL still
// works in its own context.
func TestCommOnTheFakeNCCL(t *testing.T) {
	drv := fakeDriver(t)
	fakeLib(t, "fakenccl", "libnccl.so.2", "MOEBENCH_NCCL")
	var devs []Device
	for i := range 2 {
		ctx, err := drv.PrimaryContext(i)
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, &CUDA{Drv: drv, Ordinal: i, Ctx: ctx, allocs: map[Ptr]bool{}, peers: map[int]bool{}})
	}
	exchangeCase(t, devs)

	s, _ := devs[0].NewStream()
	var nc *NoCommError
	if _, err := OpenComm([]Device{devs[0], devs[0]}, []Stream{s, s}); !errors.As(err, &nc) || !strings.Contains(err.Error(), "ranks 0 and 1 share a device") {
		t.Errorf("two ranks on one GPU: %v", err)
	}
	t.Setenv("MOEBENCH_NCCL", "/nonexistent/libnccl.so.2")
	if _, err := OpenComm(devs[:1], []Stream{s}); !errors.As(err, &nc) || !strings.Contains(err.Error(), "does not load") {
		t.Errorf("no NCCL: %v", err)
	}
}

// TestCommOnEmu: the emulated communicator moves the same bytes, and
// refuses a stream of another rank's device.
func TestCommOnEmu(t *testing.T) {
	devs := []Device{&Emu{}, &Emu{}}
	exchangeCase(t, devs)
	s0, _ := devs[0].NewStream()
	if _, err := OpenComm(devs, []Stream{s0, s0}); err == nil || !strings.Contains(err.Error(), "rank 1: emu: a stream of another device") {
		t.Errorf("rank 1 with rank 0's stream: %v", err)
	}
	if _, err := OpenComm(devs, []Stream{s0}); err == nil {
		t.Error("two devices and one stream: accepted")
	}
}
