package layer

// The per-tensor FP8 GEMM path (gemm.fp8_path cublaslt-fp8-tensor; issue 34
// item 3, docs/fp8.md "Per-tensor scaling"): what cuBLASLt runs where it
// has FP8 with one multiplier per operand only (sm_89, sm_100, sm_90
// before 12.9). A GEMM's operand is one expert's rows on its rank in the
// step (a segment, never split into ExpertBlock rows):
//
//	x̃   = the segment's rows dequantized 1×128 as dispatched (dequantRows), bf16
//	h1  = bf16(FP8GEMM(QuantFP8Tensor(x̃), QuantFP8Tensor(fc1)))
//	act = bf16(SwiGLU(h1) × prob)
//	y   = bf16(FP8GEMM(QuantFP8Tensor(act), QuantFP8Tensor(fc2)))
//
// fc1 and fc2 are the bf16 dequantized (128×128) weights the layer holds,
// one multiplier each per expert. The cuda layer runs the same (fp8dev.go,
// computeFP8Tensor: dequant_fp8_rows, amax_fp8_tensor, quant_fp8_tensor).
// The check's reference (check.refExperts) takes the multipliers from all
// of the expert's routed rows (the layer's routing), not its sample.

import (
	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
)

// FP8Tensor says whether the layer runs its expert GEMMs through the
// per-tensor FP8 GEMM (the host device at fp8 with FP8GEMMHostPath
// tensor; the cuda device's layer where FP8GEMMPath chose it), and so
// whether its reference takes the per-tensor operands.
func (l *Layer) FP8Tensor() bool {
	if !l.Cfg.IsFP8() {
		return false
	}
	if l.Cfg.Device == "cuda" {
		return l.fp8DevTensor
	}
	return FP8GEMMHostPath == kernels.FP8GEMMTensor
}

// FP8TensorUnweighted says whether the per-tensor path's last step
// quantized fc2's input without the routing weights: the expert applied
// none, the combine applies them (NCCL EP's low-latency mode), so that
// fc2's tensor is SwiGLU(h1) alone and the reference must take it so.
func (l *Layer) FP8TensorUnweighted() bool { return l.FP8Tensor() && l.fp8Unweighted.Load() }

// ExpertPathFP8Tensor is what the record says of the fp8 expert GEMMs on
// the per-tensor path.
const ExpertPathFP8Tensor = "FP8 GEMMs (cuBLASLt's per-tensor FP8 GEMM: each expert's rows on its rank dequantized 1×128 as dispatched, " +
	"then requantized with one multiplier, fc2's bf16 input likewise, weights e4m3 with one multiplier each, fp32 accumulation, bf16 out)"

// fp8GEMMHostTensorReason is why the host device's record says
// cublaslt-fp8-tensor.
const fp8GEMMHostTensorReason = "the host device runs what a GPU whose cuBLASLt has FP8 with per-tensor scales only (sm_89, sm_100, sm_90 before 12.9) " +
	"runs: kernels.FP8GEMM emulates cuBLASLt's SCALAR_32F FP8 GEMM exactly (the fake cuBLASLt's arithmetic bit for bit)"

// fp8TensorWeights are an expert's weights as the per-tensor FP8 GEMM
// takes them: e4m3 codes fc1 [2f, h], fc2 [h, f] and one multiplier each,
// quantized (QuantFP8Tensor) from the bf16 dequantized weights.
type fp8TensorWeights struct {
	q1, q2 []uint8
	s1, s2 float32
}

// quantTensorWeights quantizes bf16 weights fc1, fc2 per tensor; FP8Fault
// "t-w1" (tests) doubles fc1's multiplier (fc1's output doubled: the
// output and gradient checks must see it, their reference weights being
// their own, FP8TensorRefWeights).
func quantTensorWeights(fc1, fc2 []float32) *fp8TensorWeights {
	w := &fp8TensorWeights{}
	w.q1, w.s1 = kernels.QuantFP8Tensor(fc1)
	w.q2, w.s2 = kernels.QuantFP8Tensor(fc2)
	if FP8Fault == "t-w1" {
		w.s1 *= 2
	}
	return w
}

// fp8TensorWeights is expert e's per-tensor weights, from its bf16 weights
// ew (made once; a drawn layer makes them each time).
func (l *Layer) fp8TensorWeights(e int, ew *dispatchers.ExpertWeights) *fp8TensorWeights {
	return cachedWeights(l, &l.fp8tw, e, func() *fp8TensorWeights {
		fc1, fc2 := ew.FC1, ew.FC2
		if fc1 == nil { // a segment with e4m3 weights only (feplb's moved experts): the expert's own bf16 weights
			fc1, fc2 = l.ExpertWeights(e)
		}
		return quantTensorWeights(fc1, fc2)
	})
}

// FP8TensorRefWeights are expert e's weights as the reference takes them on
// the per-tensor path: its bf16 weights quantized per tensor by the host
// reference (kernels.QuantFP8Tensor, here: not the layer's codes nor the
// layer's quantTensorWeights, so that a fault of the layer's is not the
// reference's too), e4m3·s exactly in float64.
func (l *Layer) FP8TensorRefWeights(e int, fc1, fc2 []float64) ([]float64, []float64) {
	w1, w2 := l.ExpertWeights(e)
	q1, s1 := kernels.QuantFP8Tensor(w1)
	q2, s2 := kernels.QuantFP8Tensor(w2)
	return DequantTensor64(fc1, q1, s1), DequantTensor64(fc2, q2, s2)
}

// DequantTensor64 is q with the one multiplier s, exactly in float64, in
// dst's memory when it is large enough.
func DequantTensor64(dst []float64, q []uint8, s float32) []float64 {
	dst = kernels.Reslice(dst, len(q))
	for i, c := range q {
		dst[i] = float64(e4m3Values[c]) * float64(s)
	}
	return dst
}

// quantTensorOperand quantizes a GEMM operand x (n rows) per tensor into
// q and returns its multiplier; FP8Fault "t-half" (tests) takes amax from
// the first half of the rows only.
func quantTensorOperand(q []uint8, x []float32, n int) float32 {
	if FP8Fault == "t-half" && n > 1 {
		s := kernels.QuantFP8TensorInto(q, x[:len(x)/n*(n/2)])
		for i, v := range x[len(x)/n*(n/2):] {
			q[len(x)/n*(n/2)+i] = kernels.E4M3FromFloat32(v / s)
		}
		return s
	}
	return kernels.QuantFP8TensorInto(q, x)
}

// expertForwardFP8Tensor computes rows [start, start+n) of rank r's
// ExpertY — one segment, expert e with bf16 weights ew — on the
// per-tensor path (the file's comment), keeping fc1's output and the
// activation in scratch as ExpertForward does (the backward's tape).
func (l *Layer) expertForwardFP8Tensor(r, e, start, n int, ew *dispatchers.ExpertWeights, scratch []float32) {
	rk, h, f := l.Ranks[r], l.Cfg.Hidden, l.Cfg.FFN
	if n == 0 {
		return
	}
	w := l.fp8TensorWeights(e, ew)
	sc := fp8Scratches.Get().(*fp8Scratch)
	defer fp8Scratches.Put(sc)
	sc.q = kernels.Reslice(sc.q, n*max(h, f))
	h1, act := scratch[:n*2*f], scratch[n*2*f:n*3*f]
	sx := quantTensorOperand(sc.q[:n*h], rk.ExpertX[start*h:(start+n)*h], n)
	if FP8Fault == "t-wscale" { // tests: fc1 given the weights' multiplier for the activations'
		sx = w.s1
	}
	fp8TensorGEMMRows(h1, n, 2*f, h, sc.q, sx, w.q1, w.s1)
	kernels.SwiGLUProb(act, h1, rk.ExpertProbs[start:start+n], n, f)
	kernels.RoundBF16Slice(act) // the stored bf16 activation (the tape's), then quantized
	sa := quantTensorOperand(sc.q[:n*f], act, n)
	fp8TensorGEMMRows(rk.ExpertY[start*h:(start+n)*h], n, h, f, sc.q, sa, w.q2, w.s2)
}

// fp8TensorGEMMRows is c[m,n] = FP8GEMM(a·sa, w·sw) per tensor, stored
// bf16 (gemmRowsBF16).
func fp8TensorGEMMRows(c []float32, m, n, k int, a []uint8, sa float32, w []uint8, sw float32) {
	as, ws := []float32{sa}, []float32{sw}
	gemmRowsBF16(c, m, n, k, func(sc *fp8Scratch, lo, hi int) []float32 {
		sc.out = kernels.FP8GEMMInto(sc.out, cuda.FP8Tensor, hi-lo, n, k, a[lo*k:hi*k], as, w, ws)
		return sc.out
	})
}
