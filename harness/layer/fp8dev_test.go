package layer

import (
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// TestFP8GEMMPathChoice: the cuda layer runs the block-scaled FP8 GEMMs
// where every device offers block scaling (Emu emulates it), the
// per-tensor ones where they offer that only (the answer faked), and
// otherwise says why it runs bf16 on dequantized rows: an ffn cuBLAS's FP8 rules refuse,
// no cuBLASLt, a library or GPU without block scaling (here a cuBLASLt
// 12.8 on a device of unknown compute capability), one such device among
// Emus, a test's hook (FP8DevDequant). feplb runs the FP8 GEMMs as the
// others do (its phase 2 moves the e4m3 weights).
func TestFP8GEMMPathChoice(t *testing.T) {
	emu, _ := harnesstest.Emus(1)(1, 1)
	old := &device.CUDA{Lt: &cuda.CuBLASLt{Version: 120800}}
	c := harnesstest.FP8DeviceCases()["alltoall"]
	fe, ffn := c, c
	fe.Dispatcher = "feplb"
	ffn.FFN = 24
	for _, tc := range []struct {
		name string
		c    setup.Config
		devs []device.Device
		path kernels.FP8GEMMPath
		why  string
	}{
		{"emu", c, emu, kernels.FP8GEMMBlock, "Emu simulation runs cuBLASLt's block-scaled FP8 GEMM"},
		{"feplb", fe, emu, kernels.FP8GEMMBlock, "Emu simulation runs cuBLASLt's block-scaled FP8 GEMM"},
		{"ffn24", ffn, emu, kernels.FP8GEMMDequant, "--ffn 24"},
		{"no-cublaslt", c, []device.Device{&device.CUDA{}}, kernels.FP8GEMMDequant, "no cuBLASLt"},
		{"old-cublaslt", c, []device.Device{old}, kernels.FP8GEMMDequant, "offers bf16-dequant (cuBLASLt 120800"},
		{"emu-and-old", c, append(append([]device.Device{}, emu...), old), kernels.FP8GEMMDequant, "offers bf16-dequant"},
		{"hook", c, emu, kernels.FP8GEMMDequant, "a test's hook"},
	} {
		FP8DevDequant = tc.name == "hook"
		path, why := FP8GEMMPath(tc.devs, tc.c)
		FP8DevDequant = false
		if path != tc.path || !strings.Contains(why, tc.why) {
			t.Errorf("%s: %s (%s), want %s (…%s…)", tc.name, path, why, tc.path, tc.why)
		}
	}
	// a library offering per-tensor scaling only (the answer faked): the
	// per-tensor path, said with the reason; feplb stays bf16-dequant
	defer func() { FP8GEMMOffered = "" }()
	FP8GEMMOffered = kernels.FP8GEMMTensor
	if path, why := FP8GEMMPath(emu, c); path != kernels.FP8GEMMTensor || !strings.Contains(why, "per-tensor FP8 GEMM") || !strings.Contains(why, "faked by a test") {
		t.Errorf("per tensor: %s (%s)", path, why)
	}
	if path, why := FP8GEMMPath(emu, fe); path != kernels.FP8GEMMDequant {
		t.Errorf("feplb per tensor: %s (%s)", path, why)
	}
	// over several processes the reference cannot see every routed row
	if path, why := fp8LayerPath(emu, c, true); path != kernels.FP8GEMMDequant || !strings.Contains(why, "several processes") {
		t.Errorf("per tensor over processes: %s (%s)", path, why)
	}
	if path, _ := fp8LayerPath(emu, c, false); path != kernels.FP8GEMMTensor {
		t.Errorf("per tensor in one process: %s", path)
	}
	// a shape whose per-tensor reference (fc1 over every routed row) is
	// beyond the check's budget: bf16-dequant with the reason, unless
	// --check all pays for it
	defer func(b float64) { setup.RefFLOPBudget = b }(setup.RefFLOPBudget)
	setup.RefFLOPBudget = fp8TensorRefFLOPs(c) / (fp8TensorRefOver + 1)
	c.CheckAll, c.Check = false, true
	if path, why := fp8LayerPath(emu, c, false); path != kernels.FP8GEMMDequant || !strings.Contains(why, "--check all pays it") {
		t.Errorf("per tensor beyond the check's budget: %s (%s)", path, why)
	}
	c.CheckAll = true
	if path, _ := fp8LayerPath(emu, c, false); path != kernels.FP8GEMMTensor {
		t.Errorf("per tensor beyond the budget with --check all: %s", path)
	}
	c.CheckAll, c.Check = false, false
	if path, _ := fp8LayerPath(emu, c, false); path != kernels.FP8GEMMTensor {
		t.Errorf("per tensor beyond the budget without the check: %s", path)
	}
}
