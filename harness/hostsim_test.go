package harness

import (
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/results"
)

// TestCUDALayerOnHostSim runs whole cuda-device layers through Run — the
// CUDA kernels (compiled for the CPU by internal/hostsim), kernels.CUDA's
// launches, GEMM plans, streams, events and peer copies — on internal/cuda's
// fake driver (two GPUs, device memory in host memory), cuBLASLt and cuBLAS,
// and checks that each passes the check against the float64 reference with
// the layer's tolerance. Timings come from the fake's clock and mean
// nothing. See hostsim.Setup for when it skips.
func TestCUDALayerOnHostSim(t *testing.T) {
	useHostSimLayer(t)

	cases := deviceCases() // ranks over the fake's two GPUs
	cases["feplb-moves"] = feplbCase()
	lib := cases["softmax-natural"]
	lib.EP, lib.Impl = 2, "library" // through the fake libnccl, one rank per GPU
	cases["alltoall-nccl-ep2"] = lib
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			rec, err := Run(c, Env{Version: "test"})
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
			t.Logf("max rel err %.2e; %s", rec.Correctness.MaxRelErr, rec.Ranks.Note)
		})
	}
	// the kernel benchmark's rows, with small ceilings (the fake GEMM is a
	// plain loop), peer rows over the two GPUs
	kb, err := BenchKernels(cases["softmax-natural"], Env{Version: "test"}, BenchSizes{CopyBytes: 1 << 20, GEMMDim: 64})
	if err != nil || len(kb.Rows) < 10 || !strings.HasPrefix(kb.Peer, "peer rows") {
		t.Fatalf("bench: %v; %+v", err, kb)
	}
}

// useHostSimLayer makes cuda-device runs use the host simulation: the fake
// driver, cuBLASLt, cuBLAS and NCCL, and the kernels compiled for the CPU.
func useHostSimLayer(t *testing.T) {
	comp := hostsim.Setup(t)
	nccl, err := hostsim.BuildFake("fakenccl", t.TempDir(), "libnccl.so.2")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOEBENCH_NCCL", nccl)
	old := kernels.NewCompiler
	kernels.NewCompiler = func() (kernels.Compiler, error) { return comp, nil }
	t.Cleanup(func() { kernels.NewCompiler = old })
}
