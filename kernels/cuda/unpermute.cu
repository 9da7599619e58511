// unpermute.cu: out[t, :] = bf16(Σ_j src[pos[t·K + j], :]) — the k expert
// outputs of each token summed in fp32 in increasing row order (the host's
// order: permuted rows are expert-major), stored as bf16; with shared != null
// then out = bf16(out + shared[t, :]), as the host layer does. A gather, not an
// atomic scatter: deterministic. pos maps each token slot to its row. One
// block per token (grid-stride); each thread takes 8 columns at a time with
// 16-byte loads and stores (MB_HIDDEN % 8 == 0), all k rows loaded before the
// sum so that k loads are in flight.
//
// -D: MB_HIDDEN, MB_TOPK
#include "moebench.cuh"

#define MB_VECS (MB_HIDDEN / 8) // uint4 = 8 bf16

extern "C" __global__ void unpermute_sum(const bf16 *src, const int32 *pos, const bf16 *shared, int tokens, bf16 *out) {
    for (long t = blockIdx.x; t < tokens; t += gridDim.x) {
        int p[MB_TOPK];
#pragma unroll
        for (int j = 0; j < MB_TOPK; j++) p[j] = pos[t * MB_TOPK + j];
        for (int a = 1; a < MB_TOPK; a++) // insertion sort: k is small
            for (int b = a; b > 0 && p[b - 1] > p[b]; b--) { int x = p[b]; p[b] = p[b - 1]; p[b - 1] = x; }
        for (int v = threadIdx.x; v < MB_VECS; v += blockDim.x) {
            uint4 in[MB_TOPK];
#pragma unroll
            for (int j = 0; j < MB_TOPK; j++) in[j] = ((const uint4 *)(src + (long)p[j] * MB_HIDDEN))[v];
            float s[8], f[8];
#pragma unroll
            for (int q = 0; q < 8; q++) s[q] = 0.f;
#pragma unroll
            for (int j = 0; j < MB_TOPK; j++) {
                unpack8(in[j], f);
#pragma unroll
                for (int q = 0; q < 8; q++) s[q] += f[q];
            }
            bf16 y[8];
#pragma unroll
            for (int q = 0; q < 8; q++) y[q] = f2bf(s[q]);
            if (shared != 0) {
                unpack8(((const uint4 *)(shared + t * MB_HIDDEN))[v], f);
#pragma unroll
                for (int q = 0; q < 8; q++) y[q] = f2bf(bf2f(y[q]) + f[q]);
            }
            ((uint4 *)(out + t * MB_HIDDEN))[v] = pack8(y);
        }
    }
}
