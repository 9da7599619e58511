package kernels

// The FP8 expert GEMM (issue 34 item 3; docs/fp8.md "FP8 GEMMs"): which
// path a cuda device runs (FP8GEMMPathFor), the scale layouts cuBLASLt
// takes, and FP8GEMM, the Go emulation of cuBLASLt's FP8 product that the
// host device runs and that the fake cuBLASLt (internal/hostsim/fakes/
// fakecublaslt.c) computes bit for bit.

import (
	"fmt"
	"math"

	"github.com/moebench/moebench/internal/cuda"
)

// FP8GEMMPath is how a device runs the fp8 expert GEMMs.
type FP8GEMMPath string

const (
	// FP8GEMMBlock: cuBLASLt FP8 with block scaling, activations 1×128
	// (VEC128_32F), weights 128×128 (BLK128x128_32F): cuBLASLt 12.9+ on sm_90.
	FP8GEMMBlock FP8GEMMPath = "cublaslt-fp8-block"
	// FP8GEMMTensor: cuBLASLt FP8 with one fp32 multiplier per operand
	// (SCALAR_32F): cuBLASLt 11.11+ (CUDA 11.8) on sm_89 and later.
	FP8GEMMTensor FP8GEMMPath = "cublaslt-fp8-tensor"
	// FP8GEMMDequant: bf16 GEMMs on dequantized rows and weights.
	FP8GEMMDequant FP8GEMMPath = "bf16-dequant"
)

// FP8GEMMPathFor is the finest FP8 GEMM cuBLASLt version ltVersion
// (cublasLtGetVersion) offers on a GPU of compute capability sm (e.g. 90):
// block scaling on Hopper from 12.9 (cuBLAS 12.9's release added the
// 1×128/128×128 modes for Hopper only; Blackwell's block modes are the MX
// ones), per-tensor scaling on sm_89+ from cuBLAS 11.11, else none (bf16 on
// dequantized values). ltVersion is cuBLAS's (major·10000 + minor·100 +
// patch: CUDA 11.8's is 11.11, 111100; from CUDA 12 they match). The
// reason says why.
func FP8GEMMPathFor(ltVersion, sm int) (FP8GEMMPath, string) {
	switch {
	case sm == 90 && ltVersion >= cuda.BlockScalingVersion:
		return FP8GEMMBlock, fmt.Sprintf("cuBLASLt %d on sm_%d has VEC128_32F/BLK128x128_32F", ltVersion, sm)
	case sm >= 89 && ltVersion >= cuda.FP8TensorVersion:
		return FP8GEMMTensor, fmt.Sprintf("cuBLASLt %d on sm_%d: FP8 with per-tensor scales only (block scaling needs sm_90 and %d+)", ltVersion, sm, cuda.BlockScalingVersion)
	default:
		return FP8GEMMDequant, fmt.Sprintf("cuBLASLt %d on sm_%d has no FP8 GEMM (needs sm_89+ and %d+)", ltVersion, sm, cuda.FP8TensorVersion)
	}
}

// Scale returns the cuBLASLt scaling of a path (FP8None for FP8GEMMDequant).
func (p FP8GEMMPath) Scale() cuda.FP8Scale {
	switch p {
	case FP8GEMMBlock:
		return cuda.FP8Block
	case FP8GEMMTensor:
		return cuda.FP8Tensor
	}
	return cuda.FP8None
}

// FP8ActScalesLt reorders QuantFP8Rows' multipliers ([m, k/128] row-major)
// into VEC128_32F's order (k-block major, m contiguous: s[kb·m + i]).
func FP8ActScalesLt(s []float32, m, k int) []float32 {
	return FP8ActScalesLtInto(nil, s, m, k)
}

// FP8ActScalesLtInto is FP8ActScalesLt into out's memory when it is large
// enough (else a new slice); it returns the ⌈k/128⌉·m multipliers.
func FP8ActScalesLtInto(out, s []float32, m, k int) []float32 {
	kb := (k + FP8Block - 1) / FP8Block
	out = Reslice(out, kb*m)
	for i := range m {
		for b := range kb {
			out[b*m+i] = s[i*kb+b]
		}
	}
	return out
}

// FP8WeightScalesLt pads QuantFP8Weight's multipliers ([⌈n/128⌉, ⌈k/128⌉]
// row-major) to BLK128x128_32F's leading dimension (⌈k/128⌉ rounded up to
// 4; the pad is 0).
func FP8WeightScalesLt(s []float32, n, k int) []float32 {
	_, count, ld := cuda.FP8ScaleLayout(1, n, k)
	kb := (k + FP8Block - 1) / FP8Block
	out := make([]float32, count)
	for r := range (n + FP8Block - 1) / FP8Block {
		copy(out[r*ld:r*ld+kb], s[r*kb:(r+1)*kb])
	}
	return out
}

// FP8GEMM is c[m,n] = a[m,k]·w[n,k]ᵀ on e4m3 codes as cuBLASLt's FP8 GEMM
// computes it (the fake's arithmetic, fp32): every product of two e4m3
// values is exact in fp32; per-tensor (aScale, wScale one value each):
// c = fl(fl(wScale·aScale)·Σ) with Σ the fp32 sum in k order; block
// (aScale in FP8ActScalesLt's order, wScale in FP8WeightScalesLt's): per
// 128-long k block the fp32 sum p in k order, then acc = fl(acc +
// fl(fl(sw·sa)·p)), blocks in k order. The result is fp32 (a bf16 c is
// its round to nearest even).
func FP8GEMM(mode cuda.FP8Scale, m, n, k int, a []uint8, aScale []float32, w []uint8, wScale []float32) []float32 {
	return FP8GEMMInto(nil, mode, m, n, k, a, aScale, w, wScale)
}

// FP8GEMMInto is FP8GEMM into c's memory when it is large enough (else a
// new slice); it returns the m·n outputs.
func FP8GEMMInto(c []float32, mode cuda.FP8Scale, m, n, k int, a []uint8, aScale []float32, w []uint8, wScale []float32) []float32 {
	c = Reslice(c, m*n)
	ld := 0
	if mode == cuda.FP8Block {
		_, _, ld = cuda.FP8ScaleLayout(m, n, k)
	}
	for i := range m {
		ar := a[i*k : (i+1)*k]
		for j := range n {
			wr := w[j*k : (j+1)*k]
			if mode != cuda.FP8Block {
				var s float32
				for q := range k {
					s += e4m3Val[wr[q]] * e4m3Val[ar[q]]
				}
				c[i*n+j] = float32(wScale[0]*aScale[0]) * s
				continue
			}
			var acc float32
			for q0 := 0; q0 < k; q0 += FP8Block {
				var p float32
				for q := q0; q < min(k, q0+FP8Block); q++ {
					p += e4m3Val[wr[q]] * e4m3Val[ar[q]]
				}
				kb := q0 / FP8Block
				acc += float32(float32(wScale[j/FP8Block*ld+kb]*aScale[kb*m+i]) * p) // rounded before the add: no FMA
			}
			c[i*n+j] = acc
		}
	}
	return c
}

// FP8GEMMBound is the derived bound on |FP8GEMM − exact| for one output
// whose exact value, on the same dequantized operands ã = e4m3·sa, w̃ =
// e4m3·sw, is Σ ã_q w̃_q with Σ|ã_q w̃_q| = absSum: the products are exact,
// a block's fp32 sum of at most 128 adds ≤ γ(127), the multiplier's two
// roundings (sw·sa, then ·p) 2u, the sum over ⌈k/128⌉ blocks γ(⌈k/128⌉):
// γ(127 + 2 + ⌈k/128⌉)·absSum, γ(n) = n·u/(1 − n·u), u = 2^-24. Per
// tensor: γ(k − 1 + 2)·absSum. A bf16 output adds its rounding
// (bf16OutBound: half an ULP, and half the subnormal step).
// This is the fp32 accumulation of the fake and the emulation; a GPU whose
// FP8 tensor cores keep fewer accumulator bits (Hopper: about 14, DeepSeek-V3
// §3.3.2) needs u = 2^-14 over the promotion interval instead.
func FP8GEMMBound(mode cuda.FP8Scale, k int, absSum float64, bf16Out bool, c float64) float64 {
	n := k + 1
	if mode == cuda.FP8Block {
		n = 127 + 2 + (k+FP8Block-1)/FP8Block
	}
	u := math.Ldexp(1, -24)
	b := float64(n) * u / (1 - float64(n)*u) * absSum
	if bf16Out {
		b = bf16OutBound(b, c)
	}
	return b
}

// bf16OutBound adds to b, the bound on an fp32 result's error, that
// result's rounding to bf16 where c is the exact value: half an ULP,
// 2^-8·|fp32 result| ≤ 2^-8·(|c| + b), and in bf16's subnormal range
// (below 2^-126) half its step, 2^-134.
func bf16OutBound(b, c float64) float64 {
	return b + math.Ldexp(1, -8)*(math.Abs(c)+b) + math.Ldexp(1, -134)
}

// e4m3Val decodes every e4m3 code.
var e4m3Val = func() (v [256]float32) {
	for c := range v {
		v[c] = E4M3ToFloat32(uint8(c))
	}
	return v
}()

// QuantFP8RowsK quantizes m rows of k values in 1×128 blocks along k as
// QuantFP8Rows does (the same rule, scale = 448/amax, not a power of two),
// k any positive length: the last block of a row holds k mod 128 values
// when 128 does not divide k (cuBLASLt's VEC128_32F covers ⌈k/128⌉
// blocks). Scales are [m, ⌈k/128⌉] row-major (FP8ActScalesLt reorders
// them).
func QuantFP8RowsK(x []float32, m, k int) (q []uint8, scales []float32) {
	return QuantFP8RowsKInto(nil, nil, x, m, k)
}

// QuantFP8RowsKInto is QuantFP8RowsK into q's and scales' memory when
// they are large enough (else new slices).
func QuantFP8RowsKInto(q []uint8, scales, x []float32, m, k int) ([]uint8, []float32) {
	kb := (k + FP8Block - 1) / FP8Block
	q, scales = Reslice(q, m*k), Reslice(scales, m*kb)
	for i := range m {
		for b := range kb {
			lo, hi := i*k+b*FP8Block, i*k+min(k, (b+1)*FP8Block)
			scales[i*kb+b] = quantBlock(q[lo:hi], x[lo:hi], false)
		}
	}
	return q, scales
}

// QuantFP8Tensor quantizes x (any length) with one multiplier for the
// whole tensor: per-tensor current scaling, the operand of cuBLASLt's
// per-tensor FP8 GEMM (FP8GEMMTensor). The rule is the 1×128 blocks' over
// the whole tensor (amax clamped below at FP8Margin, q = e4m3(fl(x ·
// fl(448/amax))), inv = fl(amax · fl(1/448))), so that the project keeps
// one quantization rule; what the cuda layer's amax_fp8_tensor and
// quant_fp8_tensor compute bit for bit.
func QuantFP8Tensor(x []float32) (q []uint8, inv float32) {
	q = make([]uint8, len(x))
	return q, QuantFP8TensorInto(q, x)
}

// QuantFP8TensorInto is QuantFP8Tensor into q (len(x) codes).
func QuantFP8TensorInto(q []uint8, x []float32) float32 {
	return quantBlock(q[:len(x)], x, false)
}
