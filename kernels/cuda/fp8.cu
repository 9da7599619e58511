// fp8.cu: FP8 quantization of bf16 rows (issue 34); the semantics are
// kernels/fp8.go's (QuantFP8Rows, QuantMXFP8, DequantFP8Rows), bit for bit.
//
// quant_fp8_1x128: x [n·128] bf16 → q e4m3 and one fp32 dequantization
//   multiplier per 128-block (DeepEP's per-token cast: amax clamped to 1e-4,
//   q = e4m3(x·fl(448/amax)), inv = amax·fl(1/448); flags bit 0 (UE8M0): both
//   powers of two, inv = 2^⌈log2(amax/448)⌉).
// quant_mxfp8: x [n·32] bf16 → q e4m3 and one E8M0 byte per 32-block (OCP MX
//   v1.0 §6.3: X = ⌊log2 amax⌋ − 8 clamped to −127…127, q = e4m3(x·2^-X);
//   flags bit 2: TransformerEngine's X = ⌈log2(amax·fl(1/448))⌉ instead).
// dequant_fp8_1x128: q and its fp32 multipliers → bf16 rows, fl32(q·inv)
//   rounded to bf16 (the rows a bf16 GEMM takes).
// quant_fp8_rows, dequant_fp8_rows: the same into / from packed rows (each
//   row's e4m3 values then its fp32 multipliers, pitch bytes a row): the
//   rows the cuda device's fp8 dispatch moves.
// fp8_rows_lt, quant_fp8_lt: the operands of cuBLASLt's block-scaled FP8
//   GEMM (the cuda layer's expert GEMMs): packed rows, or bf16 rows
//   quantized 1×128 (any k, kernels.QuantFP8RowsK), into contiguous e4m3
//   rows and VEC128_32F-ordered multipliers (kernels.FP8ActScalesLt).
//
// Each lane owns 16 consecutive elements: two 16-byte loads of bf16 and one
// 16-byte store of e4m3 (dequant: one load, two stores); a 1×128 block is
// 8 lanes, an MX block 2, their amax reduced with shuffles. Blocks (n) are
// any count; rows are contiguous ([T, H] with H % 128 == 0 is n = T·H/128
// blocks, scales [T, H/128]); pointers 16-byte aligned.
//
// e4m3 rounding: round to nearest even, saturating to ±448, NaN → 0x7F.
// From sm_89 the conversion is PTX's cvt.rn.satfinite.e4m3x2.f32 unless
// flags bit 1 asks for the software one; below sm_89 and on the host
// simulation (MB_HOST) it is always the software one, which the tests hold
// bit for bit to kernels.E4M3FromFloat32. That the PTX instruction gives the
// same bits is its specification's promise, checked only on an sm_89+ GPU
// (run both with flags bit 1 clear and set and compare).
//
// No -D constants.
#include "moebench.cuh"

#define MB_FP8_UE8M0 1 // flags: power-of-two scales (1×128)
#define MB_FP8_SOFT 2  // flags: software e4m3 conversion on sm_89+ too
#define MB_FP8_MX_ROUND_UP 4 // flags: TransformerEngine's MX scale (amax/448 rounded up to 2^k)

// mb_e4m3: f rounded to e4m3 in software (kernels.E4M3FromFloat32).
__device__ __forceinline__ unsigned mb_e4m3(float f) {
    const unsigned b = __float_as_uint(f), sign = (b >> 24) & 0x80u, a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fu; // NaN
    if (a < 0x00800000u) return sign;  // zero, float32 subnormal
    const int e = (int)(a >> 23) - 127;
    if (e > 8) return sign | 0x7eu; // ≥ 512, infinity: saturate
    const unsigned m = (a & 0x7fffffu) | 0x800000u;
    const unsigned shift = 20u + (e < -6 ? (unsigned)(-6 - e) : 0u); // e4m3 subnormals below 2^-6
    if (shift > 25u) return sign;
    unsigned q = m >> shift;
    const unsigned rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
    const unsigned code = e >= -6 ? ((unsigned)(e + 6) << 3) + q : q;
    return sign | (code > 0x7eu ? 0x7eu : code);
}

// mb_e4m3x2: lo in the low byte, hi in the high byte.
__device__ __forceinline__ unsigned mb_e4m3x2(float lo, float hi, int flags) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(MB_HOST)
    if (!(flags & MB_FP8_SOFT)) {
        unsigned short r;
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo)); // first source → high byte
        return r;
    }
#endif
    return mb_e4m3(lo) | (mb_e4m3(hi) << 8);
}

// mb_e4m3_value: c's exact value (kernels.E4M3ToFloat32).
__device__ __forceinline__ float mb_e4m3_value(unsigned c) {
    const unsigned e = (c >> 3) & 15u, m = c & 7u;
    float v;
    if ((c & 0x7fu) == 0x7fu) v = __uint_as_float(0x7fc00000u);
    else if (e == 0u) v = (float)m * (1.0f / 512.0f);
    else v = __uint_as_float(((e + 120u) << 23) | (m << 20)); // 1.m·2^(e−7)
    return (c & 0x80u) ? -v : v;
}

// mb_fp8_quant: blocks of G lanes × 16 elements; each warp takes 32/G blocks
// a step (every lane takes part in the shuffles, so the loop is the warp's).
// pitch 0: q and scale are contiguous block arrays; else q holds packed rows
// of pitch bytes, each S blocks' e4m3 values then their S fp32 multipliers
// (quant_fp8_rows), and scale is unused.
template <int G, bool MX>
__device__ __forceinline__ void mb_fp8_quant(const bf16 *__restrict__ x, long n, int flags, unsigned char *__restrict__ q,
                                             float *__restrict__ scale, unsigned char *__restrict__ e8m0, int S = 1,
                                             long pitch = 0) {
    const int lane = threadIdx.x & 31;
    const long step = (long)gridDim.x * (blockDim.x >> 5) * (32 / G);
    for (long base = ((long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * (32 / G); base < n; base += step) {
        const long g = base + lane / G;
        const bool ok = g < n;
        const long off = (g * G + lane % G) * 16;
        float v[16];
        float amax = 0.f;
        if (ok) {
            const uint4 a = *(const uint4 *)(x + off), b = *(const uint4 *)(x + off + 8);
            const unsigned w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                v[2 * i] = bf2f((bf16)(w[i] & 0xffffu));
                v[2 * i + 1] = bf2f((bf16)(w[i] >> 16));
            }
#pragma unroll
            for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(v[i]));
        }
#pragma unroll
        for (int o = G / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(MB_FULL_MASK, amax, o));
        if (!ok) continue;
        float mul, inv = 0.f;
        int sx = 0;
        if (MX) {
            if (flags & MB_FP8_MX_ROUND_UP) { // TransformerEngine's float_to_e8m0(amax·fl(1/448)), exp2f_rcp
                const unsigned s = __float_as_uint(amax * (1.0f / 448.0f)), e = s >> 23, m = s & 0x7fffffu;
                const unsigned be = e + ((m > 0u && e != 0xfeu && !(e == 0u && m <= 0x400000u)) ? 1u : 0u);
                sx = (int)be - 127;
                mul = be == 0u ? 1.f : __uint_as_float((254u - be) << 23);
            } else {
                sx = max((int)((__float_as_uint(amax) >> 23) & 0xffu) - 127 - 8, -127); // X
                mul = __uint_as_float((unsigned)(127 - sx) << 23);                    // 2^-X
            }
        } else {
            const float am = fmaxf(amax, 1e-4f);
            if (flags & MB_FP8_UE8M0) {
                const unsigned s = __float_as_uint(am * (1.0f / 448.0f));
                const int e = (int)((s >> 23) & 0xffu) - 127 + ((s & 0x7fffffu) != 0u);
                mul = __uint_as_float((unsigned)(127 - e) << 23);
                inv = __uint_as_float((unsigned)(127 + e) << 23);
            } else {
                mul = 448.0f / am;
                inv = am * (1.0f / 448.0f);
            }
        }
        unsigned o[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            o[i] = mb_e4m3x2(v[4 * i] * mul, v[4 * i + 1] * mul, flags) | (mb_e4m3x2(v[4 * i + 2] * mul, v[4 * i + 3] * mul, flags) << 16);
        uint4 out;
        out.x = o[0], out.y = o[1], out.z = o[2], out.w = o[3];
        if (pitch) { // packed rows: block g is block g % S of row g / S
            unsigned char *row = q + (g / S) * pitch;
            *(uint4 *)(row + (g % S) * 128 + (lane % G) * 16) = out;
            if (lane % G == 0) ((float *)(row + (long)S * 128))[g % S] = inv;
            continue;
        }
        *(uint4 *)(q + off) = out;
        if (lane % G == 0) {
            if (MX) e8m0[g] = (unsigned char)(sx + 127);
            else scale[g] = inv;
        }
    }
}

extern "C" __global__ void quant_fp8_1x128(const bf16 *__restrict__ x, long n, int flags, unsigned char *__restrict__ q,
                                           float *__restrict__ scale) {
    mb_fp8_quant<8, false>(x, n, flags, q, scale, nullptr);
}

extern "C" __global__ void quant_mxfp8(const bf16 *__restrict__ x, long n, int flags, unsigned char *__restrict__ q,
                                       unsigned char *__restrict__ e8m0) {
    mb_fp8_quant<2, true>(x, n, flags, q, nullptr, e8m0);
}

// quant_fp8_rows: quant_fp8_1x128 into packed rows (the rows an fp8
// dispatch moves): n 128-blocks, S a row, each row of out pitch bytes (a
// multiple of 16): its S·128 e4m3 values, then its S fp32 multipliers.
extern "C" __global__ void quant_fp8_rows(const bf16 *__restrict__ x, long n, int flags, int S, long pitch,
                                          unsigned char *__restrict__ out) {
    mb_fp8_quant<8, false>(x, n, flags, out, nullptr, nullptr, S, pitch);
}
// mb_fp8_dequant: n 128-blocks; each lane takes 16 elements a step. pitch
// 0: q and scale contiguous; else packed rows as quant_fp8_rows writes.
__device__ __forceinline__ void mb_fp8_dequant(const unsigned char *__restrict__ q, const float *__restrict__ scale, long n,
                                               bf16 *__restrict__ y, int S, long pitch) {
    const long chunks = n * 8;
    for (long c = (long)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += (long)gridDim.x * blockDim.x) {
        const long g = c / 8;
        const unsigned char *src = q + c * 16;
        float s;
        if (pitch) {
            const unsigned char *row = q + (g / S) * pitch;
            src = row + (g % S) * 128 + (c % 8) * 16;
            s = ((const float *)(row + (long)S * 128))[g % S];
        } else {
            s = scale[g];
        }
        const uint4 a = *(const uint4 *)src;
        const unsigned w[4] = {a.x, a.y, a.z, a.w};
        unsigned o[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const unsigned two = w[i / 2] >> (16 * (i & 1));
            o[i] = (unsigned)f2bf(mb_e4m3_value(two & 0xffu) * s) | ((unsigned)f2bf(mb_e4m3_value((two >> 8) & 0xffu) * s) << 16);
        }
        uint4 lo, hi;
        lo.x = o[0], lo.y = o[1], lo.z = o[2], lo.w = o[3];
        hi.x = o[4], hi.y = o[5], hi.z = o[6], hi.w = o[7];
        *(uint4 *)(y + c * 16) = lo;
        *(uint4 *)(y + c * 16 + 8) = hi;
    }
}
// dequant_fp8_1x128: n 128-blocks of q with their multipliers → bf16.
extern "C" __global__ void dequant_fp8_1x128(const unsigned char *__restrict__ q, const float *__restrict__ scale, long n,
                                             bf16 *__restrict__ y) {
    mb_fp8_dequant(q, scale, n, y, 1, 0);
}
// dequant_fp8_rows: packed rows (quant_fp8_rows's layout; S blocks a row,
// pitch bytes) → contiguous bf16 rows [n/S, S·128].
extern "C" __global__ void dequant_fp8_rows(const unsigned char *__restrict__ in, long n, int S, long pitch,
                                            bf16 *__restrict__ y) {
    mb_fp8_dequant(in, nullptr, n, y, S, pitch);
}

// The operands of cuBLASLt's block-scaled FP8 GEMM (the cuda layer's
// expert GEMMs, harness/fp8dev.go): e4m3 rows [m, k] contiguous and their
// 1×128 multipliers in VEC128_32F's order, k-block major with the GEMM's m
// rows contiguous (s[b·m + i]; kernels.FP8ActScalesLt).
//
// fp8_rows_lt: m packed rows (quant_fp8_rows's layout: S blocks a row,
//   pitch bytes a row, 16-byte aligned) → codes q [m, S·128] and
//   multipliers s [S][m]. Each thread moves 16 bytes a step (one load, one
//   store); the first lane of a block's 8 moves its multiplier.
extern "C" __global__ void fp8_rows_lt(const unsigned char *__restrict__ in, int m, int S, long pitch,
                                       unsigned char *__restrict__ q, float *__restrict__ s) {
    const long chunks = (long)m * S * 8;
    for (long c = (long)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += (long)gridDim.x * blockDim.x) {
        const long g = c / 8, row = g / S, b = g % S;
        const unsigned char *src = in + row * pitch;
        *(uint4 *)(q + c * 16) = *(const uint4 *)(src + b * 128 + (c % 8) * 16);
        if (c % 8 == 0) s[b * m + row] = ((const float *)(src + (long)S * 128))[b];
    }
}

// quant_fp8_lt: m bf16 rows of k values (contiguous) quantized in 1×128
//   blocks along k by quant_fp8_1x128's rule (kernels.QuantFP8RowsK: the
//   last block of a row holds k mod 128 values when 128 does not divide
//   k) into codes q [m, k] and multipliers s [⌈k/128⌉][m]. One warp a
//   block, 4 elements a lane, the amax reduced with shuffles; scalar loads
//   and stores (k is any multiple of 16: fc2's input, ffn wide). flags as
//   quant_fp8_1x128's (bit 1: software e4m3 conversion).
extern "C" __global__ void quant_fp8_lt(const bf16 *__restrict__ x, int m, int k, int flags, unsigned char *__restrict__ q,
                                        float *__restrict__ s) {
    const int lane = threadIdx.x & 31, kb = (k + 127) / 128;
    const long blocks = (long)m * kb, step = (long)gridDim.x * (blockDim.x >> 5);
    for (long g = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); g < blocks; g += step) {
        const long row = g / kb;
        const int b = (int)(g % kb), j0 = b * 128 + lane * 4;
        float v[4];
        float amax = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[i] = j0 + i < k ? bf2f(x[row * k + j0 + i]) : 0.f;
            amax = fmaxf(amax, fabsf(v[i]));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(MB_FULL_MASK, amax, o));
        const float am = fmaxf(amax, 1e-4f), mul = 448.0f / am;
        const unsigned lo = mb_e4m3x2(v[0] * mul, v[1] * mul, flags), hi = mb_e4m3x2(v[2] * mul, v[3] * mul, flags);
        const unsigned char c[4] = {(unsigned char)(lo & 0xffu), (unsigned char)(lo >> 8), (unsigned char)(hi & 0xffu),
                                    (unsigned char)(hi >> 8)};
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (j0 + i < k) q[row * k + j0 + i] = c[i];
        if (lane == 0) s[(long)b * m + row] = am * (1.0f / 448.0f);
    }
}

// Per-tensor current scaling (cuBLASLt's per-tensor FP8 GEMM, SCALAR_32F:
// one fp32 multiplier for a whole operand; kernels.QuantFP8Tensor): the
// 1×128 rule over the whole tensor, amax = max |x| over n bf16 values,
// clamped below at 1e-4, q = e4m3(x · 448/amax), multiplier amax · (1/448).
//
// amax_fp8_tensor: n values of x; each warp's max |x| into *amax by
//   atomicMax on its bits (non-negative floats order as unsigned ints; the
//   max is the same in any order). The caller zeroes *amax first; several
//   launches onto one word take the max of all their values.
// quant_fp8_tensor: n values of x with *amax's multiplier into codes q
//   [n] and the multiplier s[0]. amax and s must not overlap (every thread
//   reads amax; the first writes s). flags as quant_fp8_1x128's. Scalar
//   loads and stores, two values a step (not tuned: the path of GPUs whose
//   cuBLASLt has no block scaling).
extern "C" __global__ void amax_fp8_tensor(const bf16 *__restrict__ x, long n, unsigned *__restrict__ amax) {
    float a = 0.f;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        a = fmaxf(a, fabsf(bf2f(x[i])));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(MB_FULL_MASK, a, o));
    if ((threadIdx.x & 31) == 0 && a > 0.f) atomicMax(amax, __float_as_uint(a));
}

extern "C" __global__ void quant_fp8_tensor(const bf16 *__restrict__ x, long n, int flags, const unsigned *__restrict__ amax,
                                            unsigned char *__restrict__ q, float *__restrict__ s) {
    const float am = fmaxf(__uint_as_float(*amax), 1e-4f), mul = 448.0f / am;
    for (long i = 2 * ((long)blockIdx.x * blockDim.x + threadIdx.x); i < n; i += 2L * gridDim.x * blockDim.x) {
        const bool two = i + 1 < n;
        const unsigned c = mb_e4m3x2(bf2f(x[i]) * mul, two ? bf2f(x[i + 1]) * mul : 0.f, flags);
        q[i] = (unsigned char)(c & 0xffu);
        if (two) q[i + 1] = (unsigned char)(c >> 8);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) s[0] = am * (1.0f / 448.0f);
}
