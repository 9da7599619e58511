package balance

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
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

// Stat is a mean over steps of a straggler, absolute and relative.
type Stat struct {
	Abs, Rel float64
}

// SimResult is one policy over all steps.
type SimResult struct {
	Policy       string
	Token        Stat               // copies: max − mean, max/mean − 1
	GEMM         Stat               // modelled seconds: max − mean, max/mean − 1
	BytesPerStep map[string]float64 // by link, mean per step
	// seconds, means over steps: the busiest rank's copy-engine time (the
	// longer of its way out and its way in: rows and weights to helpers,
	// outputs back to owners); of that, the busiest owner's outputs back;
	// and how much of the outputs' way back lands after the expert GEMMs
	// (BackExposed)
	CETimeMax, BackTimeMax, BackExposed float64
	SchedulerMicro                      float64 // measured wall time of the policy's Plan per step, mean, µs
	Steps                               int
}

// Simulate runs each policy over the same steps of src and checks every plan
// (Plan.Check); a violation is an error.
func Simulate(t Topology, m Model, src Source, steps int, policies []string, o Options) ([]SimResult, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	var out []SimResult
	for _, name := range policies {
		pol, err := New(name, t, m, o)
		if err != nil {
			return nil, err
		}
		res := SimResult{Policy: name, BytesPerStep: map[string]float64{}, Steps: steps}
		var sched time.Duration
		for i := range steps {
			st := src.Step(i)
			t0 := time.Now()
			pl := pol.Plan(st)
			sched += time.Since(t0)
			if err := pl.Check(t, st); err != nil {
				return nil, fmt.Errorf("step %d: %w", i, err)
			}
			loads := pl.Loads(t.Ranks)
			lf := make([]float64, len(loads))
			for r, v := range loads {
				lf[r] = float64(v)
			}
			a, r := Straggler(lf)
			res.Token.Abs += a
			res.Token.Rel += r
			gemm, back := phaseEnds(&pl, m, t.Ranks)
			a, r = Straggler(gemm)
			res.GEMM.Abs += a
			res.GEMM.Rel += r
			for link, b := range pl.BytesByLink() {
				res.BytesPerStep[link] += float64(b)
			}
			ce, ret := ceTimes(pl.Moves, t.Ranks, m.CE)
			res.CETimeMax += ce
			res.BackTimeMax += ret
			res.BackExposed += BackExposed(gemm, back)
		}
		n := float64(steps)
		res.Token.Abs, res.Token.Rel, res.GEMM.Abs, res.GEMM.Rel = res.Token.Abs/n, res.Token.Rel/n, res.GEMM.Abs/n, res.GEMM.Rel/n
		for k := range res.BytesPerStep {
			res.BytesPerStep[k] /= n
		}
		res.CETimeMax /= n
		res.BackTimeMax /= n
		res.BackExposed /= n
		res.SchedulerMicro = float64(sched.Microseconds()) / n
		out = append(out, res)
	}
	return out, nil
}

// ceTimes is the busiest rank's copy-engine time under moves (the longer of
// its way out and its way in, each at rate), and the busiest owner's time
// to take its outputs back.
func ceTimes(moves []Move, ranks int, rate float64) (busiest, back float64) {
	out, in, ret := make([]float64, ranks), make([]float64, ranks), make([]float64, ranks)
	for _, mv := range moves {
		if mv.Link != LinkCE {
			continue
		}
		b := float64(mv.Bytes) / rate
		out[mv.From] += b
		in[mv.To] += b
		if !mv.Weights { // the outputs come back
			out[mv.To] += b
			in[mv.From] += b
			ret[mv.From] += b
		}
	}
	for r := range ranks {
		busiest = max(busiest, out[r], in[r])
	}
	return busiest, slices.Max(ret)
}

// BackExposed is how long after the slowest rank's expert GEMMs the last
// output of a moved token is back with its owner, from phaseEnds' times:
// what the way back adds to the step, 0 when every output is back in time.
func BackExposed(gemm, back []float64) float64 {
	return max(0, slices.Max(back)-slices.Max(gemm))
}

// phaseEnds models each rank's expert phase under p: when its GEMMs end,
// and when the last output of the tokens it moved to helpers is back (0 if
// none). It follows the feplb dispatcher's order of work on a rank: its
// static experts, then the chunks it computes for others, then the share of
// its own dynamic experts it keeps (Plan.Dynamic; every expert's first share
// is its owner's). A helper's outputs leave when its chunks are computed,
// one copy after another on its way out and on the owner's way in, at the
// copy-engine rate; the chunks' rows are taken to have landed before the
// helper's static experts end, as the policy plans them.
func phaseEnds(p *Plan, m Model, ranks int) (gemm, back []float64) {
	type ret struct {
		from, to int
		secs     float64
	}
	var rets []ret
	for _, mv := range p.Moves {
		if mv.Link == LinkCE && !mv.Weights {
			rets = append(rets, ret{mv.To, mv.From, float64(mv.Bytes) / m.CE})
		}
	}
	gemm, back = m.GEMMTimes(p, ranks), make([]float64, ranks)
	if len(rets) == 0 {
		return gemm, back
	}
	done := slices.Clone(gemm) // when each rank's chunks for others are computed
	for e, dyn := range p.Dynamic {
		if dyn { // the owner's kept share comes after them
			s := p.Shares[e][0]
			done[s.Rank] -= m.ExpertTime(s.Tokens)
		}
	}
	// each copy in the order its helper is done: it starts when its helper
	// is done and both ways are free
	slices.SortStableFunc(rets, func(a, b ret) int { return cmp.Compare(done[a.from], done[b.from]) })
	out := make([]float64, ranks)
	for _, r := range rets {
		end := max(done[r.from], out[r.from], back[r.to]) + r.secs
		out[r.from], back[r.to] = end, end
	}
	return gemm, back
}

// Straggler is max − mean and max/mean − 1 of v (rel 0 when the mean is 0).
func Straggler(v []float64) (abs, rel float64) {
	mean := 0.0
	for _, x := range v {
		mean += x
	}
	mean /= float64(len(v))
	hi := slices.Max(v)
	if mean == 0 {
		return hi - mean, 0
	}
	return hi - mean, hi/mean - 1
}
