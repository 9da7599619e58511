package layer

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/results"
)

// TestTelemetryFindsTheRanksGPU: on a fake NVML whose GPU order differs
// from CUDA's, telemetry reads the GPU at the ranks' PCI address (clocks,
// power, GPM), every GPU's memory, and says which GPU it read; an unknown or
// unmatched address falls back to NVML's GPU 0 and says so.
func TestTelemetryFindsTheRanksGPU(t *testing.T) {
	so, err := hostsim.BuildFake("fakenvml", t.TempDir(), "libnvidia-ml.so.1")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOEBENCH_NVML", so)
	read := func(bus string) (*results.Telemetry, string) {
		tm, why := StartTelemetry(bus)
		if tm == nil {
			t.Fatalf("startTelemetry(%q): %s", bus, why)
		}
		time.Sleep(GPMMinSpacing + 10*time.Millisecond) // the timed loop
		return tm.Finish()
	}
	tel, sms := read("0000:1b:00.0") // the fake's NVML GPU 1
	if tel.SMClockMHz != 1980 || tel.MemClockMHz != 2619 || tel.PowerW != 500 || !tel.GPM || tel.SMUtilPct != 77 || tel.SMOccupancyPct != 38.5 ||
		!slices.Equal(tel.MemoryUsedMax, []int64{1 << 30, 5 << 30}) || !strings.Contains(tel.GPU, "PCI 0000:1b:00.0") || len(tel.Unread) != 0 ||
		!strings.Contains(sms, "SM utilisation 77.0%") {
		t.Errorf("by PCI address: %+v; %s", tel, sms)
	}
	for _, bus := range []string{"", "0000:99:00.0"} {
		tel, _ := read(bus)
		if tel.SMClockMHz != 1100 || tel.SMUtilPct != 11 || !strings.Contains(tel.GPU, "NVML's GPU 0") || (bus != "") != (len(tel.Unread) == 1) {
			t.Errorf("bus %q: %+v", bus, tel)
		}
	}
	// found in a --cuda-libs folder as well
	t.Setenv("MOEBENCH_NVML", "")
	t.Setenv(cuda.LibDirsEnv, filepath.Dir(so))
	if tel, _ := read("0000:1b:00.0"); tel.SMClockMHz != 1980 {
		t.Errorf("NVML from %s: %+v", cuda.LibDirsEnv, tel)
	}
}

// TestGPMSpacing: GPM's two samples are never taken 100 ms apart or less
// (NVML's rule; the fake refuses metrics from closer ones): a shorter timed
// loop says GPM was not measured, and why.
func TestGPMSpacing(t *testing.T) {
	so, err := hostsim.BuildFake("fakenvml", t.TempDir(), "libnvidia-ml.so.1")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOEBENCH_NVML", so)
	tm, why := StartTelemetry("0000:1b:00.0")
	if tm == nil {
		t.Fatal(why)
	}
	tel, sms := tm.Finish()
	if tel.GPM || tel.SMUtilPct != 0 || !strings.Contains(sms, "not measured: the timed loop took") || !strings.Contains(sms, "100ms") {
		t.Errorf("a loop of no time: %+v; %s", tel, sms)
	}
}
