// Package feplb is FEPLB (arXiv 2604.19654) as a dispatcher: two-phase
// dispatch. Phase 1 runs a base EP dispatcher (--feplb-base, alltoall by
// default); phase 2 — the rebalance phase — follows a plan from package
// balance: chunks of the dynamic experts' tokens move from their owner to
// less loaded ranks of the same NVLink domain together with the expert's
// weights, the helpers compute them, and combine brings the outputs back to
// the owner before the base dispatcher's combine.
//
// This build runs it on the host device, where ranks are emulated in one
// process and the copies are memory copies (no copy engines, no overlap with
// the static experts): it proves the plan executes and the output is
// unchanged. The plan's cost model has fixed rates (see hostModel).
// The cuda device's copy-engine path is not built yet.
package feplb

import (
	"fmt"
	"time"

	"github.com/moebench/moebench/balance"
	"github.com/moebench/moebench/dispatchers"
)

func init() { dispatchers.Register("feplb", New) }

// New returns FEPLB over its base dispatcher, or why it is unavailable.
func New(impl string, env dispatchers.Env) (dispatchers.Dispatcher, error) {
	un := func(reason string) error {
		return &dispatchers.UnavailableError{Name: "feplb", Impl: impl, Reason: reason}
	}
	switch {
	case impl != dispatchers.ImplNative:
		return nil, un("no library implementation (FEPLB has no public code)")
	case env.Device != "host":
		return nil, un("the copy-engine phase 2 on the cuda device is not implemented in this build yet")
	}
	base := env.Base
	if base == "" {
		base = "alltoall"
	}
	if base == "feplb" {
		return nil, fmt.Errorf("--feplb-base=feplb: the base dispatcher must be another dispatcher")
	}
	b, err := dispatchers.New(base, impl, env)
	if err != nil {
		if dispatchers.IsUnavailable(err) {
			return nil, un("base dispatcher " + err.Error())
		}
		return nil, err
	}
	dyn := env.Dynamic
	if dyn == 0 {
		dyn = balance.DefaultOptions.DynamicPerRank
	}
	return &FEPLB{Dispatcher: b, env: env, dynamic: dyn}, nil
}

// FEPLB wraps the base dispatcher; Permute, Dispatch and Unpermute are the
// base's.
type FEPLB struct {
	dispatchers.Dispatcher
	env     dispatchers.Env
	dynamic int
	shape   dispatchers.Shape
	ranks   []*dispatchers.Rank
	topo    balance.Topology
	model   balance.Model
	policy  balance.Policy

	planned bool
	in      [][]chunk // per helper: chunks it receives
	out     [][]chunk // per owner: chunks it gave away
	weights [][]dispatchers.ExpertWeights
	stats   dispatchers.RebalanceStats
}

// chunk is rows [src, src+n) of the owner's ExpertX computed by the helper at
// rows [dst, dst+n) of its ExpertX.
type chunk struct {
	expert, owner, helper int
	src, dst, n           int
}

func (f *FEPLB) Name() string { return "feplb" }

// Bind binds the base dispatcher and sets up the scheduler.
func (f *FEPLB) Bind(shape dispatchers.Shape, ranks []*dispatchers.Rank) error {
	f.shape, f.ranks = shape, ranks
	d := f.env.Domain
	if d == 0 {
		d = shape.EP
	}
	f.topo = balance.Topology{Ranks: shape.EP, Experts: shape.Experts, Domain: d}
	if err := f.topo.Validate(); err != nil {
		return fmt.Errorf("feplb: %v", err)
	}
	f.model = hostModel(f.env.Hidden, f.env.FFN)
	o := balance.DefaultOptions
	o.DynamicPerRank = f.dynamic
	p, err := balance.New("feplb", f.topo, f.model, o)
	if err != nil {
		return err
	}
	f.policy = p
	f.weights = make([][]dispatchers.ExpertWeights, shape.EP)
	return f.Dispatcher.Bind(shape, ranks)
}

// hostModel is the plan's cost model on the host device: fixed, stated
// rates of about one CPU core (10 GFLOP/s GEMMs, 10 GB/s copies), so that a
// configuration always gets the same plan.
func hostModel(hidden, ffn int) balance.Model {
	const rate, bw = 10e9, 10e9
	return balance.Model{Hidden: hidden, FFN: ffn, GEMMRate: rate, HBM: bw, CE: bw, NVLink: bw, Network: bw,
		RateSource: "host model: 10 GFLOP/s GEMMs, 10 GB/s copies"}
}

// Permute starts a step: the plan of the last one is dropped.
func (f *FEPLB) Permute(r int) error {
	f.planned = false
	return f.Dispatcher.Permute(r)
}

// plan runs the CPU scheduler on the counts phase 1 delivered and turns its
// plan into chunks; the owners' segments shrink to their own share.
func (f *FEPLB) plan() error {
	t0 := time.Now()
	counts := make([]int, f.shape.Experts)
	segOf := make([]*dispatchers.Segment, f.shape.Experts)
	for _, rk := range f.ranks {
		for i := range rk.Segments {
			sg := &rk.Segments[i]
			counts[sg.Expert] += sg.Len
			segOf[sg.Expert] = sg
		}
	}
	st := balance.Step{Counts: counts}
	pl := f.policy.Plan(st)
	if err := pl.Check(f.topo, st); err != nil {
		return fmt.Errorf("feplb: scheduler produced a bad plan: %v", err)
	}
	f.stats = dispatchers.RebalanceStats{Policy: pl.Policy, Note: pl.Note, PlanSeconds: time.Since(t0).Seconds()}
	before := balance.OwnerPlan(f.topo, st)
	f.stats.TokensBefore, f.stats.TokensAfter = before.Loads(f.topo.Ranks), pl.Loads(f.topo.Ranks)
	f.stats.ModelledBefore, _ = balance.Straggler(f.model.GEMMTimes(&before, f.topo.Ranks))
	f.stats.ModelledAfter, _ = balance.Straggler(f.model.GEMMTimes(&pl, f.topo.Ranks))
	for _, b := range pl.BytesByLink() {
		f.stats.CopyBytes += b
	}
	f.in = make([][]chunk, f.shape.EP)
	f.out = make([][]chunk, f.shape.EP)
	next := make([]int, f.shape.EP) // next free row of each helper, after its own rows
	for r, rk := range f.ranks {
		next[r] = len(rk.ExpertProbs)
	}
	for e, shares := range pl.Shares {
		if len(shares) < 2 {
			continue
		}
		sg := segOf[e]
		at := sg.Start + shares[0].Tokens // shares[0] is the owner's
		for _, s := range shares[1:] {
			c := chunk{expert: e, owner: shares[0].Rank, helper: s.Rank, src: at, dst: next[s.Rank], n: s.Tokens}
			next[s.Rank] += s.Tokens
			at += s.Tokens
			f.in[s.Rank] = append(f.in[s.Rank], c)
			f.out[c.owner] = append(f.out[c.owner], c)
			f.stats.Moves++
		}
		sg.Len = shares[0].Tokens
	}
	f.planned = true
	return nil
}

// Rebalance is rank r's phase 2 as a helper: it receives its chunks' rows,
// probabilities and the experts' weights, and adds a segment for each.
func (f *FEPLB) Rebalance(r int) error {
	if !f.planned {
		if err := f.plan(); err != nil {
			return err
		}
	}
	t0 := time.Now()
	rk, h := f.ranks[r], f.shape.Hidden
	L := f.shape.LocalExperts()
	w := f.weights[r]
	for len(w) < len(f.in[r]) {
		w = append(w, dispatchers.ExpertWeights{})
	}
	f.weights[r] = w
	for i, c := range f.in[r] {
		own := f.ranks[c.owner]
		if c.dst*h != len(rk.ExpertX) {
			return fmt.Errorf("feplb: rank %d: chunk of expert %d expected at row %d, buffer has %d rows", r, c.expert, c.dst, len(rk.ExpertX)/h)
		}
		rk.ExpertX = append(rk.ExpertX, own.ExpertX[c.src*h:(c.src+c.n)*h]...)
		rk.ExpertProbs = append(rk.ExpertProbs, own.ExpertProbs[c.src:c.src+c.n]...)
		le := c.expert - c.owner*L
		if le < 0 || le >= len(own.Experts) {
			return fmt.Errorf("feplb: rank %d holds no weights of expert %d", c.owner, c.expert)
		}
		src := own.Experts[le]
		w[i].FC1 = append(w[i].FC1[:0], src.FC1...)
		w[i].FC2 = append(w[i].FC2[:0], src.FC2...)
		rk.Segments = append(rk.Segments, dispatchers.Segment{Expert: c.expert, Start: c.dst, Len: c.n, Weights: &w[i]})
	}
	f.stats.CopySeconds += time.Since(t0).Seconds()
	return nil
}

// Combine returns the helpers' outputs of rank r's moved chunks into its
// expert output, then runs the base combine.
func (f *FEPLB) Combine(r int) error {
	t0 := time.Now()
	rk, h := f.ranks[r], f.shape.Hidden
	for _, c := range f.out[r] {
		hp := f.ranks[c.helper]
		copy(rk.ExpertY[c.src*h:(c.src+c.n)*h], hp.ExpertY[c.dst*h:(c.dst+c.n)*h])
	}
	f.stats.CopySeconds += time.Since(t0).Seconds()
	return f.Dispatcher.Combine(r)
}

// RebalanceStats is the last step's rebalance.
func (f *FEPLB) RebalanceStats() dispatchers.RebalanceStats { return f.stats }

// Footprint adds the helper's weight copies to the base's buffers.
func (f *FEPLB) Footprint(r int) int64 {
	n := int64(0)
	for _, w := range f.weights[r] {
		n += 4 * int64(cap(w.FC1)+cap(w.FC2))
	}
	return n + f.Dispatcher.Footprint(r)
}
