package results

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func noisy(g *rand.Rand, n int, mean, cv float64) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = mean * (1 + cv*g.NormFloat64())
	}
	return s
}

func okRecord(dispatcher string, samples []float64) Record {
	r := *sample(StatusOK)
	r.Config.Dispatcher = dispatcher
	t := *r.Timing
	t.Step.Samples = samples
	r.Timing = &t
	return r
}

func decideShift(base, new []float64) string {
	c, err := Compare([]Record{okRecord("alltoall", base)}, []Record{okRecord("alltoall", new)}, DefaultCompareOptions, false)
	if err != nil {
		panic(err)
	}
	return c.Changes[0].Verdict
}

// TestRegressionDecision: at default settings, 20 samples with 2% noise, a 5%
// slowdown is detected and A/A (same distribution) raises no alarm.
func TestRegressionDecision(t *testing.T) {
	g := rand.New(rand.NewPCG(11, 12))
	const trials = 300
	detected, falseAlarms, fasterFound := 0, 0, 0
	for range trials {
		base := noisy(g, 20, 10, 0.02)
		if decideShift(base, noisy(g, 20, 10.5, 0.02)) == VerdictRegression {
			detected++
		}
		if decideShift(base, noisy(g, 20, 10, 0.02)) == VerdictRegression {
			falseAlarms++
		}
		if decideShift(base, noisy(g, 20, 9.5, 0.02)) == VerdictFaster {
			fasterFound++
		}
	}
	if detected < trials*99/100 || fasterFound < trials*99/100 {
		t.Errorf("5%% slowdown detected in %d/%d trials, 5%% speed-up in %d/%d; want ≥ 99%%", detected, trials, fasterFound, trials)
	}
	if falseAlarms > 0 {
		t.Errorf("A/A raised %d false alarms in %d trials", falseAlarms, trials)
	}
	// 1% slowdown is below the 2% threshold: not a regression even when real
	if v := decideShift(noisy(g, 200, 10, 0.002), noisy(g, 200, 10.1, 0.002)); v != VerdictSame {
		t.Errorf("1%% shift: %s, want same", v)
	}
	// an outlier does not make a regression
	base := noisy(g, 20, 10, 0.01)
	withOutlier := append(noisy(g, 19, 10, 0.01), 100)
	if v := decideShift(base, withOutlier); v != VerdictSame {
		t.Errorf("one outlier: %s, want same", v)
	}
	// 20% noise, like a busy host: a 30% shift is not decided either way
	if v := decideShift(noisy(g, 30, 10, 0.2), noisy(g, 30, 13, 0.2)); v != VerdictNoisy {
		t.Errorf("20%% noise: %s, want noisy", v)
	}
	if cv := RobustCV(noisy(g, 2000, 10, 0.03)); math.Abs(cv-0.03) > 0.003 {
		t.Errorf("RobustCV of 3%% normal noise = %.4f", cv)
	}
	if v := decideShift(base[:3], base[:3]); v != VerdictNoDecision {
		t.Errorf("3 samples: %s, want no decision", v)
	}
}

func TestEstimateShift(t *testing.T) {
	base := []float64{1, 2, 3, 4, 5}
	new := []float64{1.1, 2.2, 3.3, 4.4, 5.5}
	s := EstimateShift(base, new, 0.99)
	if math.Abs(s.Est-0.1) > 1e-12 || !(s.Lo < s.Est && s.Est < s.Hi) {
		t.Errorf("shift %+v, want estimate exactly +10%% inside its interval", s)
	}
	if q := normalQuantile(0.995); math.Abs(q-2.5758293035489) > 1e-8 {
		t.Errorf("normalQuantile(0.995) = %v", q)
	}
}

func TestCompareMatchingAndStacks(t *testing.T) {
	g := rand.New(rand.NewPCG(1, 2))
	a := okRecord("alltoall", noisy(g, 20, 10, 0.01))
	d := okRecord("deepep", noisy(g, 20, 8, 0.01))
	un := *sample(StatusUnavailable)
	un.Config.Dispatcher = "hybridep"
	nd := okRecord("deepep", noisy(g, 20, 8, 0.01))
	failed := *sample(StatusFailed)
	failed.Config.Dispatcher = "alltoall"
	extra := okRecord("feplb", noisy(g, 20, 8, 0.01))
	c, err := Compare([]Record{a, d, un}, []Record{failed, nd, extra}, DefaultCompareOptions, false)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, ch := range c.Changes {
		got[ch.Settings] = ch.Verdict
	}
	want := map[string]string{"alltoall/native sms=0": VerdictRegression, "deepep/native sms=0": VerdictSame,
		"hybridep/native sms=0": VerdictOnlyBase, "feplb/native sms=0": VerdictOnlyNew}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s, want %s", k, got[k], v)
		}
	}
	if c.Regressions != 1 {
		t.Errorf("%d regressions, want 1 (ok → failed)", c.Regressions)
	}
	// a different stack is refused, then allowed with its differences named
	other := okRecord("alltoall", noisy(g, 20, 10, 0.01))
	other.Stack.CPU = "Other CPU"
	if _, err := Compare([]Record{a}, []Record{other}, DefaultCompareOptions, false); err == nil || !strings.Contains(err.Error(), `cpu: "" → Other CPU`) {
		t.Errorf("different stacks: err = %v", err)
	}
	c, err = Compare([]Record{a}, []Record{other}, DefaultCompareOptions, true)
	if err != nil || len(c.StackDiffs) != 1 || !strings.HasPrefix(c.StackDiffs[0], "cpu:") {
		t.Errorf("allowed stack change: %v, diffs %v", err, c.StackDiffs)
	}
	// the host name and moebench version do not make a different stack
	renamed := other
	renamed.Stack.CPU, renamed.Stack.Hostname, renamed.Stack.Version = a.Stack.CPU, "node2", "0.2"
	if _, err := Compare([]Record{a}, []Record{renamed}, DefaultCompareOptions, false); err != nil {
		t.Errorf("host name / version change refused: %v", err)
	}
	// nothing matches: an error
	if _, err := Compare([]Record{a}, []Record{extra}, DefaultCompareOptions, false); err == nil {
		t.Error("no matching points accepted")
	}
}
