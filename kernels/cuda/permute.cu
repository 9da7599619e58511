// permute.cu: the permute. permute_order computes the expert-major order of
// the token copies (kernels.PermuteOrder); permute_rows copies
// dst[i, :] = src[rows[i] / div, :] for i < n with 16-byte vector loads and
// stores (MB_HIDDEN % 8 == 0): the permute (div = topk: rows are token slots
// t·k+j) and any other row gather; gather_f32 does the same for one fp32 value
// per row (the probabilities).
//
// -D: MB_HIDDEN
#include "moebench.cuh"

#define MB_VECS (MB_HIDDEN / 8) // uint4 = 8 bf16

// permute_order: one block per expert e (gridDim.x = experts), blockDim.x a
// multiple of 32 and at most 1024. Rows routed to e start after every copy of
// a lower expert; within e they keep slot order (stable, as the host). Writes
// rows[row] = slot, pos[slot] = row and counts[e]. Each warp owns a
// contiguous segment of idx: it counts its segment's copies of lower experts
// and of e, one block-wide prefix over the warps places the segments, and
// each warp then writes its segment's rows of e on its own, 32 slots per
// ballot, with no further block barrier. Each block reads idx twice: fine
// for the n = tokens·k of one micro-batch. The pointers do not alias
// (__restrict__), so idx's loads take the read-only path and may be issued
// ahead of the stores.
extern "C" __global__ void permute_order(const int32 *__restrict__ idx, int n, int32 *__restrict__ rows, int32 *__restrict__ pos,
                                         int32 *__restrict__ counts) {
    __shared__ int wBelow[32], wMine[32];
    const int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int seg = (n + warps * 32 - 1) / (warps * 32) * 32; // slots per warp, a multiple of 32
    const int lo = min(n, warp * seg), hi = min(n, lo + seg);
    int below = 0, mine = 0;
    for (int i = lo + lane; i < hi; i += 32) {
        int x = idx[i];
        below += x < e;
        mine += x == e;
    }
    below = __reduce_add_sync(MB_FULL_MASK, below);
    mine = __reduce_add_sync(MB_FULL_MASK, mine);
    if (lane == 0) { wBelow[warp] = below; wMine[warp] = mine; }
    __syncthreads();
    int base = 0, total = 0; // this warp's first row; e's copies
    for (int w = 0; w < warps; w++) {
        base += wBelow[w] + (w < warp ? wMine[w] : 0);
        total += wMine[w];
    }
    if (threadIdx.x == 0) counts[e] = total;
    for (int start = lo; start < hi; start += 32) {
        int i = start + lane;
        bool hit = i < hi && idx[i] == e;
        unsigned ballot = __ballot_sync(MB_FULL_MASK, hit);
        if (hit) {
            int row = base + __popc(ballot & ((1u << lane) - 1u));
            rows[row] = i;
            pos[i] = row;
        }
        base += __popc(ballot);
    }
}

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
