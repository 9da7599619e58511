package results

// An ok record is read only when it is internally consistent: its times
// are finite, non-negative and ordered (p50 ≤ p90 ≤ p99), a check it
// passed has a finite error within its tolerance, and its counts are not
// negative. A record that is not names its field (Read adds file:line).

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Validate refuses an ok record that is not internally consistent, naming
// the first field that is not; a failed or unavailable record carries no
// measurements and passes.
func Validate(rec *Record) error {
	if rec.Status != StatusOK {
		return nil
	}
	v := validator{}
	if t := rec.Timing; t != nil {
		v.timing(t)
	}
	if c := rec.Correctness; c != nil {
		v.correctness(c)
	}
	if tk := rec.Tokens; tk != nil {
		v.ints("tokens.received_per_rank", tk.Received)
		v.straggler("tokens.straggler", tk.Straggler)
	}
	if g := rec.GEMM; g != nil {
		v.nonNeg("gemm.flops_per_iter", g.FLOPsPerIter)
		v.nonNeg("gemm.tflops", g.TFLOPS)
		v.nonNeg("gemm.backward_flops_per_iter", g.BackwardFLOPsPerIter)
		v.nonNeg("gemm.backward_tflops", g.BackwardTFLOPS)
	}
	if tr := rec.Traffic; tr != nil {
		for _, b := range []struct {
			name string
			n    int64
		}{{"dispatch_off_rank_bytes", tr.DispatchOffRank}, {"dispatch_logical_bytes", tr.DispatchLogical},
			{"combine_off_rank_bytes", tr.CombineOffRank}, {"combine_logical_bytes", tr.CombineLogical}} {
			v.nonNeg("traffic."+b.name, float64(b.n))
		}
	}
	if m := rec.Memory; m != nil {
		for i, b := range m.PerRankBytes {
			v.nonNeg(fmt.Sprintf("memory.per_rank_bytes[%d]", i), float64(b))
		}
	}
	if v.err != "" {
		return fmt.Errorf("an inconsistent ok record: %s", v.err)
	}
	return nil
}

// validator keeps the first inconsistency found.
type validator struct{ err string }

func (v *validator) fail(format string, a ...any) {
	if v.err == "" {
		v.err = fmt.Sprintf(format, a...)
	}
}

// nonNeg: x must be finite and ≥ 0.
func (v *validator) nonNeg(field string, x float64) {
	if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
		v.fail("%s = %g: must be finite and ≥ 0", field, x)
	}
}

func (v *validator) ints(field string, xs []int) {
	for i, x := range xs {
		if x < 0 {
			v.fail("%s[%d] = %d: must be ≥ 0", field, i, x)
		}
	}
}

func (v *validator) straggler(field string, s Straggler) {
	v.nonNeg(field+".abs", s.Abs)
	v.nonNeg(field+".rel", s.Rel)
}

// stat: every value finite and ≥ 0, and p50 ≤ p90 ≤ p99.
func (v *validator) stat(field string, s Stat) {
	for _, f := range []struct {
		name string
		x    float64
	}{{"p50", s.P50}, {"p90", s.P90}, {"p99", s.P99}, {"mean", s.Mean}, {"stdev", s.Stdev}} {
		v.nonNeg(field+"."+f.name, f.x)
	}
	switch {
	case s.P90 < s.P50:
		v.fail("%s.p90 = %g is below its p50 = %g: percentiles must be ordered p50 ≤ p90 ≤ p99", field, s.P90, s.P50)
	case s.P99 < s.P90:
		v.fail("%s.p99 = %g is below its p90 = %g: percentiles must be ordered p50 ≤ p90 ≤ p99", field, s.P99, s.P90)
	}
}

func (v *validator) phase(field string, p *Phase) {
	if p == nil {
		return
	}
	if p.Name != "" && !strings.HasSuffix(field, "."+p.Name) {
		field += fmt.Sprintf(" (%s)", p.Name)
	}
	v.stat(field, p.Stat)
	v.nonNeg(field+".rank_min", p.RankMin)
	v.nonNeg(field+".rank_max", p.RankMax)
	if p.RankMax < p.RankMin {
		v.fail("%s.rank_max = %g is below its rank_min = %g", field, p.RankMax, p.RankMin)
	}
	for i, x := range p.PerRank {
		v.nonNeg(fmt.Sprintf("%s.per_rank_p50[%d]", field, i), x)
	}
	for i, x := range p.Samples {
		v.nonNeg(fmt.Sprintf("%s.samples[%d]", field, i), x)
	}
	if p.HostCall != nil {
		v.stat(field+".host_call_ms", *p.HostCall)
	}
}

func (v *validator) timing(t *Timing) {
	if t.Iters < 1 {
		v.fail("timing.iters = %d: an ok record timed at least one iteration", t.Iters)
	}
	if t.Warmup < 0 {
		v.fail("timing.warmup = %d: must be ≥ 0", t.Warmup)
	}
	v.phase("timing.step", &t.Step)
	for i := range t.Phases {
		v.phase(fmt.Sprintf("timing.phases[%d]", i), &t.Phases[i])
	}
	v.phase("timing.step_slowest_rank", t.SlowestRank)
	v.phase("timing.step_lockstep", t.Lockstep)
	v.phase("timing.forward", t.Forward)
	v.phase("timing.backward", t.Backward)
	if t.HostIssue != nil {
		v.stat("timing.host_issue_ms", *t.HostIssue)
	}
	if t.HostWait != nil {
		v.stat("timing.host_wait_ms", *t.HostWait)
	}
}

// correctness: an ok record passed its check or was not checked; a check
// it passed has finite errors within their tolerance.
func (v *validator) correctness(c *Correctness) {
	if c.RoutingDiffs < 0 {
		v.fail("correctness.routing_diffs = %d: must be ≥ 0", c.RoutingDiffs)
	}
	if !c.Checked {
		if c.Passed {
			v.fail("correctness.passed = true with checked = false: a check that did not run passed nothing")
		}
		return
	}
	if !c.Passed {
		v.fail("correctness.passed = false: an ok record passed its check (a failed check makes the record failed)")
		return
	}
	v.withinTolerance("correctness", c.MaxRelErr, c.Tolerance)
	g := c.Grads
	if g == nil {
		return
	}
	v.withinTolerance("correctness.grads", g.MaxRelErr, g.Tolerance)
	keys := make([]string, 0, len(g.PerTensor))
	for k := range g.PerTensor {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		x, field := g.PerTensor[k], fmt.Sprintf("correctness.grads.per_tensor[%q]", k)
		v.nonNeg(field, x)
		if x > g.MaxRelErr {
			v.fail("%s = %g is above correctness.grads.max_rel_err = %g, the largest of them", field, x, g.MaxRelErr)
		}
	}
}

// withinTolerance: a passed check's error is finite, ≥ 0 and at most its
// tolerance, itself finite and > 0.
func (v *validator) withinTolerance(field string, err, tol float64) {
	if math.IsNaN(tol) || math.IsInf(tol, 0) || tol <= 0 {
		v.fail("%s.tolerance = %g: must be finite and > 0", field, tol)
		return
	}
	v.nonNeg(field+".max_rel_err", err)
	if err > tol {
		v.fail("%s.max_rel_err = %g is above its tolerance %g with passed = true", field, err, tol)
	}
}
