package kernels

import "math"

// The layer's backward, step by step, as host functions (see BACKWARD.md for
// how the steps map onto the dispatchers and which rounding points a device
// must reproduce). Megatron-Core's bf16 training stores these values as bf16
// (round, when not nil, marks each such point, as in ExpertForward):
//
//	B1 the upstream gradient dOut [T,h] (given, bf16); the unpermute's and
//	   the shared-expert add's backward pass it on unchanged
//	B2 fc2 dgrad dact = dy · fc2         fp32 accumulation, bf16 out
//	B3 SwiGLU×prob backward dh1           fp32 math, bf16 out (weighted_swiglu_back)
//	B4 fc1 dgrad dx = dh1 · fc1          fp32 accumulation, bf16 out
//	B5 permute backward: a token's copies summed in fp32, bf16 out
//	B6 router input gradient dlogits · Wr fp32 GEMM, bf16 out (the input's dtype)
//	B7 router weight gradient dlogitsᵀ · x fp32 GEMM, bf16 out (the weight's dtype)
//	B8 the input gradient's three parts added in bf16: permute's, then the
//	   router's, then the shared expert's (autograd's accumulation order)
//
// and keeps these in fp32, unrounded: the probability gradient (the fp32
// probs' own dtype), the logit gradient (the fp32 router), and the expert
// weight gradients fc1/fc2 (accumulated into fp32 main_grad by the wgrad
// GEMM, Transformer Engine's gradient-accumulation fusion).

// GradTolerance is the largest error (GradErrMetric) of a gradient computed
// with bf16 storage at B1–B8 against the float64 reference. The longest chain
// of roundings is the input gradient's: bf16 (unit roundoff u = 2⁻⁹ ≈ 2e-3)
// after fc2's dgrad (B2), the SwiGLU backward (B3), fc1's dgrad (B4), the
// permute backward's sum (B5) and the two adds of the input gradient's parts
// (B8), plus the forward's stored fc1 output, which the SwiGLU backward
// reads: seven roundings, 7u ≈ 1.4e-2 if every one erred the same way at the
// tensor's largest value. The weight, probability and logit gradients have
// three to five (the logit gradient's cancellation, q·(g − Σqg), is of values
// of its own scale). Rounding errors partly cancel, so observed errors are
// well under that bound (TestHostBackwardMatchesReference logs them); 2e-2,
// the forward check's tolerance, covers the worst case and stays an order of
// magnitude under what a wrong formula gives (a missing probability, scale or
// input-gradient part, swapped gate and up: TestGradCheckCatchesMutations).
const GradTolerance = 2e-2

// GradErrMetric defines the error GradTolerance bounds, per gradient tensor.
const GradErrMetric = "max_i |g_i − ref_i| / max_i |ref_i| per gradient tensor (input, router weight, all experts' fc1, all experts' fc2, shared fc1, shared fc2); ref from ReferenceGrads in float64 on the same bf16 inputs, weights and upstream gradient"

// ExpertTape is what one expert's forward over n rows keeps for its backward.
type ExpertTape[F Float32Or64] struct {
	X    []F // [n,h] the rows' inputs
	Prob []F // [n] their routing probabilities; nil means 1 (the shared expert)
	// Saved is ExpertForward's scratch after the call: the fc1 output h1
	// [n,2f] (gate | up), then the activation act [n,f], each as stored.
	Saved []F
}

// ExpertGrads receives one expert's gradients over n rows.
type ExpertGrads[F Float32Or64] struct {
	DX    []F // [n,h] written: the rows' input gradient (B4)
	DProb []F // [n] written: the probabilities' gradient; nil when the tape has no Prob
	DFC1  []F // [2f,h] added to: fc1's weight gradient
	DFC2  []F // [h,f] added to: fc2's weight gradient
}

// ExpertBackward runs the backward of ExpertForward over its n rows, given
// dy [n,h], the output rows' gradient:
//
//	dact  = dy · fc2                   [n,f]   (B2)
//	dFC2 += dyᵀ · act                  [h,f]
//	dh1, dprob = SwiGLUProbBackward     [n,2f]  (B3), [n]
//	dFC1 += dh1ᵀ · x                   [2f,h]
//	dx    = dh1 · fc1                  [n,h]   (B4)
//
// scratch must hold n·3f elements.
func ExpertBackward[F Float32Or64](g ExpertGrads[F], dy []F, tape ExpertTape[F], fc1, fc2, scratch []F, n, h, f int, round func([]F)) {
	if n == 0 {
		return
	}
	h1, act := tape.Saved[:n*2*f], tape.Saved[n*2*f:n*3*f]
	dact, dh1 := scratch[:n*f], scratch[n*f:n*3*f]
	MatMulNN(dact, dy, fc2, n, f, h)
	if round != nil {
		round(dact)
	}
	MatMulTNAdd(g.DFC2, dy, act, h, f, n)
	SwiGLUProbBackward(dh1, g.DProb, dact, h1, tape.Prob, n, f)
	if round != nil {
		round(dh1)
	}
	MatMulTNAdd(g.DFC1, dh1, tape.X, 2*f, h, n)
	MatMulNN(g.DX[:n*h], dh1, fc1, n, h, 2*f)
	if round != nil {
		round(g.DX[:n*h])
	}
}

// SwiGLUProbBackward is the backward of SwiGLUProb (act = silu(g)·u·p) for
// the rows of h1 [n,2f] = [g | u], given dact [n,f]:
//
//	dg = dact·p · silu'(g) · u,   silu'(g) = σ(g)·(1 + g·(1 − σ(g)))
//	du = dact·p · silu(g)
//	dprob[i] = Σ_j silu(g_j)·u_j · dact_j
//
// silu is recomputed from h1 (as Megatron's fused weighted_swiglu_back does;
// act holds p·silu(g)·u rounded, which cannot give the unweighted value
// back). prob nil means 1, and then dprob is not written (it may be nil).
func SwiGLUProbBackward[F Float32Or64](dh1, dprob, dact, h1, prob []F, n, f int) {
	for i := range n {
		p := F(1)
		if prob != nil {
			p = prob[i]
		}
		g, u := h1[i*2*f:i*2*f+f], h1[i*2*f+f:(i+1)*2*f]
		dg, du := dh1[i*2*f:i*2*f+f], dh1[i*2*f+f:(i+1)*2*f]
		var dp F
		for j, d := range dact[i*f : (i+1)*f] {
			x := float64(g[j])
			sg := 1 / (1 + math.Exp(-x))
			silu, dsilu := F(x*sg), F(sg*(1+x*(1-sg)))
			c := d * p
			dg[j] = c * dsilu * u[j]
			du[j] = c * silu
			dp += silu * u[j] * d
		}
		if prob != nil {
			dprob[i] = dp
		}
	}
}

// UnpermuteBackward is the backward of the unpermute (token t's output is
// the sum of its k copies' outputs): each copy's output gradient is its
// token's, dcopies[i,:] = dout[slots[i]/k,:] for the permuted rows of
// PermuteOrder. The shared expert's output gradient is dout itself.
func UnpermuteBackward[F Float32Or64](dcopies, dout []F, slots []int32, k, h int) {
	GatherRows(dcopies, dout, slots, k, h)
}

// PermuteBackward is the backward of the permute (each copy is its token's
// input row): dx[t,:] = Σ of token t's copies' input gradients, summed in F
// and rounded once (B5). dx has one row per token.
func PermuteBackward[F Float32Or64](dx, dcopies []F, slots []int32, k, h int, round func([]F)) {
	clear(dx)
	ScatterAddRows(dx, dcopies, slots, k, h)
	if round != nil {
		round(dx)
	}
}

// InputGrad writes the layer's input gradient, dx = (dperm + drouter) +
// dshared, each sum rounded (B8); drouter or dshared nil is left out (a
// router without gradient, a layer without shared expert).
func InputGrad[F Float32Or64](dx, dperm, drouter, dshared []F, round func([]F)) {
	copy(dx, dperm)
	for _, part := range [][]F{drouter, dshared} {
		if part == nil {
			continue
		}
		for i, v := range part {
			dx[i] += v
		}
		if round != nil {
			round(dx)
		}
	}
}
