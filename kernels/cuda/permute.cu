// permute.cu: row gathers. permute_rows copies dst[i, :] = src[rows[i] / div, :]
// for i < n with 16-byte vector loads and stores (MB_HIDDEN % 8 == 0): the
// permute (div = topk: rows are token slots t·k+j) and any other row gather.
// gather_f32 does the same for one fp32 value per row (the probabilities).
//
// -D: MB_HIDDEN
#include "moebench.cuh"

#define MB_VECS (MB_HIDDEN / 8) // uint4 = 8 bf16

extern "C" __global__ void permute_rows(const bf16 *src, const int32 *rows, int div, int n, bf16 *dst) {
    for (long i = blockIdx.x; i < n; i += gridDim.x) {
        const uint4 *s = (const uint4 *)(src + (long)(rows[i] / div) * MB_HIDDEN);
        uint4 *d = (uint4 *)(dst + i * MB_HIDDEN);
        for (int v = threadIdx.x; v < MB_VECS; v += blockDim.x) d[v] = s[v];
    }
}

extern "C" __global__ void gather_f32(const float *src, const int32 *rows, int div, int n, float *dst) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dst[i] = src[rows[i] / div];
}
