package feplb

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/moebench/moebench/balance"
	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
)

// NewDevice returns FEPLB on a kernels.Device over the base dispatcher's
// device implementation, or why it is unavailable. Availability: the base
// must be available, and the devices of a domain's ranks must reach each
// other's memory (peer access, or one GPU: emulated EP), which Bind checks.
func NewDevice(impl string, env dispatchers.Env) (dispatchers.DeviceDispatcher, error) {
	base, dyn, err := options(impl, env)
	if err != nil {
		return nil, err
	}
	if env.Hidden <= 0 || env.FFN <= 0 {
		return nil, fmt.Errorf("feplb: hidden %d and ffn %d must be given (the helpers receive expert weights)", env.Hidden, env.FFN)
	}
	b, err := dispatchers.NewClassicDevice(base, impl, env)
	if err != nil {
		return nil, baseUnavailable(impl, err)
	}
	return &Device{ClassicDevice: b, env: env, dynamic: dyn}, nil
}

// Device is FEPLB on a kernels.Device. Phase 2's copies go on a copy stream
// per rank as kernels.Device.CopyBatch batches (on CUDA the batch copy with
// the hint to use copy engines): a helper's copy stream pulls its chunks'
// rows, probabilities and expert weights from the owners after their phase
// 1, while its own stream computes its static experts. Its dynamic work is
// the chunks first (once the copies have landed), then its own dynamic
// experts' kept share, so that each owner's copy stream can pull the
// chunks' outputs back while both still compute (the order the policy's
// model of the way back assumes, balance's phaseEnds); the owner's combine
// waits for them, then runs the base combine.
//
// Every stream and event of a rank is on its device; copies from another
// rank's device are peer copies.
//
// Proven on kernels.Emu (the output equals the host layer's, also with the
// ranks on several emulated devices); on a GPU nothing here has run yet.
type Device struct {
	dispatchers.ClassicDevice
	env     dispatchers.Env
	dynamic int
	c       *core
	ranks   []*dispatchers.DeviceRank
	rs      []devRank
	ops     []kernels.CopyOp
}

// devRank is one rank's phase-2 state.
type devRank struct {
	ce     kernels.Stream // copy stream: incoming chunks
	origin kernels.Event  // recorded at the rank's permute; its times are read from it
	// dispatched: phase 1 done (the static experts start); staticEnd: the
	// static experts done; ceStart/ready: the incoming copies; computed: the
	// chunks for others computed; backStart/backEnd: the outputs pulled back
	dispatched, staticEnd, ceStart, ready, computed, backStart, backEnd kernels.Event

	fx, fp, fy kernels.Ptr   // rows computed for others: [rows, h] bf16, [rows] fp32, [rows, h] bf16
	w1, w2     kernels.Ptr   // weights of the experts helped: [slots, 2f, h], [slots, h, f]
	rows       kernels.Sized // fx, fp, fy
	slots      kernels.Sized // w1, w2
	work       []dispatchers.DeviceWork
	segs       [3][]dispatchers.DeviceSegment // static, own dynamic, foreign
}

func (f *Device) Name() string { return "feplb" }

// Bind checks that the ranks of each domain reach each other's devices,
// binds the base dispatcher and makes each rank's copy stream and events.
func (f *Device) Bind(shape dispatchers.Shape, ranks []*dispatchers.DeviceRank) error {
	c, err := newCore(f.env, shape, f.dynamic, balance.H100(f.env.Hidden, f.env.FFN))
	if err != nil {
		return err
	}
	d := c.topo.Domain
	for a, ra := range ranks {
		for b, rb := range ranks {
			if a/d == b/d && !ra.Dev.Reaches(rb.Dev) {
				return &dispatchers.UnavailableError{Name: "feplb", Impl: f.Impl(), Reason: fmt.Sprintf(
					"ranks %d and %d share an NVLink domain (%d ranks), but rank %d's GPU has no peer access to rank %d's, which phase 2's copies need (a smaller --domain, or fewer --gpus)",
					a, b, d, a, b)}
			}
		}
	}
	f.c, f.ranks, f.rs = c, ranks, make([]devRank, shape.EP)
	for r := range f.rs {
		s, dev := &f.rs[r], ranks[r].Dev
		if s.ce, err = dev.NewStream(); err != nil {
			return err
		}
		for _, e := range []*kernels.Event{&s.origin, &s.dispatched, &s.staticEnd, &s.ceStart, &s.ready, &s.computed, &s.backStart, &s.backEnd} {
			if *e, err = dev.NewEvent(); err != nil {
				return err
			}
		}
	}
	return f.ClassicDevice.Bind(shape, ranks)
}

// Permute starts a step (on its first rank) and the rank's clock.
func (f *Device) Permute(r int) error {
	if r == 0 {
		f.c.begin()
	}
	if err := f.ranks[r].Dev.Record(f.rs[r].origin, f.ranks[r].Stream); err != nil {
		return err
	}
	return f.ClassicDevice.Permute(r)
}

// Dispatch runs phase 1; after the last rank, every rank's work is its
// static experts, which the layer starts while the scheduler plans.
func (f *Device) Dispatch(r int) error {
	if err := f.ClassicDevice.Dispatch(r); err != nil {
		return err
	}
	rk := f.ranks[r]
	if err := rk.Dev.Record(f.rs[r].dispatched, rk.Stream); err != nil {
		return err
	}
	if !f.c.dispatchedRank(r, rk.ExpertRows) {
		return nil
	}
	L := f.c.shape.LocalExperts()
	for q, rk := range f.ranks {
		s := &f.rs[q]
		static := s.segs[0][:0]
		at := 0
		for l, n := range rk.ExpertRows {
			if e := q*L + l; n > 0 && !f.c.dynamic[e] {
				static = append(static, dispatchers.DeviceSegment{Expert: e, Start: at, Len: n})
			}
			at += n
		}
		s.segs[0] = static
		s.work = append(s.work[:0], dispatchers.DeviceWork{X: rk.ExpertX, Probs: rk.ExpertProbs, Segments: static})
		rk.Work = s.work
	}
	return nil
}

// Rebalance is rank r's phase 2: it waits for the plan, queues the copies of
// the chunks it computes for others on its copy stream, and sets its dynamic
// work: the received chunks once they have landed, then its own share of
// its dynamic experts.
func (f *Device) Rebalance(r int) error {
	rk, s := f.ranks[r], &f.rs[r]
	if err := rk.Dev.Record(s.staticEnd, rk.Stream); err != nil {
		return err
	}
	if err := f.c.plan(); err != nil {
		return err
	}
	in := f.c.lay.in[r]
	if err := f.grow(r, f.c.lay.foreign[r], len(in)); err != nil {
		return err
	}
	own := s.segs[1][:0]
	f.c.ownDynamic(r, func(e, start, n int) { own = append(own, dispatchers.DeviceSegment{Expert: e, Start: start, Len: n}) })
	s.segs[1] = own
	ownWork := dispatchers.DeviceWork{X: rk.ExpertX, Probs: rk.ExpertProbs, Segments: own}
	s.work = append(s.work[:0], ownWork)
	rk.Work = s.work
	if len(in) == 0 {
		return nil
	}
	h, ff := int64(f.c.shape.Hidden), int64(f.env.FFN)
	L := f.c.shape.LocalExperts()
	for i, c := range in {
		if i == 0 || c.owner != in[i-1].owner {
			if err := rk.Dev.Wait(s.ce, f.rs[c.owner].dispatched); err != nil {
				return err
			}
		}
	}
	if err := rk.Dev.Record(s.ceStart, s.ce); err != nil {
		return err
	}
	f.ops = f.ops[:0]
	foreign := s.segs[2][:0]
	for i, c := range in {
		o := f.ranks[c.owner]
		le, slot := int64(c.expert-c.owner*L), int64(i)
		w1, w2 := s.w1+kernels.Ptr(slot*4*ff*h), s.w2+kernels.Ptr(slot*2*h*ff)
		f.ops = append(f.ops,
			kernels.CopyOp{Dst: s.fx + kernels.Ptr(2*int64(c.dst)*h), Src: o.ExpertX + kernels.Ptr(2*int64(c.src)*h), Bytes: 2 * int64(c.n) * h, SrcDev: o.Dev},
			kernels.CopyOp{Dst: s.fp + kernels.Ptr(4*c.dst), Src: o.ExpertProbs + kernels.Ptr(4*c.src), Bytes: 4 * int64(c.n), SrcDev: o.Dev},
			kernels.CopyOp{Dst: w1, Src: o.FC1 + kernels.Ptr(le*4*ff*h), Bytes: 4 * ff * h, SrcDev: o.Dev},
			kernels.CopyOp{Dst: w2, Src: o.FC2 + kernels.Ptr(le*2*h*ff), Bytes: 2 * h * ff, SrcDev: o.Dev})
		foreign = append(foreign, dispatchers.DeviceSegment{Expert: c.expert, Start: c.dst, Len: c.n, FC1: w1, FC2: w2})
	}
	if err := rk.Dev.CopyBatch(f.ops, s.ce); err != nil {
		return fmt.Errorf("feplb: rank %d's incoming copies: %w", r, err)
	}
	if err := rk.Dev.Record(s.ready, s.ce); err != nil {
		return err
	}
	s.segs[2] = foreign
	s.work = append(s.work[:0], dispatchers.DeviceWork{X: s.fx, Probs: s.fp, Y: s.fy, Segments: foreign, After: s.ready, Done: s.computed}, ownWork)
	rk.Work = s.work
	return nil
}

// grow makes rank r's phase-2 buffers hold rows rows and slots experts'
// weights.
func (f *Device) grow(r, rows, slots int) error {
	s, dev := &f.rs[r], f.ranks[r].Dev
	h, ff := int64(f.c.shape.Hidden), int64(f.env.FFN)
	if err := s.rows.Ensure(dev, s.ce, rows, kernels.Buf{P: &s.fx, PerRow: 2 * h}, kernels.Buf{P: &s.fp, PerRow: 4}, kernels.Buf{P: &s.fy, PerRow: 2 * h}); err != nil {
		return err
	}
	return s.slots.Ensure(dev, s.ce, slots, kernels.Buf{P: &s.w1, PerRow: 4 * ff * h}, kernels.Buf{P: &s.w2, PerRow: 2 * h * ff})
}

// Combine pulls the outputs of rank r's moved chunks back from their helpers
// into its ExpertY on its copy stream (each helper's once it has computed
// its chunks, while rank r may still compute its own), makes its stream wait
// for them, then runs the base combine. Every rank's dynamic work, and so
// each helper's computed event, is queued by now.
func (f *Device) Combine(r int) error {
	rk, s, h := f.ranks[r], &f.rs[r], int64(f.c.shape.Hidden)
	if out := f.c.lay.out[r]; len(out) > 0 {
		f.ops = f.ops[:0]
		for i, c := range out {
			if i == 0 || c.helper != out[i-1].helper {
				if err := rk.Dev.Wait(s.ce, f.rs[c.helper].computed); err != nil {
					return err
				}
			}
			f.ops = append(f.ops, kernels.CopyOp{Dst: rk.ExpertY + kernels.Ptr(2*int64(c.src)*h), Src: f.rs[c.helper].fy + kernels.Ptr(2*int64(c.dst)*h),
				Bytes: 2 * int64(c.n) * h, SrcDev: f.ranks[c.helper].Dev})
		}
		if err := rk.Dev.Record(s.backStart, s.ce); err != nil {
			return err
		}
		if err := rk.Dev.CopyBatch(f.ops, s.ce); err != nil {
			return fmt.Errorf("feplb: rank %d's outputs back: %w", r, err)
		}
		if err := rk.Dev.Record(s.backEnd, s.ce); err != nil {
			return err
		}
		if err := rk.Dev.Wait(rk.Stream, s.backEnd); err != nil {
			return err
		}
	}
	return f.ClassicDevice.Combine(r)
}

// RebalanceStats is the last step's rebalance, its copy times read from the
// events (call it after the step's streams are synchronized).
func (f *Device) RebalanceStats() dispatchers.RebalanceStats {
	s := f.c.stats
	var methods []string
	for _, rk := range f.ranks {
		if m := rk.Dev.BatchMethod(); !slices.Contains(methods, m) {
			methods = append(methods, m)
		}
	}
	s.CopyMethod = strings.Join(methods, "; ")
	var in, back, overlap, total float64
	err := func() error {
		for r := range f.rs {
			d, dev := &f.rs[r], f.ranks[r].Dev
			if len(f.c.lay.out[r]) > 0 {
				ms, err := dev.Elapsed(d.backStart, d.backEnd)
				if err != nil {
					return err
				}
				back = max(back, ms)
			}
			if len(f.c.lay.in[r]) == 0 {
				continue
			}
			var t [4]float64 // copies start, land; static experts start, end (from the rank's origin)
			for i, e := range []kernels.Event{d.ceStart, d.ready, d.dispatched, d.staticEnd} {
				ms, err := dev.Elapsed(d.origin, e)
				if err != nil {
					return err
				}
				t[i] = ms
			}
			in = max(in, t[1]-t[0])
			total += t[1] - t[0]
			overlap += max(0, min(t[1], t[3])-max(t[0], t[2]))
		}
		return nil
	}()
	s.CopySeconds = (in + back) / 1e3
	switch {
	case err != nil:
		s.Hidden, s.HiddenNote = math.NaN(), "not measured: "+err.Error()
	case total == 0:
		s.Hidden, s.HiddenNote = math.NaN(), "no copies this step"
	default:
		s.Hidden = overlap / total
		s.HiddenNote = "device events: each helper's incoming copies (its copy stream) against its static experts (its stream, dispatch end to rebalance start), summed over helpers"
	}
	return s
}

// Pause makes the following steps move nothing (or resumes moving).
func (f *Device) Pause(paused bool) { f.c.paused = paused }

// Footprint adds the rank's phase-2 buffers to the base's.
func (f *Device) Footprint(r int) int64 {
	return f.rs[r].rows.Bytes + f.rs[r].slots.Bytes + f.ClassicDevice.Footprint(r)
}

// Close frees the phase-2 buffers and the base's.
func (f *Device) Close() error {
	var first error
	for r := range f.rs {
		s := &f.rs[r]
		if err := kernels.Free(f.ranks[r].Dev, &s.fx, &s.fp, &s.fy, &s.w1, &s.w2); first == nil {
			first = err
		}
		s.rows, s.slots = kernels.Sized{}, kernels.Sized{}
	}
	if err := f.ClassicDevice.Close(); first == nil {
		first = err
	}
	return first
}
