package layer

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// DeviceLayer is the layer on device.Device values (GPUs). Every EP rank has its
// own stream on its device; the ranks are spread over the devices in
// contiguous blocks (see rankDevices), several ranks to a device when there
// are more ranks than devices (emulated EP). The host twin l holds the
// inputs, the router's weights and the routing mode; expert weights are
// drawn from the seed and uploaded without being kept.
type DeviceLayer struct {
	warm       bool // a step has run: its kernels are compiled
	Layer      *Layer
	devs       []device.Device
	on         []int // device index of each rank
	th         *device.Threads
	of         [][]int // the ranks of each device
	Dispatcher dispatchers.DeviceDispatcher
	caps       dispatchers.Capabilities // Dispatcher's, asked once: the timed step reads its host waits and grouping per phase
	Ranks      []*dispatchers.DeviceRank
	RankBufs   []devRank
	dc         []devCommon // per device

	seq         []dispatchers.Step        // see steps
	start, end  map[string][]device.Event // per phase, per rank
	IssueMS     float64                   // the last step's host issue time (see step)
	Graph       *graphs                   // --cuda-graph: the captured segments (graph.go); nil: plain launches
	WaitMS      float64                   // the last step's host waits before phases (Capabilities.HostWait)
	job         job                       // what the devices' threads do next (see work)
	work        func(dev int) error       // dl.issue, made once: issuing a step allocates nothing
	Train       bool                      // a step is a training step: forward, then backward (devbackward.go)
	fp8lt       bool                      // at fp8 the expert GEMMs are cuBLASLt's block-scaled FP8 GEMM (fp8dev.go)
	fp8tensor   bool                      // at fp8 the expert GEMMs are cuBLASLt's per-tensor FP8 GEMM (fp8devtensor.go)
	fp8Path     kernels.FP8GEMMPath       // at fp8 the expert GEMM path (FP8Path)
	fp8Why      string
	Forward     int                          // the forward's phases: the first of steps
	Distributed *Distributed                 // a run over several processes (distributed.go); nil: one
	GradAcc     map[string]MaxErrAccumulator // a run over several processes: this process's part of the gradient check (checkDeviceGrads)
	ov          *Overlap                     // --overlap, --delay-wgrad (overlap.go); nil: none
	Attn        *attention                   // --attention-ms (attention.go); nil: none
}

// local: rank r runs in this process (in a run over several, the others'
// ranks have no device here).
func (dl *DeviceLayer) Local(r int) bool { return dl.on[r] >= 0 }

// job is one piece of a step for every device's thread (issue): a phase
// (with begin, the step's start first), a host wait before one, the
// step's start alone, or its end.
type job struct {
	kind  int
	ph    *dispatchers.Step
	begin bool
}

// Jobs of the devices' threads.
const (
	jobPhase    = iota // issue ph for the device's ranks between their events
	jobHostWait        // the dispatcher's host wait before ph for the device's ranks
	jobBegin           // the devices' begin events (after device 0's), their ranks' streams after them
	jobSync            // wait for the device's streams
)

// newThreads makes the issuing threads of dl's devices and the devices'
// rank lists (see deviceLayer).
func (dl *DeviceLayer) newThreads(th *device.Threads) {
	dl.th, dl.work = th, dl.issue
	dl.of = make([][]int, len(dl.devs))
	for r, d := range dl.on {
		if d >= 0 {
			dl.of[d] = append(dl.of[d], r)
		}
	}
}

// devCommon is what the ranks of one device share.
type devCommon struct {
	wr, bias   device.Addr // router weight [E, h] bf16; selection bias [E] fp32 or 0
	wrf32      device.Addr // the router weight as fp32 [E, h], the fp32 router's backward operand; 0 in a forward-only layer
	sfc1, sfc2 device.Addr // shared expert [2fs, h], [h, fs] or 0
	bytes      int64       // bytes of the buffers above
	ranks      int         // ranks on the device
	// begin is recorded at the start of a step on beginS (after device 0's
	// begin, on the other devices); the device's ranks wait for it
	begin  device.Event
	beginS device.Stream
}

// RankToDevice maps ep ranks onto n devices in contiguous blocks: rank r
// runs on device r·n/ep.
func RankToDevice(ep, n int) []int {
	on := make([]int, ep)
	for r := range on {
		on[r] = r * n / ep
	}
	return on
}

// devRank is one rank's layer buffers (the dispatcher has its own).
type devRank struct {
	Logits, Override     device.Addr        // [T, E] fp32; override 0 unless the routing mode replaces the logits
	traceIdx, traceProbs device.Addr        // routing from a trace, or 0
	sh1, sact            device.Addr        // shared expert intermediates [T, 2fs], [T, fs]
	h1, act              device.Addr        // expert intermediates [scratch.Rows, 2f], [scratch.Rows, f]
	Out, scratch         device.RowCapacity // ExpertY; h1 and act
	bytes                int64              // bytes of the fixed buffers
	Grouped              *device.Grouped    // how the expert GEMMs run
	groups               []device.Group     // scratch
	whole                []dispatchers.DeviceWork
	g                    devGrads // the backward's (training steps)
	// at fp8 (fp8dev.go): the bf16 input (rk.X holds the packed rows the
	// dispatch moves), and the expert block's dequantized rows
	xin, xdq device.Addr
	dq       device.RowCapacity
	fp8      *devFP8 // the FP8 GEMM path's weights and operands
}

// NewDeviceLayer uploads l's inputs and weights to devs (the ranks spread
// over them; in a run over several processes, ds's ranks one per device)
// and binds d; th are devs' issuing threads (one each).
func NewDeviceLayer(l *Layer, devs []device.Device, th *device.Threads, d dispatchers.DeviceDispatcher, ds *Distributed) (*DeviceLayer, error) {
	c := l.Cfg
	dl := &DeviceLayer{Layer: l, devs: devs, on: RankToDevice(c.EP, len(devs)), Dispatcher: d, RankBufs: make([]devRank, c.EP), dc: make([]devCommon, len(devs)),
		start: map[string][]device.Event{}, end: map[string][]device.Event{}, Distributed: ds, Train: trains(c, d), caps: d.Capabilities()}
	if ds != nil {
		for r := range dl.on {
			dl.on[r] = r - ds.first
			if r < ds.first || r >= ds.first+ds.PerProcess {
				dl.on[r] = -1
			}
		}
	}
	dl.newThreads(th)
	if c.IsFP8() {
		path, why := fp8LayerPath(devs, c, ds != nil)
		dl.fp8Path, dl.fp8Why = path, why
		dl.fp8lt = path == kernels.FP8GEMMBlock
		l.fp8DevLt = dl.fp8lt // the reference takes the path's operands
		dl.fp8tensor = path == kernels.FP8GEMMTensor
		l.fp8DevTensor = dl.fp8tensor
	}
	for i := range devs {
		if err := dl.newCommon(i); err != nil {
			return nil, err
		}
	}
	if dl.Train {
		drawDOuts(l)
	}
	for r := range c.EP {
		if !dl.Local(r) {
			dl.Ranks = append(dl.Ranks, &dispatchers.DeviceRank{ID: r, Threads: th})
			continue
		}
		if err := dl.newRank(r, th); err != nil {
			return nil, err
		}
	}
	if err := dl.uploadExperts(); err != nil {
		return nil, err
	}
	if ds != nil { // the communicator over every process's ranks, before the dispatcher takes it
		if err := dl.openComm(th); err != nil {
			return nil, err
		}
	}
	if err := d.Bind(dl.shape(), dl.Ranks); err != nil {
		return nil, err
	}
	if err := dl.newAttention(); err != nil { // attention.go
		return nil, err
	}
	if err := dl.phaseEvents(); err != nil {
		return nil, err
	}
	return dl, dl.sync()
}

// upload allocates *p on dev, counts its bytes and uploads host to it on s.
func upload(dev device.Device, p *device.Addr, counter *int64, host any, s device.Stream) error {
	b, err := device.HostBytes(host)
	if err != nil {
		return err
	}
	if *p, err = dev.Alloc(int64(len(b))); err != nil {
		return err
	}
	*counter += int64(len(b))
	return dev.Upload(*p, host, s)
}

// newCommon makes device i's begin stream and event and uploads what its
// ranks share: the router's weights (fp32 too where the router's gradient
// is taken), its bias and the shared expert's weights.
func (dl *DeviceLayer) newCommon(i int) error {
	l, dev, m := dl.Layer, dl.devs[i], &dl.dc[i]
	var err error
	if m.beginS, err = dev.NewStream(); err != nil {
		return err
	}
	if m.begin, err = dev.NewEvent(); err != nil {
		return err
	}
	if err := upload(dev, &m.wr, &m.bytes, kernels.BF16Bits(l.Wr), m.beginS); err != nil {
		return err
	}
	if dl.Train && l.RouterGrad() {
		if err := upload(dev, &m.wrf32, &m.bytes, l.Wr, m.beginS); err != nil {
			return err
		}
	}
	if l.Bias != nil {
		if err := upload(dev, &m.bias, &m.bytes, l.Bias, m.beginS); err != nil {
			return err
		}
	}
	if l.SharedFC1 != nil {
		if err := upload(dev, &m.sfc1, &m.bytes, kernels.BF16Bits(l.SharedFC1), m.beginS); err != nil {
			return err
		}
		if err := upload(dev, &m.sfc2, &m.bytes, kernels.BF16Bits(l.SharedFC2), m.beginS); err != nil {
			return err
		}
	}
	return nil
}

// newRank makes local rank r's stream and buffers on its device, uploads
// its input (and its routing override or trace) and appends it to
// dl.ranks.
func (dl *DeviceLayer) newRank(r int, th *device.Threads) error {
	l, c := dl.Layer, dl.Layer.Cfg
	T, h, f, E, k := c.Tokens, c.Hidden, c.FFN, c.Experts, c.TopK
	fs, L := c.FFN*c.SharedExperts, l.Shape.LocalExperts()
	b, dev := &dl.RankBufs[r], dl.devs[dl.on[r]]
	dl.dc[dl.on[r]].ranks++
	rk := &dispatchers.DeviceRank{ID: r, Dev: dev, Threads: th}
	var err error
	if rk.Stream, err = dev.NewStream(); err != nil {
		return err
	}
	xin := &rk.X
	if c.IsFP8() { // the router and the shared expert read the bf16 input; rk.X is the packed rows (quantize)
		xin = &b.xin
	}
	if err := upload(dev, xin, &b.bytes, kernels.BF16Bits(l.X[r]), rk.Stream); err != nil {
		return err
	}
	if l.Override[r] != nil {
		if err := upload(dev, &b.Override, &b.bytes, l.Override[r], rk.Stream); err != nil {
			return err
		}
	}
	if l.Trace != nil { // the trace's routing, as the host router takes it
		if err := l.route(r); err != nil {
			return err
		}
		if err := upload(dev, &b.traceIdx, &b.bytes, l.Ranks[r].Idx, rk.Stream); err != nil {
			return err
		}
		if err := upload(dev, &b.traceProbs, &b.bytes, l.Ranks[r].Probs, rk.Stream); err != nil {
			return err
		}
	}
	bufs := []device.RowBuffer{{P: &rk.FC1, PerRow: int64(2 * L * 2 * f * h)}, {P: &rk.FC2, PerRow: int64(2 * L * h * f)},
		{P: &b.Logits, PerRow: int64(4 * T * E)}, {P: &rk.Idx, PerRow: int64(4 * T * k)}, {P: &rk.Probs, PerRow: int64(4 * T * k)},
		{P: &rk.Y, PerRow: int64(2 * T * h)}}
	if c.IsFP8() {
		bufs = append(bufs, device.RowBuffer{P: &rk.X, PerRow: int64(T * kernels.FP8RowPitch(h))})
	}
	if fs > 0 {
		bufs = append(bufs, device.RowBuffer{P: &b.sh1, PerRow: int64(2 * T * 2 * fs)}, device.RowBuffer{P: &b.sact, PerRow: int64(2 * T * fs)},
			device.RowBuffer{P: &rk.Shared, PerRow: int64(2 * T * h)})
	}
	held, err := device.Resize(dev, 1, bufs...)
	if b.bytes += held; err != nil {
		return err
	}
	if b.Grouped, err = device.NewGrouped(dev, 0); err != nil {
		return err
	}
	dl.Ranks = append(dl.Ranks, rk)
	if dl.fp8lt {
		if err := dl.allocFP8(r); err != nil {
			return err
		}
	}
	if dl.fp8tensor {
		if err := dl.allocFP8Tensor(r); err != nil {
			return err
		}
	}
	if dl.Train {
		if err := dl.newDeviceBackward(r); err != nil {
			return err
		}
	}
	return nil
}

// openComm opens the communicator over every process's ranks (dl.dist),
// agrees the settings and makes the stops, before the dispatcher takes it.
func (dl *DeviceLayer) openComm(th *device.Threads) error {
	ds := dl.Distributed
	var streams []device.Stream
	for r := ds.first; r < ds.first+ds.PerProcess; r++ {
		streams = append(streams, dl.Ranks[r].Stream)
	}
	if err := ds.open(th, dl.devs, streams, dl.Layer.Cfg); err != nil {
		return err
	}
	for _, rk := range dl.Ranks {
		rk.Comm = ds.comm
	}
	if err := dl.agreeSettings(); err != nil {
		return err
	}
	return dl.newStops(dl.Ranks[ds.first].Dev)
}

// phaseEvents makes each step's start and end events on every rank.
func (dl *DeviceLayer) phaseEvents() error {
	for _, ph := range dl.Steps() {
		for r, rk := range dl.Ranks {
			for _, m := range []map[string][]device.Event{dl.start, dl.end} {
				if !dl.Local(r) {
					m[ph.Name] = append(m[ph.Name], nil)
					continue
				}
				e, err := rk.Dev.NewEvent()
				if err != nil {
					return err
				}
				m[ph.Name] = append(m[ph.Name], e)
			}
		}
	}
	return nil
}

// uploadExperts draws every expert's weights (in parallel, each expert from
// its own stream of draws) and uploads them, as bf16, to their owner rank's
// buffers. Only a few experts are held on the host at a time.
func (dl *DeviceLayer) uploadExperts() error {
	c := dl.Layer.Cfg
	h, f, L := c.Hidden, c.FFN, dl.Layer.Shape.LocalExperts()
	type drawn struct {
		e        int
		fc1, fc2 []uint16
		fp8      *fp8Weights       // on the FP8 GEMM path
		t8       *fp8TensorWeights // on the per-tensor FP8 GEMM path
	}
	ch := make(chan drawn, runtime.GOMAXPROCS(0))
	stop := make(chan struct{})
	go func() {
		defer close(ch)
		var wg sync.WaitGroup
		next := make(chan int)
		for range runtime.GOMAXPROCS(0) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for e := range next {
					fc1, fc2 := dl.Layer.ExpertWeights(e)
					var w8 *fp8Weights
					if dl.fp8lt {
						w8 = dl.Layer.fp8Weights(e)
					}
					var t8 *fp8TensorWeights
					if dl.fp8tensor {
						t8 = quantTensorWeights(fc1, fc2)
					}
					select {
					case ch <- drawn{e, kernels.BF16Bits(fc1), kernels.BF16Bits(fc2), w8, t8}:
					case <-stop:
					}
				}
			}()
		}
	feed:
		for e := range c.Experts {
			if !dl.Local(e / L) { // another process's expert
				continue
			}
			select {
			case next <- e:
			case <-stop:
				break feed
			}
		}
		close(next)
		wg.Wait()
	}()
	defer func() {
		close(stop)
		for range ch { // let the drawers finish
		}
	}()
	for w := range ch {
		r, i := w.e/L, w.e%L
		rk := dl.Ranks[r]
		if err := rk.Dev.Upload(rk.FC1+device.Addr(2*i*2*f*h), w.fc1, rk.Stream); err != nil {
			return err
		}
		if err := rk.Dev.Upload(rk.FC2+device.Addr(2*i*h*f), w.fc2, rk.Stream); err != nil {
			return err
		}
		if w.fp8 != nil {
			if err := dl.uploadFP8(w.e, w.fp8); err != nil {
				return err
			}
		}
		if w.t8 != nil {
			if err := dl.uploadFP8Tensor(w.e, w.t8); err != nil {
				return err
			}
		}
	}
	return nil
}

// Steps are the phases of a step, in the host layer's order (built once).
func (dl *DeviceLayer) Steps() []dispatchers.Step {
	if dl.seq != nil {
		return dl.seq
	}
	if dl.Attn != nil { // attention.go
		dl.seq = append(dl.seq, dispatchers.Step{Name: "attention", Run: dl.attentionForward})
	}
	if dl.dc[0].sfc1 != 0 {
		dl.seq = append(dl.seq, dispatchers.Step{Name: "shared", Run: dl.sharedExpert})
	}
	dl.seq = append(dl.seq, dispatchers.Step{Name: "router", Run: dl.route})
	if dl.Layer.Cfg.IsFP8() {
		dl.seq = append(dl.seq, dispatchers.Step{Name: "quantize", Run: dl.quantize})
	}
	dl.seq = append(dl.seq, dl.Dispatcher.Forward(dl.experts)...)
	dl.Forward = len(dl.seq)
	if dl.Train {
		bwd, err := dl.deviceBackwardSteps()
		if err != nil { // its capabilities said it has one
			panic(err)
		}
		dl.seq = append(dl.seq, bwd...)
		if dl.Attn != nil {
			dl.seq = append(dl.seq, dispatchers.Step{Name: dispatchers.BackwardName("attention"), Run: dl.attentionBackward})
		}
	}
	return dl.seq
}

// sharedExpert: fc1 → SwiGLU → fc2 on the rank's tokens into rk.Shared,
// which the dispatcher's last phase adds.
func (dl *DeviceLayer) sharedExpert(r int) error {
	c, rk, b, m := dl.Layer.Cfg, dl.Ranks[r], &dl.RankBufs[r], &dl.dc[dl.on[r]]
	T, h, fs := c.Tokens, c.Hidden, c.FFN*c.SharedExperts
	if err := rk.Dev.GEMM(b.sh1, dl.input(r), m.sfc1, T, 2*fs, h, false, rk.Stream); err != nil {
		return err
	}
	if err := rk.Dev.SwiGLU(b.sact, b.sh1, 0, T, fs, rk.Stream); err != nil {
		return err
	}
	return rk.Dev.GEMM(rk.Shared, b.sact, m.sfc2, T, h, fs, false, rk.Stream)
}

// route: the fp32 logits GEMM (bf16 operands, fp32 output), the routing
// mode's replacement logits when it has them, then top-k; a trace's routing
// replaces the top-k's output.
func (dl *DeviceLayer) route(r int) error {
	c, rk, b, m := dl.Layer.Cfg, dl.Ranks[r], &dl.RankBufs[r], &dl.dc[dl.on[r]]
	T, E, k := c.Tokens, c.Experts, c.TopK
	if err := rk.Dev.GEMM(b.Logits, dl.input(r), m.wr, T, E, c.Hidden, true, rk.Stream); err != nil {
		return err
	}
	if b.Override != 0 {
		if err := rk.Dev.Copy(b.Logits, b.Override, int64(4*T*E), rk.Stream); err != nil {
			return err
		}
	}
	if b.traceIdx != 0 {
		if err := rk.Dev.Copy(rk.Idx, b.traceIdx, int64(4*T*k), rk.Stream); err != nil {
			return err
		}
		return rk.Dev.Copy(rk.Probs, b.traceProbs, int64(4*T*k), rk.Stream)
	}
	return rk.Dev.RouterTopK(dl.Layer.Router, b.Logits, m.bias, T, rk.Idx, rk.Probs, rk.Stream)
}

// experts computes the rank's current work (DeviceRank.Work; nil: all its
// rows with its own experts), block by block.
func (dl *DeviceLayer) experts(r int) error {
	rk, b := dl.Ranks[r], &dl.RankBufs[r]
	if err := b.Out.Ensure(rk.Dev, rk.Stream, rk.Rows(), device.RowBuffer{P: &rk.ExpertY, PerRow: 2 * int64(dl.Layer.Cfg.Hidden)}); err != nil {
		return err
	}
	work := rk.Work
	if work == nil {
		work = dl.wholeWork(r)
	}
	if dl.Train {
		if err := dl.beginTape(r, work); err != nil {
			return err
		}
	}
	for i := range work {
		if err := dl.block(r, &work[i]); err != nil {
			return err
		}
	}
	return nil
}

// wholeWork is the default work: every row of ExpertX, one segment per
// local expert with rows (rebuilt in place each call).
func (dl *DeviceLayer) wholeWork(r int) []dispatchers.DeviceWork {
	rk, b := dl.Ranks[r], &dl.RankBufs[r]
	if b.whole == nil {
		b.whole = make([]dispatchers.DeviceWork, 1)
	}
	w := &b.whole[0]
	w.X, w.Probs, w.Y, w.Segments = rk.ExpertX, rk.ExpertProbs, 0, w.Segments[:0]
	at, L := 0, dl.Layer.Shape.LocalExperts()
	for l, rows := range rk.ExpertRows {
		if rows > 0 {
			w.Segments = append(w.Segments, dispatchers.DeviceSegment{Expert: r*L + l, Start: at, Len: rows})
		}
		at += rows
	}
	return b.whole
}

// block computes one block of work (compute) and records its Done event.
func (dl *DeviceLayer) block(r int, w *dispatchers.DeviceWork) error {
	if err := dl.compute(r, w); err != nil || w.Done == nil {
		return err
	}
	return dl.Ranks[r].Dev.Record(w.Done, dl.Ranks[r].Stream)
}

// compute queues one block of work: fc1 per segment, one SwiGLU×prob over
// the block's rows from its first segment's to its last's, fc2 per segment
// (cuBLASLt calls, see device.Grouped).
func (dl *DeviceLayer) compute(r int, w *dispatchers.DeviceWork) error {
	c, rk, b := dl.Layer.Cfg, dl.Ranks[r], &dl.RankBufs[r]
	h, f, L := c.Hidden, c.FFN, dl.Layer.Shape.LocalExperts()
	lo, hi := span(w.Segments)
	for _, sg := range w.Segments {
		if sg.Start < 0 || sg.Len < 0 {
			return fmt.Errorf("segment of expert %d covers rows [%d, %d)", sg.Expert, sg.Start, sg.Start+sg.Len)
		}
		// a moved expert without bf16 weights: only for the FP8 GEMMs of a
		// forward-only step, which read its e4m3 ones (feplb at fp8)
		fp8Only := dl.fp8lt && !dl.Train && sg.FP8.Q1 != 0
		if (sg.FC1 == 0) != (sg.FC2 == 0) || (sg.FC1 == 0 && sg.Expert/L != r && !fp8Only) {
			return fmt.Errorf("segment of expert %d on rank %d: weights fc1 %#x, fc2 %#x (0 only for a local expert)", sg.Expert, r, sg.FC1, sg.FC2)
		}
	}
	if hi == 0 {
		return nil
	}
	if w.After != nil {
		if err := rk.Dev.Wait(rk.Stream, w.After); err != nil {
			return err
		}
	}
	var h1, act, xd device.Addr
	if dl.Train { // kept for the backward
		h1, act, xd = dl.tapeRows(r, w, lo, hi)
	} else {
		if err := b.scratch.Ensure(rk.Dev, rk.Stream, hi-lo, device.RowBuffer{P: &b.h1, PerRow: 4 * int64(f)}, device.RowBuffer{P: &b.act, PerRow: 2 * int64(f)}); err != nil {
			return err
		}
		h1, act = b.h1, b.act
	}
	y := w.Y
	if y == 0 {
		y = rk.ExpertY
	}
	if dl.fp8tensor { // the per-tensor FP8 GEMMs on the dequantized rows (the tape's in training; fp8devtensor.go)
		x, err := dl.dequant(r, w, lo, hi, xd)
		if err != nil {
			return err
		}
		return dl.computeFP8Tensor(r, w, lo, hi, x, h1, act, y)
	}
	if dl.fp8lt { // the FP8 GEMMs (fp8dev.go); the backward's tape keeps the dequantized rows
		if dl.Train {
			if _, err := dl.dequant(r, w, lo, hi, xd); err != nil {
				return err
			}
		}
		return dl.computeFP8(r, w, lo, hi, h1, act, y)
	}
	x, xLo := w.X, 0 // the block's bf16 rows, and the row of w.X at x
	if c.IsFP8() {
		var err error
		if x, err = dl.dequant(r, w, lo, hi, xd); err != nil {
			return err
		}
		xLo = lo
	}
	fc := func(out, in device.Addr, outLo, inLo int, second bool, outCols, inCols int) []device.Group {
		b.groups = b.groups[:0]
		for _, sg := range w.Segments {
			if sg.Len == 0 {
				continue
			}
			wt := sg.FC1
			if second {
				wt = sg.FC2
			}
			if wt == 0 {
				own := rk.FC1
				if second {
					own = rk.FC2
				}
				wt = own + device.Addr(2*(sg.Expert-r*L)*outCols*inCols)
			}
			b.groups = append(b.groups, device.Group{C: out + device.Addr(2*(sg.Start-outLo)*outCols),
				A: in + device.Addr(2*(sg.Start-inLo)*inCols), W: wt, M: sg.Len})
		}
		return b.groups
	}
	if err := b.Grouped.Run(rk.Dev, fc(h1, x, lo, xLo, false, 2*f, h), 2*f, h, rk.Stream); err != nil {
		return err
	}
	if err := dl.swiGLUProbs(r, w, lo, hi, act, h1); err != nil {
		return err
	}
	return b.Grouped.Run(rk.Dev, fc(y, act, 0, lo, true, h, f), h, f, rk.Stream)
}

// GroupedSideStreams are the candidate numbers of extra streams per rank for the
// expert GEMMs; ChooseGrouped times each, and the device's grouped GEMM
// where it has one, and keeps the fastest.
var GroupedSideStreams = []int{0, 3}

// ChooseGrouped runs a few forward passes with each way of running the
// expert GEMMs (the backward's products do not use it), keeps the one whose
// expert phases (slowest rank, median) are fastest, and describes the
// comparison.
func (dl *DeviceLayer) ChooseGrouped() (string, error) {
	const reps = 3
	best, bestMS, desc := -1, math.Inf(1), ""
	ways := len(GroupedSideStreams)
	batched, ok := dl.devs[0].GroupedGEMMName()
	if ok && (dl.fp8lt || dl.fp8tensor) {
		ok, batched = false, batched+" takes no FP8 operands (the FP8 GEMMs are per-expert calls)"
	}
	if dl.Distributed != nil { // every process times the same ways: each step moves data between them
		var err error
		if ok, batched, err = dl.agreeBatched(ok, batched); err != nil {
			return "", err
		}
	}
	if ok {
		ways++
	}
	meds := make([]float64, ways) // each way's median; +Inf: left out
	options := make([][]*device.Grouped, ways)
	for i := range ways {
		for r, rk := range dl.Ranks {
			if !dl.Local(r) {
				options[i] = append(options[i], nil)
				continue
			}
			var g *device.Grouped
			var err error
			if i < len(GroupedSideStreams) {
				g, err = device.NewGrouped(rk.Dev, GroupedSideStreams[i])
			} else {
				g, err = device.NewBatched(rk.Dev)
			}
			if err != nil {
				return "", err
			}
			options[i] = append(options[i], g)
		}
		for r := range dl.RankBufs {
			dl.RankBufs[r].Grouped = options[i][r]
		}
		var ms []float64
		for range reps {
			if err := dl.forwardStep(); err != nil {
				if i < len(GroupedSideStreams) || dl.Distributed != nil { // the others run this way's steps: so must this process
					return "", err
				}
				// the grouped call is optional: a failure leaves it out
				desc += "; " + batched + " failed: " + err.Error()
				ms = nil
				break
			}
			slowest := 0.0
			for r, rk := range dl.Ranks {
				if !dl.Local(r) {
					continue
				}
				t := 0.0
				for _, ph := range dispatchers.ExpertPhases {
					if dl.start[ph] == nil {
						continue
					}
					ms, err := rk.Dev.Elapsed(dl.start[ph][r], dl.end[ph][r])
					if err != nil {
						return "", err
					}
					t += ms
				}
				slowest = math.Max(slowest, t)
			}
			ms = append(ms, slowest)
		}
		if ms == nil {
			meds[i] = math.Inf(1)
			if err := dl.sync(); err != nil {
				return "", err
			}
			continue
		}
		slices.Sort(ms)
		if desc != "" {
			desc += "; "
		}
		desc += fmt.Sprintf("%s: expert phases %.3g ms", options[i][dl.of[0][0]].Name(), ms[reps/2])
		meds[i] = ms[reps/2]
	}
	if dl.Distributed != nil { // one choice on every process: the way whose slowest process is fastest
		var err error
		if meds, err = dl.slowestProcess(meds); err != nil {
			return "", err
		}
		desc += fmt.Sprintf("; chosen by the slowest of the %d processes' medians", dl.Distributed.Rendezvous.L.World)
	}
	for i, m := range meds {
		if m < bestMS {
			best, bestMS = i, m
		}
	}
	for r := range dl.RankBufs {
		dl.RankBufs[r].Grouped = options[best][r]
	}
	if !ok {
		desc += "; not compared: " + batched
	}
	return "chosen: " + options[best][dl.of[0][0]].Name() + " (median of " + fmt.Sprint(reps) + " steps each — " + desc + ")", nil
}

// Step runs one step (the forward, then a training step's backward): every
// phase for every rank, each device's
// ranks issued from the device's own thread, all devices at once, a
// barrier between phases (dispatchers' contract); each phase between two
// events on each rank's stream; then every stream is waited for. Every
// rank starts from its device's begin event, which follows device 0's. A
// phase's events bracket each rank's own call, except for a phase the
// dispatcher issues once per device (Capabilities.Grouped): the device's
// start events are all recorded before its first rank's call and its end
// events after its last, so that each rank's time holds the work the
// device's call queues on its stream. A dispatcher's host wait before a
// phase (Capabilities.HostWait) comes before the phase's start events, so
// that no rank's phase time holds it; waitMS is its wall time, every
// device's wait included. issueMS is the host's wall time from the first
// call to the last call's return, before waiting for the streams, less
// waitMS.
func (dl *DeviceLayer) Step() error {
	if dl.Graph != nil {
		return dl.stepGraph()
	}
	return dl.plainStep(dl.Steps())
}

// plainStep is step's plain launches of phs.
func (dl *DeviceLayer) plainStep(phs []dispatchers.Step) error {
	t0 := time.Now()
	dl.WaitMS = 0
	if err := dl.begin0(); err != nil {
		return err
	}
	if err := dl.phases(phs, true, true); err != nil {
		return err
	}
	dl.IssueMS = float64(time.Since(t0).Nanoseconds())/1e6 - dl.WaitMS
	err := dl.Finish()
	dl.warm = dl.warm || err == nil
	return err
}

// forwardStep runs the forward pass alone, as plain launches; a training
// layer drops the tape it kept.
func (dl *DeviceLayer) forwardStep() error {
	steps := dl.Steps()
	if err := dl.plainStep(steps[:dl.Forward]); err != nil {
		return err
	}
	if dl.Train {
		for r := range dl.Ranks {
			dl.endTape(r)
		}
	}
	return nil
}

// each runs one job on every device's thread (a barrier).
func (dl *DeviceLayer) each(kind int, ph *dispatchers.Step, begin bool) error {
	st := "waiting for the GPUs"
	if ph != nil {
		st = ph.Name
	}
	dl.Distributed.stage(st, dl.warm) // a job may wait on other processes
	dl.doing(st)
	dl.job = job{kind, ph, begin}
	return dl.th.Each(dl.work)
}

// issue is dl.job for device dev's ranks, on its thread.
func (dl *DeviceLayer) issue(dev int) error {
	j := dl.job
	ranks := dl.of[dev]
	m := &dl.dc[dev]
	if j.begin || j.kind == jobBegin {
		if err := dl.beginDevice(dev); err != nil {
			return err
		}
	}
	switch j.kind {
	case jobBegin:
		return nil
	case jobPhase:
		return dl.issuePhase(dev, j.ph)
	case jobHostWait:
		hw := dl.caps.HostWait
		for _, r := range ranks {
			if err := hw.Wait(j.ph.Name, r); err != nil {
				return fmt.Errorf("rank %d: %w", r, err)
			}
		}
		return nil
	case jobSync:
		if err := dl.devs[dev].SyncStream(m.beginS); err != nil {
			return err
		}
		for _, r := range ranks {
			if err := dl.Ranks[r].Dev.SyncStream(dl.Ranks[r].Stream); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("harness: job %d", j.kind)
}

// issuePhase issues ph for device dev's ranks between their events (see
// step).
func (dl *DeviceLayer) issuePhase(dev int, ph *dispatchers.Step) error {
	ranks := dl.of[dev]
	g := dl.caps.Grouped
	together := g != nil && g(ph.Name)
	mark := func(evs []device.Event, rs []int) error {
		for _, r := range rs {
			if err := dl.timing(dl.Ranks[r].Dev, evs[r], dl.Ranks[r].Stream); err != nil { // graph.go
				return fmt.Errorf("%s on rank %d: %w", ph.Name, r, err)
			}
		}
		return nil
	}
	for i, r := range ranks {
		bracket := ranks[i : i+1] // the ranks whose events bracket this call
		if together {
			bracket = ranks
		}
		if !together || i == 0 {
			if err := mark(dl.start[ph.Name], bracket); err != nil {
				return err
			}
		}
		if err := ph.Run(r); err != nil {
			return fmt.Errorf("%s on rank %d: %w", ph.Name, r, err)
		}
		if !together || i == len(ranks)-1 {
			if err := mark(dl.end[ph.Name], bracket); err != nil {
				return err
			}
		}
	}
	return nil
}

// Finish waits for every stream, then asks the dispatcher what its kernels
// recorded (Capabilities.Check: a cross-rank wait that gave up).
func (dl *DeviceLayer) Finish() error {
	if err := dl.sync(); err != nil {
		return err
	}
	if c := dl.Dispatcher.Capabilities().Check; c != nil {
		return c()
	}
	return nil
}

// begin0 records device 0's begin event, on the calling goroutine: device
// 0's thread (device.Threads), before the other devices' threads wait for
// it (beginDevice).
func (dl *DeviceLayer) begin0() error {
	if err := dl.devs[0].Record(dl.dc[0].begin, dl.dc[0].beginS); err != nil {
		return err
	}
	return dl.timeBegin(0) // graph.go
}

// beginDevice, on device dev's thread after begin0: its begin event (after
// device 0's), and its ranks' streams after it.
func (dl *DeviceLayer) beginDevice(dev int) error {
	m := &dl.dc[dev]
	if dev > 0 {
		if err := dl.devs[dev].Wait(m.beginS, dl.dc[0].begin); err != nil {
			return err
		}
		if err := dl.devs[dev].Record(m.begin, m.beginS); err != nil {
			return err
		}
		if err := dl.timeBegin(dev); err != nil {
			return err
		}
	}
	for _, r := range dl.of[dev] {
		if err := dl.Ranks[r].Dev.Wait(dl.Ranks[r].Stream, m.begin); err != nil {
			return err
		}
		if dl.Train { // zero_grad
			if err := dl.zeroGrads(r); err != nil {
				return err
			}
		}
	}
	return nil
}

// begin records each device's begin event (each after device 0's) and
// makes every rank's stream wait for its device's.
func (dl *DeviceLayer) begin() error {
	if err := dl.begin0(); err != nil {
		return err
	}
	return dl.each(jobBegin, nil, false)
}

// phases issues phs for every rank between their events (see step), with
// begin the step's start (begin0 done) with the first; with hostWaits, the
// dispatcher's host wait before a phase first (adding to waitMS).
func (dl *DeviceLayer) phases(phs []dispatchers.Step, begin, hostWaits bool) error {
	hw := dl.caps.HostWait
	for i := range phs {
		ph := &phs[i]
		if hw != nil && hostWaits && hw.Before(ph.Name) { // before the phase's start events: it is timed from its own first GPU operation
			t := time.Now()
			if err := dl.each(jobHostWait, ph, begin); err != nil {
				return fmt.Errorf("%s: host wait: %w", ph.Name, err)
			}
			dl.WaitMS += float64(time.Since(t).Nanoseconds()) / 1e6
			begin = false
		}
		if err := dl.each(jobPhase, ph, begin); err != nil {
			return err
		}
		begin = false
	}
	return nil
}

// SetRouting gives the layer step's routing (Layer.SetRouting) and uploads
// it — each rank's logit override, or a trace's routing — before the
// step's clock starts.
func (dl *DeviceLayer) SetRouting(step int) error {
	l := dl.Layer
	if !l.Cfg.PerStepRouting() {
		return nil
	}
	l.SetRouting(step)
	for r, rk := range dl.Ranks {
		if !dl.Local(r) {
			continue
		}
		b := &dl.RankBufs[r]
		if l.Override[r] != nil {
			if err := rk.Dev.Upload(b.Override, l.Override[r], rk.Stream); err != nil {
				return err
			}
		}
		if l.Trace != nil {
			if err := l.route(r); err != nil {
				return err
			}
			if err := rk.Dev.Upload(b.traceIdx, l.Ranks[r].Idx, rk.Stream); err != nil {
				return err
			}
			if err := rk.Dev.Upload(b.traceProbs, l.Ranks[r].Probs, rk.Stream); err != nil {
				return err
			}
		}
	}
	return dl.sync()
}

// sync waits for every stream, each device's on its thread.
func (dl *DeviceLayer) sync() error { return dl.each(jobSync, nil, false) }

// Times reads the last step's events: each phase's time per rank, and each
// rank's step (from the common start to the rank's last event), in ms.
func (dl *DeviceLayer) Times(samples map[string][][]float64, step [][]float64) error {
	steps := dl.Steps()
	last := steps[len(steps)-1].Name
	how := "" // how the events were recorded, for an error
	if dl.Graph != nil {
		how = " (with --cuda-graph: event record nodes of the captured graphs, or plain records where a capture was refused)"
	}
	for r, rk := range dl.Ranks {
		if !dl.Local(r) {
			continue
		}
		for _, ph := range steps {
			ms, err := rk.Dev.Elapsed(dl.start[ph.Name][r], dl.end[ph.Name][r])
			if err != nil {
				return fmt.Errorf("%s on rank %d: the time from its start event to its end event%s: %w", ph.Name, r, how, err)
			}
			samples[ph.Name][r] = append(samples[ph.Name][r], ms)
		}
		ms, err := rk.Dev.Elapsed(dl.stepBegin(r), dl.end[last][r]) // graph.go
		if err != nil {
			return fmt.Errorf("the step on rank %d: the time from GPU %d's begin event to %s's end event%s: %w", r, dl.on[r], last, how, err)
		}
		step[r] = append(step[r], ms)
	}
	return nil
}

// HostCalls adds the last step's library calls' wall time per phase and
// rank (Capabilities.Library) to m.
func (dl *DeviceLayer) HostCalls(m *Measurements) {
	lib := dl.Dispatcher.Capabilities().Library
	if lib == nil {
		return
	}
	for _, ph := range dl.Steps() {
		for r := range dl.Ranks {
			if !dl.Local(r) {
				continue
			}
			ms, ok := lib.HostCallMS(ph.Name, r)
			if !ok {
				continue
			}
			if m.HostCall == nil {
				m.HostCall = map[string][][]float64{}
			}
			if m.HostCall[ph.Name] == nil {
				m.HostCall[ph.Name] = make([][]float64, len(dl.Ranks))
			}
			m.HostCall[ph.Name][r] = append(m.HostCall[ph.Name][r], ms)
		}
	}
}

// Download copies the last step's routing (chosen experts and their
// probabilities) and output of every rank into the host twin's ranks.
func (dl *DeviceLayer) Download() error {
	y := make([]uint16, dl.Layer.Cfg.Tokens*dl.Layer.Cfg.Hidden)
	for r, rk := range dl.Ranks {
		if !dl.Local(r) {
			continue
		}
		hr := dl.Layer.Ranks[r]
		if err := rk.Dev.Download(hr.Idx, rk.Idx, rk.Stream); err != nil {
			return err
		}
		if err := rk.Dev.Download(hr.Probs, rk.Probs, rk.Stream); err != nil {
			return err
		}
		if err := rk.Dev.Download(y, rk.Y, rk.Stream); err != nil {
			return err
		}
		hr.Y = kernels.FromBF16Bits(y)
	}
	return nil
}

// Footprint is rank r's bytes on its device: its layer and dispatcher
// buffers and an equal share of the buffers the device's ranks share.
func (dl *DeviceLayer) Footprint(r int) int64 {
	b, m := &dl.RankBufs[r], &dl.dc[dl.on[r]]
	n := b.bytes + b.Out.Bytes + b.scratch.Bytes + b.dq.Bytes + dl.Dispatcher.Footprint(r) + m.bytes/int64(m.ranks) + b.g.bytes()
	if b.fp8 != nil { // the FP8 GEMMs' operands (the weights are in b.bytes)
		n += b.fp8.ops.Bytes
	}
	return n
}

// SetGEMMTuning lets the GPUs among devs time each new GEMM shape's cuBLASLt
// algorithms (device.CUDA.SetGEMMTuning), or stops them: a timing waits for
// the stream, which no timed step may do.
func SetGEMMTuning(devs []device.Device, on bool) {
	for _, d := range devs {
		if g, ok := d.(*device.CUDA); ok {
			g.TuneGEMMs = on
		}
	}
}

// OpenDevices opens the devices of a cuda run (env.OpenDevices, else
// device.OpenGPUs): n of them, or when n is 0 every GPU up to most; in a
// run over several processes (ds) the GPUs of this process's ranks.
func OpenDevices(env setup.Env, n, most int, ds *Distributed) ([]device.Device, error) {
	first := 0
	if ds != nil {
		n, first = ds.PerProcess, ds.firstGPU
	}
	if env.OpenDevices != nil && ds == nil {
		return env.OpenDevices(n, most)
	}
	gs, err := device.OpenGPUsFrom(first, n, most, "")
	devs := make([]device.Device, len(gs))
	for i, g := range gs {
		devs[i] = g
	}
	return devs, err
}

// HostHeldNote is what a host run records for the SMs held: the host
// device runs no blocks, so the budget is recorded as asked (or the
// design's default) and no SMs are held.
const HostHeldNote = "n/a: the host device runs no thread blocks; the budget is recorded as asked (or the design's default)"

// FitSMBudget fits --sms to the GPUs of a device run of an SM-driven design's
// native kernels: a block holds one SM (kernels' LaunchResident) and all
// of a GPU's ranks' blocks are resident at once, so a rank's budget is at
// most the GPU's SMs ÷ its ranks (dispatchers.SMBudget.Fit), and --sms 0
// is the smaller of the design's default and that. It returns the budget
// each rank runs with and the record's note on what the ranks hold (""
// when --sms does not concern the run), or the *UnavailableError naming
// --sms, its value, the SMs and the ranks.
func FitSMBudget(cfg setup.Config, devs []device.Device, ds *Distributed) (budget int, held string, err error) {
	b, ok := dispatchers.SMBudgetOf(cfg.Dispatcher, cfg.Impl)
	if !ok || cfg.Impl != dispatchers.ImplNative || len(devs) == 0 {
		return 0, "", nil
	}
	ranks := cfg.EP
	if ds != nil {
		ranks = ds.PerProcess
	}
	perGPU := make([]int, len(devs))
	for _, g := range RankToDevice(ranks, len(devs)) {
		perGPU[g]++
	}
	most, sms := slices.Max(perGPU), devs[0].SMCount()
	for _, d := range devs {
		sms = min(sms, d.SMCount())
	}
	if budget, err = b.Fit(cfg.SMs, sms, most); err != nil {
		return 0, "", &dispatchers.UnavailableError{Name: cfg.Dispatcher, Impl: cfg.Impl, Reason: err.Error()}
	}
	held = fmt.Sprintf("each rank holds %d SMs (one block per SM)", budget)
	if most > 1 {
		held += fmt.Sprintf("; %d ranks packed on a GPU hold %d of its %d SMs", most, most*budget, sms)
	} else {
		held += fmt.Sprintf(" of its GPU's %d", sms)
	}
	if cfg.SMs == 0 {
		held += fmt.Sprintf("; --sms 0: the smaller of the design's default (%d) and the %d that fit", b.Default, b.PerGPU(sms, most))
	}
	return budget, held, nil
}

// CloseDevices closes the devices a run opened.
func CloseDevices(devs []device.Device) {
	for _, d := range devs {
		d.Close()
	}
}

// RankPlacementNoteVia says where a device run's ranks are and how data moves between
// them: through the library via names, else with copies.
func RankPlacementNoteVia(ep int, devs []device.Device, via string) string {
	var note string
	switch {
	case len(devs) == 1 && via != "":
		return fmt.Sprintf("%d EP rank(s) on GPU 0; data moves between ranks through %s", ep, via)
	case len(devs) == 1:
		return fmt.Sprintf("all %d EP ranks on GPU 0, one stream each; data moves between ranks with device-to-device copies", ep)
	case via != "":
		note = fmt.Sprintf("%d EP ranks on %d GPUs (rank r on GPU r·%d/%d), one stream each; data moves between ranks through %s", ep, len(devs), len(devs), ep, via)
	default:
		note = fmt.Sprintf("%d EP ranks on %d GPUs (rank r on GPU r·%d/%d), one stream each; data moves between GPUs with peer copies", ep, len(devs), len(devs), ep)
		if ep > len(devs) {
			note += ", between ranks of one GPU with device-to-device copies"
		}
	}
	var gaps []string
	for a, da := range devs {
		for b, db := range devs {
			if a != b && !da.Reaches(db) {
				gaps = append(gaps, fmt.Sprintf("%d→%d", a, b))
			}
		}
	}
	if gaps != nil {
		note += "; no peer access " + strings.Join(gaps, ", ")
		if via == "" {
			note += ": those copies go through host memory"
		}
	}
	return note
}

// DeviceStatus classifies a device error: running out of device memory is
// an environment limitation (unavailable); anything else a failure.
func DeviceStatus(err error) string {
	var ce *cuda.Error
	if errors.As(err, &ce) && ce.Name == "CUDA_ERROR_OUT_OF_MEMORY" {
		return results.StatusUnavailable
	}
	return results.StatusFailed
}
