package cuda

import (
	"os"
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
	if err == nil && len(gpus) > 0 {
		t.Logf("found driver %d and GPUs %v", drv, gpus)
		return
	}
	t.Logf("no GPU (as expected on CI): %v", err)
}
