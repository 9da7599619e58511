// Package roundtrip is the check of a dispatcher alone: with experts that
// multiply each row by its probability and probabilities that are powers
// of two summing to 1, dispatch then combine must give each rank its input
// back exactly, and the backward must give the input gradient back exactly
// (Verdict, Verdicts). The layer's check (check.Check) runs it next to the
// float64 reference; the dispatch benchmark runs it every iteration. It
// knows dispatchers and kernels' number formats, nothing of layers.
package roundtrip

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
)

// Poison fills s with NaN: a check writes it into outputs before they are
// computed, so that a value never written cannot pass.
func Poison(s []float32) {
	for i := range s {
		s[i] = float32(math.NaN())
	}
}

// Verdict checks d alone: with probabilities that are powers of two
// summing to 1 (Probs) and experts that multiply their input by its
// probability (on the rows their segments own; other rows stay NaN),
// dispatch then combine must give back each rank's input exactly (after
// bf16 rounding). The inputs are x with their significands cut to as few
// bits as keep every partial sum of a token's copies exact in bf16, so that
// a design that adds some of a token's outputs before the others and
// carries the partial sum as bf16 (DeepEP's combine) is exact too. It
// returns "exact" or a description of the first difference. The ranks'
// routing is reused.
func Verdict(d dispatchers.Dispatcher, shape dispatchers.Shape, x [][]float32, routed []*dispatchers.Rank) string {
	fwd, _ := Verdicts(d, shape, x, routed, false, "")
	return fwd
}

// Verdicts is Verdict with the rows sent at precision (Trip.At: the
// dispatch's e4m3 rows and scales at fp8 and mxfp8, as the step sends
// them), followed when backward is set by the
// dispatcher's backward on the same ranks (BackwardVerdict), whose verdict
// it also returns. The ranks share routed's expert weight gradients, which
// a rebalancing dispatcher adds its helpers' (zero) gradients to.
func Verdicts(d dispatchers.Dispatcher, shape dispatchers.Shape, x [][]float32, routed []*dispatchers.Rank, backward bool, precision string) (fwd, bwd string) {
	rt := New(shape, x, routed)
	if err := rt.At(precision); err != nil {
		return err.Error(), ""
	}
	if err := d.Bind(shape, rt.Ranks); err != nil {
		return err.Error(), ""
	}
	for _, step := range d.Forward(rt.Identity) {
		for r := range rt.Ranks {
			if err := step.Run(r); err != nil {
				return err.Error(), ""
			}
		}
	}
	if fwd = rt.Verdict(); !backward {
		return fwd, ""
	} else if fwd != "exact" {
		return fwd, "not run: the forward round trip failed"
	}
	return fwd, rt.BackwardVerdict(d)
}

// Trip is the round trip's ranks: coarsened inputs, power-of-two
// probabilities, the routing reused.
type Trip struct {
	Shape dispatchers.Shape
	X     [][]float32 // each rank's coarsened input: what must come back
	Ranks []*dispatchers.Rank
	// block is the elements sharing one scale of the quantized rows
	// (ToFP8: 128, ToMXFP8: 32); 0 at bf16
	block int
}

func New(shape dispatchers.Shape, x [][]float32, routed []*dispatchers.Rank) *Trip {
	probs, keep := Probs(shape.TopK)
	rt := &Trip{Shape: shape, X: coarsen(x, keep), Ranks: make([]*dispatchers.Rank, shape.EP)}
	for r := range rt.Ranks {
		p := make([]float32, shape.Tokens*shape.TopK)
		for i := range p {
			p[i] = probs[i%shape.TopK]
		}
		rt.Ranks[r] = &dispatchers.Rank{ID: r, X: rt.X[r], Idx: routed[r].Idx, Probs: p, Experts: routed[r].Experts, ExpertGrads: routed[r].ExpertGrads}
	}
	return rt
}

// Identity is the round trip's experts: each returns x·p on the rows its
// segments own (quantized rows dequantized in place first).
func (rt *Trip) Identity(r int) error {
	rk, h := rt.Ranks[r], rt.Shape.Hidden
	if n := len(rk.ExpertY); n < len(rk.ExpertX) { // rows an earlier expert phase left stay
		rk.ExpertY = append(rk.ExpertY, make([]float32, len(rk.ExpertX)-n)...)
		Poison(rk.ExpertY[n:])
	}
	S, B := 0, rt.block // fp8 (ToFP8), mxfp8 (ToMXFP8): the rows are e4m3 values, dequantized first (exact: power-of-two scales)
	if rk.ExpertScales != nil && B > 0 {
		S = h / B
	}
	for _, sg := range rk.Segments {
		for i := sg.Start * h; i < (sg.Start+sg.Len)*h; i++ {
			x := rk.ExpertX[i]
			if S > 0 { // in place, as the layer's expert phase does: the backward's operand
				x *= rk.ExpertScales[i/h*S+i%h/B]
				rk.ExpertX[i] = x
			}
			rk.ExpertY[i] = x * rk.ExpertProbs[i/h]
		}
	}
	return nil
}

// At makes the round trip's ranks send their rows at precision: bf16 ("",
// bf16), or quantized (ToFP8, ToMXFP8).
func (rt *Trip) At(precision string) error {
	switch precision {
	case dispatchers.PrecisionFP8:
		return rt.ToFP8()
	case dispatchers.PrecisionMXFP8:
		return rt.ToMXFP8()
	case "", dispatchers.PrecisionBF16:
		return nil
	}
	return fmt.Errorf("round trip: unknown precision %q (known: bf16, fp8, mxfp8)", precision)
}

// ToFP8 makes the round trip's ranks send e4m3 rows, as the fp8 step
// does: each rank's (coarsened) input quantized in 1×128 blocks, with
// power-of-two (UE8M0) scales so that each dequantized value keeps at most
// e4m3's 4 significant bits and every partial sum of its k copies (times
// probabilities that are powers of two) stays exact in bf16 up to top-16;
// each rank must get its dequantized input back.
func (rt *Trip) ToFP8() error {
	if k := rt.Shape.TopK; k > 16 {
		return &dispatchers.UnavailableError{Name: "round trip", Impl: "fp8", Reason: fmt.Sprintf("the fp8 round trip is exact up to top-16 (4 significant bits + ⌈log2 k⌉ ≤ bf16's 8); top-%d", k)}
	}
	for r, rk := range rt.Ranks {
		q, s, err := kernels.QuantFP8Rows(rt.X[r], rt.Shape.Hidden, true)
		if err != nil {
			return err
		}
		v := make([]float32, len(q))
		for i, c := range q {
			v[i] = kernels.E4M3ToFloat32(c)
		}
		rk.X, rk.Scales, rt.X[r] = v, s, kernels.DequantFP8Rows(q, s)
	}
	rt.block = dispatchers.FP8Block
	return nil
}

// ToMXFP8 is ToFP8 at mxfp8: each rank's input quantized in 1×32 blocks by
// TransformerEngine's MXFP8 rule (E8M0 scales, powers of two, sent as
// their float32 values), the same exactness up to top-16.
func (rt *Trip) ToMXFP8() error {
	if k := rt.Shape.TopK; k > 16 {
		return &dispatchers.UnavailableError{Name: "round trip", Impl: "mxfp8", Reason: fmt.Sprintf("the mxfp8 round trip is exact up to top-16 (4 significant bits + ⌈log2 k⌉ ≤ bf16's 8); top-%d", k)}
	}
	for r, rk := range rt.Ranks {
		x := rt.X[r]
		q, e := make([]uint8, len(x)), make([]uint8, len(x)/kernels.MXBlock)
		if err := kernels.QuantMXFP8RowsInto(q, e, x); err != nil {
			return err
		}
		v, s, back := make([]float32, len(q)), make([]float32, len(e)), make([]float32, len(q))
		for i, b := range e {
			s[i] = kernels.MXScaleValue(b)
		}
		for i, c := range q {
			v[i] = kernels.E4M3ToFloat32(c)
			back[i] = v[i] * s[i/kernels.MXBlock]
		}
		rk.X, rk.Scales, rt.X[r] = v, s, back
	}
	rt.block = dispatchers.MXBlock
	return nil
}

// Verdict is "exact" when every rank got its input back, else the first
// difference.
func (rt *Trip) Verdict() string {
	h := rt.Shape.Hidden
	for r, rk := range rt.Ranks {
		if len(rk.Y) != len(rt.X[r]) {
			return fmt.Sprintf("rank %d: %d values back, want %d", r, len(rk.Y), len(rt.X[r]))
		}
		for i, v := range rk.Y {
			if kernels.RoundBF16(v) != rt.X[r][i] {
				return fmt.Sprintf("rank %d token %d element %d: %g back, input %g", r, i/h, i%h, v, rt.X[r][i])
			}
		}
	}
	return "exact"
}

// Probs are k probabilities that are powers of two summing to 1
// (the leaves of a complete binary tree: 1/k each when k is a power of two),
// so that the sum of any of them is a multiple of 2⁻ᵈ, d = ⌈log₂ k⌉; keep
// is the significand bits an input may have for every such sum times it to
// be exact in bf16 (8 bits): 8 − d, at least 1 (exact up to top-128).
func Probs(k int) (p []float32, keep int) {
	d := bits.Len(uint(k - 1))
	deep := 2*k - 1<<d // leaves at depth d; the others at depth d − 1
	p = make([]float32, k)
	for j := range p {
		p[j] = 1 / float32(int(1)<<d)
		if j >= deep {
			p[j] *= 2
		}
	}
	return p, max(1, 8-d)
}

// coarsen returns copies of x with each value's significand cut to keep
// bits (toward zero).
func coarsen(x [][]float32, keep int) [][]float32 {
	mask := ^uint32(0) << (24 - keep) // float32 holds 24 significand bits
	out := make([][]float32, len(x))
	for r, v := range x {
		out[r] = make([]float32, len(v))
		for i, f := range v {
			out[r][i] = math.Float32frombits(math.Float32bits(f) & mask)
		}
	}
	return out
}

// IdentityBackward is the round trip's experts' backward (y = x·p):
// dx = dy·p and dp = Σ x·dy (a float32 sum in column order), on the rows
// of the rank's segments.
func (rt *Trip) IdentityBackward(r int) error {
	rk, h := rt.Ranks[r], rt.Shape.Hidden
	rows := len(rk.ExpertProbs)
	if n := rows * h; len(rk.ExpertDX) < n { // rows an earlier expert phase left stay
		at := len(rk.ExpertDX)
		rk.ExpertDX = append(rk.ExpertDX, make([]float32, n-at)...)
		Poison(rk.ExpertDX[at:])
	}
	if n := len(rk.ExpertDProbs); n < rows {
		rk.ExpertDProbs = append(rk.ExpertDProbs, make([]float32, rows-n)...)
		Poison(rk.ExpertDProbs[n:])
	}
	for _, sg := range rk.Segments {
		for i := sg.Start; i < sg.Start+sg.Len; i++ {
			x, dy := rk.ExpertX[i*h:(i+1)*h], rk.ExpertDY[i*h:(i+1)*h]
			rk.ExpertDProbs[i] = rowDot(x, dy)
			for c, v := range dy {
				rk.ExpertDX[i*h+c] = v * rk.ExpertProbs[i]
			}
		}
	}
	return nil
}

func rowDot(x, y []float32) float32 {
	var s float32
	for c, v := range x {
		s += v * y[c]
	}
	return s
}

// BackwardVerdict runs d's backward on the round trip's ranks, after its
// forward, with the upstream gradient equal to the coarsened input: each
// token's input gradient must come back as that row exactly (its copies'
// probabilities sum to 1, every partial sum exact in bf16), and each
// copy's probability gradient as x·dy, bit for bit.
func (rt *Trip) BackwardVerdict(d dispatchers.Dispatcher) string {
	steps := d.Backward(rt.IdentityBackward)
	if steps == nil {
		return fmt.Sprintf("%s declares no backward: %s", d.Name(), d.Capabilities().NoBackward)
	}
	for r, rk := range rt.Ranks {
		rk.DY = rt.X[r]
		for _, b := range []*[]float32{&rk.ExpertDY, &rk.ExpertDX, &rk.ExpertDProbs, &rk.DX, &rk.DProbs} {
			Poison(*b)
		}
	}
	for _, step := range steps {
		for r := range rt.Ranks {
			if err := step.Run(r); err != nil {
				return err.Error()
			}
		}
	}
	h, k := rt.Shape.Hidden, rt.Shape.TopK
	for r, rk := range rt.Ranks {
		x := rt.X[r]
		if len(rk.DX) != len(x) || len(rk.DProbs) != len(rk.Probs) {
			return fmt.Sprintf("rank %d: %d input-gradient and %d probability-gradient values back, want %d and %d", r, len(rk.DX), len(rk.DProbs), len(x), len(rk.Probs))
		}
		for i, v := range rk.DX {
			if v != x[i] {
				return fmt.Sprintf("rank %d token %d element %d: input gradient %g, want %g", r, i/h, i%h, v, x[i])
			}
		}
		for s, v := range rk.DProbs {
			t := s / k
			if want := rowDot(x[t*h:(t+1)*h], x[t*h:(t+1)*h]); v != want {
				return fmt.Sprintf("rank %d token %d slot %d: probability gradient %g, want %g", r, t, s%k, v, want)
			}
		}
	}
	return "exact"
}
