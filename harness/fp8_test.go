package harness

import (
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/dispatchers/feplb"
	"github.com/moebench/moebench/harness/check"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/results"
)

// TestFP8Host: each dispatcher that moves FP8 on the host runs a training
// step at fp8 that passes the check (the output and every gradient against
// the float64 reference on the same quantized inputs and weights, at the
// bf16 pipeline's tolerance: the expert GEMMs are cuBLASLt's block-scaled
// FP8 GEMMs emulated, fp8gemm.go), records its precision and expert path
// (gemm.fp8_path cublaslt-fp8-block), and moves e4m3 rows
// with their scales: the dispatch's algorithm bytes are bf16's times
// (1 + 4/128)/2 (DeepEP's fp8 factor), the combine's bf16's.
func TestFP8Host(t *testing.T) {
	for _, m := range harnesstest.FP8Movers {
		name, c := m.Name, harnesstest.FP8Config(m.Name)
		c.Domain = m.Domain
		if name == "feplb" { // skewed, so that phase 2 moves rows (and their scales)
			c.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}
		}
		rec, err := Run(c, setup.Env{Version: "test"})
		if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.Correctness.Grads == nil {
			t.Errorf("%s at fp8: %v, %+v", name, err, rec.Correctness)
			continue
		}
		if name == "feplb" && (rec.Rebalance == nil || rec.Rebalance.Moves == 0) {
			t.Errorf("feplb moved nothing: %+v", rec.Rebalance)
		}
		if rec.Config.Precision != setup.PrecisionFP8 || rec.GEMM.Method != layer.ExpertPathFP8Host || rec.GEMM.FP8Path != string(kernels.FP8GEMMBlock) {
			t.Errorf("%s: the record says precision %q, expert path %q (%s)", name, rec.Config.Precision, rec.GEMM.Method, rec.GEMM.FP8Path)
		}
		if m := rec.Correctness.Metric; !strings.Contains(m, "same quantized inputs and weights") {
			t.Errorf("%s: the check's metric says %q, not that the reference takes the quantized operands", name, m)
		}
		t.Logf("%s: max rel err %.3g, gradients %.3g", name, rec.Correctness.MaxRelErr, rec.Correctness.Grads.MaxRelErr)
		c.Precision = setup.PrecisionBF16
		bf, err := Run(c, setup.Env{Version: "test"})
		if err != nil || bf.Status != results.StatusOK {
			t.Fatalf("%s at bf16: %v", name, err)
		}
		tr, tb := rec.Traffic, bf.Traffic
		if name == "hybridep" && tr.InterDomainAlgorithm*2*128 != tb.InterDomainAlgorithm*(128+4) {
			t.Errorf("hybridep: inter-domain algorithm bytes %d at fp8, %d at bf16", tr.InterDomainAlgorithm, tb.InterDomainAlgorithm)
		}
		if tr.DispatchAlgorithm*2*128 != tb.DispatchAlgorithm*(128+4) || tr.CombineAlgorithm != tb.CombineAlgorithm || tr.DispatchAlgorithm == 0 {
			t.Errorf("%s: dispatch algorithm bytes %d at fp8, %d at bf16 (want ×132/256); combine %d and %d", name,
				tr.DispatchAlgorithm, tb.DispatchAlgorithm, tr.CombineAlgorithm, tb.CombineAlgorithm)
		}
		if !strings.Contains(tr.Formula, "e4m3") {
			t.Errorf("%s: the formula does not count the fp8 row: %s", name, tr.Formula)
		}
	}
}

// TestFP8CheckCatchesBrokenDequantization: with the expert side's
// dequantization broken on purpose — the multiplier doubled, the next
// block's multiplier, none at all; on the FP8 GEMM path the activation
// multipliers in the wrong (row-major) order, each weight block the next
// block's multiplier, fc2's input not dequantized — the check fails; so
// it does with feplb's phase 2 giving its helpers the owner's multipliers
// one float off ("scale-offset") or no e4m3 weights ("unmoved").
func TestFP8CheckCatchesBrokenDequantization(t *testing.T) {
	defer func() { layer.FP8Fault, feplb.FP8Fault = "", "" }()
	for _, fault := range []string{"scale", "block", "none", "lt-order", "w-block", "fc2-none", "scale-offset", "unmoved"} {
		layer.FP8Fault, feplb.FP8Fault = fault, ""
		c := harnesstest.FP8Config("alltoall")
		if fault == "scale-offset" || fault == "unmoved" {
			layer.FP8Fault, feplb.FP8Fault = "", fault
			c = harnesstest.FP8Config("feplb")
			c.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}
		}
		c.ForwardOnly = true
		rec, err := Run(c, setup.Env{Version: "test"})
		if err == nil || rec.Status != results.StatusFailed || rec.Correctness == nil || rec.Correctness.MaxRelErr <= check.Tolerance {
			t.Errorf("dequantization broken (%s): %v, %+v", fault, err, rec.Correctness)
		} else {
			t.Logf("broken (%s, %s): max rel err %.3g", fault, c.Dispatcher, rec.Correctness.MaxRelErr)
		}
	}
}

// TestFP8Unavailable: a design's FP8 constraint makes it unavailable with
// the reason; never a bf16 run in disguise (mxfp8: TestMXFP8Unavailable).
func TestFP8Unavailable(t *testing.T) {
	for _, device := range []string{"host", "cuda"} {
		c := harnesstest.FP8Config("hybridep")
		c.Hidden, c.Device = 384, device
		rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
		if !dispatchers.IsUnavailable(err) || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, "--hidden a multiple of 512 (BufferConfig.is_valid); --hidden is 384") {
			t.Errorf("hybridep at hidden 384 on the %s device: %v, %s %q", device, err, rec.Status, rec.Reason)
		}
	}
}

// TestFP8HostExpertModes: the host's FP8 GEMM path computes the same
// outputs whether the layer holds its experts or draws them (the e4m3
// weights made from each draw, not kept), and both pass the check.
func TestFP8HostExpertModes(t *testing.T) {
	var outs [][]float32
	for _, mode := range []string{setup.HostExpertsHeld, setup.HostExpertsDrawn} {
		c := harnesstest.FP8Config("alltoall")
		c.ForwardOnly, c.HostExperts = true, mode
		l, err := layer.NewLayer(c)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := Run(c, setup.Env{Version: "test"})
		if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.GEMM.FP8Path != string(kernels.FP8GEMMBlock) {
			t.Fatalf("%s: %v, %+v (%s)", mode, err, rec.Correctness, rec.GEMM.FP8Path)
		}
		d, err := dispatchers.New("alltoall", "native", c.DispatcherEnv())
		if err == nil {
			err = d.Bind(l.Shape, l.Ranks)
		}
		if err == nil {
			err = l.Iteration(d, func(_ string, _ int, fn func() error) error { return fn() })
		}
		if err != nil {
			t.Fatal(err)
		}
		if mode == setup.HostExpertsDrawn && l.FP8Weights != nil {
			t.Errorf("a drawn layer kept %d experts' e4m3 weights", len(l.FP8Weights))
		}
		outs = append(outs, l.Ranks[0].Y)
	}
	if !slices.Equal(outs[0], outs[1]) {
		t.Errorf("held and drawn layers' outputs differ")
	}
}

// TestFP8HostTensor: on the host device's per-tensor FP8 GEMM path
// (FP8GEMMHostPath cublaslt-fp8-tensor, fp8tensor.go) each dispatcher that
// moves FP8 runs a training step that passes the check — the reference
// taking each tensor's multiplier from all of the expert's routed rows —
// and the record says the path; with fc1 given the weights' multiplier for
// the activations', or each operand's multiplier from half its rows, the
// check fails.
func TestFP8HostTensor(t *testing.T) {
	was := layer.FP8GEMMHostPath
	layer.FP8GEMMHostPath = kernels.FP8GEMMTensor
	defer func() { layer.FP8GEMMHostPath, layer.FP8Fault = was, "" }()
	for _, m := range harnesstest.FP8Movers {
		c := harnesstest.FP8Config(m.Name)
		c.Domain = m.Domain
		if m.Name == "feplb" { // skewed, so that phase 2 moves whole experts (rows and weights: a segment is still all of an expert's rows)
			c.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}
		}
		rec, err := Run(c, setup.Env{Version: "test"})
		if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.Correctness.Grads == nil {
			t.Errorf("%s (domain %d) per tensor: %v, %+v", m.Name, m.Domain, err, rec.Correctness)
			continue
		}
		if rec.GEMM.Method != layer.ExpertPathFP8Tensor || rec.GEMM.FP8Path != string(kernels.FP8GEMMTensor) || !strings.Contains(rec.GEMM.FP8PathReason, "SCALAR_32F") {
			t.Errorf("%s: the record says %q (%s: %s)", m.Name, rec.GEMM.Method, rec.GEMM.FP8Path, rec.GEMM.FP8PathReason)
		}
		t.Logf("%s (domain %d): max rel err %.3g, gradients %.3g", m.Name, m.Domain, rec.Correctness.MaxRelErr, rec.Correctness.Grads.MaxRelErr)
	}
	// segments longer than ExpertBlock rows: one tensor each, not split
	// (the reference's tensor is all of the expert's rows)
	c := harnesstest.FP8Config("alltoall")
	c.Tokens, c.EP, c.ForwardOnly = 1024, 2, true
	c.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}
	if rec, err := Run(c, setup.Env{Version: "test"}); err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
		t.Errorf("per tensor, %d tokens a rank: %v, %+v", c.Tokens, err, rec.Correctness)
	} else {
		t.Logf("%d tokens a rank: max rel err %.3g", c.Tokens, rec.Correctness.MaxRelErr)
	}
	// a sampled check: each tensor's multiplier still spans all of the
	// expert's routed rows, the sample's and the others'
	func() {
		defer func(b float64) { setup.RefFLOPBudget = b }(setup.RefFLOPBudget)
		setup.RefFLOPBudget = 1
		c := harnesstest.FP8Config("alltoall")
		c.CheckAll = false
		rec, err := Run(c, setup.Env{Version: "test"})
		if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.Correctness.Grads == nil || !strings.Contains(rec.Correctness.Sample, "16 per rank") {
			t.Errorf("sampled per tensor: %v, %+v", err, rec.Correctness)
		} else {
			t.Logf("sampled (%s): max rel err %.3g, gradients %.3g", rec.Correctness.Sample, rec.Correctness.MaxRelErr, rec.Correctness.Grads.MaxRelErr)
		}
	}()
	for _, fault := range []string{"t-wscale", "t-half"} {
		layer.FP8Fault = fault
		c := harnesstest.FP8Config("alltoall")
		c.ForwardOnly = true
		rec, err := Run(c, setup.Env{Version: "test"})
		if err == nil || rec.Status != results.StatusFailed || rec.Correctness == nil || rec.Correctness.MaxRelErr <= check.Tolerance {
			t.Errorf("per tensor broken (%s): %v, %+v", fault, err, rec.Correctness)
		} else {
			t.Logf("broken (%s): max rel err %.3g", fault, rec.Correctness.MaxRelErr)
		}
	}
	// the layer's per-tensor weights broken (fc1's multiplier doubled) in a
	// training step: the reference's weights are its own, so the output
	// check fails (a review found it passing, output and gradients, when the
	// reference quantized through the layer's function)
	layer.FP8Fault = "t-w1"
	rec, err := Run(harnesstest.FP8Config("alltoall"), setup.Env{Version: "test"})
	if err == nil || rec.Status != results.StatusFailed || rec.Correctness == nil || rec.Correctness.MaxRelErr <= check.Tolerance {
		t.Errorf("per tensor broken (t-w1): %v, %+v", err, rec.Correctness)
	} else {
		t.Logf("broken (t-w1): max rel err %.3g", rec.Correctness.MaxRelErr)
	}
}

// TestFP8UnavailableBelowSM89: on a GPU below sm_89 (the fake driver's
// FAKECUDA_CC 80) --precision fp8 is unavailable with the reason, never
// run in software FP8 and bf16 GEMMs (bench dispatch:
// TestFP8BenchDispatchBelowSM89).
func TestFP8UnavailableBelowSM89(t *testing.T) {
	harnesstest.UseHostSimLayer(t)
	t.Setenv("FAKECUDA_CC", "80")
	c := harnesstest.FP8Config("alltoall")
	c.Device = "cuda"
	rec, err := Run(c, setup.Env{Version: "test"})
	want := "GPU 0 is sm_80, where Transformer Engine refuses FP8"
	if !dispatchers.IsUnavailable(err) || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, want) {
		t.Errorf("run: %v, %s %q; want unavailable, %q", err, rec.Status, rec.Reason, want)
	}
}
