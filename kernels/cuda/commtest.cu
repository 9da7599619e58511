// commtest.cu: the SM-driven machinery's proof kernel (comm.CommTestProgram):
// ring-buffer channels between ranks in the receiver's memory and a flag
// barrier, DeepEP's queue protocol in miniature. Each rank r sends
// MB_CT_CHANNELS × items ints to rank (r+1) mod ranks. One launch covers the
// ranks of one GPU: block b serves rank first + b / (2·MB_CT_CHANNELS);
// even blocks send a channel, odd blocks receive one. A channel's ring of
// MB_CT_SLOTS ints lies in the receiver's memory with its head (advanced by
// the receiver) and tail (advanced by the sender, who writes the slots
// through a peer pointer). Each receiver stores its count into a
// host-polled counter; then each rank's first block meets the others at a
// flag barrier. bug breaks the protocol for the tests: 1, the senders never
// publish their tail; 2, the last rank never reaches the barrier. Every
// wait has the communicator's timeout (mb_wait), so a broken protocol ends
// with the rank, phase and wait recorded instead of a hang.
#include "moebench.cuh"

#define MB_CT_THREADS 128
#define MB_CT_HEADER 32 // ints before a ring's slots: head at 0, tail at 16 (apart)
#define MB_CT_RING (MB_CT_HEADER + MB_CT_SLOTS)
// phases and waits (comm.CommTestNames)
#define MB_CT_SEND 1
#define MB_CT_RECV 2
#define MB_CT_BARRIER 3
#define MB_CT_WAIT_HEAD 1
#define MB_CT_WAIT_TAIL 2
#define MB_CT_WAIT_FLAG 16 // + the rank waited for

// rings[r]: rank r's rings, MB_CT_CHANNELS of MB_CT_RING ints; src[r] and
// dst[r]: rank r's MB_CT_CHANNELS × items ints to send and received;
// flags[r]: rank r's barrier flags (ranks ints).
extern "C" __global__ void __launch_bounds__(MB_CT_THREADS, 1)
    comm_test(mb_comm c, int first, int ranks, int items, int bug, int epoch, int *const *rings, const int *const *src,
              int *const *dst, int *const *flags) {
    __shared__ int ok, lo, hi;
    const int local = blockIdx.x / (2 * MB_CT_CHANNELS), rank = first + local;
    const int ch = blockIdx.x / 2 % MB_CT_CHANNELS, to = (rank + 1) % ranks;
    const bool sender = blockIdx.x % 2 == 0;
    if (threadIdx.x == 0) ok = 1;
    __syncthreads();
    if (sender) {
        int *ring = rings[to] + ch * MB_CT_RING; // in the receiver's memory
        const int *in = src[rank] + ch * items;
        for (int sent = 0; sent < items;) {
            const int n = min(items - sent, MB_CT_SLOTS / 2); // a chunk
            if (threadIdx.x == 0) // room for the chunk: the receiver's head
                ok = mb_wait(c, rank, MB_CT_SEND, MB_CT_WAIT_HEAD, sent + n - MB_CT_SLOTS,
                             [ring] { return (long long)mb_ld_acquire_sys(ring); },
                             [sent, n](long long head) { return sent + n - head <= MB_CT_SLOTS; });
            __syncthreads();
            if (!ok) break;
            for (int j = threadIdx.x; j < n; j += blockDim.x) ring[MB_CT_HEADER + (sent + j) % MB_CT_SLOTS] = in[sent + j];
            __syncthreads(); // the block's stores, then the tail (release: cumulative)
            sent += n;
            if (threadIdx.x == 0 && bug != 1) mb_st_release_sys(ring + 16, sent);
        }
    } else {
        int *ring = rings[rank] + ch * MB_CT_RING; // its own
        int *out = dst[rank] + ch * items;
        int head = 0;
        while (head < items) {
            if (threadIdx.x == 0) {
                ok = mb_wait_ge(c, rank, MB_CT_RECV, MB_CT_WAIT_TAIL, ring + 16, head + 1);
                lo = head, hi = mb_ld_acquire_sys(ring + 16);
            }
            __syncthreads();
            if (!ok) break;
            for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) out[j] = ring[MB_CT_HEADER + j % MB_CT_SLOTS];
            __syncthreads(); // the block's loads, then the head
            head = hi;
            if (threadIdx.x == 0) mb_st_release_sys(ring, head);
            __syncthreads(); // lo and hi are rewritten next round
        }
        if (threadIdx.x == 0 && ok) mb_st_release_sys(mb_counter(c.sig, ranks, rank * MB_CT_CHANNELS + ch), head);
    }
    if (blockIdx.x % (2 * MB_CT_CHANNELS) == 0 && threadIdx.x == 0 && !(bug == 2 && rank == ranks - 1))
        mb_barrier(c, rank, ranks, MB_CT_BARRIER, MB_CT_WAIT_FLAG, flags, epoch);
}
