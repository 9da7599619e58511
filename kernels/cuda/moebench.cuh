// moebench.cuh: shared definitions for moebench's kernels. No toolkit headers:
// bf16 values are 16-bit integers converted with inline PTX, so the sources
// compile with any NVRTC ≥ 11.8 for sm_80 and newer. Shape constants come as
// -D options (MB_*) so that loops have fixed trip counts. Below the bf16
// helpers: the memory primitives and timed cross-rank waits of the
// SM-driven dispatchers (mb_*), each with its host-simulation form
// (internal/hostsim/mbhost.h, MB_HOST).
#pragma once
typedef unsigned short bf16;
typedef int int32;

__device__ __forceinline__ float bf2f(bf16 h) { return __uint_as_float(((unsigned int)h) << 16); }

// round to nearest even, as kernels.RoundBF16 on the host
__device__ __forceinline__ bf16 f2bf(float f) {
#ifdef MB_HOST // the tests' CPU build (internal/hostsim/mbhost.h): no PTX
    return mbhost_f2bf(f);
#else
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
#endif
}

#define MB_FULL_MASK 0xffffffffu

// uint4 = 8 bf16; element 2i is the low half of word i (little-endian)
__device__ __forceinline__ void unpack8(uint4 v, float f[8]) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint4 pack8(const bf16 y[8]) {
    uint4 o;
    o.x = y[0] | ((unsigned)y[1] << 16);
    o.y = y[2] | ((unsigned)y[3] << 16);
    o.z = y[4] | ((unsigned)y[5] << 16);
    o.w = y[6] | ((unsigned)y[7] << 16);
    return o;
}

// ---- Memory primitives for cross-block and cross-GPU protocols (queues,
// flags, counters). Pointers are generic addresses: device memory, a peer
// GPU's memory (where peer access is enabled) or host-mapped memory. PTX
// ISA 6.0+, sm_70 and newer. On the host simulation they are C++ atomics
// with the same ordering, and each lets other threads run — a spin loop
// must use them (a plain or volatile C++ load in a loop never yields).
//   ld/st .volatile: not cached, not reordered with each other (no order
//     for other memory); .relaxed.sys: atomic, no ordering;
//   ld.acquire: later accesses stay after it; st.release: earlier accesses
//     stay before it (gpu: seen in this order by this GPU; sys: by peers
//     and the host as well).
#ifdef MB_HOST
#define MB_LD(T, p, o) return mbhost_load<T>(p, std::memory_order_##o)
#define MB_ST(T, p, v, o) mbhost_store<T>(p, v, std::memory_order_##o)
#endif

// mb_ld_early_f32 loads a float of read-only data where it stands in the
// source: an asm statement the compiler keeps in its place, not sunk to
// the value's first use past branches (expf's and division's), so that its
// latency overlaps the loads issued with it. Not a memory-model primitive.
__device__ __forceinline__ float mb_ld_early_f32(const float *p) {
#ifdef MB_HOST
    return *p;
#else
    float v;
    asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
#endif
}

__device__ __forceinline__ int mb_ld_volatile(const int *p) {
#ifdef MB_HOST
    MB_LD(int, p, relaxed);
#else
    int v;
    asm volatile("ld.volatile.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#endif
}
__device__ __forceinline__ int mb_ld_acquire_gpu(const int *p) {
#ifdef MB_HOST
    MB_LD(int, p, acquire);
#else
    int v;
    asm volatile("ld.acquire.gpu.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#endif
}
__device__ __forceinline__ int mb_ld_acquire_sys(const int *p) {
#ifdef MB_HOST
    MB_LD(int, p, acquire);
#else
    int v;
    asm volatile("ld.acquire.sys.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#endif
}
__device__ __forceinline__ unsigned long long mb_ld_acquire_sys_u64(const unsigned long long *p) {
#ifdef MB_HOST
    MB_LD(unsigned long long, p, acquire);
#else
    unsigned long long v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
#endif
}
__device__ __forceinline__ void mb_st_volatile(int *p, int v) {
#ifdef MB_HOST
    MB_ST(int, p, v, relaxed);
#else
    asm volatile("st.volatile.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#endif
}
__device__ __forceinline__ void mb_st_relaxed_sys(int *p, int v) {
#ifdef MB_HOST
    MB_ST(int, p, v, relaxed);
#else
    asm volatile("st.relaxed.sys.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#endif
}
__device__ __forceinline__ void mb_st_release_gpu(int *p, int v) {
#ifdef MB_HOST
    MB_ST(int, p, v, release);
#else
    asm volatile("st.release.gpu.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#endif
}
__device__ __forceinline__ void mb_st_release_sys(int *p, int v) {
#ifdef MB_HOST
    MB_ST(int, p, v, release);
#else
    asm volatile("st.release.sys.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#endif
}
__device__ __forceinline__ void mb_st_release_sys_u64(unsigned long long *p, unsigned long long v) {
#ifdef MB_HOST
    MB_ST(unsigned long long, p, v, release);
#else
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
}
// system-scope atomics (peers' and host-mapped memory; the host sees them
// atomic only where the platform has native host atomics): relaxed add and
// exchange, release add, acquire-release compare-and-swap; each returns the
// old value
__device__ __forceinline__ int mb_atomic_add_sys(int *p, int v) {
#ifdef MB_HOST
    return atomicAdd(p, v);
#else
    int old;
    asm volatile("atom.relaxed.sys.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
#endif
}
__device__ __forceinline__ int mb_atomic_add_release_sys(int *p, int v) {
#ifdef MB_HOST
    mbhost_release_point();
    return mbhost::rmw(p, [&](std::atomic_ref<int> a) { return a.fetch_add(v, std::memory_order_release); });
#else
    int old;
    asm volatile("atom.release.sys.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
#endif
}
__device__ __forceinline__ int mb_atomic_cas_sys(int *p, int cmp, int v) {
#ifdef MB_HOST
    mbhost_release_point();
    return mbhost::rmw(p, [&](std::atomic_ref<int> a) {
        a.compare_exchange_strong(cmp, v, std::memory_order_acq_rel, std::memory_order_acquire);
        return cmp;
    });
#else
    int old;
    asm volatile("atom.acq_rel.sys.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(p), "r"(cmp), "r"(v) : "memory");
    return old;
#endif
}
__device__ __forceinline__ int mb_atomic_exch_sys(int *p, int v) {
#ifdef MB_HOST
    return atomicExch(p, v);
#else
    int old;
    asm volatile("atom.relaxed.sys.exch.b32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
#endif
}
__device__ __forceinline__ unsigned long long mb_atomic_add_sys_u64(unsigned long long *p, unsigned long long v) {
#ifdef MB_HOST
    return atomicAdd(p, v);
#else
    unsigned long long old;
    asm volatile("atom.relaxed.sys.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    return old;
#endif
}
// mb_ld_cg: 16 bytes from global memory through L2, not L1 (ld.global.cg):
// data another GPU or block wrote since this SM last read the line (a
// queue's slots, read after acquiring its tail)
__device__ __forceinline__ uint4 mb_ld_cg(const uint4 *p) {
#ifdef MB_HOST
    return *p;
#else
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#endif
}
// mb_bar_sync: named barrier id (1 to 15; 0 is __syncthreads) for the first
// threads (a multiple of 32) of the block that reach it: a group of warps
// meets without the rest of the block
__device__ __forceinline__ void mb_bar_sync(int id, int threads) {
#ifdef MB_HOST
    mbhost_bar_sync(id, threads);
#else
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
#endif
}

// fences: all of this thread's earlier accesses before all later ones, as
// seen by this GPU (gpu) or by peers and the host too (sys)
__device__ __forceinline__ void mb_fence_gpu() { __threadfence(); }
__device__ __forceinline__ void mb_fence_sys() { __threadfence_system(); }

// mb_globaltimer: nanoseconds of the GPU's global timer (the host
// simulation's monotonic clock)
__device__ __forceinline__ unsigned long long mb_globaltimer() {
#ifdef MB_HOST
    return mbhost_globaltimer();
#else
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#endif
}
__device__ __forceinline__ void mb_nanosleep(unsigned ns) {
#ifdef MB_HOST
    mbhost_nanosleep(ns);
#else
    asm volatile("nanosleep.u32 %0;" ::"r"(ns));
#endif
}
// mb_dynamic_smem: the block's dynamic shared memory (the launch's
// sharedMemBytes), 16-byte aligned
__device__ __forceinline__ unsigned char *mb_dynamic_smem() {
#ifdef MB_HOST
    return mbhost_dynamic_smem();
#else
    extern __shared__ __align__(16) unsigned char mb_smem_[];
    return mb_smem_;
#endif
}

// ---- Cross-rank waits with a timeout (comm.Signals on the host).
// Every wait on another rank (a flag, a queue's head or tail, a barrier)
// goes through mb_wait: it gives up after the communicator's timeout, or
// at once when any rank (or the host) has given up, records why in the
// rank's error record in host-mapped memory, and returns false; the kernel
// then stops waiting and leaves (the threads of its block still meet at
// their __syncthreads: skip the work, not the barriers). The host reads the
// records after synchronizing (or while it polls a counter) and reports
// the rank, phase and wait.
#define MB_ERR_TIMEOUT 1 // this rank's wait expired
#define MB_ERR_ABORTED 2 // it gave up because another rank (or the host) did
#define MB_ERR_CHECK 3   // a value it read was not the one the protocol promised (mb_check)

// mb_error: a rank's error record (comm.CommError), 48 bytes
typedef struct {
    int status; // 0, MB_ERR_TIMEOUT, MB_ERR_ABORTED or MB_ERR_CHECK
    int rank, phase, wait;
    int block, thread;
    long long seen, expected; // the value read last, the value waited for
    unsigned long long waited_ns;
} mb_error;

// mb_signals: the host-mapped memory of one communicator: the abort word,
// then its ranks' error records, then counters the host polls
typedef struct {
    int abort; // nonzero: every wait gives up
    int ranks, counters, pad;
} mb_signals;
__device__ __forceinline__ mb_error *mb_error_of(mb_signals *s, int rank) { return (mb_error *)(s + 1) + rank; }
__device__ __forceinline__ int *mb_counter(mb_signals *s, int ranks, int i) { return (int *)((mb_error *)(s + 1) + ranks) + i; }

// mb_comm: what a kernel needs to wait across ranks (a kernel argument,
// comm.Signals.Comm): the signals, one claim word per rank in the
// launch's GPU memory (zero before the launch; it elects the one thread
// of a rank that writes its record) and the timeout of each wait
typedef struct {
    mb_signals *sig;
    int *claims;
    unsigned long long timeout_ns;
} mb_comm;

// mb_block_index, mb_thread_index: the block's index in the grid and the
// thread's in its block, flattened. Read through volatile asm on the
// device, so that the compiler cannot hoist them out of a loop around a
// wait (they are only needed when it gives up): hoisted, they hold two
// registers through the loop, which pushed other values of a kernel at its
// register bound to the stack.
__device__ __forceinline__ int mb_block_index() {
#ifdef MB_HOST
    return (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
#else
    unsigned x, y, z, nx, ny;
    asm volatile("mov.u32 %0, %%ctaid.x;\n\tmov.u32 %1, %%ctaid.y;\n\tmov.u32 %2, %%ctaid.z;\n\tmov.u32 %3, %%nctaid.x;\n\tmov.u32 %4, %%nctaid.y;"
                 : "=r"(x), "=r"(y), "=r"(z), "=r"(nx), "=r"(ny));
    return (int)(x + nx * (y + ny * z));
#endif
}
__device__ __forceinline__ int mb_thread_index() {
#ifdef MB_HOST
    return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
#else
    unsigned x, y, z, nx, ny;
    asm volatile("mov.u32 %0, %%tid.x;\n\tmov.u32 %1, %%tid.y;\n\tmov.u32 %2, %%tid.z;\n\tmov.u32 %3, %%ntid.x;\n\tmov.u32 %4, %%ntid.y;"
                 : "=r"(x), "=r"(y), "=r"(z), "=r"(nx), "=r"(ny));
    return (int)(x + nx * (y + ny * z));
#endif
}

// mb_give_up records why rank gives up (once per rank) and makes every
// other wait of the communicator give up too.
__device__ inline void mb_give_up(const mb_comm &c, int rank, int status, int phase, int wait, long long seen,
                                  long long expected, unsigned long long waited) {
    if (atomicCAS(c.claims + rank, 0, 1) == 0) {
        mb_error *e = mb_error_of(c.sig, rank);
        mb_st_volatile(&e->rank, rank);
        mb_st_volatile(&e->phase, phase);
        mb_st_volatile(&e->wait, wait);
        mb_st_volatile(&e->block, mb_block_index());
        mb_st_volatile(&e->thread, mb_thread_index());
        *(volatile long long *)&e->seen = seen;
        *(volatile long long *)&e->expected = expected;
        *(volatile unsigned long long *)&e->waited_ns = waited;
        mb_fence_sys();
        mb_st_volatile(&e->status, status); // last: the host reads the fields once it sees it
    }
    mb_st_volatile(&c.sig->abort, 1);
    mb_fence_sys();
}

__device__ __forceinline__ bool mb_aborted(const mb_comm &c) { return mb_ld_volatile(&c.sig->abort) != 0; }

// mb_check: when seen is not expected, records that rank's check (phase,
// wait) failed — a broken protocol delivered the wrong value — aborts the
// communicator and returns false.
__device__ inline bool mb_check(const mb_comm &c, int rank, int phase, int wait, long long seen, long long expected) {
    if (seen == expected) return true;
    mb_give_up(c, rank, MB_ERR_CHECK, phase, wait, seen, expected, 0);
    return false;
}

// mb_wait spins until done(load()) is true, and returns true; or gives up
// (see above) after the timeout or when the communicator aborted, and
// returns false. phase and wait name the wait in the record (the
// dispatcher's numbering); expected is the value waited for, for it.
// The clock is read every 64 loads; the abort word, in host memory (a
// read crosses PCIe), only every MB_ABORT_POLL_LOADS loads: thousands of warps spinning on
// shared memory and reading it every 64 loads flooded the GPU's path to
// host memory on an H200 (deepep's combine and hybridep's kernels ran 40
// to 200 times slower, gpu-check 2026-11-27); a healthy wait ends before
// its first read (4096 loads: about 100 µs of spinning on shared memory).
// (The load count alone spaces the reads: a time kept through the loop, or
// compared there, put deepep's kernels on the stack.) The loop only leaves
// with the status and values of its give-up, to one mb_give_up after it:
// with one inlined in each of its two exits, NVRTC 12.4 kept 8 bytes of
// deepep_notify's registers on the stack around the record's stores.
#ifndef MB_ABORT_POLL_LOADS
#define MB_ABORT_POLL_LOADS 4096u
#endif
template <class Load, class Done>
__device__ inline bool mb_wait(const mb_comm &c, int rank, int phase, int wait, long long expected, Load load, Done done) {
    const unsigned long long start = mb_globaltimer();
    long long v;
    unsigned long long waited;
    int status;
    for (unsigned i = 1;; i++) {
        v = load();
        if (done(v)) return true;
        if (i % 64 == 0) {
            waited = mb_globaltimer() - start;
            if (i % MB_ABORT_POLL_LOADS == 0 && mb_aborted(c)) {
                status = MB_ERR_ABORTED;
                break;
            }
            if (waited > c.timeout_ns) {
                status = MB_ERR_TIMEOUT;
                break;
            }
        }
    }
    mb_give_up(c, rank, status, phase, wait, v, expected, waited);
    return false;
}
// mb_wait_ge: until *p ≥ want (acquire, system scope)
__device__ __forceinline__ bool mb_wait_ge(const mb_comm &c, int rank, int phase, int wait, const int *p, int want) {
    return mb_wait(c, rank, phase, wait, want, [p] { return (long long)mb_ld_acquire_sys(p); },
                   [want](long long v) { return v >= want; });
}
// mb_wait_eq: until *p == want (acquire, system scope)
__device__ __forceinline__ bool mb_wait_eq(const mb_comm &c, int rank, int phase, int wait, const int *p, int want) {
    return mb_wait(c, rank, phase, wait, want, [p] { return (long long)mb_ld_acquire_sys(p); },
                   [want](long long v) { return v == want; });
}

// mb_barrier: no rank of ranks leaves before all have arrived. flags[r]
// (a device table of peer pointers) is rank r's array of ranks ints in its
// memory, zeroed before first use; epoch numbers the barrier's uses from
// 1. One thread of the rank calls it (the block meets it at a
// __syncthreads). The wait for rank p's flag is wait + p. It returns false
// when a wait gave up.
__device__ inline bool mb_barrier(const mb_comm &c, int rank, int ranks, int phase, int wait, int *const *flags, int epoch) {
    for (int p = 0; p < ranks; p++) mb_st_release_sys(flags[p] + rank, epoch);
    for (int p = 0; p < ranks; p++)
        if (!mb_wait_ge(c, rank, phase, wait + p, flags[rank] + p, epoch)) return false;
    return true;
}

// ---- Shared-memory FIFOs: mbarriers and bulk copies (HybridEP's TMA
// pipeline). An mbarrier (mb_mbar, 8 bytes of shared memory) counts the
// arrivals of a phase and, with bulk copies, the bytes still to land (the
// transaction count): a phase completes when both are in, and a waiter
// tests a phase by its parity. A FIFO slot has a full barrier (the
// producer's arrival and its copy's bytes) and an empty one (its
// consumers' arrivals); see hybridep.cu.
//   MB_BULK (sm_90 and newer, compiled by NVRTC ≥ 12, whose PTX ISA ≥ 8.0
//   has cp.async.bulk): one thread moves a row global→shared with
//   cp.async.bulk, whose complete_tx counts its bytes on the full barrier,
//   and shared→global with cp.async.bulk's bulk-group form (peers'
//   memory too).
//   Otherwise (sm_80, or NVRTC 11.8 for any architecture): the warp moves
//   rows with 16-byte loads and stores, and every lane arrives.
// On the host simulation (MB_HOST) the bulk path is the stand-in of
// mbhost.h, which checks the ordering rules; -DMB_NO_BULK=1 selects the
// other path (there, or on a GPU). Shared-memory accesses of FIFO slots go
// through mb_lds16 and mb_sts16, so that the stand-in sees them too.
#if !(defined(MB_NO_BULK) && MB_NO_BULK) &&                                                                           \
    (defined(MB_HOST) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDACC_VER_MAJOR__) &&          \
                          __CUDACC_VER_MAJOR__ >= 12))
#define MB_BULK 1
#endif

typedef unsigned long long mb_mbar;

#ifndef MB_HOST
__device__ __forceinline__ unsigned mb_smem(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
#endif

// mb_mbar_init: one thread, before any use; the block then meets at a
// __syncthreads (mb_mbar_init_fence first on the bulk path: the
// initialisation made visible to the copies).
__device__ __forceinline__ void mb_mbar_init(mb_mbar *b, int count) {
#ifdef MB_HOST
    mbhost_mbar_init(b, count);
#else
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(mb_smem(b)), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mb_mbar_init_fence() {
#if defined(MB_BULK) && !defined(MB_HOST)
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// mb_mbar_arrive: this thread's arrival (release: its earlier shared
// stores are seen by whoever sees the phase complete)
__device__ __forceinline__ void mb_mbar_arrive(mb_mbar *b) {
#ifdef MB_HOST
    mbhost_mbar_arrive(b, 0);
#else
    asm volatile("mbarrier.arrive.shared.b64 _, [%0];" ::"r"(mb_smem(b)) : "memory");
#endif
}
// mb_mbar_test: has the phase of this parity completed? (acquire)
__device__ __forceinline__ bool mb_mbar_test(mb_mbar *b, int parity) {
#ifdef MB_HOST
    return mbhost_mbar_test(b, parity);
#else
    unsigned done;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(mb_smem(b)), "r"(parity) : "memory");
#else
    asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(mb_smem(b)), "r"(parity) : "memory");
#endif
    return done != 0;
#endif
}
// mb_mbar_wait: until the phase of this parity completes, with the
// communicator's timeout (mb_wait; false when it gave up)
__device__ __forceinline__ bool mb_mbar_wait(const mb_comm &c, int rank, int phase, int wait, mb_mbar *b, int parity) {
    return mb_wait(c, rank, phase, wait, parity, [b, parity] { return (long long)mb_mbar_test(b, parity); },
                   [](long long v) { return v != 0; });
}

// 16-byte shared-memory accesses of FIFO slots
__device__ __forceinline__ uint4 mb_lds16(const void *p) {
#ifdef MB_HOST
    return mbhost_lds16(p);
#else
    return *(const uint4 *)p;
#endif
}
__device__ __forceinline__ void mb_sts16(void *p, uint4 v) {
#ifdef MB_HOST
    mbhost_sts16(p, v);
#else
    *(uint4 *)p = v;
#endif
}

#ifdef MB_BULK
// mb_mbar_arrive_expect_tx: this thread's arrival, expecting bytes more
// from copies in this phase
__device__ __forceinline__ void mb_mbar_arrive_expect_tx(mb_mbar *b, unsigned bytes) {
#ifdef MB_HOST
    mbhost_mbar_arrive(b, bytes);
#else
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mb_smem(b)), "r"(bytes) : "memory");
#endif
}
// mb_bulk_g2s: bytes (a multiple of 16, both addresses 16-byte aligned)
// from global (or a peer's) memory into shared memory; their arrival
// completes on b (complete_tx)
__device__ __forceinline__ void mb_bulk_g2s(void *dst, const void *src, unsigned bytes, mb_mbar *b) {
#ifdef MB_HOST
    mbhost_bulk_g2s(dst, src, bytes, b);
#else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(mb_smem(dst)),
                 "l"(src), "r"(bytes), "r"(mb_smem(b))
                 : "memory");
#endif
}
// mb_bulk_s2g: bytes from shared memory into global (or a peer's) memory,
// in the thread's open bulk group
__device__ __forceinline__ void mb_bulk_s2g(void *dst, const void *src, unsigned bytes) {
#ifdef MB_HOST
    mbhost_bulk_s2g(dst, src, bytes);
#else
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(mb_smem(src)), "r"(bytes)
                 : "memory");
#endif
}
// mb_bulk_commit closes the thread's bulk group; mb_bulk_wait_read waits
// until every committed group has read its shared memory (the slot may
// be released), mb_bulk_wait until their writes are done too (then a
// release makes them visible)
__device__ __forceinline__ void mb_bulk_commit() {
#ifdef MB_HOST
    mbhost_bulk_commit();
#else
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void mb_bulk_wait_read() {
#ifdef MB_HOST
    mbhost_bulk_wait(true, 0);
#else
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
#endif
}
// mb_bulk_wait_read_n<P>: as mb_bulk_wait_read for all but the P most
// recently committed groups (those may still be reading)
template <int P> __device__ __forceinline__ void mb_bulk_wait_read_n() {
#ifdef MB_HOST
    mbhost_bulk_wait(true, P);
#else
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(P) : "memory");
#endif
}
// mb_bulk_wait: the writes are done too, as seen by this thread: its own
// release (a fence, or a release store or atomic) then publishes them to
// other threads and ranks — not another thread's after a __syncthreads
__device__ __forceinline__ void mb_bulk_wait() {
#ifdef MB_HOST
    mbhost_bulk_wait(false, 0);
#else
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}
#endif // MB_BULK

// mb_fence_proxy_async: this thread's generic-proxy accesses (plain loads
// and stores, global or shared) ordered with its async-proxy ones (bulk
// copies): data stored with plain stores and then read by a bulk copy,
// of any thread once a release/acquire orders them, needs it after the
// stores (PTX's proxy rule), and a thread that acquired such data before
// its own bulk copies read it needs it too. No-op on the 16-byte path.
__device__ __forceinline__ void mb_fence_proxy_async() {
#ifdef MB_BULK
#ifdef MB_HOST
    mbhost_fence_proxy_async();
#else
    asm volatile("fence.proxy.async;" ::: "memory");
#endif
#endif
}
// mb_stg16: a 16-byte plain store to global (or a peer's) memory that a
// bulk copy may read later (the host simulation tracks it until the
// storing thread's mb_fence_proxy_async)
__device__ __forceinline__ void mb_stg16(void *p, uint4 v) {
#ifdef MB_HOST
    mbhost_stg16(p, v);
#else
    *(uint4 *)p = v;
#endif
}

// mb_fifo: a ring of `stages` slots of `slot` bytes (16-byte multiples) in
// dynamic shared memory, between one producer warp and C consumer warps.
// The k-th item of consumer c goes to slot c + C·(k mod stages/C), round
// k / (stages/C) (mb_fifo_item; stages a multiple of C): each slot has one
// consumer, which takes its rounds in order, so that a parity wait never
// takes a phase two rounds old for its own (a consumer that ran ahead of
// a slot shared with others would). The producer waits for the slot's
// empty barrier (its previous round released), fills it and arrives on
// its full barrier; the consumer waits for the full barrier, uses the slot
// and releases it (arrives on the empty barrier). Every wait is timed
// (mb_mbar_wait): a function returns false when its wait gave up, and the
// warp then stops.
#ifdef MB_BULK
#define MB_FIFO_PRODUCERS 1 // lane 0 arrives, expecting the copies' bytes
#else
#define MB_FIFO_PRODUCERS 32 // every lane arrives after its stores
#define MB_FIFO_UNROLL 4     // a lane's 16-byte loads in flight as it fills a slot
#endif
typedef struct {
    unsigned char *data;
    mb_mbar *full, *empty;
    int stages;
    unsigned slot;
} mb_fifo;

// mb_fifo_at lays a FIFO out at smem (every thread): the barriers in
// 16·stages bytes, then the slots (comm.FIFOBytes); mb_fifo_init
// initialises its barriers (one thread, then mb_mbar_init_fence and a
// __syncthreads): consumers is the arrivals that release a slot.
__device__ __forceinline__ mb_fifo mb_fifo_at(unsigned char *smem, int stages, unsigned slot) {
    mb_fifo f;
    f.full = (mb_mbar *)smem;
    f.empty = f.full + stages;
    f.data = smem + 16 * stages;
    f.stages = stages, f.slot = slot;
    return f;
}
__device__ inline void mb_fifo_init(const mb_fifo &f, int consumers) {
    for (int s = 0; s < f.stages; s++) {
        mb_mbar_init(f.full + s, MB_FIFO_PRODUCERS);
        mb_mbar_init(f.empty + s, consumers);
    }
}
// mb_fifo_item: the slot and round of consumer c's k-th item (of C consumers)
typedef struct {
    int slot, round;
} mb_item;
__device__ __forceinline__ mb_item mb_fifo_item(const mb_fifo &f, int consumers, int c, long long k) {
    const int per = f.stages / consumers;
    mb_item it;
    it.slot = c + consumers * (int)(k % per), it.round = (int)(k / per);
    return it;
}
__device__ __forceinline__ unsigned char *mb_fifo_slot(const mb_fifo &f, mb_item it) { return f.data + it.slot * f.slot; }

// mb_fifo_put: the producer warp (all lanes) puts an item: parts pieces,
// piece k the bytes[k] bytes at src[k] (global or a peer's memory, 16-byte
// aligned), one after another from the slot's start. expect adjusts the
// byte count the full barrier expects (0; the tests break it on purpose),
// wait_empty = false skips the wait for the slot's release and arrive =
// false the arrival (the tests again).
__device__ inline bool mb_fifo_put(const mb_fifo &f, const mb_comm &c, int rank, int phase, int wait, mb_item it, int parts,
                                   const void *const *src, const unsigned *bytes, int expect = 0, bool wait_empty = true,
                                   bool arrive = true) {
    const int parity = (it.round & 1) ^ 1;
    unsigned char *dst = mb_fifo_slot(f, it);
    const int lane = threadIdx.x % 32;
#ifdef MB_BULK
    int ok = 1;
    if (lane == 0) {
        if (wait_empty) ok = mb_mbar_wait(c, rank, phase, wait, f.empty + it.slot, parity);
        if (ok) {
            unsigned total = 0;
            for (int k = 0; k < parts; k++) total += bytes[k];
            if (arrive) mb_mbar_arrive_expect_tx(f.full + it.slot, total + expect);
            for (int k = 0, off = 0; k < parts; off += bytes[k], k++) mb_bulk_g2s(dst + off, src[k], bytes[k], f.full + it.slot);
        }
    }
    return __shfl_sync(MB_FULL_MASK, ok, 0) != 0;
#else
    (void)expect;
    int ok = wait_empty ? mb_mbar_wait(c, rank, phase, wait, f.empty + it.slot, parity) : 1;
    if (!__all_sync(MB_FULL_MASK, ok)) return false;
    // each lane's MB_FIFO_UNROLL 16-byte loads issued together, then
    // stored into the slot (issue 32: one at a time kept a lane's loads
    // waiting on each other); the arrival, after every store, as before
    for (int k = 0, off = 0; k < parts; off += bytes[k], k++) {
        const unsigned char *s = (const unsigned char *)src[k];
        for (unsigned b0 = 16 * lane; b0 < bytes[k]; b0 += MB_FIFO_UNROLL * 16 * 32) {
            uint4 v[MB_FIFO_UNROLL];
#pragma unroll
            for (int u = 0; u < MB_FIFO_UNROLL; u++)
                if (b0 + u * 16 * 32 < bytes[k]) v[u] = *(const uint4 *)(s + b0 + u * 16 * 32);
#pragma unroll
            for (int u = 0; u < MB_FIFO_UNROLL; u++)
                if (b0 + u * 16 * 32 < bytes[k]) mb_sts16(dst + off + b0 + u * 16 * 32, v[u]);
        }
    }
    if (arrive) mb_mbar_arrive(f.full + it.slot);
    return true;
#endif
}
// mb_fifo_wait: the consumer lanes that call it wait until the item is in
// its slot; it returns the slot (null when the wait gave up)
__device__ inline unsigned char *mb_fifo_wait(const mb_fifo &f, const mb_comm &c, int rank, int phase, int wait, mb_item it) {
    if (!mb_mbar_wait(c, rank, phase, wait, f.full + it.slot, it.round & 1)) return nullptr;
    return mb_fifo_slot(f, it);
}
// mb_fifo_release: a consumer's arrival that releases the item's slot (its
// reads of the slot done; a bulk store's read waited for first)
__device__ __forceinline__ void mb_fifo_release(const mb_fifo &f, mb_item it) { mb_mbar_arrive(f.empty + it.slot); }
