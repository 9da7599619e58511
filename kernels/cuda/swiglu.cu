// swiglu.cu: act[i, j] = silu(h1[i, j]) · h1[i, MB_FFN + j] · prob[i] for the
// rows of h1 = fc1 output [n, 2·MB_FFN] (gate, then up), computed in fp32 and
// rounded to bf16 once, as kernels.SwiGLUProb; prob may be null (shared expert).
//
// -D: MB_FFN
#include "moebench.cuh"

extern "C" __global__ void swiglu_prob(const bf16 *h1, const float *prob, int n, bf16 *act) {
    long total = (long)n * MB_FFN;
    for (long x = blockIdx.x * (long)blockDim.x + threadIdx.x; x < total; x += (long)gridDim.x * blockDim.x) {
        long i = x / MB_FFN, j = x % MB_FFN;
        float g = bf2f(h1[i * 2 * MB_FFN + j]);
        float u = bf2f(h1[i * 2 * MB_FFN + MB_FFN + j]);
        float p = prob != 0 ? prob[i] : 1.f;
        act[x] = f2bf(g / (1.f + expf(-g)) * u * p);
    }
}
