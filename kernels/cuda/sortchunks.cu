// sortchunks.cu: the alltoall dispatcher's local sort and its inverse.
// counts[s·MB_LOCAL + l] is the number of rows of chunk (source rank s, local
// expert l). Forward (inverse = 0) reorders a receive buffer ordered
// [source][local expert] into [local expert][source]; inverse = 1 reorders
// [local expert][source] back into [source][local expert] (combine). Each
// block first computes both chunk offset tables in shared memory from counts
// (no host sync), then copies rows with 16-byte vectors; an output row finds
// its chunk by binary search. probs (fp32, one per row) move with their rows
// when not null.
//
// -D: MB_HIDDEN, MB_EP, MB_LOCAL
#include "moebench.cuh"

#define MB_CHUNKS (MB_EP * MB_LOCAL)
#define MB_VECS (MB_HIDDEN / 8)

extern "C" __global__ void sort_chunks(const bf16 *src, const float *probs_in, const int32 *counts, int rows, int inverse,
                                       bf16 *dst, float *probs_out) {
    __shared__ int sl[MB_CHUNKS];     // offset of chunk (s, l) in [source][local] order, at s·L + l
    __shared__ int ls[MB_CHUNKS + 1]; // offset of chunk (s, l) in [local][source] order, at l·EP + s
    if (threadIdx.x == 0) {
        int a = 0;
        for (int c = 0; c < MB_CHUNKS; c++) { sl[c] = a; a += counts[c]; }
        a = 0;
        for (int l = 0; l < MB_LOCAL; l++)
            for (int s = 0; s < MB_EP; s++) { ls[l * MB_EP + s] = a; a += counts[s * MB_LOCAL + l]; }
        ls[MB_CHUNKS] = a;
    }
    __syncthreads();
    const int *out = inverse ? sl : ls; // offsets in output order, indexed in output order
    for (int o = blockIdx.x; o < rows; o += gridDim.x) {
        int lo = 0, hi = MB_CHUNKS - 1; // the last chunk starting at or before o: empty chunks start where the next does
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (out[mid] <= o) lo = mid; else hi = mid - 1;
        }
        int i;
        if (inverse) { // lo = s·L + l
            int s = lo / MB_LOCAL, l = lo % MB_LOCAL;
            i = ls[l * MB_EP + s] + (o - sl[lo]);
        } else { // lo = l·EP + s
            int l = lo / MB_EP, s = lo % MB_EP;
            i = sl[s * MB_LOCAL + l] + (o - ls[lo]);
        }
        const uint4 *sv = (const uint4 *)(src + (long)i * MB_HIDDEN);
        uint4 *dv = (uint4 *)(dst + (long)o * MB_HIDDEN);
        for (int v = threadIdx.x; v < MB_VECS; v += blockDim.x) dv[v] = sv[v];
        if (threadIdx.x == 0 && probs_in != 0) probs_out[o] = probs_in[i];
    }
}
