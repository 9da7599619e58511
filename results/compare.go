package results

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
)

// Regression decision.
//
// For each matched point, the per-iteration step samples of BASE and NEW are
// compared on a log scale with the Hodges–Lehmann estimator: the shift is the
// median of all pairwise differences log(new_j) − log(base_i), and its
// confidence interval comes from the Mann–Whitney U distribution (normal
// approximation). A point regresses when the estimated slowdown exceeds the
// threshold AND the interval excludes no change (the slowdown is not noise).
// It is faster when the mirror image holds. This uses every sample, not one
// mean, and is robust to outliers.
//
// The samples of one run do not show how much two runs of the same build
// differ (clocks, placement, neighbours), so the fine test is used only where
// that drift is small:
//   - A point whose samples are too noisy on either side (robust coefficient
//     of variation 1.4826·MAD/median above MaxNoise) gets no fine decision:
//     such runs also drift between runs by more than their samples show, as
//     Megatron's perf gate (std/mean ≤ 2%) recognises.
//   - Host-device points never get one: identical host runs differ by far
//     more than their samples show (see HostGross).
// Neither may hide a gross change: a slowdown whose whole interval lies
// above Gross (HostGross on the host device) is a regression all the same.

// CompareOptions tune the decision.
type CompareOptions struct {
	Threshold  float64 // relative slowdown that counts, e.g. 0.02
	Confidence float64 // two-sided confidence of the interval, e.g. 0.99
	MinSamples int     // fewer samples on either side: no decision
	MaxNoise   float64 // robust CV above this on either side: no fine decision
	// Gross is the relative slowdown that is a regression even when the
	// samples are too noisy for the fine test: the interval's lower end must
	// lie above it. HostGross is the same on the host device, where the fine
	// test is never used.
	Gross, HostGross float64
}

// DefaultCompareOptions: 2% (Megatron's MoE perf gate), 99% confidence, 5
// samples, 5% noise; gross slowdowns of 50% (a noisy GPU run) and 400% (5×,
// the host device: of 270 pairs of identical host runs on a 2-core VM shared
// with other builds, none had its interval above it, though one estimate
// reached +418%; scripts/aa-compare.sh, see docs/results.md).
var DefaultCompareOptions = CompareOptions{Threshold: 0.02, Confidence: 0.99, MinSamples: 5, MaxNoise: 0.05,
	Gross: 0.5, HostGross: 4}

// RobustCV is 1.4826·MAD/median: the coefficient of variation of normal data,
// unmoved by a few outliers.
func RobustCV(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	s := append([]float64(nil), x...)
	sort.Float64s(s)
	med := median(s)
	dev := make([]float64, len(s))
	for i, v := range s {
		dev[i] = math.Abs(v - med)
	}
	sort.Float64s(dev)
	if med == 0 {
		return math.Inf(1)
	}
	return 1.4826 * median(dev) / med
}

// median of sorted v.
func median(v []float64) float64 {
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// Shift is the estimated relative change new/base − 1 and its interval.
type Shift struct {
	Est, Lo, Hi float64
	N, M        int // base and new sample counts
}

// EstimateShift returns the Hodges–Lehmann relative shift of new against base
// with a two-sided interval at confidence.
func EstimateShift(base, new []float64, confidence float64) Shift {
	n, m := len(base), len(new)
	d := make([]float64, 0, n*m)
	for _, b := range base {
		for _, x := range new {
			d = append(d, math.Log(x)-math.Log(b))
		}
	}
	sort.Float64s(d)
	s := Shift{N: n, M: m}
	if len(d) == 0 {
		return s
	}
	z := normalQuantile(1 - (1-confidence)/2)
	nm := float64(n * m)
	k := int(math.Floor(nm/2 - z*math.Sqrt(nm*float64(n+m+1)/12)))
	k = max(0, min(k, len(d)-1))
	s.Est = math.Expm1(median(d))
	s.Lo, s.Hi = math.Expm1(d[k]), math.Expm1(d[len(d)-1-k])
	return s
}

// normalQuantile is the standard normal quantile (Acklam's rational
// approximation, relative error below 1.2e-9).
func normalQuantile(p float64) float64 {
	a := []float64{-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00}
	b := []float64{-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01, -1.328068155288572e+01}
	c := []float64{-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00}
	d := []float64{7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00}
	const lo = 0.02425
	switch {
	case p < lo:
		q := math.Sqrt(-2 * math.Log(p))
		return (((((c[0]*q+c[1])*q+c[2])*q+c[3])*q+c[4])*q + c[5]) / ((((d[0]*q+d[1])*q+d[2])*q+d[3])*q + 1)
	case p > 1-lo:
		return -normalQuantile(1 - p)
	}
	q := p - 0.5
	r := q * q
	return (((((a[0]*r+a[1])*r+a[2])*r+a[3])*r+a[4])*r + a[5]) * q / (((((b[0]*r+b[1])*r+b[2])*r+b[3])*r+b[4])*r + 1)
}

// Verdicts of a compared point.
const (
	VerdictSame       = "same"
	VerdictRegression = "REGRESSION"
	VerdictFaster     = "faster"
	VerdictNoDecision = "no decision"
	VerdictNoisy      = "noisy"
	VerdictHost       = "host timing" // undecided: host times drift between runs
	VerdictOnlyBase   = "only in base"
	VerdictOnlyNew    = "only in new"
)

// Change is the comparison of one point.
type Change struct {
	Workload, Settings string
	Base, New          *Record
	Shift              Shift
	Verdict            string
	Why                string
}

// Comparison is the result of Compare.
type Comparison struct {
	Changes     []Change
	StackDiffs  []string // relevant differences of the stacks (when allowed)
	StackNotes  []string // harmless differences (see StackDiff)
	Regressions int
	Undecided   int // noisy, host timing or too few samples
}

// StackChangeError is Compare's refusal of records from stacks that differ
// in what changes results: a new baseline is needed.
type StackChangeError struct{ Diffs []string }

func (e *StackChangeError) Error() string {
	return "the records come from different stacks (a new baseline is needed; pass --allow-stack-change to compare anyway):\n  " +
		strings.Join(e.Diffs, "\n  ")
}

// Compare matches the records of base and new by workload and settings and
// decides each point. Records of one file must come from one stack each; if
// the two stacks differ Compare refuses unless allowStackChange, and then
// reports the differences. When a point was recorded several times, the last
// record counts.
func Compare(base, new []Record, o CompareOptions, allowStackChange bool) (*Comparison, error) {
	bs, err := oneStack(base, "base")
	if err != nil {
		return nil, err
	}
	ns, err := oneStack(new, "new")
	if err != nil {
		return nil, err
	}
	c := &Comparison{}
	c.StackDiffs, c.StackNotes = StackDiff(bs, ns)
	if d := PrecisionDiff(base, new); d != "" {
		c.StackDiffs = append(c.StackDiffs, d)
	}
	if len(c.StackDiffs) > 0 && !allowStackChange {
		return c, &StackChangeError{c.StackDiffs}
	}
	bm, nm := lastByPoint(base), lastByPoint(new)
	keys := map[string]bool{}
	for k := range bm {
		keys[k] = true
	}
	for k := range nm {
		keys[k] = true
	}
	order := make([]string, 0, len(keys))
	for k := range keys {
		order = append(order, k)
	}
	sort.Strings(order)
	matched := 0
	for _, k := range order {
		b, n := bm[k], nm[k]
		ch := Change{Base: b, New: n}
		ref := b
		if ref == nil {
			ref = n
		}
		ch.Workload, ch.Settings = ref.Config.Workload(), ref.Config.Settings()
		switch {
		case n == nil:
			ch.Verdict = VerdictOnlyBase
		case b == nil:
			ch.Verdict = VerdictOnlyNew
		default:
			matched++
			decide(&ch, o)
		}
		switch ch.Verdict {
		case VerdictRegression:
			c.Regressions++
		case VerdictNoisy, VerdictNoDecision, VerdictHost:
			c.Undecided++
		}
		c.Changes = append(c.Changes, ch)
	}
	if matched == 0 {
		if why := passesDiffer(base, new); why != "" {
			return c, &PassChangeError{why}
		}
		return c, fmt.Errorf("no point of new matches a point of base (same workload and settings)")
	}
	return c, nil
}

// PrecisionDiff is "precision: A → B" when base and new were run at
// precisions none of which they share (--precision; each file's set of
// them), else "". Compare counts it as a stack difference: the numbers of
// two precisions are never a regression of one another. Files that share
// a precision compare at it; a point of a precision only one file has is
// listed as only in that file (a precision is part of a point's settings).
func PrecisionDiff(base, new []Record) string {
	set := func(recs []Record) map[string]bool {
		m := map[string]bool{}
		for _, r := range recs {
			m[r.Config.PrecisionName()] = true
		}
		return m
	}
	a, b := set(base), set(new)
	for p := range a {
		if b[p] {
			return ""
		}
	}
	names := func(m map[string]bool) string { return strings.Join(slices.Sorted(maps.Keys(m)), ",") }
	return fmt.Sprintf("precision: %s → %s", names(a), names(b))
}

// PassChangeError is Compare's refusal of files whose records time
// different passes (forward only, or training steps), which are never the
// same point: a new baseline is needed, as for a stack change.
type PassChangeError struct{ Why string }

func (e *PassChangeError) Error() string {
	return "no point of new matches a point of base: " + e.Why + " (a new baseline is needed)"
}

// passesDiffer says, when no pass of new is one of base's, which each
// times.
func passesDiffer(base, new []Record) string {
	passes := func(recs []Record) map[string]bool {
		m := map[string]bool{}
		for _, r := range recs {
			m[r.Config.PassName()] = true
		}
		return m
	}
	bp, np := passes(base), passes(new)
	for p := range np {
		if bp[p] {
			return ""
		}
	}
	names := func(m map[string]bool) string {
		var s []string
		for p := range m {
			s = append(s, p)
		}
		sort.Strings(s)
		return strings.Join(s, ", ")
	}
	return fmt.Sprintf("base times %s and new %s, which are never compared (a forward-only run and a training step time different work; rerun one with or without --forward-only)", names(bp), names(np))
}

func decide(ch *Change, o CompareOptions) {
	b, n := ch.Base, ch.New
	switch {
	case b.Status == StatusOK && n.Status != StatusOK:
		ch.Verdict, ch.Why = VerdictRegression, "was ok, now "+StatusLine(n.Status, n.Config.Dispatcher, n.Config.Impl, n.Reason)
		return
	case b.Status != StatusOK && n.Status == StatusOK:
		ch.Verdict, ch.Why = VerdictSame, "was "+b.Status+", now ok"
		return
	case b.Status != StatusOK:
		ch.Verdict, ch.Why = VerdictSame, "still "+n.Status
		return
	}
	ch.Shift, ch.Verdict, ch.Why = DecideSamples(b.Timing.Step.Samples, n.Timing.Step.Samples, b.Config.Device == "host", o)
}

// DecideSamples is compare's decision on two points' step samples (ms):
// the shift of new against base (Hodges–Lehmann, on log times, with its
// interval), its verdict (VerdictSame, VerdictRegression: new is slower,
// VerdictFaster, or undecided: VerdictNoDecision, VerdictNoisy,
// VerdictHost) and why. host: the samples are host-device times, on which
// only a gross slowdown is decided (see the package comment).
func DecideSamples(bx, nx []float64, host bool, o CompareOptions) (s Shift, verdict, why string) {
	s = EstimateShift(bx, nx, o.Confidence)
	change := fmt.Sprintf("step %+.1f%% (%.0f%% CI %+.1f%%…%+.1f%%)", 100*s.Est, 100*o.Confidence, 100*s.Lo, 100*s.Hi)
	gross, fine := o.Gross, true
	if host {
		gross, fine = o.HostGross, false
	}
	switch {
	case len(bx) < o.MinSamples || len(nx) < o.MinSamples:
		verdict, why = VerdictNoDecision, fmt.Sprintf("too few samples (%d and %d; need %d)", len(bx), len(nx), o.MinSamples)
	case s.Lo > gross:
		verdict, why = VerdictRegression, fmt.Sprintf("%s: gross slowdown, the whole interval above %+.0f%%", change, 100*gross)
	case !fine:
		verdict, why = VerdictHost, fmt.Sprintf("%s: host times drift between identical runs by more than this, so only a slowdown above %+.0f%% is decided", change, 100*gross)
	case max(RobustCV(bx), RobustCV(nx)) > o.MaxNoise:
		verdict, why = VerdictNoisy, fmt.Sprintf("%s: samples too noisy to decide: robust CV %.1f%% and %.1f%% (limit %.1f%%); only a slowdown above %+.0f%% is decided",
			change, 100*RobustCV(bx), 100*RobustCV(nx), 100*o.MaxNoise, 100*gross)
	case s.Est > o.Threshold && s.Lo > 0:
		verdict, why = VerdictRegression, fmt.Sprintf("%s > %.1f%%", change, 100*o.Threshold)
	case s.Est < -o.Threshold && s.Hi < 0:
		verdict = VerdictFaster
	default:
		verdict = VerdictSame
	}
	return s, verdict, why
}

func oneStack(recs []Record, which string) (Stack, error) {
	if len(recs) == 0 {
		return Stack{}, fmt.Errorf("%s has no records", which)
	}
	first := recs[0].Stack
	for i := range recs {
		if d, _ := StackDiff(first, recs[i].Stack); len(d) > 0 {
			return first, fmt.Errorf("%s mixes records of different stacks (record %d differs from record 1: %s)", which, i+1, d[0])
		}
	}
	return first, nil
}

// lastByPoint maps each point's workload and settings to its last record.
func lastByPoint(recs []Record) map[string]*Record {
	m := map[string]*Record{}
	for i := range recs {
		m[recs[i].Config.Workload()+"|"+recs[i].Config.Settings()] = &recs[i]
	}
	return m
}
