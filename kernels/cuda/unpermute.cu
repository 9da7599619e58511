// unpermute.cu: out[t, :] = bf16(Σ_j src[pos[t·K + j], :]) — the k expert
// outputs of each token summed in fp32 in increasing row order (the host's
// order: permuted rows are expert-major), stored as bf16; with shared != null
// then out = bf16(out + shared[t, :]), as the host layer does. A gather, not an
// atomic scatter: deterministic. pos maps each token slot to its row.
//
// -D: MB_HIDDEN, MB_TOPK
#include "moebench.cuh"

extern "C" __global__ void unpermute_sum(const bf16 *src, const int32 *pos, const bf16 *shared, int tokens, bf16 *out) {
    for (long t = blockIdx.x; t < tokens; t += gridDim.x) {
        int p[MB_TOPK];
        for (int j = 0; j < MB_TOPK; j++) p[j] = pos[t * MB_TOPK + j];
        for (int a = 1; a < MB_TOPK; a++) // insertion sort: k is small
            for (int b = a; b > 0 && p[b - 1] > p[b]; b--) { int x = p[b]; p[b] = p[b - 1]; p[b - 1] = x; }
        for (int c = threadIdx.x; c < MB_HIDDEN; c += blockDim.x) {
            float s = 0.f;
            for (int j = 0; j < MB_TOPK; j++) s += bf2f(src[(long)p[j] * MB_HIDDEN + c]);
            bf16 y = f2bf(s);
            if (shared != 0) y = f2bf(bf2f(y) + bf2f(shared[t * MB_HIDDEN + c]));
            out[t * MB_HIDDEN + c] = y;
        }
    }
}
