package layer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/roundtrip"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// The dispatch benchmark on the cuda device: each point is a deviceLayer
// whose steps are the dispatcher's phases alone, with experts that copy
// their rows, timed by the layer's own events (deviceLayer.step and times),
// on the round trip's inputs uploaded once (no router, no expert weights).
// With copies for experts a token's output is the sum of its k copies:
// k·x, exact in bf16 for the round trip's coarsened inputs, also as the
// partial sums deepep's combine carries (see RoundTrip).

// At fp8 each rank's X holds its packed rows (packFP8: the round trip's
// e4m3 values and UE8M0 1×128 scales, as the host's round trip quantizes
// them), the dispatcher moves them as the layer's fp8 dispatch does, and
// the experts dequantize (dequant_fp8_rows) into their output rows: each
// rank gets k times its dequantized input back.

// benchLayer builds the device layer of one benchmark point: rt's ranks on
// devs (spread as a run spreads them), d bound to them; at fp8 packed holds
// each rank's packed rows.
func benchLayer(l *Layer, rt *roundtrip.Trip, packed [][]uint16, devs []device.Device, th *device.Threads, d dispatchers.DeviceDispatcher) (*DeviceLayer, error) {
	c := l.Cfg
	T, h, k := c.Tokens, c.Hidden, c.TopK
	dl := &DeviceLayer{Layer: l, devs: devs, on: RankToDevice(c.EP, len(devs)), Dispatcher: d, RankBufs: make([]devRank, c.EP), dc: make([]devCommon, len(devs)),
		start: map[string][]device.Event{}, end: map[string][]device.Event{}, caps: d.Capabilities()}
	dl.newThreads(th)
	for i, dev := range devs {
		var err error
		if dl.dc[i].beginS, err = dev.NewStream(); err != nil {
			return dl, err
		}
		if dl.dc[i].begin, err = dev.NewEvent(); err != nil {
			return dl, err
		}
	}
	for r := range c.EP {
		dev := devs[dl.on[r]]
		dl.dc[dl.on[r]].ranks++
		rk := &dispatchers.DeviceRank{ID: r, Dev: dev, Threads: th}
		dl.Ranks = append(dl.Ranks, rk)
		var err error
		if rk.Stream, err = dev.NewStream(); err != nil {
			return dl, err
		}
		var x any = kernels.BF16Bits(rt.X[r])
		xRow := int64(2 * h)
		if packed != nil {
			x, xRow = packed[r], int64(kernels.FP8RowPitch(h))
		}
		if dl.RankBufs[r].bytes, err = device.Resize(dev, 1, device.RowBuffer{P: &rk.X, PerRow: int64(T) * xRow}, device.RowBuffer{P: &rk.Idx, PerRow: int64(4 * T * k)},
			device.RowBuffer{P: &rk.Probs, PerRow: int64(4 * T * k)}, device.RowBuffer{P: &rk.Y, PerRow: int64(2 * T * h)}); err != nil {
			return dl, err
		}
		for _, up := range []struct {
			p   device.Addr
			val any
		}{{rk.X, x}, {rk.Idx, rt.Ranks[r].Idx}, {rk.Probs, rt.Ranks[r].Probs}} {
			if err := dev.Upload(up.p, up.val, rk.Stream); err != nil {
				return dl, err
			}
		}
	}
	if err := d.Bind(dl.shape(), dl.Ranks); err != nil { // at fp8 the dispatched rows are packed rows
		return dl, err
	}
	dl.seq = d.Forward(dl.copyExperts)
	if err := dl.phaseEvents(); err != nil {
		return dl, err
	}
	return dl, dl.sync()
}

// copyExperts is the benchmark's experts: each block of the rank's work
// (DeviceRank.Work; nil: all of ExpertX) copies its segments' rows to its
// output rows.
func (dl *DeviceLayer) copyExperts(r int) error {
	rk, b := dl.Ranks[r], &dl.RankBufs[r]
	row := 2 * int64(dl.Layer.Cfg.Hidden)
	if err := b.Out.Ensure(rk.Dev, rk.Stream, rk.Rows(), device.RowBuffer{P: &rk.ExpertY, PerRow: row}); err != nil {
		return err
	}
	work := rk.Work
	if work == nil {
		work = dl.wholeWork(r)
	}
	for _, w := range work {
		if w.After != nil {
			if err := rk.Dev.Wait(rk.Stream, w.After); err != nil {
				return err
			}
		}
		y := w.Y
		if y == 0 {
			y = rk.ExpertY
		}
		for _, sg := range w.Segments {
			at := device.Addr(int64(sg.Start) * row)
			if dl.Layer.Cfg.IsFP8() { // the packed rows dequantized into the output rows
				S, pitch := dl.Layer.Cfg.Hidden/kernels.FP8Block, int64(kernels.FP8RowPitch(dl.Layer.Cfg.Hidden))
				n := int64(sg.Len * S)
				if err := rk.Dev.LaunchProgram(device.FP8DequantRowsProgram(), fp8Grid(rk.Dev, n), rk.Stream,
					w.X+device.Addr(int64(sg.Start)*pitch), n, int32(S), pitch, y+at); err != nil {
					return err
				}
				continue
			}
			if err := rk.Dev.Copy(y+at, w.X+at, int64(sg.Len)*row, rk.Stream); err != nil {
				return err
			}
		}
		if w.Done != nil {
			if err := rk.Dev.Record(w.Done, rk.Stream); err != nil {
				return err
			}
		}
	}
	return nil
}

// packFP8 quantizes the round trip's rows as its ToFP8 does (1×128 blocks,
// UE8M0 scales) and returns each rank's packed rows: a row's e4m3 values,
// its fp32 multipliers (little-endian), zeros to kernels.FP8RowPitch — as
// 16-bit words for the upload.
func packFP8(rt *roundtrip.Trip) ([][]uint16, error) {
	h := rt.Shape.Hidden
	S, pitch := h/kernels.FP8Block, kernels.FP8RowPitch(h)
	packed := make([][]uint16, len(rt.X))
	for r, x := range rt.X {
		q, s, err := kernels.QuantFP8Rows(x, h, true)
		if err != nil {
			return nil, err
		}
		T := len(x) / h
		b := make([]byte, T*pitch)
		for i := range T {
			row := b[i*pitch:]
			copy(row, q[i*h:(i+1)*h])
			for j := range S {
				binary.LittleEndian.PutUint32(row[h+4*j:], math.Float32bits(s[i*S+j]))
			}
		}
		packed[r] = codeWords(b)
	}
	return packed, rt.ToFP8()
}

// close frees what benchLayer allocated (the dispatcher frees its own).
func (dl *DeviceLayer) closeBench() {
	for r, rk := range dl.Ranks {
		device.Free(rk.Dev, &rk.X, &rk.Idx, &rk.Probs, &rk.Y, &rk.ExpertY)
		dl.RankBufs[r] = devRank{}
	}
}

// roundTripVerdict is "exact" when every rank's Y is k times its input,
// else the first difference.
func (dl *DeviceLayer) roundTripVerdict(rt *roundtrip.Trip) (string, error) {
	c := dl.Layer.Cfg
	y := make([]uint16, c.Tokens*c.Hidden)
	for r, rk := range dl.Ranks {
		if err := rk.Dev.Download(y, rk.Y, rk.Stream); err != nil {
			return "", err
		}
		for i, v := range kernels.FromBF16Bits(y) {
			if want := float32(c.TopK) * rt.X[r][i]; v != want {
				return fmt.Sprintf("rank %d token %d element %d: %g back, want %d × input = %g", r, i/c.Hidden, i%c.Hidden, v, c.TopK, want), nil
			}
		}
	}
	return "exact", nil
}

// DeviceRoundTrip is one dispatcher's round trip timed on the cuda device
// (TimeRoundTrip): what the dispatch benchmark makes a point of. On an
// error it holds what was found before it.
type DeviceRoundTrip struct {
	// Budget is the SM budget fitted to the GPUs, each block holding an
	// SM, and HeldNote how the ranks share a GPU's SMs; HeldNote "": the
	// budget was not fitted (the dispatcher is not SM-driven)
	Budget   int
	HeldNote string
	// SMUse is GPM's SM utilisation over the timed steps, or why it was
	// not measured; "" before the steps ran
	SMUse string
	// Mismatch is the round trip's first difference, where it was not exact
	Mismatch string
	Steps    []dispatchers.Step     // the phases, in order
	Samples  map[string][][]float64 // [phase][rank][iter] ms
	Traffic  dispatchers.Traffic
	// BufferBytes is the dispatcher's own buffers, every rank's, after the
	// timed steps (Footprint)
	BufferBytes int64
}

// TimeRoundTrip times one dispatcher at c's budget on devs with l's
// routing: warm-up and timed steps of its phases, the outputs poisoned
// before and checked after each, and GPM's SM utilisation over the timed
// steps where NVML has it.
func TimeRoundTrip(c setup.Config, l *Layer, devs []device.Device) (DeviceRoundTrip, error) {
	var p DeviceRoundTrip
	if err := FP8Refusal(c, devs); err != nil {
		return p, err
	}
	budget, held, err := FitSMBudget(c, devs, nil)
	if err != nil {
		return p, err
	}
	if held != "" { // the budget that fits the GPUs, each block holding an SM
		c.SMs, p.Budget, p.HeldNote = budget, budget, held
	}
	d, err := dispatchers.NewDevice(c.Dispatcher, c.Impl, c.DispatcherEnv())
	if err != nil {
		return p, err
	}
	th := device.NewThreads(devs)
	defer th.Close()
	defer d.Close() // before the threads end
	rt := roundtrip.New(l.Shape, l.X, l.Ranks)
	var packed [][]uint16
	if c.IsFP8() { // the round trip's rows quantized, as the host's (never bf16 rows under an fp8 label)
		if packed, err = packFP8(rt); err != nil {
			return p, err
		}
	}
	defer func(p string) { l.Cfg.Precision = p }(l.Cfg.Precision)
	l.Cfg.Precision = c.Precision // the point's (the device layer's shape and experts follow it); the points run one at a time
	dl, err := benchLayer(l, rt, packed, devs, th, d)
	defer dl.closeBench()
	if err != nil {
		return p, err
	}
	samples, steps := map[string][][]float64{}, make([][]float64, c.EP)
	for _, st := range dl.seq {
		samples[st.Name] = make([][]float64, c.EP)
	}
	var tm *Telemetry
	p.SMUse = "not measured"
	for i := -c.Warmup; i < c.Iters; i++ {
		if i == 0 {
			var why string
			if tm, why = StartTelemetry(GPUBusID(devs[0])); tm == nil {
				p.SMUse = "not measured: " + why
			}
		}
		for _, rk := range dl.Ranks {
			if err := rk.Dev.Fill16(rk.Y, 0x7fc0, int64(c.Tokens*c.Hidden), rk.Stream); err != nil { // NaN
				tm.Finish()
				return p, err
			}
		}
		if err := dl.Step(); err != nil {
			tm.Finish()
			return p, err
		}
		v, err := dl.roundTripVerdict(rt)
		if err == nil && v != "exact" {
			p.Mismatch, err = v, errors.New("round trip: "+v)
		}
		if err == nil && i >= 0 {
			err = dl.Times(samples, steps)
		}
		if err != nil {
			tm.Finish()
			return p, err
		}
	}
	if tm != nil {
		_, p.SMUse = tm.Finish()
		if len(devs) > 1 {
			p.SMUse += " (GPU 0's; the others' are not sampled)"
		}
	}
	p.Steps, p.Samples, p.Traffic = dl.seq, samples, d.Traffic()
	for r := range c.EP {
		p.BufferBytes += d.Footprint(r)
	}
	return p, nil
}
