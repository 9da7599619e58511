package kernels

import "math"

// ScoreBackward is the backward of Route's probabilities: from the
// probabilities' gradient dprobs [T,k] (in the order of idx [T,k]) and the
// logits [T,E] the forward scored, it writes the logits' gradient dlogits
// [T,E]. Only the chosen experts get one (except with PreSoftmax, whose
// softmax over all experts reaches every logit): top-k and group-limited
// selection are piecewise constant, and the sigmoid's selection bias only
// selects.
// Scores are recomputed from the logits as Route computes them and the rest
// is F arithmetic (fp32 for the host device, as Megatron's fp32 router):
//
//	g_i = scale · dprob_i
//	softmax over the k chosen:  q = softmax(z_chosen)
//	                            dz_i = q_i · (g_i − Σ_j q_j g_j)
//	sigmoid, k > 1:             s_i = σ(z_i), S = Σ_j s_j
//	                            dz_i = (g_i − Σ_j g_j s_j / S) / S · s_i(1 − s_i)
//	sigmoid, k = 1:             dz = g · s(1 − s)
//	pre-softmax:                P = softmax(z) over all E, G_e = g_i at e = idx_i
//	                            (0 elsewhere); dz_e = P_e · (G_e − Σ_i P_idx_i g_i)
//	                            for every expert e, chosen or not
//
// With an override of the logits (force-balanced routing) the gradient is
// that of the override's values, passed on to the router GEMM unchanged
// (Megatron's straight-through RandomSTE).
func ScoreBackward[F Float32Or64](c RouterConfig, dlogits, logits, dprobs []F, idx []int32, tokens int) {
	E, k := c.Experts, c.TopK
	scale := F(c.Scale)
	if c.Scale == 0 {
		scale = 1
	}
	s, g := make([]F, k), make([]F, k)
	for t := range tokens {
		z, dz := logits[t*E:(t+1)*E], dlogits[t*E:(t+1)*E]
		sel := idx[t*k : (t+1)*k]
		clear(dz)
		for i := range g {
			g[i] = scale * dprobs[t*k+i]
		}
		if c.UsesPreSoftmax() {
			preSoftmaxBackward(dz, z, g, sel)
			continue
		}
		if c.Score == ScoreSigmoid {
			var sum, dot F
			for i, e := range sel {
				s[i] = F(sigmoid(float64(z[e])))
				sum += s[i]
				dot += g[i] * s[i]
			}
			for i, e := range sel {
				ds := g[i]
				if k > 1 {
					ds = (g[i] - dot/sum) / sum
				}
				dz[e] = ds * s[i] * (1 - s[i])
			}
			continue
		}
		m := math.Inf(-1)
		for _, e := range sel {
			m = math.Max(m, float64(z[e]))
		}
		var sum, dot F
		for i, e := range sel {
			s[i] = F(math.Exp(float64(z[e]) - m))
			sum += s[i]
		}
		for i := range s {
			s[i] /= sum
			dot += s[i] * g[i]
		}
		for i, e := range sel {
			dz[e] = s[i] * (g[i] - dot)
		}
	}
}

// preSoftmaxBackward writes one token's dz [E] from its logits z [E] and
// the scaled probability gradients g [k] of its chosen experts sel: the
// backward of p_i = P_sel_i with P the softmax over all experts.
func preSoftmaxBackward[F Float32Or64](dz, z, g []F, sel []int32) {
	m := math.Inf(-1)
	for _, v := range z {
		m = math.Max(m, float64(v))
	}
	var sum F
	for e, v := range z {
		dz[e] = F(math.Exp(float64(v) - m)) // P's numerator, for now
		sum += dz[e]
	}
	var dot F
	for e := range dz {
		dz[e] /= sum
	}
	for i, e := range sel {
		dot += dz[e] * g[i]
	}
	for e := range dz {
		var ge F // G_e: the gradient of e's probability, if chosen
		for i, s := range sel {
			if int(s) == e {
				ge = g[i]
			}
		}
		dz[e] *= ge - dot
	}
}

// RouterBackward is the backward of the router GEMM logits = x · Wrᵀ (x
// [T,h], Wr [E,h]) given dlogits [T,E]: dx = dlogits · Wr [T,h] (B6) and
// dWr = dlogitsᵀ · x [E,h] (B7), both accumulated in F and then rounded to
// the input's and the weight's storage (Megatron's RouterGatingLinearFunction
// computes both in the fp32 router dtype and casts them back). dWr is
// written, not added to: it is the step's parameter gradient, which the
// optimizer's fp32 main_grad then accumulates.
func RouterBackward[F Float32Or64](dx, dwr, dlogits, x, wr []F, tokens, hidden, experts int, round func([]F)) {
	MatMulNN(dx, dlogits, wr, tokens, hidden, experts)
	clear(dwr[:experts*hidden])
	MatMulTNAdd(dwr, dlogits, x, experts, hidden, tokens)
	if round != nil {
		round(dx[:tokens*hidden])
		round(dwr[:experts*hidden])
	}
}
