package layer

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels/device"
)

// The overlap engine's steps (overlap.go): the overlapped step and the same
// step's phases one after another, and what their events say.

// Step runs one training step of ov's micro-batches, overlapped (over) or
// with every phase after the one before (the same phases, the same
// rounding points; only the order and the streams differ). With
// --cuda-graph (ov.graph) the overlapped step is issued as CUDA graphs
// (overlapgraph.go) unless ov.eager.
func (ov *Overlap) Step(over bool) error {
	l0 := ov.Mb[0]
	ov.lastOrdered = ov.lastOrdered[:0]
	plan := ov.plan(over)
	t0 := time.Now()
	l0.WaitMS = 0
	if over && ov.Graph != nil && !ov.eager {
		if err := ov.stepGraph(plan); err != nil {
			return err
		}
	} else {
		if err := l0.begin(); err != nil { // mb0's begin events and zero_grad
			return err
		}
		if err := ov.issue(plan, true); err != nil {
			return err
		}
	}
	if err := ov.each(func(r int) error { return l0.Ranks[r].Dev.Record(ov.end[r], l0.Ranks[r].Stream) }); err != nil {
		return err
	}
	l0.IssueMS = float64(time.Since(t0).Nanoseconds())/1e6 - l0.WaitMS
	for _, l := range ov.Mb {
		if l == nil {
			continue
		}
		if err := l.Finish(); err != nil {
			return err
		}
		l.warm = true
	}
	return nil
}

// ovItem is one action of an overlap step after its begin: a phase of
// micro-batch mb, or (ph nil) linkStreams(link).
type ovItem struct {
	mb, link int
	ph       *dispatchers.Step
}

// plan is the step's actions in issue order, overlapped (over) or not.
func (ov *Overlap) plan(over bool) []ovItem {
	l0, l1 := ov.Mb[0], ov.Mb[1]
	var p []ovItem
	run := func(i int, phs []dispatchers.Step) {
		for k := range phs {
			p = append(p, ovItem{mb: i, ph: &phs[k]})
		}
	}
	link := func(d int) { p = append(p, ovItem{link: d}) }
	pick := func(i int) []dispatchers.Step {
		if over {
			return ov.Over[i]
		}
		return ov.plain[i]
	}
	if l1 == nil {
		run(0, pick(0))
		return p
	}
	link(0) // mb1 after the start and zero_grad
	s0, s1 := pick(0), pick(1)
	f0, b0 := s0[:l0.Forward], s0[l0.Forward:]
	f1, b1 := s1[:l1.Forward], s1[l1.Forward:]
	if !over {
		run(0, f0)
		run(0, b0)
		link(0)
		run(1, f1)
	} else {
		run(0, f0)
		link(0) // F1 after F0, as in 1F1B
		for k, slot := range mergeSlots(b0, f1) {
			if k > 0 && ov.Plant != "a2a" { // the slot's pair starts after the last slot's pair
				link(0)
				link(1)
			}
			run(0, slot[0])
			run(1, slot[1])
		}
		if ov.Plant != "a2a" { // B1 accumulates into the gradients B0 wrote
			link(0)
		}
	}
	run(1, b1)
	link(1) // the step ends on mb0's stream
	return p
}

// issue queues items as plain launches; with hostWaits, each phase's host
// wait (Capabilities.HostWait) first.
func (ov *Overlap) issue(items []ovItem, hostWaits bool) error {
	for _, it := range items {
		if it.ph == nil {
			if err := ov.linkStreams(it.link); err != nil {
				return err
			}
			continue
		}
		ov.lastOrdered = append(ov.lastOrdered, orderedPhase{it.mb, it.ph.Name})
		if err := ov.Mb[it.mb].phases([]dispatchers.Step{*it.ph}, false, hostWaits); err != nil {
			return err
		}
	}
	return nil
}

// mergeSlots cuts b (a backward's phases) and f (the next micro-batch's
// forward) into runs of communication and compute and pairs them slot by
// slot, as the combined 1F1B schedule does: b's combine backward beside
// f's router, f's dispatch beside b's expert backward, b's dispatch
// backward beside f's experts, f's combine beside b's router and shared
// backward. Each slot is [b's run, f's run]; either may be empty.
func mergeSlots(b, f []dispatchers.Step) [][2][]dispatchers.Step {
	rb, rf := runs(b), runs(f)
	// b starts with communication, f with compute: slot k pairs rb[k] with
	// rf[k] when their kinds differ; otherwise one side waits a slot
	var slots [][2][]dispatchers.Step
	i, j := 0, 0
	for i < len(rb) || j < len(rf) {
		var s [2][]dispatchers.Step
		switch {
		case i < len(rb) && j < len(rf) && isComm(rb[i][0].Name) != isComm(rf[j][0].Name):
			s[0], s[1] = rb[i], rf[j]
			i, j = i+1, j+1
		case j >= len(rf) || (i < len(rb) && isComm(rb[i][0].Name)):
			s[0] = rb[i]
			i++
		default:
			s[1] = rf[j]
			j++
		}
		slots = append(slots, s)
	}
	return slots
}

// runs cuts phs into maximal runs of communication or compute.
func runs(phs []dispatchers.Step) [][]dispatchers.Step {
	var out [][]dispatchers.Step
	for k, ph := range phs {
		if k == 0 || isComm(ph.Name) != isComm(phs[k-1].Name) {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], ph)
	}
	return out
}

// linkStreams makes each rank's stream of micro-batch 1-d wait for the work
// queued so far on its stream of micro-batch d.
func (ov *Overlap) linkStreams(d int) error {
	from, to := ov.Mb[d], ov.Mb[1-d]
	return ov.each(func(r int) error {
		dev := from.Ranks[r].Dev
		if err := dev.Record(ov.link[d][r], from.Ranks[r].Stream); err != nil {
			return err
		}
		return dev.Wait(to.Ranks[r].Stream, ov.link[d][r])
	})
}

// each runs f for every local rank, each device's ranks on its thread.
func (ov *Overlap) each(f func(r int) error) error {
	dl := ov.Mb[0]
	return dl.th.Each(func(dev int) error {
		for _, r := range dl.of[dev] {
			if err := f(r); err != nil {
				return fmt.Errorf("rank %d: %w", r, err)
			}
		}
		return nil
	})
}

// ovTimes is what one step's events say, per rank.
type ovTimes struct {
	step    []float64 // from the common start to the step's end
	comm    []float64 // the dispatchers' phases' busy time (their union)
	exposed []float64 // the part of comm no compute on another stream covers
}

// Times reads the last step's events (the host has waited for them); over
// says whether it was the overlapped step, whose side streams' events it
// also reads (the sequential step records none: CUDA refuses the elapsed
// time of an event never recorded).
func (ov *Overlap) Times(over bool) (ovTimes, error) {
	l0 := ov.Mb[0]
	n := len(l0.Ranks)
	t := ovTimes{make([]float64, n), make([]float64, n), make([]float64, n)}
	for r, rk := range l0.Ranks {
		if !l0.Local(r) {
			continue
		}
		begin := l0.stepBegin(r) // graph.go: with --cuda-graph, the begin event's timing twin
		at := func(e device.Event) (float64, error) { return rk.Dev.Elapsed(begin, e) }
		var comm, comp [][2]float64
		add := func(a, b device.Event, isComm bool) error {
			s, err := at(a)
			if err != nil {
				return err
			}
			e, err := at(b)
			if err != nil {
				return err
			}
			if isComm {
				comm = append(comm, [2]float64{s, e})
			} else {
				comp = append(comp, [2]float64{s, e})
			}
			return nil
		}
		for i, l := range ov.Mb {
			if l == nil {
				continue
			}
			for _, ph := range ov.plain[i] {
				if over && ov.shared && ph.Name == "shared" { // on its side stream
					continue
				}
				if err := add(l.start[ph.Name][r], l.end[ph.Name][r], isComm(ph.Name)); err != nil {
					return t, fmt.Errorf("%s on rank %d: %w", ph.Name, r, err)
				}
			}
			o := &ov.ranks[i][r]
			if !over {
				continue
			}
			if ov.shared && l.dc[0].sfc1 != 0 {
				if err := add(o.shStart, o.shEnd, false); err != nil {
					return t, err
				}
				s, _ := at(o.shStart)
				e, _ := at(o.shEnd)
				ov.sharedMS[r] = append(ov.sharedMS[r], e-s)
			}
			for _, name := range dispatchers.ExpertBackwardPhases {
				if w := o.wgrad[name]; w != nil && len(w.ops) > 0 {
					if err := add(w.start, w.end, false); err != nil {
						return t, err
					}
				}
			}
		}
		end, err := at(ov.end[r])
		if err != nil {
			return t, err
		}
		t.step[r] = end
		t.comm[r] = length(union(comm))
		t.exposed[r] = exposedOf(comm, comp)
	}
	return t, nil
}

// union merges intervals into disjoint ones, in order.
func union(iv [][2]float64) [][2]float64 {
	iv = slices.Clone(iv)
	slices.SortFunc(iv, func(a, b [2]float64) int { return int(math.Copysign(1, a[0]-b[0])) })
	var out [][2]float64
	for _, x := range iv {
		if x[1] <= x[0] {
			continue
		}
		if n := len(out); n > 0 && x[0] <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], x[1])
			continue
		}
		out = append(out, x)
	}
	return out
}

func length(iv [][2]float64) float64 {
	s := 0.0
	for _, x := range iv {
		s += x[1] - x[0]
	}
	return s
}

// exposedOf is the time within comm's intervals that no interval of comp
// covers.
func exposedOf(comm, comp [][2]float64) float64 {
	c, u := union(comm), union(comp)
	hidden := 0.0
	for _, a := range c {
		for _, b := range u {
			hidden += max(0, min(a[1], b[1])-max(a[0], b[0]))
		}
	}
	return length(c) - hidden
}

// poison fills with NaN every micro-batch's output and the gradient
// buffers its backward writes rather than adds to (poisonGrads), so that a
// step compared bit for bit cannot pass on an earlier step's values.
func (ov *Overlap) poison() error {
	for _, l := range ov.Mb {
		if l == nil {
			continue
		}
		c := l.Layer.Cfg
		if err := ov.each(func(r int) error {
			rk := l.Ranks[r]
			if err := rk.Dev.Fill16(rk.Y, 0x7fc0, int64(c.Tokens*c.Hidden), rk.Stream); err != nil {
				return err
			}
			if l.Train {
				return l.PoisonGrads(r)
			}
			return nil
		}); err != nil {
			return err
		}
		if err := l.sync(); err != nil {
			return err
		}
	}
	return nil
}

// ovSnapshot is what a step leaves that overlap must not change: every
// micro-batch's output and input gradient per rank, and the weight
// gradients (main_grad), as bits.
type ovSnapshot map[string][]uint32

// Snapshot downloads ov's outputs and gradients after a step.
func (ov *Overlap) Snapshot() (ovSnapshot, error) {
	out := ovSnapshot{}
	c := ov.Mb[0].Layer.Cfg
	T, h, f, E := c.Tokens, c.Hidden, c.FFN, c.Experts
	fs, L := f*c.SharedExperts, ov.Mb[0].Layer.Shape.LocalExperts()
	for i, l := range ov.Mb {
		if l == nil {
			continue
		}
		for r, rk := range l.Ranks {
			if !l.Local(r) {
				continue
			}
			g := &l.RankBufs[r].g
			bf := []struct {
				name string
				p    device.Addr
				n    int
			}{{"y", rk.Y, T * h}, {"dx", g.dx, T * h}}
			f32 := []struct {
				name string
				p    device.Addr
				n    int
			}{{"dfc1", rk.DFC1, L * 2 * f * h}, {"dfc2", rk.DFC2, L * h * f}, {"router", g.routerGrad, E * h},
				{"shared-fc1", g.sfc1Grad, 2 * fs * h}, {"shared-fc2", g.sfc2Grad, h * fs}}
			for _, b := range bf {
				if b.p == 0 {
					continue
				}
				v := make([]uint16, b.n)
				if err := rk.Dev.Download(v, b.p, rk.Stream); err != nil {
					return nil, err
				}
				w := make([]uint32, b.n)
				for k, x := range v {
					w[k] = uint32(x)
				}
				out[fmt.Sprintf("micro-batch %d rank %d %s", i, r, b.name)] = w
			}
			for _, b := range f32 {
				if b.p == 0 || (i == 1 && ov.Mb[1] != nil) { // mb1's are mb0's
					continue
				}
				v := make([]float32, b.n)
				if err := rk.Dev.Download(v, b.p, rk.Stream); err != nil {
					return nil, err
				}
				w := make([]uint32, b.n)
				for k, x := range v {
					w[k] = math.Float32bits(x)
				}
				out[fmt.Sprintf("rank %d %s gradient", r, b.name)] = w
			}
		}
	}
	return out, nil
}

// Diff names the first tensor and element where a and b differ, or "".
func (a ovSnapshot) Diff(b ovSnapshot) string {
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		x, y := a[k], b[k]
		if len(x) != len(y) {
			return fmt.Sprintf("%s: %d values, %d", k, len(x), len(y))
		}
		for j := range x {
			if x[j] != y[j] {
				return fmt.Sprintf("%s: element %d differs (%#x, %#x)", k, j, x[j], y[j])
			}
		}
	}
	if len(a) != len(b) {
		return fmt.Sprintf("%d tensors, %d", len(a), len(b))
	}
	return ""
}
