package check

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/results"
)

// TestMergeChecks: the run's verdict over the processes' checks, as the
// gather carries them (JSON): every process's outputs must pass; each
// gradient's error is the run's max|g − ref| over its max|ref| (as one
// process checking every rank computes it, not the largest process's
// ratio), an infinite difference (a NaN gradient) included; a gradient
// over the tolerance fails the run naming the processes whose own
// differences are over it; a process that checked no gradients while
// this one did fails the run.
func TestMergeChecks(t *testing.T) {
	check := func(passed bool, out float64, detail string) *results.Correctness {
		return &results.Correctness{Checked: true, Passed: passed, MaxRelErr: out, Tolerance: 0.02, Sample: "all 64 tokens", Detail: detail,
			Grads: &results.GradCheck{Tolerance: 0.02, RoundTrip: layer.DeviceGradRoundTrip, PerTensor: map[string]float64{"input": 1}}} // its own ratios: not the run's
	}
	carried := func(p int, c *results.Correctness, acc map[string][2]float64) layer.ProcessContribution { // through JSON, as gatherParts sends it
		b, err := json.Marshal(layer.ProcessContribution{Process: p, Correct: layer.EncodeInfiniteErrs(c), GradAcc: acc})
		if err != nil {
			t.Fatal(err)
		}
		var back layer.ProcessContribution
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		return back
	}
	mine := check(true, 0.005, "")
	// process 0's input: diff 0.01 of a reference up to 2; process 1's 0.003
	// of 0.1 — 3% of its own, 0.5% of the run's: the run's error is
	// max diff / max ref = 0.01/2
	a0 := map[string][2]float64{"input": {0.01, 2}, "router weight": {0.001, 1}}
	a1 := map[string][2]float64{"input": {0.003, 0.1}, "router weight": {0.001, 1}}
	got := mergeChecks(mine, []layer.ProcessContribution{carried(0, mine, a0), carried(1, check(true, 0.006, ""), a1)})
	if !got.Passed || got.MaxRelErr != 0.006 || got.Grads.PerTensor["input"] != 0.005 || got.Grads.PerTensor["router weight"] != 0.001 ||
		got.Grads.MaxRelErr != 0.005 || got.Detail != "" || !strings.HasSuffix(got.Sample, "(each of the 2 processes checks its own ranks)") {
		t.Errorf("merged %+v, gradients %+v", got, got.Grads)
	}
	if mine.Grads.PerTensor["input"] != 1 || !mine.Passed { // its own check is left as it was
		t.Errorf("this process's check changed: %+v", mine.Grads)
	}
	a1["input"] = [2]float64{-1, 0.1} // a NaN gradient on process 1: an infinite difference, as agreeCheck sends it
	got = mergeChecks(mine, []layer.ProcessContribution{carried(0, mine, a0), carried(1, check(true, 0.006, ""), a1)})
	if got.Passed || !math.IsInf(got.Grads.PerTensor["input"], 1) || !math.IsInf(got.Grads.MaxRelErr, 1) ||
		got.Detail != "gradient error over the tolerance 0.02: input +Inf (input in process(es) 1)" {
		t.Errorf("a NaN gradient: %+v, gradients %+v", got, got.Grads)
	}
	a1["input"] = [2]float64{0.05, 0.1} // over the tolerance against the run's reference too (0.05/2)
	got = mergeChecks(mine, []layer.ProcessContribution{carried(0, mine, a0), carried(1, check(false, 0.5, "max relative error 0.5 (tolerance 0.02)"), a1)})
	if got.Passed || got.MaxRelErr != 0.5 || got.Grads.PerTensor["input"] != 0.025 ||
		got.Detail != "process 1: max relative error 0.5 (tolerance 0.02); gradient error over the tolerance 0.02: input 0.025 (input in process(es) 1)" {
		t.Errorf("process 1 over: %+v, gradients %+v", got, got.Grads)
	}
	if got := mergeChecks(mine, []layer.ProcessContribution{carried(0, mine, a0), carried(1, check(true, 0.005, ""), nil)}); got.Passed || !strings.Contains(got.Detail, "process 1: no gradient check") {
		t.Errorf("a process without gradients: %+v", got)
	}
}
