package feplb

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/moebench/moebench/balance"
	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels/device"
)

// NewDevice returns FEPLB on a device.Device over the base dispatcher's
// device implementation, or why it is unavailable. Availability: the base
// must be available, and the devices of a domain's ranks must reach each
// other's memory (peer access, or one GPU: emulated EP), which Bind checks.
func NewDevice(impl string, env dispatchers.Env) (dispatchers.DeviceDispatcher, error) {
	base, err := options(impl, env)
	if err != nil {
		return nil, err
	}
	if env.Hidden <= 0 || env.FFN <= 0 {
		return nil, fmt.Errorf("feplb: hidden %d and ffn %d must be given (the helpers receive expert weights)", env.Hidden, env.FFN)
	}
	b, err := dispatchers.NewDevice(base, impl, env)
	if err != nil {
		return nil, baseUnavailable(impl, err)
	}
	ph, err := classicOf(base, impl, b.Forward(nil), b.Backward(nil))
	if err != nil {
		return nil, baseUnavailable(impl, err)
	}
	return &Device{DeviceDispatcher: b, ph: ph, env: env}, nil
}

// FP8Unavailable: phase 2 copies the owners' dispatched rows as its base
// delivered them (at fp8 packed e4m3 rows with their 1×128 multipliers,
// Shape.DispatchHidden wide) and the helpers' expert phase dequantizes
// them; its base must move fp8 (NewDevice's gate checked it).
func (f *Device) FP8Unavailable(env dispatchers.Env) string {
	if m := f.DeviceDispatcher.Capabilities().FP8; m != nil {
		return m(env)
	}
	return "feplb's base has no FP8 dispatch path on the cuda device"
}

// Device is FEPLB on a device.Device. Phase 2's copies go on a copy stream
// per rank as device.Device.CopyBatch batches (on CUDA the batch copy with
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
// The scheduler plans with rates measured in the run, from the events of
// the steps before (RebalanceStats reads them): the expert GEMMs' rate over
// each rank's static experts and the copies' rate over phase 2's copies;
// until a step has measured them, the H100 roofline stands in on a GPU and
// HostModel's rates on an emulated device.
//
// Proven on device.Emu (the output equals the host layer's, also with the
// ranks on several emulated devices); on a GPU nothing here has run yet.
type Device struct {
	dispatchers.DeviceDispatcher         // the base
	ph                           classic // its phases
	env                          dispatchers.Env
	c                            *core
	ranks                        []*dispatchers.DeviceRank
	rs                           []devRank
	rates                        rates
	packed                       string    // which ranks of a domain share a device, or ""
	fp8w                         bool      // the owners hold FP8 weights (DeviceRank.FP8): phase 2 moves those (fp8wBytes an expert)
	train                        bool      // the ranks have a backward (DeviceRank.DFC1 set): at fp8w it needs the bf16 weight slots
	bk                           []devBack // the backward's, per rank (devbackward.go)
}

// rates sums what the run has measured: the static experts' FLOPs and
// seconds, phase 2's copied bytes and seconds, and the steps they came from.
type rates struct {
	flops, gemmSecs, bytes, copySecs float64
	gemmSteps, copySteps             int
}

// devRank is one rank's phase-2 state.
type devRank struct {
	ce     device.Stream // copy stream: incoming chunks
	origin device.Event  // recorded at the rank's permute; its times are read from it
	// dispatched: phase 1 done (the static experts start); staticEnd: the
	// static experts done; ceStart/ready: the incoming copies; computed: the
	// chunks for others computed; ownEnd: all the rank's own work done;
	// backStart/backEnd: the outputs pulled back
	dispatched, staticEnd, ceStart, ready, computed, ownEnd, backStart, backEnd device.Event

	fx, fp, fy device.Addr        // rows computed for others: [rows, DispatchWidth] as dispatched, [rows] fp32, [rows, h] bf16
	w1, w2     device.Addr        // weights of the experts helped: [slots, 2f, h], [slots, h, f]
	q1, q2     device.Addr        // fp8w: their e4m3 codes, [slots, 2f, h], [slots, h, f] bytes
	s1, s2     device.Addr        // fp8w: their multipliers, [slots, n1], [slots, n2] fp32 (dispatchers.FP8WeightScales)
	rows       device.RowCapacity // fx, fp, fy
	slots      device.RowCapacity // w1, w2 (and q1, q2, s1, s2)
	work       []dispatchers.DeviceWork
	segs       [3][]dispatchers.DeviceSegment // static, own dynamic, foreign
	ops        []device.CopyOp                // scratch of the rank's copies
	// issued: the bytes of the forward phase-2 copies the rank queued this
	// step (its incoming chunks and weights, its outputs back), and the rows
	// it received; Issued sums them
	issued     int64
	issuedRows int
}

func (f *Device) Name() string { return "feplb" }

// Bind checks that the ranks of each domain reach each other's devices,
// binds the base dispatcher and makes each rank's copy stream and events.
func (f *Device) Bind(shape dispatchers.Shape, ranks []*dispatchers.DeviceRank) error {
	m := balance.H100(f.env.Hidden, f.env.FFN)
	if ranks[0].Dev.Name() != "cuda" { // an emulated device: host rates
		m = HostModel(f.env.Hidden, f.env.FFN)
	}
	// at fp8 where the layer's expert GEMMs are FP8 (it set the ranks' FP8
	// weights), phase 2 moves what the FP8 GEMM on the helper reads
	f.fp8w = f.env.IsFP8() && slices.ContainsFunc(ranks, func(rk *dispatchers.DeviceRank) bool { return rk.FP8.Q1 != 0 })
	if f.fp8w {
		m.ExpertBytes = dispatchers.FP8WeightBytes(f.env.Hidden, f.env.FFN)
	}
	f.train = slices.ContainsFunc(ranks, func(rk *dispatchers.DeviceRank) bool { return rk.DFC1 != 0 })
	c, err := newCore(f.env, shape, m)
	if err != nil {
		return err
	}
	c.measure = true
	d := c.topo.Domain
	f.packed = packed(ranks, d)
	for a, ra := range ranks {
		for b, rb := range ranks {
			if a/d == b/d && !ra.Dev.Reaches(rb.Dev) {
				return &dispatchers.UnavailableError{Name: "feplb", Impl: f.Impl(), Reason: fmt.Sprintf(
					"ranks %d and %d share an NVLink domain (%d ranks), but rank %d's GPU has no peer access to rank %d's, which phase 2's copies need (a smaller --domain, or fewer --gpus)",
					a, b, d, a, b)}
			}
		}
	}
	f.c, f.ranks, f.rs, f.bk = c, ranks, make([]devRank, shape.EP), make([]devBack, shape.EP)
	for r := range f.rs {
		s, dev, bk := &f.rs[r], ranks[r].Dev, &f.bk[r]
		if s.ce, err = dev.NewStream(); err != nil {
			return err
		}
		for _, e := range []*device.Event{&s.origin, &s.dispatched, &s.staticEnd, &s.ceStart, &s.ready, &s.computed, &s.ownEnd, &s.backStart, &s.backEnd,
			&bk.dyReady, &bk.dyStart, &bk.dyIn, &bk.computed, &bk.retStart, &bk.returned} {
			if *e, err = dev.NewEvent(); err != nil {
				return err
			}
		}
	}
	return f.DeviceDispatcher.Bind(shape, ranks)
}

// Permute starts a step (on its first rank) and the rank's clock.
func (f *Device) Permute(r int) error {
	if r == 0 {
		f.c.begin()
	}
	f.rs[r].issued, f.rs[r].issuedRows = 0, 0
	if err := f.ranks[r].Dev.Record(f.rs[r].origin, f.ranks[r].Stream); err != nil {
		return err
	}
	return f.ph.Permute(r)
}

// WaitsBefore: where the base dispatcher waits (alltoall: before dispatch).
func (f *Device) WaitsBefore(phase string) bool {
	hw := f.DeviceDispatcher.Capabilities().HostWait
	return hw != nil && hw.Before(phase)
}

// HostWait is the base dispatcher's (alltoall's count exchange), if it has
// one.
func (f *Device) HostWait(phase string, r int) error {
	if hw := f.DeviceDispatcher.Capabilities().HostWait; hw != nil {
		return hw.Wait(phase, r)
	}
	return nil
}

// Dispatch runs phase 1; after the last rank, every rank's work is its
// static experts, which the layer starts while the scheduler plans.
func (f *Device) Dispatch(r int) error {
	if err := f.ph.Dispatch(r); err != nil {
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
	w := int64(f.c.shape.DispatchWidth()) // the owners' ExpertX rows: packed e4m3 rows with their scales at fp8
	L := f.c.shape.LocalExperts()
	n1, n2 := dispatchers.FP8WeightScales(f.env.Hidden, f.env.FFN)
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
	s.ops = s.ops[:0]
	foreign := s.segs[2][:0]
	for i, c := range in {
		o := f.ranks[c.owner]
		le, slot := int64(c.expert-c.owner*L), int64(i)
		w1, w2 := s.w1+device.Addr(slot*4*ff*h), s.w2+device.Addr(slot*2*h*ff)
		s.ops = append(s.ops,
			device.CopyOp{Dst: s.fx + device.Addr(2*int64(c.dst)*w), Src: o.ExpertX + device.Addr(2*int64(c.src)*w), Bytes: 2 * int64(c.n) * w, SrcDev: o.Dev},
			device.CopyOp{Dst: s.fp + device.Addr(4*c.dst), Src: o.ExpertProbs + device.Addr(4*c.src), Bytes: 4 * int64(c.n), SrcDev: o.Dev})
		// the bf16 weights' slots: what the bf16 GEMMs read, and at fp8 the
		// bf16 backward's (the owners push them in combine-bwd,
		// devbackward.go); a forward-only step at fp8 has none (grow)
		sg := dispatchers.DeviceSegment{Expert: c.expert, Start: c.dst, Len: c.n}
		if s.w1 != 0 {
			sg.FC1, sg.FC2 = w1, w2
		}
		if !f.fp8w {
			s.ops = append(s.ops,
				device.CopyOp{Dst: w1, Src: o.FC1 + device.Addr(le*4*ff*h), Bytes: 4 * ff * h, SrcDev: o.Dev},
				device.CopyOp{Dst: w2, Src: o.FC2 + device.Addr(le*2*h*ff), Bytes: 2 * h * ff, SrcDev: o.Dev})
		} else { // what the helper's FP8 GEMM reads: e4m3 codes and 128×128 multipliers
			sg.FP8 = dispatchers.FP8Weights{Q1: s.q1 + device.Addr(slot*2*ff*h), Q2: s.q2 + device.Addr(slot*h*ff),
				S1: s.s1 + device.Addr(slot*4*int64(n1)), S2: s.s2 + device.Addr(slot*4*int64(n2))}
			src1, src2 := o.FP8.S1+device.Addr(le*4*int64(n1)), o.FP8.S2+device.Addr(le*4*int64(n2))
			switch FP8Fault {
			case "": // the e4m3 codes and multipliers as the owner holds them
				s.ops = append(s.ops,
					device.CopyOp{Dst: sg.FP8.Q1, Src: o.FP8.Q1 + device.Addr(le*2*ff*h), Bytes: 2 * ff * h, SrcDev: o.Dev},
					device.CopyOp{Dst: sg.FP8.Q2, Src: o.FP8.Q2 + device.Addr(le*h*ff), Bytes: h * ff, SrcDev: o.Dev},
					device.CopyOp{Dst: sg.FP8.S1, Src: src1, Bytes: 4 * int64(n1), SrcDev: o.Dev},
					device.CopyOp{Dst: sg.FP8.S2, Src: src2, Bytes: 4 * int64(n2), SrcDev: o.Dev})
			case "scale-offset": // tests: each multiplier the next one's, the last its own, as on the host (inside the owner's S1, S2)
				s.ops = append(s.ops,
					device.CopyOp{Dst: sg.FP8.Q1, Src: o.FP8.Q1 + device.Addr(le*2*ff*h), Bytes: 2 * ff * h, SrcDev: o.Dev},
					device.CopyOp{Dst: sg.FP8.Q2, Src: o.FP8.Q2 + device.Addr(le*h*ff), Bytes: h * ff, SrcDev: o.Dev})
				for _, x := range []struct {
					dst, src device.Addr
					n        int64
				}{{sg.FP8.S1, src1, int64(n1)}, {sg.FP8.S2, src2, int64(n2)}} {
					s.ops = append(s.ops, device.CopyOp{Dst: x.dst, Src: x.src + 4, Bytes: 4 * (x.n - 1), SrcDev: o.Dev},
						device.CopyOp{Dst: x.dst + device.Addr(4*(x.n-1)), Src: x.src + device.Addr(4*(x.n-1)), Bytes: 4, SrcDev: o.Dev})
				}
			} // tests: "unmoved", the helper's slots hold whatever they held
		}
		foreign = append(foreign, sg)
	}
	if err := rk.Dev.CopyBatch(s.ops, s.ce); err != nil {
		return fmt.Errorf("feplb: rank %d's incoming copies: %w", r, err)
	}
	s.issued += opBytes(s.ops)
	s.issuedRows += f.c.lay.foreign[r]
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
	w := int64(f.c.shape.DispatchWidth())
	if err := s.rows.Ensure(dev, s.ce, rows, device.RowBuffer{P: &s.fx, PerRow: 2 * w}, device.RowBuffer{P: &s.fp, PerRow: 4}, device.RowBuffer{P: &s.fy, PerRow: 2 * h}); err != nil {
		return err
	}
	var bufs []device.RowBuffer
	if !f.fp8w || f.train { // bf16 weights: what phase 2 moves at bf16; at fp8 the bf16 backward's only
		bufs = append(bufs, device.RowBuffer{P: &s.w1, PerRow: 4 * ff * h}, device.RowBuffer{P: &s.w2, PerRow: 2 * h * ff})
	}
	if f.fp8w {
		n1, n2 := dispatchers.FP8WeightScales(f.env.Hidden, f.env.FFN)
		bufs = append(bufs, device.RowBuffer{P: &s.q1, PerRow: 2 * ff * h}, device.RowBuffer{P: &s.q2, PerRow: h * ff},
			device.RowBuffer{P: &s.s1, PerRow: 4 * int64(n1)}, device.RowBuffer{P: &s.s2, PerRow: 4 * int64(n2)})
	}
	return s.slots.Ensure(dev, s.ce, slots, bufs...)
}

// opBytes is the bytes of a batch of copies.
func opBytes(ops []device.CopyOp) int64 {
	n := int64(0)
	for _, op := range ops {
		n += op.Bytes
	}
	return n
}

// Issued is the last step's forward phase 2 as it was issued, not as
// planned: the bytes of the copies queued (the chunks' rows as the owners
// hold them, DispatchWidth bf16 words a row, so at fp8 with the packed
// rows' 16-byte padding; their fp32 probabilities; the weights; the
// outputs back) and the rows moved. The record's copy_bytes is the plan's
// figure; the two relate exactly as docs/dispatchers/feplb.md states
// ("Bytes counted, bytes issued"), which the tests hold them to.
func (f *Device) Issued() (bytes int64, rows int) {
	for r := range f.rs {
		bytes, rows = bytes+f.rs[r].issued, rows+f.rs[r].issuedRows
	}
	return bytes, rows
}

// FP8Fault, set by tests alone, breaks phase 2's FP8 weight move on
// purpose: "scale-offset", the helper's multipliers copied from the home
// copy one float off (each block gets the next block's, the last its own;
// every read inside the owner's multipliers); "unmoved", the e4m3 weights
// not copied at all. Both act on every step, on fresh and reused slots.
var FP8Fault string

// Combine pulls the outputs of rank r's moved chunks back from their helpers
// into its ExpertY on its copy stream (each helper's once it has computed
// its chunks, while rank r may still compute its own), makes its stream wait
// for them, then runs the base combine. Every rank's dynamic work, and so
// each helper's computed event, is queued by now.
func (f *Device) Combine(r int) error {
	rk, s, h := f.ranks[r], &f.rs[r], int64(f.c.shape.Hidden)
	if out := f.c.lay.out[r]; len(out) > 0 {
		s.ops = s.ops[:0]
		for i, c := range out {
			if i == 0 || c.helper != out[i-1].helper {
				if err := rk.Dev.Wait(s.ce, f.rs[c.helper].computed); err != nil {
					return err
				}
			}
			s.ops = append(s.ops, device.CopyOp{Dst: rk.ExpertY + device.Addr(2*int64(c.src)*h), Src: f.rs[c.helper].fy + device.Addr(2*int64(c.dst)*h),
				Bytes: 2 * int64(c.n) * h, SrcDev: f.ranks[c.helper].Dev})
		}
		if err := rk.Dev.Record(s.backStart, s.ce); err != nil {
			return err
		}
		if err := rk.Dev.CopyBatch(s.ops, s.ce); err != nil {
			return fmt.Errorf("feplb: rank %d's outputs back: %w", r, err)
		}
		s.issued += opBytes(s.ops)
		if err := rk.Dev.Record(s.backEnd, s.ce); err != nil {
			return err
		}
		if err := rk.Dev.Record(s.ownEnd, rk.Stream); err != nil {
			return err
		}
		if err := rk.Dev.Wait(rk.Stream, s.backEnd); err != nil {
			return err
		}
	}
	return f.ph.Combine(r)
}

// RebalanceStats is the last step's rebalance, its times read from the
// events (call it after the step's streams are synchronized; every step's
// call also feeds the rates the scheduler plans the next steps with).
func (f *Device) RebalanceStats() dispatchers.RebalanceStats {
	s := f.c.stats
	var methods []string
	for _, rk := range f.ranks {
		if m := rk.Dev.BatchMethod(); !slices.Contains(methods, m) {
			methods = append(methods, m)
		}
	}
	s.CopyMethod = strings.Join(methods, "; ")
	if f.packed != "" {
		s.Note += "; " + f.packed
	}
	st, err := f.stepTimes()
	s.CopySeconds = st.in + st.back
	switch {
	case err != nil:
		s.Exposed, s.ExposedNote = math.NaN(), "not measured: "+err.Error()
	case !st.copied:
		s.Exposed, s.ExposedNote = math.NaN(), "no copies this step"
	default:
		s.Exposed = st.exposed
		s.ExposedNote = "device events: per rank, its stream's wait for its incoming copies after its static experts (ready − static end, at least 0) plus its wait for its outputs back after its own work (back end − own end, at least 0); the slowest rank's"
	}
	if f.bk[0].ran {
		s.BackwardCopyBytes, s.WGradBytes = f.backBytes()
		if s.BackwardCopySeconds, err = f.backCopySeconds(); err != nil {
			s.Note += "; the backward's copy time was not measured: " + err.Error()
		}
	}
	if err == nil {
		if err := f.learn(st); err != nil {
			s.Note += "; the measured rates were not applied: " + err.Error()
		}
	}
	return s
}

// stepTimes is what the last step's events say.
type stepTimes struct {
	in, back, exposed float64 // seconds: the slowest helper's incoming copies, the slowest owner's outputs back, the slowest rank's wait
	copied            bool
	flops, gemmSecs   float64 // static experts, all ranks
	bytes, copySecs   float64 // phase 2's copies, all ranks
}

func (f *Device) stepTimes() (stepTimes, error) {
	var st stepTimes
	h, dw := float64(f.c.shape.Hidden), float64(f.c.shape.DispatchWidth())
	wb := float64(f.c.model.WeightBytes()) // an expert's weights as moved (fp8w: its e4m3 codes and multipliers)
	for r := range f.rs {
		d, dev := &f.rs[r], f.ranks[r].Dev
		at := func(es ...device.Event) ([]float64, error) { // seconds from the rank's origin
			t := make([]float64, len(es))
			for i, e := range es {
				ms, err := dev.Elapsed(d.origin, e)
				if err != nil {
					return nil, err
				}
				t[i] = ms / 1e3
			}
			return t, nil
		}
		static, err := at(d.dispatched, d.staticEnd)
		if err != nil {
			return st, err
		}
		rows := 0
		for _, sg := range d.segs[0] {
			rows += sg.Len
		}
		if rows > 0 && static[1] > static[0] {
			st.flops += 6 * h * float64(f.env.FFN) * float64(rows)
			st.gemmSecs += static[1] - static[0]
		}
		wait := 0.0
		if in := f.c.lay.in[r]; len(in) > 0 {
			t, err := at(d.ceStart, d.ready)
			if err != nil {
				return st, err
			}
			st.copied = true
			st.in = max(st.in, t[1]-t[0])
			st.copySecs += t[1] - t[0]
			for _, c := range in {
				st.bytes += float64(c.n)*(2*dw+4) + wb
			}
			wait += max(0, t[1]-static[1]) // copies landed after the static experts
		}
		if out := f.c.lay.out[r]; len(out) > 0 {
			t, err := at(d.backStart, d.backEnd, d.ownEnd)
			if err != nil {
				return st, err
			}
			st.copied = true
			st.back = max(st.back, t[1]-t[0])
			st.copySecs += t[1] - t[0]
			for _, c := range out {
				st.bytes += float64(c.n) * 2 * h
			}
			wait += max(0, t[1]-t[2]) // outputs back after the rank's own work
		}
		st.exposed = max(st.exposed, wait)
	}
	return st, nil
}

// learn adds a step's measurements to the run's rates and makes the
// scheduler plan with them.
func (f *Device) learn(st stepTimes) error {
	r := &f.rates
	if st.gemmSecs > 0 {
		r.flops, r.gemmSecs, r.gemmSteps = r.flops+st.flops, r.gemmSecs+st.gemmSecs, r.gemmSteps+1
	}
	if st.copySecs > 0 {
		r.bytes, r.copySecs, r.copySteps = r.bytes+st.bytes, r.copySecs+st.copySecs, r.copySteps+1
	}
	if r.gemmSteps == 0 {
		return nil
	}
	m := f.c.model
	m.GEMMRate = r.flops / r.gemmSecs
	src := fmt.Sprintf("rates measured in this run: expert GEMMs %.4g TFLOP/s (static experts of %d steps)", m.GEMMRate/1e12, r.gemmSteps)
	if r.copySteps > 0 {
		m.CE = r.bytes / r.copySecs
		src += fmt.Sprintf(", copies %.4g GB/s (phase 2 of %d steps)", m.CE/1e9, r.copySteps)
	} else {
		src += fmt.Sprintf(", copies at %.4g GB/s (not yet measured)", m.CE/1e9)
	}
	m.RateSource = src
	return f.c.setModel(m)
}

// packed says which ranks of an NVLink domain share one device (emulated
// EP), where moving work between them cannot shorten that device's work.
func packed(ranks []*dispatchers.DeviceRank, domain int) string {
	var groups []string
	for lo := 0; lo < len(ranks); {
		hi := lo + 1
		for hi < len(ranks) && hi%domain != 0 && ranks[hi].Dev == ranks[lo].Dev {
			hi++
		}
		if hi-lo > 1 {
			groups = append(groups, fmt.Sprintf("%d–%d", lo, hi-1))
		}
		lo = hi
	}
	if groups == nil {
		return ""
	}
	return fmt.Sprintf("ranks %s share one GPU each (packed, emulated EP): moving work between ranks of one GPU cannot shorten that GPU's work, so these per-rank figures do not show what a GPU per rank would gain", strings.Join(groups, ", "))
}

// Pause makes the following steps move nothing (or resumes moving).
func (f *Device) Pause(paused bool) { f.c.paused = paused }

// Footprint adds the rank's phase-2 buffers to the base's.
func (f *Device) Footprint(r int) int64 {
	bk := &f.bk[r]
	return f.rs[r].rows.Bytes + f.rs[r].slots.Bytes + bk.rows.Bytes + bk.slots.Bytes + bk.back.Bytes + f.DeviceDispatcher.Footprint(r)
}

// Close frees the phase-2 buffers and the base's.
func (f *Device) Close() error {
	var first error
	for r := range f.rs {
		s := &f.rs[r]
		bk := &f.bk[r]
		if err := device.Free(f.ranks[r].Dev, &s.fx, &s.fp, &s.fy, &s.w1, &s.w2, &s.q1, &s.q2, &s.s1, &s.s2, &bk.dx, &bk.dp, &bk.g1, &bk.g2, &bk.w1, &bk.w2); first == nil {
			first = err
		}
		s.rows, s.slots = device.RowCapacity{}, device.RowCapacity{}
		bk.rows, bk.slots, bk.back = device.RowCapacity{}, device.RowCapacity{}, device.RowCapacity{}
	}
	if err := f.DeviceDispatcher.Close(); first == nil {
		first = err
	}
	return first
}

// Forward is the base's steps with phase 2 after the static experts, as
// the host's.
func (f *Device) Forward(experts func(rank int) error) []dispatchers.Step {
	return forward(experts, f.Permute, f.Dispatch, f.Rebalance, f.Combine, f.ph.Unpermute)
}

// Backward is their duals in the reverse order (devbackward.go).
func (f *Device) Backward(experts func(rank int) error) []dispatchers.Step {
	return backward(experts, f.UnpermuteBackward, f.CombineBackward, f.RebalanceBackward, f.DispatchBackward, f.PermuteBackward)
}

// Capabilities: fp8 as its base moves it, the rebalance, and its base's
// host waits (none where the base has none).
func (f *Device) Capabilities() dispatchers.Capabilities {
	return dispatchers.Capabilities{FP8: f.FP8Unavailable, Rebalance: &dispatchers.Rebalance{Stats: f.RebalanceStats, Pause: f.Pause},
		HostWait: &dispatchers.HostWait{Before: f.WaitsBefore, Wait: f.HostWait}}
}
