package harnesstest

import (
	"testing"

	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/device"
)

// UseHostSimLayer makes cuda-device runs use the host simulation: the fake
// driver, cuBLASLt, cuBLAS and NCCL, and the kernels compiled for the CPU.
func UseHostSimLayer(t *testing.T) {
	comp := hostsim.Setup(t)
	nccl, err := hostsim.BuildFake("fakenccl", t.TempDir(), "libnccl.so.2")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOEBENCH_NCCL", nccl)
	old := device.NewCompiler
	device.NewCompiler = func() (device.Compiler, error) { return comp, nil }
	t.Cleanup(func() { device.NewCompiler = old })
}
