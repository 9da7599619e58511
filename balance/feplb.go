package balance

import (
	"fmt"
	"slices"
	"sort"
)

// feplb is FEPLB (arXiv 2604.19654): after phase 1 (the base dispatcher),
// each rank's DynamicPerRank most loaded experts are dynamic and the rest
// static; the static experts start computing at once while a CPU scheduler
// plans phase 2, which moves dynamic experts' work to other ranks of the
// same NVLink domain over copy engines (weights and rows out, outputs
// back). Phase 2 cannot move load between domains. Three policies share
// this type:
//
// feplb, the paper's policy as third-party reviews describe its text (the
// paper has no public code; docs/references.md, FEPLB): whole
// dynamic experts move — weights and all their tokens, never split. A
// greedy scheduler repeatedly takes the domain's most loaded rank, picks
// its busiest dynamic expert not yet moved (stopping below τ tokens) —
// and, when that one cannot move usefully, its next (inferred; the strict
// reading, Options.BusiestOnly, stops there instead) — and
// moves it to the domain's least loaded rank with a free buffer slot (a
// helper holds at most MaxDyn moved experts' weights, the paper's
// max_num_dyn), until no useful move remains. What moebench infers, as the
// reviews leave it open: a rank's "load" is its modelled finish time
// (Model.Play: static GEMMs, then the chunks it helps with once their
// copies have landed, then its own dynamic experts, and the wait for its
// outputs to come back), not a token count; a move is "useful" when it
// lowers the busiest rank's finish and leaves no other rank above that
// finish, so the paper's condition T_sched + T_CE ≤ T_static is not a rule
// but a cost: a copy that lands late stalls its helper in the model; the
// dynamic experts are each rank's most loaded ones in this step; the copies
// start when the plan is known (Step.Ready).
//
// feplb-split, moebench's own reading before the paper's text was known:
// the dynamic experts' tokens are cut into chunks and water-filled, largest
// expert first, each chunk to the least loaded rank of the domain, aiming
// at the domain's mean load, each chunk cut to what lands before the
// helper runs out of static work and to what comes back by the end of the
// domain's expert phase; a chunk under τ tokens is not worth its weights.
// It plans twice (aiming at the domain's mean expert time, then at the end
// the first plan reaches) and keeps, per domain, the plan that ends first.
//
// feplb+place is feplb plus a load-aware placement of the static experts
// across domains, re-made every ReplanEvery steps from the load history
// (experts, heaviest first, to the least loaded domain with a free slot and
// inside it to the least loaded rank; no replicas; the weight moves land
// before the step that uses the new placement).
//
// In every variant, leaving everything home is a candidate: each domain
// keeps its plan only if the domain finishes earlier with it in the model
// than without it. At most L−1 experts of a rank are dynamic, so that every
// rank has static work to hide the copies behind.
type feplb struct {
	name         string
	t            Topology
	m            Model
	o            Options
	split, place bool
	owner        []int   // current static placement
	history      history // feplb+place: the load since the last placement decision

	// one domain's state while planning (local rank indices)
	q                         phase2
	static, foreign, kept     []float64 // modelled seconds of each kind of work
	gemmEnd, back, fin, saved []float64
	used                      []int // moved experts' weights each helper holds
	keep                      []int // rows each dynamic expert's owner keeps
	dyns                      []dyn
	pairs                     []pair
	best                      []chunk
}

// dyn is a dynamic expert of a domain; owner is a local rank index.
type dyn struct{ e, owner, n int }

// chunk is rows of a dynamic expert (p.dyns[k], expert e) that a helper
// computes (local ranks).
type chunk struct{ k, e, owner, helper, rows int }

func newFEPLB(name string, t Topology, m Model, o Options) *feplb {
	f := &feplb{name: name, t: t, m: m, o: o, split: name == "feplb-split", place: name == "feplb+place",
		owner: make([]int, t.Experts), history: newHistory(t.Experts, o.ReplanEvery)}
	for e := range f.owner {
		f.owner[e] = t.Owner(e)
	}
	D := t.Domain
	f.q.init(m, D)
	for _, s := range []*[]float64{&f.static, &f.foreign, &f.kept, &f.gemmEnd, &f.back, &f.fin, &f.saved} {
		*s = make([]float64, D)
	}
	f.used = make([]int, D)
	return f
}

func (p *feplb) Name() string { return p.name }

func (p *feplb) Plan(st Step) Plan {
	t, m := p.t, p.m
	var placeMoves []Move
	if p.place {
		placeMoves = p.replace()
		p.history.add(st.Counts)
	}
	pl := Plan{Policy: p.name, Shares: make([][]Share, t.Experts), Holders: make([][]int, t.Experts), Dynamic: make([]bool, t.Experts)}
	byRank := make([][]int, t.Ranks)
	shareBuf, holderBuf := make([]Share, t.Experts), make([]int, t.Experts) // one allocation each
	for e, r := range p.owner {
		byRank[r] = append(byRank[r], e)
		shareBuf[e], holderBuf[e] = Share{r, st.Counts[e]}, r
		pl.Shares[e], pl.Holders[e] = shareBuf[e:e+1:e+1], holderBuf[e:e+1:e+1]
	}
	nDyn := dynamicPerRank(t, p.o.DynamicPerRank)
	D, dynamic, moved := t.Domain, 0, 0
	for d := 0; d < t.Ranks/D; d++ {
		lo := d * D
		p.dyns = p.dyns[:0]
		for i := range D {
			p.static[i], p.kept[i] = 0, 0
			pickDynamic(byRank[lo+i], st.Counts, nDyn, pl.Dynamic)
			for _, e := range byRank[lo+i] {
				n := st.Counts[e]
				if pl.Dynamic[e] {
					p.dyns = append(p.dyns, dyn{e: e, owner: i, n: n})
					p.kept[i] += m.ExpertTime(n)
				} else {
					p.static[i] += m.ExpertTime(n)
				}
			}
		}
		dynamic += len(p.dyns)
		sort.SliceStable(p.dyns, func(i, j int) bool { return p.dyns[i].n > p.dyns[j].n })
		p.greedy(st.Ready)
		for _, c := range p.best {
			o, h := lo+c.owner, lo+c.helper
			pl.Shares[c.e][0].Tokens -= c.rows
			pl.Shares[c.e] = append(pl.Shares[c.e], Share{h, c.rows})
			pl.Holders[c.e] = append(pl.Holders[c.e], h)
			pl.Moves = append(pl.Moves,
				Move{Expert: c.e, From: o, To: h, Bytes: m.WeightBytes(), Link: LinkCE, Weights: true, Kind: KindRebalance},
				Move{Expert: c.e, From: o, To: h, Tokens: c.rows, Bytes: int64(c.rows) * m.TokenBytes(), Link: LinkCE, Kind: KindRebalance})
			moved++
		}
	}
	what := "moved whole"
	if p.split {
		what = "(expert, helper) chunks"
	}
	pl.Note = fmt.Sprintf("%d dynamic experts, %d %s over copy engines", dynamic, moved, what)
	if len(placeMoves) > 0 {
		pl.Moves = append(placeMoves, pl.Moves...)
		pl.Note += fmt.Sprintf("; re-placed experts across domains (%d weight moves)", len(placeMoves))
	}
	return pl
}

// play plays the domain's current pairs out (Model.Play's phase 2) and
// sets each rank's finish.
func (p *feplb) play(ready float64) {
	p.q.play(p.pairs, p.static, p.foreign, p.kept, ready, false, p.gemmEnd, p.back)
	for i := range p.fin {
		p.fin[i] = max(p.gemmEnd[i], p.back[i])
	}
}

// greedy is the scheduler on one domain (see feplb): it leaves the moves
// in p.best. Each round takes the domain's most loaded rank s and its
// least loaded rank h with a free buffer slot, and tries s's dynamic
// experts, busiest first (with Options.BusiestOnly only the busiest one
// left: the scheduler stops when it cannot move): the paper's policy moves the whole expert;
// feplb-split moves a chunk sized to even out s and h, halved while the
// move is not useful, down to τ rows, one chunk per (expert, helper).
func (p *feplb) greedy(ready float64) {
	clear(p.foreign)
	clear(p.used)
	p.keep = p.keep[:0]
	for _, x := range p.dyns {
		p.keep = append(p.keep, x.n)
	}
	p.pairs, p.best = p.pairs[:0], p.best[:0]
	p.play(ready)
	for p.round(ready) {
	}
}

// round is one round of greedy; it reports whether it moved something.
func (p *feplb) round(ready float64) bool {
	s, h := 0, -1
	for i, f := range p.fin {
		if f > p.fin[s] {
			s = i
		}
	}
	for i, f := range p.fin {
		if i != s && p.used[i] < p.o.MaxDyn && (h < 0 || f < p.fin[h]) {
			h = i
		}
	}
	if h < 0 {
		return false
	}
	for k, x := range p.dyns {
		if x.owner != s || p.keep[k] < p.o.Tau || (p.split && p.helps(k, h)) {
			continue
		}
		rows := p.keep[k]
		if p.split {
			rows = min(rows, int((p.fin[s]-p.fin[h])/(2*p.m.TokenCompute())))
		}
		for ; rows >= p.o.Tau; rows /= 2 {
			if p.try(k, s, h, rows, ready) {
				return true
			}
			if !p.split {
				break
			}
		}
		if p.o.BusiestOnly { // the strict reading: only s's busiest dynamic expert
			return false
		}
	}
	return false
}

// helps says whether helper h already computes a chunk of p.dyns[k].
func (p *feplb) helps(k, h int) bool {
	for _, c := range p.best {
		if c.k == k && c.helper == h {
			return true
		}
	}
	return false
}

// try moves rows of p.dyns[k] from its owner s to helper h and keeps the
// move if it is useful: s finishes earlier and no other rank later than s
// did. It reports whether it kept it.
func (p *feplb) try(k, s, h, rows int, ready float64) bool {
	m, n := p.m, p.keep[k]
	copy(p.saved, p.fin)
	kept, foreign := p.kept[s], p.foreign[h]
	p.kept[s] -= m.ExpertTime(n) - m.ExpertTime(n-rows)
	p.foreign[h] += m.ExpertTime(rows)
	p.pairs = append(p.pairs, pair{s, h, rows})
	p.play(ready)
	others := 0.0
	for i, f := range p.fin {
		if i != s {
			others = max(others, f)
		}
	}
	if p.fin[s] < p.saved[s] && others <= p.saved[s] {
		p.keep[k] -= rows
		p.used[h]++
		p.best = append(p.best, chunk{k, p.dyns[k].e, s, h, rows})
		return true
	}
	p.kept[s], p.foreign[h] = kept, foreign
	p.pairs = p.pairs[:len(p.pairs)-1]
	copy(p.fin, p.saved)
	return false
}

// replace decides, every ReplanEvery steps, whether to adopt a new
// static placement made from the history (the eplb policy's rule: one made
// from the older half must save more on the newer half over the next
// ReplanEvery steps than its weight moves take), and returns the weight
// moves of the one adopted.
func (p *feplb) replace() []Move {
	h := &p.history
	if !h.due() {
		return nil
	}
	defer h.reset()
	t, m := p.t, p.m
	gain := h.gain(t, holders(p.owner), holders(p.placement(h.basis()))) * m.TokenCompute() * float64(p.o.ReplanEvery)
	cand := p.placement(h.total())
	var moves []Move
	in, out := make([]float64, t.Ranks), make([]float64, t.Ranks)
	for e, r := range cand {
		if o := p.owner[e]; r != o {
			link, bw := m.linkBW(t, o, r)
			moves = append(moves, Move{Expert: e, From: o, To: r, Bytes: m.WeightBytes(), Link: link, Weights: true, Kind: KindPlacement})
			in[r] += float64(m.WeightBytes()) / bw
			out[o] += float64(m.WeightBytes()) / bw
		}
	}
	if cost := max(slices.Max(in), slices.Max(out)); gain <= cost {
		return nil
	}
	p.owner = cand
	return moves
}

// placement is a static placement from a load: experts, heaviest first, to
// the least loaded domain with a free slot and inside it to its least
// loaded rank.
func (p *feplb) placement(load []float64) []int {
	t := p.t
	order := make([]int, t.Experts)
	for e := range order {
		order[e] = e
	}
	sort.SliceStable(order, func(i, j int) bool { return load[order[i]] > load[order[j]] })
	nd := t.Ranks / t.Domain
	dLoad, dUsed := make([]float64, nd), make([]int, nd)
	rLoad, rUsed := make([]float64, t.Ranks), make([]int, t.Ranks)
	owner := make([]int, t.Experts)
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
		dLoad[d] += load[e]
		dUsed[d]++
		rLoad[r] += load[e]
		rUsed[r]++
		owner[e] = r
	}
	return owner
}

// holders is a placement without replicas as holders.
func holders(owner []int) [][]int {
	h := make([][]int, len(owner))
	for e, r := range owner {
		h[e] = []int{r}
	}
	return h
}

// DefaultDynamic is FEPLB's dynamic experts per rank where none are asked
// for, fitted to a rank's local experts: the paper's 4 where a rank has
// more than 4, else all of its experts but one (so no "asked, used" cap).
func DefaultDynamic(local int) int { return min(DefaultOptions.DynamicPerRank, max(1, local-1)) }

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

// DynamicExperts are the experts the FEPLB policies treat as dynamic in a
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

// NoOp says why FEPLB can move nothing at all under t and o — every step
// then equals `none` — or "" when it can move work.
func NoOp(t Topology, o Options) string {
	switch {
	case t.Local() < 2:
		return fmt.Sprintf("one expert per rank (%d experts, %d ranks): FEPLB keeps at least one static expert per rank, so none can be dynamic", t.Experts, t.Ranks)
	case t.Domain < 2:
		return "NVLink domains of one rank: phase 2 has no other rank to move work to"
	case o.DynamicPerRank < 1:
		return "0 dynamic experts per rank"
	}
	return ""
}

// Capped says, when it is so, that fewer dynamic experts per rank are used
// than o asks for ("" otherwise).
func Capped(t Topology, o Options) string {
	if n := dynamicPerRank(t, o.DynamicPerRank); n < o.DynamicPerRank && n > 0 {
		return fmt.Sprintf("%d dynamic experts per rank asked, %d used: FEPLB keeps at least one static expert on each rank (%d local experts), so the copies have static work to hide behind",
			o.DynamicPerRank, n, t.Local())
	}
	return ""
}

// Moved is how many (expert, helper) pairs a plan moves over copy engines.
func (p *Plan) Moved() int {
	n := 0
	for _, mv := range p.Moves {
		if mv.Kind == KindRebalance && !mv.Weights {
			n++
		}
	}
	return n
}
