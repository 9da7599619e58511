package cuda

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/moebench/moebench/internal/cuda/abi"
)

// TestOneNVMLBinding: NVML is called through go-nvml only (DESIGN.md's
// build card): abi.h declares no NVML entry point and no Go file of
// internal/cuda calls one through a trampoline of its own.
func TestOneNVMLBinding(t *testing.T) {
	if m := regexp.MustCompile(`\bnvml\w+`).FindAllString(abi.Header, -1); len(m) > 0 {
		t.Errorf("abi.h declares NVML entry points %v: NVML goes through go-nvml", m)
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(src), "C.mbcall_"+"nvml") {
			t.Errorf("%s calls NVML through its own trampoline: NVML goes through go-nvml", f)
		}
	}
}

// TestProbeNVML: doctor's NVML row, without the library (what was tried,
// and what telemetry then says) and on the fake (its driver version).
func TestProbeNVML(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent/libnvidia-ml.so.1")
	c := probeNVML()
	if c.Found || !strings.HasPrefix(c.Detail, "MOEBENCH_NVML=/nonexistent/libnvidia-ml.so.1 does not load: ") ||
		!strings.HasSuffix(c.Detail, `; telemetry would say "not measured"`) {
		t.Errorf("without NVML: %+v", c)
	}
	buildFake(t, "fakenvml", "MOEBENCH_NVML")
	c = probeNVML()
	if !c.Found || c.Version != "580.00.fake" || c.Path != os.Getenv("MOEBENCH_NVML") || c.Detail != "telemetry: memory, clocks, power" {
		t.Errorf("on the fake: %+v", c)
	}
}
