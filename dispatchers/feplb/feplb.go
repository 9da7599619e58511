// Package feplb is FEPLB (arXiv 2604.19654) as a dispatcher: two-phase
// dispatch. Phase 1 runs a base EP dispatcher (--feplb-base, alltoall by
// default). Its counts split the step's experts: each rank's few most loaded
// experts are dynamic, the rest static. The static experts start computing at
// once while the CPU scheduler (package balance's policy named by
// --feplb-policy, in a goroutine) plans phase 2: the paper's policy (feplb)
// moves whole dynamic experts, moebench's variant (feplb-split) chunks of
// their rows, from their owner to less loaded ranks of the same NVLink domain
// together with the expert's weights; the helpers compute them before their
// own dynamic experts, and the outputs go back to the owner before the base
// dispatcher's combine.
//
// One engine (core) turns counts into the split, runs the scheduler and lays
// the plan out as chunks of rows; host.go executes the chunks on the host
// device (memory copies, in their own phase) and device.go on a
// device.Device (batched copies meant for the copy engines, on a copy stream
// per rank, overlapped with the static experts).
//
// The design notes, what is faithful to the paper and what differs:
// docs/dispatchers/feplb.md.
package feplb

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moebench/moebench/balance"
	"github.com/moebench/moebench/dispatchers"
)

func init() {
	dispatchers.Register("feplb", New)
	dispatchers.RegisterDevice("feplb", NewDevice)
}

// options checks what FEPLB needs of its environment whatever the device:
// the native implementation, a base dispatcher other than itself and a
// policy the dispatcher can execute.
func options(impl string, env dispatchers.Env) (base string, err error) {
	if impl != dispatchers.ImplNative {
		return "", &dispatchers.UnavailableError{Name: "feplb", Impl: impl, Reason: "no library implementation (FEPLB has no public code)"}
	}
	base = env.Base
	if base == "" {
		base = "alltoall"
	}
	if base == "feplb" {
		return "", fmt.Errorf("--feplb-base=feplb: the base dispatcher must be another dispatcher")
	}
	if env.Policy != "" && !slices.Contains(balance.FEPLBPolicies, env.Policy) {
		return "", fmt.Errorf("--feplb-policy=%s: allowed: %s", env.Policy, strings.Join(balance.FEPLBPolicies, ", "))
	}
	return base, nil
}

// classic is a base dispatcher's phases, which FEPLB wraps: Megatron's
// (dispatchers.Sequence) and, where the base has a backward, their duals
// (dispatchers.SequenceBackward), by name.
type classic struct {
	Permute, Dispatch, Combine, Unpermute                                 func(rank int) error
	UnpermuteBackward, CombineBackward, DispatchBackward, PermuteBackward func(rank int) error
	hasBackward                                                           bool
}

// classicOrder are the forward steps FEPLB can wrap.
var classicOrder = []string{"permute", "dispatch", dispatchers.ExpertPhases[0], "combine", "unpermute"}

// classicOf is the phases of base dispatcher name (impl) from its forward
// and backward steps (nil: none), or why it cannot be FEPLB's base.
func classicOf(name, impl string, fwd, bwd []dispatchers.Step) (classic, error) {
	if phases := names(fwd); !slices.Equal(phases, classicOrder) {
		return classic{}, &dispatchers.UnavailableError{Name: name, Impl: impl, Reason: fmt.Sprintf(
			"it cannot be the base of a two-phase dispatcher: its phases are its own (%s), not permute, dispatch, combine and unpermute", strings.Join(phases, ", "))}
	}
	f := dispatchers.Runs(fwd)
	c := classic{Permute: f["permute"], Dispatch: f["dispatch"], Combine: f["combine"], Unpermute: f["unpermute"]}
	if c.hasBackward = slices.Equal(names(bwd), names(dispatchers.SequenceBackward(nil, nil, nil, nil, nil))); c.hasBackward {
		b, bn := dispatchers.Runs(bwd), dispatchers.BackwardName
		c.UnpermuteBackward, c.CombineBackward, c.DispatchBackward, c.PermuteBackward = b[bn("unpermute")], b[bn("combine")], b[bn("dispatch")], b[bn("permute")]
	}
	return c, nil
}

// names are steps' names in order.
func names(steps []dispatchers.Step) []string {
	var n []string
	for _, s := range steps {
		n = append(n, s.Name)
	}
	return n
}

// forward is FEPLB's forward: its base's with the rebalance and the
// second expert step after the first expert step.
func forward(experts, permute, dispatch, rebalance, combine, unpermute func(rank int) error) []dispatchers.Step {
	return []dispatchers.Step{{Name: "permute", Run: permute}, {Name: "dispatch", Run: dispatch}, {Name: dispatchers.ExpertPhases[0], Run: experts},
		{Name: "rebalance", Run: rebalance}, {Name: dispatchers.ExpertPhases[1], Run: experts}, {Name: "combine", Run: combine}, {Name: "unpermute", Run: unpermute}}
}

// backward is forward's duals in the reverse order.
func backward(experts, unpermute, combine, rebalance, dispatch, permute func(rank int) error) []dispatchers.Step {
	bn := dispatchers.BackwardName
	return []dispatchers.Step{{Name: bn("unpermute"), Run: unpermute}, {Name: bn("combine"), Run: combine}, {Name: dispatchers.ExpertBackwardPhases[1], Run: experts},
		{Name: bn("rebalance"), Run: rebalance}, {Name: dispatchers.ExpertBackwardPhases[0], Run: experts}, {Name: bn("dispatch"), Run: dispatch}, {Name: bn("permute"), Run: permute}}
}

// baseUnavailable says FEPLB is unavailable because its base is.
func baseUnavailable(impl string, err error) error {
	var u *dispatchers.UnavailableError
	if errors.As(err, &u) { // its reason once: "base dispatcher deepep (native): …"
		return &dispatchers.UnavailableError{Name: "feplb", Impl: impl, Reason: fmt.Sprintf("base dispatcher %s (%s): %s", u.Name, u.Impl, u.Reason)}
	}
	return err
}

// core is the part of FEPLB every device shares: the scheduler's policy,
// the static/dynamic split of each step, the scheduler goroutine, and the
// plan's layout as chunks of rows.
type core struct {
	shape   dispatchers.Shape
	topo    balance.Topology
	model   balance.Model
	opts    balance.Options
	name    string // the policy's
	policy  balance.Policy
	perRank int     // dynamic experts per rank asked for
	noOp    string  // why no work can move, or ""
	capped  string  // fewer dynamic experts than asked, and why, or ""
	ready   float64 // when the next plan is expected: the last one's scheduler time (measured), else the paper's
	measure bool    // plan with the scheduler's measured time (not on the host device: its plans are fixed)
	rows    string  // the rows' precision: at fp8 and mxfp8 they move as e4m3 rows with their scales

	// this step; mu guards dispatchedRank and plan, which every rank calls
	// (on the device, each from its GPU's thread, at once)
	mu         sync.Mutex
	counts     []int  // rows of each expert after phase 1
	start      []int  // first row of each expert in its owner's ExpertX
	dynamic    []bool // set when every rank has dispatched
	dispatched int
	sched      chan scheduled
	planned    bool
	lay        layout
	stats      dispatchers.RebalanceStats
	// paused: no scheduler runs and phase 2 moves nothing; every owner
	// computes all its dynamic experts' rows after its static ones, so a
	// rank's expert work is what the base dispatcher alone gives it
	paused bool
}

// scheduled is the scheduler goroutine's answer.
type scheduled struct {
	plan    balance.Plan
	seconds float64
	err     error
}

func newCore(env dispatchers.Env, shape dispatchers.Shape, model balance.Model) (*core, error) {
	d := env.Domain
	if d == 0 {
		d = shape.EP
	}
	t := balance.Topology{Ranks: shape.EP, Experts: shape.Experts, Domain: d}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("feplb: %v", err)
	}
	o := balance.DefaultOptions
	if env.Dynamic > 0 {
		o.DynamicPerRank = env.Dynamic
	} else { // the default fits the layer
		o.DynamicPerRank = balance.DefaultDynamic(t.Local())
	}
	name := env.Policy
	if name == "" {
		name = "feplb"
	}
	c := &core{shape: shape, topo: t, opts: o, name: name, perRank: o.DynamicPerRank, ready: balance.PaperSchedSeconds, rows: env.Precision,
		counts: make([]int, shape.Experts), start: make([]int, shape.Experts), sched: make(chan scheduled, 1)}
	if why := balance.NoOp(t, o); why != "" {
		c.noOp = "feplb moves nothing, every step is the base dispatcher's alone: " + why
	} else {
		c.capped = balance.Capped(t, o)
	}
	return c, c.setModel(model)
}

// setModel makes m the scheduler's cost model (between steps only).
func (c *core) setModel(m balance.Model) error {
	p, err := balance.New(c.name, c.topo, m, c.opts)
	if err != nil {
		return err
	}
	c.model, c.policy = m, p
	return nil
}

// begin starts a step (called at its first permute). A scheduler left
// running by a step that failed is waited for.
func (c *core) begin() {
	if c.dynamic != nil && !c.planned {
		<-c.sched
	}
	c.dispatched, c.planned, c.dynamic = 0, false, nil
}

// dispatchedRank records that phase 1 delivered rows[l] rows for rank r's
// local expert l, one run per expert in order from row 0. When it is the
// last rank, it splits the experts and starts the scheduler, and reports
// true.
func (c *core) dispatchedRank(r int, rows []int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	L := c.shape.LocalExperts()
	at := 0
	for l, n := range rows {
		c.counts[r*L+l], c.start[r*L+l] = n, at
		at += n
	}
	if c.dispatched++; c.dispatched < c.shape.EP {
		return false
	}
	c.dynamic = balance.DynamicExperts(c.topo, c.counts, c.perRank)
	if c.paused {
		c.sched <- scheduled{plan: balance.OwnerPlan(c.topo, balance.Step{Counts: c.counts})}
		return true
	}
	go func(st balance.Step) {
		t0 := time.Now()
		pl := c.policy.Plan(st)
		err := pl.Check(c.topo, st)
		c.sched <- scheduled{pl, time.Since(t0).Seconds(), err}
	}(balance.Step{Counts: slices.Clone(c.counts), Ready: c.ready})
	return true
}

// plan waits for the scheduler (the first call of a step) and lays its plan
// out; it also fills the step's stats that the plan decides.
func (c *core) plan() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.planned {
		return nil
	}
	if c.dynamic == nil {
		return fmt.Errorf("feplb: rebalance before every rank dispatched (%d of %d)", c.dispatched, c.shape.EP)
	}
	t0 := time.Now()
	s := <-c.sched
	wait := time.Since(t0).Seconds()
	if s.err != nil {
		return fmt.Errorf("feplb: the scheduler produced a bad plan: %v", s.err)
	}
	lay, err := newLayout(c.topo, &s.plan, c.dynamic, c.start, c.counts)
	if err != nil {
		return err
	}
	c.lay, c.planned = lay, true
	st := balance.Step{Counts: c.counts}
	before := balance.OwnerPlan(c.topo, st)
	how := "the paper's scheduler time"
	if c.measure {
		how = "the scheduler's last measured time, or the paper's before one"
	}
	note := fmt.Sprintf("%s; copies planned to start %.0f µs after phase 1 (%s); cost model: %s", s.plan.Note, 1e6*c.ready, how, c.model.RateSource)
	if c.capped != "" {
		note += "; " + c.capped
	}
	if c.measure && s.seconds > 0 { // the next plan expects this one's time
		c.ready = s.seconds
	}
	c.stats = dispatchers.RebalanceStats{Policy: s.plan.Policy, Note: note, NoOp: c.noOp,
		PlanSeconds: s.seconds, PlanWait: wait, TokensBefore: before.Loads(c.topo.Ranks), TokensAfter: s.plan.Loads(c.topo.Ranks), Moves: lay.moves}
	c.stats.ModelledBefore, _ = balance.Straggler(c.model.GEMMTimes(&before, c.topo.Ranks))
	c.stats.ModelledAfter, _ = balance.Straggler(c.model.GEMMTimes(&s.plan, c.topo.Ranks))
	for _, b := range s.plan.BytesByLink() {
		c.stats.CopyBytes += b
	}
	if dispatchers.ScaleBlock(c.rows) > 0 { // the model counts each moved row as bf16 out and back; out it is an e4m3 row with its scales
		h := c.shape.Hidden
		for _, in := range lay.in {
			for _, ch := range in {
				c.stats.CopyBytes -= int64(ch.n) * (2*int64(h) - dispatchers.RowBytes(c.rows, h))
			}
		}
	}
	return nil
}

// chunk is rows [src, src+n) of the owner's ExpertX for expert, computed by
// helper at rows [dst, dst+n) of the rows it computes for others.
type chunk struct {
	expert, owner, helper int
	src, dst, n           int
}

// layout is a plan as rows: which chunks each rank computes for others
// (in) and gave away (out), how many of each expert's rows its owner keeps
// (its first ones), and how many rows each rank computes for others.
type layout struct {
	in, out [][]chunk
	keep    []int
	foreign []int
	moves   int
}

// newLayout lays pl out. The plan must leave static experts whole with
// their owner and list a dynamic expert's owner first: that is what lets the
// static experts start before the plan exists.
func newLayout(t balance.Topology, pl *balance.Plan, dynamic []bool, start, counts []int) (layout, error) {
	lay := layout{in: make([][]chunk, t.Ranks), out: make([][]chunk, t.Ranks), keep: make([]int, t.Experts), foreign: make([]int, t.Ranks)}
	for e, shares := range pl.Shares {
		o := t.Owner(e)
		if len(shares) == 0 || shares[0].Rank != o {
			return lay, fmt.Errorf("feplb: the plan's first share of expert %d is %v, want its owner %d", e, shares, o)
		}
		if !dynamic[e] && (len(shares) > 1 || shares[0].Tokens != counts[e]) {
			return lay, fmt.Errorf("feplb: the plan moves static expert %d (shares %v)", e, shares)
		}
		lay.keep[e] = shares[0].Tokens
		at := start[e] + shares[0].Tokens
		for _, s := range shares[1:] {
			if t.DomainOf(s.Rank) != t.DomainOf(o) {
				return lay, fmt.Errorf("feplb: the plan moves expert %d from rank %d out of its NVLink domain to rank %d", e, o, s.Rank)
			}
			ch := chunk{expert: e, owner: o, helper: s.Rank, src: at, dst: lay.foreign[s.Rank], n: s.Tokens}
			lay.foreign[s.Rank] += s.Tokens
			at += s.Tokens
			lay.in[s.Rank] = append(lay.in[s.Rank], ch)
			lay.out[o] = append(lay.out[o], ch)
			lay.moves++
		}
	}
	return lay, nil
}

// ownDynamic calls fn for each of rank r's dynamic experts whose owner keeps
// rows: the expert, its first row and how many rows it keeps.
func (c *core) ownDynamic(r int, fn func(e, start, n int)) {
	L := c.shape.LocalExperts()
	for e := r * L; e < (r+1)*L; e++ {
		if c.dynamic[e] && c.lay.keep[e] > 0 {
			fn(e, c.start[e], c.lay.keep[e])
		}
	}
}
