// sortchunks.cu: the alltoall dispatcher's local sort. The receive buffer is
// ordered [source rank][local expert]; counts[s·MB_LOCAL + l] rows each. The
// output is ordered [local expert][source rank]. Each block first computes
// both chunk offset tables in shared memory from counts (no host sync), then
// copies rows with 16-byte vectors; a row finds its chunk by binary search.
// probs (fp32, one per row) move with their rows when not null.
//
// -D: MB_HIDDEN, MB_EP, MB_LOCAL
#include "moebench.cuh"

#define MB_CHUNKS (MB_EP * MB_LOCAL)
#define MB_VECS (MB_HIDDEN / 8)

extern "C" __global__ void sort_chunks(const bf16 *src, const float *probs_in, const int32 *counts, int rows,
                                       bf16 *dst, float *probs_out) {
    __shared__ int srcOff[MB_CHUNKS]; // chunk (s, l) at srcOff[s·L + l]
    __shared__ int dstOff[MB_CHUNKS + 1]; // chunk in output order (l, s) at dstOff[l·EP + s]
    if (threadIdx.x == 0) {
        int a = 0;
        for (int c = 0; c < MB_CHUNKS; c++) { srcOff[c] = a; a += counts[c]; }
        a = 0;
        for (int l = 0; l < MB_LOCAL; l++)
            for (int s = 0; s < MB_EP; s++) { dstOff[l * MB_EP + s] = a; a += counts[s * MB_LOCAL + l]; }
        dstOff[MB_CHUNKS] = a;
    }
    __syncthreads();
    for (int o = blockIdx.x; o < rows; o += gridDim.x) {
        int lo = 0, hi = MB_CHUNKS - 1; // the last chunk starting at or before o: empty chunks start where the next does
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (dstOff[mid] <= o) lo = mid; else hi = mid - 1;
        }
        int l = lo / MB_EP, s = lo % MB_EP;
        int i = srcOff[s * MB_LOCAL + l] + (o - dstOff[lo]);
        const uint4 *sv = (const uint4 *)(src + (long)i * MB_HIDDEN);
        uint4 *dv = (uint4 *)(dst + (long)o * MB_HIDDEN);
        for (int v = threadIdx.x; v < MB_VECS; v += blockDim.x) dv[v] = sv[v];
        if (threadIdx.x == 0 && probs_in != 0) probs_out[o] = probs_in[i];
    }
}
