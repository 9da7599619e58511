// swiglu.cu: act[i, j] = silu(h1[i, j]) · h1[i, MB_FFN + j] · prob[i] for the
// rows of h1 = fc1 output [n, 2·MB_FFN] (gate, then up), computed in fp32 and
// rounded to bf16 once, as kernels.SwiGLUProb; prob may be null (shared expert).
// With MB_FFN % 8 == 0 each work item is 8 columns, moved with 16-byte loads
// and stores, else one column (grid-stride over the items).
//
// -D: MB_FFN
#include "moebench.cuh"

#if MB_FFN % 8 == 0
#define MB_COLS 8 // columns per work item
#else
#define MB_COLS 1
#endif
#define MB_ITEMS (MB_FFN / MB_COLS) // work items per row

__device__ __forceinline__ float swiglu1(float g, float u, float p) { return g / (1.f + expf(-g)) * u * p; }

// swiglu_rows is the kernel's loop; WITH_PROB says whether prob is given,
// decided once outside the loop, so that each item's probability load is
// unconditional and issued with its row's, before the math (the SASS audit
// checks that no load comes after the math begins).
template <bool WITH_PROB>
__device__ __forceinline__ void swiglu_rows(const bf16 *__restrict__ h1, const float *__restrict__ prob, int n, bf16 *__restrict__ act) {
    long total = (long)n * MB_ITEMS;
    for (long x = blockIdx.x * (long)blockDim.x + threadIdx.x; x < total; x += (long)gridDim.x * blockDim.x) {
        long i = x / MB_ITEMS, v = x % MB_ITEMS;
        float p = WITH_PROB ? mb_ld_early_f32(prob + i) : 1.f;
#if MB_COLS == 8
        const uint4 *row = (const uint4 *)(h1 + i * 2 * MB_FFN);
        uint4 gv = row[v], uv = row[MB_ITEMS + v];
        float g[8], u[8];
        unpack8(gv, g);
        unpack8(uv, u);
        bf16 y[8];
#pragma unroll
        for (int q = 0; q < 8; q++) y[q] = f2bf(swiglu1(g[q], u[q], p));
        ((uint4 *)act)[x] = pack8(y);
#else
        bf16 g = h1[i * 2 * MB_FFN + v], u = h1[i * 2 * MB_FFN + MB_FFN + v];
        act[x] = f2bf(swiglu1(bf2f(g), bf2f(u), p));
#endif
    }
}

extern "C" __global__ void swiglu_prob(const bf16 *__restrict__ h1, const float *__restrict__ prob, int n, bf16 *__restrict__ act) {
    if (prob != 0) swiglu_rows<true>(h1, prob, n, act);
    else swiglu_rows<false>(h1, prob, n, act);
}

// swiglu_prob_bwd: the backward of swiglu_prob (kernels.SwiGLUProbBackward)
// for the rows of h1 = [g | u] [n, 2·MB_FFN] and dact [n, MB_FFN], in fp32:
//   dg = dact·p · silu'(g) · u,  du = dact·p · silu(g)  (silu recomputed from
//   h1; stored bf16 in dh1 [n, 2·MB_FFN], the rounding point B3)
//   dprob[i] = Σ_j silu(g_j)·u_j·dact_j  (fp32, not written when prob is null)
// One warp per row (grid-stride over rows): each lane takes the row's items
// lane, lane + 32, … (8 columns with 16-byte accesses when MB_FFN % 8 == 0,
// else one), summing its part of dprob in column order, then the warp's
// lanes add theirs in a butterfly — another order than the host's
// column-by-column sum, so dprob agrees with the host's to fp32 rounding,
// not bit for bit.
__device__ __forceinline__ void swiglu_bwd1(float g, float u, float d, float p, bf16 &dg, bf16 &du, float &dp) {
    const float sg = 1.f / (1.f + expf(-g)), silu = g * sg, c = d * p;
    dg = f2bf(c * (sg * (1.f + g * (1.f - sg))) * u);
    du = f2bf(c * silu);
    dp += silu * u * d;
}

template <bool WITH_PROB>
__device__ __forceinline__ void swiglu_bwd_rows(const bf16 *__restrict__ h1, const float *__restrict__ prob, const bf16 *__restrict__ dact, int n,
                                                bf16 *__restrict__ dh1, float *__restrict__ dprob) {
    const int lane = threadIdx.x & 31;
    const long warps = (long)gridDim.x * (blockDim.x >> 5);
    for (long i = blockIdx.x * (long)(blockDim.x >> 5) + (threadIdx.x >> 5); i < n; i += warps) { // warp-uniform
        const float p = WITH_PROB ? mb_ld_early_f32(prob + i) : 1.f;
        float dp = 0.f;
        for (int v = lane; v < MB_ITEMS; v += 32) {
#if MB_COLS == 8
            const uint4 *row = (const uint4 *)(h1 + i * 2 * MB_FFN);
            const uint4 gv = row[v], uv = row[MB_ITEMS + v], dv = ((const uint4 *)(dact + i * MB_FFN))[v];
            float g[8], u[8], d[8];
            unpack8(gv, g);
            unpack8(uv, u);
            unpack8(dv, d);
            bf16 dg[8], du[8];
#pragma unroll
            for (int q = 0; q < 8; q++) swiglu_bwd1(g[q], u[q], d[q], p, dg[q], du[q], dp);
            uint4 *out = (uint4 *)(dh1 + i * 2 * MB_FFN);
            out[v] = pack8(dg);
            out[MB_ITEMS + v] = pack8(du);
#else
            const long at = i * 2 * MB_FFN + v;
            swiglu_bwd1(bf2f(h1[at]), bf2f(h1[at + MB_FFN]), bf2f(dact[i * MB_FFN + v]), p, dh1[at], dh1[at + MB_FFN], dp);
#endif
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dp += __shfl_xor_sync(MB_FULL_MASK, dp, o);
        if (WITH_PROB && lane == 0) dprob[i] = dp;
    }
}

extern "C" __global__ void swiglu_prob_bwd(const bf16 *__restrict__ h1, const float *__restrict__ prob, const bf16 *__restrict__ dact, int n,
                                           bf16 *__restrict__ dh1, float *__restrict__ dprob) {
    if (prob != 0) swiglu_bwd_rows<true>(h1, prob, dact, n, dh1, dprob);
    else swiglu_bwd_rows<false>(h1, prob, dact, n, dh1, dprob);
}
