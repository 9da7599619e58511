package bench

import (
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
	"testing"

	"github.com/moebench/moebench/kernels/comm"
)

// TestBenchDispatchPredicts: on the host device too, deepep's and
// hybridep's points carry the ceiling the committed table
// (kernels/comm/inflight.json) predicts for the kernels the cuda device runs;
// alltoall's, and a library implementation's, none.
func TestBenchDispatchPredicts(t *testing.T) {
	tab, err := comm.Inflight()
	if err != nil {
		t.Fatal(err)
	}
	c := harnesstest.Small()
	c.Warmup, c.Iters = 0, 1
	b, err := Dispatch(c, []string{"alltoall", "deepep", "hybridep"}, []int{4}, setup.Env{Version: "test"})
	if err != nil || len(b.Points) != 3 {
		t.Fatalf("err %v, points %+v", err, b)
	}
	if b.Points[0].Predicted != nil {
		t.Errorf("alltoall: predicted %+v", b.Points[0].Predicted)
	}
	for _, p := range b.Points[1:] {
		d, cb, path, ok := comm.DispatcherKernels(p.Dispatcher)
		kd, okd := tab.Kernel(d, path)
		kc, okc := tab.Kernel(cb, path)
		if !ok || !okd || !okc {
			t.Fatalf("%s: its kernels (%s, %s, %s) are not all in the table", p.Dispatcher, d, cb, path)
		}
		q := p.Predicted
		if q == nil || q.DispatchGBpsPerSM != kd.CeilingGBpsPerSM || q.CombineGBpsPerSM != kc.CeilingGBpsPerSM || q.DispatchGBpsPerSM <= 0 || q.CombineGBpsPerSM <= 0 || q.Source != tab.Source {
			t.Errorf("%s: predicted %+v, want %s's %v and %s's %v GB/s per SM", p.Dispatcher, q, d, kd.CeilingGBpsPerSM, cb, kc.CeilingGBpsPerSM)
		}
	}
	if q := predicted("hybridep", "library"); q != nil {
		t.Errorf("hybridep library: predicted %+v", q)
	}
}
