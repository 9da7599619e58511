package kernels

import (
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/internal/hostsim"
)

// useHostSim makes the cuda device run on the host simulation (see
// hostsim.Setup): internal/cuda's fake libcuda, cuBLASLt and cuBLAS (device
// memory is host memory; the GEMMs are the fakes' column-major loops), and
// the CUDA kernels compiled for the CPU.
func useHostSim(t *testing.T) {
	comp := hostsim.Setup(t)
	old := NewCompiler
	NewCompiler = func() (Compiler, error) { return comp, nil }
	t.Cleanup(func() { NewCompiler = old })
}

// TestKernelsOnHostSim runs the GPU tests' checks — the CUDA device
// against Emu on the same random inputs, with the same tolerances — on
// the host simulation (see useHostSim): the kernels' CUDA C, the launches
// that kernels.CUDA makes, and the fakes' GEMMs.
func TestKernelsOnHostSim(t *testing.T) {
	useHostSim(t)
	for _, tc := range []struct {
		name  string
		check func(*gpuPair)
	}{
		{"CopiesAndEvents", checkCopiesAndEvents}, {"GEMM", checkGEMM}, {"GroupedGEMM", checkGroupedGEMM},
		{"Permute", checkPermute}, {"SortChunks", checkSortChunks}, {"SwiGLUAndUnpermute", checkSwiGLUAndUnpermute},
		{"Router", checkRouter}, {"Launches", checkLaunches},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			tc.check(openPair(t))
			t.Logf("%.1f s", time.Since(start).Seconds())
		})
	}
}

// TestProbeCUDANamesWhyNot: on a CUDA 12 driver with only a cuBLASLt 13
// (the fake's), the cuda device does not open and ProbeCUDA says why, so
// that --device auto falls back to host with the reason; on a CUDA 13
// driver it opens.
func TestProbeCUDANamesWhyNot(t *testing.T) {
	useHostSim(t)
	if err := ProbeCUDA(); err != nil {
		t.Fatalf("CUDA 13 driver: %v", err)
	}
	t.Setenv("FAKECUDA_DRIVER_VERSION", "12080")
	if err := ProbeCUDA(); err == nil || !strings.Contains(err.Error(), "cublasLtCreate") {
		t.Fatalf("cuBLASLt 13 on a CUDA 12 driver: %v", err)
	}
}
