package device

import (
	"fmt"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
)

// The backward's device operations (BACKWARD.md, "Device kernels and GEMMs
// the backward needs"), each the device form of a host function of
// backward.go and routerbwd.go, with the same rounding points (B1–B8):
//
//	MatMul          the dgrad and wgrad GEMMs (MatMulNN, MatMulTNAdd) and
//	                the fp32 router's, through cuBLASLt
//	SwiGLUBackward  SwiGLUProbBackward, dh1 stored bf16 (B3), dprob fp32
//	ScoreBackward   ScoreBackward on the fp32 router's logits
//	InputGrad       InputGrad, the router's fp32 part rounded first (B6)
//	AddF32          main_grad += a gradient (fp32, or rounded to bf16
//	                first: the router weight's, B7)
//
// The permute's and unpermute's backward are the forward's own kernels
// (GatherRows, UnpermuteSum without a shared part, GatherF32, SortChunks).

// MatMul is one product of Device.MatMul, row-major, fp32 accumulation:
// C[M,N] = op(A) · op(B), plus C when Add (beta = 1); see cuda.MatMul for
// the transposes and the operand and output types.
type MatMul struct {
	C, A, B Addr
	cuda.MatMul
	// AScale, BScale: at FP8 (cuda.MatMul.FP8) the fp32 multipliers of A
	// and B (one each per tensor; FP8ActScalesLt's and FP8WeightScalesLt's
	// orders for block scaling)
	AScale, BScale Addr
}

// NN is the dgrad product c[m,n] = a[m,k] · b[k,n] (bf16 in and out, as
// MatMulNN then bf16 storage).
func NN(c, a, b Addr, m, n, k int) MatMul {
	return MatMul{C: c, A: a, B: b, MatMul: cuda.MatMul{M: m, N: n, K: k}}
}

// TNAdd is the wgrad product c[m,n] += a[k,m]ᵀ · b[k,n] (bf16 operands, an
// fp32 c: main_grad, as MatMulTNAdd).
func TNAdd(c, a, b Addr, m, n, k int) MatMul {
	return MatMul{C: c, A: a, B: b, MatMul: cuda.MatMul{M: m, N: n, K: k, TransA: true, F32Out: true, Add: true}}
}

// check says what is wrong with mm's shape or types.
func (mm MatMul) check() error {
	switch {
	case mm.M < 0 || mm.N < 1 || mm.K < 1:
		return fmt.Errorf("matmul %dx%dx%d: m ≥ 0, n and k ≥ 1 needed", mm.M, mm.N, mm.K)
	case mm.F32In && !mm.F32Out, mm.Add && !mm.F32Out:
		return fmt.Errorf("matmul with fp32 operands (%v) or accumulation (%v) needs an fp32 output", mm.F32In, mm.Add)
	case mm.TransA && mm.TransB:
		return fmt.Errorf("matmul with both operands transposed: not a product of the layer")
	case mm.FP8 != cuda.FP8None && (mm.TransA || !mm.TransB || mm.F32In || mm.Add || mm.AScale == 0 || mm.BScale == 0):
		return fmt.Errorf("fp8 (%v) matmul %dx%dx%d: only c = a·wᵀ with both multipliers (TransA %v TransB %v Add %v)", mm.FP8, mm.M, mm.N, mm.K, mm.TransA, mm.TransB, mm.Add)
	}
	return nil
}

// scaleCounts are the multipliers an FP8 mm reads of A and of B.
func (mm MatMul) scaleCounts() (a, b int) {
	if mm.FP8 == cuda.FP8Block {
		a, b, _ = cuda.FP8ScaleLayout(mm.M, mm.N, mm.K)
		return a, b
	}
	return 1, 1
}

// bytes are the bytes mm reads of A and B and writes of C.
func (mm MatMul) bytes() (a, b, c int64) {
	in, out := int64(2), int64(2)
	if mm.F32In {
		in = 4
	}
	if mm.FP8 != cuda.FP8None {
		in = 1
	}
	if mm.F32Out {
		out = 4
	}
	return in * int64(mm.M*mm.K), in * int64(mm.K*mm.N), out * int64(mm.M*mm.N)
}

// host computes mm on host operands a, b (bf16 values or fp32) into c,
// float32 accumulation in the order of k, as the host functions do: c =
// op(a)·op(b), or c + op(a)·op(b) when Add (the product summed first, as
// cuBLAS's D = A·B + C).
func (mm MatMul) host(c, a, b []float32) {
	m, n, k := mm.M, mm.N, mm.K
	out := c
	if mm.Add {
		out = make([]float32, m*n)
	}
	switch {
	case mm.TransB:
		kernels.MatMulNT(out, a, b, m, n, k)
	case mm.TransA:
		clear(out)
		kernels.MatMulTNAdd(out, a, b, m, n, k)
	default:
		kernels.MatMulNN(out, a, b, m, n, k)
	}
	if mm.Add {
		for i, v := range out {
			c[i] += v
		}
	}
}

// operand reads n values at p: fp32, or bf16 widened.
func (e *Emu) operand(p Addr, n int, f32 bool) ([]float32, error) {
	if f32 {
		v, err := view[float32](e, p, n)
		return v, err
	}
	return e.bf16At(p, n)
}

// MatMul: the host functions' products (MatMul.host) on the operands as
// stored, rounded to bf16 when the output is.
func (e *Emu) MatMul(mm MatMul, s Stream) error {
	if err := mm.check(); err != nil || mm.M == 0 {
		return err
	}
	ab, bb, cb := mm.bytes()
	read := int64(0) // of C: only an accumulating product reads it
	if mm.Add {
		read = cb
	}
	if mm.FP8 != cuda.FP8None {
		return e.matMulFP8(mm, ab, bb, cb, s)
	}
	if err := e.Enqueue("MatMul", s, e.ReadSpan(mm.A, ab), e.ReadSpan(mm.B, bb), e.ReadSpan(mm.C, read), e.WriteSpan(mm.C, cb)); err != nil {
		return err
	}
	a, err := e.operand(mm.A, mm.M*mm.K, mm.F32In)
	if err != nil {
		return err
	}
	b, err := e.operand(mm.B, mm.K*mm.N, mm.F32In)
	if err != nil {
		return err
	}
	if mm.F32Out {
		c, err := view[float32](e, mm.C, mm.M*mm.N)
		if err == nil {
			mm.host(c, a, b)
		}
		return err
	}
	c := make([]float32, mm.M*mm.N)
	mm.host(c, a, b)
	return e.storeBF16(mm.C, c)
}

// matMulFP8 is an FP8 MatMul on Emu: FP8GEMM (cuBLASLt's FP8 GEMM
// emulated exactly) on the e4m3 codes and multipliers, stored fp32 or
// bf16 (round to nearest even).
func (e *Emu) matMulFP8(mm MatMul, ab, bb, cb int64, s Stream) error {
	na, nb := mm.scaleCounts()
	if err := e.Enqueue("MatMulFP8", s, e.ReadSpan(mm.A, ab), e.ReadSpan(mm.B, bb), e.ReadSpan(mm.AScale, int64(4*na)), e.ReadSpan(mm.BScale, int64(4*nb)), e.WriteSpan(mm.C, cb)); err != nil {
		return err
	}
	a, err := e.BytesAt(mm.A, ab)
	if err != nil {
		return err
	}
	b, err := e.BytesAt(mm.B, bb)
	if err != nil {
		return err
	}
	sa, err := view[float32](e, mm.AScale, na)
	if err != nil {
		return err
	}
	sb, err := view[float32](e, mm.BScale, nb)
	if err != nil {
		return err
	}
	c := kernels.FP8GEMM(mm.FP8, mm.M, mm.N, mm.K, a, sa, b, sb)
	if mm.F32Out {
		cv, err := view[float32](e, mm.C, mm.M*mm.N)
		copy(cv, c)
		return err
	}
	return e.storeBF16(mm.C, c)
}

// SwiGLUBackward: SwiGLUProbBackward on the stored operands, dh1 stored as
// bf16 (B3); prob 0 means 1 (dprob not written).
func (e *Emu) SwiGLUBackward(dh1, dprob, dact, h1, prob Addr, n, ffn int, s Stream) error {
	pb := int64(4 * n)
	if prob == 0 {
		pb = 0
	}
	if err := e.Enqueue("SwiGLUBackward", s, e.ReadSpan(dact, int64(2*n*ffn)), e.ReadSpan(h1, int64(4*n*ffn)), e.ReadSpan(prob, pb),
		e.WriteSpan(dh1, int64(4*n*ffn)), e.WriteSpan(dprob, pb)); err != nil || n == 0 {
		return err
	}
	d, err := e.bf16At(dact, n*ffn)
	if err != nil {
		return err
	}
	hv, err := e.bf16At(h1, n*2*ffn)
	if err != nil {
		return err
	}
	var pv, dp []float32
	if prob != 0 {
		if pv, err = view[float32](e, prob, n); err != nil {
			return err
		}
		if dp, err = view[float32](e, dprob, n); err != nil {
			return err
		}
	}
	out := make([]float32, n*2*ffn)
	kernels.SwiGLUProbBackward(out, dp, d, hv, pv, n, ffn)
	return e.storeBF16(dh1, out)
}

// ScoreBackward: the host's ScoreBackward on fp32 logits [T,E], dprobs
// [T,k] and idx [T,k], into dlogits [T,E].
func (e *Emu) ScoreBackward(rc kernels.RouterConfig, dlogits, logits, dprobs, idx Addr, tokens int, s Stream) error {
	E, k := rc.Experts, rc.TopK
	if err := e.Enqueue("ScoreBackward", s, e.ReadSpan(logits, int64(4*tokens*E)), e.ReadSpan(dprobs, int64(4*tokens*k)), e.ReadSpan(idx, int64(4*tokens*k)),
		e.WriteSpan(dlogits, int64(4*tokens*E))); err != nil || tokens == 0 {
		return err
	}
	lg, err := view[float32](e, logits, tokens*E)
	if err != nil {
		return err
	}
	dp, err := view[float32](e, dprobs, tokens*k)
	if err != nil {
		return err
	}
	iv, err := view[int32](e, idx, tokens*k)
	if err != nil {
		return err
	}
	for _, x := range iv {
		if x < 0 || int(x) >= E {
			return fmt.Errorf("emu: score backward: expert %d of %d", x, E)
		}
	}
	dl, err := view[float32](e, dlogits, tokens*E)
	if err != nil {
		return err
	}
	kernels.ScoreBackward(rc, dl, lg, dp, iv, tokens)
	return nil
}

// InputGrad: dx = bf16(bf16(dperm + bf16(drouter)) + dshared) over n
// values — the host's InputGrad with the router's fp32 part rounded to its
// bf16 storage first (B6); drouter or dshared 0 is left out.
func (e *Emu) InputGrad(dx, dperm, drouter, dshared Addr, n int, s Stream) error {
	rb, sb := int64(4*n), int64(2*n)
	if drouter == 0 {
		rb = 0
	}
	if dshared == 0 {
		sb = 0
	}
	if err := e.Enqueue("InputGrad", s, e.ReadSpan(dperm, int64(2*n)), e.ReadSpan(drouter, rb), e.ReadSpan(dshared, sb), e.WriteSpan(dx, int64(2*n))); err != nil || n == 0 {
		return err
	}
	perm, err := e.bf16At(dperm, n)
	if err != nil {
		return err
	}
	var router, shared []float32
	if drouter != 0 {
		v, err := view[float32](e, drouter, n)
		if err != nil {
			return err
		}
		router = append([]float32(nil), v...)
		kernels.RoundBF16Slice(router)
	}
	if dshared != 0 {
		if shared, err = e.bf16At(dshared, n); err != nil {
			return err
		}
	}
	out := make([]float32, n)
	kernels.InputGrad(out, perm, router, shared, kernels.RoundBF16Slice)
	return e.storeBF16(dx, out)
}

// AddF32: dst[i] += src[i] (fp32), or += bf16(src[i]) when round.
func (e *Emu) AddF32(dst, src Addr, n int, round bool, s Stream) error {
	if err := e.Enqueue("AddF32", s, e.ReadSpan(src, int64(4*n)), e.ReadSpan(dst, int64(4*n)), e.WriteSpan(dst, int64(4*n))); err != nil || n == 0 {
		return err
	}
	d, err := view[float32](e, dst, n)
	if err != nil {
		return err
	}
	v, err := view[float32](e, src, n)
	if err != nil {
		return err
	}
	for i, x := range v {
		if round {
			x = kernels.RoundBF16(x)
		}
		d[i] += x
	}
	return nil
}
