// mbhost.h: runs moebench's CUDA kernels on the CPU, for the tests only
// (internal/hostsim). The kernel sources are compiled unchanged by a C++
// compiler with this header included first and MB_HOST defined (which
// moebench.cuh checks for its one line of inline PTX). A launch runs every
// CUDA thread of a block as a fiber (its own stack, switched with
// _setjmp/_longjmp) on the calling thread, and the grid's blocks one after
// another. __syncthreads and the warp-wide intrinsics (shuffles, ballots,
// reductions) are barriers among the fibers: a thread runs until it reaches
// one, and a barrier that some threads never reach — a hang on a GPU — is
// reported and fails the launch. __shared__ variables become function
// statics: one copy, right while one block runs at a time. Floating point
// is the host's (expf may differ from the GPU's in the last bit).
#pragma once
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <ucontext.h>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

struct uint4 { unsigned x, y, z, w; };
struct mbhost_dim3 { unsigned x = 1, y = 1, z = 1; };

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
    mbhost_dim3 tid, bid;
    unsigned linear = 0; // the thread's index in its block
};

inline fiber *self;
inline jmp_buf scheduler;
inline mbhost_dim3 bdim, gdim;
inline barrier *blockSync;
inline std::vector<warp> *warps;
inline std::function<void()> runBlocks; // the running fiber's work

inline void yield() {
    if (!_setjmp(self->at)) _longjmp(scheduler, 1);
}

inline void wait(barrier &b) {
    const unsigned g = b.generation;
    if (++b.arrived == b.n) {
        b.arrived = 0;
        b.generation++;
        return;
    }
    self->blocked = &b;
    self->gen = g;
    yield();
}

inline unsigned lane() { return self->linear % 32; }

// exchange publishes this lane's value and returns every lane's.
inline void exchange(uint64_t v, uint64_t out[32]) {
    warp &w = (*warps)[self->linear / 32];
    uint64_t *s = w.slot[w.bar.generation & 1];
    s[lane()] = v;
    wait(w.bar);
    std::memcpy(out, s, sizeof w.slot[0]);
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

inline void entry() {
    runBlocks();
    self->finished = true;
    _longjmp(scheduler, 1);
}

// launch runs kernel k over the grid with params (cuLaunchKernel's: one
// pointer per argument). It returns 0; 1 for a block that is not whole
// warps (or no memory for the fibers' stacks); 2 when the threads stopped at
// barriers they cannot pass.
template <class... A> int launch(void (*k)(A...), mbhost_dim3 grid, mbhost_dim3 blk, void **params) {
    const unsigned threads = blk.x * blk.y * blk.z;
    if (threads == 0 || threads > 1024 || threads % 32 != 0) return 1;
    auto args = [&]<size_t... I>(std::index_sequence<I...>) {
        return std::tuple<A...>(*static_cast<std::remove_reference_t<A> *>(params[I])...);
    }(std::index_sequence_for<A...>{});
    barrier sync{threads}, done{threads}; // __syncthreads; every thread finished the block
    std::vector<warp> ws(threads / 32);
    for (auto &w : ws) w.bar.n = 32;
    bdim = blk;
    gdim = grid;
    blockSync = &sync;
    warps = &ws;
    runBlocks = [&] {
        for (unsigned z = 0; z < grid.z; z++)
            for (unsigned y = 0; y < grid.y; y++)
                for (unsigned x = 0; x < grid.x; x++) {
                    self->bid = {x, y, z};
                    std::apply(k, args);
                    wait(done); // threads that returned early wait here
                }
    };
    const size_t stackBytes = 64 << 10;
    std::vector<fiber> fs(threads);
    for (unsigned t = 0; t < threads; t++) {
        fiber &f = fs[t];
        f.linear = t;
        f.tid = {t % blk.x, t / blk.x % blk.y, t / (blk.x * blk.y)};
        f.stack = static_cast<char *>(std::malloc(stackBytes));
        if (!f.stack) {
            for (auto &g : fs) std::free(g.stack);
            return 1;
        }
        getcontext(&f.start);
        f.start.uc_stack.ss_sp = f.stack;
        f.start.uc_stack.ss_size = stackBytes;
        f.start.uc_link = nullptr;
        makecontext(&f.start, entry, 0);
    }
    ucontext_t here;
    unsigned live = threads;
    int status = 0;
    while (live > 0) {
        bool ran = false;
        for (auto &f : fs) {
            if (f.finished || (f.blocked && f.blocked->generation == f.gen)) continue;
            f.blocked = nullptr;
            self = &f;
            if (!_setjmp(scheduler)) {
                if (!f.started) {
                    f.started = true;
                    swapcontext(&here, &f.start);
                } else {
                    _longjmp(f.at, 1);
                }
            }
            ran = true;
            if (f.finished) live--;
        }
        if (!ran) { // as a GPU would hang
            unsigned atSync = 0;
            for (auto &f : fs) atSync += f.blocked == &sync;
            std::fprintf(stderr, "mbhost: %u of %u threads cannot go on: %u at __syncthreads, the others at the end of "
                                 "the block or at a warp-wide intrinsic that not all 32 lanes reach\n",
                         live, threads, atSync);
            status = 2;
            break;
        }
    }
    for (auto &f : fs) std::free(f.stack);
    runBlocks = nullptr;
    return status;
}

} // namespace mbhost

#define threadIdx (mbhost::self->tid)
#define blockIdx (mbhost::self->bid)
#define blockDim mbhost::bdim
#define gridDim mbhost::gdim

inline void __syncthreads() { mbhost::wait(*mbhost::blockSync); }

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
inline int atomicAdd(int *p, int v) { // one fiber runs at a time
    int old = *p;
    *p = old + v;
    return old;
}
inline float __uint_as_float(unsigned u) { return mbhost::from<float>(u); }
inline float __int_as_float(int i) { return mbhost::from<float>((unsigned)i); }
inline unsigned __float_as_uint(float f) { return (unsigned)mbhost::bits(f); }

// f2bf without PTX: round to nearest even (finite values; NaN stays NaN)
inline unsigned short mbhost_f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// MBHOST_KERNEL(name) exports mbhost_launch_name, which the fake libcuda
// (internal/cuda/testdata/fakecuda.c) calls for cuLaunchKernel.
#define MBHOST_KERNEL(name)                                                                                            \
    extern "C" int mbhost_launch_##name(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,  \
                                        void **params) {                                                               \
        return mbhost::launch(name, mbhost_dim3{gx, gy, gz}, mbhost_dim3{bx, by, bz}, params);                        \
    }
