package layer

import (
	"fmt"
	"slices"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels/device"
)

// MoE communication overlap on the device layer (docs/overlap.md). Two
// forms, as Megatron-Core has them:
//
//   - shared (moe_shared_expert_overlap): each rank's shared expert (fc1,
//     SwiGLU, fc2) runs on a side stream of its own, from an event after the
//     step's start, while the dispatcher's phases run on the rank's stream;
//     the rank's stream waits for it before the forward's last phase, which
//     adds rk.Shared.
//   - a2a (overlap_moe_expert_parallel_comm): two micro-batches a step, each
//     a deviceLayer of its own on the same devices (its own dispatcher,
//     buffers and streams; the weight gradients, main_grad, are the first's,
//     shared). The step is F0, then F1 merged with B0 as the combined 1F1B
//     schedule merges them — the merged passes cut into alternating runs of
//     compute and communication (the dispatcher's phases), each slot one
//     micro-batch's communication beside the other's compute, on the two
//     micro-batches' streams, events between the slots — then B1.
//
// With delayWgrad, the expert GEMMs' weight gradients (dFC1, dFC2) of each
// expert backward phase are not queued with its dgrad: they run afterwards
// on a side stream of the rank, after an event, beside the dispatcher's
// backward communication that follows; the rank's stream waits for them
// before the backward's last phase. The fp32 accumulations run in the same
// order as without, so every gradient is the same bit for bit.
//
// Every cross-stream dependency is an event; Emu's stream-order check
// (kernels/device/order.go) fails a step that misses one (see plant).

// Overlap is a device layer's overlap engine: the side streams and events
// of shared and delayed wgrad, and for a2a the second micro-batch.
type Overlap struct {
	shared, a2a, delay bool
	// Plant leaves out one event on purpose (tests): "shared", "wgrad" or
	// "a2a"; Emu's order check must fail the step.
	Plant string
	// Graph issues the overlapped step as CUDA graphs (--cuda-graph;
	// overlapgraph.go), nil: plain launches; eager issues it as plain
	// launches all the same (the equality check's reference).
	Graph *ovGraphs
	eager bool
	// seg is the segment of the overlapped step being issued as a graph
	// (or, refused, as plain launches), numbered across steps from 1; 0:
	// the step is issued as plain launches (see crossWait).
	seg int

	Mb    [2]*DeviceLayer // the micro-batches (mb[1] nil without a2a)
	plain [2][]dispatchers.Step
	Over  [2][]dispatchers.Step
	ranks [2][]ovRank // per micro-batch, per rank

	link        [2][]device.Event // per direction (0: mb0 → mb1), per rank
	end         []device.Event    // per rank: the step's end on mb0's stream
	deferring   [2][]string       // per micro-batch, per rank: the expert backward phase deferring its wgrad now, or ""
	sharedMS    [][]float64       // per rank, the overlapped steps' shared expert times (side stream)
	lastOrdered []orderedPhase    // the last overlapped step's issue order (tests: order)
}

// ovRank is one rank's side streams and events in one micro-batch.
type ovRank struct {
	side, wside    device.Stream // the shared expert's; the deferred wgrad's
	in, shDone     device.Event  // the shared expert's start (on the rank's stream) and end (on side)
	shDoneSeg      int           // the graph segment shDone was recorded in (crossWait)
	shStart, shEnd device.Event  // timing events on side
	wgrad          map[string]*wgradPhase
}

// wgradPhase is what one expert backward phase defers on one rank.
type wgradPhase struct {
	ops       []device.MatMul
	arena     device.RowCapacity // the phase's dh1 rows, kept for its dFC1
	dh1       device.Addr
	at        int          // rows of arena given out
	ready     device.Event // on the rank's stream, after the dgrad
	start     device.Event // on the wgrad stream, after its wait (timing)
	done      device.Event // on the wgrad stream, after the products (the backward's last phase waits for it)
	end       device.Event // on the wgrad stream, after done: the products' end (timing)
	waitedFor bool
	doneSeg   int // the graph segment done was recorded in (crossWait)
}

// NewOverlap builds dl's overlap engine for the forms asked; with a2a it
// builds the second micro-batch's layer from mb1 (a layer of the same
// configuration and weights, with inputs of its own) and dispatcher d1.
func NewOverlap(dl *DeviceLayer, shared, a2a, delay bool, mb1 *Layer, d1 dispatchers.DeviceDispatcher) (*Overlap, error) {
	if shared && a2a {
		return nil, fmt.Errorf("overlap: shared and a2a together: %s", setup.SharedA2AConflict)
	}
	if (a2a || delay) && !dl.Train {
		return nil, fmt.Errorf("overlap: a2a and --delay-wgrad overlap a training step's backward, and this layer is forward-only")
	}
	ov := &Overlap{shared: shared, a2a: a2a, delay: delay}
	ov.Mb[0] = dl
	if a2a {
		dl.Layer.micros = 2 // its trace tokens, then micro-batch 1's, each step
		dl1, err := NewDeviceLayer(mb1, dl.devs, dl.th, d1, dl.Distributed)
		if err != nil {
			return nil, fmt.Errorf("overlap: micro-batch 1: %w", err)
		}
		dl1.RankBufs = dl1.RankBufs[:len(dl.RankBufs)]
		for r := range dl1.RankBufs { // the grouped GEMM way mb0 chose
			dl1.RankBufs[r].Grouped = dl.RankBufs[r].Grouped
		}
		if dl1.Attn != nil && dl.Attn != nil { // one calibration for both
			dl1.Attn.reps = dl.Attn.reps
		}
		if err := shareGrads(dl, dl1); err != nil {
			return nil, err
		}
		ov.Mb[1] = dl1
	}
	for i, l := range ov.Mb {
		if l == nil {
			continue
		}
		l.ov = ov
		ov.ranks[i] = make([]ovRank, len(l.Ranks))
		ov.deferring[i] = make([]string, len(l.Ranks))
		for r, rk := range l.Ranks {
			if !l.Local(r) {
				continue
			}
			o := &ov.ranks[i][r]
			o.wgrad = map[string]*wgradPhase{}
			var err error
			if o.side, err = rk.Dev.NewStream(); err != nil {
				return nil, err
			}
			if o.wside, err = rk.Dev.NewStream(); err != nil {
				return nil, err
			}
			for _, e := range []*device.Event{&o.in, &o.shDone, &o.shStart, &o.shEnd} {
				if *e, err = rk.Dev.NewEvent(); err != nil {
					return nil, err
				}
			}
		}
		ov.plain[i] = slices.Clone(l.Steps())
		ov.Over[i] = ov.rewrite(i, ov.plain[i])
	}
	ov.end = make([]device.Event, len(dl.Ranks))
	ov.sharedMS = make([][]float64, len(dl.Ranks))
	for d := range ov.link {
		ov.link[d] = make([]device.Event, len(dl.Ranks))
	}
	for r, rk := range dl.Ranks {
		if !dl.Local(r) {
			continue
		}
		for _, e := range []*device.Event{&ov.end[r], &ov.link[0][r], &ov.link[1][r]} {
			var err error
			if *e, err = rk.Dev.NewEvent(); err != nil {
				return nil, err
			}
		}
	}
	return ov, nil
}

// shareGrads points mb1's weight gradients (main_grad) at mb0's, freeing
// its own: the micro-batches accumulate into one gradient, as gradient
// accumulation does.
func shareGrads(dl0, dl1 *DeviceLayer) error {
	for r, rk := range dl1.Ranks {
		if !dl1.Local(r) {
			continue
		}
		g0, g1, rk0 := &dl0.RankBufs[r].g, &dl1.RankBufs[r].g, dl0.Ranks[r]
		c := dl1.Layer.Cfg
		h, f, fs, L := int64(c.Hidden), int64(c.FFN), int64(c.FFN*c.SharedExperts), int64(dl1.Layer.Shape.LocalExperts())
		for _, p := range []struct {
			mine, theirs *device.Addr
			bytes        int64 // as newDeviceBackward allocated it
		}{{&rk.DFC1, &rk0.DFC1, 4 * L * 2 * f * h}, {&rk.DFC2, &rk0.DFC2, 4 * L * h * f},
			{&g1.routerGrad, &g0.routerGrad, 4 * int64(c.Experts) * h}, {&g1.sfc1Grad, &g0.sfc1Grad, 4 * 2 * fs * h}, {&g1.sfc2Grad, &g0.sfc2Grad, 4 * h * fs}} {
			if *p.mine == 0 {
				continue
			}
			g1.fixed -= p.bytes // held once, in mb0's footprint
			if err := rk.Dev.SyncStream(rk.Stream); err != nil {
				return err
			}
			if err := rk.Dev.Free(*p.mine); err != nil {
				return err
			}
			*p.mine = *p.theirs
		}
	}
	return nil
}

// isExpert reports whether phase name is the layer's expert computation
// (forward or backward).
func isExpert(name string) bool {
	return slices.Contains(dispatchers.ExpertPhases, name) || slices.Contains(dispatchers.ExpertBackwardPhases, name)
}

// layerPhases are the layer's own phases besides the experts: compute.
var layerPhases = []string{"shared", "router", "quantize", "attention",
	dispatchers.BackwardName("router"), dispatchers.BackwardName("shared"), dispatchers.BackwardName("attention")}

// isComm reports whether phase name is communication: a dispatcher's phase
// (its dispatch, combine and what they hold: layout, notify, permute…).
func isComm(name string) bool { return !isExpert(name) && !slices.Contains(layerPhases, name) }

// rewrite is micro-batch i's steps with the shared expert on its side
// stream and the expert backward's wgrad deferred, as ov asks.
func (ov *Overlap) rewrite(i int, plain []dispatchers.Step) []dispatchers.Step {
	dl := ov.Mb[i]
	s := slices.Clone(plain)
	if ov.shared {
		for j := range s {
			if s[j].Name == "shared" {
				s[j].Run = func(r int) error { return ov.sharedSide(i, r) }
			}
		}
		if last := dl.Forward - 1; last >= 0 && s[last].Name != "shared" {
			run := s[last].Run
			s[last].Run = func(r int) error {
				if ov.Plant != "shared" && dl.dc[0].sfc1 != 0 {
					if err := ov.crossWait(dl.Ranks[r].Dev, dl.Ranks[r].Stream, ov.ranks[i][r].shDone, ov.ranks[i][r].shDoneSeg); err != nil {
						return err
					}
				}
				return run(r)
			}
		}
	}
	if ov.delay && dl.Train {
		for j := dl.Forward; j < len(s); j++ {
			if name, run := s[j].Name, s[j].Run; slices.Contains(dispatchers.ExpertBackwardPhases, name) {
				s[j].Run = func(r int) error { return ov.deferredExperts(i, name, r, run) }
			}
		}
		last := len(s) - 1
		run := s[last].Run
		s[last].Run = func(r int) error {
			if err := ov.waitWgrad(i, r); err != nil {
				return err
			}
			return run(r)
		}
	}
	return s
}

// sharedSide queues rank r's shared expert on its side stream after an
// event on the rank's stream, and the event the forward's last phase waits
// for.
func (ov *Overlap) sharedSide(i, r int) error {
	dl, o := ov.Mb[i], &ov.ranks[i][r]
	rk := dl.Ranks[r]
	dev, main := rk.Dev, rk.Stream
	if err := dev.Record(o.in, main); err != nil {
		return err
	}
	if err := dev.Wait(o.side, o.in); err != nil {
		return err
	}
	if err := dl.timing(dev, o.shStart, o.side); err != nil { // graph.go
		return err
	}
	rk.Stream = o.side // sharedExpert queues on rk.Stream; the rank's calls are this thread's alone
	err := dl.sharedExpert(r)
	rk.Stream = main
	if err != nil {
		return err
	}
	if err := dl.timing(dev, o.shEnd, o.side); err != nil {
		return err
	}
	o.shDoneSeg = ov.seg
	return dev.Record(o.shDone, o.side)
}

// crossWait makes stream s wait for event e, recorded in graph segment at
// (ov.seg then). While the overlapped step is issued as graphs, an event
// recorded in another segment is left out: it is ordered already, since
// every segment joins every stream back into the origin, on which the next
// segment's graph is launched, every stream forked after it (stepGraph);
// and a captured wait for an event of another capture is refused
// (CUDA_ERROR_STREAM_CAPTURE_ISOLATION).
func (ov *Overlap) crossWait(dev device.Device, s device.Stream, e device.Event, at int) error {
	if ov.seg != 0 && at != ov.seg {
		return nil
	}
	return dev.Wait(s, e)
}

// deferredExperts runs expert backward phase name (run) of rank r with its
// wgrad deferred (blockBackward asks wgradNow), then queues the deferred
// products on the rank's wgrad stream after an event.
func (ov *Overlap) deferredExperts(i int, name string, r int, run func(int) error) error {
	dl, o := ov.Mb[i], &ov.ranks[i][r]
	rk := dl.Ranks[r]
	w := o.wgrad[name]
	if w == nil {
		w = &wgradPhase{}
		var err error
		if w.ready, err = rk.Dev.NewEvent(); err != nil {
			return err
		}
		if w.done, err = rk.Dev.NewEvent(); err != nil {
			return err
		}
		if w.start, err = rk.Dev.NewEvent(); err != nil {
			return err
		}
		if w.end, err = rk.Dev.NewEvent(); err != nil {
			return err
		}
		o.wgrad[name] = w
	}
	rows := 0 // the dh1 rows every segment of the phase keeps
	work := rk.Work
	if work == nil {
		work = dl.wholeWork(r)
	}
	for _, b := range work {
		for _, sg := range b.Segments {
			rows += sg.Len
		}
	}
	f := int64(dl.Layer.Cfg.FFN)
	if err := w.arena.Ensure(rk.Dev, rk.Stream, rows, device.RowBuffer{P: &w.dh1, PerRow: 4 * f}); err != nil {
		return err
	}
	w.ops, w.at = w.ops[:0], 0
	ov.deferring[i][r] = name
	err := run(r)
	ov.deferring[i][r] = ""
	if err != nil {
		return err
	}
	if err := rk.Dev.Record(w.ready, rk.Stream); err != nil {
		return err
	}
	if ov.Plant != "wgrad" {
		if err := rk.Dev.Wait(o.wside, w.ready); err != nil {
			return err
		}
	}
	if err := dl.timing(rk.Dev, w.start, o.wside); err != nil { // graph.go: an event record node inside a capture
		return err
	}
	for _, mm := range w.ops {
		if err := rk.Dev.MatMul(mm, o.wside); err != nil {
			return err
		}
	}
	w.waitedFor, w.doneSeg = false, ov.seg
	if err := rk.Dev.Record(w.done, o.wside); err != nil {
		return err
	}
	return dl.timing(rk.Dev, w.end, o.wside)
}

// waitWgrad makes rank r's stream wait for every deferred wgrad of the step.
func (ov *Overlap) waitWgrad(i, r int) error {
	dl := ov.Mb[i]
	rk := dl.Ranks[r]
	for _, name := range dispatchers.ExpertBackwardPhases {
		w := ov.ranks[i][r].wgrad[name]
		if w == nil || w.waitedFor {
			continue
		}
		if err := ov.crossWait(rk.Dev, rk.Stream, w.done, w.doneSeg); err != nil {
			return err
		}
		w.waitedFor = true
	}
	return nil
}

// ovDeferring reports whether rank r's expert backward defers its wgrad
// now (blockBackward).
func (dl *DeviceLayer) ovDeferring(r int) bool {
	if dl.ov == nil {
		return false
	}
	i := 0
	if dl.ov.Mb[1] == dl {
		i = 1
	}
	return dl.ov.deferring[i][r] != ""
}

// wgradDH1 is where a segment of n rows keeps its dh1: the shared scratch,
// or, when its wgrad is deferred, rows of the phase's arena of their own.
func (dl *DeviceLayer) wgradDH1(r, n int) device.Addr {
	if !dl.ovDeferring(r) {
		return dl.RankBufs[r].g.dh1
	}
	w := dl.ovPhase(r)
	p := w.dh1 + device.Addr(int64(w.at)*4*int64(dl.Layer.Cfg.FFN))
	w.at += n
	return p
}

// wgrad queues a weight-gradient product of rank r, or defers it. The
// gradients of a segment with weights of its own (moved: FEPLB's dynamic
// experts) are queued now: the dispatcher's next phase sends them to their
// owners.
func (dl *DeviceLayer) wgrad(r int, mm device.MatMul, moved bool) error {
	if moved || !dl.ovDeferring(r) {
		return dl.Ranks[r].Dev.MatMul(mm, dl.Ranks[r].Stream)
	}
	w := dl.ovPhase(r)
	w.ops = append(w.ops, mm)
	return nil
}

// ovPhase is rank r's deferral of the expert backward phase running now.
func (dl *DeviceLayer) ovPhase(r int) *wgradPhase {
	i := 0
	if dl.ov.Mb[1] == dl {
		i = 1
	}
	return dl.ov.ranks[i][r].wgrad[dl.ov.deferring[i][r]]
}

// MicroBatch is the layer of micro-batch i of c's step: c's weights and
// routing mode, with inputs and routing of its own (micro-batch 0's are
// c's): a random routing's logit overrides drawn from the same
// distribution, from a stream of the micro-batch's own; a trace's tokens
// the ones after micro-batch 0's (see Layer.traceToken).
func MicroBatch(c setup.Config, i int) (*Layer, error) { return NewMicroBatchLayer(c, i, false) }

// NewMicroBatchLayer is micro-batch i's layer: the host's (NewLayer's host) or the
// device's twin.
func NewMicroBatchLayer(c setup.Config, i int, host bool) (*Layer, error) {
	l, err := MakeLayer(c, host)
	if err != nil || i == 0 {
		return l, err
	}
	l.micro, l.micros = i, 2
	for r := range l.X {
		normalInto(l.X[r], c.Seed, fmt.Sprintf("x-micro-batch-%d", i), r, 1)
		if o := l.Override[r]; o != nil { // step 0's (SetRouting draws the others)
			c.Routing.FillLogits(o, c.Seed, r, c.Experts, 0, i)
		}
	}
	return l, nil
}

// bytes is what ov holds on rank r's device beyond micro-batch 0's layer
// (its footprint, in the record already): with a2a the second micro-batch's
// layer, activations, saved tape, gradients of its own and dispatcher
// buffers (its weight gradients are mb0's, counted once); with
// --delay-wgrad the deferred phases' dh1 arenas of both micro-batches.
func (ov *Overlap) bytes(r int) int64 {
	var n int64
	if l := ov.Mb[1]; l != nil && l.Local(r) {
		n += l.Footprint(r)
	}
	for i := range ov.ranks {
		if r < len(ov.ranks[i]) {
			for _, w := range ov.ranks[i][r].wgrad {
				n += w.arena.Bytes
			}
		}
	}
	return n
}

// orderedPhase is a phase as the step issued it: its micro-batch and name.
type orderedPhase struct {
	mb   int
	name string
}

// Order is the last step's issue order as "mb:phase" (tests).
func (ov *Overlap) Order() []string {
	out := make([]string, len(ov.lastOrdered))
	for i, p := range ov.lastOrdered {
		out[i] = fmt.Sprintf("%d:%s", p.mb, p.name)
	}
	return out
}
