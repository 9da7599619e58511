package harness

import (
	"testing"

	"github.com/moebench/moebench/results"
)

// TestOverlapOnHostSim runs overlapped steps on the cuda device through the
// host simulation (the real CUDA C compiled for the CPU, the fake driver's
// streams and events, the fake NCCL): deepep's SM-driven kernels with a2a
// and the delayed wgrad, alltoall through NCCL with a2a, hybridep with the
// shared expert on its side stream. Each must pass the check and give the
// sequential step's output and gradients bit for bit.
func TestOverlapOnHostSim(t *testing.T) {
	useHostSimLayer(t)
	base := deviceCases()["softmax-natural"]
	base.Warmup, base.Iters, base.EP = 0, 1, 2
	deepep := base
	deepep.Dispatcher, deepep.SMs, deepep.Overlap, deepep.DelayWgrad = "deepep", 4, []string{OverlapA2A}, true
	nccl := base
	nccl.Impl, nccl.Overlap = "library", []string{OverlapA2A}
	hybrid := base
	hybrid.Dispatcher, hybrid.SharedExperts, hybrid.Overlap = "hybridep", 1, []string{OverlapShared}
	for name, c := range map[string]Config{"deepep-a2a-delay-wgrad": deepep, "alltoall-nccl-a2a": nccl, "hybridep-shared": hybrid} {
		t.Run(name, func(t *testing.T) {
			rec, err := Run(c, Env{Version: "test"})
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
