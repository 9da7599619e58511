package kernels

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
)

// fdLoss is Σ DOut·out of p's layer, computed in float64 with the forward
// functions (MatMulNT, Select, Probs, ExpertForward). With an override, the
// logits are the override plus the change of x·Wrᵀ from base (the
// straight-through estimator's function). It fails when a token's selection
// is not p.Idx's: a finite difference that crosses a selection boundary
// measures nothing.
func fdLoss(t *testing.T, p GradProblem, base []float64) float64 {
	t.Helper()
	c := p.Router
	T, h, f, E, k := p.Tokens, p.Hidden, p.FFN, c.Experts, c.TopK
	loss := 0.0
	z, y := make([]float64, E), make([]float64, h)
	for tok := range T {
		x, sel := p.X[tok*h:(tok+1)*h], p.Idx[tok*k:(tok+1)*k]
		MatMulNT(z, x, p.Wr, 1, E, h)
		if p.Override != nil {
			for e := range z {
				z[e] += p.Override[tok*E+e] - base[tok*E+e]
			}
		}
		var probs []float64
		if p.Probs != nil {
			probs = p.Probs[tok*k : (tok+1)*k]
		} else {
			if got := c.Select(c.SelectionScores(z)); !sameExperts(got, sel) {
				t.Fatalf("token %d: the perturbed forward selects %v, not %v", tok, got, sel)
			}
			probs = c.Probs(z, sel)
		}
		out := make([]float64, h)
		for j, e := range sel {
			fc1, fc2 := p.Expert(int(e))
			ExpertForward(y, x, probs[j:j+1], fc1, fc2, make([]float64, 3*f), 1, h, f, nil)
			axpy(out, 1, y)
		}
		if p.SharedFFN > 0 {
			ExpertForward(y, x, nil, p.SharedFC1, p.SharedFC2, make([]float64, 3*p.SharedFFN), 1, h, p.SharedFFN, nil)
			axpy(out, 1, y)
		}
		loss += dot(out, p.DOut[tok*h:(tok+1)*h])
	}
	return loss
}

func sameExperts(a, b []int32) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// fdEps is the central differences' step. Their error is about eps²/6
// times the loss's third derivative (truncation) plus 1e-16·|L|/eps
// (rounding): below 1e-9 for these layers, whose values are of order one.
// fdTol bounds |fd − analytic| relative to the tensor's largest gradient:
// three orders over that error, and orders under what a wrong gradient
// gives (a 1% error in one term fails it).
const (
	fdEps = 1e-5
	fdTol = 1e-6
)

// The reference gradients equal central finite differences of the float64
// forward, for every parameter and input coordinate, for every score
// function and router option; the selection bias has no gradient.
func TestReferenceGradsFiniteDifferences(t *testing.T) {
	for _, c := range gradCases(6, 5, 3, 4) {
		t.Run(c.name, func(t *testing.T) {
			l := newGradLayer(7, c)
			p := l.problem()
			ref := ReferenceGrads(p)
			var base []float64
			if p.Override != nil {
				base = make([]float64, l.T*c.rc.Experts)
				MatMulNT(base, p.X, p.Wr, l.T, c.rc.Experts, l.h)
			}
			worst, coords := 0.0, 0 // largest |fd − ref| / max|ref| of a tensor
			check := func(name string, param, grad []float64) {
				scale := 1e-3 // the tensor's largest gradient, at least 1e-3
				for _, g := range grad {
					scale = math.Max(scale, math.Abs(g))
				}
				coords += len(param)
				for i := range param {
					v := param[i]
					param[i] = v + fdEps
					up := fdLoss(t, p, base)
					param[i] = v - fdEps
					down := fdLoss(t, p, base)
					param[i] = v
					fd := (up - down) / (2 * fdEps)
					if d := math.Abs(fd - grad[i]); d > fdTol*scale {
						t.Fatalf("%s[%d]: reference %.9g, finite difference %.9g", name, i, grad[i], fd)
					}
					worst = math.Max(worst, math.Abs(fd-grad[i])/scale)
				}
			}
			check("x", p.X, ref.X)
			wr := make([]float64, len(p.Wr)) // the loss sums every rank's tokens
			for _, g := range ref.Wr {
				axpy(wr, 1, g)
			}
			check("router weight", p.Wr, wr)
			for e := range c.rc.Experts {
				check(fmt.Sprintf("expert %d fc1", e), l.fc1[e], ref.FC1[e])
				check(fmt.Sprintf("expert %d fc2", e), l.fc2[e], ref.FC2[e])
			}
			if c.fs > 0 {
				check("shared fc1", l.sfc1, ref.SharedFC1)
				check("shared fc2", l.sfc2, ref.SharedFC2)
			}
			if b := l.rc.Bias; b != nil { // selection only: the loss does not move
				l0 := fdLoss(t, p, base)
				for e := range b {
					v := b[e]
					b[e] = v + 1e-4
					if d := fdLoss(t, p, base) - l0; d != 0 {
						t.Fatalf("moving bias %d changed the loss by %g", e, d)
					}
					b[e] = v
				}
			}
			t.Logf("%d coordinates: largest |fd − ref| / max|ref| %.2g", coords, worst)
		})
	}
}

// ReferenceGradsEach hands every expert's weight gradients over exactly
// once, on any number of workers, and computes the other gradients as
// ReferenceGrads does.
func TestReferenceGradsEach(t *testing.T) {
	c := gradCases(16, 8, 6, 4)[2] // groups, scale and a shared expert
	l := newGradLayer(9, c)
	want := ReferenceGrads(l.problem())
	for _, workers := range []int{1, 3} {
		var mu sync.Mutex
		seen := map[int]int{}
		got := ReferenceGradsEach(l.problem(), workers, func(e int, fc1, fc2 []float64) {
			mu.Lock()
			defer mu.Unlock()
			seen[e]++
			if relErr(fc1, want.FC1[e]) > 1e-14 || relErr(fc2, want.FC2[e]) > 1e-14 {
				t.Errorf("%d workers: expert %d's weight gradients differ from ReferenceGrads'", workers, e)
			}
		})
		for e := range c.rc.Experts {
			if seen[e] != 1 {
				t.Errorf("%d workers: expert %d handed over %d times, want once", workers, e, seen[e])
			}
		}
		if got.FC1 != nil || got.FC2 != nil {
			t.Errorf("%d workers: ReferenceGradsEach kept the weight gradients", workers)
		}
		got.FC1, got.FC2 = want.FC1, want.FC2
		for name, e := range gradErrs(got, want) {
			if e > 1e-14 {
				t.Errorf("%d workers: %s gradient differs by %.3g", workers, name, e)
			}
		}
	}
}

// TestReferenceGradsFC1Out: a FC1Out that writes fc1·x itself (what the
// reference computes without it) gives the same gradients, and one that
// writes a different fc1 output changes them (the hook is used, not
// ignored).
func TestReferenceGradsFC1Out(t *testing.T) {
	c := gradCases(16, 8, 6, 4)[2]
	l := newGradLayer(9, c)
	want := ReferenceGrads(l.problem())
	h, f, k := l.h, l.f, c.rc.TopK
	fc1Out := func(scale float64) func(e int, slots []int, z []float64) {
		return func(e int, slots []int, z []float64) {
			for i, s := range slots {
				x := l.x[s/k*h : (s/k+1)*h]
				for j := range 2 * f {
					var v float64
					for q, w := range l.fc1[e][j*h : (j+1)*h] {
						v += w * x[q]
					}
					z[i*2*f+j] = scale * v
				}
			}
		}
	}
	p := l.problem()
	p.FC1Out = fc1Out(1)
	for name, e := range gradErrs(ReferenceGrads(p), want) {
		if e > 1e-12 {
			t.Errorf("FC1Out = fc1·x: the %s gradient differs by %.3g", name, e)
		}
	}
	p.FC1Out = fc1Out(1.5)
	changed := false
	for _, e := range gradErrs(ReferenceGrads(p), want) {
		changed = changed || e > 1e-3
	}
	if !changed {
		t.Error("FC1Out = 1.5·fc1·x: no gradient changed; the hook is not used")
	}
}
