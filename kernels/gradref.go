package kernels

import "math"

// The float64 reference of every gradient of the layer, from first
// principles: token by token, each chosen expert's MLP is differentiated with
// matrix-vector products (no permutation, no batched GEMM, none of the
// backward functions of backward.go), and the router's probabilities through
// their explicit Jacobian. It is validated against central finite differences
// of the float64 forward (gradref_test.go) and is the oracle the host and
// device backward are checked against.

// GradProblem is one layer's forward inputs and upstream gradient, in
// float64 (the bf16 values the layer holds, widened), for ReferenceGrads.
type GradProblem struct {
	Router RouterConfig
	// Tokens is the number of tokens, all ranks together, in rank order;
	// RankTokens is the tokens per rank (0: one rank holds them all), by
	// which the router weight's gradient is given per rank.
	Tokens, RankTokens     int
	Hidden, FFN, SharedFFN int // SharedFFN is FFN × shared experts; 0: none

	X  []float64 // [T,h] the layer's input
	Wr []float64 // [E,h] router weight
	// Override, when not nil, holds logits [T,E] that replace x·Wrᵀ in the
	// forward; their gradient flows to x·Wrᵀ unchanged (straight-through,
	// Megatron's force-balanced routing).
	Override []float64
	Idx      []int32 // [T,k] the chosen experts
	// Probs, when not nil, are given probabilities [T,k] (a trace's): the
	// router then has no gradient. nil: Router's probabilities of Idx.
	Probs                []float64
	Expert               func(e int) (fc1, fc2 []float64) // expert e's weights, [2f,h] and [h,f]; called concurrently
	SharedFC1, SharedFC2 []float64                        // [2·fs,h], [h,fs]; nil without shared expert
	DOut                 []float64                        // [T,h] the output's gradient
}

// Grads are the gradients of the scalar Σ DOut·out with respect to each
// input of the layer, and two intermediates.
type Grads struct {
	X                    []float64   // [T,h]
	Wr                   [][]float64 // per rank, [E,h] from that rank's tokens
	FC1, FC2             [][]float64 // per expert, [2f,h] and [h,f] (zeros for experts no token chose)
	SharedFC1, SharedFC2 []float64   // nil without shared expert
	Probs                []float64   // [T,k] the probabilities' gradient
	Logits               []float64   // [T,E] the router logits' gradient (zero without router gradient)
}

// ReferenceGrads computes every gradient of p's layer in float64. Experts
// run in parallel, each calling p.Expert once.
func ReferenceGrads(p GradProblem) Grads {
	c := p.Router
	T, h, f, E, k := p.Tokens, p.Hidden, p.FFN, c.Experts, c.TopK
	rankTokens := p.RankTokens
	if rankTokens == 0 {
		rankTokens = T
	}
	g := Grads{X: make([]float64, T*h), FC1: make([][]float64, E), FC2: make([][]float64, E),
		Probs: make([]float64, T*k), Logits: make([]float64, T*E)}
	for range (T + rankTokens - 1) / rankTokens {
		g.Wr = append(g.Wr, make([]float64, E*h))
	}

	// The forward's logits and probabilities, token by token.
	logits, probs := make([]float64, T*E), p.Probs
	if probs == nil {
		probs = make([]float64, T*k)
	}
	for t := range T {
		z := logits[t*E : (t+1)*E]
		if p.Override != nil {
			copy(z, p.Override[t*E:(t+1)*E])
		} else {
			for e := range E {
				z[e] = dot(p.X[t*h:(t+1)*h], p.Wr[e*h:(e+1)*h])
			}
		}
		if p.Probs == nil {
			copy(probs[t*k:], c.Probs(z, p.Idx[t*k:(t+1)*k]))
		}
	}

	// Routed experts: each token copy's backward through its expert.
	type copyRef struct{ tok, slot int }
	byExpert := make([][]copyRef, E)
	for s, e := range p.Idx[:T*k] {
		byExpert[e] = append(byExpert[e], copyRef{s / k, s})
	}
	dxCopy := make([]float64, T*k*h) // each copy's input gradient, by slot
	parallelRows(E, T*k*h*f, func(lo, hi int) {
		for e := lo; e < hi; e++ {
			g.FC1[e], g.FC2[e] = make([]float64, 2*f*h), make([]float64, h*f)
			if len(byExpert[e]) == 0 {
				continue
			}
			fc1, fc2 := p.Expert(e)
			for _, cp := range byExpert[e] {
				x, dy := p.X[cp.tok*h:(cp.tok+1)*h], p.DOut[cp.tok*h:(cp.tok+1)*h]
				g.Probs[cp.slot] = mlpTokenGrad(x, dy, probs[cp.slot], fc1, fc2, h, f,
					dxCopy[cp.slot*h:(cp.slot+1)*h], g.FC1[e], g.FC2[e])
			}
		}
	})
	for s := range T * k {
		axpy(g.X[(s/k)*h:(s/k+1)*h], 1, dxCopy[s*h:(s+1)*h])
	}

	// The shared expert sees every token with probability 1.
	if p.SharedFFN > 0 {
		fs := p.SharedFFN
		g.SharedFC1, g.SharedFC2 = make([]float64, 2*fs*h), make([]float64, h*fs)
		for t := range T {
			mlpTokenGrad(p.X[t*h:(t+1)*h], p.DOut[t*h:(t+1)*h], 1, p.SharedFC1, p.SharedFC2, h, fs,
				g.X[t*h:(t+1)*h], g.SharedFC1, g.SharedFC2)
		}
	}

	// The router: dlogit_e = Σ_i dprob_i ∂prob_i/∂z_e over the chosen e,
	// then through z = x·Wrᵀ.
	if p.Probs != nil {
		return g
	}
	for t := range T {
		sel, z, dz := p.Idx[t*k:(t+1)*k], logits[t*E:(t+1)*E], g.Logits[t*E:(t+1)*E]
		jac := probJacobian(c, z, sel)
		for i := range k {
			for m, e := range sel {
				dz[e] += g.Probs[t*k+i] * jac[i][m]
			}
		}
		x, dwr := p.X[t*h:(t+1)*h], g.Wr[t/rankTokens]
		for e := range E {
			axpy(dwr[e*h:(e+1)*h], dz[e], x)
			axpy(g.X[t*h:(t+1)*h], dz[e], p.Wr[e*h:(e+1)*h])
		}
	}
	return g
}

// mlpTokenGrad differentiates y = fc2 · (p · silu(g) ⊙ u), [g | u] = fc1 · x,
// for one token x [h] given dy [h]: it adds the input gradient to dx [h] and
// the weight gradients to dfc1 [2f,h] and dfc2 [h,f], and returns the
// gradient of p.
func mlpTokenGrad(x, dy []float64, p float64, fc1, fc2 []float64, h, f int, dx, dfc1, dfc2 []float64) float64 {
	z := make([]float64, 2*f) // fc1 · x
	for r := range z {
		z[r] = dot(fc1[r*h:(r+1)*h], x)
	}
	dz := make([]float64, 2*f)
	dp := 0.0
	for j := range f {
		gt, u := z[j], z[f+j]
		sg := 1 / (1 + math.Exp(-gt))
		a := gt * sg * u // silu(g)·u
		da := 0.0        // ∂L/∂(p·a_j) = Σ_o dy_o fc2[o,j]
		for o := range h {
			da += dy[o] * fc2[o*f+j]
			dfc2[o*f+j] += dy[o] * p * a
		}
		dp += da * a
		dz[j] = p * da * u * sg * (1 + gt*(1-sg))
		dz[f+j] = p * da * gt * sg
	}
	for r, d := range dz {
		axpy(dfc1[r*h:(r+1)*h], d, x)
		axpy(dx, d, fc1[r*h:(r+1)*h])
	}
	return dp
}

// probJacobian returns J[i][m] = ∂prob_i/∂z_{sel[m]} of Router.Probs for one
// token's logits z [E] and chosen experts sel [k].
func probJacobian(c RouterConfig, z []float64, sel []int32) [][]float64 {
	k := len(sel)
	scale := c.Scale
	if scale == 0 {
		scale = 1
	}
	jac := make([][]float64, k)
	q := make([]float64, k) // exp of the chosen logits (shifted by their max), or their sigmoids
	zmax := math.Inf(-1)
	for _, e := range sel {
		zmax = math.Max(zmax, z[e])
	}
	sum := 0.0
	for m, e := range sel {
		if c.Score == ScoreSigmoid {
			q[m] = sigmoid(z[e])
		} else {
			q[m] = math.Exp(z[e] - zmax)
		}
		sum += q[m]
	}
	for i := range jac {
		jac[i] = make([]float64, k)
		for m := range jac[i] {
			delta := 0.0
			if i == m {
				delta = 1
			}
			switch {
			case c.Score != ScoreSigmoid: // p_i = scale·q_i/Σq, q = exp(z)
				jac[i][m] = scale * q[i] / sum * (delta - q[m]/sum)
			case k == 1: // p = scale·σ(z)
				jac[i][m] = scale * q[i] * (1 - q[i])
			default: // p_i = scale·σ_i/Σσ
				jac[i][m] = scale * (delta/sum - q[i]/(sum*sum)) * q[m] * (1 - q[m])
			}
		}
	}
	return jac
}

func dot(a, b []float64) float64 {
	s := 0.0
	for i, v := range a {
		s += v * b[i]
	}
	return s
}

// axpy adds a·x to y.
func axpy(y []float64, a float64, x []float64) {
	for i, v := range x {
		y[i] += a * v
	}
}
