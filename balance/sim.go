package balance

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// PaperSchedSeconds is the FEPLB paper's scheduler time (about 50 µs on one
// core): what a simulation measuring the scheduler expects before its
// first measurement.
const PaperSchedSeconds = 50e-6

// SimConfig is one simulation: the same steps for every policy.
type SimConfig struct {
	Topology Topology
	Model    Model
	Options  Options
	Source   Source
	Steps    int
	Policies []string
	// Tokens and TopK per rank give the EP dispatch/combine traffic that
	// the policies' own traffic would share NVLink with (SimResult.EPOverhead).
	Tokens, TopK int
	// Counts is how long after phase 1 the step's counts are on the CPU;
	// Sched the CPU scheduler's time, or < 0 for its measured wall time
	// (then the results are not deterministic). A per-step plan (fastermoe,
	// the feplb policies) is known at Counts + Sched: copies and broadcasts
	// start then.
	Counts, Sched float64
	// Backward also models the backward pass (Model.Play).
	Backward bool
}

// Stat is a mean over steps of a straggler, absolute and relative.
type Stat struct {
	Abs, Rel float64
}

// SimResult is one policy over all steps; every value is a mean over steps
// (times in seconds).
type SimResult struct {
	Policy string
	Token  Stat // copies: max − mean, max/mean − 1
	GEMM   Stat // the ranks' modelled GEMM times: max − mean, max/mean − 1
	// Effective is the slowest rank's finish (Timeline.Finish: its GEMMs,
	// waits for copies, outputs back, broadcasts, placement traffic) minus
	// the mean GEMM time with every expert home (what a perfect balance
	// would take), and relative to that mean: what the step really loses.
	Effective Stat
	// Exposed is the slowest finish minus the slowest rank's GEMM time:
	// what the policy's own costs add beyond its GEMM straggler.
	Exposed      float64
	BytesPerStep map[string]float64 // by link
	// the busiest rank's copy-engine time, the busiest owner's time taking
	// outputs back, and how much of the way back lands after the GEMMs
	CETimeMax, BackTimeMax, BackExposed float64
	// LinkLoad is the bytes of the policy's own traffic on the busiest
	// rank's NVLink direction (Plan.LinkLoad); EPOverhead that over the EP
	// dispatch and combine bytes on that direction (NaN with one rank per
	// domain): how much longer EP traffic running beside the copies takes.
	LinkLoad, EPOverhead float64
	Moved                float64 // (expert, helper) pairs moved over copy engines
	Backward             *BackwardResult
	SchedulerMicro       float64 // measured wall time of the policy's Plan per step, µs
	ReadyMicro           float64 // when a per-step plan was charged as known (Counts + Sched), µs
	Warnings             []string
	Steps                int
}

// BackwardResult is the backward pass under the same plans (Model.Play).
type BackwardResult struct {
	GEMM, Effective Stat
	// bytes per step of the policy's own backward traffic: FEPLB's weights
	// fetched again, output gradients out, input and weight gradients back;
	// FasterMoE's weight-gradient reductions; EPLB's replicas' weight
	// gradients summed with their owner's (in the data-parallel gradient
	// reduction, not timed here)
	Bytes float64
	// the busiest rank's copy-engine time, and how much the gradients'
	// way back lands after the backward GEMMs
	CETimeMax, Exposed float64
}

// Simulate runs each policy over the same steps and checks every plan
// (Plan.Check); a violation is an error.
func Simulate(c SimConfig) ([]SimResult, error) {
	t, m := c.Topology, c.Model
	if err := t.Validate(); err != nil {
		return nil, err
	}
	epBytes := 2 * float64(c.Tokens*c.TopK) * float64(m.TokenBytes()) * float64(t.Domain-1) / float64(t.Ranks)
	var out []SimResult
	for _, name := range c.Policies {
		pol, err := New(name, t, m, c.Options)
		if err != nil {
			return nil, err
		}
		res := SimResult{Policy: name, BytesPerStep: map[string]float64{}, Steps: c.Steps, Warnings: warnings(name, t, c.Options)}
		if c.Backward {
			res.Backward = &BackwardResult{}
		}
		perStep := name != "none" && name != "eplb"
		est := c.Sched
		if est < 0 {
			est = PaperSchedSeconds
		}
		var sched float64
		for i := range c.Steps {
			st := c.Source.Step(i)
			if perStep {
				st.Ready = c.Counts + est
			}
			t0 := time.Now()
			pl := pol.Plan(st)
			took := time.Since(t0).Seconds()
			sched += took
			ready := st.Ready
			if perStep && c.Sched < 0 {
				ready, est = c.Counts+took, took
			}
			res.ReadyMicro += 1e6 * ready
			if err := pl.Check(t, st); err != nil {
				return nil, fmt.Errorf("%s, step %d: %w", name, i, err)
			}
			loads := pl.Loads(t.Ranks)
			lf := make([]float64, len(loads))
			for r, v := range loads {
				lf[r] = float64(v)
			}
			res.Token.add(lf)
			ideal := 0.0 // mean GEMM time with every expert home
			for _, n := range st.Counts {
				ideal += m.ExpertTime(n)
			}
			ideal /= float64(t.Ranks)
			tl := m.Play(&pl, t.Ranks, ready, false)
			res.GEMM.add(tl.Busy)
			res.Effective.addEnd(tl.End(), ideal)
			res.Exposed += tl.End() - slices.Max(tl.Busy)
			for link, b := range pl.BytesByLink() {
				res.BytesPerStep[link] += float64(b)
			}
			res.CETimeMax += tl.CEBusiest
			res.BackTimeMax += tl.BackBusiest
			res.BackExposed += tl.BackExposed()
			res.LinkLoad += pl.LinkLoad(t, t.Ranks)
			res.Moved += float64(pl.Moved())
			if b := res.Backward; b != nil {
				bt := m.Play(&pl, t.Ranks, ready, true)
				b.GEMM.add(bt.Busy)
				b.Effective.addEnd(bt.End(), 2*ideal)
				b.Bytes += backwardBytes(&pl, m)
				b.CETimeMax += bt.CEBusiest
				b.Exposed += bt.BackExposed()
			}
		}
		n := float64(c.Steps)
		for _, s := range []*Stat{&res.Token, &res.GEMM, &res.Effective} {
			s.Abs, s.Rel = s.Abs/n, s.Rel/n
		}
		for k := range res.BytesPerStep {
			res.BytesPerStep[k] /= n
		}
		for _, v := range []*float64{&res.Exposed, &res.CETimeMax, &res.BackTimeMax, &res.BackExposed, &res.LinkLoad, &res.Moved, &res.ReadyMicro} {
			*v /= n
		}
		res.EPOverhead = math.NaN()
		if epBytes > 0 {
			res.EPOverhead = res.LinkLoad / epBytes
		}
		if b := res.Backward; b != nil {
			for _, s := range []*Stat{&b.GEMM, &b.Effective} {
				s.Abs, s.Rel = s.Abs/n, s.Rel/n
			}
			b.Bytes, b.CETimeMax, b.Exposed = b.Bytes/n, b.CETimeMax/n, b.Exposed/n
		}
		res.SchedulerMicro = 1e6 * sched / n
		if isFEPLB(name) && res.Moved == 0 && NoOp(t, c.Options) == "" {
			res.Warnings = append(res.Warnings, fmt.Sprintf("%s moved nothing in %d steps: no move lowered the busiest rank's modelled finish (is there static work to hide one expert's weights behind? they take %.0f µs to copy), so it equals none",
				name, c.Steps, 1e6*float64(m.WeightBytes())/m.CERate()))
		}
		out = append(out, res)
	}
	return out, nil
}

// add adds one step's straggler of v.
func (s *Stat) add(v []float64) {
	a, r := Straggler(v)
	s.Abs += a
	s.Rel += r
}

// addEnd adds one step's effective straggler: end against ideal.
func (s *Stat) addEnd(end, ideal float64) {
	s.Abs += end - ideal
	if ideal > 0 {
		s.Rel += end/ideal - 1
	}
}

// warnings are what a policy's settings make of it before any step: a
// FEPLB policy that can move nothing, or fewer dynamic experts than asked.
func warnings(name string, t Topology, o Options) []string {
	if !isFEPLB(name) {
		return nil
	}
	var w []string
	if why := NoOp(t, o); why != "" {
		w = append(w, name+" is a no-op, identical to none: "+why)
	}
	if why := Capped(t, o); why != "" {
		w = append(w, name+": "+why)
	}
	return w
}

func isFEPLB(name string) bool {
	return name == "feplb" || name == "feplb-split" || name == "feplb+place"
}

// backwardBytes is a plan's own traffic in the backward pass (see
// BackwardResult.Bytes).
func backwardBytes(p *Plan, m Model) float64 {
	w, b := float64(m.WeightBytes()), 0.0
	for _, mv := range p.Moves {
		switch {
		case mv.Kind == KindRebalance && !mv.Weights: // weights again, gradients both ways, weight gradient back
			b += 2*w + 2*float64(mv.Bytes)
		case mv.Kind == KindShadow:
			b += w
		}
	}
	if p.Policy == "eplb" {
		for _, hs := range p.Holders {
			b += w * float64(len(hs)-1)
		}
	}
	return b
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
