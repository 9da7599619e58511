// fifotest.cu: the proof kernel of moebench.cuh's shared-memory FIFO
// (comm.FIFOTestProgram), the pipeline HybridEP's kernels move rows through:
// in each block warp 0 produces, the other MB_FT_WARPS − 1 warps consume.
// Block b moves its share of rows rows of MB_FT_HIDDEN bf16 from in to out
// through a FIFO of MB_FT_STAGES slots (a multiple of warps − 1), item i
// being the block's row i (two pieces, each half a row), the (i / (warps −
// 1))-th item of consumer warp 1 + i mod (warps − 1).
// reduce = 0: the consumer stores the slot to out (a bulk store on the
// bulk path, 16-byte stores otherwise); reduce = 1: its lanes read the
// slot and store bf16(2·x). bug breaks the protocol on item 3 of each block
// or from the first reuse of a slot: 1, the producer never arrives; 2, it
// expects 16 bytes fewer than it copies; 3, 16 more; 4, it does not wait
// for the slot to be released; 5, the consumer does not wait for the slot
// to be full. Waits are timed (phase put or get, wait empty or full).
#include "moebench.cuh"

#define MB_FT_PUT 1
#define MB_FT_GET 2
#define MB_FT_WAIT_EMPTY 1
#define MB_FT_WAIT_FULL 2
#define MB_FT_ROW (2 * MB_FT_HIDDEN) // bytes

extern "C" __global__ void __launch_bounds__(32 * MB_FT_WARPS, 1)
    fifo_test(mb_comm c, int rows, int bug, int reduce, const bf16 *in, bf16 *out) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, consumers = MB_FT_WARPS - 1;
    const int per = (rows + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, n = max(0, min(rows, lo + per) - lo);
    const mb_fifo f = mb_fifo_at(mb_dynamic_smem(), MB_FT_STAGES, MB_FT_ROW);
#ifdef MB_BULK
    const int releasers = reduce ? 32 : 1;
#else
    const int releasers = 32;
#endif
    if (threadIdx.x == 0) mb_fifo_init(f, releasers);
    mb_mbar_init_fence();
    __syncthreads();
    if (warp == 0) {
        for (int i = 0; i < n; i++) {
            const unsigned char *row = (const unsigned char *)(in + (size_t)(lo + i) * MB_FT_HIDDEN);
            const void *src[2] = {row, row + MB_FT_ROW / 2};
            const unsigned bytes[2] = {MB_FT_ROW / 2, MB_FT_ROW / 2};
            const int expect = i == 3 ? (bug == 2 ? -16 : bug == 3 ? 16 : 0) : 0;
            const mb_item it = mb_fifo_item(f, consumers, i % consumers, i / consumers);
            if (!mb_fifo_put(f, c, 0, MB_FT_PUT, MB_FT_WAIT_EMPTY, it, 2, src, bytes, expect, !(bug == 4 && i >= MB_FT_STAGES),
                             !(bug == 1 && i == 3)))
                break;
        }
    } else {
        for (int i = warp - 1; i < n; i += consumers) {
            bf16 *dst = out + (size_t)(lo + i) * MB_FT_HIDDEN;
            const mb_item it = mb_fifo_item(f, consumers, warp - 1, i / consumers);
            unsigned char *slot = mb_fifo_slot(f, it);
            bool bulk = false;
#ifdef MB_BULK
            bulk = !reduce;
#endif
            int ok = 1;
            if (bug != 5 && (lane == 0 || !bulk)) ok = mb_fifo_wait(f, c, 0, MB_FT_GET, MB_FT_WAIT_FULL, it) != nullptr;
            if (!__all_sync(MB_FULL_MASK, ok)) break;
            if (bulk) {
#ifdef MB_BULK
                if (lane == 0) {
                    mb_bulk_s2g(dst, slot, MB_FT_ROW);
                    mb_bulk_commit();
                    mb_bulk_wait_read();
                    mb_fifo_release(f, it);
                }
#endif
            } else {
                for (int b = 16 * lane; b < MB_FT_ROW; b += 16 * 32) {
                    uint4 v = mb_lds16(slot + b);
                    if (reduce) {
                        float x[8];
                        bf16 y[8];
                        unpack8(v, x);
                        for (int k = 0; k < 8; k++) y[k] = f2bf(2.f * x[k]);
                        v = pack8(y);
                    }
                    *(uint4 *)((unsigned char *)dst + b) = v;
                }
                mb_fifo_release(f, it);
            }
            __syncwarp();
        }
#ifdef MB_BULK
        if (lane == 0) mb_bulk_wait();
#endif
    }
    __syncthreads();
}
