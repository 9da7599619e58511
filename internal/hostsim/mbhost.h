// mbhost.h: runs moebench's CUDA kernels on the CPU, for the tests only
// (internal/hostsim). The kernel sources are compiled unchanged by a C++
// compiler with this header included first and MB_HOST defined (which
// moebench.cuh checks for its inline PTX).
//
// Concurrency as a GPU has it. The fake libcuda (fakes/fakecuda.c) places
// a launch's blocks on its fake device's SMs as a GPU would (a block takes
// threads, registers and shared memory of one SM until it ends), and runs
// each resident block on an OS thread of its own: every block that fits the
// device runs at the same time as the others, later ones in waves as
// earlier ones end, and launches on different streams (of one fake GPU or
// of several) overlap in time. Within a block every CUDA thread is a fiber
// (its own stack, switched with _setjmp/_longjmp) on the block's OS thread:
// a thread runs until it reaches __syncthreads, a warp-wide intrinsic
// (shuffles, ballots, reductions, __syncwarp) or a memory primitive of
// moebench.cuh (mb_ld_*, mb_st_*, mb_atomic_*, mb_nanosleep), where the next
// fiber runs; a barrier that some threads never reach — a hang on a GPU — is
// reported and fails the launch. __shared__ variables are thread_local: one
// copy per resident block. Memory primitives are C++ atomics
// (std::atomic_ref) with the ordering PTX gives them, so that blocks on
// different OS threads (and different fake GPUs) really race; a thread that
// spins on a flag lets the block's other threads and the OS's other threads
// run. A block whose every thread does nothing but spin for
// MBHOST_SPIN_LIMIT_S seconds (default 60) is stopped and fails the launch,
// so that a kernel without a timeout cannot hang the tests.
//
// Floating point is the host's (expf may differ from the GPU's in the last
// bit). Not modelled: the GPU's weaker ordering of plain loads and stores
// (x86 orders more than PTX requires), warps' lock-step execution, clusters'
// distributed shared memory.
#pragma once
#include <atomic>
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include <tuple>
#include <type_traits>
#include <ucontext.h>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static thread_local
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct uint4 { unsigned x, y, z, w; };
struct mbhost_dim3 { unsigned x = 1, y = 1, z = 1; };

// The launch the fake driver asks a module's kernel to run: the grid and
// block, the dynamic shared memory and the cluster shape (0: none).
struct mbhost_geom {
    unsigned gx, gy, gz, bx, by, bz, smem, cx, cy, cz;
};

// mbhost_kernel is what a module exports for each kernel (as
// mbhost_kernel_NAME), the ABI between the module and the fake driver.
#define MBHOST_ABI 2
struct mbhost_kernel {
    unsigned abi;
    int max_threads; // __launch_bounds__'s first argument, 0 without
    int min_blocks;  // its second, 0 without
    int regs;        // the modelled registers per thread (see mbhost::regs_for)
    void *(*bind)(void **params); // copies the arguments (cuLaunchKernel's params) for a later run
    void (*unbind)(void *args);
    // run runs blocks on the calling OS thread, each the block next(sched)
    // returns (a linear block index), until it returns −1; it returns 0,
    // 1 when the block is not whole warps or there is no memory, 2 when
    // threads stopped at barriers they cannot pass, 3 when the block spun
    // past the spin limit.
    int (*run)(void *args, const mbhost_geom *g, int (*next)(void *sched), void *sched);
};

namespace mbhost {

// barrier: n threads wait until all n have arrived; reusable.
struct barrier {
    unsigned n = 0, arrived = 0, generation = 0;
};

// warp: the barrier of one warp's 32 threads and their exchange slots,
// two sets used in turn (a thread may write the next exchange's slot
// before the others have read this one's).
struct warp {
    barrier bar;
    uint64_t slot[2][32];
};

struct fiber {
    ucontext_t start;
    jmp_buf at;
    char *stack = nullptr;
    bool started = false, finished = false;
    const barrier *blocked = nullptr; // waiting for its generation to change
    unsigned gen = 0;
    mbhost_dim3 tid;
    unsigned linear = 0; // the thread's index in its block
};

// worker is the state of one OS thread running blocks (one resident block
// at a time).
struct worker {
    fiber *self = nullptr;
    jmp_buf scheduler;
    mbhost_dim3 bdim, gdim, bid, cdim;
    barrier *blockSync = nullptr;
    warp *warps = nullptr;
    void (*body)(void *) = nullptr; // the kernel with its arguments
    void *arg = nullptr;
    unsigned char *dsmem = nullptr; // dynamic shared memory
    bool spun = false;              // the running fiber yielded in a spin primitive
    bool stopping = false;          // fibers leave their loop
};
inline constinit thread_local worker w{};

inline void yield() {
    if (!_setjmp(w.self->at)) _longjmp(w.scheduler, 1);
}

// spin yields from a memory primitive: the fiber may be waiting for
// another thread, block or GPU to write.
inline void spin() {
    w.spun = true;
    yield();
}

inline void wait(barrier &b) {
    const unsigned g = b.generation;
    if (++b.arrived == b.n) {
        b.arrived = 0;
        b.generation++;
        return;
    }
    w.self->blocked = &b;
    w.self->gen = g;
    yield();
}

inline unsigned lane() { return w.self->linear % 32; }

// exchange publishes this lane's value and returns every lane's.
inline void exchange(uint64_t v, uint64_t out[32]) {
    warp &wp = w.warps[w.self->linear / 32];
    uint64_t *s = wp.slot[wp.bar.generation & 1];
    s[lane()] = v;
    wait(wp.bar);
    std::memcpy(out, s, sizeof wp.slot[0]);
}

template <class T> uint64_t bits(T v) {
    static_assert(sizeof(T) <= 8, "a register value");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof v);
    return u;
}
template <class T> T from(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof v);
    return v;
}

// a fiber runs the kernel once per block, then parks until the next block
// (or until the worker stops, when it is dropped with its stack).
inline void entry() {
    for (;;) {
        w.body(w.arg);
        w.self->finished = true;
        yield();
    }
}

// stacks: fiber stacks, kept for reuse (their pages stay mapped).
constexpr size_t stackBytes = 64 << 10;
inline std::mutex stackMu;
inline std::vector<char *> stackPool;

inline char *takeStack() {
    {
        std::lock_guard<std::mutex> l(stackMu);
        if (!stackPool.empty()) {
            char *s = stackPool.back();
            stackPool.pop_back();
            return s;
        }
    }
    void *m = mmap(nullptr, stackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return m == MAP_FAILED ? nullptr : static_cast<char *>(m);
}
inline void giveStacks(std::vector<fiber> &fs) {
    std::lock_guard<std::mutex> l(stackMu);
    for (auto &f : fs)
        if (f.stack) stackPool.push_back(f.stack);
}

inline uint64_t nowNs() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

inline double spinLimitS() {
    const char *e = std::getenv("MBHOST_SPIN_LIMIT_S");
    double v = e ? std::atof(e) : 0;
    return v > 0 ? v : 60;
}

// block runs the worker's fibers through one block. 0, 2 (stuck at
// barriers) or 3 (spun past the limit).
inline int block(std::vector<fiber> &fs) {
    unsigned live = fs.size();
    uint64_t spinning = 0; // when every runnable thread began to only spin
    const double limit = spinLimitS();
    ucontext_t here;
    for (auto &f : fs) f.finished = false, f.blocked = nullptr;
    while (live > 0) {
        bool ran = false, moved = false;
        for (auto &f : fs) {
            if (f.finished || (f.blocked && f.blocked->generation == f.gen)) continue;
            f.blocked = nullptr;
            w.self = &f;
            w.spun = false;
            if (!_setjmp(w.scheduler)) {
                if (!f.started) {
                    f.started = true;
                    swapcontext(&here, &f.start);
                } else {
                    _longjmp(f.at, 1);
                }
            }
            ran = true;
            moved |= !w.spun;
            if (f.finished) live--;
        }
        if (!ran) { // as a GPU would hang
            unsigned atSync = 0;
            for (auto &f : fs) atSync += !f.finished && f.blocked == w.blockSync;
            std::fprintf(stderr,
                         "mbhost: block (%u,%u,%u): %u of %zu threads cannot go on: %u at __syncthreads, the others at "
                         "the end of the block or at a warp-wide intrinsic that not all 32 lanes reach\n",
                         w.bid.x, w.bid.y, w.bid.z, live, fs.size(), atSync);
            return 2;
        }
        if (moved) {
            spinning = 0;
            continue;
        }
        // every runnable thread waits on memory that another block, GPU or
        // the host must change: let the other OS threads run
        const uint64_t now = nowNs();
        if (spinning == 0) spinning = now;
        else if ((now - spinning) / 1e9 > limit) {
            std::fprintf(stderr, "mbhost: block (%u,%u,%u): every thread spun for %.0f s without progress (a wait "
                                 "without a timeout that nothing ends; MBHOST_SPIN_LIMIT_S)\n",
                         w.bid.x, w.bid.y, w.bid.z, limit);
            return 3;
        }
        sched_yield();
    }
    return 0;
}

// run runs blocks of kernel K (arguments args) until next says there are
// no more (see mbhost_kernel.run).
template <class... A> int run(void (*k)(A...), std::tuple<std::decay_t<A>...> *args, const mbhost_geom *g,
                              int (*next)(void *), void *sched) {
    const unsigned threads = g->bx * g->by * g->bz;
    if (threads == 0 || threads > 1024 || threads % 32 != 0) return 1;
    struct ctx {
        void (*k)(A...);
        std::tuple<std::decay_t<A>...> *args;
    } c{k, args};
    w = worker{};
    w.body = [](void *p) {
        auto *c = static_cast<ctx *>(p);
        std::apply(c->k, *c->args);
    };
    w.arg = &c;
    w.bdim = {g->bx, g->by, g->bz};
    w.gdim = {g->gx, g->gy, g->gz};
    w.cdim = {g->cx ? g->cx : 1, g->cy ? g->cy : 1, g->cz ? g->cz : 1};
    std::vector<unsigned char> dyn(g->smem + 16);
    w.dsmem = dyn.data();
    barrier sync{threads};
    std::vector<warp> ws(threads / 32);
    w.blockSync = &sync;
    w.warps = ws.data();
    std::vector<fiber> fs(threads);
    ucontext_t proto;
    getcontext(&proto); // once: makecontext needs a context to start from
    for (unsigned t = 0; t < threads; t++) {
        fiber &f = fs[t];
        f.linear = t;
        f.tid = {t % g->bx, t / g->bx % g->by, t / (g->bx * g->by)};
        if (!(f.stack = takeStack())) {
            giveStacks(fs);
            return 1;
        }
        f.start = proto;
        f.start.uc_stack.ss_sp = f.stack;
        f.start.uc_stack.ss_size = stackBytes;
        f.start.uc_link = nullptr;
        makecontext(&f.start, entry, 0);
    }
    int status = 0;
    for (int b; status == 0 && (b = next(sched)) >= 0;) {
        const unsigned u = b;
        w.bid = {u % g->gx, u / g->gx % g->gy, u / (g->gx * g->gy)};
        for (auto &x : ws) x.bar = barrier{32};
        sync = barrier{threads};
        status = block(fs);
    }
    giveStacks(fs);
    w = worker{};
    return status;
}

// regs_for is the fake's register model: with __launch_bounds__(T, B) the
// most registers ptxas may give each thread so that B blocks of T threads
// fit an SM's 64 Ki (in steps of 8, at most 255); without, 32.
constexpr int regs_for(int maxThreads, int minBlocks) {
    if (maxThreads <= 0) return 32;
    const int warps = (maxThreads + 31) / 32, blocks = minBlocks > 0 ? minBlocks : 1;
    const int r = 65536 / (warps * 32 * blocks) / 8 * 8;
    return r > 255 ? 255 : r;
}

template <class F> struct ops;
template <class... A> struct ops<void (*)(A...)> {
    using args = std::tuple<std::decay_t<A>...>;
    static void *bind(void **params) {
        return [&]<size_t... I>(std::index_sequence<I...>) {
            return new args(*static_cast<std::decay_t<A> *>(params[I])...);
        }(std::index_sequence_for<A...>{});
    }
    static void unbind(void *a) { delete static_cast<args *>(a); }
    template <void (*K)(A...)> static int runK(void *a, const mbhost_geom *g, int (*next)(void *), void *s) {
        return run(K, static_cast<args *>(a), g, next, s);
    }
};

} // namespace mbhost

#define threadIdx (mbhost::w.self->tid)
#define blockIdx (mbhost::w.bid)
#define blockDim (mbhost::w.bdim)
#define gridDim (mbhost::w.gdim)

inline void __syncthreads() { mbhost::wait(*mbhost::w.blockSync); }
inline void __syncwarp(unsigned = 0xffffffffu) { mbhost::wait(mbhost::w.warps[mbhost::w.self->linear / 32].bar); }

template <class T> T __shfl_sync(unsigned, T v, int src) {
    uint64_t all[32];
    mbhost::exchange(mbhost::bits(v), all);
    return mbhost::from<T>(all[src & 31]);
}
template <class T> T __shfl_up_sync(unsigned, T v, unsigned delta) { // width 32: lanes below delta keep theirs
    uint64_t all[32];
    mbhost::exchange(mbhost::bits(v), all);
    int l = mbhost::lane();
    return l >= (int)delta ? mbhost::from<T>(all[l - delta]) : v;
}
template <class T> T __shfl_xor_sync(unsigned, T v, int mask) {
    uint64_t all[32];
    mbhost::exchange(mbhost::bits(v), all);
    return mbhost::from<T>(all[(mbhost::lane() ^ mask) & 31]);
}
inline unsigned __ballot_sync(unsigned, int pred) {
    uint64_t all[32];
    mbhost::exchange(pred != 0, all);
    unsigned b = 0;
    for (int i = 0; i < 32; i++) b |= (unsigned)all[i] << i;
    return b;
}
inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
inline int __all_sync(unsigned m, int pred) { return __ballot_sync(m, pred) == 0xffffffffu; }
inline unsigned __reduce_max_sync(unsigned, unsigned v) {
    uint64_t all[32];
    mbhost::exchange(v, all);
    unsigned r = 0;
    for (auto x : all) r = (unsigned)x > r ? (unsigned)x : r;
    return r;
}
inline unsigned __reduce_min_sync(unsigned, unsigned v) {
    uint64_t all[32];
    mbhost::exchange(v, all);
    unsigned r = ~0u;
    for (auto x : all) r = (unsigned)x < r ? (unsigned)x : r;
    return r;
}
inline int __reduce_add_sync(unsigned, int v) {
    uint64_t all[32];
    mbhost::exchange((unsigned)v, all);
    unsigned r = 0;
    for (auto x : all) r += (unsigned)x;
    return (int)r;
}
// CUDA's integer min and max
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline float __uint_as_float(unsigned u) { return mbhost::from<float>(u); }
inline float __int_as_float(int i) { return mbhost::from<float>((unsigned)i); }
inline unsigned __float_as_uint(float f) { return (unsigned)mbhost::bits(f); }

// Atomics: real ones (blocks run on several OS threads), relaxed as CUDA's
// atomicX, each a point where the fiber lets others run.
namespace mbhost {
template <class T> std::atomic_ref<T> at(const T *p) { return std::atomic_ref<T>(*const_cast<T *>(p)); }
template <class T, class F> T rmw(T *p, F f) {
    T old = f(at(p));
    spin();
    return old;
}
} // namespace mbhost
template <class T> T atomicAdd(T *p, T v) {
    return mbhost::rmw(p, [&](std::atomic_ref<T> a) { return a.fetch_add(v, std::memory_order_relaxed); });
}
template <class T> T atomicSub(T *p, T v) {
    return mbhost::rmw(p, [&](std::atomic_ref<T> a) { return a.fetch_sub(v, std::memory_order_relaxed); });
}
template <class T> T atomicExch(T *p, T v) {
    return mbhost::rmw(p, [&](std::atomic_ref<T> a) { return a.exchange(v, std::memory_order_relaxed); });
}
template <class T> T atomicCAS(T *p, T cmp, T v) {
    return mbhost::rmw(p, [&](std::atomic_ref<T> a) {
        a.compare_exchange_strong(cmp, v, std::memory_order_relaxed);
        return cmp;
    });
}
template <class T> T atomicMax(T *p, T v) {
    return mbhost::rmw(p, [&](std::atomic_ref<T> a) {
        T o = a.load(std::memory_order_relaxed);
        while (o < v && !a.compare_exchange_weak(o, v, std::memory_order_relaxed)) {
        }
        return o;
    });
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// The memory primitives of moebench.cuh (mb_*), which call these under
// MB_HOST: PTX's volatile, relaxed, acquire and release accesses at gpu or
// sys scope become C++ atomics of that ordering (the scope does not matter
// on one host), and each lets the other fibers run.
template <class T> T mbhost_load(const T *p, std::memory_order o) {
    T v = mbhost::at(p).load(o);
    mbhost::spin();
    return v;
}
template <class T> void mbhost_store(T *p, T v, std::memory_order o) {
    mbhost::at(p).store(v, o);
    mbhost::spin();
}
inline unsigned long long mbhost_globaltimer() { return mbhost::nowNs(); }
inline void mbhost_nanosleep(unsigned) { mbhost::spin(); }
inline unsigned char *mbhost_dynamic_smem() { return mbhost::w.dsmem; }
// the block's rank in its cluster (x fastest), as %cluster_ctarank
inline unsigned mbhost_cluster_ctarank() {
    const auto &b = mbhost::w.bid, &c = mbhost::w.cdim;
    return b.x % c.x + c.x * (b.y % c.y + c.y * (b.z % c.z));
}

// f2bf without PTX: round to nearest even (finite values; NaN stays NaN)
inline unsigned short mbhost_f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// MBHOST_KERNEL(name, maxThreads, minBlocks) exports mbhost_kernel_name
// (see mbhost_kernel) for the fake libcuda; maxThreads and minBlocks are the
// kernel's __launch_bounds__ (0, 0 without).
#define MBHOST_KERNEL(name, maxThreads, minBlocks)                                                                     \
    extern "C" const mbhost_kernel *mbhost_kernel_##name(void) {                                                       \
        using o = mbhost::ops<decltype(&name)>;                                                                        \
        static const mbhost_kernel k = {MBHOST_ABI, (maxThreads), (minBlocks), mbhost::regs_for((maxThreads), (minBlocks)), \
                                        o::bind, o::unbind, o::template runK<&name>};                                  \
        return &k;                                                                                                     \
    }
// mbhost_tls_own: the bytes of thread-local storage that are this header's
// (the rest of the module's is the kernels' __shared__ memory).
#define MBHOST_MODULE                                                                                                  \
    extern "C" unsigned long mbhost_tls_own(void) { return sizeof(mbhost::worker); }
