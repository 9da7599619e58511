// hybridep.cu: HybridEP's design on GPUs (dispatchers/hybridep;
// docs/dispatchers/hybridep.md states the placement and summation order
// these kernels reproduce). Every kernel is a persistent, co-resident launch per GPU
// covering its ranks (rank first + blockIdx.x / blocks, block
// blockIdx.x % blocks of the rank's budget), its cross-rank waits timed
// (mb_wait):
//   he_allgather   each rank's top-k as dense rows: its routing-map rows
//                  stored into every rank's copy of the global map (peer
//                  stores, up to 16 bytes of a row a thread), its
//                  probabilities per domain; then a device barrier
//   he_preprocess_count, he_preprocess
//                  (blocks of their own) from the global map alone,
//                  identically on every rank: sparse_to_dense,
//                  dense_to_expert, the chunk layout, the domains each
//                  token goes to and the inter-domain slots
//   he_pack        (several domains) the rows each other domain needs,
//                  for the inter-domain send (NCCL, by the host)
//   he_dispatch    barrier; a loader warp stages each forwarded token (row
//                  and its domain's probabilities) in a shared FIFO, storer
//                  warps write it into every destination rank's receive
//                  buffer at its final position (peer stores); barrier
//   he_permute     (blocks of its own) each rank places its received
//                  tokens at their experts' rows
//   he_combine     stage 1: each rank's partial sums of its received tokens
//                  (unpermute: its local experts' outputs), barrier, and
//                  with several domains the pre-reduction for the other
//                  domains' homes; stage 2: each home's sum of its domain's
//                  partials and the pre-reduced sums (after the host's
//                  inter-domain exchange), then a barrier. Sums go through
//                  two pipelines of whole-row FIFOs (a loader warp and two
//                  reducer warps each), float32 from 0 in the design's
//                  order, rounded to bf16 where the design rounds.
// The backward (kernels/BACKWARD.md) runs the same kernels in their
// backward forms, separate entry points of the same bodies (template
// BWD), over the forward's routing map and preprocessing:
//   he_pack_bwd      the output gradients each other domain needs (rows,
//                    no probabilities)
//   he_dispatch_bwd  the combine's backward: the output gradients DY as
//                    he_dispatch moves the inputs (no probabilities),
//                    placed at the forward's expert-major rows (ExpertDY)
//   he_combine_bwd   the dispatch's backward: the copies' input gradients
//                    (ExpertDX) summed as he_combine sums the outputs, with
//                    its rounding points, into DX (no shared expert); each
//                    row's probability gradients (fp32, ExpertDProbs) go
//                    to its domain's L·D places of the receive buffer's
//                    probability row, the pre-reduction adds them per
//                    domain (fp32, to the send buffer's, then the
//                    inter-domain path), and each home takes its token's
//                    k from them into DProbs (a slot's one term, from 0).
// Dispatch's FIFO stages are a multiple of WARPS − 1 (one slot, one
// consumer); each combine pipeline has MB_HE_STAGES of its own.
// Rows move with bulk copies on the bulk path (moebench.cuh, MB_BULK),
// 16-byte accesses otherwise (a FIFO loader's lane keeps MB_FIFO_UNROLL
// loads in flight: mb_fifo_put).
#include "moebench.cuh"

#define N MB_HE_EP
#define D MB_HE_DOMAIN
#define M (N / D)
#define T MB_HE_TOKENS
#define E MB_HE_EXPERTS
#define L (E / N)
#define LD (L * D)
#define LDP ((LD + 3) / 4 * 4) // probabilities per token and domain, padded to 16 bytes
#define H MB_HE_HIDDEN
#define ROW (2 * H) // bytes
// the forward dispatch's rows (pack, dispatch, permute): bf16-sized
// elements and bytes; at fp8 a packed row (Shape.DispatchHidden: its e4m3
// values and 1×128 fp32 multipliers), narrower than the combine's and the
// backward's bf16 rows (H, ROW), in the same buffers
#ifdef MB_HE_DHIDDEN
#define DH MB_HE_DHIDDEN
#else
#define DH H
#endif
#define DROW (2 * DH)
// a kernel's rows: the forward dispatch's, or the backward's bf16 ones
#define XH (BWD ? H : DH)
#define XROW (BWD ? ROW : DROW)
#define CHUNK MB_HE_CHUNK
#define CHUNKS ((T + CHUNK - 1) / CHUNK)
#define WARPS 4 // dispatch: a loader and three storers (combine: CWARPS)
#define THREADS (32 * WARPS)
#define PRE_THREADS 256

// Phases and waits (dispatchers/hybridep names them)
#define PH_ALLGATHER 1
#define PH_DISPATCH 2
#define PH_COMBINE 3
#define PH_COMBINE_BWD 4  // he_dispatch_bwd
#define PH_DISPATCH_BWD 5 // he_combine_bwd
#define W_PASSED 1 // the rank's blocks waiting for its barrier
#define W_EMPTY 2
#define W_FULL 3
#define W_FLAG 16 // + the rank waited for (mb_barrier)

// Test bugs (the bug argument: kind | rank << 8)
#define BUG_NO_ARRIVE 1  // the rank's dispatch loader never arrives for its first item
#define BUG_NO_BARRIER 2 // the rank never reaches dispatch's second barrier
#define BUG_BWD_NO_BARRIER 3 // the rank's backward combine ends before its first barrier

// he_rank: one rank's buffers, 8-byte pointers (dispatchers/hybridep
// uploads a table of every rank's to each GPU: its own ranks' in full, of
// the other ranks only the buffers a kernel reaches across ranks, gmap,
// recv_x and recv_p; the rest are null there. A rank of another process,
// in a run that spans processes, has only gmap, the GPU's first rank's:
// he_allgather's stores for it land where that rank's own already go, and
// no kernel reaches its other buffers, its domain being in its process).
typedef struct {
    const bf16 *x;        // [T, H] input
    const int *idx;       // [T, k] experts
    const float *probs;   // [T, k]
    unsigned char *gmap;  // [N·T, E] the global routing map
    float *dprobs;        // [T, M, LDP] its tokens' probabilities, per domain
    int *meta;            // the preprocessing's output (below)
    unsigned char *todom; // [T, M] domains needing each of its tokens
    bf16 *recv_x;         // [N·T, H] receive buffer; combine's partial sums
    float *recv_p;        // [N·T, LDP]
    bf16 *id_x;           // [(M−1)·T, H] inter-domain buffer (in)
    float *id_p;          // [(M−1)·T, LDP]
    bf16 *send_x;         // [(M−1)·T, H] inter-domain staging (out)
    float *send_p;        // [(M−1)·T, LDP]
    bf16 *ex;             // expert-major rows
    float *ep;            // their probabilities
    const bf16 *ey;       // the experts' outputs
    bf16 *y;              // [T, H] output
    const bf16 *shared;   // [T, H] shared expert's output, or null
    int *sync;            // [2] a barrier's block arrivals, and the epoch passed
    // the backward's
    const bf16 *dy;       // [T, H] output gradients
    bf16 *edy;            // the expert-major rows' output gradients
    const bf16 *edx;      // the expert-major rows' input gradients
    const float *edp;     // and their probability gradients
    bf16 *dx;             // [T, H] input gradients
    float *dp;            // [T, k] probability gradients
} he_rank;

// meta: int32 offsets
#define META_S2D 0                              // [M, T, D] sparse_to_dense of the tokens the rank forwards
#define META_D2E (META_S2D + M * T * D)         // [N·T, L] dense_to_expert of the tokens it receives
#define META_COUNTS (META_D2E + N * T * L)      // [L] rows per local expert, receive count, [M] sends, [M] receives
#define META_CHUNK_AT (META_COUNTS + L + 1 + 2 * M) // [N·CHUNKS + 1]
#define META_SEND (META_CHUNK_AT + N * CHUNKS + 1) // [M, T] a token's slot in the send to a domain, or −1
#define META_RECV (META_SEND + M * T)              // [M, T] a forwarded token's slot in the inter-domain buffer, or −1
#define META_TILECNT (META_RECV + M * T)                 // [PRE_TILES, PRE_COLS] the preprocessing's scratch: each tile's count per column,
#define META_BITS (META_TILECNT + PRE_TILES * PRE_COLS)  // [PRE_TILES, PRE_COLS, PRE_WARPS] and its tokens' column bits
#define META_INTS (META_BITS + PRE_TILES * PRE_COLS * PRE_WARPS)

// tile: where domain m's rows lie in an inter-domain buffer of domain n ≠ m
__device__ __forceinline__ int he_tile(int m, int n) { return m < n ? m : m - 1; }

// he_sync: a device barrier of every block of every rank: each block's
// stores (peers' memory too) before it, every block waits for all. The
// rank's last block to arrive meets the other ranks (mb_barrier on
// flags, epoch) and tells its blocks. Every thread fences the async
// proxy on both sides: plain stores before it (combine's partial sums)
// are read after it by bulk copies. (A thread's bulk stores are
// published by its own release: it waits for them and fences first.)
// False when a wait gave up.
__device__ bool he_sync(const mb_comm &c, const he_rank *R, int *const *flags, int rank, int blocks, int phase, int epoch,
                        bool skip) {
    __shared__ int ok;
    mb_fence_proxy_async();
    __syncthreads();
    if (threadIdx.x == 0) {
        int *s = R[rank].sync;
        mb_fence_sys();
        ok = 1;
        if (mb_atomic_add_release_sys(s, 1) == epoch * blocks - 1) {
            mb_fence_sys();
            ok = skip ? 1 : mb_barrier(c, rank, N, phase, W_FLAG, flags, epoch);
            mb_st_release_sys(s + 1, epoch);
        } else {
            ok = mb_wait_ge(c, rank, phase, W_PASSED, s + 1, epoch);
        }
    }
    __syncthreads();
    mb_fence_proxy_async();
    return ok;
}

// ---- allgather

// MAPV: the bytes of a map row one thread builds and stores at once (the
// widest vector, up to 16 bytes, that E is a multiple of: rows stay aligned)
#define MAPV (E % 16 == 0 ? 16 : E % 8 == 0 ? 8 : E % 4 == 0 ? 4 : E % 2 == 0 ? 2 : 1)

// he_store_map stores the first MAPV bytes of w (little-endian) at p
__device__ __forceinline__ void he_store_map(unsigned char *p, const unsigned w[4]) {
    if (MAPV == 16) {
        uint4 v;
        v.x = w[0], v.y = w[1], v.z = w[2], v.w = w[3];
        *(uint4 *)p = v;
    } else if (MAPV == 8) {
        *(unsigned long long *)p = w[0] | (unsigned long long)w[1] << 32;
    } else if (MAPV == 4) {
        *(unsigned *)p = w[0];
    } else if (MAPV == 2) {
        *(unsigned short *)p = (unsigned short)w[0];
    } else {
        *p = (unsigned char)w[0];
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    he_allgather(mb_comm c, int first, int blocks, int epoch, const he_rank *R, int *const *flags) {
    const int rank = first + blockIdx.x / blocks, b = blockIdx.x % blocks, lane = threadIdx.x % 32;
    const he_rank me = R[rank];
    // the map: each thread MAPV bytes of a row (experts e0, e0 + 1, …) from
    // the token's top-k, stored as one vector into every rank's copy
    for (int x = b * THREADS + threadIdx.x; x < T * (E / MAPV); x += blocks * THREADS) {
        const int t = x / (E / MAPV), e0 = x % (E / MAPV) * MAPV;
        unsigned w[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < MB_HE_TOPK; j++) {
            const int e = me.idx[t * MB_HE_TOPK + j] - e0;
            const bool in = e >= 0 && e < MAPV;
#pragma unroll
            for (int q = 0; q < 4; q++) w[q] |= in && e >> 2 == q ? 1u << 8 * (e & 3) : 0u;
        }
        for (int q = 0; q < N; q++) he_store_map(R[q].gmap + ((size_t)rank * T + t) * E + e0, w);
    }
    for (int t = b * WARPS + threadIdx.x / 32; t < T; t += blocks * WARPS) {
        int e_of[MB_HE_TOPK];
        float p_of[MB_HE_TOPK];
#pragma unroll
        for (int j = 0; j < MB_HE_TOPK; j++) e_of[j] = me.idx[t * MB_HE_TOPK + j], p_of[j] = me.probs[t * MB_HE_TOPK + j];
        for (int x = lane; x < M * LDP; x += 32) {
            const int m = x / LDP, e = m * LD + x % LDP;
            float p = 0.f;
            if (x % LDP < LD) {
#pragma unroll
                for (int j = 0; j < MB_HE_TOPK; j++) p = e_of[j] == e ? p_of[j] : p;
            }
            me.dprobs[(size_t)t * M * LDP + x] = p;
        }
    }
    he_sync(c, R, flags, rank, blocks, PH_ALLGATHER, epoch, false);
}

// ---- preprocess: HybridEP's metadata_preprocessing, two launches of
// the rank's own budget (blocks blockIdx.x % blocks, as the other
// kernels'; no cross-block wait: the second follows the first on the
// stream). Every column of the scan is a count in global token order (g
// = source rank · T + t), an exclusive prefix: x < D, "rank (n, x) needs
// the token" (receive positions); D + e, "a token this rank receives has
// its expert e"; with the rank's own tokens D + L + m, "domain m needs
// it"; with the tokens of source (m, l), m ≠ n (those it forwards from
// another domain), D + L + M + m, "this domain needs it". The global map
// is cut into tiles of PRE_TILE tokens, the rank's block b taking tiles
// b, b + blocks, ….
//   he_preprocess_count  stages each tile's map rows in shared memory
//                        (16-byte loads, 4 in flight a lane), each warp
//                        turns its PRE_TPW tokens' rows into a bit of
//                        every column (a row's experts as ballots), and
//                        the block stores the tile's column bits and
//                        counts (META_BITS, META_TILECNT)
//   he_preprocess        each tile's prefix (the counts of the tiles
//                        before it) and its tokens' positions, a thread a
//                        token: sparse_to_dense, dense_to_expert (from the
//                        expert's first row: every tile's counts give
//                        them), the chunk layout, attn_to_rdma and the
//                        inter-domain slots; block 0 the counts
#define PRE_WARPS (PRE_THREADS / 32)
#define PRE_TILE (E <= 256 ? 256 : E <= 512 ? 128 : E <= 1024 ? 64 : 32) // tokens a tile (≤ 64 KiB of map)
#define PRE_TPW (PRE_TILE / PRE_WARPS)                                   // a warp's tokens of a tile: the bits of a word
#define PRE_TILES ((N * T + PRE_TILE - 1) / PRE_TILE)
#define PRE_COLS (D + L + 2 * M)
#define PRE_COLW ((PRE_COLS + 31) / 32) // a lane's columns
#define PRE_EW ((E + 31) / 32)          // words of a row's experts' bits
#define PRE_UNROLL 4

// he_any: is a bit of m[a, a + len) set?
__device__ __forceinline__ bool he_any(const unsigned *m, int a, int len) {
    for (int b = a, end = a + len; b < end;) {
        const int s = b % 32, k = min(32 - s, end - b);
        if ((m[b / 32] >> s) & (k == 32 ? ~0u : (1u << k) - 1)) return true;
        b += k;
    }
    return false;
}

// he_col: does source rank src's token whose row has the expert bits m
// count in column x of rank's scan?
__device__ __forceinline__ bool he_col(const unsigned *m, int x, int src, int rank) {
    const int n = rank / D, l = rank % D;
    if (x < D) return he_any(m, n * LD + x * L, L);
    if (x < D + L) {
        const int e = n * LD + l * L + x - D;
        return (m[e / 32] >> e % 32 & 1) != 0; // (its own expert: the rank needs it)
    }
    if (x < D + L + M) return src == rank && he_any(m, (x - D - L) * LD, LD);
    return src % D == l && src / D != n && x - D - L - M == src / D && he_any(m, n * LD, LD);
}

extern "C" __global__ void __launch_bounds__(PRE_THREADS, 1) he_preprocess_count(int first, int blocks, const he_rank *R) {
    const int rank = first + blockIdx.x / blocks, b = blockIdx.x % blocks, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const he_rank me = R[rank];
    unsigned char *tile = mb_dynamic_smem(); // PRE_TILE map rows
    __shared__ unsigned msk[PRE_WARPS][PRE_EW];
    __shared__ unsigned sb[PRE_COLS][PRE_WARPS];
    int *cnt = me.meta + META_TILECNT;
    unsigned *bits = (unsigned *)(me.meta + META_BITS);
    for (int k = b; k < PRE_TILES; k += blocks) {
        const int g0 = k * PRE_TILE, ntok = min(PRE_TILE, N * T - g0);
        // the tile's rows, whole 16-byte units (the map's allocation is)
        const unsigned bytes = ((unsigned)ntok * E + 15) / 16 * 16;
        const unsigned char *src = me.gmap + (size_t)g0 * E;
        for (unsigned b0 = 16 * threadIdx.x; b0 < bytes; b0 += PRE_UNROLL * 16 * PRE_THREADS) {
            uint4 v[PRE_UNROLL];
#pragma unroll
            for (int u = 0; u < PRE_UNROLL; u++)
                if (b0 + u * 16 * PRE_THREADS < bytes) v[u] = *(const uint4 *)(src + b0 + u * 16 * PRE_THREADS);
#pragma unroll
            for (int u = 0; u < PRE_UNROLL; u++)
                if (b0 + u * 16 * PRE_THREADS < bytes) *(uint4 *)(tile + b0 + u * 16 * PRE_THREADS) = v[u];
        }
        __syncthreads();
        unsigned acc[PRE_COLW];
#pragma unroll
        for (int q = 0; q < PRE_COLW; q++) acc[q] = 0;
        for (int j = 0; j < PRE_TPW; j++) {
            const int tt = warp * PRE_TPW + j;
            if (tt >= ntok) break;
            const unsigned char *row = tile + (size_t)tt * E;
            for (int c = 0; c < PRE_EW; c++) {
                const int e = 32 * c + lane;
                const unsigned ball = __ballot_sync(MB_FULL_MASK, e < E && row[e] != 0);
                if (lane == 0) msk[warp][c] = ball;
            }
            __syncwarp();
            const int s = (g0 + tt) / T;
#pragma unroll
            for (int q = 0; q < PRE_COLW; q++) {
                const int x = lane + 32 * q;
                if (x < PRE_COLS && he_col(msk[warp], x, s, rank)) acc[q] |= 1u << j;
            }
            __syncwarp();
        }
#pragma unroll
        for (int q = 0; q < PRE_COLW; q++)
            if (lane + 32 * q < PRE_COLS) sb[lane + 32 * q][warp] = acc[q];
        __syncthreads();
        for (int x = threadIdx.x; x < PRE_COLS; x += PRE_THREADS) {
            int c = 0;
            for (int w = 0; w < PRE_WARPS; w++) {
                bits[((size_t)k * PRE_COLS + x) * PRE_WARPS + w] = sb[x][w];
                c += __popc(sb[x][w]);
            }
            cnt[k * PRE_COLS + x] = c;
        }
        __syncthreads(); // the tile and sb read
    }
}

extern "C" __global__ void __launch_bounds__(PRE_THREADS, 1) he_preprocess(int first, int blocks, const he_rank *R) {
    const int rank = first + blockIdx.x / blocks, b = blockIdx.x % blocks, n = rank / D, l = rank % D;
    const he_rank me = R[rank];
    int *s2d = me.meta + META_S2D, *d2e = me.meta + META_D2E, *counts = me.meta + META_COUNTS;
    int *chunk_at = me.meta + META_CHUNK_AT, *send = me.meta + META_SEND, *recv = me.meta + META_RECV;
    const int *cnt = me.meta + META_TILECNT;
    const unsigned *bits = (const unsigned *)(me.meta + META_BITS);
    __shared__ int base[PRE_COLS];  // the counts before the tile
    __shared__ int total[PRE_COLS]; // every tile's
    __shared__ int start[L];        // each local expert's first row
    __shared__ unsigned sb[PRE_COLS][PRE_WARPS];
    __shared__ int wpre[PRE_COLS][PRE_WARPS]; // the counts before each warp's tokens
    for (int x = threadIdx.x; x < PRE_COLS; x += PRE_THREADS) {
        int s = 0, before = 0;
        for (int k = 0; k < PRE_TILES; k++) {
            if (k == b) before = s;
            s += cnt[k * PRE_COLS + x];
        }
        total[x] = s, base[x] = before;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int e = 0, s = 0; e < L; e++) start[e] = s, s += total[D + e];
        if (b == 0) { // receive count and rows per local expert, sends and receives per domain
            counts[L] = total[l];
            for (int e = 0; e < L; e++) counts[e] = total[D + e];
            for (int dm = 0; dm < M; dm++) {
                counts[L + 1 + dm] = dm == n ? 0 : total[D + L + dm];
                counts[L + 1 + M + dm] = dm == n ? 0 : total[D + L + M + dm];
            }
            chunk_at[N * CHUNKS] = total[l];
        }
    }
    __syncthreads();
    for (int k = b; k < PRE_TILES; k += blocks) {
        const int g0 = k * PRE_TILE, ntok = min(PRE_TILE, N * T - g0);
        for (int x = threadIdx.x; x < PRE_COLS; x += PRE_THREADS) {
            int s = base[x];
            for (int w = 0; w < PRE_WARPS; w++) {
                const unsigned v = bits[((size_t)k * PRE_COLS + x) * PRE_WARPS + w];
                sb[x][w] = v, wpre[x][w] = s;
                s += __popc(v);
            }
        }
        __syncthreads();
        const int tt = threadIdx.x;
        if (tt < ntok) {
            const int g = g0 + tt, src = g / T, t = g % T, m = src / D, sl = src % D, w = tt / PRE_TPW, j = tt % PRE_TPW;
            int i = -1; // the token's receive position, if this rank receives it
            for (int x = 0; x < PRE_COLS; x++) {
                const unsigned word = sb[x][w];
                const bool v = (word >> j & 1) != 0;
                const int pos = wpre[x][w] + __popc(word & ((1u << j) - 1));
                if (x < D) {
                    if (sl == l) s2d[((size_t)m * T + t) * D + x] = v ? pos : -1;
                    if (x == l) {
                        i = v ? pos : -1;
                        if (t % CHUNK == 0) chunk_at[src * CHUNKS + t / CHUNK] = pos;
                    }
                } else if (x < D + L) {
                    if (i >= 0) d2e[(size_t)i * L + x - D] = v ? pos + start[x - D] : -1;
                } else if (x < D + L + M) {
                    if (src == rank) {
                        me.todom[t * M + x - D - L] = v;
                        send[(x - D - L) * T + t] = v && x - D - L != n ? pos : -1;
                    }
                } else if (sl == l && m != n && x - D - L - M == m) {
                    recv[m * T + t] = v ? pos : -1;
                }
            }
            if (src == rank) recv[n * T + t] = -1; // (no source of its own domain forwards to it)
        }
        __syncthreads();
        // the tiles up to this block's next
        for (int x = threadIdx.x; x < PRE_COLS; x += PRE_THREADS)
            for (int k2 = k; k2 < min(k + blocks, PRE_TILES); k2++) base[x] += cnt[k2 * PRE_COLS + x];
        __syncthreads();
    }
}

// ---- pack (several domains): each of the rank's tokens another domain
// needs, at its slot of the send to that domain (the inter-domain path's
// staging; the host then sends it with NCCL to the rank of the same local
// index there).
// he_copy_row: the warp copies a row, COPY_UNROLL 16-byte loads in
// flight per lane before their stores
#define COPY_UNROLL 4
__device__ __forceinline__ void he_copy_row(void *dst, const void *src, unsigned bytes) {
    for (unsigned b0 = 16 * (threadIdx.x % 32); b0 < bytes; b0 += COPY_UNROLL * 16 * 32) {
        uint4 v[COPY_UNROLL];
#pragma unroll
        for (int u = 0; u < COPY_UNROLL; u++)
            if (b0 + u * 16 * 32 < bytes) v[u] = *(const uint4 *)((const unsigned char *)src + b0 + u * 16 * 32);
#pragma unroll
        for (int u = 0; u < COPY_UNROLL; u++)
            if (b0 + u * 16 * 32 < bytes) *(uint4 *)((unsigned char *)dst + b0 + u * 16 * 32) = v[u];
    }
}

// BWD: the output gradients, without probabilities.
template <bool BWD> __device__ __forceinline__ void he_pack_body(int first, int blocks, const he_rank *R) {
    const int rank = first + blockIdx.x / blocks, b = blockIdx.x % blocks, n = rank / D;
    const he_rank me = R[rank];
    const int *send = me.meta + META_SEND;
    for (int x = b * WARPS + threadIdx.x / 32; x < M * T; x += blocks * WARPS) {
        const int dm = x / T, t = x % T, slot = send[x];
        if (dm == n || slot < 0) continue;
        const size_t at = (size_t)he_tile(dm, n) * T + slot;
        he_copy_row(me.send_x + at * XH, (BWD ? me.dy : me.x) + (size_t)t * XH, XROW);
        if (!BWD) he_copy_row(me.send_p + at * LDP, me.dprobs + ((size_t)t * M + dm) * LDP, 4 * LDP);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) he_pack(int first, int blocks, const he_rank *R) {
    he_pack_body<false>(first, blocks, R);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) he_pack_bwd(int first, int blocks, const he_rank *R) {
    he_pack_body<true>(first, blocks, R);
}

// ---- dispatch

#define SLOT (ROW + 4 * LDP) // a FIFO item: a token's row and its domain's probabilities
#ifdef MB_BULK
#define STORE_RELEASERS 1 // lane 0 stores with bulk copies
// a storer's bulk-store groups left reading their slots while it goes on
// (HybridEP keeps 8 in flight): all its slots but the one the loader
// fills next, the oldest released as each new group is committed
#define S2G_INFLIGHT (MB_HE_STAGES / (WARPS - 1) - 1)
#else
#define STORE_RELEASERS 32
#endif

// he_forwarded calls fn(i, m, t, row, probs) for the items of the rank's
// block b, in the design's order: chunks b, b + blocks, …; in each, source
// domains n, n − 1, …, n + 1; their tokens that domain n needs (its own
// rows x, or those the inter-domain path brought).
template <bool BWD, class F> __device__ void he_forwarded(const he_rank &me, const bf16 *x, int n, int b, int blocks, F fn) {
    const int *recvi = me.meta + META_RECV;
    long long i = 0;
    for (int c = b; c < CHUNKS; c += blocks)
        for (int k = 0; k < M; k++) {
            const int m = (n - k + M) % M;
            for (int t = c * CHUNK; t < min(T, (c + 1) * CHUNK); t++) {
                if (m == n) {
                    if (!me.todom[t * M + n]) continue;
                    if (!fn(i++, m, t, (const void *)(x + (size_t)t * XH), (const void *)(me.dprobs + ((size_t)t * M + n) * LDP)))
                        return;
                } else {
                    const int s = recvi[m * T + t];
                    if (s < 0) continue;
                    const size_t at = (size_t)he_tile(m, n) * T + s;
                    if (!fn(i++, m, t, (const void *)(me.id_x + at * XH), (const void *)(me.id_p + at * LDP))) return;
                }
            }
        }
}

// BWD (the combine's backward): the output gradients DY, without
// probabilities, into the forward's receive rows, then ExpertDY's rows.
template <bool BWD>
__device__ __forceinline__ void he_dispatch_body(mb_comm c, int first, int blocks, int epoch, const he_rank *R, int *const *flags,
                                                 int bug) {
    const int rank = first + blockIdx.x / blocks, b = blockIdx.x % blocks, n = rank / D;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int ph = BWD ? PH_COMBINE_BWD : PH_DISPATCH;
    const bool buggy = !BWD && (bug >> 8) == rank;
    const he_rank me = R[rank];
    const bf16 *x = BWD ? me.dy : me.x;
    const mb_fifo f = mb_fifo_at(mb_dynamic_smem(), MB_HE_STAGES, SLOT);
    if (threadIdx.x == 0) mb_fifo_init(f, STORE_RELEASERS);
    mb_mbar_init_fence();
    if (!he_sync(c, R, flags, rank, blocks, ph, epoch, false)) return;
    if (warp == 0) {
        he_forwarded<BWD>(me, x, n, b, blocks, [&](long long i, int, int, const void *row, const void *probs) {
            const void *src[2] = {row, probs};
            const unsigned bytes[2] = {XROW, 4 * LDP};
            const mb_item it = mb_fifo_item(f, WARPS - 1, (int)(i % (WARPS - 1)), i / (WARPS - 1));
            return mb_fifo_put(f, c, rank, ph, W_EMPTY, it, BWD ? 1 : 2, src, bytes, 0, true,
                               !(buggy && (bug & 255) == BUG_NO_ARRIVE && i == 0));
        });
    } else {
        const int *s2d = me.meta + META_S2D;
        he_forwarded<BWD>(me, x, n, b, blocks, [&](long long i, int m, int t, const void *, const void *) {
            if (i % (WARPS - 1) != warp - 1) return true;
            int ok = 1;
            const mb_item it = mb_fifo_item(f, WARPS - 1, warp - 1, i / (WARPS - 1));
            unsigned char *slot = mb_fifo_slot(f, it);
#ifdef MB_BULK
            if (lane == 0) {
                ok = mb_fifo_wait(f, c, rank, ph, W_FULL, it) != nullptr;
                if (ok) {
                    for (int j = 0; j < D; j++) {
                        const int p = s2d[((size_t)m * T + t) * D + j];
                        if (p < 0) continue;
                        const he_rank &q = R[n * D + j];
                        mb_bulk_s2g(q.recv_x + (size_t)p * XH, slot, XROW);
                        if (!BWD) mb_bulk_s2g(q.recv_p + (size_t)p * LDP, slot + XROW, 4 * LDP);
                    }
                    mb_bulk_commit();
                    // the group S2G_INFLIGHT items back has read its slot
                    mb_bulk_wait_read_n<S2G_INFLIGHT>();
                    const long long k = i / (WARPS - 1) - S2G_INFLIGHT;
                    if (k >= 0) mb_fifo_release(f, mb_fifo_item(f, WARPS - 1, warp - 1, k));
                }
            }
            return __shfl_sync(MB_FULL_MASK, ok, 0) != 0;
#else
            ok = mb_fifo_wait(f, c, rank, ph, W_FULL, it) != nullptr;
            if (!__all_sync(MB_FULL_MASK, ok)) return false;
            for (int j = 0; j < D; j++) {
                const int p = s2d[((size_t)m * T + t) * D + j];
                if (p < 0) continue;
                const he_rank &q = R[n * D + j];
                for (unsigned o = 16 * lane; o < (BWD ? ROW : DROW + 4 * LDP); o += 16 * 32) {
                    const uint4 v = mb_lds16(slot + o);
                    if (o < XROW) *(uint4 *)((unsigned char *)(q.recv_x + (size_t)p * XH) + o) = v;
                    else *(uint4 *)((unsigned char *)(q.recv_p + (size_t)p * LDP) + o - XROW) = v;
                }
            }
            mb_fifo_release(f, it);
            return true;
#endif
        });
#ifdef MB_BULK
        if (lane == 0) { // the stores landed, as this thread sees them: its own fence publishes them
            mb_bulk_wait();
            mb_fence_sys();
        }
#endif
    }
    // every rank's receive buffer complete (he_permute follows on the stream)
    he_sync(c, R, flags, rank, blocks, ph, epoch + 1, buggy && (bug & 255) == BUG_NO_BARRIER);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    he_dispatch(mb_comm c, int first, int blocks, int epoch, const he_rank *R, int *const *flags, int bug) {
    he_dispatch_body<false>(c, first, blocks, epoch, R, flags, bug);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    he_dispatch_bwd(mb_comm c, int first, int blocks, int epoch, const he_rank *R, int *const *flags, int bug) {
    he_dispatch_body<true>(c, first, blocks, epoch, R, flags, bug);
}

// ---- permute: HybridEP's permute kernel, blocks of its own after the
// dispatch (the rank's received rows are all in): each received token's
// row to its local experts' rows (BWD: ExpertDY's), its probability with
// it. The rank's block b takes tokens b·PWARPS + warp, then every
// blocks·PWARPS-th. On the bulk path each warp's lane 0 keeps a ring of
// PSTAGES rows in shared memory (a FIFO whose producer and consumer are
// itself): bulk loads of the next rows in flight while each loaded row
// goes out to its experts' rows as bulk stores; otherwise the warp copies
// with COPY_UNROLL 16-byte loads in flight per lane.
#define PWARPS 4
#define PTHREADS (32 * PWARPS)
#ifdef MB_HE_PSTAGES
#define PSTAGES MB_HE_PSTAGES // fewer where a block's shared memory is short (dispatchers/hybridep's permuteStages)
#else
#define PSTAGES 3 // a warp's rows (comm.FIFOBytes(PSTAGES, ROW) each)
#endif

template <bool BWD> __device__ __forceinline__ void he_permute_body(int first, int blocks, const he_rank *R) {
    const int rank = first + blockIdx.x / blocks, b = blockIdx.x % blocks, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int l = rank % D;
    const he_rank me = R[rank];
    const int *d2e = me.meta + META_D2E, received = me.meta[META_COUNTS + L];
    bf16 *dst = BWD ? me.edy : me.ex;
    const int i0 = b * PWARPS + warp, stride = blocks * PWARPS;
#ifdef MB_BULK
    const mb_fifo f = mb_fifo_at(mb_dynamic_smem() + warp * (16 * PSTAGES + PSTAGES * ROW), PSTAGES, ROW);
    if (lane == 0) mb_fifo_init(f, 1);
    mb_mbar_init_fence();
    __syncthreads();
    if (lane != 0) return;
    const int n = i0 < received ? (received - 1 - i0) / stride + 1 : 0; // the warp's tokens
    // load: the k-th token's row into its slot, once the slot's last
    // stores have read it (released below)
    auto load = [&](int k) {
        const mb_item it = mb_fifo_item(f, 1, 0, k);
        while (!mb_mbar_test(f.empty + it.slot, (it.round & 1) ^ 1)) {
        }
        mb_mbar_arrive_expect_tx(f.full + it.slot, XROW);
        mb_bulk_g2s(mb_fifo_slot(f, it), me.recv_x + (size_t)(i0 + k * stride) * XH, XROW, f.full + it.slot);
    };
    for (int k = 0; k < min(PSTAGES, n); k++) load(k);
    for (int k = 0; k < n; k++) {
        const int i = i0 + k * stride;
        const mb_item it = mb_fifo_item(f, 1, 0, k);
        while (!mb_mbar_test(f.full + it.slot, it.round & 1)) {
        }
        for (int e = 0; e < L; e++) {
            const int p = d2e[(size_t)i * L + e];
            if (p < 0) continue;
            mb_bulk_s2g(dst + (size_t)p * XH, mb_fifo_slot(f, it), XROW);
            if (!BWD) me.ep[p] = me.recv_p[(size_t)i * LDP + l * L + e];
        }
        mb_bulk_commit();
        mb_bulk_wait_read(); // the slot read (its writes go on)
        mb_fifo_release(f, it);
        if (k + PSTAGES < n) load(k + PSTAGES);
    }
    mb_bulk_wait();
#else
    for (int i = i0; i < received; i += stride)
        for (int e = 0; e < L; e++) {
            const int p = d2e[(size_t)i * L + e];
            if (p < 0) continue;
            he_copy_row(dst + (size_t)p * XH, me.recv_x + (size_t)i * XH, XROW);
            if (!BWD && lane == 0) me.ep[p] = me.recv_p[(size_t)i * LDP + l * L + e];
        }
#endif
}

extern "C" __global__ void __launch_bounds__(PTHREADS, 1) he_permute(int first, int blocks, const he_rank *R) {
    he_permute_body<false>(first, blocks, R);
}

extern "C" __global__ void __launch_bounds__(PTHREADS, 1) he_permute_bwd(int first, int blocks, const he_rank *R) {
    he_permute_body<true>(first, blocks, R);
}

// ---- combine: sums through FIFOs of whole rows (HybridEP's combine: 2
// loader warps, 4 reducer warps). The block is two pipelines: loader warp
// p stages every term of its outputs, a whole row an item, in FIFO p
// (MB_HE_STAGES slots); reducer warps 2 + 2p and 3 + 2p (64 threads, a
// 16-byte piece of the row in 64 per thread) add them, float32 from 0 in
// order, and store the bf16 sum (with the shared expert's output added
// and rounded again, at home): on the bulk path into one of the
// pipeline's OUT_STAGES output rows in shared memory, which one thread
// stores with a bulk copy (its previous one left reading); otherwise
// with 16-byte stores.

#define CWARPS 6
#define CTHREADS (32 * CWARPS)
#define PIPES 2
#define PIPE_THREADS 64                                   // a pipeline's reducers
#define ACC ((ROW / 16 + PIPE_THREADS - 1) / PIPE_THREADS) // 16-byte pieces of a row per reducer
#define ADD_UNROLL 4                                       // a reducer's add loads in flight (home: the shared expert's row)
#define CFIFO_BYTES (16 * MB_HE_STAGES + MB_HE_STAGES * ROW) // a pipeline's FIFO (comm.FIFOBytes)
#ifdef MB_BULK
#define OUT_STAGES 2
#else
#define OUT_STAGES 1 // (unused)
#endif

// he_outs: the pipelines' output rows (after their FIFOs) and their
// barriers: full, the pipeline's reducers' stores in; empty, the bulk
// store's read of it done
struct he_outs {
    unsigned char *rows;
    mb_mbar *full, *empty;
    long long k, released; // the pipeline's outputs so far, the rows released (its storer's)
};

// he_reduce: the rank's block b sums outputs o = b, b + blocks, … < count
// of S (terms(o), term(o, x), out(o), add(o)), its waits in phase ph; the
// block's k-th output with terms goes to pipeline k mod 2. items counts
// the thread's FIFO items (a loader's puts, a reducer's takes) from one
// call to the next. False when a wait gave up.
template <class S>
__device__ bool he_reduce(const mb_comm &c, int rank, int ph, int b, int blocks, int count, const S &s, long long &items,
                          he_outs &os) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bool loader = warp < PIPES;
    const int pipe = loader ? warp : (warp - PIPES) / 2, pt = threadIdx.x - 32 * PIPES - PIPE_THREADS * pipe;
    const mb_fifo f = mb_fifo_at(mb_dynamic_smem() + pipe * CFIFO_BYTES, MB_HE_STAGES, ROW);
    int ok = 1;
    for (int o = b, k = 0; o < count && ok; o += blocks) {
        const int nt = s.terms(o);
        if (nt == 0) continue; // no output (a pre-reduction for a token this domain does not hold)
        if (k++ % PIPES != pipe) continue;
        if (loader) {
            for (int x = 0; x < nt && ok; x++) {
                const void *src[1] = {s.term(o, x)};
                const unsigned bytes = ROW;
                ok = mb_fifo_put(f, c, rank, ph, W_EMPTY, mb_fifo_item(f, 1, 0, items++), 1, src, &bytes);
            }
            continue;
        }
        float acc[ACC][8];
#pragma unroll
        for (int p = 0; p < ACC; p++)
#pragma unroll
            for (int x = 0; x < 8; x++) acc[p][x] = 0.f;
        for (int x = 0; x < nt && ok; x++) {
            const mb_item it = mb_fifo_item(f, 1, 0, items++);
            unsigned char *slot = mb_fifo_wait(f, c, rank, ph, W_FULL, it);
            ok = __all_sync(MB_FULL_MASK, slot != nullptr);
            if (!ok) break;
#pragma unroll
            for (int p = 0; p < ACC; p++) {
                const unsigned at = 16 * (p * PIPE_THREADS + pt);
                if (at < ROW) {
                    float v[8];
                    unpack8(mb_lds16(slot + at), v);
#pragma unroll
                    for (int y = 0; y < 8; y++) acc[p][y] += v[y];
                }
            }
            mb_fifo_release(f, it);
        }
        if (!ok) break;
        const unsigned char *add = (const unsigned char *)s.add(o);
#ifdef MB_BULK
        // the output row: wait until its previous bulk store has read it
        const int r = (int)(os.k % OUT_STAGES), round = (int)(os.k / OUT_STAGES);
        unsigned char *row = os.rows + (pipe * OUT_STAGES + r) * ROW;
        ok = __all_sync(MB_FULL_MASK, mb_mbar_wait(c, rank, ph, W_EMPTY, os.empty + pipe * OUT_STAGES + r, (round & 1) ^ 1));
        if (!ok) break;
#else
        unsigned char *out = (unsigned char *)s.out(o);
#endif
        // the row's pieces ADD_UNROLL at a time: their add loads (the
        // shared expert's row, at home) issued together, then each summed
        // and stored in order
#pragma unroll
        for (int p0 = 0; p0 < ACC; p0 += ADD_UNROLL) {
            uint4 av[ADD_UNROLL];
#pragma unroll
            for (int u = 0; u < ADD_UNROLL; u++) {
                const unsigned at = 16 * ((p0 + u) * PIPE_THREADS + pt);
                if (add && p0 + u < ACC && at < ROW) av[u] = *(const uint4 *)(add + at);
            }
#pragma unroll
            for (int u = 0; u < ADD_UNROLL; u++) {
                const int p = p0 + u;
                const unsigned at = 16 * (p * PIPE_THREADS + pt);
                if (p >= ACC || at >= ROW) continue;
                bf16 y[8];
#pragma unroll
                for (int x = 0; x < 8; x++) y[x] = f2bf(acc[p][x]);
                if (add) {
                    float a[8];
                    unpack8(av[u], a);
#pragma unroll
                    for (int x = 0; x < 8; x++) y[x] = f2bf(bf2f(y[x]) + a[x]);
                }
#ifdef MB_BULK
                mb_sts16(row + at, pack8(y));
#else
                mb_stg16(out + at, pack8(y));
#endif
            }
        }
#ifdef MB_BULK
        // the reducers' stores, seen by the bulk copy (async proxy), in
        mb_fence_proxy_async();
        mb_mbar_arrive(os.full + pipe * OUT_STAGES + r);
        if (pt == 0) { // the pipeline's storer
            ok = mb_mbar_wait(c, rank, ph, W_FULL, os.full + pipe * OUT_STAGES + r, round & 1);
            if (ok) {
                mb_bulk_s2g(s.out(o), row, ROW);
                mb_bulk_commit();
                // release the rows whose stores have read them (all but the
                // latest OUT_STAGES − 1)
                mb_bulk_wait_read_n<OUT_STAGES - 1>();
                for (; os.released <= os.k - (OUT_STAGES - 1); os.released++)
                    mb_mbar_arrive(os.empty + pipe * OUT_STAGES + (int)(os.released % OUT_STAGES));
            }
        }
        os.k++;
        ok = __shfl_sync(MB_FULL_MASK, ok, 0);
#endif
    }
#ifdef MB_BULK
    if (!loader && pt == 0) { // the sums landed: this thread's fence publishes them
        mb_bulk_wait();
        for (; os.released < os.k; os.released++) mb_mbar_arrive(os.empty + pipe * OUT_STAGES + (int)(os.released % OUT_STAGES));
        mb_fence_sys();
    }
#endif
    __shared__ int all;
    __syncthreads();
    if (threadIdx.x == 0) all = 1;
    __syncthreads();
    if (!ok) all = 0;
    __syncthreads();
    return all != 0;
}

// The three sums. Partial (each expert rank, its received token i): its
// local experts' outputs ey (in the backward their input gradients), in
// expert order, into its receive buffer row i.
struct he_partials {
    const he_rank &me;
    const bf16 *ey;
    __device__ int terms(int i) const {
        int n = 0;
        for (int e = 0; e < L; e++) n += me.meta[META_D2E + i * L + e] >= 0;
        return n;
    }
    __device__ const bf16 *term(int i, int x) const {
        for (int e = 0;; e++)
            if (me.meta[META_D2E + i * L + e] >= 0 && x-- == 0) return ey + (size_t)me.meta[META_D2E + i * L + e] * H;
    }
    __device__ bf16 *out(int i) const { return me.recv_x + (size_t)i * H; }
    __device__ const bf16 *add(int) const { return nullptr; }
};

// he_domain_terms: the partial sums of source (sn, l)'s token t that the
// ranks of reader's domain hold, in rank order, as reader's
// sparse_to_dense places them (its x-th, or their count when x < 0).
__device__ __forceinline__ int he_domain_terms(const he_rank *R, int reader, int sn, int t, int x, const bf16 **row) {
    const int *s2d = R[reader].meta + META_S2D + ((size_t)sn * T + t) * D, dn = reader / D;
    int k = 0;
    for (int j = 0; j < D; j++) {
        if (s2d[j] < 0) continue;
        if (k == x) *row = R[dn * D + j].recv_x + (size_t)s2d[j] * H;
        k++;
    }
    return k;
}

// Pre-reduction (forwarder (m, l), for home (n, l) of another domain,
// output o = tile(n, m)·T + t over the tokens its domain needs): its
// domain's partial sums, into the send buffer at the token's slot.
struct he_prereduce {
    const he_rank *R;
    int rank;
    __device__ void home(int o, int &sn, int &t) const {
        const int m = rank / D, k = o / T;
        sn = k < m ? k : k + 1, t = o % T;
    }
    __device__ int terms(int o) const {
        int sn, t;
        home(o, sn, t);
        if (R[rank].meta[META_RECV + sn * T + t] < 0) return 0;
        const bf16 *r;
        return he_domain_terms(R, rank, sn, t, -1, &r);
    }
    __device__ const bf16 *term(int o, int x) const {
        int sn, t;
        home(o, sn, t);
        const bf16 *r = nullptr;
        he_domain_terms(R, rank, sn, t, x, &r);
        return r;
    }
    __device__ bf16 *out(int o) const {
        int sn, t;
        home(o, sn, t);
        return R[rank].send_x + ((size_t)he_tile(sn, rank / D) * T + R[rank].meta[META_RECV + sn * T + t]) * H;
    }
    __device__ const bf16 *add(int) const { return nullptr; }
};

// Home (rank (n, l), its token t): its domain's partial sums in rank
// order, then the pre-reduced sums of the domains n − 1, n − 2, …, n + 1
// that need it (the inter-domain path brought them); plus the shared
// expert's output (BWD: into DX, no shared expert).
template <bool BWD> struct he_home {
    const he_rank *R;
    int rank;
    __device__ int terms(int t) const {
        const bf16 *r;
        int k = he_domain_terms(R, rank, rank / D, t, -1, &r);
        for (int dm = 0; dm < M; dm++) k += dm != rank / D && R[rank].todom[t * M + dm];
        return k;
    }
    __device__ const bf16 *term(int t, int x) const {
        const int n = rank / D;
        const bf16 *r = nullptr;
        const int own = he_domain_terms(R, rank, n, t, x, &r);
        if (x < own) return r;
        x -= own;
        for (int k = 1; k < M; k++) {
            const int dm = (n - k + M) % M;
            if (R[rank].todom[t * M + dm] && x-- == 0)
                return R[rank].id_x + ((size_t)he_tile(dm, n) * T + R[rank].meta[META_SEND + dm * T + t]) * H;
        }
        return nullptr;
    }
    __device__ bf16 *out(int t) const { return (BWD ? R[rank].dx : R[rank].y) + (size_t)t * H; }
    __device__ const bf16 *add(int t) const { return !BWD && R[rank].shared ? R[rank].shared + (size_t)t * H : nullptr; }
};

// The backward's probability gradients (fp32, each a sum from 0 in the
// order of the rows' sums; the rank's block b of blocks, a thread per
// value). he_dp_partials: each received token i's row of the domain's L·D
// (LDP) places, its copies' ExpertDProbs at the rank's own, 0 elsewhere.
__device__ __forceinline__ void he_dp_partials(const he_rank &me, int l, int b, int blocks) {
    const int received = me.meta[META_COUNTS + L];
    for (int x = b * CTHREADS + threadIdx.x; x < received * LDP; x += blocks * CTHREADS) {
        const int i = x / LDP, e = x % LDP - l * L;
        float v = 0.f;
        if (e >= 0 && e < L) {
            const int p = me.meta[META_D2E + i * L + e];
            if (p >= 0) v = me.edp[p];
        }
        me.recv_p[x] = v;
    }
}

// he_dp_domain: the sum of the domain's rows (reader's domain's ranks, in
// rank order, where reader's sparse_to_dense places source (sn, l)'s token
// t) at place e of the L·D.
__device__ __forceinline__ float he_dp_domain(const he_rank *R, int reader, int sn, int t, int e) {
    const int *s2d = R[reader].meta + META_S2D + ((size_t)sn * T + t) * D, dn = reader / D;
    float acc = 0.f;
    for (int j = 0; j < D; j++)
        if (s2d[j] >= 0) acc += R[dn * D + j].recv_p[(size_t)s2d[j] * LDP + e];
    return acc;
}

// he_dp_prereduce: forwarder (m, l)'s pre-reduced rows for the other
// domains' homes, into its send buffer's probability rows (as he_prereduce).
__device__ __forceinline__ void he_dp_prereduce(const he_rank *R, int rank, int b, int blocks) {
    const int m = rank / D;
    for (int x = b * CTHREADS + threadIdx.x; x < (M - 1) * T * LDP; x += blocks * CTHREADS) {
        const int o = x / LDP, e = x % LDP, k = o / T, sn = k < m ? k : k + 1, t = o % T;
        const int s = R[rank].meta[META_RECV + sn * T + t];
        if (s < 0) continue;
        R[rank].send_p[((size_t)he_tile(sn, m) * T + s) * LDP + e] = e < LD ? he_dp_domain(R, rank, sn, t, e) : 0.f;
    }
}

// he_dp_home: each home's token t's k probability gradients into DProbs:
// the sum from 0 of its domain's rows at the slot's expert, or of the
// pre-reduced row of the expert's domain.
__device__ __forceinline__ void he_dp_home(const he_rank *R, int rank, int b, int blocks) {
    const int n = rank / D;
    const he_rank &me = R[rank];
    for (int x = b * CTHREADS + threadIdx.x; x < T * MB_HE_TOPK; x += blocks * CTHREADS) {
        const int t = x / MB_HE_TOPK, ex = me.idx[x], dm = ex / LD, e = ex % LD;
        float acc = 0.f;
        if (dm == n) acc = he_dp_domain(R, rank, n, t, e);
        else acc += me.id_p[((size_t)he_tile(dm, n) * T + me.meta[META_SEND + dm * T + t]) * LDP + e];
        me.dp[x] = acc;
    }
}

// he_combine: stage 1, each rank's partial sums, a barrier, and (several
// domains) the pre-reduction for the other domains' homes; stage 2, each
// home's sum and a barrier; stage 0 both (one domain). BWD (the dispatch's
// backward): the input gradients into DX, the probability gradients with
// them (he_dp_*) into DProbs.
template <bool BWD>
__device__ __forceinline__ void he_combine_body(mb_comm c, int first, int blocks, int epoch, const he_rank *R, int *const *flags,
                                                int stage, int bug) {
    const int rank = first + blockIdx.x / blocks, b = blockIdx.x % blocks;
    const int ph = BWD ? PH_DISPATCH_BWD : PH_COMBINE;
    const bool stop = BWD && (bug >> 8) == rank && (bug & 255) == BUG_BWD_NO_BARRIER;
    const he_rank me = R[rank];
    __shared__ mb_mbar ofull[PIPES * OUT_STAGES], oempty[PIPES * OUT_STAGES];
    if (threadIdx.x == 0) {
        for (int p = 0; p < PIPES; p++) mb_fifo_init(mb_fifo_at(mb_dynamic_smem() + p * CFIFO_BYTES, MB_HE_STAGES, ROW), PIPE_THREADS);
        for (int r = 0; r < PIPES * OUT_STAGES; r++) mb_mbar_init(ofull + r, PIPE_THREADS), mb_mbar_init(oempty + r, 1);
    }
    mb_mbar_init_fence();
    __syncthreads();
    long long items = 0; // the thread's FIFO items (a loader's, a reducer's)
    he_outs os = {mb_dynamic_smem() + PIPES * CFIFO_BYTES, ofull, oempty, 0, 0};
    if (stage != 2) {
        if (!he_reduce(c, rank, ph, b, blocks, me.meta[META_COUNTS + L], he_partials{me, BWD ? me.edx : me.ey}, items, os)) return;
        if (BWD) he_dp_partials(me, rank % D, b, blocks);
        if (stop || !he_sync(c, R, flags, rank, blocks, ph, epoch, false)) return;
        if (M > 1 && !he_reduce(c, rank, ph, b, blocks, (M - 1) * T, he_prereduce{R, rank}, items, os)) return;
        if (BWD && M > 1) he_dp_prereduce(R, rank, b, blocks);
        epoch++;
    }
    if (stage != 1) {
        if (!he_reduce(c, rank, ph, b, blocks, T, he_home<BWD>{R, rank}, items, os)) return;
        if (BWD) he_dp_home(R, rank, b, blocks);
        he_sync(c, R, flags, rank, blocks, ph, epoch, false);
    }
}

extern "C" __global__ void __launch_bounds__(CTHREADS, 1)
    he_combine(mb_comm c, int first, int blocks, int epoch, const he_rank *R, int *const *flags, int stage) {
    he_combine_body<false>(c, first, blocks, epoch, R, flags, stage, 0);
}

extern "C" __global__ void __launch_bounds__(CTHREADS, 1)
    he_combine_bwd(mb_comm c, int first, int blocks, int epoch, const he_rank *R, int *const *flags, int stage, int bug) {
    he_combine_body<true>(c, first, blocks, epoch, R, flags, stage, bug);
}
