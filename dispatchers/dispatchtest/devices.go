package dispatchtest

// The devices a dispatcher's device tests run on: real GPUs where the
// machine has them, the host simulation's otherwise.

import (
	"os"
	"testing"

	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/device"
)

// GPUs opens up to n of the machine's GPUs, closed with the test; without
// one the test is skipped (failed with MOEBENCH_REQUIRE_GPU=1).
func GPUs(t *testing.T, n int) []device.Device {
	t.Helper()
	gs, err := device.OpenGPUs(0, n, t.TempDir())
	if err != nil {
		if os.Getenv("MOEBENCH_REQUIRE_GPU") == "1" {
			t.Fatalf("GPU required: %v", err)
		}
		t.Skipf("no GPU: %v", err)
	}
	return devices(t, gs)
}

// FakeGPUs opens n GPUs of the host simulation (hostsim.Setup: the fake
// driver, the kernels compiled for the CPU), closed with the test; they
// have $FAKECUDA_SMS SMs, 16 unless the test set it (a resident block
// holds an SM: 8 ranks' notify blocks, or 4 ranks × 4 blocks, on one).
func FakeGPUs(t *testing.T, n int) []device.Device {
	t.Helper()
	if os.Getenv("FAKECUDA_SMS") == "" {
		t.Setenv("FAKECUDA_SMS", "16")
	}
	comp := hostsim.Setup(t)
	old := device.NewCompiler
	device.NewCompiler = func() (device.Compiler, error) { return comp, nil }
	t.Cleanup(func() { device.NewCompiler = old })
	gs, err := device.OpenGPUs(n, n, "")
	if err != nil {
		t.Fatal(err)
	}
	return devices(t, gs)
}

func devices(t *testing.T, gs []*device.CUDA) []device.Device {
	devs := make([]device.Device, len(gs))
	for i, g := range gs {
		devs[i] = g
		t.Cleanup(func() { g.Close() })
	}
	return devs
}
