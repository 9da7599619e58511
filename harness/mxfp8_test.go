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
	"github.com/moebench/moebench/results"
)

// mxConfig is FP8Config at mxfp8: hidden 512 (16 MX blocks a row), ffn 32
// (one block along fc2's k).
func mxConfig(dispatcher string) setup.Config {
	c := harnesstest.FP8Config(dispatcher)
	c.Precision = setup.PrecisionMXFP8
	return c
}

// TestMXFP8Host: --dispatcher alltoall --precision mxfp8 --hidden 512 (and
// feplb over it, skewed so that phase 2 moves rows with their E8M0 scales)
// runs a training step on the host device that passes the check — the
// float64 reference on the same 1×32 quantized inputs and weights, the
// expert GEMMs MX-emulated (gemm.fp8_path mx-emulated) — and moves rows
// of hidden e4m3 bytes + hidden/32 E8M0 bytes: the dispatch's bytes are
// bf16's × (512 + 16)/1024, the combine's bf16's.
func TestMXFP8Host(t *testing.T) {
	for _, name := range []string{"alltoall", "feplb"} {
		c := mxConfig(name)
		if name == "feplb" {
			c.Domain, c.Routing = 2, setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}
		}
		rec, err := Run(c, setup.Env{Version: "test"})
		if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.Correctness.Grads == nil {
			t.Errorf("%s at mxfp8: %v, %s %q, %+v", name, err, rec.Status, rec.Reason, rec.Correctness)
			continue
		}
		if name == "feplb" && (rec.Rebalance == nil || rec.Rebalance.Moves == 0) {
			t.Errorf("feplb moved nothing: %+v", rec.Rebalance)
		}
		if rec.Config.Precision != setup.PrecisionMXFP8 || rec.GEMM.Method != layer.ExpertPathMXHost || rec.GEMM.FP8Path != layer.MXGEMMHostPath ||
			!strings.Contains(rec.GEMM.FP8PathReason, "not a measured Blackwell") {
			t.Errorf("%s: the record says precision %q, method %q, path %q (%s)", name, rec.Config.Precision, rec.GEMM.Method, rec.GEMM.FP8Path, rec.GEMM.FP8PathReason)
		}
		if m := rec.Correctness.Metric; !strings.Contains(m, "1×32 E8M0 scales") {
			t.Errorf("%s: the check's metric says %q, not that the reference takes the MX operands", name, m)
		}
		t.Logf("%s: max rel err %.3g, gradients %.3g", name, rec.Correctness.MaxRelErr, rec.Correctness.Grads.MaxRelErr)
		c.Precision = setup.PrecisionBF16
		bf, err := Run(c, setup.Env{Version: "test"})
		if err != nil || bf.Status != results.StatusOK {
			t.Fatalf("%s at bf16: %v", name, err)
		}
		tr, tb := rec.Traffic, bf.Traffic
		if tr.DispatchAlgorithm*1024 != tb.DispatchAlgorithm*(512+16) || tr.CombineAlgorithm != tb.CombineAlgorithm || tr.DispatchAlgorithm == 0 {
			t.Errorf("%s: dispatch algorithm bytes %d at mxfp8, %d at bf16 (want ×528/1024); combine %d and %d", name,
				tr.DispatchAlgorithm, tb.DispatchAlgorithm, tr.CombineAlgorithm, tb.CombineAlgorithm)
		}
		if !strings.Contains(tr.Formula, "hidden/32 × 1 B E8M0") {
			t.Errorf("%s: the formula does not count the MX row: %s", name, tr.Formula)
		}
	}
}

// TestMXFP8CheckCatchesBrokenDequantization: with the expert side's MX
// dequantization broken on purpose — a scale exponent off by one, the
// next 32-block's scale, no dequantization, fc2's input not dequantized —
// the check fails.
func TestMXFP8CheckCatchesBrokenDequantization(t *testing.T) {
	defer func() { layer.FP8Fault = "" }()
	for _, fault := range []string{"scale", "block", "none", "fc2-none"} {
		layer.FP8Fault = fault
		c := mxConfig("alltoall")
		c.ForwardOnly = true
		rec, err := Run(c, setup.Env{Version: "test"})
		if err == nil || rec.Status != results.StatusFailed || rec.Correctness == nil || rec.Correctness.MaxRelErr <= check.Tolerance {
			t.Errorf("MX dequantization broken (%s): %v, %+v", fault, err, rec.Correctness)
		} else {
			t.Logf("broken (%s): max rel err %.3g", fault, rec.Correctness.MaxRelErr)
		}
	}
}

// TestMXFP8Unavailable: at mxfp8 the designs whose FP8 layout is 1×128
// (deepep, hybridep, feplb over deepep) are unavailable with their
// reason, and so is the cuda device, in its GPU's terms (Emu: the Hopper
// path); never a bf16 or fp8 run under an mxfp8 label.
func TestMXFP8Unavailable(t *testing.T) {
	for _, c := range []struct{ name, base, device, want string }{
		{"deepep", "", "host", "fp32 scale per 1×128 block"},
		{"hybridep", "", "host", "hidden/128 fp32 scaling factors"},
		{"feplb", "deepep", "host", "fp32 scale per 1×128 block"},
		{"alltoall", "", "cuda", "the Emu simulation models the Hopper (sm_90) path, which has no MX tensor-core GEMM"},
		{"hybridep", "", "cuda", "needs sm_100"},
	} {
		cfg := mxConfig(c.name)
		cfg.Device = c.device
		if c.base != "" {
			cfg.FeplbBase = c.base
		}
		rec, err := Run(cfg, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
		if !dispatchers.IsUnavailable(err) || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, c.want) {
			t.Errorf("%s (base %q) on the %s device at mxfp8: %v, %s %q; want unavailable: %q", c.name, c.base, c.device, err, rec.Status, rec.Reason, c.want)
		}
	}
}

// TestMXFP8FFN: mxfp8 with ffn not a multiple of 32 is a usage error
// naming --ffn.
func TestMXFP8FFN(t *testing.T) {
	c := mxConfig("alltoall")
	c.FFN = 48
	err := c.Validate()
	if ce, ok := err.(*setup.ConfigError); !ok || ce.Flag != "ffn" || !strings.Contains(ce.Error(), "1×32") {
		t.Errorf("ffn 48 at mxfp8: %v", err)
	}
}

// TestMXFP8RefusedOnHostSim: on the simulated cuda device (the fake
// driver's sm_90 GPUs, the fake cuBLASLt 13.0) mxfp8 is unavailable in
// the GPU's terms: sm_90 has no MX tensor-core path.
func TestMXFP8RefusedOnHostSim(t *testing.T) {
	harnesstest.UseHostSimLayer(t)
	c := mxConfig("alltoall")
	c.Device, c.EP = "cuda", 2
	rec, err := Run(c, setup.Env{Version: "test"})
	if !dispatchers.IsUnavailable(err) || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, "sm_90 has no MX tensor-core path") {
		t.Errorf("mxfp8 on hostsim: %v, %s %q", err, rec.Status, rec.Reason)
	}
}

// TestMXFP8HostExpertModes: the MX GEMM path computes the same outputs
// whether the layer holds its experts or draws them (the MX weights made
// from each draw and not kept), and both pass the check.
func TestMXFP8HostExpertModes(t *testing.T) {
	var outs [][]float32
	for _, mode := range []string{setup.HostExpertsHeld, setup.HostExpertsDrawn} {
		c := mxConfig("alltoall")
		c.ForwardOnly, c.HostExperts = true, mode
		rec, err := Run(c, setup.Env{Version: "test"})
		if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
			t.Fatalf("%s: %v, %+v", mode, err, rec.Correctness)
		}
		l, err := layer.NewLayer(c)
		if err != nil {
			t.Fatal(err)
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
		if mode == setup.HostExpertsDrawn && l.MXWeights != nil {
			t.Errorf("a drawn layer kept %d experts' MX weights", len(l.MXWeights))
		}
		if mode == setup.HostExpertsHeld && len(l.MXWeights) == 0 {
			t.Errorf("a held layer made no MX weights: the MX GEMM did not run")
		}
		outs = append(outs, l.Ranks[0].Y)
	}
	if !slices.Equal(outs[0], outs[1]) {
		t.Errorf("held and drawn layers' outputs differ")
	}
}

// TestMXFP8FEPLBMovedWeights: feplb's helpers compute with the weights
// phase 2 moved (quantized again on the helper), not the layer's copy of
// the expert: with the weights not moved (feplb.FP8Fault "unmoved") a
// forward-only step's check fails.
func TestMXFP8FEPLBMovedWeights(t *testing.T) {
	defer func() { feplb.FP8Fault = "" }()
	c := mxConfig("feplb")
	c.Domain, c.Routing, c.ForwardOnly = 2, setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}, true
	for _, fault := range []string{"", "unmoved"} {
		feplb.FP8Fault = fault
		rec, err := Run(c, setup.Env{Version: "test"})
		if fault == "" && (rec.Rebalance == nil || rec.Rebalance.Moves == 0) {
			t.Fatalf("feplb moved nothing (%v, %+v)", err, rec.Rebalance)
		}
		if passed := rec.Correctness != nil && rec.Correctness.Passed; passed != (fault == "") {
			t.Errorf("fault %q: check passed %v (%+v)", fault, passed, rec.Correctness)
		}
	}
}
