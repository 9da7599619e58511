// sortchunks.cu: the alltoall dispatcher's local sort and its inverse.
// counts[s·MB_LOCAL + l] is the number of rows of chunk (source rank s, local
// expert l). Forward (inverse = 0) reorders a receive buffer ordered
// [source][local expert] into [local expert][source]; inverse = 1 reorders
// [local expert][source] back into [source][local expert] (combine). Each
// block first computes both chunk offset tables in shared memory from counts
// (no host sync; its first warp scans them), then copies rows with 16-byte vectors; an output row finds
// its chunk by binary search. probs (fp32, one per row) move with their rows
// when not null.
//
// -D: MB_HIDDEN, MB_EP, MB_LOCAL
#include "moebench.cuh"

#define MB_CHUNKS (MB_EP * MB_LOCAL)
#define MB_VECS (MB_HIDDEN / 8)
#define MB_PER ((MB_CHUNKS + 31) / 32) // chunks per lane in the offset scan

extern "C" __global__ void sort_chunks(const bf16 *src, const float *probs_in, const int32 *counts, int rows, int inverse,
                                       bf16 *dst, float *probs_out) {
    __shared__ int sl[MB_CHUNKS];     // offset of chunk (s, l) in [source][local] order, at s·L + l
    __shared__ int ls[MB_CHUNKS + 1]; // offset of chunk (s, l) in [local][source] order, at l·EP + s
    if (threadIdx.x < 32) { // warp 0 scans both orders: lane i takes chunks [i·PER, (i+1)·PER) of each
        const int lane = threadIdx.x;
        int a = 0, b = 0; // the lane's sums in either order
        for (int q = 0; q < MB_PER; q++) {
            int c = lane * MB_PER + q;
            if (c < MB_CHUNKS) {
                a += counts[c];
                b += counts[(c % MB_EP) * MB_LOCAL + c / MB_EP];
            }
        }
        int ia = a, ib = b; // inclusive scans over the lanes
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
            int ta = __shfl_up_sync(MB_FULL_MASK, ia, d), tb = __shfl_up_sync(MB_FULL_MASK, ib, d);
            if (lane >= d) { ia += ta; ib += tb; }
        }
        a = ia - a, b = ib - b;
        for (int q = 0; q < MB_PER; q++) {
            int c = lane * MB_PER + q;
            if (c < MB_CHUNKS) {
                sl[c] = a;
                a += counts[c];
                ls[c] = b;
                b += counts[(c % MB_EP) * MB_LOCAL + c / MB_EP];
            }
        }
        if (lane == 31) ls[MB_CHUNKS] = ib;
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
