package check

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/roundtrip"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/results"
)

// Tolerance is the largest max relative error (see ErrMetric) a layer output
// may have against the float64 reference. The layer stores bf16 (8-bit
// significand, unit roundoff 2⁻⁹ ≈ 0.002) after fc1, the activation, fc2, the
// k-way sum and the shared-expert add: five roundings of values of up to the
// output's own scale, plus fp32 accumulation error, stay below 5 units of
// roundoff. 2e-2 leaves a factor two over that worst case and is still an
// order of magnitude under what a wrong expert, a lost or doubled token copy
// or a misapplied probability does (those give errors of order 1).
const Tolerance = 2e-2

// ErrMetric defines the relative error the check reports.
const ErrMetric = "max_i |out_i − ref_i| / max_i |ref_i| over all ranks' outputs; ref computed in float64 from the same bf16 inputs and weights"

// errMetricAt is ErrMetric at precision p: at fp8 and mxfp8 the reference
// takes the same quantized inputs and weights (docs/fp8.md "The check and
// its tolerance").
func errMetricAt(p string) string {
	switch p {
	case setup.PrecisionFP8:
		return "max_i |out_i − ref_i| / max_i |ref_i| over all ranks' outputs; ref computed in float64 from the same quantized inputs and weights " +
			"(e4m3 values times their 1×128 / 128×128 multipliers, exact), fc2's input quantized 1×128 from the bf16 activation as the layer does"
	case setup.PrecisionMXFP8:
		return "max_i |out_i − ref_i| / max_i |ref_i| over all ranks' outputs; ref computed in float64 from the same quantized inputs and weights " +
			"(e4m3 values times their 1×32 E8M0 scales, exact), fc2's input quantized 1×32 from the bf16 activation as the layer does"
	}
	return ErrMetric
}

// routingSlack is how much lower (in selection score summed over the k
// choices) the layer's choice may be than the float64 reference's: it absorbs
// near-ties that fp32 logits order differently, and nothing larger.
const routingSlack = 1e-3

// The check's stages, as progress reports them.
const (
	StageStep      = setup.Checking + ": the layer's step, its outputs poisoned"
	StageRef       = setup.Checking + ": the float64 reference (experts)"
	StageBackward  = setup.Checking + ": the layer's backward, its gradients poisoned"
	StageAlongside = setup.Checking + ": the layer's backward, the float64 gradient reference alongside (experts)"
	StageGradRef   = setup.Checking + ": the float64 gradient reference (experts)"
	checkRoundTrip = setup.Checking + ": the dispatcher's round trip"
)

// PhaseWork is a rough measure of a rank's work in the phase called name,
// for the progress line's share of a step: the FLOPs of its GEMMs (the
// backward's twice the forward's), a token row's worth for each copy the
// other phases move.
func PhaseWork(c setup.Config, name string) float64 {
	T, h, f, k := float64(c.Tokens), float64(c.Hidden), float64(c.FFN), float64(c.TopK)
	fwd, times := strings.CutSuffix(name, dispatchers.BackwardName(""))
	n := 1.0
	if times {
		n = 2
	}
	switch {
	case slices.Contains(dispatchers.ExpertPhases, fwd):
		return n * T * k * 6 * h * f
	case fwd == "shared":
		return n * T * 6 * h * f * float64(c.SharedExperts)
	case fwd == "router":
		return n * T * 2 * h * float64(c.Experts)
	}
	return T * k * h
}

// countedPhases runs an untimed step's phases, each adding its work to the
// progress line (the check's step and backward).
func countedPhases(l *layer.Layer) func(string, int, func() error) error {
	return func(name string, _ int, fn func() error) error {
		defer l.Cfg.ProgressLine().Add(PhaseWork(l.Cfg, name))
		return fn()
	}
}

// StepsWork is phaseWork summed over steps and ranks.
func StepsWork(c setup.Config, steps []dispatchers.Step, ranks int) float64 {
	w := 0.0
	for _, s := range steps {
		w += PhaseWork(c, s.Name) * float64(ranks)
	}
	return w
}

// Check runs one untimed step with poisoned outputs and compares the layer's
// output with the float64 reference; it also runs the dispatcher's round trip.
func Check(l *layer.Layer, d dispatchers.Dispatcher, fresh func() (dispatchers.Dispatcher, error)) (*results.Correctness, error) {
	c := &results.Correctness{Checked: true, Tolerance: Tolerance, Metric: errMetricAt(l.Cfg.ResolvedPrecision())}
	for _, rk := range l.Ranks {
		roundtrip.Poison(rk.Y)
		roundtrip.Poison(rk.ExpertY)
	}
	prog := l.Cfg.ProgressLine()
	counted := countedPhases(l)
	prog.Work(StageStep, StepsWork(l.Cfg, l.Steps(d), len(l.Ranks)))
	if err := l.Step(d, counted); err != nil {
		return nil, err
	}
	sample, which := checkSample(l.Cfg)
	c.Sample = which
	prog.Work(StageRef, float64(l.Cfg.Experts))
	compareReference(c, l, sample)
	backward := l.Grads != nil
	if backward {
		if err := checkGrads(c, l, d, sample); err != nil {
			return nil, err
		}
	}
	prog.Set(checkRoundTrip)
	rd, err := fresh()
	if err != nil {
		return nil, err
	}
	var back string
	c.RoundTrip, back = roundtrip.Verdicts(rd, l.Shape, l.X, l.Ranks, backward, l.Cfg.ResolvedPrecision())
	c.Passed = c.Detail == "" && c.MaxRelErr <= Tolerance && c.RoundTrip == "exact"
	if !c.Passed && c.Detail == "" {
		c.Detail = fmt.Sprintf("max relative error %.3g (tolerance %g); round trip %s", c.MaxRelErr, Tolerance, c.RoundTrip)
	}
	if g := c.Grads; g != nil {
		g.RoundTrip = back
		if why := gradDetail(g); why != "" {
			c.Passed = false
			c.Detail = strings.TrimPrefix(c.Detail+"; "+why, "; ")
		}
	}
	return c, nil
}

// checkSample picks the tokens the check compares: all of them with
// --check all or where their reference is within the budget
// (sampledTokens), else the same number of seeded random tokens per rank
// (at least 16). It also says which, for the record.
func checkSample(c setup.Config) ([][]int, string) {
	total, n := c.EP*c.Tokens, setup.SampledTokens(c)
	if c.CheckAll {
		return nil, fmt.Sprintf("all %d tokens (--check all)", total)
	}
	if n == c.Tokens {
		return nil, fmt.Sprintf("all %d tokens", total)
	}
	g := rand.New(rand.NewPCG(c.Seed, 0x5a3b1e))
	s := make([][]int, c.EP)
	for r := range s {
		s[r] = g.Perm(c.Tokens)[:n]
		slices.Sort(s[r])
	}
	return s, fmt.Sprintf("%d of %d tokens (%d per rank, drawn with the run's seed; --check all compares every token)", n*c.EP, total, n)
}

// compareReference computes the reference on sample (nil: every token) and
// sets c's error, routing differences and, when the reference refuses the
// layer's routing, the detail.
func compareReference(c *results.Correctness, l *layer.Layer, sample [][]int) {
	if sample == nil {
		sample = allTokens(l.Cfg.EP, l.Cfg.Tokens)
	}
	ref, diffs, err := Reference(l, sample)
	c.RoutingDiffs = diffs
	if err != nil {
		c.Detail, c.MaxRelErr = err.Error(), math.Inf(1)
		return
	}
	h := l.Cfg.Hidden
	var maxErr, maxRef float64
	for r, rk := range l.Ranks {
		for i, t := range sample[r] {
			for j := range h {
				d := math.Abs(float64(rk.Y[t*h+j]) - ref[r][i*h+j])
				if math.IsNaN(d) {
					c.MaxRelErr = math.Inf(1)
					return
				}
				maxErr = math.Max(maxErr, d)
				maxRef = math.Max(maxRef, math.Abs(ref[r][i*h+j]))
			}
		}
	}
	c.MaxRelErr = math.Inf(1) // an all-zero reference means the inputs were bad
	if maxRef > 0 {
		c.MaxRelErr = maxErr / maxRef
	}
}

// Reference computes the layer output in float64, without EP: each global
// expert gathers its token copies from every rank directly. Routing comes
// from float64 router logits; the layer's choice of experts is accepted when
// it is feasible and within routingSlack of the reference's best choice (a
// near-tie), and the reference then uses it so both compute the same sum.
// Only the tokens in sample (per rank, increasing; nil: all) are computed:
// out[r] holds their rows in that order. It also returns how many tokens'
// choices differ. Experts run in parallel (refWorkers at once, each widening
// its expert's weights into its own buffers, drawing them when the layer does
// not hold them), RefBlock rows at a time.
func Reference(l *layer.Layer, sample [][]int) (out [][]float64, diffs int, err error) {
	c := l.Cfg
	if sample == nil {
		sample = allTokens(c.EP, c.Tokens)
	}
	probs, byExpert, diffs, err := refRouting(l, sample)
	if err != nil {
		return nil, diffs, err
	}
	ys := refExperts(l, probs, byExpert)
	if err := l.Cfg.Interrupt().Interrupted("while computing the float64 reference"); err != nil {
		return nil, diffs, err
	}
	h := c.Hidden
	out = make([][]float64, c.EP)
	for r := range out {
		out[r] = make([]float64, len(sample[r])*h)
	}
	for e, copies := range byExpert {
		for i, cp := range copies {
			dst := out[cp.rank][cp.row*h:]
			for j := range h {
				dst[j] += ys[e][i*h+j]
			}
		}
	}
	if l.SharedFC1 != nil {
		refShared(l, sample, out)
	}
	return out, diffs, nil
}

// refCopy is a token copy sent to an expert: its rank, its row (the
// token's place in sample[rank]) and its slot (token*topk + j).
type refCopy struct{ rank, row, slot int }

// refRouting checks the layer's routing of the sampled tokens against the
// float64 router (or the trace) and returns the probabilities by rank and
// slot, the copies by expert, and how many tokens' choices differ.
func refRouting(l *layer.Layer, sample [][]int) (probs [][]float64, byExpert [][]refCopy, diffs int, err error) {
	c := l.Cfg
	T, h, E, k := c.Tokens, c.Hidden, c.Experts, c.TopK
	probs = make([][]float64, c.EP)
	wr := widen(l.Wr)
	byExpert = make([][]refCopy, E)
	for r, rk := range l.Ranks {
		probs[r] = make([]float64, T*k)
		for i, t := range sample[r] {
			idx := rk.Idx[t*k : (t+1)*k]
			logits := make([]float64, E)
			if l.Override[r] != nil {
				for e := range logits {
					logits[e] = float64(l.Override[r][t*E+e])
				}
			} else {
				kernels.MatMulNT(logits, widen(l.X[r][t*h:(t+1)*h]), wr, 1, E, h)
			}
			given := false // probabilities given by the trace
			if l.Trace != nil {
				want, tp := l.TraceToken(r, t)
				if !sameSet(idx, want) {
					return nil, nil, diffs, fmt.Errorf("rank %d token %d: experts %v, trace says %v", r, t, idx, want)
				}
				for j := range tp {
					probs[r][t*k+j], given = float64(tp[j]), true
				}
			} else {
				if err := l.Router.Feasible(idx); err != nil {
					return nil, nil, diffs, fmt.Errorf("rank %d token %d: %v", r, t, err)
				}
				sel := l.Router.SelectionScores(logits)
				best := l.Router.Select(sel)
				if !sameSet(idx, best) {
					diffs++
					if sum(sel, idx) < sum(sel, best)-routingSlack {
						return nil, nil, diffs, fmt.Errorf("rank %d token %d: router chose %v (score %.6g), reference %v (score %.6g)",
							r, t, idx, sum(sel, idx), best, sum(sel, best))
					}
				}
			}
			if !given {
				copy(probs[r][t*k:], l.Router.Probs(logits, idx))
			}
			for j, e := range idx {
				byExpert[e] = append(byExpert[e], refCopy{r, i, t*k + j})
			}
		}
	}
	return probs, byExpert, diffs, nil
}

// refExperts computes each expert's outputs in float64, in byExpert order:
// refWorkers experts at once, each widening its expert's weights into its
// own buffers, RefBlock rows at a time. An interrupt leaves the rest nil.
func refExperts(l *layer.Layer, probs [][]float64, byExpert [][]refCopy) [][]float64 {
	c := l.Cfg
	h, f, E, k := c.Hidden, c.FFN, c.Experts, c.TopK
	ys := make([][]float64, E)
	type buffers struct{ fc1, fc2, x, p, scratch []float64 }
	workers := setup.RefWorkers(c)
	bufs := make([]buffers, workers)
	layer.ParallelFor(E, workers, func(w, e int) {
		defer l.Cfg.ProgressLine().Add(1)
		copies := byExpert[e]
		n := len(copies)
		if n == 0 || l.Cfg.Interrupt().Why() != "" {
			return
		}
		b := &bufs[w]
		if l.FP8Tensor() { // the per-tensor path: multipliers from all the expert's routed rows (fp8tensor.go)
			b.fc1, b.fc2 = l.FP8TensorRefWeights(e, b.fc1, b.fc2)
			ys[e] = fp8TensorExpert(l, copies, probs, e, b.fc1, b.fc2)
			return
		}
		mx := l.Cfg.IsMXFP8() // the MX GEMM's exact operands (layer/mxfp8.go)
		if mx {
			b.fc1, b.fc2 = l.MXRefWeights(e, b.fc1, b.fc2)
		} else if l.FP8Lt() { // the FP8 GEMM path's exact operands (fp8gemm.go)
			b.fc1, b.fc2 = l.FP8RefWeights(e, b.fc1, b.fc2)
		} else {
			fc1, fc2 := l.ExpertWeights(e)
			b.fc1, b.fc2 = widenInto(b.fc1, fc1), widenInto(b.fc2, fc2)
		}
		y := make([]float64, n*h)
		for lo := 0; lo < n; lo += setup.RefBlock { // a block of rows at a time
			m := min(setup.RefBlock, n-lo)
			b.x, b.p, b.scratch = kernels.Reslice(b.x, m*h), kernels.Reslice(b.p, m), kernels.Reslice(b.scratch, m*3*f)
			for i, cp := range copies[lo : lo+m] {
				tok := cp.slot / k
				b.p[i] = probs[cp.rank][cp.slot]
				if mx {
					l.MXRefRow(b.x[i*h:], cp.rank, tok)
					continue
				}
				if l.FP8Lt() {
					l.FP8RefRow(b.x[i*h:], cp.rank, tok)
					continue
				}
				xr := l.ExpertInput(cp.rank)
				for j := range h {
					b.x[i*h+j] = float64(xr[tok*h+j])
				}
			}
			if mx {
				layer.MXRefExpert(y[lo*h:], b.x, b.p, b.fc1, b.fc2, b.scratch, m, h, f)
				continue
			}
			if l.FP8Lt() {
				layer.FP8RefExpert(y[lo*h:], b.x, b.p, b.fc1, b.fc2, b.scratch, m, h, f)
				continue
			}
			kernels.ExpertForward(y[lo*h:], b.x, b.p, b.fc1, b.fc2, b.scratch, m, h, f, nil)
		}
		ys[e] = y
	})
	return ys
}

// refShared adds the shared experts' outputs of the sampled tokens to out.
func refShared(l *layer.Layer, sample [][]int, out [][]float64) {
	c := l.Cfg
	h := c.Hidden
	fs := c.FFN * c.SharedExperts
	w1, w2 := widen(l.SharedFC1), widen(l.SharedFC2)
	for r := range out {
		n := len(sample[r])
		x, y := make([]float64, n*h), make([]float64, n*h)
		for i, t := range sample[r] {
			for j := range h {
				x[i*h+j] = float64(l.X[r][t*h+j])
			}
		}
		kernels.ExpertForward(y, x, nil, w1, w2, make([]float64, n*3*fs), n, h, fs, nil)
		for i, v := range y {
			out[r][i] += v
		}
	}
}

// allTokens lists every token of every rank.
func allTokens(ep, tokens int) [][]int {
	s := make([][]int, ep)
	for r := range s {
		for t := range tokens {
			s[r] = append(s[r], t)
		}
	}
	return s
}

func widen(s []float32) []float64 { return widenInto(nil, s) }

// widenInto is s in float64, in dst's memory when it is large enough.
func widenInto(dst []float64, s []float32) []float64 {
	dst = kernels.Reslice(dst, len(s))
	for i, v := range s {
		dst[i] = float64(v)
	}
	return dst
}

func sameSet(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		found := false
		for _, y := range b {
			found = found || x == y
		}
		if !found {
			return false
		}
	}
	return true
}

func sum(v []float64, idx []int32) float64 {
	s := 0.0
	for _, e := range idx {
		s += v[e]
	}
	return s
}
