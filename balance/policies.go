package balance

import (
	"fmt"
	"math"
	"slices"
	"sort"
)

// Policy computes one step's plan. Policies may keep state across steps
// (history, placement); a Policy is used for one sequence of steps.
type Policy interface {
	Name() string
	Plan(st Step) Plan
}

// PolicyNames are the policies New knows.
var PolicyNames = []string{"none", "eplb", "fastermoe", "feplb", "feplb-split", "feplb+place"}

// FEPLBPolicies are the FEPLB policies a dispatcher can execute per step
// (feplb+place also re-places experts across domains, which a dispatcher
// does not do).
var FEPLBPolicies = []string{"feplb", "feplb-split"}

// Options tune the policies.
type Options struct {
	// EPLB
	RedundantPerRank int // extra expert slots per rank (replicas)
	ReplanEvery      int // steps between placements, from the load history since the last
	// FEPLB
	DynamicPerRank int // dyn: the most loaded experts of each rank that may move (at most L−1)
	// Tau (τ) is the fewest tokens worth moving an expert's weights for: a
	// whole dynamic expert (feplb), or one chunk (feplb-split)
	Tau int
	// MaxDyn is how many moved experts' weights a helper's buffer holds
	// (the paper's max_num_dyn: the buffer is MaxDyn × one expert's weights)
	MaxDyn int
	// BusiestOnly is the strict reading of the paper's scheduler ("pick its
	// busiest dynamic expert"): each round tries only the busiest rank's
	// busiest dynamic expert left, and the scheduler stops when that one
	// cannot move usefully. false (the default, --feplb-fallback next): it
	// tries the rank's next dynamic experts, busiest first. The review of the
	// paper's text leaves it open; it decides much of FEPLB's lead over
	// FasterMoE at EP 8 (results/straggler).
	BusiestOnly bool
}

// DefaultOptions: one redundant slot per rank, re-planned every 50 steps
// (EPLB); the paper's 4 dynamic experts per rank and buffer of 8 experts'
// weights, and τ = 32 tokens (the paper gives no value) for FEPLB.
var DefaultOptions = Options{RedundantPerRank: 1, ReplanEvery: 50, DynamicPerRank: 4, Tau: 32, MaxDyn: 8}

// New returns the named policy.
func New(name string, t Topology, m Model, o Options) (Policy, error) {
	switch name {
	case "none":
		return none{t}, nil
	case "eplb":
		if o.RedundantPerRank < 0 || o.ReplanEvery < 1 {
			return nil, fmt.Errorf("eplb: redundant slots %d must be ≥ 0 and re-plan interval %d ≥ 1", o.RedundantPerRank, o.ReplanEvery)
		}
		return &eplb{t: t, m: m, o: o, history: newHistory(t.Experts, o.ReplanEvery)}, nil
	case "fastermoe":
		return fastermoe{t, m}, nil
	case "feplb", "feplb-split", "feplb+place":
		if o.DynamicPerRank < 0 || o.Tau < 1 || o.MaxDyn < 1 || o.ReplanEvery < 1 {
			return nil, fmt.Errorf("%s: dynamic experts per rank %d must be ≥ 0, τ %d ≥ 1, buffer %d experts ≥ 1, re-plan interval %d ≥ 1",
				name, o.DynamicPerRank, o.Tau, o.MaxDyn, o.ReplanEvery)
		}
		return newFEPLB(name, t, m, o), nil
	}
	return nil, fmt.Errorf("unknown policy %q (known: %v)", name, PolicyNames)
}

// none computes every expert on its owner.
type none struct{ t Topology }

func (none) Name() string { return "none" }
func (p none) Plan(st Step) Plan {
	pl := OwnerPlan(p.t, st)
	pl.Policy, pl.Note = "none", "every expert computed by its owner"
	return pl
}

// eplb is DeepSeek EPLB's global policy (deepseek-ai/EPLB eplb.py, global
// mode): from the load history, replicate the heaviest experts into the
// redundant slots (each time the expert with the largest load per
// replica), then pack all replicas onto ranks, heaviest first onto the
// least loaded rank with a free slot. Tokens of a replicated expert are
// split evenly over its replicas. Every ReplanEvery steps it makes a new
// placement from the history since the last — and adopts it only when the
// history says it pays (keeping the placement is always a candidate; the
// first placement is the default one): a placement made from the older
// half of the history must save, on the newer half, more of the busiest
// rank's load over the next ReplanEvery steps than the new placement's
// weight moves take before the step that uses it. Judging on data the
// placement was not made from keeps drifting popularity from passing for
// a gain.
type eplb struct {
	t       Topology
	m       Model
	o       Options
	history history
	holders [][]int // current placement; nil: the default one
}

func (*eplb) Name() string { return "eplb" }

func (p *eplb) Plan(st Step) Plan {
	t := p.t
	var moves []Move
	note := "placement kept"
	if h := &p.history; h.due() {
		old := p.holders
		if old == nil {
			old = make([][]int, t.Experts)
			for e := range old {
				old[e] = []int{t.Owner(e)}
			}
		}
		judged := eplbPlace(t, h.basis(), p.o.RedundantPerRank)
		gain := h.gain(t, old, judged) * p.m.TokenCompute() * float64(p.o.ReplanEvery)
		cand := eplbPlace(t, h.total(), p.o.RedundantPerRank)
		var cost float64
		moves, cost = p.placementMoves(old, cand)
		if gain > cost {
			p.holders = cand
			note = fmt.Sprintf("new placement from %d steps of history (%d weight moves, %.0f µs before this step; its older half's placement saves %.0f µs over %d steps of the newer half's load)",
				h.steps(), len(moves), 1e6*cost, 1e6*gain, p.o.ReplanEvery)
		} else {
			note = fmt.Sprintf("placement kept: a new one would save %.0f µs over %d steps (judged on the newer half of the history), its weight moves take %.0f µs", 1e6*gain, p.o.ReplanEvery, 1e6*cost)
			moves = nil
		}
		h.reset()
	}
	p.history.add(st.Counts)
	if p.holders == nil {
		pl := OwnerPlan(t, st)
		pl.Policy, pl.Note = "eplb", note
		return pl
	}
	pl := Plan{Policy: "eplb", Shares: make([][]Share, t.Experts), Holders: make([][]int, t.Experts), Moves: moves, Note: note}
	for e, hs := range p.holders {
		pl.Holders[e] = append([]int(nil), hs...)
		n, k := st.Counts[e], len(hs)
		for i, r := range hs {
			part := n / k
			if i < n%k {
				part++
			}
			pl.Shares[e] = append(pl.Shares[e], Share{r, part})
		}
	}
	return pl
}

// history is the tokens per expert since the last placement decision: the
// older half summed, the newer half step by step, so that a placement made
// from the older half can be judged on the newer one, step by step (the
// busiest rank of each step, not of the sum, which hides each step's
// noise).
type history struct {
	older []float64
	newer [][]float64 // per step
	nOld  int
	every int // steps between decisions
	sum   []float64
}

func newHistory(experts, every int) history {
	return history{older: make([]float64, experts), sum: make([]float64, experts), every: every}
}

func (h *history) add(counts []int) {
	if h.nOld < h.every/2 {
		for e, n := range counts {
			h.older[e] += float64(n)
		}
		h.nOld++
		return
	}
	f := make([]float64, len(counts))
	for e, n := range counts {
		f[e] = float64(n)
	}
	h.newer = append(h.newer, f)
}

func (h *history) steps() int { return h.nOld + len(h.newer) }
func (h *history) due() bool  { return h.steps() >= h.every }

// gain is how many tokens per step, on the busiest rank of each step of
// the newer half, placement b (holders) surely saves against placement a:
// the mean saving less two standard errors, the error taken from the means
// of five batches of consecutive steps (the steps' loads are correlated,
// so the steps themselves would understate it).
func (h *history) gain(t Topology, a, b [][]int) float64 {
	n := len(h.newer)
	const batches = 5
	if n < batches {
		g := 0.0
		for _, f := range h.newer {
			g += maxRankLoad(t, a, f) - maxRankLoad(t, b, f)
		}
		return g / float64(n)
	}
	var sum, sq float64
	for k := range batches {
		g := 0.0
		lo, hi := k*n/batches, (k+1)*n/batches
		for _, f := range h.newer[lo:hi] {
			g += maxRankLoad(t, a, f) - maxRankLoad(t, b, f)
		}
		g /= float64(hi - lo)
		sum += g
		sq += g * g
	}
	mean := sum / batches
	sd := math.Sqrt(max(0, sq/batches-mean*mean) * batches / (batches - 1))
	return mean - 2*sd/math.Sqrt(batches)
}

// basis is what a placement to be judged is made from: the older half, or
// the newer one for a one-step interval.
func (h *history) basis() []float64 {
	if h.nOld == 0 {
		return h.newer[0]
	}
	return h.older
}

// total is the whole history (a view, valid until the next add).
func (h *history) total() []float64 {
	copy(h.sum, h.older)
	for _, f := range h.newer {
		for e, x := range f {
			h.sum[e] += x
		}
	}
	return h.sum
}

func (h *history) reset() {
	clear(h.older)
	h.newer = h.newer[:0]
	h.nOld = 0
}

// placementMoves are the weight moves from placement old to next (each new
// holder gets the weights from the expert's first old holder), and the
// time they take before the step: the busiest rank's way in or way out.
func (p *eplb) placementMoves(old, next [][]int) ([]Move, float64) {
	var moves []Move
	in, out := make([]float64, p.t.Ranks), make([]float64, p.t.Ranks)
	for e, hs := range next {
		for _, r := range hs {
			if slices.Contains(old[e], r) {
				continue
			}
			link, bw := p.m.linkBW(p.t, old[e][0], r)
			moves = append(moves, Move{Expert: e, From: old[e][0], To: r, Bytes: p.m.WeightBytes(), Link: link, Weights: true, Kind: KindPlacement})
			in[r] += float64(p.m.WeightBytes()) / bw
			out[old[e][0]] += float64(p.m.WeightBytes()) / bw
		}
	}
	return moves, max(slices.Max(in), slices.Max(out))
}

// maxRankLoad is the busiest rank's load under a placement, each expert's
// load split evenly over its holders.
func maxRankLoad(t Topology, holders [][]int, load []float64) float64 {
	l := make([]float64, t.Ranks)
	for e, hs := range holders {
		for _, r := range hs {
			l[r] += load[e] / float64(len(hs))
		}
	}
	return slices.Max(l)
}

// eplbPlace returns the ranks holding each expert: replicas by largest load
// per replica, packed heaviest first onto the least loaded rank with room.
func eplbPlace(t Topology, load []float64, redundantPerRank int) [][]int {
	replicas := make([]int, t.Experts)
	for e := range replicas {
		replicas[e] = 1
	}
	for range redundantPerRank * t.Ranks {
		best := 0
		for e := range load {
			if load[e]/float64(replicas[e]) > load[best]/float64(replicas[best]) {
				best = e
			}
		}
		replicas[best]++
	}
	type rep struct {
		e int
		w float64
	}
	var reps []rep
	for e, k := range replicas {
		for range k {
			reps = append(reps, rep{e, load[e] / float64(k)})
		}
	}
	sort.SliceStable(reps, func(i, j int) bool { return reps[i].w > reps[j].w })
	slots := t.Local() + redundantPerRank
	used := make([]int, t.Ranks)
	weight := make([]float64, t.Ranks)
	holders := make([][]int, t.Experts)
	for _, r := range reps {
		best := -1
		for k := range t.Ranks {
			if used[k] < slots && !slices.Contains(holders[r.e], k) && (best < 0 || weight[k] < weight[best]) {
				best = k
			}
		}
		if best < 0 { // every rank with room already holds this expert: drop the replica
			continue
		}
		used[best]++
		weight[best] += r.w
		holders[r.e] = append(holders[r.e], best)
	}
	return holders
}
