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
    return mbhost::rmw(p, [&](std::atomic_ref<int> a) { return a.fetch_add(v, std::memory_order_release); });
#else
    int old;
    asm volatile("atom.release.sys.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
#endif
}
__device__ __forceinline__ int mb_atomic_cas_sys(int *p, int cmp, int v) {
#ifdef MB_HOST
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

// ---- Cross-rank waits with a timeout (kernels.Signals on the host).
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

// mb_error: a rank's error record (kernels.CommError), 48 bytes
typedef struct {
    int status; // 0, MB_ERR_TIMEOUT or MB_ERR_ABORTED
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
// kernels.Signals.Comm): the signals, one claim word per rank in the
// launch's GPU memory (zero before the launch; it elects the one thread
// of a rank that writes its record) and the timeout of each wait
typedef struct {
    mb_signals *sig;
    int *claims;
    unsigned long long timeout_ns;
} mb_comm;

// mb_give_up records why rank gives up (once per rank) and makes every
// other wait of the communicator give up too.
__device__ inline void mb_give_up(const mb_comm &c, int rank, int status, int phase, int wait, long long seen,
                                  long long expected, unsigned long long waited) {
    if (atomicCAS(c.claims + rank, 0, 1) == 0) {
        mb_error *e = mb_error_of(c.sig, rank);
        mb_st_volatile(&e->rank, rank);
        mb_st_volatile(&e->phase, phase);
        mb_st_volatile(&e->wait, wait);
        mb_st_volatile(&e->block, (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)));
        mb_st_volatile(&e->thread, (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)));
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

// mb_wait spins until done(load()) is true, and returns true; or gives up
// (see above) after the timeout or when the communicator aborted, and
// returns false. phase and wait name the wait in the record (the
// dispatcher's numbering); expected is the value waited for, for it.
template <class Load, class Done>
__device__ inline bool mb_wait(const mb_comm &c, int rank, int phase, int wait, long long expected, Load load, Done done) {
    const unsigned long long start = mb_globaltimer();
    for (unsigned i = 1;; i++) {
        const long long v = load();
        if (done(v)) return true;
        if (i % 64 == 0) { // the clock and the abort word now and then
            const unsigned long long waited = mb_globaltimer() - start;
            if (mb_aborted(c)) {
                mb_give_up(c, rank, MB_ERR_ABORTED, phase, wait, v, expected, waited);
                return false;
            }
            if (waited > c.timeout_ns) {
                mb_give_up(c, rank, MB_ERR_TIMEOUT, phase, wait, v, expected, waited);
                return false;
            }
        }
    }
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
