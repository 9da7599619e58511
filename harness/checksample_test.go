package harness

import (
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// TestHostSampledCheck: beyond the reference's budget the host's check
// compares a seeded sample of tokens, as the cuda device's does, and says
// so; a training step's gradient check is bounded by the same sample (the
// check's upstream gradient is zero outside it, every gradient then the
// sampled tokens', every other token's input and probability gradients
// zero) and still catches a broken backward; the upstream gradient of the
// timed steps is the drawn one. --check all compares every token.
func TestHostSampledCheck(t *testing.T) {
	defer func(b float64) { setup.RefFLOPBudget = b }(setup.RefFLOPBudget)
	setup.RefFLOPBudget = 1
	c := harnesstest.Small()
	rec, err := Run(c, setup.Env{Version: "test"})
	if err != nil || rec.Status != results.StatusOK {
		t.Fatalf("sampled check: %v, %+v", err, rec)
	}
	cc := rec.Correctness
	if !strings.Contains(cc.Sample, "64 of 128 tokens (16 per rank") || cc.Grads == nil || len(cc.Grads.PerTensor) != 7 || rec.Config.CheckTokens != "sample" {
		t.Fatalf("sampled check: config %+v, correctness %+v, grads %+v", rec.Config, cc, cc.Grads)
	}
	if cc.Grads != nil && !strings.Contains(cc.Grads.Note, "zero outside the sampled tokens") {
		t.Errorf("the gradient note does not say the sample bounds it: %q", cc.Grads.Note)
	}
	l, _, _ := trained(t, c)
	for r := range l.DOut {
		if !slices.Equal(l.DOut[r], layer.DrawOutputGrad(c, r)) {
			t.Fatalf("rank %d: the upstream gradient after the check is not the drawn one", r)
		}
	}
	b := c
	b.Dispatcher = "broken-bwd"
	if rec, err := Run(b, setup.Env{Version: "test"}); err == nil || rec.Status != results.StatusFailed || rec.Correctness.Grads == nil ||
		!strings.Contains(rec.Correctness.Detail, "gradient error over the tolerance") {
		t.Errorf("broken backward with a sampled check: %v, %+v", err, rec.Correctness)
	}
	d := c
	d.HostExperts = setup.HostExpertsDrawn // the gradient reference alongside the backward, on the sample
	if rec, err := Run(d, setup.Env{Version: "test"}); err != nil || rec.Status != results.StatusOK || rec.Correctness.Grads == nil ||
		rec.Correctness.Grads.MaxRelErr != cc.Grads.MaxRelErr {
		t.Errorf("drawn weights, sampled check: %v, %+v (held: %+v)", err, rec.Correctness, cc.Grads)
	}
	c.CheckAll = true
	rec, err = Run(c, setup.Env{Version: "test"})
	if err != nil || rec.Correctness.Sample != "all 128 tokens (--check all)" || rec.Config.CheckTokens != "all" {
		t.Errorf("--check all: %v, config %+v, correctness %+v", err, rec.Config, rec.Correctness)
	}
}
