package kernels

import (
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
