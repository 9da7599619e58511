package harness

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/internal/cuda"
)

// The layer's GPU tests live here, with the other TestGPU*, since
// scripts/build-gpu-bins.sh builds package harness's test binary.

// TestGPUCopyProbe: the copy-engine probe runs on the GPU and gives a
// verdict with its numbers.
func TestGPUCopyProbe(t *testing.T) {
	dev := harnesstest.OpenGPU(t)
	defer dev.Close()
	v, err := layer.ProbeCopies(dev, 1)
	if err != nil || !strings.Contains(v, "by measurement") {
		t.Fatalf("probe: %q, %v", v, err)
	}
	t.Log(v)
}

// TestGPUTelemetry: on a GPU machine NVML answers, memory in use is read and
// GPM is either measured or its absence explained; the GPU read is CUDA's
// device 0, found by its PCI address.
func TestGPUTelemetry(t *testing.T) {
	bus := ""
	if d, err := cuda.OpenDriver(); err == nil {
		bus, _ = d.PCIBusID(0)
	}
	tm, why := layer.StartTelemetry(bus)
	if tm == nil {
		if os.Getenv("MOEBENCH_REQUIRE_GPU") == "1" {
			t.Fatalf("GPU required: %s", why)
		}
		t.Skipf("no NVML: %s", why)
	}
	time.Sleep(2 * layer.GPMMinSpacing) // a timed loop GPM can measure
	tel, sms := tm.Finish()
	if len(tel.MemoryUsedMax) == 0 || tel.MemoryUsedMax[0] <= 0 || !(tel.SMClockMHz > 0) || (!tel.GPM && len(tel.Unread) == 0) ||
		bus == "" || !strings.Contains(tel.GPU, bus) {
		t.Errorf("telemetry %+v", tel)
	}
	t.Logf("%+v; %s", tel, sms)
}
