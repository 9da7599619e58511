package comm

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/device"
)

// useHostSim makes the cuda device run on the host simulation (see
// hostsim.Setup): internal/cuda's fake libcuda, cuBLASLt and cuBLAS (device
// memory is host memory; the GEMMs are the fakes' column-major loops), and
// the CUDA kernels compiled for the CPU.
func useHostSim(t *testing.T) {
	comp := hostsim.Setup(t)
	old := device.NewCompiler
	device.NewCompiler = func() (device.Compiler, error) { return comp, nil }
	t.Cleanup(func() { device.NewCompiler = old })
}

// hostSimCUDA opens the cuda device on the host simulation (useHostSim),
// closed when the test ends.
func hostSimCUDA(t *testing.T) *device.CUDA {
	useHostSim(t)
	c, err := device.OpenCUDA(0, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestKernelsOnHostSim runs the GPU tests' checks — the CUDA device
// against Emu on the same random inputs, with the same tolerances — on
// the host simulation (see useHostSim): the kernels' CUDA C, the launches
// that device.CUDA makes, and the fakes' GEMMs.
func TestKernelsOnHostSim(t *testing.T) {
	useHostSim(t)
	for _, tc := range []struct {
		name  string
		check func(*gpuPair)
	}{
		{"CopiesAndEvents", checkCopiesAndEvents}, {"GEMM", checkGEMM}, {"GroupedGEMM", checkGroupedGEMM},
		{"Permute", checkPermute}, {"SortChunks", checkSortChunks}, {"SwiGLUAndUnpermute", checkSwiGLUAndUnpermute},
		{"Router", checkRouter}, {"Launches", checkLaunches}, {"Backward", checkBackward},
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
	if err := device.ProbeCUDA(); err != nil {
		t.Fatalf("CUDA 13 driver: %v", err)
	}
	t.Setenv("FAKECUDA_DRIVER_VERSION", "12080")
	if err := device.ProbeCUDA(); err == nil || !strings.Contains(err.Error(), "cublasLtCreate") {
		t.Fatalf("cuBLASLt 13 on a CUDA 12 driver: %v", err)
	}
}

// archLister is a compiler that says which architectures it has.
type archLister struct {
	device.Compiler
	archs []int
}

func (a archLister) SupportedArchs() ([]int, error) { return a.archs, nil }

// TestArchitectureChoice: a GPU whose architecture the compiler lacks
// (Blackwell, compute capability 10.0, with an NVRTC that stops at sm_90)
// gets PTX of the newest one it has, which the driver compiles; one it has
// gets its cubin; a GPU below 8.0 is refused with the reason.
func TestArchitectureChoice(t *testing.T) {
	useHostSim(t)
	comp, _ := device.NewCompiler()
	device.NewCompiler = func() (device.Compiler, error) { return archLister{comp, []int{75, 80, 86, 90}}, nil }
	for _, tc := range []struct{ cc, want string }{{"100", "compute_90"}, {"90", "sm_90"}, {"86", "sm_86"}, {"75", "compute capability 7.5"}} {
		t.Setenv("FAKECUDA_CC", tc.cc)
		c, err := device.OpenCUDA(0, t.TempDir())
		got := ""
		if err != nil {
			got = err.Error()
		} else {
			got = c.Arch
			c.Close()
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("compute capability %s: %q, want %q", tc.cc, got, tc.want)
		}
	}
	if _, err := device.ChooseArch(100, []int{70, 75}); err == nil {
		t.Error("no architecture from 8.0 up: no error")
	}
}

// TestGEMMAlgorithmsTimed: the heuristic's algorithms for a new shape are
// each timed once and the fastest kept (the fake cuBLASLt's second takes
// the least time on the fake driver's clock), when tuning is allowed; when
// it is not (a timed step), the shape takes the nearest timed shape's
// algorithm, which the heuristic offers for it too, and is counted.
func TestGEMMAlgorithmsTimed(t *testing.T) {
	c := hostSimCUDA(t)
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	m, n, k := 8, 16, 32
	out, _ := c.Alloc(int64(2 * (m + 8) * n))
	a, _ := c.Alloc(int64(2 * (m + 8) * k))
	w, _ := c.Alloc(int64(2 * n * k))
	c.TuneGEMMs = true
	if err := c.GEMM(out, a, w, m, n, k, false, s); err != nil {
		t.Fatal(err)
	}
	c.TuneGEMMs = false
	if err := c.GEMM(out, a, w, m+8, n, k, false, s); err != nil {
		t.Fatal(err)
	}
	if err := c.SyncStream(s); err != nil {
		t.Fatal(err)
	}
	var chosen []int
	for key, g := range c.Plans {
		if g.Algorithms() != 3 {
			t.Errorf("shape %+v: %d algorithms asked for, the fake offers 3", key, g.Algorithms())
		}
		if key.Op.M == m {
			chosen = append([]int{g.Chosen()}, chosen...)
		} else {
			chosen = append(chosen, g.Chosen())
		}
	}
	if !slices.Equal(chosen, []int{1, 1}) || c.Tuned != 1 || c.Untuned != 1 || c.Matched != 1 {
		t.Errorf("chosen %v (want the fastest, 1, then the timed shape's choice, 1), tuned %d, untuned %d, matched %d", chosen, c.Tuned, c.Untuned, c.Matched)
	}
}
