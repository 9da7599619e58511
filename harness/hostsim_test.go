package harness

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/results"
)

// TestCUDALayerOnHostSim runs whole cuda-device layers through Run — the
// CUDA kernels (compiled for the CPU by internal/hostsim), device.CUDA's
// launches, GEMM plans, streams, events and peer copies — on internal/cuda's
// fake driver (two GPUs, device memory in host memory), cuBLASLt and cuBLAS,
// and checks that each passes the check against the float64 reference with
// the layer's tolerance, forward and backward (alltoall's and feplb's
// device backward: every gradient against the float64 reference). Timings
// come from the fake's clock and mean nothing. See hostsim.Setup for when
// it skips.
func TestCUDALayerOnHostSim(t *testing.T) {
	harnesstest.UseHostSimLayer(t)

	cases := harnesstest.DeviceCases() // ranks over the fake's two GPUs
	cases["feplb-moves"] = harnesstest.FEPLBCase()
	lib := cases["softmax-natural"]
	lib.EP, lib.Impl = 2, "library" // through the fake libnccl, one rank per GPU
	cases["alltoall-nccl-ep2"] = lib
	for name, c := range cases {
		// the subject is the check: one timed step; the configurations
		// whose backward adds nothing to the others' (the score
		// functions' backward kernels are checked in kernels'
		// TestKernelsOnHostSim/Backward) run the forward alone
		c.Warmup, c.Iters = 0, 1
		c.ForwardOnly = name == "balanced-ep8" || name == "pre-softmax-top1"
		t.Run(name, func(t *testing.T) {
			if name != "softmax-natural" && name != "balanced-ep8" {
				hostsim.SkipIfShort(t, "softmax-natural and balanced-ep8")
			}
			rec, err := Run(c, setup.Env{Version: "test"})
			if err != nil || rec.Status != results.StatusOK || rec.Correctness == nil || !rec.Correctness.Passed {
				t.Fatalf("%v; record %+v", err, rec)
			}
			gpus := min(c.EP, 2) // the fake driver has two
			if len(rec.Timing.Phases) == 0 || len(rec.Ranks.Devices) != c.EP || slices.Max(rec.Ranks.Devices) != gpus-1 {
				t.Errorf("phases %+v, ranks %+v", rec.Timing.Phases, rec.Ranks)
			}
			if c.Dispatcher == "feplb" && (rec.Rebalance == nil || rec.Rebalance.Moves == 0) {
				t.Errorf("feplb moved nothing: %+v", rec.Rebalance)
			}
			if c.ForwardOnly {
				return
			}
			// a training step: every gradient checked against the reference
			g := rec.Correctness.Grads
			if rec.Config.Pass != results.PassTraining || rec.Timing.Backward == nil || g == nil || len(g.PerTensor) < 5 {
				t.Fatalf("pass %q, backward %v, gradients %+v", rec.Config.Pass, rec.Timing.Backward, g)
			}
			t.Logf("max rel err %.2e, gradients %.2e; %s", rec.Correctness.MaxRelErr, g.MaxRelErr, rec.Ranks.Note)
		})
	}
}

// TestCUDAGraphOnHostSim: with --cuda-graph the timed steps are issued as
// graphs on the fake driver's stream capture (ranks on its two GPUs): with
// fixed routing, two captures — the step before alltoall's count exchange
// and after it — replayed every step, and the last step's output equal to
// the run's without graphs bit for bit (the fakes' arithmetic is
// deterministic); with routing drawn per step, the second part is captured
// again whenever the counts change, or issued as plain launches when the
// driver refuses its capture (a buffer that must grow), and still correct.
// Every phase is timed, as without graphs (see graphs: the timing events
// are event record nodes).
func TestCUDAGraphOnHostSim(t *testing.T) {
	hostsim.SkipIfShort(t, "internal/cuda's TestStreamCapture (the fake driver's capture)")
	harnesstest.UseHostSimLayer(t)
	c := harnesstest.DeviceCases()["softmax-natural"]
	c.EP, c.Warmup, c.Iters, c.Routing, c.RoutingFixed = 4, 1, 3, setup.Routing{Kind: setup.RoutingBalanced}, true
	run := func(c setup.Config) (*results.Record, []byte) {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "dump")
		rec, err := Run(c, setup.Env{Version: "test", Dump: dir})
		if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
			t.Fatalf("%v; %+v", err, rec)
		}
		y, err := os.ReadFile(filepath.Join(dir, "output.npy"))
		if err != nil {
			t.Fatal(err)
		}
		return rec, y
	}
	plain, want := run(c)
	c.CUDAGraph = true
	rec, got := run(c)
	steps := c.Warmup + c.Iters
	if !bytes.Equal(got, want) {
		t.Error("the last step's output with graphs differs from the one without")
	}
	if d := fmt.Sprintf("used: %d graph launches over %d steps", 2*steps, steps); !strings.Contains(rec.Timing.CUDAGraph, d) ||
		!strings.Contains(rec.Timing.CUDAGraph, ", 2 captures") || !rec.Config.CUDAGraph || plain.Timing.CUDAGraph != "not used (--cuda-graph off)" {
		t.Errorf("graphs: %q (want %q, 2 captures); without: %q", rec.Timing.CUDAGraph, d, plain.Timing.CUDAGraph)
	}
	// every phase timed as without graphs, each iteration: the fake driver,
	// as the real one, times no event whose last record was a plain record
	// inside a capture (the phase events are event record nodes)
	if len(rec.Timing.Phases) != len(plain.Timing.Phases) || len(rec.Timing.Step.Samples) != c.Iters ||
		!strings.Contains(rec.Timing.CUDAGraph, "event record nodes") {
		t.Errorf("graphs: phases %d (without: %d), step samples %d, %q", len(rec.Timing.Phases), len(plain.Timing.Phases), len(rec.Timing.Step.Samples), rec.Timing.CUDAGraph)
	}
	for i, ph := range rec.Timing.Phases {
		if ph.Name != plain.Timing.Phases[i].Name || len(ph.Samples) != c.Iters || ph.P50 <= 0 {
			t.Errorf("graphs: phase %+v", ph)
		}
	}
	c.RoutingFixed = false
	if rec, _ := run(c); !strings.Contains(rec.Timing.CUDAGraph, "used:") {
		t.Errorf("routing per step: %q", rec.Timing.CUDAGraph)
	} else {
		t.Log(rec.Timing.CUDAGraph)
	}
	c.Dispatcher = "feplb"
	if rec, err := Run(c, setup.Env{Version: "test"}); err == nil || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, "graphs") {
		t.Errorf("feplb with --cuda-graph: %v; %+v", err, rec)
	}
}
