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
// a thread runs until it reaches __syncthreads, a named barrier
// (mb_bar_sync), a warp-wide intrinsic (shuffles, ballots, reductions,
// __syncwarp) or a memory primitive of
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
// Hopper's mbarriers and bulk copies (cp.async.bulk) run through a
// stand-in that checks their ordering rules (see bulkstate below).
//
// Floating point is the host's (expf may differ from the GPU's in the last
// bit). Not modelled: the GPU's weaker ordering of plain loads and stores
// (x86 orders more than PTX requires), warps' lock-step execution, clusters'
// distributed shared memory.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <link.h>
#include <map>
#include <mutex>
#include <unordered_map>
#include <cstdarg>
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
struct float4 { float x, y, z, w; };
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
    // past the spin limit, 4 when it broke a bulk-copy rule (see bulkstate).
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
    barrier *named = nullptr;       // bar.sync's barriers 1 to 15 (0 is __syncthreads), by id
    void (*body)(void *) = nullptr; // the kernel with its arguments
    void *arg = nullptr;
    unsigned char *dsmem = nullptr; // dynamic shared memory
    bool spun = false;              // the running fiber yielded in a spin primitive
    bool stopping = false;          // fibers leave their loop
    struct bulkstate *bulk = nullptr; // the block's mbarriers and bulk copies (see below)
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

// ---- The bulk-copy stand-in: Hopper's mbarriers and cp.async.bulk
// (moebench.cuh's mb_mbar_* and mb_bulk_*) on the CPU, with their ordering
// rules checked. An mbarrier is a side-table entry keyed by its address:
// its arrival count, pending arrivals, transaction count (bytes expected
// minus bytes copied) and the number of phases completed. A phase completes
// when its pending arrivals and its transaction count are both zero; a
// parity test succeeds once the phase of that parity is complete. Copies
// move their bytes when issued (the worst case for a reader that does not
// wait), and a global→shared copy performs its complete_tx at once; a
// shared→global copy reads shared memory when issued but writes global
// memory only once the issuer has waited for its group (cp.async.bulk.
// wait_group, not .read) and then released (a fence, or a release store or
// atomic, of that same thread), or at the end of the block: a flag
// published before that wait, or by another thread after a __syncthreads,
// announces data not yet there. wait_group N (and .read N) leave the N
// most recently committed groups of the thread in flight.
//
// The async proxy's fence: a 16-byte plain store to global memory that a
// bulk copy may read (moebench.cuh's mb_stg16) is recorded, process-wide,
// until the storing thread's fence.proxy.async (mb_fence_proxy_async) or
// the end of its block; a global→shared bulk copy that reads a recorded
// store breaks the rule below. (The reader's own fence after its acquire
// is not modelled.)
//
// The dynamic shared memory is shadowed in 16-byte units, and every access
// a FIFO makes goes through the stand-in (bulk copies, mb_lds16, mb_sts16).
// A unit's bytes are published in an mbarrier phase (a copy's complete_tx,
// or the arrive of the thread that stored them) and released in one (the
// arrive of a thread that read them; for a bulk store, its first arrive
// after the wait_group.read that ended the read). The rules, each a
// detected violation that fails the launch (status 4) with a message:
//   - a read needs the unit published in a phase the reader has seen
//     complete (a consumer that does not wait for the full barrier);
//   - a write needs the unit never written, or released in a phase the
//     writer has seen complete, or read since it was published only by
//     the writer's own bulk store, whose read the writer waited for
//     (wait_group.read: a thread staging rows through its own buffer),
//     and no bulk store still reading it (a FIFO slot reused before its
//     consumer released it, or without waiting for the empty barrier);
//   - an arrival on a phase with no pending arrival left, or a phase whose
//     arrivals are in but whose copies brought more bytes than expected
//     (transaction count below zero): a wrong expected byte count;
//   - a wait on an mbarrier never initialised; a copy not 16-byte aligned
//     or sized, or outside the dynamic shared memory;
//   - a block that ends with a bulk store whose read was never waited for;
//   - a global→shared copy of bytes some thread stored with mb_stg16 and
//     did not follow with fence.proxy.async (the generic proxy's write not
//     ordered before the async proxy's read).
// A missing arrive, or fewer bytes copied than expected, leaves a phase
// incomplete: the kernel's timed wait (mb_mbar_wait) gives up, naming the
// rank, phase and wait. Not modelled: clusters, multicast, tensor maps.
struct mbar {
    uint64_t phase = 0; // phases completed
    int count = 0, pending = 0;
    long long tx = 0;
};
struct unit {
    uint8_t state = 0;     // 0 never written, 1 stored by `writer` (unpublished), 2 published
    uint16_t writer = 0;
    bool released = false; // a reader arrived since it was published
    bool inflight = false; // a bulk store reads it
    const void *fillBar = nullptr, *relBar = nullptr;
    uint64_t fillPhase = 0, relPhase = 0;
};
struct bulkop { // a shared→global copy of one thread
    unsigned lo, hi; // its units
    void *dst;
    std::vector<unsigned char> data;
    unsigned group; // 0: not committed
    bool read = false; // its read was waited for
};
struct tshadow {
    std::unordered_map<const void *, uint64_t> seen; // barrier → phases seen complete
    std::vector<unsigned> wrote, read;              // units stored (unpublished), read (unreleased)
    std::vector<bulkop> ops;
    std::vector<bulkop> landed; // waited for (wait_group), not yet released by this thread
    std::vector<uintptr_t> plain; // its mb_stg16 stores not yet followed by fence.proxy.async
    unsigned groups = 0;
};
struct bulkstate {
    unsigned char *base = nullptr;
    size_t bytes = 0;
    std::vector<unit> units;
    std::unordered_map<const void *, mbar> bars;
    std::vector<tshadow> threads;
    bool violated = false;
    void reset(unsigned char *b, size_t n, unsigned nthreads) {
        base = b, bytes = n, violated = false;
        units.assign(n / 16, unit{});
        bars.clear();
        threads.assign(nthreads, tshadow{});
    }
};

// plainStores: every block's mb_stg16 stores not yet followed by their
// thread's fence.proxy.async, by 16-byte address (process-wide: a bulk
// copy of one GPU's block may read another's stores)
struct plainStore {
    const tshadow *owner;
    unsigned block, thread; // for the message
};
inline std::mutex plainMu;
inline std::map<uintptr_t, plainStore> plainStores;

inline void violation(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!w.bulk->violated) // the first only: what follows may be its consequence
        std::fprintf(stderr, "mbhost: block (%u,%u,%u) thread %u: bulk-copy rule broken: %s\n", w.bid.x, w.bid.y, w.bid.z,
                     w.self ? w.self->linear : 0u, msg);
    w.bulk->violated = true;
}
inline tshadow &me() { return w.bulk->threads[w.self->linear]; }
inline mbar *barAt(const void *b, const char *what) {
    auto it = w.bulk->bars.find(b);
    if (it == w.bulk->bars.end()) {
        violation("%s on an mbarrier never initialised (%p)", what, b);
        return nullptr;
    }
    return &it->second;
}
// unitsOf: the units [lo, hi) of n bytes at p, or false (a violation)
inline bool unitsOf(const void *p, size_t n, const char *what, unsigned &lo, unsigned &hi) {
    const auto *c = static_cast<const unsigned char *>(p);
    bulkstate &s = *w.bulk;
    if (c < s.base || c + n > s.base + s.bytes || (c - s.base) % 16 || n % 16 || n == 0) {
        violation("%s of %zu bytes at shared offset %td: must lie in the dynamic shared memory (%zu bytes), 16-byte "
                  "aligned and sized",
                  what, n, c - s.base, s.bytes);
        return false;
    }
    lo = (c - s.base) / 16, hi = lo + n / 16;
    return true;
}
inline bool seenDone(const void *bar, uint64_t phase) { // has this thread seen bar's phase complete?
    auto &seen = me().seen;
    auto it = seen.find(bar);
    return it != seen.end() && it->second > phase;
}
inline bool canWrite(unsigned u, const char *what) {
    unit &x = w.bulk->units[u];
    if (x.inflight) {
        violation("%s overwrites shared offset %u while a bulk store still reads it (no cp.async.bulk.wait_group.read "
                  "before the slot was released)", what, 16 * u);
        return false;
    }
    if (x.state == 0 || (x.state == 1 && x.writer == w.self->linear)) return true;
    // a unit whose only read since it was published is this thread's own
    // bulk store, waited for (wait_group.read) and not yet released by an
    // arrive: the thread may refill it (its copy's read is over, in its
    // program order); the unit is no longer this thread's to release
    if (x.state == 2 && !x.released) {
        auto &rd = me().read;
        if (auto it = std::find(rd.begin(), rd.end(), u); it != rd.end()) {
            rd.erase(it);
            return true;
        }
    }
    if (x.state == 1 || !x.released) {
        violation("%s writes shared offset %u, which holds data not yet released by its consumer (a FIFO slot reused "
                  "before the consumer's arrive on the empty barrier)", what, 16 * u);
        return false;
    }
    if (!seenDone(x.relBar, x.relPhase)) {
        violation("%s writes shared offset %u, released in phase %llu of mbarrier %p, a phase this thread has not "
                  "seen complete (no wait on the empty barrier)", what, 16 * u, (unsigned long long)x.relPhase, x.relBar);
        return false;
    }
    return true;
}
inline bool canRead(unsigned u, const char *what) {
    unit &x = w.bulk->units[u];
    if (x.state == 1 && x.writer == w.self->linear) return true;
    if (x.state != 2) {
        violation("%s reads shared offset %u, which holds no published data (%s)", what, 16 * u,
                  x.state == 0 ? "never written" : "stored by another thread that has not arrived yet");
        return false;
    }
    if (!seenDone(x.fillBar, x.fillPhase)) {
        violation("%s reads shared offset %u, published in phase %llu of mbarrier %p, a phase this thread has not "
                  "seen complete (no wait on the full barrier)", what, 16 * u, (unsigned long long)x.fillPhase, x.fillBar);
        return false;
    }
    return true;
}
inline void publish(unsigned u, const void *bar, uint64_t phase) {
    unit &x = w.bulk->units[u];
    x.state = 2, x.released = false, x.fillBar = bar, x.fillPhase = phase;
}
inline void complete(mbar &m) {
    if (m.pending == 0 && m.tx == 0) m.phase++, m.pending = m.count;
}
// arrive: this thread's arrival (with tx expected bytes) on bar: it
// publishes the units it stored and releases those it read
inline void arrive(void *bar, unsigned tx) {
    mbar *m = barAt(bar, "arrive");
    if (!m) return;
    if (m->pending == 0) {
        violation("arrive on mbarrier %p in phase %llu, whose %d arrivals are all in (more arrivals than its count)", bar,
                  (unsigned long long)m->phase, m->count);
        return;
    }
    tshadow &t = me();
    for (unsigned u : t.wrote)
        if (w.bulk->units[u].state == 1 && w.bulk->units[u].writer == w.self->linear) publish(u, bar, m->phase);
    for (unsigned u : t.read) {
        unit &x = w.bulk->units[u];
        if (x.state == 2) x.released = true, x.relBar = bar, x.relPhase = m->phase;
    }
    t.wrote.clear(), t.read.clear();
    m->tx += tx;
    m->pending--;
    if (m->pending == 0 && m->tx < 0)
        violation("mbarrier %p phase %llu: its arrivals are in, but its copies brought %lld bytes more than expected "
                  "(arrive.expect_tx's byte count too small)", bar, (unsigned long long)m->phase, -m->tx);
    complete(*m);
}
} // namespace mbhost

inline void mbhost_mbar_init(void *bar, int count) {
    mbhost::mbar &m = mbhost::w.bulk->bars[bar];
    m = mbhost::mbar{};
    m.count = m.pending = count;
    mbhost::yield();
}
inline void mbhost_mbar_arrive(void *bar, unsigned tx) {
    mbhost::arrive(bar, tx);
    mbhost::yield();
}
// mbhost_mbar_test: has the phase of this parity completed?
inline bool mbhost_mbar_test(void *bar, int parity) {
    bool done = false;
    if (mbhost::mbar *m = mbhost::barAt(bar, "parity wait")) {
        done = (int)(m->phase & 1) != (parity & 1);
        if (done) {
            uint64_t &seen = mbhost::me().seen[bar];
            if (seen < m->phase) seen = m->phase;
        }
    }
    mbhost::spin();
    return done;
}
inline void mbhost_bulk_g2s(void *dst, const void *src, unsigned bytes, void *bar) {
    unsigned lo, hi;
    mbhost::mbar *m = mbhost::barAt(bar, "cp.async.bulk (global to shared)");
    if (m && mbhost::unitsOf(dst, bytes, "cp.async.bulk (global to shared)", lo, hi)) {
        bool ok = true;
        for (unsigned u = lo; u < hi && ok; u++) ok = mbhost::canWrite(u, "cp.async.bulk (global to shared)");
        if (ok && (reinterpret_cast<uintptr_t>(src) % 16)) {
            mbhost::violation("cp.async.bulk from a global address not 16-byte aligned (%p)", src);
            ok = false;
        }
        if (ok) {
            const uintptr_t a = reinterpret_cast<uintptr_t>(src);
            std::lock_guard<std::mutex> l(mbhost::plainMu);
            auto it = mbhost::plainStores.lower_bound(a >= 15 ? a - 15 : 0);
            if (it != mbhost::plainStores.end() && it->first < a + bytes) {
                mbhost::violation("cp.async.bulk (global to shared) reads %p, which block %u thread %u stored with a plain "
                                  "store not followed by its fence.proxy.async (the generic proxy's write is not ordered "
                                  "before the async proxy's read)",
                                  reinterpret_cast<void *>(it->first), it->second.block, it->second.thread);
                ok = false;
            }
        }
        if (ok) {
            std::memcpy(dst, src, bytes);
            for (unsigned u = lo; u < hi; u++) mbhost::publish(u, bar, m->phase);
            m->tx -= bytes; // complete_tx
            if (m->pending == 0 && m->tx < 0)
                mbhost::violation("mbarrier %p phase %llu: a copy brought %lld bytes more than expected after its "
                                  "arrivals were in (arrive.expect_tx's byte count too small)",
                                  bar, (unsigned long long)m->phase, -m->tx);
            mbhost::complete(*m);
        }
    }
    mbhost::yield();
}
inline void mbhost_bulk_s2g(void *dst, const void *src, unsigned bytes) {
    unsigned lo, hi;
    if (mbhost::unitsOf(src, bytes, "cp.async.bulk (shared to global)", lo, hi)) {
        bool ok = true;
        for (unsigned u = lo; u < hi && ok; u++) ok = mbhost::canRead(u, "cp.async.bulk (shared to global)");
        if (ok && (reinterpret_cast<uintptr_t>(dst) % 16)) {
            mbhost::violation("cp.async.bulk to a global address not 16-byte aligned (%p)", dst);
            ok = false;
        }
        if (ok) {
            auto *c = static_cast<const unsigned char *>(src);
            mbhost::me().ops.push_back({lo, hi, dst, std::vector<unsigned char>(c, c + bytes), 0});
            for (unsigned u = lo; u < hi; u++) mbhost::w.bulk->units[u].inflight = true;
        }
    }
    mbhost::yield();
}
inline void mbhost_bulk_commit() {
    mbhost::tshadow &t = mbhost::me();
    t.groups++;
    for (auto &o : t.ops)
        if (o.group == 0) o.group = t.groups;
    mbhost::yield();
}
// mbhost_bulk_wait: every committed bulk store's read is over (and, unless
// readOnly, its write done, to be published by this thread's next release)
// but those of the keep most recently committed groups
inline void mbhost_bulk_wait(bool readOnly, unsigned keep) {
    mbhost::tshadow &t = mbhost::me();
    std::vector<mbhost::bulkop> left;
    for (auto &o : t.ops) {
        if (o.group == 0 || o.group + keep > t.groups) {
            left.push_back(std::move(o));
            continue;
        }
        if (!o.read) {
            o.read = true;
            for (unsigned u = o.lo; u < o.hi; u++) {
                mbhost::w.bulk->units[u].inflight = false;
                t.read.push_back(u);
            }
        }
        if (readOnly) left.push_back(std::move(o));
        else t.landed.push_back(std::move(o));
    }
    t.ops = std::move(left);
    mbhost::yield();
}
// mbhost_release_point: this thread releases (a fence, or a release store
// or atomic): the bulk stores it waited for become visible to others
inline void mbhost_release_point() {
    if (!mbhost::w.bulk || !mbhost::w.self) return;
    mbhost::tshadow &t = mbhost::me();
    for (auto &o : t.landed) std::memcpy(o.dst, o.data.data(), o.data.size());
    t.landed.clear();
}
// mbhost_stg16: a plain 16-byte store to global memory that a bulk copy
// may read, recorded until this thread's fence.proxy.async
inline void mbhost_stg16(void *p, uint4 v) {
    std::memcpy(p, &v, 16);
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    mbhost::tshadow &t = mbhost::me();
    {
        std::lock_guard<std::mutex> l(mbhost::plainMu);
        const auto &b = mbhost::w.bid, &g = mbhost::w.gdim;
        mbhost::plainStores[a] = {&t, b.x + g.x * (b.y + g.y * b.z), mbhost::w.self->linear};
    }
    t.plain.push_back(a);
}
namespace mbhost {
// forgetPlain drops thread t's recorded plain stores
inline void forgetPlain(tshadow &t) {
    if (t.plain.empty()) return;
    std::lock_guard<std::mutex> l(plainMu);
    for (uintptr_t a : t.plain) {
        auto it = plainStores.find(a);
        if (it != plainStores.end() && it->second.owner == &t) plainStores.erase(it);
    }
    t.plain.clear();
}
} // namespace mbhost
inline void mbhost_fence_proxy_async() {
    mbhost::forgetPlain(mbhost::me());
    mbhost::yield();
}
// mbhost_bulk_end: at the end of a block, stores whose read was waited for
// land; one never waited for is a violation
inline void mbhost_bulk_end() {
    for (auto &t : mbhost::w.bulk->threads) {
        for (auto &o : t.ops) {
            if (!o.read && !mbhost::w.bulk->violated) {
                std::fprintf(stderr, "mbhost: block (%u,%u,%u): bulk-copy rule broken: the block ended with a bulk store "
                                     "whose read of shared memory was never waited for (cp.async.bulk.wait_group.read)\n",
                             mbhost::w.bid.x, mbhost::w.bid.y, mbhost::w.bid.z);
            }
            mbhost::w.bulk->violated |= !o.read;
            std::memcpy(o.dst, o.data.data(), o.data.size());
        }
        t.ops.clear();
        for (auto &o : t.landed) std::memcpy(o.dst, o.data.data(), o.data.size());
        t.landed.clear();
    }
}
inline uint4 mbhost_lds16(const void *p) {
    unsigned lo, hi;
    uint4 v{};
    if (mbhost::unitsOf(p, 16, "a 16-byte shared load", lo, hi) && mbhost::canRead(lo, "a 16-byte shared load")) {
        std::memcpy(&v, p, 16);
        mbhost::me().read.push_back(lo);
    }
    mbhost::yield();
    return v;
}
inline void mbhost_sts16(void *p, uint4 v) {
    unsigned lo, hi;
    if (mbhost::unitsOf(p, 16, "a 16-byte shared store", lo, hi) && mbhost::canWrite(lo, "a 16-byte shared store")) {
        std::memcpy(p, &v, 16);
        mbhost::unit &x = mbhost::w.bulk->units[lo];
        if (x.state != 1) mbhost::me().wrote.push_back(lo);
        x.state = 1, x.writer = mbhost::w.self->linear, x.released = false;
    }
    mbhost::yield();
}
namespace mbhost {

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
                         "the end of the block, at a named barrier or at a warp-wide intrinsic that not all 32 lanes reach\n",
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

// ---- Poison. On a GPU a block's shared memory, static and dynamic, holds
// at the block's start whatever the SM's previous block left there. Here
// each block starts with both filled with the 16-bit word 0x7FFF (bytes
// FF 7F), as the fake libcuda fills every allocation: a kernel that reads
// shared memory it never wrote sees NaN (bf16, fp32) and huge counts, not
// the zeros that thread-local storage starts with.
inline void poison(unsigned char *p, unsigned char *end) {
    for (; p < end; p++) *p = (reinterpret_cast<uintptr_t>(p) & 1) ? 0x7F : 0xFF;
}
namespace {
void anchor() {} // an address in this module's image
} // namespace
// staticShared finds this module's thread-local storage on the calling
// thread (its __shared__ variables, and w): [*lo, *hi), or false.
inline bool staticShared(unsigned char **lo, unsigned char **hi) {
    struct find {
        uintptr_t at;
        unsigned char *tls;
        size_t n;
    } f{reinterpret_cast<uintptr_t>(&anchor), nullptr, 0};
    dl_iterate_phdr(
        [](dl_phdr_info *i, size_t, void *arg) {
            auto *f = static_cast<find *>(arg);
            bool mine = false;
            size_t n = 0;
            for (int k = 0; k < i->dlpi_phnum; k++) {
                const auto &ph = i->dlpi_phdr[k];
                const uintptr_t a = i->dlpi_addr + ph.p_vaddr;
                if (ph.p_type == PT_LOAD && f->at >= a && f->at < a + ph.p_memsz) mine = true;
                if (ph.p_type == PT_TLS) n = ph.p_memsz;
            }
            if (!mine) return 0;
            f->tls = static_cast<unsigned char *>(i->dlpi_tls_data), f->n = n;
            return 1;
        },
        &f);
    auto *me = reinterpret_cast<unsigned char *>(&w);
    if (!f.tls || me < f.tls || me + sizeof w > f.tls + f.n) return false;
    *lo = f.tls, *hi = f.tls + f.n;
    return true;
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
    unsigned char *tlsLo, *tlsHi;
    if (!staticShared(&tlsLo, &tlsHi)) {
        std::fprintf(stderr, "mbhost: this module's thread-local storage (its __shared__ variables) was not found: "
                             "they cannot be poisoned\n");
        return 1;
    }
    barrier sync{threads};
    std::vector<warp> ws(threads / 32);
    std::vector<barrier> named(16);
    w.blockSync = &sync;
    w.warps = ws.data();
    w.named = named.data();
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
    bulkstate bulk;
    w.bulk = &bulk;
    int status = 0;
    for (int b; status == 0 && (b = next(sched)) >= 0;) {
        const unsigned u = b;
        w.bid = {u % g->gx, u / g->gx % g->gy, u / (g->gx * g->gy)};
        for (auto &x : ws) x.bar = barrier{32};
        for (auto &x : named) x = barrier{};
        sync = barrier{threads};
        poison(w.dsmem, w.dsmem + dyn.size()); // the SM's last block's bytes
        poison(tlsLo, reinterpret_cast<unsigned char *>(&w));
        poison(reinterpret_cast<unsigned char *>(&w + 1), tlsHi);
        bulk.reset(w.dsmem, g->smem, threads);
        status = block(fs);
        if (status == 0) {
            mbhost_bulk_end();
            if (bulk.violated) status = 4;
        }
        for (auto &t : bulk.threads) forgetPlain(t); // the block's plain stores are seen by every proxy after it

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
inline void __threadfence() {
    mbhost_release_point();
    std::atomic_thread_fence(std::memory_order_seq_cst);
}
inline void __threadfence_system() {
    mbhost_release_point();
    std::atomic_thread_fence(std::memory_order_seq_cst);
}
inline void __threadfence_block() {
    mbhost_release_point();
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

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
    if (o != std::memory_order_relaxed) mbhost_release_point();
    mbhost::at(p).store(v, o);
    mbhost::spin();
}
inline unsigned long long mbhost_globaltimer() { return mbhost::nowNs(); }
// bar.sync id, n: the first n threads to arrive at barrier id (1 to 15)
// pass together; the count is set by the first arrival of each use
inline void mbhost_bar_sync(int id, int n) {
    mbhost::barrier &b = mbhost::w.named[id & 15];
    if (b.arrived == 0) b.n = (unsigned)n;
    mbhost::wait(b);
}
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
