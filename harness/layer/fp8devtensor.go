package layer

// The per-tensor FP8 GEMM path on the cuda device (gemm.fp8_path
// cublaslt-fp8-tensor; fp8tensor.go is the host's, and the design): per
// expert segment of a block of work, dequant_fp8_rows into bf16 rows (the
// tape's in a training step), amax_fp8_tensor into a zeroed word and
// quant_fp8_tensor into e4m3 codes and one multiplier, fc1 as
// Grouped{FP8: FP8Tensor} on the expert's per-tensor e4m3 weights (uploaded
// once with their multiplier), swiGLUProbs, the same two kernels on each
// segment's activation, fc2. A segment is one expert's rows on its rank in
// the step where the work is the whole rows (wholeWork); the reference
// takes each tensor over all of the expert's routed rows.

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// FP8GEMMOffered, set by tests alone, replaces what every device answers
// for the FP8 GEMM its library offers (CUDA.FP8GEMMPath; Emu: block). On
// hostsim the fake driver at FAKECUDA_CC=89 answers per tensor honestly;
// Emu has no compute capability to ask.
var FP8GEMMOffered kernels.FP8GEMMPath

// fp8TensorDistributed is why a run over several processes runs bf16 on
// dequantized rows where the devices offer the per-tensor FP8 GEMM only.
const fp8TensorDistributed = fp8DequantWhy + "the devices offer cublaslt-fp8-tensor, but in a run over " +
	"several processes the check's reference cannot take a tensor's multiplier over all of the expert's routed rows (each process holds its own ranks' routing)"

// fp8TensorRefOver is how many times the check's FLOP budget
// (setup.RefFLOPBudget) the per-tensor reference's pass over every routed
// row may take (unless --check all asks for the whole reference anyway).
const fp8TensorRefOver = 8

// fp8TensorRefFLOPs is the per-tensor reference's pass that the check's
// sample does not shrink: fc1 in float64 over every routed row (each
// tensor's multiplier spans them all; check/fp8tensor.go), 4·h·f a copy.
func fp8TensorRefFLOPs(c setup.Config) float64 {
	return 4 * float64(c.Hidden) * float64(c.FFN) * float64(c.EP) * float64(c.Tokens) * float64(c.TopK)
}

// fp8LayerPath is FP8GEMMPath, but bf16-dequant in place of the
// per-tensor path in a run over several processes (fp8TensorDistributed)
// and where the check's reference could not afford the tensors'
// multipliers (fp8TensorRefFLOPs beyond fp8TensorRefOver budgets, without
// --check all; a run without the check keeps the path): a check that ran
// for hours is not one to wait for.
func fp8LayerPath(devs []device.Device, c setup.Config, distributed bool) (kernels.FP8GEMMPath, string) {
	path, why := FP8GEMMPath(devs, c)
	if path != kernels.FP8GEMMTensor {
		return path, why
	}
	if distributed {
		return kernels.FP8GEMMDequant, fp8TensorDistributed + " (" + why + ")"
	}
	if n, most := fp8TensorRefFLOPs(c), fp8TensorRefOver*setup.RefFLOPBudget; c.Check && !c.CheckAll && n > most {
		return kernels.FP8GEMMDequant, fmt.Sprintf(fp8DequantWhy+"the devices offer cublaslt-fp8-tensor, but its check "+
			"takes each tensor's multiplier over every routed row, fc1 in float64 on all of them (%.3g FLOPs, more than %d times the check's budget of %.3g; "+
			"--check all pays it) (%s)", n, fp8TensorRefOver, setup.RefFLOPBudget, why)
	}
	return path, why
}

// FP8Path is the expert GEMM path the layer runs at fp8 (FP8GEMMPath, and
// bf16-dequant instead of per tensor over several processes or beyond the
// check's budget: fp8LayerPath), and why.
func (dl *DeviceLayer) FP8Path() (kernels.FP8GEMMPath, string) { return dl.fp8Path, dl.fp8Why }

// fp8TensorStride is the bytes a segment's words take in the operand
// buffers: its amax word, then 16 bytes on, its multiplier (each 16-byte
// aligned).
const fp8TensorStride = 32

// uploadFP8Tensor uploads expert e's per-tensor e4m3 weights and their
// multipliers (w) to its owner rank's devFP8 (n1 = n2 = 4 floats an
// expert: one multiplier, 16-byte aligned).
func (dl *DeviceLayer) uploadFP8Tensor(e int, w *fp8TensorWeights) error {
	return dl.uploadExpertFP8(e, w.q1, w.q2, []float32{w.s1, 0, 0, 0}, []float32{w.s2, 0, 0, 0})
}

// allocFP8Tensor allocates rank r's devFP8 weights for the per-tensor path.
func (dl *DeviceLayer) allocFP8Tensor(r int) error {
	c, rk, b := dl.Layer.Cfg, dl.Ranks[r], &dl.RankBufs[r]
	h, f, L := c.Hidden, c.FFN, dl.Layer.Shape.LocalExperts()
	b.fp8 = &devFP8{n1: 4, n2: 4}
	held, err := device.Resize(rk.Dev, 1, device.RowBuffer{P: &b.fp8.q1, PerRow: int64(L * 2 * f * h)}, device.RowBuffer{P: &b.fp8.q2, PerRow: int64(L * h * f)},
		device.RowBuffer{P: &b.fp8.s1, PerRow: int64(16 * L)}, device.RowBuffer{P: &b.fp8.s2, PerRow: int64(16 * L)})
	b.bytes += held
	return err
}

// quantTensor queues the per-tensor quantization of n bf16 values at x:
// the word at amax zeroed, amax_fp8_tensor, quant_fp8_tensor into codes q
// and the multiplier at s.
func (dl *DeviceLayer) quantTensor(r int, x device.Addr, n int64, amax, q, s device.Addr) error {
	rk := dl.Ranks[r]
	if err := rk.Dev.Fill16(amax, 0, 2, rk.Stream); err != nil {
		return err
	}
	grid := fp8Grid(rk.Dev, n/kernels.FP8Block+1)
	na := n
	if FP8DevFault == "t-half" { // tests: the multiplier from the first half of the values
		na = n / 2
	}
	if err := rk.Dev.LaunchProgram(device.FP8AmaxTensorProgram(), grid, rk.Stream, x, na, amax); err != nil {
		return err
	}
	return rk.Dev.LaunchProgram(device.FP8QuantTensorProgram(), grid, rk.Stream, x, n, int32(0), amax, q, s)
}

// computeFP8Tensor queues the per-tensor FP8 GEMM path of one block of
// work, rows [lo, hi), on its bf16 rows at x (row lo first; dequantized
// by the caller) into h1 and act (bf16 [hi-lo, 2f], [hi-lo, f]) and y (row
// 0 of w's output at y).
func (dl *DeviceLayer) computeFP8Tensor(r int, w *dispatchers.DeviceWork, lo, hi int, x, h1, act, y device.Addr) error {
	c, rk, b := dl.Layer.Cfg, dl.Ranks[r], &dl.RankBufs[r]
	h, f, L, fp := c.Hidden, c.FFN, dl.Layer.Shape.LocalExperts(), b.fp8
	segs := 0
	for _, sg := range w.Segments {
		if sg.Len == 0 {
			continue
		}
		if sg.FC1 != 0 || sg.Expert/L != r {
			return fmt.Errorf("fp8 per-tensor GEMM path: segment of expert %d on rank %d has weights at fc1 %#x (the FP8 GEMM takes the rank's own experts' e4m3 weights only)", sg.Expert, r, sg.FC1)
		}
		segs++
	}
	// xs, as: each segment's amax word and multiplier (fp8TensorStride bytes)
	if err := fp.ops.Ensure(rk.Dev, rk.Stream, hi-lo+fp8TensorStride/4*segs, device.RowBuffer{P: &fp.xq, PerRow: int64(h)}, device.RowBuffer{P: &fp.xs, PerRow: 4},
		device.RowBuffer{P: &fp.aq, PerRow: int64(f)}, device.RowBuffer{P: &fp.as, PerRow: 4}); err != nil {
		return err
	}
	groups := func(second bool) ([]device.Group, error) {
		b.groups = b.groups[:0]
		at := 0 // the segment's words
		for _, sg := range w.Segments {
			if sg.Len == 0 {
				continue
			}
			e, row := sg.Expert-r*L, sg.Start-lo
			var g device.Group
			var err error
			if !second {
				words := fp.xs + device.Addr(fp8TensorStride*at)
				g = device.Group{C: h1 + device.Addr(2*row*2*f), A: fp.xq + device.Addr(row*h), W: fp.q1 + device.Addr(e*2*f*h),
					AScale: words + 16, WScale: fp.s1 + device.Addr(4*e*fp.n1), M: sg.Len}
				err = dl.quantTensor(r, x+device.Addr(2*row*h), int64(sg.Len*h), words, g.A, g.AScale)
				if FP8DevFault == "t-wscale" { // tests: fc1 given the weights' multiplier for the activations'
					g.AScale = g.WScale
				}
			} else {
				words := fp.as + device.Addr(fp8TensorStride*at)
				g = device.Group{C: y + device.Addr(2*sg.Start*h), A: fp.aq + device.Addr(row*f), W: fp.q2 + device.Addr(e*h*f),
					AScale: words + 16, WScale: fp.s2 + device.Addr(4*e*fp.n2), M: sg.Len}
				err = dl.quantTensor(r, act+device.Addr(2*row*f), int64(sg.Len*f), words, g.A, g.AScale)
			}
			if err != nil {
				return nil, err
			}
			b.groups = append(b.groups, g)
			at++
		}
		return b.groups, nil
	}
	dl.Layer.fp8Unweighted.Store(w.Probs == 0) // fc2's tensor without the routing weights (the reference's too); every block of a step agrees
	return dl.fp8Groups(r, w, lo, hi, act, h1, cuda.FP8Tensor, groups)
}
