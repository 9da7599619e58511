package kernels

import (
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

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

	X []float64 // [T,h] the layer's input
	// XE, when not nil, is the routed experts' input [T,h] in place of X
	// (fp8 dispatch: X quantized and dequantized); its gradient is added
	// to X's unchanged (straight-through, as the FP8 recipes' backward)
	XE []float64
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
	// FC1Out, when not nil, writes into z [len(slots), 2f] the fc1 output
	// of expert e's copies slots (t·k+j) as the caller's reference forward
	// computes it, in place of fc1·x (fp8 per tensor: on the requantized
	// operands, check/fp8tensor.go); the
	// backward takes fc1 and x as they are (straight-through). Called
	// concurrently for different experts.
	FC1Out func(e int, slots []int, z []float64)
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
	E := p.Router.Experts
	fc1, fc2 := make([][]float64, E), make([][]float64, E)
	g := ReferenceGradsEach(p, runtime.GOMAXPROCS(0), func(e int, d1, d2 []float64) {
		fc1[e], fc2[e] = slices.Clone(d1), slices.Clone(d2)
	})
	g.FC1, g.FC2 = fc1, fc2
	return g
}

// ReferenceGradsEach is ReferenceGrads for layers whose experts' weight
// gradients do not all fit in memory at once: workers goroutines compute
// the experts, each into its own float64 buffers, and hand each expert's
// weight gradients to each(e, dfc1, dfc2) — called concurrently, once per
// expert (zeros for an expert no token chose), the buffers reused once it
// returns — instead of keeping them: the Grads it returns have FC1 and FC2
// nil. The other gradients are ReferenceGrads' (the input gradient's
// per-expert parts are added in the order the experts finish: float64
// roundoff may differ between runs, nothing more).
func ReferenceGradsEach(p GradProblem, workers int, each func(e int, fc1, fc2 []float64)) Grads {
	c := p.Router
	T, h, f, E, k := p.Tokens, p.Hidden, p.FFN, c.Experts, c.TopK
	rankTokens := p.RankTokens
	if rankTokens == 0 {
		rankTokens = T
	}
	g := Grads{X: make([]float64, T*h), Probs: make([]float64, T*k), Logits: make([]float64, T*E)}
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

	// Routed experts: each token copy's backward through its expert; its
	// input gradient goes to its token's row.
	byExpert := make([][]int, E) // the slots t·k+j of each expert's copies
	for s, e := range p.Idx[:T*k] {
		byExpert[e] = append(byExpert[e], s)
	}
	var mu sync.Mutex // g.X
	xe := p.X
	if p.XE != nil {
		xe = p.XE
	}
	type buffers struct{ dfc1, dfc2, dx []float64 }
	bufs := make([]buffers, max(1, min(workers, E)))
	parallelItems(E, len(bufs), func(w, e int) {
		b := &bufs[w]
		b.dfc1, b.dfc2 = zeroed(b.dfc1, 2*f*h), zeroed(b.dfc2, h*f)
		if slots := byExpert[e]; len(slots) > 0 {
			fc1, fc2 := p.Expert(e)
			b.dx = zeroed(b.dx, len(slots)*h)
			var z []float64
			if p.FC1Out != nil {
				z = make([]float64, len(slots)*2*f)
				p.FC1Out(e, slots, z)
			}
			for i, s := range slots {
				tok := s / k
				x, dy := xe[tok*h:(tok+1)*h], p.DOut[tok*h:(tok+1)*h]
				var zi []float64
				if z != nil {
					zi = z[i*2*f : (i+1)*2*f]
				}
				g.Probs[s] = mlpTokenGrad(x, dy, probs[s], fc1, fc2, zi, h, f, b.dx[i*h:(i+1)*h], b.dfc1, b.dfc2)
			}
			mu.Lock()
			for i, s := range slots {
				axpy(g.X[(s/k)*h:(s/k+1)*h], 1, b.dx[i*h:(i+1)*h])
			}
			mu.Unlock()
		}
		each(e, b.dfc1, b.dfc2)
	})

	// The shared expert sees every token with probability 1.
	if p.SharedFFN > 0 {
		fs := p.SharedFFN
		g.SharedFC1, g.SharedFC2 = make([]float64, 2*fs*h), make([]float64, h*fs)
		for t := range T {
			mlpTokenGrad(p.X[t*h:(t+1)*h], p.DOut[t*h:(t+1)*h], 1, p.SharedFC1, p.SharedFC2, nil, h, fs,
				g.X[t*h:(t+1)*h], g.SharedFC1, g.SharedFC2)
		}
	}

	// The router: dlogit_e = Σ_i dprob_i ∂prob_i/∂z_e, then through
	// z = x·Wrᵀ.
	if p.Probs != nil {
		return g
	}
	for t := range T {
		sel, z, dz := p.Idx[t*k:(t+1)*k], logits[t*E:(t+1)*E], g.Logits[t*E:(t+1)*E]
		jac := probJacobian(c, z, sel)
		for i := range k {
			axpy(dz, g.Probs[t*k+i], jac[i])
		}
		x, dwr := p.X[t*h:(t+1)*h], g.Wr[t/rankTokens]
		for e := range E {
			axpy(dwr[e*h:(e+1)*h], dz[e], x)
			axpy(g.X[t*h:(t+1)*h], dz[e], p.Wr[e*h:(e+1)*h])
		}
	}
	return g
}

// zeroed is a zeroed slice of n elements, in b's memory when it is large
// enough.
func zeroed(b []float64, n int) []float64 {
	b = Reslice(b, n)
	clear(b)
	return b
}

// parallelItems runs fn(w, i) for i in [0, n) on workers goroutines, w
// being the goroutine's index.
func parallelItems(n, workers int, fn func(w, i int)) {
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				fn(w, i)
			}
		})
	}
	wg.Wait()
}

// mlpTokenGrad differentiates y = fc2 · (p · silu(g) ⊙ u), [g | u] = fc1 · x,
// for one token x [h] given dy [h]: it adds the input gradient to dx [h] and
// the weight gradients to dfc1 [2f,h] and dfc2 [h,f], and returns the
// gradient of p. fz, when not nil, is the forward's fc1 output (GradProblem.FC1Out).
func mlpTokenGrad(x, dy []float64, p float64, fc1, fc2, fz []float64, h, f int, dx, dfc1, dfc2 []float64) float64 {
	z := fz
	if z == nil {
		z = make([]float64, 2*f) // fc1 · x
		for r := range z {
			z[r] = dot(fc1[r*h:(r+1)*h], x)
		}
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

// probJacobian returns J[i][e] = ∂prob_i/∂z_e of Router.Probs for one
// token's logits z [E] and chosen experts sel [k]: [k][E], zero at experts
// not chosen unless the softmax over all experts comes first (PreSoftmax).
func probJacobian(c RouterConfig, z []float64, sel []int32) [][]float64 {
	k, E := len(sel), len(z)
	scale := c.Scale
	if scale == 0 {
		scale = 1
	}
	jac := make([][]float64, k)
	for i := range jac {
		jac[i] = make([]float64, E)
	}
	if c.UsesPreSoftmax() { // p_i = scale·P_sel_i, P = softmax(z) over all E
		P := softmax(z)
		for i, s := range sel {
			for e := range E {
				delta := 0.0
				if int(s) == e {
					delta = 1
				}
				jac[i][e] = scale * P[s] * (delta - P[e])
			}
		}
		return jac
	}
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
		for m, e := range sel {
			delta := 0.0
			if i == m {
				delta = 1
			}
			switch {
			case c.Score != ScoreSigmoid: // p_i = scale·q_i/Σq, q = exp(z)
				jac[i][e] = scale * q[i] / sum * (delta - q[m]/sum)
			case k == 1: // p = scale·σ(z)
				jac[i][e] = scale * q[i] * (1 - q[i])
			default: // p_i = scale·σ_i/Σσ
				jac[i][e] = scale * (delta/sum - q[i]/(sum*sum)) * q[m] * (1 - q[m])
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
