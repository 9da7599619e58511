package check

import (
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels"
)

// fp8TensorExpert is expert e's reference outputs, in copies' order, on
// the per-tensor FP8 GEMM path (harness/layer/fp8tensor.go). A tensor's
// amax spans every row of the expert on its rank in the step, so the
// multipliers come from ALL the expert's routed rows (the layer's routing,
// every rank's Idx), not from the check's sample: x̃ (the 1×128 quantized
// input dequantized to bf16, Layer.ExpertInput) quantized per tensor, fc1
// (fc1, the weights per tensor, exact in float64) on every routed row, its
// output rounded to bf16 as the layer stores it, SwiGLU × prob rounded to
// bf16, that activation quantized per tensor, then fc2 (fc2) on the
// sampled copies. The probabilities are the reference's for the sampled
// copies, the layer's for the others (they only enter fc2's multiplier).
// Where the layer's experts apply no routing weight (the combine does:
// FP8TensorUnweighted) the activation is SwiGLU(h1) alone and each output
// row is fc2's times its probability.
func fp8TensorExpert(l *layer.Layer, copies []refCopy, probs [][]float64, e int, fc1, fc2 []float64) []float64 {
	c := l.Cfg
	h, f, k := c.Hidden, c.FFN, c.TopK
	type routed struct{ rank, slot int }
	var all []routed
	where := map[routed]int{}
	for r, rk := range l.Ranks {
		for s, x := range rk.Idx {
			if int(x) == e {
				where[routed{r, s}] = len(all)
				all = append(all, routed{r, s})
			}
		}
	}
	n := len(all)
	x, p := make([]float32, n*h), make([]float64, n)
	for i, a := range all {
		t := a.slot / k
		copy(x[i*h:(i+1)*h], l.ExpertInput(a.rank)[t*h:(t+1)*h])
		p[i] = float64(l.Ranks[a.rank].Probs[a.slot])
	}
	for _, cp := range copies {
		p[where[routed{cp.rank, cp.slot}]] = probs[cp.rank][cp.slot]
	}
	unweighted := l.FP8TensorUnweighted()
	qx, sx := kernels.QuantFP8Tensor(x)
	act := make([]float32, n*f) // every routed row's bf16 activation
	var xa, h1, a64 []float64
	for lo := 0; lo < n; lo += setup.RefBlock {
		m := min(setup.RefBlock, n-lo)
		xa = layer.DequantTensor64(xa, qx[lo*h:(lo+m)*h], sx)
		h1, a64 = kernels.Reslice(h1, m*2*f), kernels.Reslice(a64, m*f)
		kernels.MatMulNT(h1, xa, fc1, m, 2*f, h)
		for i, v := range h1 { // fc1's output as the layer stores it (bf16)
			h1[i] = float64(kernels.RoundBF16(float32(v)))
		}
		pm := p[lo : lo+m]
		if unweighted {
			pm = nil // probability 1
		}
		kernels.SwiGLUProb(a64, h1, pm, m, f)
		for i, v := range a64 { // the activation as the layer stores it (bf16), then quantized
			act[lo*f+i] = kernels.RoundBF16(float32(v))
		}
	}
	qa, sa := kernels.QuantFP8Tensor(act)
	y := make([]float64, len(copies)*h)
	for lo := 0; lo < len(copies); lo += setup.RefBlock {
		m := min(setup.RefBlock, len(copies)-lo)
		a64 = kernels.Reslice(a64, m*f)
		for i, cp := range copies[lo : lo+m] {
			j := where[routed{cp.rank, cp.slot}]
			layer.DequantTensor64(a64[i*f:(i+1)*f], qa[j*f:(j+1)*f], sa)
		}
		kernels.MatMulNT(y[lo*h:], a64, fc2, m, h, f)
		if unweighted {
			for i, cp := range copies[lo : lo+m] {
				for j := range h {
					y[(lo+i)*h+j] *= probs[cp.rank][cp.slot]
				}
			}
		}
	}
	return y
}

// fp8TensorFC1 is GradProblem.FC1Out on the per-tensor FP8 GEMM path: the
// forward's fc1 output, exact in float64 on the per-tensor operands — each
// copy's x̃ quantized with the multiplier of all the expert's routed rows
// (as fp8TensorExpert), fc1 quantized per tensor — so that the gradient
// reference reads the h1 the layer's backward reads (its saved fc1
// output), the requantization straight-through. origin is each of the
// gradient problem's tokens' rank and token.
func fp8TensorFC1(l *layer.Layer, origin [][2]int) func(e int, slots []int, z []float64) {
	return func(e int, slots []int, z []float64) {
		c := l.Cfg
		h, f, k := c.Hidden, c.FFN, c.TopK
		var amax float32 // over every routed row of e (the layer's routing)
		for r, rk := range l.Ranks {
			x := l.ExpertInput(r)
			for s, ex := range rk.Idx {
				if int(ex) == e {
					for _, v := range x[s/k*h : (s/k+1)*h] {
						amax = max(amax, abs32(v))
					}
				}
			}
		}
		fc1, _ := l.FP8TensorRefWeights(e, nil, nil)
		row, q := make([]float32, h+1), make([]uint8, h+1)
		xa := make([]float64, len(slots)*h)
		for i, s := range slots {
			o := origin[s/k]
			copy(row, l.ExpertInput(o[0])[o[1]*h:(o[1]+1)*h])
			row[h] = amax // the tensor's amax: the row's multiplier is the tensor's
			layer.DequantTensor64(xa[i*h:(i+1)*h], q[:h], kernels.QuantFP8TensorInto(q, row))
		}
		kernels.MatMulNT(z, xa, fc1, len(slots), 2*f, h)
	}
}

func abs32(v float32) float32 {
	if v < 0 {
		return -v
	}
	return v
}
