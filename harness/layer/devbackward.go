package layer

import (
	"fmt"
	"math"
	"runtime"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// The layer's backward on device.Device values (the device form of backward.go,
// kernels/BACKWARD.md): the device dispatcher's backward phases around the
// experts' backward (dgrad and wgrad through Device.MatMul, the SwiGLU×prob
// backward kernel), then the router's (score backward, the fp32 router's
// two products, its weight gradient rounded to bf16 and added to its
// main_grad) and the shared expert's, the last phase followed by the input
// gradient's three-part add (B8). The forward keeps each computed
// segment's fc1 output and activation (devTape); the weight gradients are
// fp32 main_grad on each rank, zeroed at the start of every step as
// zero_grad does.

// devGrads are one rank's backward buffers (besides the DeviceRank's).
type devGrads struct {
	xf32               device.Addr // [T, h] fp32 copy of the input: the fp32 router's backward operand
	dlogits            device.Addr // [T, E] fp32
	dxRouter           device.Addr // [T, h] fp32 (B6 rounds it in the input gradient's add)
	dwr, routerGrad    device.Addr // [E, h] fp32: the step's router weight gradient; the rank's main_grad of it
	sdact, sdh1        device.Addr // shared expert: [T, fs], [T, 2fs] bf16
	sfc1Grad, sfc2Grad device.Addr // shared expert main_grad [2fs, h], [h, fs] fp32
	dxShared           device.Addr // [T, h] bf16
	dx                 device.Addr // [T, h] bf16: the input gradient
	fixed              int64       // bytes of the buffers above, DY, DFC1 and DFC2

	dact, dh1 device.Addr        // expert backward scratch: [rows, f], [rows, 2f] bf16
	scratch   device.RowCapacity // dact, dh1
	expert    device.RowCapacity // the DeviceRank's ExpertDX, ExpertDProbs
	tape      devTape
}

// devTape is what a rank's forward keeps of its expert phases: each
// phase's fc1 outputs and activations in an arena of its own, and where
// each segment the phase computed has its rows.
type devTape struct {
	arenas []tapeArena // one per expert phase of the step
	calls  int         // expert phases run in this step
	at     int         // rows of the current arena given out
	segs   []tapedSeg
}

type tapeArena struct {
	h1, act device.Addr // [rows, 2f], [rows, f] bf16
	xd      device.Addr // at fp8: [rows, h] bf16, the dequantized rows the forward's fc1 read
	size    device.RowCapacity
}

// tapedSeg is a computed segment: rows [start, start+n) of the block whose
// inputs are at x, by expert, its h1 and act rows at h1 and act.
type tapedSeg struct {
	x             device.Addr
	expert, start int
	n             int
	h1, act       device.Addr
	fc1, fc2      device.Addr // the segment's weights (0: the rank's own)
	xd            device.Addr // at fp8: the segment's dequantized rows [n, h] (0: x's rows are bf16)
}

// trains says whether the device layer runs the backward: the layer is
// not forward-only and the dispatcher's device implementation has one.
func trains(c setup.Config, d dispatchers.DeviceDispatcher) bool {
	return !c.ForwardOnly && d.Capabilities().NoBackward == ""
}

// drawDOuts draws every rank's upstream gradient into the host twin (in
// a run over several processes the other processes' ranks' too: the
// gradient reference of this process's experts takes every token).
func drawDOuts(l *Layer) {
	l.DOut = make([][]float32, l.Cfg.EP)
	ParallelFor(l.Cfg.EP, runtime.GOMAXPROCS(0), func(_, r int) { l.DOut[r] = DrawOutputGrad(l.Cfg, r) })
}

// newDeviceBackward allocates what rank r's backward needs and uploads its
// upstream gradient (drawDOuts drew it).
func (dl *DeviceLayer) newDeviceBackward(r int) error {
	l, rk, g := dl.Layer, dl.Ranks[r], &dl.RankBufs[r].g
	c := l.Cfg
	T, h, f, E := c.Tokens, c.Hidden, c.FFN, c.Experts
	fs, L := f*c.SharedExperts, l.Shape.LocalExperts()
	bufs := []device.RowBuffer{{P: &rk.DY, PerRow: int64(2 * T * h)}, {P: &rk.DFC1, PerRow: int64(4 * L * 2 * f * h)}, {P: &rk.DFC2, PerRow: int64(4 * L * h * f)},
		{P: &g.dx, PerRow: int64(2 * T * h)}}
	if l.RouterGrad() {
		bufs = append(bufs, device.RowBuffer{P: &g.xf32, PerRow: int64(4 * T * h)}, device.RowBuffer{P: &g.dlogits, PerRow: int64(4 * T * E)},
			device.RowBuffer{P: &g.dxRouter, PerRow: int64(4 * T * h)}, device.RowBuffer{P: &g.dwr, PerRow: int64(4 * E * h)}, device.RowBuffer{P: &g.routerGrad, PerRow: int64(4 * E * h)})
	}
	if fs > 0 {
		bufs = append(bufs, device.RowBuffer{P: &g.sdact, PerRow: int64(2 * T * fs)}, device.RowBuffer{P: &g.sdh1, PerRow: int64(4 * T * fs)},
			device.RowBuffer{P: &g.sfc1Grad, PerRow: int64(4 * 2 * fs * h)}, device.RowBuffer{P: &g.sfc2Grad, PerRow: int64(4 * h * fs)}, device.RowBuffer{P: &g.dxShared, PerRow: int64(2 * T * h)})
	}
	held, err := device.Resize(rk.Dev, 1, bufs...)
	if g.fixed = held; err != nil {
		return err
	}
	if err := rk.Dev.Upload(rk.DY, kernels.BF16Bits(l.DOut[r]), rk.Stream); err != nil {
		return err
	}
	if g.xf32 != 0 {
		return rk.Dev.Upload(g.xf32, l.X[r], rk.Stream) // bf16 values: the input as the router's fp32 sees it
	}
	return nil
}

// DrawOutputGrad is rank r's upstream gradient, bf16 values drawn from the seed
// (the same on every device).
func DrawOutputGrad(c setup.Config, r int) []float32 {
	return normal(c.Seed, "dout", r, c.Tokens*c.Hidden, 1)
}

// deviceBackwardSteps are the backward's phases, in autograd's order (see
// Layer.backwardSteps), the last followed by the input gradient.
func (dl *DeviceLayer) deviceBackwardSteps() ([]dispatchers.Step, error) {
	s := dl.Dispatcher.Backward(dl.expertsBackward)
	var router, shared func(int) error
	if dl.Layer.RouterGrad() {
		router = dl.routerBackward
	}
	if dl.dc[0].sfc1 != 0 {
		shared = dl.sharedBackward
	}
	return layerBackward(s, router, shared, dl.inputGrad), nil
}

// zeroGrads queues rank r's zero_grad: its weight gradients' main_grad.
func (dl *DeviceLayer) zeroGrads(r int) error {
	rk, g, c := dl.Ranks[r], &dl.RankBufs[r].g, dl.Layer.Cfg
	h, f, E, L := c.Hidden, c.FFN, c.Experts, dl.Layer.Shape.LocalExperts()
	fs := f * c.SharedExperts
	for _, b := range []struct {
		p     device.Addr
		words int
	}{{rk.DFC1, 2 * L * 2 * f * h}, {rk.DFC2, 2 * L * h * f}, {g.routerGrad, 2 * E * h}, {g.sfc1Grad, 2 * 2 * fs * h}, {g.sfc2Grad, 2 * h * fs}} {
		if b.p != 0 {
			if err := rk.Dev.Fill16(b.p, 0, int64(b.words), rk.Stream); err != nil {
				return err
			}
		}
	}
	return nil
}

// tapeRows gives the forward's block of rows [lo, hi) of work w its place
// in the current expert phase's arena (beginTape sized it) and notes its
// segments; it returns where the block's h1 and act rows go.
func (dl *DeviceLayer) tapeRows(r int, w *dispatchers.DeviceWork, lo, hi int) (h1, act, xd device.Addr) {
	t, f, h := &dl.RankBufs[r].g.tape, int64(dl.Layer.Cfg.FFN), int64(dl.Layer.Cfg.Hidden)
	a := &t.arenas[t.calls-1]
	h1, act = a.h1+device.Addr(4*f*int64(t.at)), a.act+device.Addr(2*f*int64(t.at))
	if a.xd != 0 {
		xd = a.xd + device.Addr(2*h*int64(t.at))
	}
	for _, sg := range w.Segments {
		if sg.Len > 0 {
			o := int64(sg.Start - lo)
			ts := tapedSeg{x: w.X, expert: sg.Expert, start: sg.Start, n: sg.Len, h1: h1 + device.Addr(4*f*o), act: act + device.Addr(2*f*o),
				fc1: sg.FC1, fc2: sg.FC2}
			if xd != 0 {
				ts.xd = xd + device.Addr(2*h*o)
			}
			t.segs = append(t.segs, ts)
		}
	}
	t.at += hi - lo
	return h1, act, xd
}

// beginTape opens an arena for an expert phase of the forward that
// computes work: as many rows as its blocks span.
func (dl *DeviceLayer) beginTape(r int, work []dispatchers.DeviceWork) error {
	rk, t := dl.Ranks[r], &dl.RankBufs[r].g.tape
	rows := 0
	for _, w := range work {
		lo, hi := span(w.Segments)
		rows += max(hi-lo, 0)
	}
	if t.calls == len(t.arenas) {
		t.arenas = append(t.arenas, tapeArena{})
	}
	a := &t.arenas[t.calls]
	t.calls, t.at = t.calls+1, 0
	f := int64(dl.Layer.Cfg.FFN)
	bufs := []device.RowBuffer{{P: &a.h1, PerRow: 4 * f}, {P: &a.act, PerRow: 2 * f}}
	if dl.Layer.Cfg.IsFP8() {
		bufs = append(bufs, device.RowBuffer{P: &a.xd, PerRow: 2 * int64(dl.Layer.Cfg.Hidden)})
	}
	return a.size.Ensure(rk.Dev, rk.Stream, rows, bufs...)
}

// span is the rows [lo, hi) from the first segment with rows to the end of
// the last; hi is 0 when none has rows.
func span(segs []dispatchers.DeviceSegment) (lo, hi int) {
	lo = math.MaxInt
	for _, sg := range segs {
		if sg.Len > 0 {
			lo, hi = min(lo, sg.Start), max(hi, sg.Start+sg.Len)
		}
	}
	return lo, hi
}

// endTape forgets the step's tape (after its backward).
func (dl *DeviceLayer) endTape(r int) {
	t := &dl.RankBufs[r].g.tape
	t.calls, t.at, t.segs = 0, 0, t.segs[:0]
}

// taped is the forward's record of segment sg of the block at x.
func (t *devTape) taped(x device.Addr, sg dispatchers.DeviceSegment) (tapedSeg, bool) {
	for _, s := range t.segs {
		if s.x == x && s.expert == sg.Expert && s.start == sg.Start && s.n == sg.Len {
			return s, true
		}
	}
	return tapedSeg{}, false
}

// bytes are the rank's backward buffers' bytes: the gradients, the
// expert backward's scratch and the tape.
func (g *devGrads) bytes() int64 { return g.fixed + g.scratch.Bytes + g.expert.Bytes + g.tape.bytes() }

func (t *devTape) bytes() int64 {
	var n int64
	for _, a := range t.arenas {
		n += a.size.Bytes
	}
	return n
}

// expertsBackward runs the backward of rank r's current work (Work; nil:
// every row of ExpertX with its own experts), block by block, from the
// tape its forward kept.
func (dl *DeviceLayer) expertsBackward(r int) error {
	rk, g, h := dl.Ranks[r], &dl.RankBufs[r].g, int64(dl.Layer.Cfg.Hidden)
	if err := g.expert.Ensure(rk.Dev, rk.Stream, rk.Rows(), device.RowBuffer{P: &rk.ExpertDX, PerRow: 2 * h}, device.RowBuffer{P: &rk.ExpertDProbs, PerRow: 4}); err != nil {
		return err
	}
	work := rk.Work
	if work == nil {
		work = dl.wholeWork(r)
	}
	for i := range work {
		w := &work[i]
		if err := dl.blockBackward(r, w); err != nil {
			return err
		}
		if w.Done != nil {
			if err := rk.Dev.Record(w.Done, rk.Stream); err != nil {
				return err
			}
		}
	}
	return nil
}

// blockBackward queues the backward of one block, segment by segment:
//
//	dact  = dy · fc2          (B2)      dFC2 += dyᵀ · act
//	dh1, dprob = SwiGLU×prob backward (B3)
//	dFC1 += dh1ᵀ · x                    dx    = dh1 · fc1  (B4)
func (dl *DeviceLayer) blockBackward(r int, w *dispatchers.DeviceWork) error {
	c, rk, g := dl.Layer.Cfg, dl.Ranks[r], &dl.RankBufs[r].g
	h, f, L := c.Hidden, c.FFN, dl.Layer.Shape.LocalExperts()
	dy, dx, dp := or(w.DY, rk.ExpertDY), or(w.DX, rk.ExpertDX), or(w.DProbs, rk.ExpertDProbs)
	most := 0
	for _, sg := range w.Segments {
		most = max(most, sg.Len)
	}
	if most == 0 {
		return nil
	}
	if w.After != nil {
		if err := rk.Dev.Wait(rk.Stream, w.After); err != nil {
			return err
		}
	}
	if err := g.scratch.Ensure(rk.Dev, rk.Stream, most, device.RowBuffer{P: &g.dact, PerRow: 2 * int64(f)}, device.RowBuffer{P: &g.dh1, PerRow: 4 * int64(f)}); err != nil {
		return err
	}
	row := func(p device.Addr, at, width, size int) device.Addr {
		return p + device.Addr(int64(at)*int64(width)*int64(size))
	}
	for _, sg := range w.Segments {
		if sg.Len == 0 {
			continue
		}
		tp, ok := g.tape.taped(w.X, sg)
		if !ok {
			return fmt.Errorf("segment of expert %d, rows [%d, %d): the forward computed no such segment, so it kept no tape for it", sg.Expert, sg.Start, sg.Start+sg.Len)
		}
		fc1, fc2, dfc1, dfc2 := sg.FC1, sg.FC2, sg.DFC1, sg.DFC2
		if (fc1 == 0) != (dfc1 == 0) || tp.fc1 != fc1 || tp.fc2 != fc2 {
			return fmt.Errorf("segment of expert %d on rank %d: weights %#x, gradients %#x, the forward's weights %#x (a segment with weights of its own needs its own gradients)", sg.Expert, r, fc1, dfc1, tp.fc1)
		}
		if fc1 == 0 {
			le := sg.Expert - r*L
			if le < 0 || le >= L {
				return fmt.Errorf("segment of expert %d has no weights and the expert is not local to rank %d", sg.Expert, r)
			}
			fc1, fc2 = row(rk.FC1, le, 2*f*h, 2), row(rk.FC2, le, h*f, 2)
			dfc1, dfc2 = row(rk.DFC1, le, 2*f*h, 4), row(rk.DFC2, le, h*f, 4)
		}
		n, ydy, x := sg.Len, row(dy, sg.Start, h, 2), row(w.X, sg.Start, h, 2)
		if tp.xd != 0 { // fp8: the dequantized rows the forward read
			x = tp.xd
		}
		prob, dprob := device.Addr(0), device.Addr(0)
		if w.Probs != 0 {
			prob, dprob = row(w.Probs, sg.Start, 1, 4), row(dp, sg.Start, 1, 4)
		}
		dh1 := dl.wgradDH1(r, n) // g.dh1, or rows of their own when the wgrad is deferred (overlap.go)
		for _, op := range []func() error{
			func() error { return rk.Dev.MatMul(device.NN(g.dact, ydy, fc2, n, f, h), rk.Stream) },
			func() error { return dl.wgrad(r, device.TNAdd(dfc2, ydy, tp.act, h, f, n), sg.DFC1 != 0) },
			func() error { return rk.Dev.SwiGLUBackward(dh1, dprob, g.dact, tp.h1, prob, n, f, rk.Stream) },
			func() error { return dl.wgrad(r, device.TNAdd(dfc1, dh1, x, 2*f, h, n), sg.DFC1 != 0) },
			func() error {
				return rk.Dev.MatMul(device.NN(row(dx, sg.Start, h, 2), dh1, fc1, n, h, 2*f), rk.Stream)
			},
		} {
			if err := op(); err != nil {
				return err
			}
		}
	}
	return nil
}

// or is p, or def when p is 0.
func or(p, def device.Addr) device.Addr {
	if p == 0 {
		return def
	}
	return p
}

// routerBackward is rank r's score-function backward and the fp32 router
// GEMM's: dlogits from DProbs, the input's part (B6 when it is added) and
// the weight's, rounded to bf16 and added to the router's main_grad (B7).
func (dl *DeviceLayer) routerBackward(r int) error {
	c, rk, b, g := dl.Layer.Cfg, dl.Ranks[r], &dl.RankBufs[r], &dl.RankBufs[r].g
	T, h, E := c.Tokens, c.Hidden, c.Experts
	if err := rk.Dev.ScoreBackward(dl.Layer.Router, g.dlogits, b.Logits, rk.DProbs, rk.Idx, T, rk.Stream); err != nil {
		return err
	}
	wr := dl.dc[dl.on[r]].wrf32
	dx := device.MatMul{C: g.dxRouter, A: g.dlogits, B: wr}
	dx.M, dx.N, dx.K, dx.F32In, dx.F32Out = T, h, E, true, true
	dw := device.MatMul{C: g.dwr, A: g.dlogits, B: g.xf32}
	dw.M, dw.N, dw.K, dw.TransA, dw.F32In, dw.F32Out = E, h, T, true, true, true
	for _, mm := range []device.MatMul{dx, dw} {
		if err := rk.Dev.MatMul(mm, rk.Stream); err != nil {
			return err
		}
	}
	return rk.Dev.AddF32(g.routerGrad, g.dwr, E*h, true, rk.Stream)
}

// sharedBackward is rank r's shared expert's backward: its output gradient
// is DY itself, its tape the forward's sh1 and sact.
func (dl *DeviceLayer) sharedBackward(r int) error {
	c, rk, b, g, m := dl.Layer.Cfg, dl.Ranks[r], &dl.RankBufs[r], &dl.RankBufs[r].g, &dl.dc[dl.on[r]]
	T, h, fs, x := c.Tokens, c.Hidden, c.FFN*c.SharedExperts, dl.input(r)
	for _, op := range []func() error{
		func() error { return rk.Dev.MatMul(device.NN(g.sdact, rk.DY, m.sfc2, T, fs, h), rk.Stream) },
		func() error { return rk.Dev.MatMul(device.TNAdd(g.sfc2Grad, rk.DY, b.sact, h, fs, T), rk.Stream) },
		func() error { return rk.Dev.SwiGLUBackward(g.sdh1, 0, g.sdact, b.sh1, 0, T, fs, rk.Stream) },
		func() error { return rk.Dev.MatMul(device.TNAdd(g.sfc1Grad, g.sdh1, x, 2*fs, h, T), rk.Stream) },
		func() error { return rk.Dev.MatMul(device.NN(g.dxShared, g.sdh1, m.sfc1, T, h, 2*fs), rk.Stream) },
	} {
		if err := op(); err != nil {
			return err
		}
	}
	return nil
}

// inputGrad is rank r's input gradient (B8), the end of its backward.
func (dl *DeviceLayer) inputGrad(r int) error {
	c, rk, g := dl.Layer.Cfg, dl.Ranks[r], &dl.RankBufs[r].g
	defer dl.endTape(r)
	router := device.Addr(0)
	if dl.Layer.RouterGrad() {
		router = g.dxRouter
	}
	return rk.Dev.InputGrad(g.dx, rk.DX, router, g.dxShared, c.Tokens*c.Hidden, rk.Stream)
}

// PoisonGrads fills with NaN every gradient buffer rank r's backward
// writes rather than adds to, where it is allocated (sized for the step
// before).
func (dl *DeviceLayer) PoisonGrads(r int) error {
	c, rk, g := dl.Layer.Cfg, dl.Ranks[r], &dl.RankBufs[r].g
	T, h, E, k := c.Tokens, c.Hidden, c.Experts, c.TopK
	n := rk.Rows()
	for _, b := range []struct {
		p     device.Addr
		words int
	}{{g.dx, T * h}, {g.dxShared, T * h}, {g.dxRouter, 2 * T * h}, {g.dlogits, 2 * T * E}, {g.dwr, 2 * E * h},
		{rk.DX, T * h}, {rk.DProbs, 2 * T * k}, {rk.ExpertDY, n * h}, {rk.ExpertDX, n * h}, {rk.ExpertDProbs, 2 * n}} {
		if b.p != 0 && b.words > 0 {
			if err := rk.Dev.Fill16(b.p, 0x7fc0, int64(b.words), rk.Stream); err != nil {
				return err
			}
		}
	}
	return nil
}

// DownloadGrads copies the last step's gradients into the host twin, as
// the gradient check reads them: each of this process's ranks' input
// gradient and probability gradients, and the router's and shared
// expert's main_grad summed over its ranks in rank order (as the host
// layer's replicas sum them); in a run over several processes those sums
// are then summed over the processes (sumOverProcesses, a data-parallel
// all-reduce over NCCL), so that every process holds the whole run's.
func (dl *DeviceLayer) DownloadGrads() error {
	l, c := dl.Layer, dl.Layer.Cfg
	T, h, E, fs := c.Tokens, c.Hidden, c.Experts, c.FFN*c.SharedExperts
	l.Grads = make([]rankGrads, c.EP)
	l.Replica = replicaGrads{Router: make([]float32, E*h)}
	if fs > 0 {
		l.Replica.Shared = dispatchers.ExpertWeights{FC1: make([]float32, 2*fs*h), FC2: make([]float32, h*fs)}
	}
	dx := make([]uint16, T*h)
	add := func(dst []float32, src device.Addr, rk *dispatchers.DeviceRank) error {
		v := make([]float32, len(dst))
		if err := rk.Dev.Download(v, src, rk.Stream); err != nil {
			return err
		}
		for i, x := range v {
			dst[i] += x
		}
		return nil
	}
	for r, rk := range dl.Ranks {
		if !dl.Local(r) {
			continue
		}
		g, hr := &dl.RankBufs[r].g, l.Ranks[r]
		if err := rk.Dev.Download(dx, g.dx, rk.Stream); err != nil {
			return err
		}
		l.Grads[r].Dx = kernels.FromBF16Bits(dx)
		hr.DProbs = make([]float32, T*c.TopK)
		if err := rk.Dev.Download(hr.DProbs, rk.DProbs, rk.Stream); err != nil {
			return err
		}
		if l.RouterGrad() {
			if err := add(l.Replica.Router, g.routerGrad, rk); err != nil {
				return err
			}
		}
		if fs > 0 {
			if err := add(l.Replica.Shared.FC1, g.sfc1Grad, rk); err != nil {
				return err
			}
			if err := add(l.Replica.Shared.FC2, g.sfc2Grad, rk); err != nil {
				return err
			}
		}
	}
	if dl.Distributed == nil {
		return nil
	}
	sums := [][]float32{l.Replica.Shared.FC1, l.Replica.Shared.FC2}
	if l.RouterGrad() {
		sums = append(sums, l.Replica.Router)
	}
	for _, v := range sums {
		if err := dl.sumOverProcesses(v); err != nil {
			return err
		}
	}
	return nil
}

// ExpertGrads downloads expert e's weight gradients from its owner.
func (dl *DeviceLayer) ExpertGrads(e int) (dispatchers.ExpertWeights, error) {
	c := dl.Layer.Cfg
	h, f, L := c.Hidden, c.FFN, dl.Layer.Shape.LocalExperts()
	rk, le := dl.Ranks[e/L], int64(e%L)
	g := dispatchers.ExpertWeights{FC1: make([]float32, 2*f*h), FC2: make([]float32, h*f)}
	if err := rk.Dev.Download(g.FC1, rk.DFC1+device.Addr(le*4*int64(2*f*h)), rk.Stream); err != nil {
		return g, err
	}
	return g, rk.Dev.Download(g.FC2, rk.DFC2+device.Addr(le*4*int64(h*f)), rk.Stream)
}

// DeviceGradRoundTrip is the device check's backward round trip verdict: not
// run (the gradient check covers the dispatcher's backward).
const DeviceGradRoundTrip = results.RoundTripNotRun + " on the device: the gradient check covers the dispatcher's backward"

// DistGradNote says how a run over several processes checks its gradients.
const DistGradNote = "over several processes: each process compares its own ranks' input and probability gradients and its own experts' weight gradients " +
	"(their reference takes every rank's tokens, with the other processes' routing gathered over NCCL), and the router's and shared expert's main_grad " +
	"summed over every process's ranks over NCCL; each gradient's error is then the run's, max|g − ref| and max|ref| taken over every process's, as one process's check takes them"
