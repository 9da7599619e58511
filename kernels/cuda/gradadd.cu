// gradadd.cu: the backward's element-wise sums.
//   input_grad  dx = bf16(bf16(dperm + bf16(drouter)) + dshared): the layer's
//               input gradient from its three parts in autograd's order
//               (kernels.InputGrad, B8), the fp32 router's part rounded to
//               the input's bf16 first (B6); drouter or dshared may be null
//   add_f32     dst += src, or += bf16(src) with round: a gradient added to
//               an fp32 main_grad (the router weight's is rounded to its
//               bf16 storage first, B7; a FEPLB helper's expert weight
//               gradients are added as they are)
// Grid-stride loops over n values: 8 (input_grad) or 4 (add_f32) a work
// item with 16-byte accesses, then the last few one per thread. The
// buffers are 16-byte aligned (whole allocations, or offsets of 16 bytes).
#include "moebench.cuh"

__device__ __forceinline__ float round_bf(float f) { return bf2f(f2bf(f)); }

template <bool ROUTER, bool SHARED>
__device__ __forceinline__ void input_grad_all(const bf16 *__restrict__ dperm, const float *__restrict__ drouter, const bf16 *__restrict__ dshared,
                                               long n, bf16 *__restrict__ dx) {
    const long stride = (long)gridDim.x * blockDim.x, first = blockIdx.x * (long)blockDim.x + threadIdx.x, items = n / 8;
    for (long x = first; x < items; x += stride) {
        float a[8], f[8];
        unpack8(((const uint4 *)dperm)[x], a);
        if (ROUTER) {
            const float4 r0 = ((const float4 *)drouter)[2 * x], r1 = ((const float4 *)drouter)[2 * x + 1];
            const float r[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
#pragma unroll
            for (int q = 0; q < 8; q++) a[q] = round_bf(a[q] + round_bf(r[q]));
        }
        if (SHARED) {
            unpack8(((const uint4 *)dshared)[x], f);
#pragma unroll
            for (int q = 0; q < 8; q++) a[q] = round_bf(a[q] + f[q]);
        }
        bf16 o[8];
#pragma unroll
        for (int q = 0; q < 8; q++) o[q] = f2bf(a[q]);
        ((uint4 *)dx)[x] = pack8(o);
    }
    for (long i = items * 8 + first; i < n; i += stride) {
        float a = bf2f(dperm[i]);
        if (ROUTER) a = round_bf(a + round_bf(drouter[i]));
        if (SHARED) a = round_bf(a + bf2f(dshared[i]));
        dx[i] = f2bf(a);
    }
}

extern "C" __global__ void input_grad(const bf16 *__restrict__ dperm, const float *__restrict__ drouter, const bf16 *__restrict__ dshared, long n,
                                      bf16 *__restrict__ dx) {
    if (drouter != 0 && dshared != 0) input_grad_all<true, true>(dperm, drouter, dshared, n, dx);
    else if (drouter != 0) input_grad_all<true, false>(dperm, drouter, dshared, n, dx);
    else if (dshared != 0) input_grad_all<false, true>(dperm, drouter, dshared, n, dx);
    else input_grad_all<false, false>(dperm, drouter, dshared, n, dx);
}

template <bool ROUND>
__device__ __forceinline__ void add_f32_all(float *__restrict__ dst, const float *__restrict__ src, long n) {
    const long stride = (long)gridDim.x * blockDim.x, first = blockIdx.x * (long)blockDim.x + threadIdx.x, items = n / 4;
    for (long x = first; x < items; x += stride) {
        float4 d = ((float4 *)dst)[x];
        const float4 s = ((const float4 *)src)[x];
        d.x += ROUND ? round_bf(s.x) : s.x;
        d.y += ROUND ? round_bf(s.y) : s.y;
        d.z += ROUND ? round_bf(s.z) : s.z;
        d.w += ROUND ? round_bf(s.w) : s.w;
        ((float4 *)dst)[x] = d;
    }
    for (long i = items * 4 + first; i < n; i += stride) dst[i] += ROUND ? round_bf(src[i]) : src[i];
}

extern "C" __global__ void add_f32(float *__restrict__ dst, const float *__restrict__ src, long n, int round) {
    if (round) add_f32_all<true>(dst, src, n);
    else add_f32_all<false>(dst, src, n);
}
