package cuda

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/internal/hostsim"
)

// TestProbe: without a GPU, Probe must return an error, never crash; with
// MOEBENCH_REQUIRE_GPU=1 (the GPU check script) it must find one.
func TestProbe(t *testing.T) {
	drv, gpus, err := Probe()
	if os.Getenv("MOEBENCH_REQUIRE_GPU") == "1" {
		if err != nil || len(gpus) == 0 || drv <= 0 {
			t.Fatalf("GPU required: driver %d, gpus %v, err %v", drv, gpus, err)
		}
		return
	}
	switch {
	case err == nil && len(gpus) > 0:
		t.Logf("found driver %d and GPUs %v", drv, gpus)
	case err == nil:
		t.Errorf("no error and no GPU: a machine without GPUs must say why")
	case !regexp.MustCompile(`libcuda|\bcu[A-Z]\w+`).MatchString(err.Error()):
		t.Errorf("error %q names neither the library nor the failing call", err)
	default:
		t.Logf("no GPU (as expected on CI): %v", err)
	}
}

func TestDoctorSaysWhy(t *testing.T) {
	t.Setenv("MOEBENCH_NCCL", "/nonexistent/libnccl.so.2")
	comps := Doctor()
	names := map[string]Component{}
	for _, c := range comps {
		names[c.Name] = c
		if !c.Found && c.Detail == "" {
			t.Errorf("%s missing without a reason", c.Name)
		}
		if c.Found && c.Version == "" {
			t.Errorf("%s found without a version", c.Name)
		}
	}
	for _, n := range []string{"driver (libcuda)", "NVRTC", "cuBLASLt", "NCCL", "NVML"} {
		if _, ok := names[n]; !ok {
			t.Errorf("doctor does not report %s", n)
		}
	}
	if c := names["NCCL"]; c.Found || !strings.Contains(c.Detail, "MOEBENCH_NCCL=/nonexistent/libnccl.so.2 does not load") {
		t.Errorf("NCCL with a bad override: %+v", c)
	}
}

func TestDoctorFindsNCCL(t *testing.T) {
	buildFake(t, "fakenccl", "MOEBENCH_NCCL")
	c := probeNCCL()
	if !c.Found || c.Version != "2.21.5" || !strings.Contains(c.Path, "libfakenccl.so") || !strings.Contains(c.Detail, "one rank per GPU") {
		t.Errorf("NCCL through MOEBENCH_NCCL: %+v", c)
	}
}

// TestLibraryMajorFollowsDriver: with a CUDA 12 driver, cuBLASLt 12 is
// loaded even where a cuBLASLt 13 is found first (a CUDA 13 library cannot
// run on a CUDA 12 driver); with a CUDA 13 driver, cuBLASLt 13; with only a
// newer library than the driver, the other major is tried and the failure
// says why.
func TestLibraryMajorFollowsDriver(t *testing.T) {
	buildFake(t, "fakecuda", "MOEBENCH_LIBCUDA")
	t.Setenv("MOEBENCH_CUBLASLT", "")
	a, b := t.TempDir(), t.TempDir()
	for dir, file := range map[string]string{a: "libcublasLt.so.13", b: "libcublasLt.so.12"} {
		if _, err := hostsim.BuildFake("fakecublaslt", dir, file); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(LibDirsEnv, a+":"+b) // the 13 is found first
	for _, tc := range []struct {
		driver, want string
	}{{"12080", filepath.Join(b, "libcublasLt.so.12")}, {"13000", filepath.Join(a, "libcublasLt.so.13")}} {
		t.Setenv("FAKECUDA_DRIVER_VERSION", tc.driver)
		lt, err := OpenCuBLASLt()
		if err != nil || lt.Path != tc.want {
			t.Fatalf("driver %s: %v, %+v; want %s", tc.driver, err, lt, tc.want)
		}
		if err := lt.Init(); err != nil {
			t.Errorf("driver %s: %v", tc.driver, err)
		}
	}
	t.Setenv(LibDirsEnv, a) // only the 13, on a CUDA 12 driver
	t.Setenv("FAKECUDA_DRIVER_VERSION", "12080")
	lt, err := OpenCuBLASLt()
	if err != nil {
		t.Fatal(err)
	}
	if err := lt.Init(); err == nil || !strings.Contains(err.Error(), "libcublasLt.so.13") {
		t.Errorf("cuBLASLt 13 on a CUDA 12 driver: %v", err)
	}
}

// TestNVRTCArchitectures: against a fake NVRTC of 12.6's architectures, the
// binding lists them, compiles a cubin for one it has, PTX for a virtual
// one, and fails naming the option for one it lacks (Blackwell's sm_100).
func TestNVRTCArchitectures(t *testing.T) {
	buildFake(t, "fakenvrtc", "MOEBENCH_NVRTC")
	t.Setenv("FAKENVRTC_ARCHS", "75,80,86,89,90")
	n, err := openNVRTC()
	if err != nil {
		t.Fatal(err)
	}
	if a, err := n.SupportedArchs(); err != nil || !slices.Equal(a, []int{75, 80, 86, 89, 90}) {
		t.Fatalf("SupportedArchs = %v, %v", a, err)
	}
	compile := func(arch string) ([]byte, error) {
		return n.Compile("k.cu", "extern \"C\" __global__ void k() {}", nil, []string{"--gpu-architecture=" + arch})
	}
	if b, err := compile("sm_90"); err != nil || !strings.HasPrefix(string(b), "\x7fELF") {
		t.Errorf("sm_90: %q, %v", b, err)
	}
	if b, err := compile("compute_90"); err != nil || !strings.Contains(string(b), ".target sm_90") || b[len(b)-1] != 0 {
		t.Errorf("compute_90: %q, %v (PTX, NUL-terminated)", b, err)
	}
	if _, err := compile("sm_100"); err == nil || !strings.Contains(err.Error(), "gpu-architecture") {
		t.Errorf("sm_100: %v", err)
	}
}
