package results

import (
	"encoding/json"
	"errors"
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

// onCUDA moves records to the cuda device (where the fine test applies).
func onCUDA(rs ...Record) []Record {
	for i := range rs {
		rs[i].Config.Device, rs[i].Stack.Device = "cuda", "cuda"
	}
	return rs
}

func decideShift(base, new []float64) string {
	c, err := Compare(onCUDA(okRecord("alltoall", base)), onCUDA(okRecord("alltoall", new)), DefaultCompareOptions, false)
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
	c, err := Compare(onCUDA(a, d, un), onCUDA(failed, nd, extra), DefaultCompareOptions, false)
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
	var sc *StackChangeError
	if _, err := Compare([]Record{a}, []Record{other}, DefaultCompareOptions, false); !errors.As(err, &sc) || !strings.Contains(err.Error(), `cpu: "" → Other CPU`) {
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

// hostRun draws the step samples of one host run under the noise seen on a
// 2-core VM shared with other builds (scripts/aa-compare.sh, 120–300 runs of
// the default layer): each run's level drifts log-normally (σ 0.165 between
// runs' medians), its samples scatter by cv around that level, and one run
// in 60 is 2–5.2× slower throughout (a neighbour took the cores).
func hostRun(g *rand.Rand, n int, mean, cv float64) []float64 {
	level := mean * math.Exp(0.165*g.NormFloat64())
	if g.IntN(60) == 0 {
		level *= 2 + 3.2*g.Float64()
	}
	return noisy(g, n, level, cv)
}

// TestHostComparisonsDecideOnlyGrossChanges: host points are never decided
// by the fine test, so identical host runs raise (almost) no alarm — at most
// 1% of 2000 A/A pairs under the modelled drift — while a 10× slowdown is a
// regression every time, and so is one on a noisy GPU run.
func TestHostComparisonsDecideOnlyGrossChanges(t *testing.T) {
	g := rand.New(rand.NewPCG(5, 6))
	host := func(samples []float64) Record { return okRecord("alltoall", samples) }
	verdict := func(base, new Record) string {
		c, err := Compare([]Record{base}, []Record{new}, DefaultCompareOptions, false)
		if err != nil {
			t.Fatal(err)
		}
		return c.Changes[0].Verdict
	}
	const pairs = 2000
	alarms, tenfold := 0, 0
	for range pairs {
		base := host(hostRun(g, 20, 3.5, 0.06))
		if verdict(base, host(hostRun(g, 20, 3.5, 0.06))) == VerdictRegression {
			alarms++
		}
		if verdict(base, host(hostRun(g, 20, 35, 0.06))) == VerdictRegression {
			tenfold++
		}
	}
	if alarms > pairs/100 {
		t.Errorf("A/A false alarms on the host: %d of %d pairs, want ≤ 1%%", alarms, pairs)
	}
	// (misses: pairs whose base run was itself a slow outlier)
	if tenfold < pairs*97/100 {
		t.Errorf("10× host slowdown a regression in %d of %d pairs, want ≥ 97%%", tenfold, pairs)
	}
	// a modest host shift is left undecided, and says so
	c, _ := Compare([]Record{host(noisy(g, 20, 10, 0.01))}, []Record{host(noisy(g, 20, 13, 0.01))}, DefaultCompareOptions, false)
	if ch := c.Changes[0]; ch.Verdict != VerdictHost || c.Undecided != 1 || !strings.Contains(ch.Why, "+400%") {
		t.Errorf("+30%% on the host: %s (%s), undecided %d", ch.Verdict, ch.Why, c.Undecided)
	}
	// a 10× slowdown of a noisy GPU run is a regression, not merely noisy
	if v := decideShift(noisy(g, 30, 10, 0.2), noisy(g, 30, 100, 0.2)); v != VerdictRegression {
		t.Errorf("10× with 20%% noise: %s, want %s", v, VerdictRegression)
	}
}

// TestStackDiffTiers: differences that do not change results are notes, the
// others refuse the comparison.
func TestStackDiffTiers(t *testing.T) {
	base := Stack{Device: "cuda", CPU: "EPYC", MemoryBytes: 25276510208, OS: "linux/amd64 6.18.44-fc-v657", GoVersion: "go1.26.8",
		GPU: &GPUStack{Model: "H100", Count: 8, MemoryBytes: 85899345920, Driver: "580.65"},
		Env: map[string]string{"MOEBENCH_CACHE": "/a", "NCCL_ALGO": "Ring"}}
	clone := func(f func(s *Stack)) Stack {
		s := base
		g := *base.GPU
		s.GPU = &g
		s.Env = map[string]string{}
		for k, v := range base.Env {
			s.Env[k] = v
		}
		f(&s)
		return s
	}
	harmless := []func(s *Stack){
		func(s *Stack) { s.MemoryBytes += 4096 },
		func(s *Stack) { s.GPU.MemoryBytes -= 2 << 20 },
		func(s *Stack) { s.OS = "linux/amd64 6.18.51-fc-v769" },
		func(s *Stack) { s.Env["MOEBENCH_CACHE"] = "/b" },
		func(s *Stack) { delete(s.Env, "MOEBENCH_CACHE") },
		func(s *Stack) { s.Env["MOEBENCH_NIGHTLY_DIR"] = "/n" },
		func(s *Stack) { s.Hostname, s.Version, s.Commit, s.KernelHash = "node7", "0.2", "abc", "ff" },
	}
	for i, f := range harmless {
		rel, notes := StackDiff(base, clone(f))
		if len(rel) != 0 || (i < 6 && len(notes) != 1) {
			t.Errorf("harmless change %d: relevant %v, notes %v", i, rel, notes)
		}
	}
	relevant := []func(s *Stack){
		func(s *Stack) { s.MemoryBytes *= 2 },
		func(s *Stack) { s.OS = "linux/amd64 6.19.2-fc-v800" },
		func(s *Stack) { s.OS = "linux/arm64 6.18.44-fc-v657" },
		func(s *Stack) { s.GPU.Driver = "590.10" },
		func(s *Stack) { s.GPU.Model = "H200" },
		func(s *Stack) { s.Env["NCCL_ALGO"] = "Tree" },
		func(s *Stack) { s.Env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1" },
		func(s *Stack) { s.CPU = "Xeon" },
		func(s *Stack) { s.GoVersion = "go1.27" },
	}
	for i, f := range relevant {
		if rel, _ := StackDiff(base, clone(f)); len(rel) != 1 {
			t.Errorf("relevant change %d: %v", i, rel)
		}
	}
}

// TestComparePasses: a forward-only record and a training step's are never
// the same point, whatever else they share: compare refuses to match them
// and says why; a record without the pass field (older) is forward-only.
func TestComparePasses(t *testing.T) {
	fwd, train, old := okRecord("alltoall", []float64{1, 1, 1, 1, 1}), okRecord("alltoall", []float64{3, 3, 3, 3, 3}), okRecord("alltoall", []float64{1, 1, 1, 1, 1})
	fwd.Config.Pass, train.Config.Pass, old.Config.Pass = PassForward, PassTraining, ""
	c, err := Compare([]Record{fwd}, []Record{train}, DefaultCompareOptions, false)
	var pc *PassChangeError
	if !errors.As(err, &pc) || !strings.Contains(err.Error(), "base times fwd and new fwd+bwd, which are never compared") {
		t.Fatalf("fwd against fwd+bwd: %v", err)
	}
	if len(c.Changes) != 2 || c.Changes[0].Verdict == VerdictRegression || c.Changes[1].Verdict == VerdictRegression {
		t.Errorf("changes %+v: want each only in its own file", c.Changes)
	}
	if c, err := Compare([]Record{old}, []Record{fwd}, DefaultCompareOptions, false); err != nil || len(c.Changes) != 1 {
		t.Errorf("an older record (no pass) against a forward-only one: %v, %+v", err, c)
	}
	if old.Config.PassName() != PassForward || old.Config.Workload() != fwd.Config.Workload() {
		t.Errorf("a record without the pass field is not forward-only: %q", old.Config.Workload())
	}
}

// TestCompareSettingsThatChangeTheMeasurement: records that differ only in
// a setting that changes what was measured — the routing drawn per step
// or replayed (--routing-fixed), CUDA graphs, how the host held the
// experts — are different points: compare never matches them, and a
// record written without such a field (older) reads as the setting its
// absence meant then.
func TestCompareSettingsThatChangeTheMeasurement(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"routing_per_step": func(c *Config) { c.RoutingPerStep = !c.RoutingPerStep },
		"cuda_graph":       func(c *Config) { c.CUDAGraph = true },
		"host_experts":     func(c *Config) { c.HostExperts = "drawn" },
	} {
		base := okRecord("alltoall", []float64{1, 1, 1, 1, 1})
		base.Config.RoutingPerStep = true
		other := base
		mut(&other.Config)
		c, err := Compare([]Record{base}, []Record{other}, DefaultCompareOptions, false)
		if err == nil || len(c.Changes) != 2 {
			t.Errorf("%s: records that differ in it were matched: %v, %+v", name, err, c)
		}
	}
	// routing_per_step is written whatever its value; without it (a record
	// from before routing was drawn per step) the routing was replayed
	fixed := okRecord("alltoall", []float64{1})
	b, _ := json.Marshal(fixed)
	if !strings.Contains(string(b), `"routing_per_step":false`) {
		t.Errorf("a record with routing replayed does not say so: %s", b)
	}
	old := strings.Replace(string(b), `"routing_per_step":false,`, "", 1)
	recs, err := Read(strings.NewReader(old+"\n"), "old.jsonl", nil)
	if err != nil || len(recs) != 1 || recs[0].Config.RoutingPerStep || recs[0].Config.Workload() != fixed.Config.Workload() {
		t.Errorf("an older record without routing_per_step: %v %+v", err, recs)
	}
}

// TestComparePrecisions: files of precisions none of which they share
// (--precision) are refused as a stack change, with the precisions named,
// unless allowed; a precision added beside the baseline's is new points; a
// record without the field (older) reads as bf16 and keeps its
// point; files of the same precisions compare.
func TestComparePrecisions(t *testing.T) {
	bf, fp := okRecord("alltoall", []float64{1, 1, 1, 1, 1}), okRecord("alltoall", []float64{1, 1, 1, 1, 1})
	fp.Config.Precision = "fp8"
	_, err := Compare([]Record{bf}, []Record{fp}, DefaultCompareOptions, false)
	var sc *StackChangeError
	if !errors.As(err, &sc) || !strings.Contains(err.Error(), "precision: bf16 → fp8") {
		t.Fatalf("bf16 against fp8: %v", err)
	}
	if c, err := Compare([]Record{bf}, []Record{fp}, DefaultCompareOptions, true); err == nil || len(c.Changes) != 2 || len(c.StackDiffs) != 1 {
		t.Errorf("bf16 against fp8, allowed: the points must stay apart: %v, %+v", err, c)
	}
	if c, err := Compare([]Record{bf, fp}, []Record{fp, bf}, DefaultCompareOptions, false); err != nil || len(c.Changes) != 2 || c.Regressions != 0 {
		t.Errorf("the same precisions in both files: %v, %+v", err, c)
	}
	// a precision added beside the baseline's: its points are new, the
	// shared precision's compare (no new baseline needed)
	if c, err := Compare([]Record{bf}, []Record{bf, fp}, DefaultCompareOptions, false); err != nil || len(c.Changes) != 2 || len(c.StackDiffs) != 0 {
		t.Errorf("fp8 points added beside bf16 ones: %v, %+v", err, c)
	}
	b, _ := json.Marshal(bf)
	if strings.Contains(string(b), "precision") {
		t.Errorf("a bf16 record writes its precision (older readers and points expect none): %s", b)
	}
	recs, err := Read(strings.NewReader(string(b)+"\n"), "old.jsonl", nil)
	if err != nil || recs[0].Config.PrecisionName() != "bf16" || recs[0].Config.Settings() != bf.Config.Settings() {
		t.Errorf("an older record: %v %+v", err, recs)
	}
	if fp.Config.Settings() == bf.Config.Settings() {
		t.Errorf("fp8 and bf16 share a point: %s", fp.Config.Settings())
	}
}

// TestCheckNameOfOlderRecords: a record without check_tokens (older) reads
// as what its device's check did then: every token on the host, a sample
// on the cuda device; one with it says which.
func TestCheckNameOfOlderRecords(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Check: true, Device: "host"}, CheckAll},
		{Config{Check: true, Device: "cuda"}, CheckSample},
		{Config{Check: false, Device: "host"}, CheckOff},
		{Config{Check: true, Device: "host", CheckTokens: CheckSample}, CheckSample},
		{Config{Check: true, Device: "cuda", CheckTokens: CheckAll}, CheckAll},
	} {
		if got := c.cfg.CheckName(); got != c.want {
			t.Errorf("%+v: %s, want %s", c.cfg, got, c.want)
		}
	}
}
