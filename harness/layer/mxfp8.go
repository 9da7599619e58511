package layer

// The layer at --precision mxfp8 on the host device (docs/fp8.md "mxfp8 on
// the host device"): Blackwell's MXFP8 as TransformerEngine's recipe runs
// it (Megatron-Core's mxfp8 recipe goes through TE), emulated in Go:
//
//   - expert weights are quantized once, when drawn, in 1×32 blocks along
//     K (fc1 [2f, h] along h, fc2 [h, f] along f; kernels.QuantMXFP8RowsInto,
//     TE's rule: the E8M0 scale rounded up, kernel flag FP8MXRoundUp) and
//     held dequantized as bf16 values, the bf16 backward's weights;
//   - the quantize phase casts each rank's input rows in 1×32 blocks with
//     the same rule: Rank.X holds the e4m3 values, Rank.Scales [T, h/32]
//     each block's E8M0 scale as its exact float32 power of two, which
//     alltoall (and feplb over it) moves with the rows; a row is counted
//     hidden e4m3 bytes + hidden/32 E8M0 bytes (dispatchers.RowBytes);
//   - the expert phase dequantizes its segments' rows in place,
//     bf16(e4m3·2^X), keeping their codes and E8M0 scales, and runs the
//     expert GEMMs as kernels.MXGEMM (moebench's emulation of cuBLASLt's
//     VEC32_UE8M0 GEMM: per 32-long block an fp32 sum of exact products
//     times the exact power-of-two scale product, accumulated in fp32 in
//     k order — not a measured Blackwell accumulation):
//
//     h1  = bf16(MXGEMM(x codes · E8M0 1×32 as dispatched, fc1 codes · 1×32))
//     act = bf16(SwiGLU(h1) × prob)
//     y   = bf16(MXGEMM(mx(act) 1×32 along f,           fc2 codes · 1×32))
//
//   - the backward is bf16 on the dequantized rows and weights, as at fp8.
//
// The check's reference takes the same quantized operands exactly (MXRef*).

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// MXGEMMHostPath is what the host's record says of its mxfp8 expert
// GEMMs (gemm.fp8_path).
const MXGEMMHostPath = "mx-emulated"

// ExpertPathMXHost is the record's gemm.method at mxfp8 on the host.
const ExpertPathMXHost = "MXFP8 GEMMs emulated (e4m3 activations and weights in 1×32 blocks along K with E8M0 scales, TransformerEngine's rule; " +
	"per block an fp32 sum of exact products times the exact power-of-two scales, fp32 accumulation in k order, bf16 out)"

// mxGEMMHostReason is why the host's record says MXGEMMHostPath.
const mxGEMMHostReason = "the host device emulates cuBLASLt's MXFP8 GEMM (VEC32_UE8M0, sm_100 and cuBLASLt 12.8+) with kernels.MXGEMM; " +
	"its fp32 accumulation is moebench's model, not a measured Blackwell one (no sm_100 here)"

// HostMXGEMMNote is what a host run's record says of its mxfp8 expert
// GEMMs: the method, gemm.fp8_path and why.
func HostMXGEMMNote() (method, path, why string) {
	return ExpertPathMXHost, MXGEMMHostPath, mxGEMMHostReason
}

// mxWeights are an expert's weights as the MX GEMM takes them: e4m3 codes
// of fc1 [2f, h] and fc2 [h, f] with their E8M0 scales per 32 along K
// (s1 [2f, h/32], s2 [h, f/32]).
type mxWeights struct {
	q1, q2, s1, s2 []uint8
}

// quantMX quantizes w (rows of k, k % 32 == 0) by TE's MXFP8 rule.
func quantMX(w []float32) (q, s []uint8) {
	q, s = make([]uint8, len(w)), make([]uint8, len(w)/kernels.MXBlock)
	if err := kernels.QuantMXFP8RowsInto(q, s, w); err != nil {
		panic(err) // Validate: hidden and ffn are multiples of 32
	}
	return q, s
}

// quantWeightMX replaces w ([n, k]) with its 1×32 MX quantization along
// k, dequantized and rounded to bf16.
func quantWeightMX(w []float32) {
	q, s := quantMX(w)
	for i, c := range q {
		w[i] = kernels.RoundBF16(e4m3Values[c] * kernels.MXScaleValue(s[i/kernels.MXBlock]))
	}
}

// quantWeightAt replaces w ([n, k]) with its quantization at the layer's
// precision (128×128 blocks at fp8, 1×32 along k at mxfp8), dequantized
// to bf16; bf16 leaves it.
func (l *Layer) quantWeightAt(w []float32, n, k int) {
	switch {
	case l.Cfg.IsFP8():
		quantWeight(w, n, k)
	case l.Cfg.IsMXFP8():
		quantWeightMX(w)
	}
}

// mxWeights quantizes expert e's weights (drawn from the seed, as the
// held ones) in 1×32 blocks along K, once (a drawn layer makes them each
// time).
func (l *Layer) mxWeights(e int) *mxWeights {
	return cachedWeights(l, &l.MXWeights, e, func() *mxWeights {
		h, f := l.Cfg.Hidden, l.Cfg.FFN
		fc1, fc2 := make([]float32, 2*f*h), make([]float32, h*f)
		l.drawExpert(e, fc1, fc2)
		w := new(mxWeights)
		w.q1, w.s1 = quantMX(fc1)
		w.q2, w.s2 = quantMX(fc2)
		return w
	})
}

// segmentMXWeights is the MX weights segment sg's GEMMs read: the rank's
// own expert's (mxWeights), or, for a segment with its own weights w (a
// moved expert: feplb's helpers), w's bf16 values quantized again by the
// same rule on the helper. They are the drawn weights' MX values (the
// layer holds its weights MX-dequantized), which TE's rule quantizes back
// to the same values (a block whose largest code rounded to 224 may take
// half the scale and twice the codes: the same values, the same products
// scaled by a power of two), so that a correct move changes no bit and a
// broken one (weights not moved) reaches the output.
func (l *Layer) segmentMXWeights(sg dispatchers.Segment, w *dispatchers.ExpertWeights) *mxWeights {
	if sg.Weights == nil {
		return l.mxWeights(sg.Expert)
	}
	m := new(mxWeights)
	m.q1, m.s1 = quantMX(w.FC1)
	m.q2, m.s2 = quantMX(w.FC2)
	return m
}

// quantizeMX is the mxfp8 step's quantize phase: rank r's input rows cast
// to e4m3 in 1×32 blocks (TE's rule), the values into Rank.X, each block's
// E8M0 scale, as its float32 power of two, into Rank.Scales.
func (l *Layer) quantizeMX(r int) error {
	rk, run, x := l.Ranks[r], &l.run[r], l.X[r]
	if len(run.q8) != len(x) {
		run.q8, run.xq = make([]uint8, len(x)), make([]float32, len(x))
	}
	if len(run.mxs) != len(x)/kernels.MXBlock {
		run.mxs, run.qs = make([]uint8, len(x)/kernels.MXBlock), make([]float32, len(x)/kernels.MXBlock)
	}
	if err := kernels.QuantMXFP8RowsInto(run.q8, run.mxs, x); err != nil {
		return err
	}
	for i, c := range run.q8 {
		run.xq[i] = e4m3Values[c]
	}
	for i, s := range run.mxs {
		run.qs[i] = kernels.MXScaleValue(s)
	}
	rk.X, rk.Scales = run.xq, run.qs
	return nil
}

// dequantRowsMX dequantizes rows [lo, hi) of rank r's ExpertX in place
// from its ExpertScales (E8M0 values), bf16(e4m3·2^X), once per step,
// keeping each row's codes (run.xc) and E8M0 bytes (run.xm) for the MX
// GEMM. FP8Fault breaks it on purpose: "scale" the exponent off by one,
// "block" the next block's scale, "none" no dequantization.
func (l *Layer) dequantRowsMX(r, lo, hi int) error {
	rk, run, h := l.Ranks[r], &l.run[r], l.Cfg.Hidden
	S := h / kernels.MXBlock
	if len(rk.ExpertScales) < hi*S {
		return fmt.Errorf("mxfp8: the dispatch delivered scales for %d rows; the experts compute rows up to %d", len(rk.ExpertScales)/S, hi)
	}
	if len(run.dq) < hi {
		run.dq = append(run.dq, make([]bool, hi-len(run.dq))...)
	}
	if len(run.xc) < hi*h {
		run.xc = append(run.xc, make([]uint8, hi*h-len(run.xc))...)
	}
	if len(run.xm) < hi*S {
		run.xm = append(run.xm, make([]uint8, hi*S-len(run.xm))...)
	}
	for i := lo; i < hi; i++ {
		if run.dq[i] {
			continue
		}
		run.dq[i] = true
		row := rk.ExpertX[i*h : (i+1)*h]
		for j, v := range row {
			run.xc[i*h+j] = kernels.E4M3FromFloat32(v) // exact: row holds e4m3 values
		}
		for b := range S {
			x := kernels.MXScaleByte(rk.ExpertScales[i*S+b])
			switch FP8Fault {
			case "scale":
				x++
			case "block":
				x = kernels.MXScaleByte(rk.ExpertScales[(i*S+b+1)%len(rk.ExpertScales)])
			case "none":
				x = 127 // 2^0: the codes taken as values
			}
			run.xm[i*S+b] = x
			v := kernels.MXScaleValue(x)
			for j := b * kernels.MXBlock; j < (b+1)*kernels.MXBlock; j++ {
				row[j] = kernels.RoundBF16(row[j] * v)
			}
		}
	}
	return nil
}

// mxGEMMRows is c[m,n] = MXGEMM(a, w) stored bf16 (gemmRowsBF16).
func mxGEMMRows(c []float32, m, n, k int, a, aS, w, wS []uint8) {
	kb := k / kernels.MXBlock
	gemmRowsBF16(c, m, n, k, func(sc *fp8Scratch, lo, hi int) []float32 {
		sc.out = kernels.MXGEMMInto(sc.out, hi-lo, n, k, a[lo*k:hi*k], aS[lo*kb:hi*kb], w, wS)
		return sc.out
	})
}

// expertForwardMX computes rows [start, start+n) of rank r's ExpertY with
// expert e's MX GEMMs (the file's comment), keeping fc1's output and the
// activation in scratch as ExpertForward does (the backward's tape).
func (l *Layer) expertForwardMX(r int, w *mxWeights, start, n int, scratch []float32) {
	rk, run, h, f := l.Ranks[r], &l.run[r], l.Cfg.Hidden, l.Cfg.FFN
	if n == 0 {
		return
	}
	S := h / kernels.MXBlock
	h1, act := scratch[:n*2*f], scratch[n*2*f:n*3*f]
	mxGEMMRows(h1, n, 2*f, h, run.xc[start*h:(start+n)*h], run.xm[start*S:(start+n)*S], w.q1, w.s1)
	kernels.SwiGLUProb(act, h1, rk.ExpertProbs[start:start+n], n, f)
	kernels.RoundBF16Slice(act) // the stored bf16 activation (the tape's, the bf16 backward's)
	sc := fp8Scratches.Get().(*fp8Scratch)
	defer fp8Scratches.Put(sc)
	q, s := kernels.Reslice(sc.q, len(act)), kernels.Reslice(sc.e, len(act)/kernels.MXBlock)
	sc.q, sc.e = q, s
	if err := kernels.QuantMXFP8RowsInto(q, s, act); err != nil { // fc2's input, 1×32 along f
		panic(err) // Validate: ffn is a multiple of 32
	}
	if FP8Fault == "fc2-none" { // tests: fc2's input not dequantized
		for i := range s {
			s[i] = 127
		}
	}
	mxGEMMRows(rk.ExpertY[start*h:(start+n)*h], n, h, f, q, s, w.q2, w.s2)
}

// mxFootprint is the bytes of rank r's host buffers of the MX GEMM path:
// its rows' codes and scales and its local experts' e4m3 weights.
func (l *Layer) mxFootprint(r int) int64 {
	run := &l.run[r]
	n := int64(cap(run.xm) + cap(run.mxs))
	L := l.Shape.LocalExperts()
	l.fp8wMu.Lock()
	defer l.fp8wMu.Unlock()
	for e, w := range l.MXWeights {
		if e/L == r {
			n += int64(len(w.q1) + len(w.q2) + len(w.s1) + len(w.s2))
		}
	}
	return n
}

// mxExpertInput is every rank's expert input as the reference takes it at
// mxfp8: its 1×32 quantization (from Layer.X) dequantized to bf16.
func (l *Layer) mxExpertInput() [][]float32 {
	xe := make([][]float32, len(l.X))
	for i, x := range l.X {
		q, s := quantMX(x)
		xe[i] = make([]float32, len(x))
		for j, c := range q {
			xe[i][j] = kernels.RoundBF16(e4m3Values[c] * kernels.MXScaleValue(s[j/kernels.MXBlock]))
		}
	}
	return xe
}

// mx64 is q dequantized exactly in float64 with its E8M0 scales (one per
// 32) into dst.
func mx64(dst []float64, q, s []uint8) []float64 {
	dst = kernels.Reslice(dst, len(q))
	for i, c := range q {
		dst[i] = float64(e4m3Values[c]) * float64(kernels.MXScaleValue(s[i/kernels.MXBlock]))
	}
	return dst
}

// MXRefWeights are expert e's weights as the reference takes them at
// mxfp8: e4m3·2^X exactly, in float64 (into fc1, fc2).
func (l *Layer) MXRefWeights(e int, fc1, fc2 []float64) ([]float64, []float64) {
	w := l.mxWeights(e)
	return mx64(fc1, w.q1, w.s1), mx64(fc2, w.q2, w.s2)
}

// MXRefRow is token tok of rank r's input as the reference takes it at
// mxfp8: its 1×32 quantization (from Layer.X, not from what the dispatch
// delivered) dequantized exactly in float64 into dst.
func (l *Layer) MXRefRow(dst []float64, r, tok int) {
	h := l.Cfg.Hidden
	q, s := quantMX(l.X[r][tok*h : (tok+1)*h])
	mx64(dst[:h], q, s)
}

// MXRefExpert is the reference's expert at mxfp8, in float64 on the exact
// dequantized operands, as FP8RefExpert (fc1's output rounded to bf16 as
// the layer stores it, for the same reason) with fc2's input quantized
// 1×32 along f by TE's rule from the activation rounded to bf16.
func MXRefExpert(y, x, prob, fc1, fc2, scratch []float64, n, h, f int) {
	h1, act := scratch[:n*2*f], scratch[n*2*f:n*3*f]
	kernels.MatMulNT(h1, x[:n*h], fc1, n, 2*f, h)
	for i, v := range h1 {
		h1[i] = float64(kernels.RoundBF16(float32(v)))
	}
	kernels.SwiGLUProb(act, h1, prob, n, f)
	a32 := make([]float32, n*f)
	for i, v := range act {
		a32[i] = kernels.RoundBF16(float32(v))
	}
	q, s := quantMX(a32)
	mx64(act, q, s)
	kernels.MatMulNT(y[:n*h], act, fc2, n, h, f)
}

// MXFP8DeviceReason is why mxfp8 is unavailable on devs (the cuda
// device), in the GPUs' and libraries' own terms: a GPU below sm_100 has
// no MX tensor-core path, a cuBLASLt before 12.8 no VEC32_UE8M0 scale
// mode (kernels.MXGEMMPathFor); where both are there, moebench's cuda
// layer still has no MX path (its dispatch moves fp8's 1×128 packed rows,
// its FP8 GEMM is Hopper's block scaling), which it says.
func MXFP8DeviceReason(devs []device.Device) string {
	const host = "; --device host runs mxfp8 (emulated)"
	for i, dev := range devs {
		g, ok := dev.(*device.CUDA)
		if !ok {
			return "--precision mxfp8: the Emu simulation models the Hopper (sm_90) path, which has no MX tensor-core GEMM " +
				"(cuBLASLt's MXFP8 GEMM, VEC32_UE8M0, needs sm_100 or later)" + host
		}
		if g.Lt == nil {
			return fmt.Sprintf("--precision mxfp8: GPU %d has no cuBLASLt (an MXFP8 GEMM needs cuBLASLt %d+ on sm_100 or later)", i, kernels.MXScalingVersion) + host
		}
		if ok, why := kernels.MXGEMMPathFor(g.Lt.Version, g.CC()); !ok {
			return fmt.Sprintf("--precision mxfp8: GPU %d: %s", i, why) + host
		}
	}
	if len(devs) == 0 {
		return "--precision mxfp8: no device" + host
	}
	_, why := kernels.MXGEMMPathFor(devs[0].(*device.CUDA).Lt.Version, devs[0].(*device.CUDA).CC())
	return "--precision mxfp8: " + why + ", but moebench's cuda layer has no MX path: its dispatch moves fp8's 1×128 packed rows " +
		"and its FP8 GEMM is Hopper's block scaling (an MX layer is not built: no sm_100 to prove it on)" + host
}
