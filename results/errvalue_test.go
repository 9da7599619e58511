package results

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

// TestNonFiniteErrors: a failed check whose errors are infinite or NaN is
// appended and read back with them (encoding/json alone refuses the
// record, and the run's record was lost); finite errors stay numbers;
// unknown fields and other strings are still refused.
func TestNonFiniteErrors(t *testing.T) {
	r := sample(StatusFailed)
	r.Correctness = &Correctness{Checked: true, MaxRelErr: math.Inf(1), Tolerance: 0.02, Metric: "m", RoundTrip: "exact",
		Grads: &GradCheck{MaxRelErr: math.NaN(), Tolerance: 0.02, PerTensor: map[string]float64{"input": math.NaN(), "router": math.Inf(-1), "fc1": 0.003}}}
	p := filepath.Join(t.TempDir(), "r.jsonl")
	if _, err := Append(p, r); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadFile(p, nil)
	if err != nil || len(recs) != 1 {
		t.Fatalf("%d records, %v", len(recs), err)
	}
	c := recs[0].Correctness
	if !math.IsInf(c.MaxRelErr, 1) || c.Tolerance != 0.02 || !c.Checked || c.Grads == nil || !math.IsNaN(c.Grads.MaxRelErr) ||
		!math.IsNaN(c.Grads.PerTensor["input"]) || !math.IsInf(c.Grads.PerTensor["router"], -1) || c.Grads.PerTensor["fc1"] != 0.003 {
		t.Errorf("read back %+v, grads %+v", c, c.Grads)
	}
	b, _ := json.Marshal(&Correctness{MaxRelErr: 0.5})
	if !strings.Contains(string(b), `"max_rel_err":0.5`) {
		t.Errorf("a finite error: %s", b)
	}
	good := string(line(t, r))
	for in, want := range map[string]string{
		strings.Replace(good, `"max_rel_err":"+Inf"`, `"max_rel_err":"Infinity"`, 1): `error value "Infinity"`,
		strings.Replace(good, `"checked":true`, `"checked":true,"extra":1`, 1):       `unknown field "extra"`,
		strings.Replace(good, `"per_tensor":{`, `"per_tensor":{"x":true,`, 1):        "error value true",
	} {
		if _, err := Read(strings.NewReader(in), "x", nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want %q", err, want)
		}
	}
}

// TestGradVerdictWithoutRoundTrip: the table's gradient verdict is PASS for
// gradients under the tolerance whose backward round trip was not run (the
// cuda device's), FAIL for one over it or a round trip that differed.
func TestGradVerdictWithoutRoundTrip(t *testing.T) {
	for _, c := range []struct {
		err       float64
		roundTrip string
		want      string
	}{
		{0.005, RoundTripNotRun + " on the device: the gradient check covers the dispatcher's backward", "PASS"},
		{0.005, "exact", "PASS"},
		{0.005, "input differs at token 3", "FAIL"},
		{0.5, RoundTripNotRun + " on the device", "FAIL"},
	} {
		t.Run(fmt.Sprintf("%g,%s", c.err, c.roundTrip), func(t *testing.T) {
			t.Parallel()
			r := sample(StatusOK)
			r.Correctness = &Correctness{Checked: true, Passed: true, MaxRelErr: 0.001, Tolerance: 0.02, RoundTrip: "exact",
				Grads: &GradCheck{MaxRelErr: c.err, Tolerance: 0.02, PerTensor: map[string]float64{"input": c.err}, RoundTrip: c.roundTrip}}
			var b strings.Builder
			if err := WriteTable(&b, r); err != nil {
				t.Fatal(err)
			}
			if want := "# gradients              " + c.want + " ·"; !strings.Contains(b.String(), want) {
				t.Errorf("error %g, round trip %q: want %q in\n%s", c.err, c.roundTrip, want, b.String())
			}
		})
	}
}
