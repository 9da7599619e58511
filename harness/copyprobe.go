package harness

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// probeCopies finds out what runs FEPLB's phase-2 copies (CopyBatch) on a
// GPU. Same-device copies may run on the copy engines or on the SMs, and
// the CUDA documentation does not say which (docs/references.md, CUDA
// bindings), so it measures: the slowdown of a compute-bound GEMM stream while
// copies run on another stream, and the GPU's SM utilisation (GPM) while
// only the copies run. Verdict: "copy engines" when the SMs stay under 10%
// busy and the GEMM slows by under 15%; "SMs" from 50% or 30%; else
// "unclear". It returns the verdict with its numbers.
func probeCopies(dev device.Device, seed uint64) (string, error) {
	const n, copyBytes, gemms = 4096, 256 << 20, 50
	var a, w, c, src, dst device.Addr
	defer device.Free(dev, &a, &w, &c, &src, &dst)
	if _, err := device.Resize(dev, 1, device.RowBuffer{P: &a, PerRow: 2 * n * n}, device.RowBuffer{P: &w, PerRow: 2 * n * n},
		device.RowBuffer{P: &c, PerRow: 2 * n * n}, device.RowBuffer{P: &src, PerRow: copyBytes}, device.RowBuffer{P: &dst, PerRow: copyBytes}); err != nil {
		return "", err
	}
	sg, err := dev.NewStream()
	if err != nil {
		return "", err
	}
	sc, err := dev.NewStream()
	if err != nil {
		return "", err
	}
	var ev [4]device.Event
	for i := range ev {
		if ev[i], err = dev.NewEvent(); err != nil {
			return "", err
		}
	}
	g := rand.New(rand.NewPCG(seed, 0xce))
	host := make([]float32, n*n)
	for _, p := range []device.Addr{a, w} { // never time on zeros
		for i := range host {
			host[i] = float32(g.NormFloat64())
		}
		if err := dev.Upload(p, kernels.BF16Bits(host), sg); err != nil {
			return "", err
		}
	}
	if err := dev.Copy(src, a, 2*n*n, sg); err != nil {
		return "", err
	}
	ops := []device.CopyOp{{Dst: dst, Src: src, Bytes: copyBytes}}
	run := func(reps int, s device.Stream, gemm bool) error {
		for range reps {
			var err error
			if gemm {
				err = dev.GEMM(c, a, w, n, n, n, false, s)
			} else {
				err = dev.CopyBatch(ops, s)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	timed := func(s device.Stream, fn func() error) (float64, error) {
		if err := dev.Record(ev[0], s); err != nil {
			return 0, err
		}
		if err := fn(); err != nil {
			return 0, err
		}
		if err := dev.Record(ev[1], s); err != nil {
			return 0, err
		}
		if err := dev.SyncStream(s); err != nil {
			return 0, err
		}
		return dev.Elapsed(ev[0], ev[1])
	}
	if err := run(3, sg, true); err != nil { // warm-up
		return "", err
	}
	if err := run(3, sc, false); err != nil {
		return "", err
	}
	if err := dev.SyncStream(sc); err != nil {
		return "", err
	}
	alone, err := timed(sg, func() error { return run(gemms, sg, true) })
	if err != nil {
		return "", err
	}
	perCopy, err := timed(sc, func() error { return run(8, sc, false) })
	if err != nil {
		return "", err
	}
	perCopy /= 8
	cover := int(math.Ceil(alone/max(perCopy, 1e-3))) + 1
	beside, err := timed(sg, func() error { // the copies start with the GEMMs and outlast them
		if err := dev.Record(ev[2], sg); err != nil {
			return err
		}
		if err := dev.Wait(sc, ev[2]); err != nil {
			return err
		}
		if err := run(cover, sc, false); err != nil {
			return err
		}
		return run(gemms, sg, true)
	})
	if err != nil {
		return "", err
	}
	if err := dev.SyncStream(sc); err != nil {
		return "", err
	}
	util := "SM utilisation not measured: "
	busy := math.NaN()
	tm, why := startTelemetry(gpuBusID(dev))
	if tm != nil {
		err := run(int(math.Ceil(300/max(perCopy, 1e-3))), sc, false) // ≥ 300 ms of copies alone
		if err == nil {
			err = dev.SyncStream(sc)
		}
		t, _ := tm.finish()
		if err != nil {
			return "", err
		}
		if t.GPM {
			busy = t.SMUtilPct
			util = fmt.Sprintf("SM utilisation %.1f%% while only the copies ran (GPM, whole GPU, ≥ 300 ms)", busy)
		} else {
			util += fmt.Sprint(t.Unread)
		}
	} else {
		util += why
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
		verdict, util, gemms, n, alone, beside, 100*slow, 2*copyBytes/perCopy/1e6, dev.BatchMethod()), nil
}
