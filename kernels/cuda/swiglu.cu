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
