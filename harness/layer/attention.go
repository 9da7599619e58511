package layer

import (
	"fmt"
	"math"

	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// The attention stand-in (--attention-ms): work for overlap to hide
// behind, as the rest of a transformer layer gives it. Each rank runs, as
// the forward's first phase ("attention"), a chain of dense bf16 GEMMs
// [T, h] × [h, h]ᵀ on its input, and as the backward's last phase
// ("attention-bwd") the same chain on its input gradient; the chain's
// length is calibrated on the device so that a pass takes about the asked
// time. Their outputs go to a scratch buffer nothing reads: the layer's
// output and gradients are the same with the stand-in as without.

// attention is the stand-in's state on a device layer.
type attention struct {
	w, out []device.Addr // per rank: the weight [h, h] bf16, the scratch [T, h] bf16
	reps   int           // GEMMs a pass
	gemmMS float64       // one GEMM's calibrated time
}

// newAttention sets the stand-in up when the configuration asks for it:
// the weight drawn from the seed, the scratch, and the chain's length from
// GEMMs timed on rank 0's stream.
func (dl *DeviceLayer) newAttention() error {
	c := dl.Layer.Cfg
	if c.AttentionMS <= 0 {
		return nil
	}
	T, h := c.Tokens, c.Hidden
	a := &attention{w: make([]device.Addr, len(dl.Ranks)), out: make([]device.Addr, len(dl.Ranks)), reps: 1}
	wt := kernels.BF16Bits(normal(c.Seed, "attention", 0, h*h, 1/math.Sqrt(float64(h))))
	first := -1
	for r, rk := range dl.Ranks {
		if !dl.Local(r) {
			continue
		}
		if first < 0 {
			first = r
		}
		var err error
		if a.w[r], err = rk.Dev.Alloc(int64(2 * h * h)); err != nil {
			return err
		}
		if a.out[r], err = rk.Dev.Alloc(int64(2 * T * h)); err != nil {
			return err
		}
		if err := rk.Dev.Upload(a.w[r], wt, rk.Stream); err != nil {
			return err
		}
		dl.RankBufs[r].bytes += int64(2*h*h + 2*T*h)
	}
	dl.Attn = a
	if first < 0 {
		return nil
	}
	rk := dl.Ranks[first]
	gemm := func() error { return rk.Dev.GEMM(a.out[first], dl.input(first), a.w[first], T, h, h, false, rk.Stream) }
	if err := gemm(); err != nil { // a first call may tune the shape
		return err
	}
	if err := rk.Dev.SyncStream(rk.Stream); err != nil {
		return err
	}
	e0, err := rk.Dev.NewEvent()
	if err != nil {
		return err
	}
	e1, err := rk.Dev.NewEvent()
	if err != nil {
		return err
	}
	const n = 3
	if err := rk.Dev.Record(e0, rk.Stream); err != nil {
		return err
	}
	for range n {
		if err := gemm(); err != nil {
			return err
		}
	}
	if err := rk.Dev.Record(e1, rk.Stream); err != nil {
		return err
	}
	if err := rk.Dev.SyncStream(rk.Stream); err != nil {
		return err
	}
	ms, err := rk.Dev.Elapsed(e0, e1)
	if err != nil {
		return err
	}
	a.gemmMS = ms / n
	if a.gemmMS > 0 {
		a.reps = int(math.Round(c.AttentionMS / a.gemmMS))
	}
	a.reps = min(max(a.reps, 1), 100_000)
	return nil
}

// attentionPass queues the stand-in's chain on rank r from in [T, h].
func (dl *DeviceLayer) attentionPass(r int, in device.Addr) error {
	c, rk, a := dl.Layer.Cfg, dl.Ranks[r], dl.Attn
	for range a.reps {
		if err := rk.Dev.GEMM(a.out[r], in, a.w[r], c.Tokens, c.Hidden, c.Hidden, false, rk.Stream); err != nil {
			return err
		}
	}
	return nil
}

// attentionForward is the "attention" phase: the chain on the input.
func (dl *DeviceLayer) attentionForward(r int) error { return dl.attentionPass(r, dl.input(r)) }

// attentionBackward is the "attention-bwd" phase: the chain on the input
// gradient.
func (dl *DeviceLayer) attentionBackward(r int) error {
	return dl.attentionPass(r, dl.RankBufs[r].g.dx)
}

// Describe says what the stand-in ran, for the record.
func (a *attention) Describe(c setup.Config) string {
	return fmt.Sprintf("attention stand-in (--attention-ms %g): %d dense bf16 GEMMs [%d, %d]×[%d, %d]ᵀ a pass (forward on the input, backward on the input gradient), one calibrated at %.4g ms on this device; their outputs are read by nothing",
		c.AttentionMS, a.reps, c.Tokens, c.Hidden, c.Hidden, c.Hidden, a.gemmMS)
}
