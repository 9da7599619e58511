// deepep.cu: DeepEP's normal-mode intranode design (dispatchers/deepep;
// docs/dispatchers/deepep.md gives the protocol, the received order and
// the rounding points, which these kernels reproduce bit for bit). Read
// for semantics from deepseek-ai/DeepEP's intranode.cu and layout.cu; the
// code is moebench's.
//
//   deepep_layout   plain, per rank: the ranks each token goes to (once per
//                   rank) and the tokens per rank and copies per expert
//   deepep_notify   collective, a block per rank: each destination's tokens
//                   per channel; counts into every peer's queue buffer,
//                   barriers, prefix sums, the host-mapped counters the host
//                   waits for, the queues' metadata cleared
//   deepep_dispatch collective, MB_CHANNELS·2 blocks per rank (the SM budget):
//                   even blocks send channel b/2, odd ones receive it, through
//                   a ring per (channel, source) in the receiver's buffer
//   deepep_permute  plain, per rank: the expert-major order of the received
//                   copies (the rows the grouped GEMM reads)
//   deepep_combine  collective, the same blocks: each expert rank sends, per
//                   received token, the bf16 sum of its local experts'
//                   outputs; the home rank adds them in rank order into Y
//
// The backward (dispatchers/deepep/devbackward.go) reuses them over the
// forward's handle: deepep_notify cached (barriers, the queues' metadata
// cleared, nothing counted), deepep_dispatch with bwd set (the output
// gradients' rows, no top-k), deepep_combine_bwd (the copies'
// input gradients' partial sums, each row carrying its token's K
// probability gradients, summed at home into DX and DProbs).
//
// A collective launch covers all ranks of one GPU: block b serves rank
// first + b / (blocks per rank). The ranks' buffers come from a descriptor
// table (DE_* slots, 64-bit addresses, indexed by rank; peers' queue buffers
// through it). Offsets of the arrays in a rank's queue buffer (MB_Q_*,
// reached by peers) and layout buffer (MB_F_*, local) are the Go side's
// (deepep.layout). Every wait on another rank is timed (mb_wait); a kernel
// whose wait gives up skips its remaining work but still meets its block's
// barriers.
//
// -D: MB_HIDDEN, MB_TOPK, MB_RANKS, MB_LOCAL, MB_TOKENS, MB_CHANNELS,
//     MB_DRING, MB_DCHUNK, MB_CRING, MB_CCHUNK (queues: ring slots, chunk),
//     MB_WARPS (warps of a dispatch or combine block, a multiple of
//     MB_RANKS), MB_DE_DHIDDEN (optional, MB_HIDDEN when not given: the
//     bf16-sized elements of the forward dispatch's rows; at --precision fp8
//     the packed rows, each its MB_HIDDEN e4m3 bytes then its MB_HIDDEN/128
//     fp32 scales padded to 16 bytes, DeepEP's (x, x_scales) quantized by
//     the caller before the dispatch), MB_MINB (such blocks one SM must hold: the register bound),
//     MB_DE_BUG (tests only: 1, dispatch senders never publish their tail;
//     2, the last rank never reaches notify's first barrier; 3, the last
//     rank writes its counts over rank 0's; 4, the backward's combine
//     senders never publish their tail; with MB_DE_DHIDDEN < MB_HIDDEN:
//     5, the fp8 dispatch's senders copy a row's e4m3 bytes and not its
//     scales; 6, its receivers store the rows at the e4m3 bytes' stride,
//     the scales left out of it; 7, the dispatch's senders skip the
//     proxy fence after their ring stores (the bulk path's receivers then
//     read them through the async proxy unordered)), and the offsets MB_Q_*
//     and MB_F_*.
#include "moebench.cuh"

#define DE_N MB_RANKS
#define DE_K MB_TOPK
#define DE_C MB_CHANNELS
#define DE_VECS (MB_HIDDEN / 8) // uint4 = 8 bf16
#ifndef MB_DE_DHIDDEN
#define MB_DE_DHIDDEN MB_HIDDEN
#endif
// the forward dispatch's vectors a row (the packed fp8 rows at fp8: the
// ring slots, the input and the receive rows at this stride; the backward's
// dispatch of bf16 rows and the combine keep DE_VECS, and every buffer keeps
// its bf16 size, the larger)
#define DE_DVECS (MB_DE_DHIDDEN / 8)
#define DE_THREADS (MB_WARPS * 32)
#define DE_GROUP (MB_WARPS / DE_N) // warps serving one peer in a sending or receiving block
#define DE_PER ((MB_TOKENS + DE_C - 1) / DE_C) // tokens per channel
#define DE_NOTIFY_THREADS 128

// descriptor slots (deepep.slot*)
#define DE_X 0
#define DE_IDX 1
#define DE_PROBS 2
#define DE_Y 3
#define DE_SHARED 4
#define DE_EXPERT_Y 5
#define DE_FIXED 6
#define DE_QUEUES 7
#define DE_RECV_X 8
#define DE_RECV_SRC 9
#define DE_RECV_IDX 10
#define DE_RECV_W 11
#define DE_PERM_ROW 12
#define DE_DY 13        // the backward's: output gradients [T][H] bf16
#define DE_EXPERT_DX 14 // the expert rows' input gradients [rows][H] bf16
#define DE_EXPERT_DP 15 // and probability gradients [rows] fp32
#define DE_DX 16        // the input gradients [T][H] bf16
#define DE_DPROBS 17    // and probability gradients [T][K] fp32
#define DE_SLOTS 18

// phases and waits (deepep.names)
#define DE_PH_NOTIFY 1
#define DE_PH_DISPATCH 2
#define DE_PH_COMBINE 3
#define DE_PH_COMBINE_BWD 4  // the dispatch kernel in the backward
#define DE_PH_DISPATCH_BWD 5 // the combine kernel in the backward
#define DE_W_ROOM 1    // free slots in a ring (its head)
#define DE_W_DATA 2    // tokens in a ring (its tail)
#define DE_W_OFFSETS 3 // a queue's channel offsets
#define DE_W_START 4   // the combine's start (its rank's barrier)
#define DE_W_TOKEN 5   // the token a combine row belongs to (a check)
#define DE_W_FLAG 16   // + the rank: a barrier's flag

#if MB_WARPS % MB_RANKS != 0 || MB_WARPS < 2 || MB_HIDDEN % 8 != 0 || MB_TOPK > 32 || MB_RANKS > 8
#error "deepep.cu: MB_WARPS must be a multiple of MB_RANKS and at least 2, MB_HIDDEN of 8; MB_TOPK ≤ 32, MB_RANKS ≤ 8"
#endif
#if MB_DE_DHIDDEN % 8 != 0 || MB_DE_DHIDDEN > MB_HIDDEN || MB_DE_DHIDDEN < 8
#error "deepep.cu: MB_DE_DHIDDEN must be a multiple of 8 in 8..MB_HIDDEN"
#endif

typedef unsigned long long u64;

template <class T> __device__ __forceinline__ T *de_at(u64 base, long off) { return (T *)((unsigned char *)base + off); }
__device__ __forceinline__ u64 de_slot(const u64 *desc, int rank, int slot) { return desc[rank * DE_SLOTS + slot]; }

// a queue buffer's metadata: dispatch [start, end, head, tail][C][N],
// combine [head, tail][C][N]; queue (c, p) holds what rank p sends through
// channel c
__device__ __forceinline__ int *de_dmeta(u64 q, int which, int c, int p) { return de_at<int>(q, MB_Q_DMETA) + (which * DE_C + c) * DE_N + p; }
__device__ __forceinline__ int *de_cmeta(u64 q, int which, int c, int p) { return de_at<int>(q, MB_Q_CMETA) + (which * DE_C + c) * DE_N + p; }
// de_ctaid: the block's index, read where it is used (volatile: the
// compiler neither hoists it nor what is computed from it out of a loop,
// where they would hold registers). de_cmeta_of: de_cmeta of the queue of
// this block's channel and rank in home rank peer's buffer, so computed.
__device__ __forceinline__ int de_ctaid() {
#ifdef MB_HOST
    return blockIdx.x;
#else
    int b;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(b));
    return b;
#endif
}
__device__ __forceinline__ int *de_cmeta_of(const u64 *desc, int first, int peer, int which) {
    const int b = de_ctaid();
    return de_cmeta(de_slot(desc, peer, DE_QUEUES), which, b % (2 * DE_C) / 2, first + b / (2 * DE_C));
}
// the rings: dispatch rows [C][N][DRING][H], then sources [C][N][DRING],
// top-k indices and weights [C][N][DRING][K]; combine rows [C][N][CRING][H],
// then sources [C][N][CRING] and, in the backward, probability gradients
// [C][N][CRING][K] (both over the same bytes: a rank's combine starts after
// a barrier that every rank's dispatch has passed)
#define DE_DROWS ((long)DE_C * DE_N * MB_DRING * MB_HIDDEN * 2)
#define DE_DSRC ((long)DE_C * DE_N * MB_DRING * 4)
#define DE_DTOPK ((long)DE_C * DE_N * MB_DRING * DE_K * 4)
#define DE_CROWS ((long)DE_C * DE_N * MB_CRING * MB_HIDDEN * 2)
#define DE_CSRC ((long)DE_C * DE_N * MB_CRING * 4)
static_assert(DE_CROWS / 16 < (1L << 31), "deepep.cu: the combine rings' vectors must have int indices");
__device__ __forceinline__ long de_dslot(int c, int p, int slot) { return ((long)c * DE_N + p) * MB_DRING + slot; }
__device__ __forceinline__ long de_cslot(int c, int p, int slot) { return ((long)c * DE_N + p) * MB_CRING + slot; }

// the token range of channel c
__device__ __forceinline__ void de_channel(int c, int &lo, int &hi) {
    lo = min(c * DE_PER, MB_TOKENS);
    hi = min(lo + DE_PER, MB_TOKENS);
}

// Row accesses. de_ld_nc: 16 bytes of the kernel's input (X, DY, the
// experts' outputs: unchanged while it runs) through the non-coherent path,
// not allocated in L1 (DeepEP's ld_nc_global); the 256-byte L2 prefetch
// hint where the architecture has it (sm_80 and newer). de_st_na: 16 bytes
// stored without allocating in L1 (a ring's slot, a received row: no reader
// on this SM). On the host simulation both are plain accesses.
__device__ __forceinline__ uint4 de_ld_nc(const uint4 *p) {
#ifdef MB_HOST
    return *p;
#else
    uint4 v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#endif
    return v;
#endif
}
__device__ __forceinline__ void de_st_na(uint4 *p, uint4 v) {
#ifdef MB_HOST
    *p = v;
#else
    asm volatile("st.global.L1::no_allocate.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
#endif
}

// de_st_ring: de_st_na into a ring slot, which on the bulk path the
// receiver reads with bulk copies (the async proxy): the host simulation
// records the store (mb_stg16) until the storing thread's proxy fence.
__device__ __forceinline__ void de_st_ring(uint4 *p, uint4 v) {
#if defined(MB_HOST) && defined(MB_BULK)
    mb_stg16(p, v);
#else
    de_st_na(p, v);
#endif
}

// de_ld_acquire_cta / de_st_release_cta: an int of the block's shared
// memory that another warp reads or writes, with acquire / release at
// block scope, through a 32-bit shared address (a generic one would hold
// two registers); a waiting loop may spin on de_ld_acquire_cta (on the
// host simulation it lets the other threads run, as moebench.cuh's
// primitives).
__device__ __forceinline__ int de_ld_acquire_cta(const int *p) {
#ifdef MB_HOST
    MB_LD(int, p, acquire);
#else
    int v;
    asm volatile("ld.acquire.cta.shared.s32 %0, [%1];" : "=r"(v) : "r"(mb_smem(p)) : "memory");
    return v;
#endif
}
__device__ __forceinline__ void de_st_release_cta(int *p, int v) {
#ifdef MB_HOST
    MB_ST(int, p, v, release);
#else
    asm volatile("st.release.cta.shared.s32 [%0], %1;" ::"r"(mb_smem(p)), "r"(v) : "memory");
#endif
}

// de_copy_row: a warp copies a row of VECS 16-byte vectors (MB_HIDDEN
// bf16, or the fp8 dispatch's DE_DVECS), DE_UNROLL 16-byte
// loads per lane in flight before their stores (DeepEP's unrolled warp
// copy), then the row's rest the same way with the lanes past its end
// idle. RING: the source is a ring (written by another GPU or block: read
// through L2, mb_ld_cg), else the kernel's input (de_ld_nc); the stores
// are de_st_na.
#ifndef DE_UNROLL
#define DE_UNROLL 8
#endif
template <bool RING, int VECS = DE_VECS> __device__ __forceinline__ void de_copy_row(uint4 *dst, const uint4 *src, int lane) {
    constexpr int stride = 32 * DE_UNROLL, whole = VECS / stride * stride;
    uint4 v[DE_UNROLL];
#pragma unroll 1
    for (int i = lane; i < whole; i += stride) {
#pragma unroll
        for (int u = 0; u < DE_UNROLL; u++) v[u] = RING ? mb_ld_cg(src + i + 32 * u) : de_ld_nc(src + i + 32 * u);
#pragma unroll
        for (int u = 0; u < DE_UNROLL; u++) RING ? de_st_na(dst + i + 32 * u, v[u]) : de_st_ring(dst + i + 32 * u, v[u]);
    }
    if (whole == VECS) return;
    const int i = whole + lane;
#pragma unroll
    for (int u = 0; u < DE_UNROLL; u++)
        if (whole + 32 * u < VECS && i + 32 * u < VECS) v[u] = RING ? mb_ld_cg(src + i + 32 * u) : de_ld_nc(src + i + 32 * u);
#pragma unroll
    for (int u = 0; u < DE_UNROLL; u++)
        if (whole + 32 * u < VECS && i + 32 * u < VECS) RING ? de_st_na(dst + i + 32 * u, v[u]) : de_st_ring(dst + i + 32 * u, v[u]);
}

// The receiver's rows through bulk copies (MB_BULK: sm_90 compiled by
// NVRTC ≥ 12, and the host simulation; otherwise de_copy_row<true>).
// PTX's cp.async.bulk has no global→global form (its forms are
// global→shared::cluster, shared::cta→global and shared::cta→
// shared::cluster), so lane 0 of a receiving warp stages a row in pieces
// through its DE_STAGE bytes of the dynamic shared memory: two halves, each
// with an mbarrier; piece k+1 comes in (global→shared, complete_tx on its
// half's barrier) while piece k goes out (shared→global, a bulk group),
// and a half is refilled only once its previous bulk store has read it
// (cp.async.bulk.wait_group.read). A piece's copy is issued before its
// barrier's arrive.expect_tx (PTX lets complete_tx precede expect_tx in
// a phase: the phase cannot complete before the arrival, and the
// transaction count may go below zero meanwhile). The rings are written by generic
// stores (the senders' de_st_ring) and read here by the async proxy: each
// sending thread issues fence.proxy.async after its stores and before
// the barrier that precedes the tail's release (PTX's memory model: a
// generic-proxy write is ordered before an async-proxy read only through
// a proxy fence), and lane 0 fences again after acquiring the tail and
// after its reads of the ring, before the head frees the slots for the
// senders' next generic stores. The launch's dynamic shared memory is
// MB_WARPS · (16 + DE_STAGE) bytes (deepep.dispatchShared): the warps'
// barrier pairs, then their stages.
#ifndef DE_STAGE
#define DE_STAGE 4096
#endif
#define DE_PIECE (DE_STAGE / 2)
static_assert(DE_PIECE % 16 == 0, "deepep.cu: DE_STAGE must be a multiple of 32");
#ifdef MB_BULK
#define DE_BULK 1
// de_stage: a warp's staging state (lane 0's): its barriers and halves,
// and the pieces it has moved (piece k in half k % 2, barrier phase k / 2)
struct de_stage {
    mb_mbar *bar;
    unsigned char *buf;
    unsigned k;
};
__device__ __forceinline__ de_stage de_stage_at(int warp) {
    unsigned char *smem = mb_dynamic_smem();
    de_stage st;
    st.bar = (mb_mbar *)(smem + 16 * warp);
    st.buf = smem + 16 * MB_WARPS + (long)DE_STAGE * warp;
    st.k = 0;
    return st;
}
// de_bulk_row: lane 0 moves bytes from the ring slot src into the
// receive row dst; false when a barrier wait gave up (mb_wait's timeout)
__device__ __forceinline__ bool de_bulk_row(de_stage &st, const mb_comm &c, int rank, int ph, unsigned char *dst,
                                            const unsigned char *src, int bytes) {
    const int pieces = (bytes + DE_PIECE - 1) / DE_PIECE;
    // piece 0 in: its half's last bulk store (two pieces ago; the last
    // one, in the other half, may go on reading) has read it
    mb_bulk_wait_read_n<1>();
    unsigned k = st.k;
    mb_bulk_g2s(st.buf + (k % 2) * DE_PIECE, src, min(DE_PIECE, bytes), st.bar + k % 2);
    mb_mbar_arrive_expect_tx(st.bar + k % 2, min(DE_PIECE, bytes));
    for (int p = 0; p < pieces; p++, k++) {
        const int off = p * DE_PIECE;
        if (p + 1 < pieces) { // the next piece into the other half, once its last store read it
            const int o = off + DE_PIECE, m = min(DE_PIECE, bytes - o);
            mb_bulk_wait_read();
            mb_bulk_g2s(st.buf + ((k + 1) % 2) * DE_PIECE, src + o, m, st.bar + (k + 1) % 2);
            mb_mbar_arrive_expect_tx(st.bar + (k + 1) % 2, m);
        }
        if (!mb_mbar_wait(c, rank, ph, DE_W_DATA, st.bar + k % 2, (k / 2) & 1)) {
            st.k = k;
            return false;
        }
        mb_bulk_s2g(dst + off, st.buf + (k % 2) * DE_PIECE, min(DE_PIECE, bytes - off));
        mb_bulk_commit();
    }
    st.k = k;
    return true;
}
#endif

// de_sum_row: a warp writes the bf16 row of the fp32 sums of count expert
// rows of y (rows order[0..count), in that order: each element's additions
// from 0.f, one row after the other, whatever V and E), V vectors a lane
// at a time, the loads of E rows' V vectors (E·V a lane) in flight before
// their additions. V · E = 4 keeps the fp32 sums (V · 8) and the loads in
// the 64 registers of the combine's launch bounds (COUNT: count known, one
// round of E rows, and the V sums need not stay live). A lane past the row's
// end loads its last vector again (summed, never stored): every load
// unconditional, which keeps the arrays in registers.
template <int V, int E, int COUNT = 0> __device__ __forceinline__ void de_sum_row(uint4 *dst, const uint4 *y, const int *order, int count, int lane) {
    if (COUNT) count = COUNT; // known: no loop over the rows to keep the sums live through
#pragma unroll 1
    for (int v = lane; v < DE_VECS; v += 32 * V) {
        float acc[V][8];
#pragma unroll
        for (int w = 0; w < V; w++)
#pragma unroll
            for (int u = 0; u < 8; u++) acc[w][u] = 0.f;
#pragma unroll 1
        for (int o = 0; o < count; o += E) {
            uint4 in[E][V];
#pragma unroll
            for (int e = 0; e < E; e++) {
                if (o + e >= count) continue;
                const uint4 *src = y + (long)order[o + e] * DE_VECS + v;
#pragma unroll
                for (int w = 0; w < V; w++) in[e][w] = de_ld_nc(src + min(32 * w, DE_VECS - 1 - v));
            }
#pragma unroll
            for (int e = 0; e < E; e++) {
                if (o + e >= count) continue;
#pragma unroll
                for (int w = 0; w < V; w++) {
                    float f[8];
                    unpack8(in[e][w], f);
#pragma unroll
                    for (int u = 0; u < 8; u++) acc[w][u] += f[u];
                }
            }
        }
#pragma unroll
        for (int w = 0; w < V; w++) {
            if (v + 32 * w >= DE_VECS) continue;
            bf16 out[8];
#pragma unroll
            for (int u = 0; u < 8; u++) out[u] = f2bf(acc[w][u]);
            de_st_na(dst + v + 32 * w, pack8(out));
        }
    }
}

// ---- layout: one thread per token (block 256). counts (per rank, then per
// expert) are zero before the launch.
extern "C" __global__ void __launch_bounds__(256) deepep_layout(const int32 *idx, unsigned char *fixed) {
    __shared__ int perRank[DE_N], perExpert[DE_N * MB_LOCAL];
    for (int i = threadIdx.x; i < DE_N * MB_LOCAL; i += blockDim.x) perExpert[i] = 0;
    if (threadIdx.x < DE_N) perRank[threadIdx.x] = 0;
    __syncthreads();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < MB_TOKENS) {
        unsigned mask = 0;
        for (int j = 0; j < DE_K; j++) {
            const int e = idx[t * DE_K + j];
            if ((unsigned)e >= DE_N * MB_LOCAL) continue; // the router's output is in range; never write outside
            atomicAdd(&perExpert[e], 1);
            mask |= 1u << (e / MB_LOCAL);
        }
        for (int d = 0; d < DE_N; d++) {
            fixed[t * DE_N + d] = (mask >> d) & 1;
            if ((mask >> d) & 1) atomicAdd(&perRank[d], 1);
        }
    }
    __syncthreads();
    int *gRank = (int *)(fixed + MB_F_PER_RANK), *gExpert = (int *)(fixed + MB_F_PER_EXPERT);
    if (threadIdx.x < DE_N && perRank[threadIdx.x]) atomicAdd(gRank + threadIdx.x, perRank[threadIdx.x]);
    for (int i = threadIdx.x; i < DE_N * MB_LOCAL; i += blockDim.x)
        if (perExpert[i]) atomicAdd(gExpert + i, perExpert[i]);
}

// ---- notify: one block of 128 threads per rank. The tokens to each rank d
// in channels ≤ c (chanEnd[d][c]); barrier; the rank's counts into every
// peer's buffer (cnt[rank], ecnt[rank][·]); barrier; the prefix of the
// counts it received (srcEnd), the received tokens and copies per local
// expert into the host-mapped counters (rank·(1+L): tokens, then one per
// local expert); its queues' metadata cleared; barrier. cached (the
// backward's, DeepEP's cached notify before a dispatch with the forward's
// handle): the counts, prefixes and counters are the forward's and stay;
// only the barriers and the metadata cleared.
extern "C" __global__ void __launch_bounds__(DE_NOTIFY_THREADS) deepep_notify(mb_comm c, int first, int epoch, int cached, const u64 *desc) {
    __shared__ int *flags[DE_N];
    __shared__ int ok;
    const int rank = first + blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u64 fixed = de_slot(desc, rank, DE_FIXED), q = de_slot(desc, rank, DE_QUEUES);
    const unsigned char *inRank = de_at<unsigned char>(fixed, 0);
    int *chanEnd = de_at<int>(fixed, MB_F_CHAN_END);
    for (int dc = warp; dc < DE_N * DE_C && !cached; dc += DE_NOTIFY_THREADS / 32) {
        const int d = dc / DE_C;
        int lo, hi, n = 0;
        de_channel(dc % DE_C, lo, hi);
        for (int t = lo + lane; t < hi; t += 32) n += inRank[t * DE_N + d];
        n = __reduce_add_sync(MB_FULL_MASK, n);
        if (lane == 0) chanEnd[dc] = n;
    }
    if (threadIdx.x < DE_N) flags[threadIdx.x] = de_at<int>(de_slot(desc, threadIdx.x, DE_QUEUES), MB_Q_FLAGS);
    __syncthreads();
    if (threadIdx.x < DE_N && !cached)
        for (int ch = 1; ch < DE_C; ch++) chanEnd[threadIdx.x * DE_C + ch] += chanEnd[threadIdx.x * DE_C + ch - 1];
    // 1: no rank writes counts before every rank is done with the last step
    if (threadIdx.x == 0) ok = MB_DE_BUG == 2 && rank == DE_N - 1 ? 0 : mb_barrier(c, rank, DE_N, DE_PH_NOTIFY, DE_W_FLAG, flags, epoch);
    __syncthreads();
    if (ok && !cached) {
        const int *perRank = de_at<int>(fixed, MB_F_PER_RANK), *perExpert = de_at<int>(fixed, MB_F_PER_EXPERT);
        for (int i = threadIdx.x; i < DE_N * (1 + MB_LOCAL); i += blockDim.x) {
            const int p = i / (1 + MB_LOCAL), l = i % (1 + MB_LOCAL);
            const u64 pq = de_slot(desc, p, DE_QUEUES);
            if (l == 0) de_at<int>(pq, 0)[rank] = perRank[p];
            else de_at<int>(pq, MB_Q_ECNT)[rank * MB_LOCAL + l - 1] = perExpert[p * MB_LOCAL + l - 1];
        }
        mb_fence_sys(); // the block's writes to peers, then the barrier's flags
    }
    __syncthreads();
    // 2: every rank's counts are in
    if (threadIdx.x == 0 && ok) ok = mb_barrier(c, rank, DE_N, DE_PH_NOTIFY, DE_W_FLAG, flags, epoch + 1);
    __syncthreads();
    if (ok) {
        const int *cnt = de_at<int>(q, 0), *ecnt = de_at<int>(q, MB_Q_ECNT);
        int *counters = mb_counter(c.sig, DE_N, rank * (1 + MB_LOCAL));
        if (MB_DE_BUG == 3 && rank == DE_N - 1) counters = mb_counter(c.sig, DE_N, 0); // the last rank's never written
        if (threadIdx.x == 0 && !cached) {
            int *srcEnd = de_at<int>(fixed, MB_F_SRC_END), total = 0;
            for (int s = 0; s < DE_N; s++) srcEnd[s] = total += mb_ld_volatile(cnt + s); // peers wrote them
            mb_st_release_sys(counters, total);
        }
        for (int l = threadIdx.x; l < MB_LOCAL && !cached; l += blockDim.x) {
            int n = 0;
            for (int s = 0; s < DE_N; s++) n += mb_ld_volatile(ecnt + s * MB_LOCAL + l);
            mb_st_release_sys(counters + 1 + l, n);
        }
        for (int i = threadIdx.x; i < 4 * DE_C * DE_N; i += blockDim.x) de_at<int>(q, MB_Q_DMETA)[i] = 0;
        for (int i = threadIdx.x; i < 2 * DE_C * DE_N; i += blockDim.x) de_at<int>(q, MB_Q_CMETA)[i] = 0;
        mb_fence_sys();
    }
    __syncthreads();
    // 3: no rank sends before every rank's queues are clear
    if (threadIdx.x == 0 && ok) mb_barrier(c, rank, DE_N, DE_PH_NOTIFY, DE_W_FLAG, flags, epoch + 2);
}

// ---- dispatch: in a sending block of channel ch, group g of DE_GROUP warps
// serves destination g: it walks the channel's tokens and, per round, once
// the ring has room for a chunk, pushes up to MB_DCHUNK of the tokens for g
// (warp w of the group copies the tokens whose stream position is w mod
// DE_GROUP) and publishes the tail. In a receiving block group g drains the
// queue from source g into the receive buffer at the source's offset plus
// the channel's. bwd (the combine's backward, with the forward's handle):
// the rows are the output gradients DY, into the receive rows; no top-k
// travels (the receive buffer keeps the forward's).
extern "C" __global__ void __launch_bounds__(DE_THREADS, MB_MINB) deepep_dispatch(mb_comm c, int first, int bwd, const u64 *desc) {
    __shared__ int ok[DE_N], okOff[DE_N], a[DE_N], b[DE_N], tl[DE_N], row0[DE_N];
    const int local = blockIdx.x / (2 * DE_C), rank = first + local, bb = blockIdx.x % (2 * DE_C), ch = bb / 2;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, peer = warp / DE_GROUP, gw = warp % DE_GROUP;
    const bool lead = threadIdx.x % (DE_GROUP * 32) == 0;
    const int ph = bwd ? DE_PH_COMBINE_BWD : DE_PH_DISPATCH;
    const u64 fixed = de_slot(desc, rank, DE_FIXED);
    if (bb % 2 == 0) { // send to peer
        const u64 q = de_slot(desc, peer, DE_QUEUES);
        const unsigned char *inRank = de_at<unsigned char>(fixed, 0);
        const int *chanEnd = de_at<int>(fixed, MB_F_CHAN_END) + peer * DE_C;
        int *sendHead = de_at<int>(fixed, MB_F_SEND_HEAD);
        int *head = de_dmeta(q, 2, ch, rank), *tail = de_dmeta(q, 3, ch, rank);
        if (lead) { // the channel's offsets among this rank's tokens to peer, as −v−1 (0 means not yet written)
            mb_st_relaxed_sys(de_dmeta(q, 0, ch, rank), -(ch > 0 ? chanEnd[ch - 1] : 0) - 1);
            mb_st_relaxed_sys(de_dmeta(q, 1, ch, rank), -chanEnd[ch] - 1);
        }
        int lo, hi, pos = 0; // pos: the ring's stream position (the tail)
        de_channel(ch, lo, hi);
        for (int t = lo; t < hi;) {
            if (lead)
                ok[peer] = mb_wait(c, rank, ph, DE_W_ROOM, pos + MB_DCHUNK - MB_DRING, [head] { return (long long)mb_ld_acquire_sys(head); },
                                   [pos](long long h) { return MB_DRING - (pos - h) >= MB_DCHUNK; });
            mb_bar_sync(1 + peer, DE_GROUP * 32);
            if (!ok[peer]) break;
            for (int pushed = 0; t < hi && pushed < MB_DCHUNK; t++) {
                const bool in = inRank[t * DE_N + peer];
                if (lead) sendHead[t * DE_N + peer] = in ? pos : -1;
                if (!in) continue;
                if (pos % DE_GROUP == gw) {
                    // the slot's source and top-k, then its row; their
                    // pointers are read from the descriptors here (loads
                    // that hit L1), so that no more than the row's two
                    // addresses stay live through the unrolled copy
                    const u64 pq = de_slot(desc, peer, DE_QUEUES);
                    const long s = de_dslot(ch, rank, pos % MB_DRING);
                    if (lane == 0) de_at<int>(pq, MB_Q_RINGS + DE_DROWS)[s] = t;
                    if (lane < DE_K && !bwd) {
                        const int e = ((const int32 *)de_slot(desc, rank, DE_IDX))[t * DE_K + lane];
                        const bool mine = (unsigned)e < DE_N * MB_LOCAL && e / MB_LOCAL == peer;
                        de_at<int>(pq, MB_Q_RINGS + DE_DROWS + DE_DSRC)[s * DE_K + lane] = mine ? e - peer * MB_LOCAL : -1;
                        de_at<float>(pq, MB_Q_RINGS + DE_DROWS + DE_DSRC + DE_DTOPK)[s * DE_K + lane] =
                            mine ? ((const float *)de_slot(desc, rank, DE_PROBS))[t * DE_K + lane] : 0.f;
                    }
#if DE_DVECS != DE_VECS
                    if (!bwd) // the forward's packed fp8 rows (DeepEP's x and x_scales in one slot)
                        de_copy_row<false, MB_DE_BUG == 5 ? MB_HIDDEN / 16 : DE_DVECS>(de_at<uint4>(pq, MB_Q_RINGS) + s * DE_DVECS,
                                                     (const uint4 *)de_slot(desc, rank, DE_X) + (long)t * DE_DVECS, lane);
                    else
#endif
                    de_copy_row<false>(de_at<uint4>(pq, MB_Q_RINGS) + s * DE_VECS,
                                       (const uint4 *)de_slot(desc, rank, bwd ? DE_DY : DE_X) + (long)t * DE_VECS, lane);
                }
                pos++, pushed++;
            }
            // the round's generic stores into the ring ordered before the
            // receiver's bulk copies read them (no-op on the 16-byte path)
            if (MB_DE_BUG != 7) mb_fence_proxy_async();
            mb_bar_sync(1 + peer, DE_GROUP * 32); // the group's copies, then the tail (release: cumulative)
            if (lead && MB_DE_BUG != 1) mb_st_release_sys(tail, pos);
        }
        return;
    }
    // receive from peer
#ifdef DE_BULK
    de_stage st = de_stage_at(warp);
    if (lane == 0) {
        mb_mbar_init(st.bar, 1), mb_mbar_init(st.bar + 1, 1);
        mb_mbar_init_fence();
    }
    bool bulkOk = true;
#endif
    const u64 q = de_slot(desc, rank, DE_QUEUES);
    int *head = de_dmeta(q, 2, ch, peer), *tail = de_dmeta(q, 3, ch, peer);
    if (lead) {
        int *start = de_dmeta(q, 0, ch, peer), *end = de_dmeta(q, 1, ch, peer);
        auto written = [](long long v) { return v < 0; };
        okOff[peer] = mb_wait(c, rank, ph, DE_W_OFFSETS, -1, [start] { return (long long)mb_ld_acquire_sys(start); }, written) &&
                   mb_wait(c, rank, ph, DE_W_OFFSETS, -1, [end] { return (long long)mb_ld_acquire_sys(end); }, written);
        a[peer] = -mb_ld_volatile(start) - 1, b[peer] = -mb_ld_volatile(end) - 1;
        int *recvChan = de_at<int>(fixed, MB_F_RECV_CHAN) + (peer * DE_C + ch) * 2;
        recvChan[0] = a[peer], recvChan[1] = b[peer];
        row0[peer] = (peer > 0 ? de_at<int>(fixed, MB_F_SRC_END)[peer - 1] : 0) + a[peer]; // the first row
    }
    mb_bar_sync(1 + peer, DE_GROUP * 32);
    if (!okOff[peer]) return;
    // the queue's tokens read from shared memory each round (no register
    // held through the copies for them)
    for (int got = 0; got < ((volatile int *)b)[peer] - ((volatile int *)a)[peer];) {
        if (lead) {
            ok[peer] = mb_wait_ge(c, rank, ph, DE_W_DATA, tail, got + 1);
            tl[peer] = mb_ld_acquire_sys(tail);
        }
        mb_bar_sync(1 + peer, DE_GROUP * 32);
        if (!ok[peer]) break;
        const int until = tl[peer];
#ifdef DE_BULK
        if (lane == 0) mb_fence_proxy_async(); // the acquired ring rows, then the async proxy's reads
#endif
        for (int i = got + gw; i < until; i += DE_GROUP) {
            // the slot's source and top-k, then its row (the pointers
            // read from the descriptors here, as the sender's)
            const long s = de_dslot(ch, peer, i % MB_DRING), r = (long)((volatile int *)row0)[peer] + i; // (read where used: no register held through the copies)
            if (lane == 0) ((int *)de_slot(desc, rank, DE_RECV_SRC))[r] = mb_ld_volatile(de_at<int>(q, MB_Q_RINGS + DE_DROWS) + s);
            if (lane < DE_K && !bwd) {
                const long k = s * DE_K + lane;
                ((int *)de_slot(desc, rank, DE_RECV_IDX))[r * DE_K + lane] = mb_ld_volatile(de_at<int>(q, MB_Q_RINGS + DE_DROWS + DE_DSRC) + k);
                ((float *)de_slot(desc, rank, DE_RECV_W))[r * DE_K + lane] =
                    __int_as_float(mb_ld_volatile(de_at<int>(q, MB_Q_RINGS + DE_DROWS + DE_DSRC + DE_DTOPK) + k));
            }
#ifdef DE_BULK
            if (lane == 0 && bulkOk) {
                const int vecs = bwd ? DE_VECS : DE_DVECS, pitch = bwd ? DE_VECS : MB_DE_BUG == 6 ? MB_HIDDEN / 16 : DE_DVECS;
                bulkOk = de_bulk_row(st, c, rank, ph, (unsigned char *)((uint4 *)de_slot(desc, rank, DE_RECV_X) + r * pitch),
                                     (const unsigned char *)(de_at<uint4>(q, MB_Q_RINGS) + s * vecs), 16u * vecs);
            }
            continue;
#endif
#if DE_DVECS != DE_VECS
            if (!bwd)
                de_copy_row<true, DE_DVECS>((uint4 *)de_slot(desc, rank, DE_RECV_X) + r * (MB_DE_BUG == 6 ? MB_HIDDEN / 16 : DE_DVECS),
                                            de_at<uint4>(q, MB_Q_RINGS) + s * DE_DVECS, lane);
            else
#endif
            de_copy_row<true>((uint4 *)de_slot(desc, rank, DE_RECV_X) + r * DE_VECS, de_at<uint4>(q, MB_Q_RINGS) + s * DE_VECS, lane);
        }
#ifdef DE_BULK
        if (lane == 0) mb_fence_proxy_async(); // the async proxy's reads of the slots, then the head frees them
        __syncwarp(); // lane 0 alone copied: the warp reconverges before the aligned barrier
#endif
        mb_bar_sync(1 + peer, DE_GROUP * 32); // the group's reads, then the head
        got = until;
        if (lead) mb_st_release_sys(head, got);
    }
#ifdef DE_BULK
    if (lane == 0) mb_bulk_wait(); // the receive rows written (the kernel's end publishes them)
#endif
}

// ---- permute: one block (512 threads) per local expert l. The copies of l
// (received slots i·K + j with recvIdx == l) in slot order after every copy
// of a lower local expert: order[row] = slot, permRow[slot] = row; block 0
// also sets permRow = −1 for the slots of experts on other ranks. Each warp
// counts a contiguous segment; a prefix over the warps places the segments.
extern "C" __global__ void __launch_bounds__(512) deepep_permute(const int32 *recvIdx, int slots, int32 *order, int32 *permRow) {
    __shared__ int below[16], mine[16];
    const int l = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int seg = (slots + warps * 32 - 1) / (warps * 32) * 32, lo = min(slots, warp * seg), hi = min(slots, lo + seg);
    int nb = 0, nm = 0;
    for (int i = lo + lane; i < hi; i += 32) {
        const int e = recvIdx[i];
        nb += e >= 0 && e < l;
        nm += e == l;
        if (l == 0 && e < 0) permRow[i] = -1;
    }
    nb = __reduce_add_sync(MB_FULL_MASK, nb);
    nm = __reduce_add_sync(MB_FULL_MASK, nm);
    if (lane == 0) below[warp] = nb, mine[warp] = nm;
    __syncthreads();
    int row = 0;
    for (int w = 0; w < warps; w++) row += below[w] + (w < warp ? mine[w] : 0);
    for (int i0 = lo; i0 < hi; i0 += 32) {
        const int i = i0 + lane;
        const bool hit = i < hi && recvIdx[i] == l;
        const unsigned set = __ballot_sync(MB_FULL_MASK, hit);
        if (hit) {
            const int r = row + __popc(set & ((1u << lane) - 1u));
            order[r] = i;
            permRow[i] = r;
        }
        row += __popc(set);
    }
}

// ---- combine: sending block of channel ch on expert rank `rank`, group g:
// the tokens it received from home rank g through ch, in received order,
// each as bf16(Σ its local experts' outputs in ascending expert order, fp32)
// into queue (ch, rank) of g, a chunk per round once the ring has room for
// it. Receiving block of channel ch on home rank `rank` (DeepEP's
// structure): lanes d < N of warp 0 mirror the tails of queues (ch, d) into
// shared memory and move their heads; the other warps (the reducers) take
// the channel's tokens in turn, each at its own pace: for token t each lane
// d < N waits for the mirrored tail to pass the row at sendHead[t][d] (when
// ≥ 0) of queue (ch, d); the warp loads every rank's vector of the row
// before it adds them in rank order in fp32, and stores bf16 (then bf16
// plus the shared expert's output) in Y; it then posts the next token it
// takes. Warp 0 moves queue d's head past the rows of every token before
// the lowest posted one. Senders start after rank 0's first block has passed a barrier
// that every rank reaches once its dispatch is done (the rings are the
// dispatch's bytes). BWD (deepep_combine_bwd, the dispatch's backward): the rows are the
// copies' input gradients ExpertDX, and each row also carries its token's K
// probability gradients (ExpertDP of its copy on the sender, 0 at slots not
// on it), which the home rank adds in rank order into DProbs; the rows'
// sum goes to DX, with no shared expert.
// The sending and receiving blocks' parts are functions of their own that
// each work out their block's place from its index: nothing computed
// before the branch between them is live in both, so that the registers
// one part needs at its peak never push the other's values to the stack.
template <bool BWD> __device__ __forceinline__ void de_combine_send(mb_comm c, int first, int epoch, const u64 *desc) {
    __shared__ int *flags[DE_N];
    __shared__ int ok[DE_N], go;
    __shared__ int order[MB_WARPS][32]; // a token's expert rows, ascending expert
    const int local = blockIdx.x / (2 * DE_C), rank = first + local, bb = blockIdx.x % (2 * DE_C), ch = bb / 2;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, peer = warp / DE_GROUP, gw = warp % DE_GROUP;
    const bool lead = threadIdx.x % (DE_GROUP * 32) == 0;
    constexpr int ph = BWD ? DE_PH_DISPATCH_BWD : DE_PH_COMBINE;
    const u64 fixed = de_slot(desc, rank, DE_FIXED);
    int *goFlag = de_at<int>(de_slot(desc, rank, DE_QUEUES), MB_Q_GO);
    if (threadIdx.x < DE_N) flags[threadIdx.x] = de_at<int>(de_slot(desc, threadIdx.x, DE_QUEUES), MB_Q_FLAGS);
    __syncthreads();
    if (threadIdx.x == 0) {
        if (bb == 0 && mb_barrier(c, rank, DE_N, ph, DE_W_FLAG, flags, epoch)) mb_st_release_sys(goFlag, epoch);
        go = mb_wait_ge(c, rank, ph, DE_W_START, goFlag, epoch);
    }
    __syncthreads();
    if (!go) return;
    // the queue's and the rank's arrays are read from the descriptors
    // where they are used (loads that hit L1, which the compiler cannot
    // hoist out of the loops): only the chunk's place stays live through
    // a row's sum
    const int *recvChan = de_at<int>(fixed, MB_F_RECV_CHAN) + (peer * DE_C + ch) * 2;
    const int base = peer > 0 ? de_at<int>(fixed, MB_F_SRC_END)[peer - 1] : 0, end = base + recvChan[1];
    int pos = 0;
    for (int i0 = base + recvChan[0]; i0 < end;) {
        const int n = min(MB_CCHUNK, end - i0);
        if (lead) {
            const int *head = de_cmeta_of(desc, first, peer, 0);
            ok[peer] = mb_wait(c, rank, ph, DE_W_ROOM, pos + n - MB_CRING, [head] { return (long long)mb_ld_acquire_sys(head); },
                               [pos, n](long long h) { return MB_CRING - (pos - h) >= n; });
        }
        mb_bar_sync(1 + peer, DE_GROUP * 32);
        if (!ok[peer]) break;
        for (int k = gw; k < n; k += DE_GROUP) {
            const int i = i0 + k;
            const u64 q = de_slot(desc, peer, DE_QUEUES);
            // this token's local experts in ascending order: lane j's place among them
            const int e = lane < DE_K ? ((const int *)de_slot(desc, rank, DE_RECV_IDX))[i * DE_K + lane] : -1;
            int place = 0, count = 0;
            for (int j = 0; j < DE_K; j++) {
                const int ej = __shfl_sync(MB_FULL_MASK, e, j);
                place += ej >= 0 && ej < e;
                count += ej >= 0;
            }
            const long s = de_cslot(ch, rank, (pos + k) % MB_CRING);
            // the slot's source and (BWD) probability gradients before the row:
            // nothing of them stays live through the row's loop
            float *grads = BWD ? de_at<float>(q, MB_Q_RINGS + DE_CROWS + DE_CSRC) + s * DE_K : nullptr;
            if (e >= 0) {
                const int row = ((const int *)de_slot(desc, rank, DE_PERM_ROW))[i * DE_K + lane];
                order[warp][place] = row;
                if (BWD) grads[lane] = ((const float *)de_slot(desc, rank, DE_EXPERT_DP))[row];
            } else if (BWD && lane < DE_K) {
                grads[lane] = 0.f;
            }
            if (lane == 0) de_at<int>(q, MB_Q_RINGS + DE_CROWS)[s] = ((const int *)de_slot(desc, rank, DE_RECV_SRC))[i];
            __syncwarp();
            uint4 *dst = de_at<uint4>(q, MB_Q_RINGS) + s * DE_VECS;
            const uint4 *y = (const uint4 *)de_slot(desc, rank, BWD ? DE_EXPERT_DX : DE_EXPERT_Y);
            if (count == 1) de_sum_row<4, 1, 1>(dst, y, order[warp], count, lane);
            else if (count == 2) de_sum_row<2, 2, 2>(dst, y, order[warp], count, lane);
            else de_sum_row<1, 4>(dst, y, order[warp], count, lane);
            __syncwarp(); // order[warp] is rewritten by the next token
        }
        mb_bar_sync(1 + peer, DE_GROUP * 32);
        pos += n, i0 += n;
        if (lead && !(MB_DE_BUG == 4 && BWD)) mb_st_release_sys(de_cmeta_of(desc, first, peer, 1), pos);
    }
}

template <bool BWD> __device__ __forceinline__ void de_combine_recv(mb_comm c, int first, const u64 *desc) {
    // a reducer's token, in one place per warp (one base address live in
    // its loop): its rows in the rings (unused where none), its output
    // row and the shared expert's row added to it (none: nullptr), its
    // stream position in each rank's queue (−1: none), and the next token
    // the reducer takes (it is done with the channel's before it)
    struct reducer {
        const uint4 *row[DE_N];
        uint4 *out;
        const uint4 *add;
        int pos[DE_N];
        int next;
    };
    __shared__ reducer red[MB_WARPS];
    __shared__ int tails[DE_N]; // the queues' tails, mirrored by warp 0
    __shared__ int stop;        // a reducer gave up
    const int local = blockIdx.x / (2 * DE_C), rank = first + local, ch = blockIdx.x % (2 * DE_C) / 2;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    constexpr int ph = BWD ? DE_PH_DISPATCH_BWD : DE_PH_COMBINE;
    int lo, hi;
    de_channel(ch, lo, hi);
    if (threadIdx.x < DE_N) tails[threadIdx.x] = 0;
    if (threadIdx.x < MB_WARPS) red[threadIdx.x].next = lo + threadIdx.x - 1;
    if (threadIdx.x == 0) stop = 0;
    __syncthreads(); // the only one: the reducers run free from here
    if (warp == 0) { // lane d: queue (ch, d)'s tail into tails[d]; its head past the done tokens' rows
        if (lane >= DE_N) return;
        const u64 own = de_slot(desc, rank, DE_QUEUES);
        const int *tail = de_cmeta(own, 1, ch, lane), *sendHead = de_at<int>(de_slot(desc, rank, DE_FIXED), MB_F_SEND_HEAD);
        int *head = de_cmeta(own, 0, ch, lane);
        for (int t = lo, h = 0;;) {
            de_st_release_cta(tails + lane, mb_ld_acquire_sys(tail));
            int done = hi; // the reducers are done with every token before it
            for (int w = 1; w < MB_WARPS; w++) done = min(done, de_ld_acquire_cta(&red[w].next));
            const int was = h;
            for (; t < done; t++) {
                const int p = sendHead[t * DE_N + lane];
                if (p >= 0) h = p + 1;
            }
            if (h != was) mb_st_release_sys(head, h);
            if (t >= hi || de_ld_acquire_cta(&stop)) return;
        }
    }
    // the reducers read the rank's arrays from the descriptors per token
    // (loads that hit L1): none of their addresses stays live through
    // the loop, whose row sum keeps DE_N loads a lane in flight at the
    // register bound
    reducer &me = red[warp];
    for (int t = lo + warp - 1; t < hi; t += MB_WARPS - 1) {
        int pos = -1;
        bool fine = true;
        if (lane < DE_N) {
            pos = de_at<int>(de_slot(desc, rank, DE_FIXED), MB_F_SEND_HEAD)[t * DE_N + lane];
            if (pos >= 0) {
                const int *mirror = tails + lane, *srcs = de_at<int>(de_slot(desc, rank, DE_QUEUES), MB_Q_RINGS + DE_CROWS);
                fine = mb_wait(c, rank, ph, DE_W_DATA, pos + 1, [mirror] { return (long long)de_ld_acquire_cta(mirror); },
                               [pos](long long v) { return v > pos; }) &&
                       mb_check(c, rank, ph, DE_W_TOKEN, mb_ld_volatile(srcs + de_cslot(ch, lane, pos % MB_CRING)), t);
            }
            me.pos[lane] = pos;
            if (pos >= 0) me.row[lane] = de_at<uint4>(de_slot(desc, rank, DE_QUEUES), MB_Q_RINGS) + de_cslot(ch, lane, pos % MB_CRING) * DE_VECS;
        }
        if (!__all_sync(MB_FULL_MASK, fine)) {
            if (lane == 0) de_st_release_cta(&stop, 1);
            return;
        }
        if (lane == 0) {
            me.out = (uint4 *)de_slot(desc, rank, BWD ? DE_DX : DE_Y) + (long)t * DE_VECS;
            const uint4 *add = BWD ? nullptr : (const uint4 *)de_slot(desc, rank, DE_SHARED); // none without a shared expert
            me.add = add ? add + (long)t * DE_VECS : nullptr;
        }
        __syncwarp(); // me, written by lanes < N
        const unsigned from = __ballot_sync(MB_FULL_MASK, pos >= 0); // the ranks with a row of t
        if (BWD && lane < DE_K) { // the probability gradients, in rank order from 0
            const int *grads = de_at<int>(de_slot(desc, rank, DE_QUEUES), MB_Q_RINGS + DE_CROWS + DE_CSRC);
            float acc = 0.f;
            for (int d = 0; d < DE_N; d++) {
                const int p = me.pos[d];
                if (p >= 0) acc += __int_as_float(mb_ld_volatile(grads + de_cslot(ch, d, p % MB_CRING) * DE_K + lane));
            }
            ((float *)de_slot(desc, rank, DE_DPROBS))[(long)t * DE_K + lane] = acc;
        }
        for (int v = lane; v < DE_VECS; v += 32) {
            // every rank's vector, loaded before the sum; the rows' and the
            // output's addresses read from shared memory each time (8
            // 64-bit addresses kept across the loop would not fit the
            // registers, nor would those of the rings, the output and the
            // shared expert's rows at the register bound)
            const volatile reducer &at = me;
            uint4 in[DE_N];
#pragma unroll
            for (int d = 0; d < DE_N; d++)
                if (from >> d & 1) in[d] = mb_ld_cg(at.row[d] + v);
            float acc[8], f[8];
#pragma unroll
            for (int u = 0; u < 8; u++) acc[u] = 0.f;
#pragma unroll
            for (int d = 0; d < DE_N; d++) {
                if (!(from >> d & 1)) continue;
                unpack8(in[d], f);
#pragma unroll
                for (int u = 0; u < 8; u++) acc[u] += f[u];
            }
            bf16 o[8];
#pragma unroll
            for (int u = 0; u < 8; u++) o[u] = f2bf(acc[u]);
            const uint4 *add = at.add;
            if (add) {
                unpack8(de_ld_nc(add + v), f);
#pragma unroll
                for (int u = 0; u < 8; u++) o[u] = f2bf(bf2f(o[u]) + f[u]);
            }
            de_st_na(at.out + v, pack8(o));
        }
        __syncwarp(); // the warp's reads of the rows, then its post (warp 0 then frees them)
        if (lane == 0) de_st_release_cta(&me.next, t + MB_WARPS - 1);
    }
}

template <bool BWD> __device__ __forceinline__ void de_combine(mb_comm c, int first, int epoch, const u64 *desc) {
    if (blockIdx.x % 2 == 0) de_combine_send<BWD>(c, first, epoch, desc); // even blocks send (2·DE_C a rank: even)
    else de_combine_recv<BWD>(c, first, desc);
}

// The combine and its backward form are two entry points of one body, so
// that each keeps its own registers: the backward's probability-gradient
// section compiled into the forward made it use stack under its launch
// bounds (the SASS audit forbids any).
extern "C" __global__ void __launch_bounds__(DE_THREADS, MB_MINB) deepep_combine(mb_comm c, int first, int epoch, const u64 *desc) {
    de_combine<false>(c, first, epoch, desc);
}
extern "C" __global__ void __launch_bounds__(DE_THREADS, MB_MINB) deepep_combine_bwd(mb_comm c, int first, int epoch, const u64 *desc) {
    de_combine<true>(c, first, epoch, desc);
}
