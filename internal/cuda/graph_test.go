package cuda

import (
	"errors"
	"os"
	"testing"
)

// TestGraphEventTiming: the driver's contract for events recorded during a
// stream capture (see RecordNode), on the fake driver. A plain Record there
// is capture-internal — it orders the capture's work (a fork and join here,
// which still hold at every launch) but no launch records the event — so
// cuEventElapsedTime on it fails with CUDA_ERROR_INVALID_VALUE after the
// graph ran, as the real driver's did for moebench's phase events under
// --cuda-graph. An event record node (RecordNode) is recorded by each
// launch and times; outside a capture RecordNode is refused.
func TestGraphEventTiming(t *testing.T) {
	d := fakeDriver(t)
	p, err := d.Alloc(8)
	if err != nil {
		t.Fatal(err)
	}
	// the graph adds to it: zeroed first (new memory holds anything), and
	// waited for, as the graph runs on other streams
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(s)
	if err := CopyToDevice(d, p, []float32{0, 0}, s); err != nil {
		t.Fatal(err)
	}
	if err := d.SyncStream(s); err != nil {
		t.Fatal(err)
	}
	m, _ := d.LoadModule([]byte("\x7fELF fake cubin"))
	f, _ := d.Function(m, "add")
	graphEventTiming(t, d, func(s Stream) error {
		return d.Launch(f, [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, s, p, int32(2), float32(1))
	}, false, func(s Stream) {
		got := make([]float32, 2)
		if err := CopyFromDevice(d, got, p, s); err != nil {
			t.Fatal(err)
		}
		if got[0] != 4 || got[1] != 4 {
			t.Errorf("after 2 launches of a graph adding 1 on each of two streams: %v", got)
		}
	})
}

// TestGPUGraphEventTiming is TestGraphEventTiming on GPU 0 through the real
// driver (the graph's work: 64 MiB memsets), so that the contract the fake
// implements is checked where the failure was seen. It skips without a GPU
// and fails under MOEBENCH_REQUIRE_GPU=1 (scripts/gpu-check.sh).
func TestGPUGraphEventTiming(t *testing.T) {
	d, err := OpenDriver()
	if err == nil {
		_, err = d.PrimaryContext(0)
	}
	if err != nil {
		if os.Getenv("MOEBENCH_REQUIRE_GPU") == "1" {
			t.Fatalf("GPU required: %v", err)
		}
		t.Skipf("no GPU: %v", err)
	}
	const n = 32 << 20 // 16-bit words
	p, err := d.Alloc(2 * n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(p)
	graphEventTiming(t, d, func(s Stream) error { return d.Fill16(p, 0x3c00, n, s) }, true, nil)
}

// graphEventTiming captures work on two streams (s2 forked from s1 and
// joined back) with a plain Record and a RecordNode at each end, launches
// the graph twice (then calls after, if any), and checks which events time.
// On a GPU (gpu) what neither NVIDIA's documentation nor the H200's failure
// settles — the error codes once the graph is destroyed and of RecordNode
// outside a capture — is logged, not checked: the fake's choice is no proof
// of the driver's.
func graphEventTiming(t *testing.T, d *Driver, work func(Stream) error, gpu bool, after func(Stream)) {
	t.Helper()
	unsettled := t.Errorf
	if gpu {
		unsettled = t.Logf
	}
	if !d.HasGraphs() {
		t.Fatal("the driver has no graphs")
	}
	code := func(err error) int {
		var ce *Error
		if errors.As(err, &ce) {
			return ce.Code
		}
		return 0
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	s1, err := d.NewStream(0)
	must(err)
	s2, err := d.NewStream(0)
	must(err)
	ev := func() Event {
		e, err := d.NewEvent()
		must(err)
		return e
	}
	plain0, plain1, node0, node1, fork, join := ev(), ev(), ev(), ev(), ev(), ev()
	must(d.BeginCapture(s1))
	must(d.Record(plain0, s1))
	must(d.RecordNode(node0, s1))
	must(work(s1))
	must(d.Record(fork, s1))
	must(d.WaitEvent(s2, fork)) // s2 joins
	must(work(s2))
	must(d.RecordNode(node1, s2))
	must(d.Record(plain1, s2))
	must(d.Record(join, s2))
	must(d.WaitEvent(s1, join))
	g, err := d.EndCapture(s1)
	must(err)
	x, err := d.Instantiate(g)
	must(err)
	for range 2 {
		must(d.LaunchGraph(x, s1))
	}
	must(d.SyncStream(s1))
	if after != nil {
		after(s1)
	}
	if ms, err := d.Elapsed(plain0, plain1); code(err) != 1 {
		t.Errorf("cuEventElapsedTime on capture-internal records after the graph ran: %g ms, %v; want CUDA_ERROR_INVALID_VALUE (the driver's)", ms, err)
	}
	if ms, err := d.Elapsed(node0, node1); err != nil || ms <= 0 {
		t.Errorf("cuEventElapsedTime on event record nodes after the graph ran: %g ms, %v; want a time", ms, err)
	} else {
		t.Logf("between the event record nodes: %.3f ms", ms)
	}
	if ms, err := d.Elapsed(node0, plain1); code(err) != 1 {
		t.Errorf("one event capture-internal: %g ms, %v; want CUDA_ERROR_INVALID_VALUE", ms, err)
	}
	must(d.DestroyGraph(g, x))
	if _, err := d.Elapsed(node0, plain1); code(err) != 1 {
		unsettled("a capture-internal record, its graph destroyed: %v; want CUDA_ERROR_INVALID_VALUE", err)
	}
	// a plain record outside a capture makes plain1 a timing event again;
	// an event record node outside a capture is refused
	must(d.Record(plain1, s1))
	must(d.SyncStream(s1))
	if _, err := d.Elapsed(node0, plain1); err != nil {
		t.Errorf("after a plain record: %v", err)
	}
	if err := d.RecordNode(plain0, s1); code(err) != 1 {
		unsettled("an event record node outside a capture: %v, want CUDA_ERROR_INVALID_VALUE", err)
	}
}
