package layer

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// ProbeCopies finds out what runs FEPLB's phase-2 copies (CopyBatch) on a
// GPU. Same-device copies may run on the copy engines or on the SMs, and
// the CUDA documentation does not say which (docs/references.md, CUDA
// bindings), so it measures: the slowdown of a compute-bound GEMM stream while
// copies run on another stream, and the GPU's SM utilisation (GPM) while
// only the copies run. Verdict: "copy engines" when the SMs stay under 10%
// busy and the GEMM slows by under 15%; "SMs" from 50% or 30%; else
// "unclear". It returns the verdict with its numbers.
func ProbeCopies(dev device.Device, seed uint64) (string, error) {
	p := &copyProbe{dev: dev}
	defer device.Free(dev, &p.a, &p.w, &p.c, &p.src, &p.dst)
	if err := p.setUp(seed); err != nil {
		return "", err
	}
	if err := p.run(3, p.sg, true); err != nil { // warm-up
		return "", err
	}
	if err := p.run(3, p.sc, false); err != nil {
		return "", err
	}
	if err := dev.SyncStream(p.sc); err != nil {
		return "", err
	}
	alone, err := p.timed(p.sg, func() error { return p.run(probeGEMMs, p.sg, true) })
	if err != nil {
		return "", err
	}
	perCopy, err := p.timed(p.sc, func() error { return p.run(8, p.sc, false) })
	if err != nil {
		return "", err
	}
	perCopy /= 8
	cover := int(math.Ceil(alone/max(perCopy, 1e-3))) + 1
	beside, err := p.timed(p.sg, func() error { // the copies start with the GEMMs and outlast them
		if err := dev.Record(p.ev[2], p.sg); err != nil {
			return err
		}
		if err := dev.Wait(p.sc, p.ev[2]); err != nil {
			return err
		}
		if err := p.run(cover, p.sc, false); err != nil {
			return err
		}
		return p.run(probeGEMMs, p.sg, true)
	})
	if err != nil {
		return "", err
	}
	if err := dev.SyncStream(p.sc); err != nil {
		return "", err
	}
	busy, util, err := p.smUtil(perCopy)
	if err != nil {
		return "", err
	}
	slow := beside/alone - 1
	verdict := "unclear which engine runs the copies"
	switch {
	case (math.IsNaN(busy) || busy < 10) && slow < 0.15:
		verdict = "copy engines run the copies"
	case busy >= 50 || slow >= 0.3:
		verdict = "the SMs run the copies"
	}
	return fmt.Sprintf("%s, by measurement: %s; %d GEMMs of %d³ bf16 took %.2f ms alone and %.2f ms beside the copies (%+.0f%%); copies alone %.0f GB/s (read + write) [%s]",
		verdict, util, probeGEMMs, probeN, alone, beside, 100*slow, 2*probeCopyBytes/perCopy/1e6, dev.BatchMethod()), nil
}

// The copy probe's sizes: n×n GEMMs, copies of copyBytes, the GEMMs timed.
const probeN, probeCopyBytes, probeGEMMs = 4096, 256 << 20, 50

// copyProbe is probeCopies' buffers, streams (sg the GEMMs', sc the
// copies') and events.
type copyProbe struct {
	dev               device.Device
	a, w, c, src, dst device.Addr
	sg, sc            device.Stream
	ev                [4]device.Event
	ops               []device.CopyOp
}

// setUp allocates the buffers, makes the streams and events and fills the
// GEMMs' operands (never time on zeros) and the copies' source.
func (p *copyProbe) setUp(seed uint64) error {
	const n = probeN
	dev := p.dev
	if _, err := device.Resize(dev, 1, device.RowBuffer{P: &p.a, PerRow: 2 * n * n}, device.RowBuffer{P: &p.w, PerRow: 2 * n * n},
		device.RowBuffer{P: &p.c, PerRow: 2 * n * n}, device.RowBuffer{P: &p.src, PerRow: probeCopyBytes}, device.RowBuffer{P: &p.dst, PerRow: probeCopyBytes}); err != nil {
		return err
	}
	var err error
	if p.sg, err = dev.NewStream(); err != nil {
		return err
	}
	if p.sc, err = dev.NewStream(); err != nil {
		return err
	}
	for i := range p.ev {
		if p.ev[i], err = dev.NewEvent(); err != nil {
			return err
		}
	}
	g := rand.New(rand.NewPCG(seed, 0xce))
	host := make([]float32, n*n)
	for _, a := range []device.Addr{p.a, p.w} { // never time on zeros
		for i := range host {
			host[i] = float32(g.NormFloat64())
		}
		if err := dev.Upload(a, kernels.BF16Bits(host), p.sg); err != nil {
			return err
		}
	}
	if err := dev.Copy(p.src, p.a, 2*n*n, p.sg); err != nil {
		return err
	}
	p.ops = []device.CopyOp{{Dst: p.dst, Src: p.src, Bytes: probeCopyBytes}}
	return nil
}

// run issues reps GEMMs (gemm) or copy batches on s.
func (p *copyProbe) run(reps int, s device.Stream, gemm bool) error {
	for range reps {
		var err error
		if gemm {
			err = p.dev.GEMM(p.c, p.a, p.w, probeN, probeN, probeN, false, s)
		} else {
			err = p.dev.CopyBatch(p.ops, s)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// timed is the milliseconds fn's work takes on s, by events.
func (p *copyProbe) timed(s device.Stream, fn func() error) (float64, error) {
	dev := p.dev
	if err := dev.Record(p.ev[0], s); err != nil {
		return 0, err
	}
	if err := fn(); err != nil {
		return 0, err
	}
	if err := dev.Record(p.ev[1], s); err != nil {
		return 0, err
	}
	if err := dev.SyncStream(s); err != nil {
		return 0, err
	}
	return dev.Elapsed(p.ev[0], p.ev[1])
}

// smUtil is the GPU's SM utilisation (GPM) while only copies run, for at
// least 300 ms (perCopy: one batch's milliseconds), NaN where not
// measured, with what the verdict says of it.
func (p *copyProbe) smUtil(perCopy float64) (busy float64, util string, err error) {
	util = "SM utilisation not measured: "
	busy = math.NaN()
	tm, why := StartTelemetry(GPUBusID(p.dev))
	if tm == nil {
		return busy, util + why, nil
	}
	err = p.run(int(math.Ceil(300/max(perCopy, 1e-3))), p.sc, false) // ≥ 300 ms of copies alone
	if err == nil {
		err = p.dev.SyncStream(p.sc)
	}
	t, _ := tm.Finish()
	if err != nil {
		return 0, "", err
	}
	if t.GPM {
		busy = t.SMUtilPct
		return busy, fmt.Sprintf("SM utilisation %.1f%% while only the copies ran (GPM, whole GPU, ≥ 300 ms)", busy), nil
	}
	return busy, util + fmt.Sprint(t.Unread), nil
}
