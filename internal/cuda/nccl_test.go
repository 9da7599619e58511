package cuda

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestNCCLVersionCodes(t *testing.T) {
	for code, want := range map[int][3]int{22105: {2, 21, 5}, 2708: {2, 7, 8}, 2804: {2, 8, 4}, 21003: {2, 10, 3}, 30001: {3, 0, 1}} {
		if a, b, c := ncclVersion(code); [3]int{a, b, c} != want {
			t.Errorf("ncclVersion(%d) = %d.%d.%d, want %v", code, a, b, c, want)
		}
	}
}

// TestNCCLOnTheFake: two communicators of one process exchange buffers in a
// group (each rank also sends to itself); what NCCL (or a single thread
// driving two GPUs) refuses is an error naming the call, the result and
// NCCL's last message.
func TestNCCLOnTheFake(t *testing.T) {
	d := fakeDriver(t)
	buildFake(t, "fakenccl", "MOEBENCH_NCCL")
	n, err := OpenNCCL()
	if err != nil {
		t.Fatal(err)
	}
	if n.Version != "2.21.5" {
		t.Errorf("Version = %q", n.Version)
	}
	if _, err := n.InitAll([]int{1, 1}); err == nil || !strings.Contains(err.Error(), "ncclCommInitAll(GPUs [1 1]): ncclInvalidUsage (5, invalid usage") ||
		!strings.Contains(err.Error(), "Duplicate GPU detected") {
		t.Errorf("one GPU twice: %v", err)
	}
	comms, err := n.InitAll([]int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	// a stream and a send and a receive buffer on each GPU
	var s [2]Stream
	var src, dst [2]DevicePtr
	for g := range 2 {
		ctx, err := d.PrimaryContext(g)
		if err != nil {
			t.Fatal(err)
		}
		d.ContextChanged() // NCCL's init left GPU 1's context current
		if err := d.SetCurrent(ctx); err != nil {
			t.Fatal(err)
		}
		if s[g], err = d.NewStream(0); err != nil {
			t.Fatal(err)
		}
		if src[g], err = d.Alloc(16); err != nil {
			t.Fatal(err)
		}
		if dst[g], err = d.Alloc(16); err != nil {
			t.Fatal(err)
		}
		v := []uint32{uint32(10 * g), uint32(10*g + 1), uint32(10*g + 2), uint32(10*g + 3)}
		if err := CopyToDevice(d, src[g], v, s[g]); err != nil {
			t.Fatal(err)
		}
	}
	// rank g sends its first half to rank 1−g and its second to itself
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	ok(n.GroupStart())
	for g := range 2 {
		ok(n.Send(src[g], 8, 1-g, comms[g], s[g]))
		ok(n.Send(src[g]+8, 8, g, comms[g], s[g]))
		ok(n.Recv(dst[g], 8, 1-g, comms[g], s[g]))
		ok(n.Recv(dst[g]+8, 8, g, comms[g], s[g]))
	}
	ok(n.GroupEnd())
	d.ContextChanged()
	for g, want := range [][]uint32{{10, 11, 2, 3}, {0, 1, 12, 13}} {
		ctx, _ := d.PrimaryContext(g)
		ok(d.SetCurrent(ctx))
		got := make([]uint32, 4)
		ok(CopyFromDevice(d, got, dst[g], s[g]))
		if !slices.Equal(got, want) {
			t.Errorf("rank %d received %v, want %v", g, got, want)
		}
	}

	var ne *NCCLError
	if err := n.Send(src[0], 8, 1, comms[0], s[0]); !errors.As(err, &ne) || ne.Name != "ncclInvalidUsage" ||
		!strings.Contains(err.Error(), "ncclSend(8 bytes to rank 1)") || !strings.Contains(err.Error(), "outside a group") {
		t.Errorf("a send outside a group: %v", err)
	}
	ok(n.GroupStart())
	if err := n.Send(src[0], 8, 1, comms[0], s[1]); err == nil || !strings.Contains(err.Error(), "a stream of another GPU") {
		t.Errorf("rank 0's send on GPU 1's stream: %v", err)
	}
	ok(n.Send(src[0], 8, 1, comms[0], s[0]))
	if err := n.GroupEnd(); err == nil || !strings.Contains(err.Error(), "ncclGroupEnd: ncclInvalidUsage") || !strings.Contains(err.Error(), "no matching receive") {
		t.Errorf("a send nobody receives: %v", err)
	}
	for _, c := range comms {
		ok(n.Destroy(c))
	}
}

// TestNCCLTooOld: an NCCL without point-to-point transfers is refused with
// its version.
func TestNCCLTooOld(t *testing.T) {
	buildFake(t, "fakenccl", "MOEBENCH_NCCL")
	t.Setenv("FAKENCCL_VERSION", "2604")
	if _, err := OpenNCCL(); err == nil || !strings.Contains(err.Error(), "NCCL 2.6.4 has no point-to-point transfers (2.7 or later needed)") {
		t.Errorf("NCCL 2.6.4: %v", err)
	}
}
