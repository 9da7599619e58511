package results

import (
	"math"
	"path/filepath"
	"strings"
	"testing"
)

// consistent is an ok record that Validate accepts, with a passed check of
// a training step.
func consistent() *Record {
	r := sample(StatusOK)
	r.Timing.Step.Stat = Stat{P50: 2, P90: 3, P99: 4, Mean: 2.5, Stdev: 0.5}
	r.Timing.Phases = []Phase{{Name: "dispatch", Stat: Stat{P50: 1, P90: 1, P99: 1.5, Mean: 1}, RankMin: 0.5, RankMax: 1}}
	r.Timing.HostIssue = &Stat{P50: 0.1, P90: 0.2, P99: 0.3, Mean: 0.1}
	r.Correctness = &Correctness{Checked: true, Passed: true, MaxRelErr: 0.005, Tolerance: 0.02, RoundTrip: "exact",
		Grads: &GradCheck{MaxRelErr: 0.004, Tolerance: 0.02, PerTensor: map[string]float64{"input": 0.004, "expert fc1": 0.001}}}
	return r
}

func TestValidate(t *testing.T) {
	if err := Validate(consistent()); err != nil {
		t.Fatalf("a consistent record: %v", err)
	}
	cases := []struct {
		name string
		edit func(r *Record)
		want string
	}{
		{"negative p50", func(r *Record) { r.Timing.Step.P50 = -1 }, "timing.step.p50 = -1: must be finite and ≥ 0"},
		{"p90 below p50", func(r *Record) { r.Timing.Phases[0].P90 = 0.5 },
			"timing.phases[0] (dispatch).p90 = 0.5 is below its p50 = 1: percentiles must be ordered p50 ≤ p90 ≤ p99"},
		{"p99 below p90", func(r *Record) { r.Timing.Step.P99 = 2.5 }, "timing.step.p99 = 2.5 is below its p90 = 3"},
		{"NaN mean", func(r *Record) { r.Timing.Step.Mean = math.NaN() }, "timing.step.mean = NaN: must be finite and ≥ 0"},
		{"negative sample", func(r *Record) { r.Timing.Phases[0].Samples = []float64{1, -0.1} }, "timing.phases[0] (dispatch).samples[1] = -0.1"},
		{"rank max below min", func(r *Record) { r.Timing.Phases[0].RankMax = 0.1 }, "timing.phases[0] (dispatch).rank_max = 0.1 is below its rank_min = 0.5"},
		{"negative host issue", func(r *Record) { r.Timing.HostIssue.P50 = -0.1 }, "timing.host_issue_ms.p50 = -0.1"},
		{"no iterations", func(r *Record) { r.Timing.Iters = 0 }, "timing.iters = 0"},
		{"passed with NaN", func(r *Record) { r.Correctness.MaxRelErr = math.NaN() }, "correctness.max_rel_err = NaN: must be finite and ≥ 0"},
		{"passed with +Inf", func(r *Record) { r.Correctness.MaxRelErr = math.Inf(1) }, "correctness.max_rel_err = +Inf"},
		{"passed above tolerance", func(r *Record) { r.Correctness.MaxRelErr = 0.5 },
			"correctness.max_rel_err = 0.5 is above its tolerance 0.02 with passed = true"},
		{"no tolerance", func(r *Record) { r.Correctness.Tolerance = 0 }, "correctness.tolerance = 0: must be finite and > 0"},
		{"ok but failed its check", func(r *Record) { r.Correctness.Passed = false }, "correctness.passed = false: an ok record passed its check"},
		{"passed unchecked", func(r *Record) { r.Correctness.Checked = false }, "correctness.passed = true with checked = false"},
		{"gradient NaN", func(r *Record) { r.Correctness.Grads.PerTensor["input"] = math.NaN() }, `correctness.grads.per_tensor["input"] = NaN`},
		{"gradient above its max", func(r *Record) { r.Correctness.Grads.PerTensor["expert fc1"] = 0.01 },
			`correctness.grads.per_tensor["expert fc1"] = 0.01 is above correctness.grads.max_rel_err = 0.004`},
		{"gradients above tolerance", func(r *Record) { r.Correctness.Grads.MaxRelErr = 0.03 }, "correctness.grads.max_rel_err = 0.03 is above its tolerance 0.02"},
		{"negative tokens", func(r *Record) { r.Tokens.Received[1] = -8 }, "tokens.received_per_rank[1] = -8: must be ≥ 0"},
		{"negative bytes", func(r *Record) { r.Traffic.CombineLogical = -1 }, "traffic.combine_logical_bytes = -1"},
		{"negative rate", func(r *Record) { r.GEMM.TFLOPS = -2 }, "gemm.tflops = -2"},
	}
	for _, c := range cases {
		r := consistent()
		c.edit(r)
		err := Validate(r)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want %q", c.name, err, c.want)
		}
	}
	// a failed record carries no measurements to be consistent about
	f := sample(StatusFailed)
	f.Correctness = &Correctness{Checked: true, MaxRelErr: math.NaN(), Tolerance: 0.02}
	if err := Validate(f); err != nil {
		t.Errorf("failed record: %v", err)
	}
	// unchecked (--check=false) is consistent
	u := consistent()
	u.Correctness = &Correctness{Checked: false, Detail: "check disabled by --check=false"}
	if err := Validate(u); err != nil {
		t.Errorf("unchecked record: %v", err)
	}
}

// TestReadRefusesInconsistent: the reader refuses an inconsistent ok record
// naming the file, the line and the field; the published records read.
func TestReadRefusesInconsistent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.jsonl")
	bad := consistent()
	bad.Correctness.MaxRelErr = math.NaN()
	neg := consistent()
	neg.Timing.Step.P50 = -3
	for _, r := range []*Record{consistent(), bad, neg} {
		if _, err := Append(path, r); err != nil {
			t.Fatal(err)
		}
	}
	_, err := ReadFile(path, nil)
	if err == nil || !strings.Contains(err.Error(), "r.jsonl:2: an inconsistent ok record: correctness.max_rel_err = NaN") {
		t.Errorf("err = %v", err)
	}
	if recs, err := ReadFile("published/host-tiny.jsonl", nil); err != nil || len(recs) == 0 {
		t.Errorf("published records: %d, %v", len(recs), err)
	}
}
