package kernels

// The MXFP8 expert GEMM (--precision mxfp8; docs/fp8.md "mxfp8 on the host
// device"): both operands e4m3 in 1×32 blocks along K, one E8M0 scale a
// block, as TransformerEngine's MXFP8 recipe feeds cuBLASLt's
// VEC32_UE8M0 GEMM on Blackwell. The host device runs MXGEMM, moebench's
// emulation of that product (not a measured Blackwell accumulation: no
// sm_100 here); MXGEMMPathFor says where a GPU's cuBLASLt has it.

import (
	"fmt"
	"math"
)

// MXScalingVersion is the first cuBLASLt with the VEC32_UE8M0 scale mode
// (cuBLAS 12.8, the release that added Blackwell's block-scaled
// MXFP8/NVFP4 GEMMs).
const MXScalingVersion = 120800

// MXGEMMPathFor says whether cuBLASLt version ltVersion on a GPU of
// compute capability sm (e.g. 90) has the MXFP8 GEMM, and why (or why
// not): MX tensor-core instructions exist from sm_100 (Blackwell); Hopper
// (sm_90) and Ada (sm_89) have FP8 with per-tensor or 128-blocks of fp32
// scales only, and cuBLASLt takes E8M0 scales per 32 elements
// (VEC32_UE8M0) from 12.8.
func MXGEMMPathFor(ltVersion, sm int) (bool, string) {
	switch {
	case sm < 100:
		return false, fmt.Sprintf("sm_%d has no MX tensor-core path: cuBLASLt's MXFP8 GEMM (e4m3 with E8M0 scales per 32 elements, "+
			"VEC32_UE8M0) runs on sm_100 (Blackwell) and later", sm)
	case ltVersion < MXScalingVersion:
		return false, fmt.Sprintf("cuBLASLt %d has no VEC32_UE8M0 scale mode (MXFP8 GEMMs need cuBLASLt %d or later on sm_%d)", ltVersion, MXScalingVersion, sm)
	}
	return true, fmt.Sprintf("cuBLASLt %d on sm_%d has VEC32_UE8M0 (MXFP8 block scaling)", ltVersion, sm)
}

// MXScaleByte is MXScaleValue's inverse: the E8M0 byte of a power of two
// 2^-127…2^127 (what the dispatch delivered as a float32 multiplier).
func MXScaleByte(v float32) uint8 {
	b := math.Float32bits(v) & 0x7fffffff
	if b < 0x00800000 { // 2^-127, the one subnormal scale
		return 0
	}
	return uint8(b >> 23)
}

// QuantMXFP8RowsInto quantizes x (a multiple of 32 values; rows of k with
// k % 32 == 0 are blocks along k) by TransformerEngine's MXFP8 rule
// (QuantMXFP8 with roundUp) into q (len(x) codes) and scales (len(x)/32
// E8M0 bytes).
func QuantMXFP8RowsInto(q, scales []uint8, x []float32) error {
	if len(x)%MXBlock != 0 || len(q) != len(x) || len(scales) != len(x)/MXBlock {
		return fmt.Errorf("mxfp8: %d values (a multiple of %d) into %d codes and %d scales", len(x), MXBlock, len(q), len(scales))
	}
	for b := range scales {
		blk := x[b*MXBlock : (b+1)*MXBlock]
		s := MXScaleRoundUp(BlockAmax(blk))
		r := MXRecip(s)
		for i, v := range blk {
			q[b*MXBlock+i] = E4M3FromFloat32(v * r)
		}
		scales[b] = s
	}
	return nil
}

// MXGEMM is c[m,n] = a[m,k]·w[n,k]ᵀ on e4m3 codes with E8M0 scales per 32
// elements along k (aS [m, k/32], wS [n, k/32], row-major; k % 32 == 0),
// as moebench emulates cuBLASLt's VEC32_UE8M0 FP8 GEMM: every product of
// two e4m3 values is exact in fp32; per 32-long k block the fp32 sum p of
// its products in k order; then acc = fl32(acc + fl32(p·2^(Xa+Xw))), the
// scale product an exact power of two, blocks in k order. The result is
// fp32 (a bf16 c is its round to nearest even).
func MXGEMM(m, n, k int, a, aS, w, wS []uint8) []float32 {
	return MXGEMMInto(nil, m, n, k, a, aS, w, wS)
}

// MXGEMMInto is MXGEMM into c's memory when it is large enough (else a
// new slice); it returns the m·n outputs.
func MXGEMMInto(c []float32, m, n, k int, a, aS, w, wS []uint8) []float32 {
	c = Reslice(c, m*n)
	kb := k / MXBlock
	for i := range m {
		ar, as := a[i*k:(i+1)*k], aS[i*kb:(i+1)*kb]
		for j := range n {
			wr, ws := w[j*k:(j+1)*k], wS[j*kb:(j+1)*kb]
			var acc float32
			for b := range kb {
				var p float32
				for q := b * MXBlock; q < (b+1)*MXBlock; q++ {
					p += e4m3Val[wr[q]] * e4m3Val[ar[q]]
				}
				// p·2^e exactly in float64, then one rounding to fp32 (only
				// where it under- or overflows fp32's range)
				acc += float32(math.Ldexp(float64(p), int(as[b])+int(ws[b])-254))
			}
			c[i*n+j] = acc
		}
	}
	return c
}

// MXGEMMBound is the derived bound on |MXGEMM − exact| for one output
// whose exact value, on the same dequantized operands ã = e4m3·2^Xa, w̃ =
// e4m3·2^Xw, is Σ ã_q w̃_q with Σ|ã_q w̃_q| = absSum: the products are
// exact, a block's fp32 sum of 32 adds ≤ γ(31), its scaling by a power of
// two exact (an fp32 subnormal result adds at most 2^-150 a block), the
// sum over k/32 blocks γ(k/32): γ(31 + k/32)·absSum + (k/32)·2^-150,
// γ(n) = n·u/(1 − n·u), u = 2^-24. A bf16 output adds its rounding
// (bf16OutBound). This is the emulation's fp32 accumulation, not a
// measured Blackwell one.
func MXGEMMBound(k int, absSum float64, bf16Out bool, c float64) float64 {
	n := float64(31 + k/MXBlock)
	u := math.Ldexp(1, -24)
	b := n*u/(1-n*u)*absSum + float64(k/MXBlock)*math.Ldexp(1, -150)
	if bf16Out {
		b = bf16OutBound(b, c)
	}
	return b
}
