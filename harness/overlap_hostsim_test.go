package harness

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/results"
)

// TestOverlapOnHostSim runs overlapped steps on the cuda device through the
// host simulation (the real CUDA C compiled for the CPU, the fake driver's
// streams and events, the fake NCCL): deepep's SM-driven kernels with a2a
// and the delayed wgrad, alltoall through NCCL with a2a, hybridep with the
// shared expert on its side stream. Each must pass the check and give the
// sequential step's output and gradients bit for bit.
func TestOverlapOnHostSim(t *testing.T) {
	harnesstest.UseHostSimLayer(t)
	base := harnesstest.DeviceCases()["softmax-natural"]
	base.Warmup, base.Iters, base.EP = 0, 1, 2
	deepep := base
	deepep.Dispatcher, deepep.SMs, deepep.Overlap, deepep.DelayWgrad = "deepep", 4, []string{setup.OverlapA2A}, true
	nccl := base
	nccl.Impl, nccl.Overlap = "library", []string{setup.OverlapA2A}
	hybrid := base
	hybrid.Dispatcher, hybrid.SharedExperts, hybrid.Overlap = "hybridep", 1, []string{setup.OverlapShared}
	for name, c := range map[string]setup.Config{"deepep-a2a-delay-wgrad": deepep, "alltoall-nccl-a2a": nccl, "hybridep-shared": hybrid} {
		t.Run(name, func(t *testing.T) {
			rec, err := Run(c, setup.Env{Version: "test"})
			if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
				t.Fatalf("%v; record %+v", err, rec)
			}
			o := rec.Overlap
			if o == nil || !o.Equal || o.Exposed == nil {
				t.Fatalf("overlap %+v", o)
			}
			t.Logf("%s: step %.3g ms, sequential %.3g ms, exposed %.3g of %.3g ms; %s", name, o.Step.P50, o.Sequential.P50, o.Exposed.P50, o.Comm.P50, o.GEMMSMsNote)
		})
	}
}

// TestOverlapCUDAGraphOnHostSim: with --cuda-graph the overlapped step is
// captured on the fake driver's stream capture (segments cut at alltoall's
// count exchanges, every stream forked from the origin and joined back) and
// replayed: each form's replayed step gives the outputs and gradients of
// the same step as plain launches and of the sequential step, bit for bit
// (the record's equal; measureOverlap compares all three), its phases timed
// by the graphs' event record nodes. A planted missing join fails the
// capture with CUDA_ERROR_STREAM_CAPTURE_UNJOINED; graphs that leave out
// micro-batch 0's last forward phase fail the bit-for-bit comparison. The
// planted missing fork (of micro-batch 0's first wgrad stream) fails with
// CUDA_ERROR_STREAM_CAPTURE_ISOLATION only because that stream is idle in
// the first segment, so nothing joins it to the capture and its join is a
// plain record: it does not show that every missing fork is caught (a
// stream whose first work waits for a captured event is joined by it).
func TestOverlapCUDAGraphOnHostSim(t *testing.T) {
	hostsim.SkipIfShort(t, "internal/cuda's TestStreamCapture (the fake driver's capture)")
	harnesstest.UseHostSimLayer(t)
	base := harnesstest.DeviceCases()["softmax-natural"]
	base.Warmup, base.Iters, base.EP, base.CUDAGraph, base.SharedExperts = 2, 2, 2, true, 1
	base.RoutingFixed = true // the counts repeat: the graphs are replayed
	launches := regexp.MustCompile(`(\d+) graph launches over \d+ steps .*, (\d+) captures`)
	for _, tc := range []struct {
		name  string
		forms []string
		delay bool
	}{{"a2a", []string{setup.OverlapA2A}, false}, {"a2a-delay-wgrad", []string{setup.OverlapA2A}, true},
		{"shared", []string{setup.OverlapShared}, false}, {"shared-delay-wgrad", []string{setup.OverlapShared}, true}} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			c.Overlap, c.DelayWgrad = tc.forms, tc.delay
			rec, err := Run(c, setup.Env{Version: "test"})
			if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
				t.Fatalf("%v; record %+v", err, rec)
			}
			o := rec.Overlap
			if o == nil || !o.Equal || o.Comm == nil || o.Comm.P50 <= 0 || o.Exposed == nil {
				t.Fatalf("overlap %+v", o)
			}
			m := launches.FindStringSubmatch(o.Note)
			if m == nil {
				t.Fatalf("no graph launches in the note: %q", o.Note)
			}
			n, _ := strconv.Atoi(m[1])
			k, _ := strconv.Atoi(m[2])
			if n <= k || k == 0 || !strings.Contains(o.Note, "event record nodes") || !strings.Contains(o.Note, "the compared step was replayed from graphs captured before") {
				t.Errorf("%d launches, %d captures: want replays; %q", n, k, o.Note)
			}
			t.Logf("step %.3g ms, sequential %.3g ms, exposed %.3g of %.3g ms; %s", o.Step.P50, o.Sequential.P50, o.Exposed.P50, o.Comm.P50, m[0])
		})
	}
	for plant, want := range map[string]string{"graph-join": "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "graph-fork": "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
		"graph-drop": "(replayed from CUDA graphs; the same step as plain launches equals it) differ from the sequential step's"} {
		t.Run(plant, func(t *testing.T) {
			layer.OverlapPlant = plant
			t.Cleanup(func() { layer.OverlapPlant = "" })
			c := base
			c.Overlap, c.DelayWgrad = []string{setup.OverlapA2A}, true
			rec, err := Run(c, setup.Env{Version: "test"})
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("planted %s: %v (record %+v), want %s", plant, err, rec, want)
			}
			t.Log(err)
		})
	}
}

// TestOverlapCUDAGraphPerStepRoutingOnHostSim: with per-step routing
// (skewed) the counts change from step to step, so the overlapped a2a
// --delay-wgrad step is captured afresh each step, and segments whose
// capture the fake driver refuses (a buffer that grows) run as plain
// launches after their streams are forked again; the record is still equal
// bit for bit to the sequential step, and the note counts the fallbacks.
func TestOverlapCUDAGraphPerStepRoutingOnHostSim(t *testing.T) {
	hostsim.SkipIfShort(t, "internal/cuda's TestStreamCapture (the fake driver's capture)")
	harnesstest.UseHostSimLayer(t)
	c := harnesstest.DeviceCases()["softmax-natural"]
	c.Warmup, c.Iters, c.EP, c.CUDAGraph = 1, 2, 2, true
	c.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.2}
	c.Overlap, c.DelayWgrad = []string{setup.OverlapA2A}, true
	rec, err := Run(c, setup.Env{Version: "test"})
	if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
		t.Fatalf("%v; record %+v", err, rec)
	}
	o := rec.Overlap
	if o == nil || !o.Equal {
		t.Fatalf("overlap %+v", o)
	}
	m := regexp.MustCompile(`(\d+) segments issued as plain launches when the driver refused their capture`).FindStringSubmatch(o.Note)
	if m == nil {
		t.Fatalf("no fallbacks in the note: %q", o.Note)
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Fatalf("0 fallbacks: %q", o.Note)
	}
	t.Log(o.Note)
}
