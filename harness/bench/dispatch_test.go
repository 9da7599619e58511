package bench

import (
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// TestBenchDispatchChecksEachPoint: a dispatcher that delivers a wrong row
// fails its point by the round trip; the others are timed.
func TestBenchDispatchChecksEachPoint(t *testing.T) {
	c := harnesstest.Small()
	c.Warmup, c.Iters = 0, 2
	b, err := Dispatch(c, []string{"broken", "deepep"}, []int{4, 8}, setup.Env{Version: "test"})
	if err == nil || len(b.Points) != 3 {
		t.Fatalf("err %v, points %+v", err, b)
	}
	if p := b.Points[0]; p.Status != results.StatusFailed || p.Traffic != nil || !strings.HasPrefix(p.RoundTrip, "rank 0") {
		t.Errorf("broken: %+v", p)
	}
	for _, p := range b.Points[1:] {
		if p.Status != results.StatusOK || p.RoundTrip != "exact" || p.Budget != p.SMs || len(p.Phases) != 6 || p.Phases[2].Name != "dispatch" {
			t.Errorf("deepep: %+v", p)
		}
	}
}

// TestBenchDispatchAsDesigned: bench dispatch's dispatch GB/s are the
// rate of the dispatch as the design's own test times it.
func TestBenchDispatchAsDesigned(t *testing.T) {
	cfg := harnesstest.Small()
	b, err := Dispatch(cfg, []string{"deepep", "hybridep"}, []int{2}, setup.Env{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range b.Points {
		d := p.DispatchAsDesigned
		if d == nil || d.GBps == 0 || p.Traffic.DispatchGBps != d.GBps || p.Traffic.DispatchGBpsPerSM != d.GBpsPerSM {
			t.Errorf("bench %s: dispatch as designed %+v, traffic %+v: want its GB/s", p.Dispatcher, d, p.Traffic)
		}
	}
}

// TestBenchDispatchOnDevice: the dispatch benchmark on the device pipeline
// (Emu): alltoall once, deepep per budget, each point timed by events and
// checked; a lost copy fails alltoall's point by its round trip.
func TestBenchDispatchOnDevice(t *testing.T) {
	c := harnesstest.Small()
	c.Device, c.Dispatcher, c.EP, c.SMs, c.SharedExperts = "cuda", "deepep", 4, 2, 1
	c.Tokens, c.Hidden, c.FFN = 24, 32, 16
	c.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}
	c.Warmup, c.Iters = 1, 2
	b, err := Dispatch(c, []string{"alltoall", "deepep"}, []int{2, 4}, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(2)})
	if err != nil || len(b.Points) != 3 {
		t.Fatalf("%v, %+v", err, b)
	}
	for i, p := range b.Points {
		if p.Status != results.StatusOK || p.RoundTrip != "exact" || p.Traffic == nil || p.Traffic.DispatchGBps <= 0 || len(p.Phases) == 0 {
			t.Errorf("point %d: %+v", i, p)
		}
	}
	if p := b.Points[2]; p.Budget != 4 || p.Phases[2].Name != "dispatch" || p.Traffic.DispatchGBpsPerSM != p.Traffic.DispatchGBps/4 {
		t.Errorf("deepep at 4 SMs: %+v", p)
	}
	if !strings.Contains(b.Clock, "CUDA events") || !strings.Contains(b.Ranks, "4 EP ranks on 2 GPUs") {
		t.Errorf("clock %q, ranks %q", b.Clock, b.Ranks)
	}
	lose := func(n, most int) ([]device.Device, error) {
		return []device.Device{&harnesstest.DropCopy{Drop: 1}}, nil
	}
	b, err = Dispatch(c, []string{"alltoall"}, nil, setup.Env{Version: "test", OpenDevices: lose})
	if err == nil || b.Points[0].Status != results.StatusFailed || !strings.HasPrefix(b.Points[0].RoundTrip, "rank ") {
		t.Errorf("a lost copy: %v, %+v", err, b.Points)
	}
}

// TestFP8BenchDispatch: bench dispatch runs each point at bf16 and fp8
// side by side; the fp8 round trip (e4m3 rows with their scales, the
// experts dequantizing) gives each rank its dequantized input back
// exactly, and its dispatch moves bf16's algorithm bytes times
// (1 + 4/128)/2, its combine the same as bf16's.
func TestFP8BenchDispatch(t *testing.T) {
	c := harnesstest.FP8Config("alltoall")
	c.Tokens, c.Iters, c.Warmup = 16, 2, 0
	b, err := DispatchAt(c, []string{"alltoall", "deepep", "hybridep"}, []int{4}, []string{setup.PrecisionBF16, setup.PrecisionFP8}, setup.Env{Version: "test"})
	if err != nil || len(b.Points) != 6 {
		t.Fatalf("%v, %d points", err, len(b.Points))
	}
	for i := 0; i < len(b.Points); i += 2 {
		bf, fp := b.Points[i], b.Points[i+1]
		if bf.Status != results.StatusOK || fp.Status != results.StatusOK || bf.Precision != "" || fp.Precision != setup.PrecisionFP8 || fp.RoundTrip != "exact" {
			t.Errorf("%s: bf16 %s %q, fp8 %s %q (%q)", bf.Dispatcher, bf.Status, bf.Reason, fp.Status, fp.Reason, fp.Precision)
			continue
		}
		if fp.Traffic.DispatchAlgorithm*256 != bf.Traffic.DispatchAlgorithm*132 || fp.Traffic.CombineAlgorithm != bf.Traffic.CombineAlgorithm {
			t.Errorf("%s: dispatch bytes %d (fp8) and %d (bf16), combine %d and %d", bf.Dispatcher, fp.Traffic.DispatchAlgorithm, bf.Traffic.DispatchAlgorithm,
				fp.Traffic.CombineAlgorithm, bf.Traffic.CombineAlgorithm)
		}
	}
}

// TestFP8BenchDispatchOnDevice: bench dispatch at fp8 on the cuda device
// (Emu) runs each point at bf16 and fp8 side by side: the fp8 round trip
// sends the packed rows (e4m3 values, UE8M0 1×128 scales), the experts
// dequantize them (dequant_fp8_rows) and every rank gets k times its
// dequantized input back exactly; the dispatch bytes are the fp8 rows'
// (×132/256), the combine's bf16's, for every design (deepep's in
// DeepEP's convention comes to the same ratio).
func TestFP8BenchDispatchOnDevice(t *testing.T) {
	c := harnesstest.FP8Config("alltoall")
	c.Device = "cuda"
	c.Warmup, c.Iters = 0, 1
	b, err := DispatchAt(c, []string{"alltoall", "hybridep", "deepep"}, []int{4}, []string{setup.PrecisionBF16, setup.PrecisionFP8},
		setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
	if b == nil || len(b.Points) != 6 {
		t.Fatalf("%v, %+v", err, b)
	}
	for i := 0; i < len(b.Points); i += 2 {
		bf, fp := b.Points[i], b.Points[i+1]
		if bf.Status != results.StatusOK || bf.Precision != "" || fp.Precision != setup.PrecisionFP8 {
			t.Errorf("%s: bf16 %s %q; fp8 labelled %q", bf.Dispatcher, bf.Status, bf.Reason, fp.Precision)
			continue
		}
		if fp.Status != results.StatusOK || fp.RoundTrip != "exact" {
			t.Errorf("%s fp8: %s %q, round trip %q", fp.Dispatcher, fp.Status, fp.Reason, fp.RoundTrip)
			continue
		}
		if bf.BufferBytes <= 0 || fp.BufferBytes <= 0 {
			t.Errorf("%s: the dispatcher's buffers %d B (bf16) and %d B (fp8) not counted", bf.Dispatcher, bf.BufferBytes, fp.BufferBytes)
		}
		if fp.Traffic.DispatchAlgorithm*256 != bf.Traffic.DispatchAlgorithm*132 || fp.Traffic.CombineAlgorithm != bf.Traffic.CombineAlgorithm {
			t.Errorf("%s: dispatch bytes %d (fp8) and %d (bf16), combine %d and %d", bf.Dispatcher, fp.Traffic.DispatchAlgorithm, bf.Traffic.DispatchAlgorithm,
				fp.Traffic.CombineAlgorithm, bf.Traffic.CombineAlgorithm)
		}
	}
}

// TestFP8BenchDispatchBelowSM89: on a GPU below sm_89 (the fake driver's
// FAKECUDA_CC 80) bench dispatch's fp8 point is unavailable with the
// reason, as a run is (TestFP8UnavailableBelowSM89).
func TestFP8BenchDispatchBelowSM89(t *testing.T) {
	harnesstest.UseHostSimLayer(t)
	t.Setenv("FAKECUDA_CC", "80")
	c := harnesstest.FP8Config("alltoall")
	c.Device = "cuda"
	c.Warmup, c.Iters = 0, 1
	b, err := DispatchAt(c, []string{"alltoall"}, nil, []string{setup.PrecisionFP8}, setup.Env{Version: "test"})
	if b == nil || len(b.Points) != 1 {
		t.Fatalf("%v, %+v", err, b)
	}
	want := "GPU 0 is sm_80, where Transformer Engine refuses FP8"
	if p := b.Points[0]; p.Status != results.StatusUnavailable || !strings.Contains(p.Reason, want) {
		t.Errorf("fp8 point: %s %q; want unavailable, %q", p.Status, p.Reason, want)
	}
}
