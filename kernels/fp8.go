package kernels

import (
	"fmt"
	"math"
)

// FP8 host reference (issue 34): e4m3 (OCP FP8 E4M3FN) rounding and the
// block quantizations the FP8 recipes use — DeepEP's 1×128 activation
// blocks with an fp32 scale (optionally a power of two, UE8M0), 128×128
// weight blocks, and MX (OCP Microscaling v1.0) blocks of 32 with an E8M0
// scale — with their dequantizations and error bounds. The CUDA kernels of
// kernels/cuda/fp8.cu are checked against these bit for bit; docs/fp8.md
// gives the sources and the derivation of the bounds.

// E4M3 constants: bias 7, 3 mantissa bits, no infinities; 0x7F and 0xFF
// are NaN; the largest finite magnitude is 448 (0x7E), the smallest
// normal 2^-6, the subnormal step 2^-9.
const (
	E4M3Max    = 448.0
	E4M3NaN    = 0x7F
	E4M3MaxBit = 0x7E
	// FP8Margin is the floor of a block's amax (DeepEP's kFP8Margin,
	// PyTorch's amax.clamp(1e-4)), as float32.
	FP8Margin = float32(1e-4)
	// FP8Block is the activation block (1×128) and the weight block's side
	// (128×128); MXBlock is the MX block (32 elements, one E8M0 scale).
	FP8Block = 128
	MXBlock  = 32
)

// E4M3FromFloat32 rounds f to e4m3: round to nearest, ties to even, with
// saturation (cvt.rn.satfinite): every finite or infinite value beyond
// ±448 gives ±448; NaN gives 0x7F (positive canonical NaN, whatever f's
// sign); zero and values that round to zero keep their sign.
func E4M3FromFloat32(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	a := b & 0x7fffffff
	switch {
	case a > 0x7f800000:
		return E4M3NaN
	case a == 0 || a < 0x00800000: // zero or a float32 subnormal (< 2^-126): rounds to zero
		return sign
	}
	e := int(a>>23) - 127 // unbiased exponent of a normal float32
	if e > 8 {            // ≥ 512 (infinity included): saturate
		return sign | E4M3MaxBit
	}
	m := a&0x7fffff | 0x800000 // 24-bit significand
	shift := uint(20)          // keep 3 mantissa bits of a normal e4m3
	if e < -6 {                // below 2^-6: e4m3 subnormal, step 2^-9
		shift += uint(-6 - e)
	}
	if shift > 25 { // below 2^-11 = a quarter step: zero (m < 2^24 ≤ half)
		return sign
	}
	q := m >> shift
	rem, half := m&(1<<shift-1), uint32(1)<<(shift-1)
	if rem > half || rem == half && q&1 == 1 {
		q++
	}
	// q is in units of the value's e4m3 step; a carry into the next binade
	// lands on the right code (q = 16 → mantissa 0 of exponent + 1)
	code := q
	if e >= -6 {
		code = uint32(e+6)<<3 + q
	}
	if code > E4M3MaxBit {
		code = E4M3MaxBit
	}
	return sign | uint8(code)
}

// E4M3ToFloat32 is c's exact value (NaN for 0x7F and 0xFF).
func E4M3ToFloat32(c uint8) float32 {
	e, m := int(c>>3)&15, float32(c&7)
	var v float32
	switch {
	case e == 15 && c&7 == 7:
		return float32(math.NaN())
	case e == 0:
		v = m * (1.0 / 512)
	default:
		v = float32(math.Ldexp(float64(8+m), e-10))
	}
	if c&0x80 != 0 {
		v = -v
	}
	return v
}

// FP8Scales are a block's quantization multiplier (scale, applied before
// the cast) and its dequantization multiplier (inv), as DeepEP's kernels
// compute them (csrc/kernels/utils.cuh, calculate_fp8_scales) from the
// block's amax clamped to FP8Margin: inv = amax·fl(1/448), scale =
// fl(448/amax); with ue8m0 both are powers of two, inv = 2^⌈log2(amax/448)⌉
// (the exponent read from fl(amax·fl(1/448))'s bits) and scale = 1/inv.
func FP8Scales(amax float32, ue8m0 bool) (scale, inv float32) {
	amax = max(amax, FP8Margin)
	inv448 := float32(1.0 / E4M3Max)
	if ue8m0 {
		b := math.Float32bits(amax * inv448)
		e := int(b>>23&0xff) - 127
		if b&0x7fffff != 0 {
			e++
		}
		return float32(math.Ldexp(1, -e)), float32(math.Ldexp(1, e))
	}
	return float32(E4M3Max / amax), amax * inv448
}

// BlockAmax is the largest magnitude of x's elements.
func BlockAmax(x []float32) float32 {
	var a float32
	for _, v := range x {
		a = max(a, float32(math.Abs(float64(v))))
	}
	return a
}

// QuantFP8Rows quantizes x (rows of h values, h a multiple of 128) in 1×128
// blocks: per block, q = e4m3(fl(x·scale)) and the dequantization
// multiplier inv is stored (scales, [rows, h/128], row-major), as DeepEP's
// per-token cast (tests/utils.py per_token_cast_to_fp8, and its kernels'
// before dispatch).
func QuantFP8Rows(x []float32, h int, ue8m0 bool) (q []uint8, scales []float32, err error) {
	if err := fp8RowsShape(x, h); err != nil {
		return nil, nil, err
	}
	q, scales = make([]uint8, len(x)), make([]float32, len(x)/FP8Block)
	return q, scales, QuantFP8RowsInto(q, scales, x, h, ue8m0)
}

// QuantFP8RowsInto is QuantFP8Rows into the caller's buffers, q of
// len(x) codes and scales of len(x)/128 multipliers, which it overwrites
// (a step's quantization without allocating).
func QuantFP8RowsInto(q []uint8, scales, x []float32, h int, ue8m0 bool) error {
	if err := fp8RowsShape(x, h); err != nil {
		return err
	}
	if len(q) != len(x) || len(scales) != len(x)/FP8Block {
		return fmt.Errorf("fp8: buffers of %d codes and %d scales for %d values (want %d and %d)", len(q), len(scales), len(x), len(x), len(x)/FP8Block)
	}
	for b := range scales {
		scales[b] = quantBlock(q[b*FP8Block:(b+1)*FP8Block], x[b*FP8Block:(b+1)*FP8Block], ue8m0)
	}
	return nil
}

// quantBlock casts one block of x (at most 128 values) into q by the 1×128
// rule — q = e4m3(fl(x·scale)), scale from the block's amax — and returns
// the block's dequantization multiplier.
func quantBlock(q []uint8, x []float32, ue8m0 bool) float32 {
	s, inv := FP8Scales(BlockAmax(x), ue8m0)
	for i, v := range x {
		q[i] = E4M3FromFloat32(v * s)
	}
	return inv
}

// fp8RowsShape refuses rows of h values that are not 1×128 blocks of x.
func fp8RowsShape(x []float32, h int) error {
	if h <= 0 || h%FP8Block != 0 || len(x)%h != 0 {
		return fmt.Errorf("fp8: hidden %d must be a positive multiple of %d dividing %d values", h, FP8Block, len(x))
	}
	return nil
}

// DequantFP8Rows is QuantFP8Rows' inverse: fl32(e4m3 · inv) per element.
func DequantFP8Rows(q []uint8, scales []float32) []float32 {
	out := make([]float32, len(q))
	for i, c := range q {
		out[i] = E4M3ToFloat32(c) * scales[i/FP8Block]
	}
	return out
}

// QuantFP8Weight quantizes w ([n, k], row-major) in 128×128 blocks (per
// block_cast_to_fp8: one amax per block, padded with zeros where n or k is
// not a multiple of 128); scales are [⌈n/128⌉, ⌈k/128⌉].
func QuantFP8Weight(w []float32, n, k int, ue8m0 bool) (q []uint8, scales []float32, err error) {
	if n <= 0 || k <= 0 || len(w) != n*k {
		return nil, nil, fmt.Errorf("fp8: weight of %d values is not %d×%d", len(w), n, k)
	}
	bn, bk := (n+FP8Block-1)/FP8Block, (k+FP8Block-1)/FP8Block
	q = make([]uint8, len(w))
	scales = make([]float32, bn*bk)
	for i := range bn {
		for j := range bk {
			var amax float32
			for r := i * FP8Block; r < min(n, (i+1)*FP8Block); r++ {
				amax = max(amax, BlockAmax(w[r*k+j*FP8Block:r*k+min(k, (j+1)*FP8Block)]))
			}
			s, inv := FP8Scales(amax, ue8m0)
			for r := i * FP8Block; r < min(n, (i+1)*FP8Block); r++ {
				for c := j * FP8Block; c < min(k, (j+1)*FP8Block); c++ {
					q[r*k+c] = E4M3FromFloat32(w[r*k+c] * s)
				}
			}
			scales[i*bk+j] = inv
		}
	}
	return q, scales, nil
}

// DequantFP8Weight is QuantFP8Weight's inverse.
func DequantFP8Weight(q []uint8, scales []float32, n, k int) []float32 {
	bk := (k + FP8Block - 1) / FP8Block
	out := make([]float32, len(q))
	for r := range n {
		for c := range k {
			out[r*k+c] = E4M3ToFloat32(q[r*k+c]) * scales[r/FP8Block*bk+c/FP8Block]
		}
	}
	return out
}

// MXScale is the E8M0 shared scale of an MX block whose largest magnitude
// is amax (OCP Microscaling Formats v1.0, §6.3): X = ⌊log2 amax⌋ − 8 (8 is
// e4m3's emax), clamped to E8M0's −127…127, stored biased (X + 127); a
// block of zeros (or of values below 2^-119) gets X = −127. Finite amax.
func MXScale(amax float32) uint8 {
	e := int(math.Float32bits(amax)>>23&0xff) - 127 // ⌊log2⌋ for normals; −127 (or below) otherwise
	x := max(e-8, -127)
	return uint8(x + 127)
}

// MXScaleRoundUp is the E8M0 scale as TransformerEngine's MXFP8 recipe
// computes it (transformer_engine/common/utils.cuh float_to_e8m0 on
// amax·fl(1/448), its software path): the exponent of v = amax·fl(1/448)
// rounded up (+1 where v's mantissa is not zero, except at the exponent
// 0xFE and for subnormal v ≤ 2^-127), 0 for v = 0. The block's largest
// element then never exceeds 448 after scaling.
func MXScaleRoundUp(amax float32) uint8 {
	b := math.Float32bits(amax * float32(1.0/E4M3Max))
	if b == 0 {
		return 0
	}
	e, m := b>>23&0xff, b&0x7fffff
	if m > 0 && e != 0xfe && !(e == 0 && m <= 0x400000) {
		e++
	}
	return uint8(e)
}

// MXRecip is the multiplier TransformerEngine applies before the cast for
// scale e8m0 (exp2f_rcp): 2^-(e8m0−127), but 1 for e8m0 = 0, where the
// spec's rule multiplies by 2^127 (only blocks whose values all lie below
// 2^-119 get the scale 0; under TE's rule they quantize to zeros).
func MXRecip(e8m0 uint8) float32 {
	if e8m0 == 0 {
		return 1
	}
	return math.Float32frombits(uint32(254-int(e8m0)) << 23)
}

// MXScaleValue is E8M0 scale e8m0's value 2^(e8m0−127), exact in float32
// (2^-127 is a float32 subnormal); 0xFF (NaN) is never produced by
// QuantMXFP8.
func MXScaleValue(e8m0 uint8) float32 { return float32(math.Ldexp(1, int(e8m0)-127)) }

// QuantMXFP8 quantizes x (a multiple of 32 finite values) in MX blocks of
// 32: the E8M0 scale X of each block (MXScale, or MXScaleRoundUp with
// roundUp) and its elements e4m3(x·mxRecip(X)) with saturation (the
// scaling is exact: a power of two).
func QuantMXFP8(x []float32, roundUp bool) (q []uint8, scales []uint8, err error) {
	if len(x)%MXBlock != 0 {
		return nil, nil, fmt.Errorf("fp8: %d values are not a multiple of the MX block %d", len(x), MXBlock)
	}
	q = make([]uint8, len(x))
	scales = make([]uint8, len(x)/MXBlock)
	for b := range scales {
		blk := x[b*MXBlock : (b+1)*MXBlock]
		s := MXScale(BlockAmax(blk))
		r := 1 / MXScaleValue(s) // 2^-X: a float32 normal for X in −127…120
		if roundUp {
			s = MXScaleRoundUp(BlockAmax(blk))
			r = MXRecip(s)
		}
		for i, v := range blk {
			q[b*MXBlock+i] = E4M3FromFloat32(v * r)
		}
		scales[b] = s
	}
	return q, scales, nil
}

// DequantMXFP8 is QuantMXFP8's inverse: e4m3 · 2^X, exact in float64.
func DequantMXFP8(q, scales []uint8) []float64 {
	out := make([]float64, len(q))
	for i, c := range q {
		out[i] = float64(E4M3ToFloat32(c)) * float64(MXScaleValue(scales[i/MXBlock]))
	}
	return out
}

// Error bounds (derived in docs/fp8.md). FP8RelStep is e4m3's half-ULP
// relative to a normal value (3 mantissa bits: 2^-4); FP8SubStep the
// absolute half-step of its subnormals (2^-10) in scaled units; fp8Slack
// covers the float32 roundings of the scale, the scaled value and the
// dequantized product (a few units of 2^-24).
const (
	FP8RelStep = 1.0 / 16
	FP8SubStep = 1.0 / 1024
	fp8Slack   = 1.0 / (1 << 20)
)

// FP8ElemBound bounds |x − deq(q(x))| for an element x of a 1×128 or
// 128×128 block whose dequantization multiplier is inv:
// (2^-4 + 2^-20)|x| + 2^-10·inv·(1 + 2^-20).
func FP8ElemBound(x, inv float64) float64 {
	return (FP8RelStep+fp8Slack)*math.Abs(x) + FP8SubStep*inv*(1+fp8Slack)
}

// MXElemBound bounds |x − deq(q(x))| for an element x of an MX block of
// scale 2^X: the rounding bound, or the saturation's loss where x/2^X
// lies beyond 448 (the block's largest may reach 2^9): max(2^-4|x|,
// |x| − 448·2^X) + 2^-10·2^X. The scaling is exact (powers of two).
func MXElemBound(x float64, e8m0 uint8) float64 {
	s := float64(MXScaleValue(e8m0))
	return max(FP8RelStep*math.Abs(x), math.Abs(x)-E4M3Max*s) + FP8SubStep*s
}

// DotBound bounds |Σ a_k·w_k − Σ ã_k·w̃_k| where ã and w̃ are a and w
// quantized with per-element bounds ea_k ≥ |a_k − ã_k| and ew_k ≥
// |w_k − w̃_k|: Σ (ea_k|w_k| + |a_k|ew_k + ea_k·ew_k). It is the tolerance
// of a K-long dot product of quantized operands against the unquantized
// one, in exact arithmetic; the accumulation's own error is added by the
// check that uses it (docs/fp8.md).
func DotBound(a, w, ea, ew []float64) float64 {
	var t float64
	for k := range a {
		t += ea[k]*math.Abs(w[k]) + math.Abs(a[k])*ew[k] + ea[k]*ew[k]
	}
	return t
}

// FP8 kernels (kernels/cuda/fp8.cu). Their flags: FP8UE8M0 makes the 1×128
// scales powers of two; FP8Soft makes sm_89+ GPUs convert to e4m3 in
// software too (below sm_89 and on the host simulation it always is), so
// that a GPU check can hold the PTX conversion to the software one.
const (
	FP8UE8M0       = 1
	FP8Soft        = 2
	FP8MXRoundUp   = 4   // quant_mxfp8: TransformerEngine's scale (MXScaleRoundUp)
	FP8KernelBlock = 256 // threads per block of every FP8 kernel
)

// FP8RowPitch is the bytes of a packed fp8 row of h elements (h % 128 ==
// 0): its e4m3 values, then its h/128 fp32 multipliers, padded to 16
// bytes (quant_fp8_rows's layout: the rows the cuda device's fp8 dispatch
// moves).
func FP8RowPitch(h int) int { return (h + h/FP8Block*4 + 15) / 16 * 16 }

// FP8Grid is the grid that gives every warp of the quantization kernels
// one step over n blocks of size elements (16 per lane), capped at cap.
func FP8Grid(n int64, size, cap int) int {
	perBlock := int64(FP8KernelBlock / 32 * 512 / size) // blocks per thread block a step
	return int(max(1, min((n+perBlock-1)/perBlock, int64(cap))))
}
