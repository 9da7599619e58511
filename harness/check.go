package harness

import (
	"fmt"
	"math"

	"github.com/moebench/moebench/dispatchers"
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

// routingSlack is how much lower (in selection score summed over the k
// choices) the layer's choice may be than the float64 reference's: it absorbs
// near-ties that fp32 logits order differently, and nothing larger.
const routingSlack = 1e-3

// Check runs one untimed step with poisoned outputs and compares the layer's
// output with the float64 reference; it also runs the dispatcher's round trip.
func Check(l *Layer, d dispatchers.Dispatcher, fresh func() (dispatchers.Dispatcher, error)) (*results.Correctness, error) {
	c := &results.Correctness{Checked: true, Tolerance: Tolerance, Metric: ErrMetric}
	for _, rk := range l.Ranks {
		poison(rk.Y)
		poison(rk.ExpertY)
	}
	untimed := func(_ string, _ int, fn func() error) error { return fn() }
	if err := l.Step(d, untimed); err != nil {
		return nil, err
	}
	ref, diffs, err := Reference(l)
	c.RoutingDiffs = diffs
	if err != nil {
		c.Detail = err.Error()
		c.MaxRelErr = math.Inf(1)
	} else {
		c.MaxRelErr = maxRelErr(l, ref)
	}
	rd, err := fresh()
	if err != nil {
		return nil, err
	}
	c.RoundTrip = RoundTrip(rd, l.Shape, l.X, l.Ranks)
	c.Passed = c.Detail == "" && c.MaxRelErr <= Tolerance && c.RoundTrip == "exact"
	if !c.Passed && c.Detail == "" {
		c.Detail = fmt.Sprintf("max relative error %.3g (tolerance %g); round trip %s", c.MaxRelErr, Tolerance, c.RoundTrip)
	}
	return c, nil
}

func poison(s []float32) {
	for i := range s {
		s[i] = float32(math.NaN())
	}
}

func maxRelErr(l *Layer, ref [][]float64) float64 {
	var maxErr, maxRef float64
	for r, rk := range l.Ranks {
		for i, v := range rk.Y {
			d := math.Abs(float64(v) - ref[r][i])
			if math.IsNaN(d) {
				return math.Inf(1)
			}
			maxErr = math.Max(maxErr, d)
			maxRef = math.Max(maxRef, math.Abs(ref[r][i]))
		}
	}
	if maxRef == 0 {
		return math.Inf(1) // an all-zero reference means the inputs were bad
	}
	return maxErr / maxRef
}

// Reference computes the layer output in float64, without EP: each global
// expert gathers its token copies from every rank directly. Routing comes
// from float64 router logits; the layer's choice of experts is accepted when
// it is feasible and within routingSlack of the reference's best choice (a
// near-tie), and the reference then uses it so both compute the same sum. It
// returns the outputs per rank and how many tokens' choices differ.
func Reference(l *Layer) (out [][]float64, diffs int, err error) {
	c := l.Cfg
	T, h, f, E, k := c.Tokens, c.Hidden, c.FFN, c.Experts, c.TopK
	probs := make([][]float64, c.EP)
	type copyRef struct{ rank, slot int }
	byExpert := make([][]copyRef, E)
	for r, rk := range l.Ranks {
		logits := make([]float64, T*E)
		if l.Override[r] != nil {
			for i, v := range l.Override[r] {
				logits[i] = float64(v)
			}
		} else {
			kernels.MatMulNT(logits, widen(l.X[r]), widen(l.Wr), T, E, h)
		}
		probs[r] = make([]float64, T*k)
		for t := range T {
			idx := rk.Idx[t*k : (t+1)*k]
			row := logits[t*E : (t+1)*E]
			if l.Trace != nil {
				want, tp := l.Trace.Token(r*T + t)
				if !sameSet(idx, want) {
					return nil, diffs, fmt.Errorf("rank %d token %d: experts %v, trace says %v", r, t, idx, want)
				}
				if tp != nil {
					for j := range tp {
						probs[r][t*k+j] = float64(tp[j])
					}
					continue
				}
			} else {
				if err := l.Router.Feasible(idx); err != nil {
					return nil, diffs, fmt.Errorf("rank %d token %d: %v", r, t, err)
				}
				sel := l.Router.SelectionScores(row)
				best := l.Router.Select(sel)
				if !sameSet(idx, best) {
					diffs++
					if sum(sel, idx) < sum(sel, best)-routingSlack {
						return nil, diffs, fmt.Errorf("rank %d token %d: router chose %v (score %.6g), reference %v (score %.6g)",
							r, t, idx, sum(sel, idx), best, sum(sel, best))
					}
				}
			}
			copy(probs[r][t*k:], l.Router.Probs(row, idx))
		}
		for s, e := range rk.Idx {
			byExpert[e] = append(byExpert[e], copyRef{r, s})
		}
	}
	out = make([][]float64, c.EP)
	for r := range out {
		out[r] = make([]float64, T*h)
	}
	for e, copies := range byExpert {
		n := len(copies)
		if n == 0 {
			continue
		}
		x, p, y := make([]float64, n*h), make([]float64, n), make([]float64, n*h)
		for i, cp := range copies {
			tok := cp.slot / k
			for j := range h {
				x[i*h+j] = float64(l.X[cp.rank][tok*h+j])
			}
			p[i] = probs[cp.rank][cp.slot]
		}
		kernels.ExpertForward(y, x, p, widen(l.FC1[e]), widen(l.FC2[e]), make([]float64, n*3*f), n, h, f, nil)
		for i, cp := range copies {
			dst := out[cp.rank][cp.slot/k*h:]
			for j := range h {
				dst[j] += y[i*h+j]
			}
		}
	}
	if l.SharedFC1 != nil {
		fs := f * c.SharedExperts
		w1, w2 := widen(l.SharedFC1), widen(l.SharedFC2)
		y := make([]float64, T*h)
		for r := range out {
			kernels.ExpertForward(y, widen(l.X[r]), nil, w1, w2, make([]float64, T*3*fs), T, h, fs, nil)
			for i, v := range y {
				out[r][i] += v
			}
		}
	}
	return out, diffs, nil
}

// RoundTrip checks d alone: with every probability 1/k and experts that
// multiply their input by its probability (on the rows their segments own;
// other rows stay NaN), dispatch then combine must give back each rank's
// input exactly (after bf16 rounding). It returns "exact" or
// a description of the first difference. The ranks' routing is reused.
func RoundTrip(d dispatchers.Dispatcher, shape dispatchers.Shape, x [][]float32, routed []*dispatchers.Rank) string {
	ranks := make([]*dispatchers.Rank, shape.EP)
	for r := range ranks {
		p := make([]float32, shape.Tokens*shape.TopK)
		for i := range p {
			p[i] = 1 / float32(shape.TopK)
		}
		ranks[r] = &dispatchers.Rank{ID: r, X: x[r], Idx: routed[r].Idx, Probs: p, Experts: routed[r].Experts}
	}
	if err := d.Bind(shape, ranks); err != nil {
		return err.Error()
	}
	identity := func(r int) error { // experts that return x·p on the rows they own
		rk := ranks[r]
		rk.ExpertY = make([]float32, len(rk.ExpertX))
		poison(rk.ExpertY)
		for _, sg := range rk.Segments {
			for i := sg.Start * shape.Hidden; i < (sg.Start+sg.Len)*shape.Hidden; i++ {
				rk.ExpertY[i] = rk.ExpertX[i] * rk.ExpertProbs[i/shape.Hidden]
			}
		}
		return nil
	}
	for _, step := range dispatchers.Sequence(d, identity) {
		for r := range ranks {
			if err := step.Run(r); err != nil {
				return err.Error()
			}
		}
	}
	for r, rk := range ranks {
		if len(rk.Y) != len(x[r]) {
			return fmt.Sprintf("rank %d: %d values back, want %d", r, len(rk.Y), len(x[r]))
		}
		for i, v := range rk.Y {
			if kernels.RoundBF16(v) != x[r][i] {
				return fmt.Sprintf("rank %d token %d element %d: %g back, input %g", r, i/shape.Hidden, i%shape.Hidden, v, x[r][i])
			}
		}
	}
	return "exact"
}

func widen(s []float32) []float64 {
	o := make([]float64, len(s))
	for i, v := range s {
		o[i] = float64(v)
	}
	return o
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
