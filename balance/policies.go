package balance

import (
	"fmt"
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
var PolicyNames = []string{"none", "eplb", "fastermoe", "feplb", "feplb+place"}

// Options tune the policies.
type Options struct {
	// EPLB
	RedundantPerRank int // extra expert slots per rank (replicas)
	ReplanEvery      int // steps between placements, from the load history since the last
	// FEPLB
	DynamicPerRank int // the most loaded experts of each rank that may move
	MinChunk       int // fewest tokens worth moving an expert's weights for
}

// DefaultOptions: one redundant slot per rank re-planned every 50 steps
// (EPLB); two dynamic experts per rank, moved in chunks of at least 32 tokens
// (FEPLB).
var DefaultOptions = Options{RedundantPerRank: 1, ReplanEvery: 50, DynamicPerRank: 2, MinChunk: 32}

// New returns the named policy.
func New(name string, t Topology, m Model, o Options) (Policy, error) {
	switch name {
	case "none":
		return none{t}, nil
	case "eplb":
		if o.RedundantPerRank < 0 || o.ReplanEvery < 1 {
			return nil, fmt.Errorf("eplb: redundant slots %d must be ≥ 0 and re-plan interval %d ≥ 1", o.RedundantPerRank, o.ReplanEvery)
		}
		return &eplb{t: t, m: m, o: o, history: make([]float64, t.Experts)}, nil
	case "fastermoe":
		return fastermoe{t, m}, nil
	case "feplb", "feplb+place":
		if o.DynamicPerRank < 0 || o.MinChunk < 1 || o.ReplanEvery < 1 {
			return nil, fmt.Errorf("feplb: dynamic experts per rank %d must be ≥ 0, min chunk %d ≥ 1, re-plan interval %d ≥ 1", o.DynamicPerRank, o.MinChunk, o.ReplanEvery)
		}
		f := &feplb{t: t, m: m, o: o, place: name == "feplb+place", wayBack: true, owner: make([]int, t.Experts), history: make([]float64, t.Experts)}
		for e := range f.owner {
			f.owner[e] = t.Owner(e)
		}
		return f, nil
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

// eplb is DeepSeek EPLB's global policy: from the load history, replicate
// the heaviest experts into the redundant slots (each time the expert with
// the largest load per replica), then pack all replicas onto ranks, heaviest
// first onto the least loaded rank with a free slot. Tokens of a replicated
// expert are split evenly over its replicas. Weights move only when a new
// placement is made, every ReplanEvery steps.
type eplb struct {
	t       Topology
	m       Model
	o       Options
	history []float64 // tokens per expert since the last placement
	holders [][]int   // current placement; nil until the first plan
	seen    int
}

func (*eplb) Name() string { return "eplb" }

func (p *eplb) Plan(st Step) Plan {
	t := p.t
	var moves []Move
	note := "placement kept"
	if p.holders == nil || p.seen >= p.o.ReplanEvery {
		old := p.holders
		if old == nil { // start from the default placement
			old = make([][]int, t.Experts)
			for e := range old {
				old[e] = []int{t.Owner(e)}
			}
		}
		load := p.history
		if p.holders == nil {
			load = make([]float64, t.Experts) // no history yet: replicate nothing useful
			for e := range load {
				load[e] = 1
			}
		}
		p.holders = eplbPlace(t, load, p.o.RedundantPerRank)
		for e, hs := range p.holders {
			for _, r := range hs {
				if slices.Contains(old[e], r) {
					continue
				}
				link, _ := p.m.linkBW(t, old[e][0], r)
				moves = append(moves, Move{Expert: e, From: old[e][0], To: r, Bytes: p.m.WeightBytes(), Link: link, Weights: true})
			}
		}
		clear(p.history)
		p.seen = 0
		note = fmt.Sprintf("new placement from %d steps of history (%d weight moves)", p.o.ReplanEvery, len(moves))
	}
	p.seen++
	for e, n := range st.Counts {
		p.history[e] += float64(n)
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

// fastermoe is FasterMoE's dynamic shadowing: experts, hottest first, are
// broadcast to every rank and computed where their tokens come from, as long
// as its latency model 3·comp·Bmax + 4·send·Bmax + shadows·bcast still falls
// (comp: GEMM time per token; send: one token row over the link; bcast: one
// expert's weights over the link).
type fastermoe struct {
	t Topology
	m Model
}

func (fastermoe) Name() string { return "fastermoe" }

func (p fastermoe) Plan(st Step) Plan {
	t, m := p.t, p.m
	_, bw := m.linkBW(t, 0, t.Ranks-1) // the slowest link any broadcast crosses
	comp := 6 * float64(m.Hidden) * float64(m.FFN) / m.GEMMRate
	send := float64(m.TokenBytes()) / bw
	bcast := float64(m.WeightBytes()) / bw
	order := make([]int, t.Experts)
	for e := range order {
		order[e] = e
	}
	sort.SliceStable(order, func(i, j int) bool { return st.Counts[order[i]] > st.Counts[order[j]] })
	load := make([]int, t.Ranks)
	for e, n := range st.Counts {
		load[t.Owner(e)] += n
	}
	latency := func(shadows int) float64 {
		return (3*comp+4*send)*float64(slices.Max(load)) + float64(shadows)*bcast
	}
	best := latency(0)
	var shadowed []int
	split := map[int][]int{}
	for _, e := range order {
		if st.Counts[e] == 0 {
			break
		}
		from := st.FromRank(e)
		load[t.Owner(e)] -= st.Counts[e]
		for r, n := range from {
			load[r] += n
		}
		if l := latency(len(shadowed) + 1); l < best {
			best = l
			shadowed = append(shadowed, e)
			split[e] = from
			continue
		}
		for r, n := range from { // undo: shadowing e does not pay
			load[r] -= n
		}
		load[t.Owner(e)] += st.Counts[e]
		break
	}
	pl := OwnerPlan(t, st)
	pl.Policy = "fastermoe"
	pl.Note = fmt.Sprintf("shadowed %d experts %v", len(shadowed), shadowed)
	for _, e := range shadowed {
		o := t.Owner(e)
		pl.Shares[e], pl.Holders[e] = nil, nil
		for r, n := range split[e] {
			pl.Holders[e] = append(pl.Holders[e], r)
			if n > 0 {
				pl.Shares[e] = append(pl.Shares[e], Share{r, n})
			}
			if r != o {
				link, _ := m.linkBW(t, o, r)
				pl.Moves = append(pl.Moves, Move{Expert: e, From: o, To: r, Bytes: m.WeightBytes(), Link: link, Weights: true})
			}
		}
	}
	return pl
}

// feplb is moebench's reading of FEPLB (arXiv 2604.19654). After phase 1 (the
// base dispatcher), each rank's DynamicPerRank most loaded experts are
// dynamic; the rest are static and start computing at once. The CPU
// scheduler, per NVLink domain, hands the dynamic experts' tokens out by
// water-filling: largest expert first, each chunk to the least loaded rank of
// the domain, aiming at the domain's mean load. A chunk for a rank other than
// the owner moves the tokens there and the expert's weights once, over copy
// engines; the copies must land before the helper finishes its own static
// experts, so they are hidden. Copies are modelled one after another on each
// rank's way out and on each rank's way in, at the copy-engine rate, so a
// chunk is cut to what lands in time; a chunk of fewer than MinChunk tokens
// is not worth its weights, and the helper is passed over for the next least
// loaded one. What no helper takes stays with the owner. At most L−1 experts
// of a rank are dynamic, so every rank has static work.
//
// The outputs go back too, and nothing hides them but the helper's own
// dynamic work and the time until the domain is done: a helper computes its
// chunks for others right after its static experts and sends their outputs
// back one after another (phaseEnds), so a chunk is also cut to what is back
// by the end of the domain's expert phase. That end is not known before the
// plan: the scheduler plans once aiming at the domain's mean expert time,
// once at the end the first plan reaches in the model, and each domain keeps
// the plan that ends first. Without this rule, at mild skew the outputs'
// way back costs most of what the balance gains.
//
// Phase 2 cannot move load between domains. As feplb+place, the static
// placement itself is re-made every ReplanEvery steps from the load history:
// experts, heaviest first, go to the least loaded domain with a free slot and
// inside it to the least loaded rank (no replicas; weights move once per
// re-placement, counted in that step).
type feplb struct {
	t       Topology
	m       Model
	o       Options
	place   bool      // feplb+place: re-place experts across domains
	wayBack bool      // plan for the outputs' way back (false: only tests, to show what it buys)
	owner   []int     // current static placement
	history []float64 // tokens per expert since the last placement
	seen    int
}

func (p *feplb) Name() string {
	if p.place {
		return "feplb+place"
	}
	return "feplb"
}

func (p *feplb) Plan(st Step) Plan {
	o := p.o
	var placeMoves []Move
	if p.place {
		if p.seen >= o.ReplanEvery {
			placeMoves = p.replace()
		}
		p.seen++
		for e, n := range st.Counts {
			p.history[e] += float64(n)
		}
	}
	pl := p.fill(st, nil)
	if p.wayBack {
		ends := p.domainEnds(&pl)
		pl = p.earlier(pl, ends, p.fill(st, ends))
	}
	moved := 0
	for _, mv := range pl.Moves {
		if !mv.Weights {
			moved++
		}
	}
	dynamic := 0
	for _, dyn := range pl.Dynamic {
		if dyn {
			dynamic++
		}
	}
	pl.Note = fmt.Sprintf("%d dynamic experts, %d (expert, helper) moves over copy engines", dynamic, moved)
	if len(placeMoves) > 0 {
		pl.Moves = append(placeMoves, pl.Moves...)
		pl.Note += fmt.Sprintf("; re-placed experts across domains (%d weight moves)", len(placeMoves))
	}
	return pl
}

// earlier merges two plans of one step, a with its domains' ends ea: each
// domain keeps the plan whose expert phase ends first in the model (a on
// ties).
func (p *feplb) earlier(a Plan, ea []float64, b Plan) Plan {
	eb := p.domainEnds(&b)
	pl := b
	pl.Moves = nil
	for d := range ea {
		from := &b
		if ea[d] <= eb[d] {
			from = &a
			for e, r := range p.owner {
				if p.t.DomainOf(r) == d {
					pl.Shares[e], pl.Holders[e], pl.Dynamic[e] = a.Shares[e], a.Holders[e], a.Dynamic[e]
				}
			}
		}
		for _, mv := range from.Moves {
			if p.t.DomainOf(mv.From) == d {
				pl.Moves = append(pl.Moves, mv)
			}
		}
	}
	return pl
}

// domainEnds is, per domain, when its expert phase ends under pl in the
// model: its slowest rank's GEMMs, or the last output back, if later.
func (p *feplb) domainEnds(pl *Plan) []float64 {
	gemm, back := phaseEnds(pl, p.m, p.t.Ranks)
	ends := make([]float64, p.t.Ranks/p.t.Domain)
	for r := range gemm {
		d := p.t.DomainOf(r)
		ends[d] = max(ends[d], gemm[r], back[r])
	}
	return ends
}

// fill is one water-filling plan of the dynamic experts' tokens (see feplb)
// under the current placement; a helper's outputs must be back by ends[d]
// for its domain d (nil: the domain's mean modelled expert time).
func (p *feplb) fill(st Step, ends []float64) Plan {
	t, m, o := p.t, p.m, p.o
	pl := Plan{Policy: p.Name(), Shares: make([][]Share, t.Experts), Holders: make([][]int, t.Experts)}
	byRank := make([][]int, t.Ranks)
	shareBuf, holderBuf := make([]Share, t.Experts), make([]int, t.Experts) // one allocation each
	for e, r := range p.owner {
		byRank[r] = append(byRank[r], e)
		shareBuf[e], holderBuf[e] = Share{r, st.Counts[e]}, r
		pl.Shares[e], pl.Holders[e] = shareBuf[e:e+1:e+1], holderBuf[e:e+1:e+1]
	}
	load := make([]int, t.Ranks)
	static := make([]float64, t.Ranks) // modelled static compute time: when a helper is free
	// copy-engine transfers are modelled one after another on each rank's
	// way out and each rank's way in: when each is next free (seconds)
	ceOut, ceIn := make([]float64, t.Ranks), make([]float64, t.Ranks)
	// a helper computes its chunks for others right after its static
	// experts, then sends their outputs back one after another: the
	// modelled time of its chunks, and of their outputs' way back
	foreign, backOut := make([]float64, t.Ranks), make([]float64, t.Ranks)
	wCost, tCost := float64(m.WeightBytes())/m.CE, float64(m.TokenBytes())/m.CE
	cTok := 6 * float64(m.Hidden) * float64(m.FFN) / m.GEMMRate // a token's compute
	type dyn struct{ e, owner, n int }
	nDyn := dynamicPerRank(t, o.DynamicPerRank)
	pl.Dynamic = make([]bool, t.Experts)
	for d := 0; d < t.Ranks/t.Domain; d++ {
		var dyns []dyn
		for r := d * t.Domain; r < (d+1)*t.Domain; r++ {
			pickDynamic(byRank[r], st.Counts, nDyn, pl.Dynamic)
			for _, e := range byRank[r] {
				if pl.Dynamic[e] {
					dyns = append(dyns, dyn{e, r, st.Counts[e]})
				} else {
					load[r] += st.Counts[e]
					static[r] += m.ExpertTime(st.Counts[e])
				}
			}
		}
		total, end := 0, 0.0
		for r := d * t.Domain; r < (d+1)*t.Domain; r++ {
			total += load[r]
			end += static[r]
		}
		for _, x := range dyns {
			total += x.n
			end += m.ExpertTime(x.n)
		}
		target := (total + t.Domain - 1) / t.Domain
		end /= float64(t.Domain)
		if ends != nil {
			end = max(end, ends[d])
		}
		sort.SliceStable(dyns, func(i, j int) bool { return dyns[i].n > dyns[j].n })
		lo := d * t.Domain
		shares := make([]int, t.Domain) // of the expert, per rank of the domain
		late := make([]bool, t.Domain)  // helpers no copy of the expert can reach in time
		for _, x := range dyns {
			left := x.n
			clear(shares)
			clear(late)
			for left > 0 {
				r := x.owner // the least loaded rank of the domain not ruled out; the owner on ties
				for k := lo; k < lo+t.Domain; k++ {
					if !late[k-lo] && load[k] < load[r] {
						r = k
					}
				}
				give := left
				if room := target - load[r]; room > 0 && room < give {
					give = room
				}
				if r != x.owner {
					// the weights (once) and as many tokens as land in time
					start, w := max(ceOut[x.owner], ceIn[r]), 0.0
					if shares[r-lo] == 0 {
						w = wCost
					}
					// ... and whose outputs are back by the end
					fit := (static[r] - start - w) / tCost
					if p.wayBack {
						fit = min(fit, (end-static[r]-foreign[r]-backOut[r])/(cTok+tCost))
					}
					if int(fit) < give {
						give = max(int(fit), 0)
					}
					if give < o.MinChunk { // not worth it, or nothing lands or comes back in time
						late[r-lo] = true
						continue
					}
					ceOut[x.owner] = start + w + float64(give)*tCost
					ceIn[r] = ceOut[x.owner]
					foreign[r] += m.ExpertTime(give)
					backOut[r] += float64(give) * tCost
				}
				shares[r-lo] += give
				load[r] += give
				left -= give
			}
			pl.Shares[x.e][0].Tokens = shares[x.owner-lo]
			for i, n := range shares {
				if r := lo + i; r != x.owner && n > 0 {
					pl.Shares[x.e] = append(pl.Shares[x.e], Share{r, n})
					pl.Holders[x.e] = append(pl.Holders[x.e], r)
					pl.Moves = append(pl.Moves,
						Move{Expert: x.e, From: x.owner, To: r, Bytes: m.WeightBytes(), Link: LinkCE, Weights: true},
						Move{Expert: x.e, From: x.owner, To: r, Tokens: n, Bytes: int64(n) * m.TokenBytes(), Link: LinkCE})
				}
			}
		}
	}
	return pl
}

// replace makes a new static placement from the history and returns the
// weight moves it needs.
func (p *feplb) replace() []Move {
	t := p.t
	order := make([]int, t.Experts)
	for e := range order {
		order[e] = e
	}
	sort.SliceStable(order, func(i, j int) bool { return p.history[order[i]] > p.history[order[j]] })
	nd := t.Ranks / t.Domain
	dLoad, dUsed := make([]float64, nd), make([]int, nd)
	rLoad, rUsed := make([]float64, t.Ranks), make([]int, t.Ranks)
	var moves []Move
	for _, e := range order {
		d := -1
		for k := range nd {
			if dUsed[k] < t.Domain*t.Local() && (d < 0 || dLoad[k] < dLoad[d]) {
				d = k
			}
		}
		r := -1
		for k := d * t.Domain; k < (d+1)*t.Domain; k++ {
			if rUsed[k] < t.Local() && (r < 0 || rLoad[k] < rLoad[r]) {
				r = k
			}
		}
		dLoad[d] += p.history[e]
		dUsed[d]++
		rLoad[r] += p.history[e]
		rUsed[r]++
		if r != p.owner[e] {
			link, _ := p.m.linkBW(t, p.owner[e], r)
			moves = append(moves, Move{Expert: e, From: p.owner[e], To: r, Bytes: p.m.WeightBytes(), Link: link, Weights: true})
			p.owner[e] = r
		}
	}
	clear(p.history)
	p.seen = 0
	return moves
}

// dynamicPerRank is how many experts of a rank FEPLB may treat as dynamic:
// at most L−1, so that every rank keeps static work to hide the copies behind.
func dynamicPerRank(t Topology, want int) int { return max(0, min(want, t.Local()-1)) }

// pickDynamic marks in dyn FEPLB's dynamic experts among one rank's experts
// (in expert order): its n most loaded ones with tokens, ties by expert order.
// It sorts experts by load.
func pickDynamic(experts, counts []int, n int, dyn []bool) {
	sort.SliceStable(experts, func(i, j int) bool { return counts[experts[i]] > counts[experts[j]] })
	for i, e := range experts {
		dyn[e] = i < n && counts[e] > 0
	}
}

// DynamicExperts are the experts the feplb policy treats as dynamic in a
// step with these counts, under the default placement: each rank's
// perRank most loaded experts (at most L−1 of them). The feplb dispatcher
// starts the others — the static experts — before the plan exists.
func DynamicExperts(t Topology, counts []int, perRank int) []bool {
	n := dynamicPerRank(t, perRank)
	out := make([]bool, t.Experts)
	L := t.Local()
	experts := make([]int, L)
	for r := range t.Ranks {
		for i := range experts {
			experts[i] = r*L + i
		}
		pickDynamic(experts, counts, n, out)
	}
	return out
}
