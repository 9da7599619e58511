package kernels

import (
	"fmt"
	"math"
)

// Score functions of the router (Megatron-Core's moe_router_score_function).
const (
	ScoreSoftmax = "softmax" // top-k on the logits, softmax over the k selected (PreSoftmax: softmax over all, then top-k)
	ScoreSigmoid = "sigmoid" // top-k on sigmoid+bias, unbiased sigmoid renormalised
)

// RouterConfig is what the top-k step needs besides the logits.
type RouterConfig struct {
	Experts   int
	TopK      int
	Score     string    // ScoreSoftmax or ScoreSigmoid
	Groups    int       // expert groups for group-limited routing; 0 or 1 = off
	GroupTopK int       // groups each token may use
	Bias      []float32 // per-expert selection bias (sigmoid only); nil = none
	Scale     float64   // moe_router_topk_scaling_factor; 0 means 1
	// PreSoftmax (softmax only; Megatron's moe_router_pre_softmax): the
	// softmax over all experts comes first, top-k selects on it and the
	// chosen keep their share of it, not renormalised.
	PreSoftmax bool
}

func (c RouterConfig) grouped() bool { return c.Groups > 1 }

// SelectionScores returns, for one token's logits, the scores top-k selects
// on: the logits for softmax (with PreSoftmax the softmax over all experts),
// sigmoid(logit)+bias for sigmoid.
func (c RouterConfig) SelectionScores(logits []float64) []float64 {
	if c.UsesPreSoftmax() {
		return softmax(logits)
	}
	s := make([]float64, len(logits))
	for e, l := range logits {
		if c.Score == ScoreSigmoid {
			s[e] = sigmoid(l)
			if c.Bias != nil {
				s[e] += float64(c.Bias[e])
			}
		} else {
			s[e] = l
		}
	}
	return s
}

// Select returns the k experts with the highest selection scores, in
// descending order of score (ties: lower index first). With group-limited
// routing only experts of the GroupTopK best groups are eligible, a group's
// score being the sum of its best TopK/GroupTopK scores.
func (c RouterConfig) Select(sel []float64) []int32 {
	eligible := make([]bool, len(sel))
	if c.grouped() {
		per := c.Experts / c.Groups
		gs := make([]float64, c.Groups)
		for g := range gs {
			for _, e := range topIdx(sel[g*per:(g+1)*per], nil, c.TopK/c.GroupTopK) {
				gs[g] += sel[g*per+int(e)]
			}
		}
		for _, g := range topIdx(gs, nil, c.GroupTopK) {
			for e := int(g) * per; e < int(g+1)*per; e++ {
				eligible[e] = true
			}
		}
	} else {
		for e := range eligible {
			eligible[e] = true
		}
	}
	return topIdx(sel, eligible, c.TopK)
}

func (c RouterConfig) UsesPreSoftmax() bool { return c.PreSoftmax && c.Score == ScoreSoftmax }

// softmax is the softmax of v.
func softmax(v []float64) []float64 {
	m := math.Inf(-1)
	for _, x := range v {
		m = math.Max(m, x)
	}
	s, sum := make([]float64, len(v)), 0.0
	for i, x := range v {
		s[i] = math.Exp(x - m)
		sum += s[i]
	}
	for i := range s {
		s[i] /= sum
	}
	return s
}

// Probs returns the routing probabilities of the chosen experts of one token.
func (c RouterConfig) Probs(logits []float64, idx []int32) []float64 {
	p := make([]float64, len(idx))
	scale := c.Scale
	if scale == 0 {
		scale = 1
	}
	if c.UsesPreSoftmax() {
		all := softmax(logits)
		for i, e := range idx {
			p[i] = all[e] * scale
		}
		return p
	}
	if c.Score == ScoreSigmoid {
		sum := 0.0
		for i, e := range idx {
			p[i] = sigmoid(logits[e])
			sum += p[i]
		}
		for i := range p {
			if len(idx) > 1 {
				p[i] /= sum
			}
			p[i] *= scale
		}
		return p
	}
	m := math.Inf(-1)
	for _, e := range idx {
		m = math.Max(m, logits[e])
	}
	sum := 0.0
	for i, e := range idx {
		p[i] = math.Exp(logits[e] - m)
		sum += p[i]
	}
	for i := range p {
		p[i] = p[i] / sum * scale
	}
	return p
}

// Feasible reports whether idx is a valid choice for this router: TopK
// distinct experts in range, spanning at most GroupTopK groups.
func (c RouterConfig) Feasible(idx []int32) error {
	if len(idx) != c.TopK {
		return fmt.Errorf("%d experts chosen, want topk = %d", len(idx), c.TopK)
	}
	seen := map[int32]bool{}
	groups := map[int]bool{}
	for _, e := range idx {
		if e < 0 || int(e) >= c.Experts {
			return fmt.Errorf("expert %d out of range [0, %d)", e, c.Experts)
		}
		if seen[e] {
			return fmt.Errorf("expert %d chosen twice", e)
		}
		seen[e] = true
		if c.grouped() {
			groups[int(e)/(c.Experts/c.Groups)] = true
		}
	}
	if c.grouped() && len(groups) > c.GroupTopK {
		return fmt.Errorf("experts span %d groups, at most topk-groups = %d allowed", len(groups), c.GroupTopK)
	}
	return nil
}

// Route runs the top-k step on logits [T,E] and writes the chosen experts to
// idx [T,k] and their probabilities to probs [T,k] (float32, as the layer
// keeps them). Scores are computed in float64 whatever F is.
func Route[F Float32Or64](c RouterConfig, logits []F, tokens int, idx []int32, probs []float32) {
	E, k := c.Experts, c.TopK
	row := make([]float64, E)
	for t := range tokens {
		for e := range E {
			row[e] = float64(logits[t*E+e])
		}
		sel := c.Select(c.SelectionScores(row))
		copy(idx[t*k:], sel)
		for i, p := range c.Probs(row, sel) {
			probs[t*k+i] = float32(p)
		}
	}
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// topIdx returns the indices of the n largest values among the eligible ones
// (all when eligible is nil), largest first, ties broken by lower index.
func topIdx(v []float64, eligible []bool, n int) []int32 {
	out := make([]int32, 0, n)
	taken := make([]bool, len(v))
	for range n {
		best := -1
		for i, x := range v {
			if taken[i] || (eligible != nil && !eligible[i]) {
				continue
			}
			if best < 0 || x > v[best] {
				best = i
			}
		}
		if best < 0 {
			break
		}
		taken[best] = true
		out = append(out, int32(best))
	}
	return out
}
