package balance

import (
	"cmp"
	"slices"
)

// Timeline is one step's expert phase under a plan in the model, in seconds
// from the end of phase 1 (the base dispatcher's dispatch), per rank: its
// GEMM time (Busy, what the GEMM straggler compares), when its last GEMM
// ends, waits for copies included (GEMMEnd), when the last output of the
// tokens it handed to helpers is back (Back, 0 if none), and when it is done
// with the phase (Finish: the later of those two, plus placement traffic
// that had to land before the step).
type Timeline struct {
	Busy, GEMMEnd, Back, Finish []float64
	Placement                   float64 // seconds of placement traffic before the step
	// the busiest rank's copy-engine time for FEPLB's phase 2 (the longer
	// of its way out and its way in, outputs back included), and the
	// busiest owner's time taking outputs back
	CEBusiest, BackBusiest float64
}

// End is when the slowest rank is done.
func (tl Timeline) End() float64 { return slices.Max(tl.Finish) }

// BackExposed is how much later than the slowest rank's GEMMs the last
// output of a moved token is back: what the way back adds to the step, 0
// when every output is back in time.
func (tl Timeline) BackExposed() float64 {
	return max(0, slices.Max(tl.Back)-slices.Max(tl.GEMMEnd))
}

// Play plays plan p out in time on ranks ranks. ready is when a per-step
// plan is known (the counts arrived and the CPU scheduler is done): FEPLB's
// copies and FasterMoE's broadcasts start then. It follows what the
// dispatchers do:
//
//   - Placement moves (EPLB, feplb+place) land before the step: every rank
//     waits for the busiest rank's placement traffic.
//   - FEPLB (KindRebalance; phase2): a rank computes its static experts from
//     0, then the chunks it helps with once all its incoming copies have
//     landed, then the share of its own dynamic experts it keeps. Copies run
//     one after another on each rank's way out and way in at the
//     copy-engine rate, in the plan's order; an owner pulls its outputs back
//     in one batch once every helper it gave work to has computed its chunks.
//   - FasterMoE (KindShadow): shadowed experts are broadcast one after
//     another (each at the slowest link it crosses, from ready); a rank
//     computes its other experts first, then each shadowed expert's local
//     tokens once that expert's weights are there, as fastmoe's
//     smart_schedule.h orders them.
//
// backward models the backward pass: GEMMs take twice as long (data and
// weight gradients); a helper fetches the expert's weights again (FEPLB's
// buffer is reused across layers) with the output gradients of its rows,
// and sends back the input gradients and the expert's weight gradient
// (6·hidden·ffn bytes in bf16); FasterMoE computes the shadowed experts
// first and reduces each one's weight gradient to its owner (fastmoe's
// backward order) while the other experts compute. Placement is not
// repeated in the backward pass.
func (m Model) Play(p *Plan, ranks int, ready float64, backward bool) Timeline {
	scale := 1.0
	if backward {
		scale = 2
	}
	tl := Timeline{Busy: make([]float64, ranks), GEMMEnd: make([]float64, ranks), Back: make([]float64, ranks), Finish: make([]float64, ranks)}
	static, foreign, kept := make([]float64, ranks), make([]float64, ranks), make([]float64, ranks)
	placeIn, placeOut := make([]float64, ranks), make([]float64, ranks)
	var pairs []pair
	var shadows []shadow
	shadowOf := map[int]int{} // expert → index in shadows
	for _, mv := range p.Moves {
		switch mv.Kind {
		case KindPlacement:
			if !backward {
				s := float64(mv.Bytes) / m.rate(mv.Link)
				placeIn[mv.To] += s
				placeOut[mv.From] += s
			}
		case KindShadow:
			i, ok := shadowOf[mv.Expert]
			if !ok {
				i = len(shadows)
				shadowOf[mv.Expert] = i
				shadows = append(shadows, shadow{expert: mv.Expert})
			}
			shadows[i].secs = max(shadows[i].secs, float64(mv.Bytes)/m.rate(mv.Link))
		case KindRebalance:
			if !mv.Weights {
				pairs = append(pairs, pair{mv.From, mv.To, mv.Tokens})
			}
		}
	}
	for e, shares := range p.Shares {
		if _, ok := shadowOf[e]; ok {
			continue
		}
		dyn := p.Dynamic != nil && p.Dynamic[e]
		for i, s := range shares {
			x := scale * m.ExpertTime(s.Tokens)
			tl.Busy[s.Rank] += x
			switch {
			case !dyn:
				static[s.Rank] += x
			case i == 0:
				kept[s.Rank] += x
			default:
				foreign[s.Rank] += x
			}
		}
	}
	for _, x := range placeIn {
		tl.Placement = max(tl.Placement, x)
	}
	for _, x := range placeOut {
		tl.Placement = max(tl.Placement, x)
	}
	if len(shadows) > 0 {
		m.playShadows(p, shadows, static, ready, scale, backward, &tl)
	} else {
		var q phase2
		q.init(m, ranks)
		q.play(pairs, static, foreign, kept, ready, backward, tl.GEMMEnd, tl.Back)
		tl.CEBusiest, tl.BackBusiest = q.busiest()
	}
	for r := range tl.Finish {
		tl.Finish[r] = tl.Placement + max(tl.GEMMEnd[r], tl.Back[r])
	}
	return tl
}

// shadow is one expert FasterMoE broadcasts, and the broadcast's time.
type shadow struct {
	expert int
	secs   float64
}

// playShadows fills tl for a FasterMoE plan: static is each rank's work on
// the experts it computes as usual.
func (m Model) playShadows(p *Plan, shadows []shadow, static []float64, ready, scale float64, backward bool, tl *Timeline) {
	local := func(sh shadow, fn func(r int, x float64)) {
		for _, s := range p.Shares[sh.expert] {
			if x := scale * m.ExpertTime(s.Tokens); x > 0 {
				tl.Busy[s.Rank] += x
				fn(s.Rank, x)
			}
		}
	}
	if !backward {
		copy(tl.GEMMEnd, static)
		arrived := ready
		for _, sh := range shadows {
			arrived += sh.secs
			local(sh, func(r int, x float64) { tl.GEMMEnd[r] = max(tl.GEMMEnd[r], arrived) + x })
		}
		return
	}
	// backward: the shadowed experts first, each one's gradient reduced to
	// its owner once every rank has computed it, one reduction after another
	reduced := 0.0
	for _, sh := range shadows {
		done := 0.0
		local(sh, func(r int, x float64) {
			tl.GEMMEnd[r] += x
			done = max(done, tl.GEMMEnd[r])
		})
		reduced = max(reduced, done) + sh.secs
	}
	for r := range tl.GEMMEnd {
		tl.GEMMEnd[r] += static[r]
		tl.Back[r] = reduced
	}
}

// pair is one (expert, helper) of FEPLB's phase 2: rows of an expert that
// its owner hands to the helper, with the expert's weights.
type pair struct{ owner, helper, rows int }

// phase2 is the copy-engine model of FEPLB's phase 2 (see Play), with its
// scratch space, so that a planner can play a domain out many times
// without allocating. Ranks are indices into the slices given to play.
type phase2 struct {
	tok, w                 float64 // seconds per row and per expert's weights at the copy rate
	out, in, land, comp    []float64
	start, ceOut, ceIn, bk []float64
	owners                 []int
}

func (q *phase2) init(m Model, ranks int) {
	q.tok, q.w = float64(m.TokenBytes())/m.CERate(), float64(m.WeightBytes())/m.CERate()
	for _, s := range []*[]float64{&q.out, &q.in, &q.land, &q.comp, &q.start, &q.ceOut, &q.ceIn, &q.bk} {
		*s = make([]float64, ranks)
	}
}

// play fills gemmEnd and back for ranks with static, foreign (chunks for
// others) and kept (own dynamic share) work; copies start at ready.
func (q *phase2) play(pairs []pair, static, foreign, kept []float64, ready float64, backward bool, gemmEnd, back []float64) {
	for _, s := range [][]float64{q.out, q.in, q.land, q.ceOut, q.ceIn, q.bk, back} {
		clear(s)
	}
	for _, p := range pairs { // incoming: weights and rows
		d := q.w + float64(p.rows)*q.tok
		end := max(ready, q.out[p.owner], q.in[p.helper]) + d
		q.out[p.owner], q.in[p.helper] = end, end
		q.land[p.helper] = max(q.land[p.helper], end)
		q.ceOut[p.owner] += d
		q.ceIn[p.helper] += d
	}
	for r := range static {
		q.comp[r] = static[r]
		if foreign[r] > 0 {
			q.comp[r] = max(static[r], q.land[r]) + foreign[r]
		}
		gemmEnd[r] = q.comp[r] + kept[r]
	}
	q.owners = q.owners[:0]
	for r := range q.start {
		q.start[r] = -1
	}
	for _, p := range pairs { // an owner's batch starts when its helpers are done
		if q.start[p.owner] < 0 {
			q.owners = append(q.owners, p.owner)
		}
		q.start[p.owner] = max(q.start[p.owner], q.comp[p.helper])
	}
	slices.SortStableFunc(q.owners, func(a, b int) int { return cmp.Compare(q.start[a], q.start[b]) })
	for _, o := range q.owners {
		for _, p := range pairs {
			if p.owner != o {
				continue
			}
			d := float64(p.rows) * q.tok
			if backward {
				d += q.w // the weight gradient
			}
			end := max(q.start[o], q.out[p.helper], q.in[o]) + d
			q.out[p.helper], q.in[o], back[o] = end, end, end
			q.ceOut[p.helper] += d
			q.ceIn[o] += d
			q.bk[o] += d
		}
	}
}

// busiest is the last play's busiest rank's copy time (way out or way in)
// and the busiest owner's time taking outputs back.
func (q *phase2) busiest() (ce, back float64) {
	for r := range q.ceOut {
		ce = max(ce, q.ceOut[r], q.ceIn[r])
		back = max(back, q.bk[r])
	}
	return ce, back
}

// LinkLoad is the most bytes the plan's own traffic puts on one rank's
// NVLink in one direction (copy-engine and NVLink moves inside a domain,
// outputs back included; a FasterMoE broadcast passes each rank once in
// and once out, as a ring would): what EP dispatch/combine traffic sharing
// that link would have to wait for.
func (p *Plan) LinkLoad(t Topology, ranks int) float64 {
	in, out := make([]float64, ranks), make([]float64, ranks)
	shadowed := map[int]bool{}
	for _, mv := range p.Moves {
		if mv.Link == LinkNetwork {
			continue
		}
		b := float64(mv.Bytes)
		switch {
		case mv.Kind == KindShadow:
			if !shadowed[mv.Expert] {
				shadowed[mv.Expert] = true
				for _, r := range p.Holders[mv.Expert] {
					in[r] += b
					out[r] += b
				}
			}
		default:
			in[mv.To] += b
			out[mv.From] += b
			if !mv.Weights && mv.Kind == KindRebalance { // outputs back
				in[mv.From] += b
				out[mv.To] += b
			}
		}
	}
	return max(slices.Max(in), slices.Max(out))
}
