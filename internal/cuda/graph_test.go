package cuda

import (
	"errors"
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
	if !d.HasGraphs() {
		t.Fatal("the fake driver has graphs")
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
	s1, _ := d.NewStream(0)
	s2, _ := d.NewStream(0)
	p, _ := d.Alloc(8)
	must(CopyToDevice(d, p, []float32{0, 0}, s1))
	must(d.SyncStream(s1))
	m, _ := d.LoadModule([]byte("\x7fELF fake cubin"))
	f, _ := d.Function(m, "add")
	add := func(s Stream) error {
		return d.Launch(f, [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, s, p, int32(2), float32(1))
	}
	ev := func() Event {
		e, err := d.NewEvent()
		must(err)
		return e
	}
	plain0, plain1, node0, node1, fork, join := ev(), ev(), ev(), ev(), ev(), ev()
	must(d.BeginCapture(s1))
	must(d.Record(plain0, s1))
	must(d.RecordNode(node0, s1))
	must(add(s1))
	must(d.Record(fork, s1))
	must(d.WaitEvent(s2, fork))
	must(add(s2))
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
	got := make([]float32, 2)
	must(CopyFromDevice(d, got, p, s1))
	if got[0] != 4 || got[1] != 4 {
		t.Errorf("after 2 launches of a graph adding 1 on each of two streams: %v", got)
	}
	if ms, err := d.Elapsed(plain0, plain1); code(err) != 1 {
		t.Errorf("cuEventElapsedTime on capture-internal records after the graph ran: %g ms, %v; want CUDA_ERROR_INVALID_VALUE (the driver's)", ms, err)
	}
	if ms, err := d.Elapsed(node0, node1); err != nil || ms <= 0 {
		t.Errorf("cuEventElapsedTime on event record nodes after the graph ran: %g ms, %v; want a time", ms, err)
	}
	if ms, err := d.Elapsed(node0, plain1); code(err) != 1 {
		t.Errorf("one event capture-internal: %g ms, %v; want CUDA_ERROR_INVALID_VALUE", ms, err)
	}
	must(d.DestroyGraph(g, x))
	if _, err := d.Elapsed(node0, plain1); code(err) != 1 {
		t.Errorf("a capture-internal record, its graph destroyed: %v; want CUDA_ERROR_INVALID_VALUE", err)
	}
	// a plain record outside a capture makes plain1 a timing event again;
	// an event record node outside a capture is refused
	must(d.Record(plain1, s1))
	must(d.SyncStream(s1))
	if _, err := d.Elapsed(node0, plain1); err != nil {
		t.Errorf("after a plain record: %v", err)
	}
	if err := d.RecordNode(plain0, s1); code(err) != 1 {
		t.Errorf("an event record node outside a capture: %v, want CUDA_ERROR_INVALID_VALUE", err)
	}
}
