package balance

import (
	"math"
	"math/rand/v2"
)

// Source yields the routing of each simulated step: the token copies per
// expert, and on request their split by source rank.
type Source interface {
	Step(i int) Step
}

// Skewed is a synthetic source. Expert popularity is Zipf(Alpha) over a
// seeded random order of the experts, times a per-expert drift factor that
// follows a mean-reverting random walk in log space (stationary standard
// deviation Drift, step-to-step correlation 0.9). Each step, expert e gets
// Binomial(ranks·tokens, π_e) copies, π_e being the probability that e is
// among a token's TopK experts when they are drawn without replacement in
// proportion to popularity; π_e is approximated by 1 − exp(−λ·p_e) with λ
// chosen so that Σπ = TopK. Copies are split over source ranks uniformly
// (multinomially) when asked.
type Skewed struct {
	Topology
	TopK, Tokens int // tokens per rank
	Alpha, Drift float64
	Seed         uint64
	steps        [][]int
}

// NewSkewed draws all steps up front, so every policy sees the same ones.
func NewSkewed(t Topology, topk, tokens int, alpha, drift float64, seed uint64, steps int) *Skewed {
	s := &Skewed{Topology: t, TopK: topk, Tokens: tokens, Alpha: alpha, Drift: drift, Seed: seed}
	g := rand.New(rand.NewPCG(seed, 1))
	base := make([]float64, t.Experts)
	for i, e := range g.Perm(t.Experts) {
		base[e] = -alpha * math.Log(float64(i+1))
	}
	x := make([]float64, t.Experts)
	const rho = 0.9
	p := make([]float64, t.Experts)
	n := t.Ranks * tokens
	for range steps {
		sum := 0.0
		for e := range x {
			x[e] = rho*x[e] + math.Sqrt(1-rho*rho)*drift*g.NormFloat64()
			p[e] = math.Exp(base[e] + x[e])
			sum += p[e]
		}
		for e := range p {
			p[e] /= sum
		}
		pi := inclusion(p, topk)
		counts := make([]int, t.Experts)
		for e := range counts {
			counts[e] = binomial(g, n, pi[e])
		}
		s.steps = append(s.steps, counts)
	}
	return s
}

// Step returns step i (i < the number drawn).
func (s *Skewed) Step(i int) Step {
	counts := s.steps[i%len(s.steps)]
	return Step{Index: i, Counts: counts, FromRank: func(e int) []int {
		g := rand.New(rand.NewPCG(s.Seed, uint64(i)<<20|uint64(e)))
		return multinomialEven(g, counts[e], s.Ranks)
	}}
}

// inclusion solves Σ 1−exp(−λ·p_e) = k for λ by bisection.
func inclusion(p []float64, k int) []float64 {
	f := func(l float64) float64 {
		s := 0.0
		for _, x := range p {
			s += -math.Expm1(-l * x)
		}
		return s
	}
	lo, hi := 0.0, 1.0
	for f(hi) < float64(k) && hi < 1e12 {
		hi *= 2
	}
	for range 60 {
		mid := (lo + hi) / 2
		if f(mid) < float64(k) {
			lo = mid
		} else {
			hi = mid
		}
	}
	pi := make([]float64, len(p))
	for e, x := range p {
		pi[e] = -math.Expm1(-hi * x)
	}
	return pi
}

// binomial draws Binomial(n, p): by counting geometric gaps when n·p is
// small, else from the normal approximation with continuity correction.
func binomial(g *rand.Rand, n int, p float64) int {
	if p <= 0 || n == 0 {
		return 0
	}
	if p >= 1 {
		return n
	}
	if p > 0.5 {
		return n - binomial(g, n, 1-p)
	}
	if float64(n)*p < 30 {
		k, pos := 0, 0
		lq := math.Log1p(-p)
		for {
			pos += int(math.Log(1-g.Float64())/lq) + 1
			if pos > n {
				return k
			}
			k++
		}
	}
	v := math.Round(float64(n)*p + math.Sqrt(float64(n)*p*(1-p))*g.NormFloat64())
	return int(math.Max(0, math.Min(float64(n), v)))
}

// multinomialEven splits n over k equally likely bins.
func multinomialEven(g *rand.Rand, n, k int) []int {
	out := make([]int, k)
	left := n
	for i := 0; i < k-1 && left > 0; i++ {
		out[i] = binomial(g, left, 1/float64(k-i))
		left -= out[i]
	}
	out[k-1] += left
	return out
}
