package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
)

func TestNCCLVersionCodes(t *testing.T) {
	for code, want := range map[int][3]int{22105: {2, 21, 5}, 2708: {2, 7, 8}, 2804: {2, 8, 4}, 21003: {2, 10, 3}, 30001: {3, 0, 1}} {
		if a, b, c := ncclVersion(code); [3]int{a, b, c} != want {
			t.Errorf("ncclVersion(%d) = %d.%d.%d, want %v", code, a, b, c, want)
		}
	}
}

// onGPUs runs f(g) for GPUs 0 and 1 at once, each on a goroutine locked
// to its own OS thread with GPU g's context current (as moebench's threads
// per GPU run), and returns their errors.
func onGPUs(d *Driver, f func(g int) error) [2]error {
	var errs [2]error
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			if _, err := d.PrimaryContext(g); err != nil {
				errs[g] = err
				return
			}
			errs[g] = f(g)
		}()
	}
	wg.Wait()
	return errs
}

// TestNCCLOnTheFake: two communicators of one process, one per GPU, each
// joined and driven from its GPU's thread, exchange buffers in a group
// (each rank also sends to itself); what NCCL refuses is an error naming
// the call, the result and NCCL's last message, and a rank that does not
// join, or does not take part in a group, makes the others fail after the
// fake's timeout where NCCL would hang.
func TestNCCLOnTheFake(t *testing.T) {
	d := fakeDriver(t)
	buildFake(t, "fakenccl", "MOEBENCH_NCCL")
	t.Setenv("FAKENCCL_TIMEOUT_S", "1")
	n, err := OpenNCCL()
	if err != nil {
		t.Fatal(err)
	}
	if n.Version != "2.21.5" {
		t.Errorf("Version = %q", n.Version)
	}
	id, err := n.UniqueID()
	if err != nil {
		t.Fatal(err)
	}
	twice := onGPUs(d, func(g int) error {
		ctx, _ := d.PrimaryContext(1) // both ranks on GPU 1
		if err := d.SetCurrent(ctx); err != nil {
			return err
		}
		_, err := n.InitRank(2, id, g)
		return err
	})
	for g, err := range twice {
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("ncclCommInitRank(rank %d of 2): ncclInvalidUsage (5, invalid usage", g)) ||
			!strings.Contains(err.Error(), "Duplicate GPU detected") {
			t.Errorf("rank %d, one GPU twice: %v", g, err)
		}
	}
	if id, err = n.UniqueID(); err != nil {
		t.Fatal(err)
	}
	alone := onGPUs(d, func(g int) error {
		if g == 1 {
			return nil // rank 1 never joins
		}
		_, err := n.InitRank(2, id, 0)
		return err
	})
	if err := alone[0]; err == nil || !strings.Contains(err.Error(), "waited 1 s for the other ranks of 2 (1 joined)") {
		t.Errorf("a rank alone: %v", err)
	}

	if id, err = n.UniqueID(); err != nil {
		t.Fatal(err)
	}
	var comms [2]Comm
	got := [2][]uint32{make([]uint32, 4), make([]uint32, 4)}
	errs := onGPUs(d, func(g int) error {
		c, err := n.InitRank(2, id, g)
		if err != nil {
			return err
		}
		comms[g] = c
		s, err := d.NewStream(0)
		if err != nil {
			return err
		}
		src, err := d.Alloc(16)
		if err != nil {
			return err
		}
		dst, err := d.Alloc(16)
		if err != nil {
			return err
		}
		if err := CopyToDevice(d, src, []uint32{uint32(10 * g), uint32(10*g + 1), uint32(10*g + 2), uint32(10*g + 3)}, s); err != nil {
			return err
		}
		// rank g sends its first half to rank 1−g and its second to itself
		if err := n.GroupStart(); err != nil {
			return err
		}
		for _, e := range []error{n.Send(src, 8, 1-g, c, s), n.Send(src+8, 8, g, c, s), n.Recv(dst, 8, 1-g, c, s), n.Recv(dst+8, 8, g, c, s)} {
			if e != nil {
				return e
			}
		}
		if err := n.GroupEnd(); err != nil {
			return err
		}
		d.ContextChanged()
		ctx, _ := d.PrimaryContext(g)
		if err := d.SetCurrent(ctx); err != nil {
			return err
		}
		if err := CopyFromDevice(d, got[g], dst, s); err != nil {
			return err
		}
		if err := d.SyncStream(s); err != nil {
			return err
		}

		var ne *NCCLError
		if err := n.Send(src, 8, 1-g, c, s); !errors.As(err, &ne) || ne.Name != "ncclInvalidUsage" ||
			!strings.Contains(err.Error(), fmt.Sprintf("ncclSend(8 bytes to rank %d)", 1-g)) || !strings.Contains(err.Error(), "outside a group") {
			return fmt.Errorf("a send outside a group: %v", err)
		}
		if g == 1 {
			return nil // rank 1 takes no part in the next group
		}
		other, err := func() (Stream, error) { // a stream of GPU 1
			ctx, _ := d.PrimaryContext(1)
			d.SetCurrent(ctx)
			defer func() { ctx, _ := d.PrimaryContext(0); d.SetCurrent(ctx) }()
			return d.NewStream(0)
		}()
		if err != nil {
			return err
		}
		if err := n.GroupStart(); err != nil {
			return err
		}
		if err := n.Send(src, 8, 1, c, other); err == nil || !strings.Contains(err.Error(), "a stream of another GPU") {
			return fmt.Errorf("rank 0's send on GPU 1's stream: %v", err)
		}
		if err := n.Send(src, 8, 1, c, s); err != nil {
			return err
		}
		if err := n.GroupEnd(); err != nil {
			return err
		}
		if err := d.SyncStream(s); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_LAUNCH_FAILED") {
			return fmt.Errorf("a send nobody receives: %v", err)
		}
		return nil
	})
	for g, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", g, err)
		}
	}
	for g, want := range [][]uint32{{10, 11, 2, 3}, {0, 1, 12, 13}} {
		if !slices.Equal(got[g], want) {
			t.Errorf("rank %d received %v, want %v", g, got[g], want)
		}
	}
	for _, c := range comms {
		if c != nil {
			if err := n.Destroy(c); err != nil {
				t.Error(err)
			}
		}
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
