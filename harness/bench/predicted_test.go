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
	if q := predicted(tab, "hybridep", "library", setup.PrecisionBF16); q != nil {
		t.Errorf("hybridep library: predicted %+v", q)
	}
}

// TestBenchDispatchPredictsFP8: an fp8 point carries its dispatch
// kernel's fp8 build's ceiling (the packed rows) and the bf16 combine's;
// mxfp8, which the table has no build for, none.
func TestBenchDispatchPredictsFP8(t *testing.T) {
	tab, err := comm.Inflight()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"deepep", "hybridep"} {
		d, cb, path, _ := comm.DispatcherKernels(name)
		kd, okd := tab.Kernel(d, path+" fp8")
		kc, okc := tab.Kernel(cb, path)
		kb, _ := tab.Kernel(d, path)
		if !okd || !okc {
			t.Fatalf("%s: the table has no %s %s fp8 or %s %s", name, d, path, cb, path)
		}
		if kd.CeilingGBpsPerSM == kb.CeilingGBpsPerSM {
			t.Fatalf("%s: the fp8 and bf16 builds' ceilings are both %v: the test could not tell them apart", name, kd.CeilingGBpsPerSM)
		}
		q := predicted(tab, name, "native", setup.PrecisionFP8)
		if q == nil || q.DispatchGBpsPerSM != kd.CeilingGBpsPerSM || q.CombineGBpsPerSM != kc.CeilingGBpsPerSM {
			t.Errorf("%s at fp8: predicted %+v, want %s's fp8 %v and %s's %v GB/s per SM", name, q, d, kd.CeilingGBpsPerSM, cb, kc.CeilingGBpsPerSM)
		}
		if q := predicted(tab, name, "native", setup.PrecisionMXFP8); q != nil {
			t.Errorf("%s at mxfp8: predicted %+v, want none (no such build in the table)", name, q)
		}
	}
	c := harnesstest.Small()
	c.Warmup, c.Iters, c.Hidden = 0, 1, 128
	b, err := DispatchAt(c, []string{"deepep"}, []int{4}, []string{setup.PrecisionBF16, setup.PrecisionFP8}, setup.Env{Version: "test"})
	if err != nil || len(b.Points) != 2 {
		t.Fatalf("err %v, points %+v", err, b)
	}
	if p0, p1 := b.Points[0].Predicted, b.Points[1].Predicted; p0 == nil || p1 == nil || p0.DispatchGBpsPerSM == p1.DispatchGBpsPerSM {
		t.Errorf("deepep bf16 and fp8 points: predicted %+v and %+v, want each its build's dispatch ceiling", p0, p1)
	}
}
