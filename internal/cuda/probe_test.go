package cuda

import (
	"os"
	"regexp"
	"strings"
	"testing"
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
