// A fake libcuda for the tests: the entry points moebench uses, with
// "device" memory in host RAM, and real asynchronous streams: each stream
// has a worker thread that runs its work in order (copies, fills, kernels,
// event records, waits on other streams' events), so that work queued on
// different streams of one fake GPU or of two runs at the same time, as on
// GPUs, and cuStreamSynchronize, cuEventSynchronize and cuCtxSynchronize
// wait for it. Event times come from a clock that advances 0.5 ms per
// record that runs (they mean nothing).
//
// Two fake GPUs, each with an H100's per-SM limits (2048 threads, 64 Ki
// registers, 228 KiB shared memory, 32 blocks per SM; 227 KiB of shared
// memory per block with opt-in, 1 KiB reserved per block) and
// $FAKECUDA_SMS SMs (default 4), compute capability 9.0. A module whose
// image is a shared object for this CPU rather than a cubin holds kernels
// compiled for the host (internal/hostsim/mbhost.h): a launch places each
// block on an SM with room for its threads, registers and shared memory,
// runs every placed block on an OS thread of its own, and places the rest
// as blocks end (waves), as a GPU's block scheduler does; a cooperative
// launch waits until all of its blocks can be placed at once and is refused
// (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) when they exceed what
// cuOccupancyMaxActiveBlocksPerMultiprocessor times the SM count allows —
// the driver's documented rule. A host kernel's registers per thread are
// mbhost.h's model (from its __launch_bounds__, else 32), its static shared
// memory the module's thread-local storage beyond mbhost.h's own (all of the
// file's __shared__ variables: an upper bound for each kernel). Any other
// ELF image is a cubin with one kernel, "add", that adds a float to n floats,
// so that launch parameters, copies and error names are checked without a
// GPU.
//
// cuMemcpyHtoDAsync copies pageable host memory to a staging buffer before
// it returns, and cuMemcpyDtoHAsync into pageable memory returns when the
// copy is done, as the driver may; copies from and to memory of
// cuMemHostAlloc are asynchronous. cuMemFree, cuMemFreeHost and
// cuModuleUnload wait for all queued work first. A kernel that fails
// (threads stuck at a barrier, a block spinning past mbhost.h's limit)
// leaves its context's error sticky, as a GPU fault does: every later
// synchronization and launch on it returns CUDA_ERROR_LAUNCH_FAILED.
#define MB_ABI_DECLARE // moebench's prototypes: a definition here that differs does not compile
#include "abi.h"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum {
    OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, INVALID_IMAGE = 200, INVALID_CONTEXT = 201, INVALID_HANDLE = 400,
    ILLEGAL_STATE = 401, CAPTURE_UNSUPPORTED = 900, CAPTURE_INVALIDATED = 901, CAPTURE_UNMATCHED = 903,
    CAPTURE_UNJOINED = 904, CAPTURE_ISOLATION = 905,
    NOT_FOUND = 500, NOT_READY = 600, OUT_OF_RESOURCES = 701, PEER_ALREADY = 704, LAUNCH_FAILED = 719, COOP_TOO_LARGE = 720,
};

// ---- the fake GPUs

#define NDEV 2
#define SM_THREADS 2048
#define SM_REGS 65536
#define SM_SMEM 233472        // 228 KiB
#define SM_BLOCKS 32
#define BLOCK_SMEM 49152      // without opt-in
#define BLOCK_SMEM_OPTIN 232448 // 227 KiB
#define SMEM_RESERVED 1024
#define BLOCK_REGS 65536
typedef struct { int threads, regs, smem, blocks; } sm_use;
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv; // an SM's resources were given back
    sm_use *sm;
    CUresult failed; // sticky error of its context
} fgpu;
static fgpu gpu[NDEV];
static int nsms = 4;
// a block's opt-in shared memory limit: $FAKECUDA_SMEM_OPTIN (e.g. an
// A100's 166912), else BLOCK_SMEM_OPTIN
static int smem_optin = BLOCK_SMEM_OPTIN;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void init_gpus(void) {
    const char *e = getenv("FAKECUDA_SMS");
    if (e && atoi(e) > 0 && atoi(e) <= 1024) nsms = atoi(e);
    e = getenv("FAKECUDA_SMEM_OPTIN");
    if (e && atoi(e) >= BLOCK_SMEM && atoi(e) <= BLOCK_SMEM_OPTIN) smem_optin = atoi(e);
    for (int d = 0; d < NDEV; d++) {
        pthread_mutex_init(&gpu[d].mu, 0);
        pthread_cond_init(&gpu[d].cv, 0);
        gpu[d].sm = calloc(nsms, sizeof(sm_use));
    }
}

// The environment's CUDA_DEVICE_MAX_CONNECTIONS at the first cuInit, which
// is when a driver reads it; a test reads it as device attribute 10000 (no
// real attribute).
static int max_connections = -1;
CUresult cuInit(unsigned flags) {
    if (flags != 0) return INVALID_VALUE;
    pthread_once(&once, init_gpus);
    if (max_connections < 0) {
        const char *e = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
        max_connections = e ? atoi(e) : 0;
    }
    return OK;
}
// The CUDA version the fake driver supports: $FAKECUDA_DRIVER_VERSION, else
// 13000 (13.0); it answers before cuInit, as the real one does.
CUresult cuDriverGetVersion(int *v) {
    const char *e = getenv("FAKECUDA_DRIVER_VERSION");
    *v = e && atoi(e) > 0 ? atoi(e) : 13000;
    return OK;
}
CUresult cuDeviceGetCount(int *n) { *n = NDEV; return OK; }
// CUdevice handles are 100 + ordinal, so that a binding passing ordinals
// where handles belong is caught (CUDA_ERROR_INVALID_DEVICE, 101).
#define HANDLE_OK(d) ((d) == 100 || (d) == 101)
CUresult cuDeviceGet(int *d, int ord) { *d = 100 + ord; return ord < NDEV ? OK : 101; }
CUresult cuDeviceGetName(char *s, int n, int d) {
    if (!HANDLE_OK(d)) return 101;
    strncpy(s, d == 100 ? "Fake GPU 0" : "Fake GPU 1", n); return OK;
}
CUresult cuDeviceGetPCIBusId(char *s, int n, int d) {
    if (!HANDLE_OK(d)) return 101;
    strncpy(s, d == 100 ? "0000:1B:00.0" : "0000:2C:00.0", n); return OK;
}
// cc is the compute capability × 10: $FAKECUDA_CC, else 90.
static int cc(void) {
    const char *e = getenv("FAKECUDA_CC");
    return e && atoi(e) > 0 ? atoi(e) : 90;
}
// Attributes: the ones occupancy depends on as above; any other attribute a
// reads as a·100 + ordinal, so that a test sees which one was asked.
CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
    if (!HANDLE_OK(d)) return 101;
    switch (attr) {
    case 1: *v = 1024; break;                  // MAX_THREADS_PER_BLOCK
    case 8: *v = BLOCK_SMEM; break;            // MAX_SHARED_MEMORY_PER_BLOCK
    case 10: *v = 32; break;                   // WARP_SIZE
    case 12: *v = BLOCK_REGS; break;           // MAX_REGISTERS_PER_BLOCK
    case 16: *v = nsms; break;                 // MULTIPROCESSOR_COUNT
    case 19: case 41: case 95: *v = 1; break;  // CAN_MAP_HOST_MEMORY, UNIFIED_ADDRESSING, COOPERATIVE_LAUNCH
    case 39: *v = SM_THREADS; break;           // MAX_THREADS_PER_MULTIPROCESSOR
    case 75: *v = cc() / 10; break;            // COMPUTE_CAPABILITY_MAJOR
    case 76: *v = cc() % 10; break;            // COMPUTE_CAPABILITY_MINOR
    case 81: *v = SM_SMEM; break;              // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    case 82: *v = SM_REGS; break;              // MAX_REGISTERS_PER_MULTIPROCESSOR
    case 97: *v = smem_optin; break;     // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    case 106: *v = SM_BLOCKS; break;           // MAX_BLOCKS_PER_MULTIPROCESSOR
    case 111: *v = SMEM_RESERVED; break;       // RESERVED_SHARED_MEMORY_PER_BLOCK
    case 10000: *v = max_connections; break;   // the fake's: CUDA_DEVICE_MAX_CONNECTIONS at cuInit
    default: *v = attr * 100 + d - 100;
    }
    return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *n, int d) { if (!HANDLE_OK(d)) return 101; *n = (size_t)80 << 30; return OK; }
CUresult cuDeviceCanAccessPeer(int *v, int a, int b) { if (!HANDLE_OK(a) || !HANDLE_OK(b)) return 101; *v = a != b; return OK; }

// ---- contexts
// Contexts are 0x1000 + handle. The fake tracks the current context (one
// per thread, as the driver's is: a thread that never made one current has
// none) and which context owns each stream, event and
// allocation, and refuses what a driver refuses across contexts (or
// stricter): a stream or allocation made with no current context, an event
// recorded on another context's stream, elapsed time between contexts, a
// copy on a stream of a context that owns neither side, a peer copy whose
// contexts do not own its pointers, and a launch on a stream that is not the
// current context's.
#define CTX(d) ((void *)(0x1000L + (d)))
#define CTXDEV(c) ((int)((long)(c) - 0x1000 - 100))
static __thread void *cur;
static int peer[NDEV][NDEV];
// fakecuda_current is the calling thread's current context (for the other
// fake libraries: NCCL takes its communicator's GPU from it).
void *fakecuda_current(void) { return cur; }
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { if (!HANDLE_OK(d)) return 101; *c = CTX(d); return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { return HANDLE_OK(d) ? OK : 101; }
CUresult cuCtxSetCurrent(void *c) { if (!c) return INVALID_CONTEXT; cur = c; return OK; }
// fakecuda_fail makes ctx's error sticky, as a fault of another library's
// kernel does (fakenccl.c: a collective that timed out where NCCL hangs).
void fakecuda_fail(void *ctx) {
    fgpu *g = &gpu[CTXDEV(ctx)];
    pthread_mutex_lock(&g->mu);
    if (!g->failed) g->failed = LAUNCH_FAILED;
    pthread_mutex_unlock(&g->mu);
}
static CUresult sticky(void *ctx) {
    fgpu *g = &gpu[CTXDEV(ctx)];
    pthread_mutex_lock(&g->mu);
    CUresult r = g->failed;
    pthread_mutex_unlock(&g->mu);
    return r;
}
CUresult cuCtxEnablePeerAccess(void *c, unsigned flags) {
    if (!cur || c == cur || flags) return INVALID_VALUE;
    int a = CTXDEV(cur), b = CTXDEV(c);
    if (peer[a][b]) return PEER_ALREADY;
    peer[a][b] = 1; return OK;
}
CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) { *least = 0; *greatest = -5; return OK; }

// ---- streams: a queue of work and a thread that runs it in order

typedef struct op op;
typedef struct fstream {
    void *ctx; // first: the fake libraries read it
    pthread_mutex_t mu;
    pthread_cond_t cv; // work queued, or work done
    op *head, *tail;
    uint64_t queued, done; // work items queued and finished
    int destroyed;
    pthread_t thread;
    struct capture *cap; // the stream capture it is part of, or 0
} fstream;

typedef struct fevent {
    void *ctx;
    fstream *s;      // the stream of its last record (0: never recorded)
    uint64_t ticket; // that stream's work count at the record
    double t;        // the clock when the record ran
    struct capture *cap; // the capture its last record was captured in (0: a real record)
    struct fevent *node; // that capture-internal record's own event (see cuEventRecord)
    int internal;    // its last record was capture-internal: it holds no time
    unsigned flags;  // cuEventCreate's
} fevent;

static pthread_mutex_t regmu = PTHREAD_MUTEX_INITIALIZER; // streams, clock, events' fields
#define MAXS 1024
static fstream *streams[MAXS];
static int nstreams;
static fstream *defstream[NDEV];
static double fake_clock;

enum { OP_COPY, OP_FILL16, OP_KERNEL, OP_ADD, OP_RECORD, OP_WAIT, OP_HOST, OP_BATCH };
typedef struct klaunch klaunch;
struct op {
    op *next;
    int kind;
    int keep; // a graph's: its resources stay for the next launch
    union {
        struct { void *dst; const void *src; size_t n; void *staged; } copy;
        struct { unsigned short *p; unsigned short v; size_t n; } fill;
        klaunch *k;
        struct { float *x; int n; float a, mark; } add;
        struct { fevent *e; uint64_t ticket; } rec;
        struct { fstream *s; uint64_t ticket; } wait;
        struct { void (*fn)(void *); void *arg; void (*release)(void *); } host;
        struct { size_t count; CUdeviceptr *d, *s; size_t *n; } batch;
    };
};

static void wait_done(fstream *s, uint64_t ticket) {
    pthread_mutex_lock(&s->mu);
    while (s->done < ticket) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}
static int is_done(fstream *s, uint64_t ticket) {
    pthread_mutex_lock(&s->mu);
    int d = s->done >= ticket;
    pthread_mutex_unlock(&s->mu);
    return d;
}

static CUresult run_kernel(klaunch *k);
static void klaunch_keep(klaunch *l);
static void klaunch_free(klaunch *l);
static void exec(fstream *s, op *o) {
    switch (o->kind) {
    case OP_COPY:
        memcpy(o->copy.dst, o->copy.src, o->copy.n);
        if (!o->keep) free(o->copy.staged);
        break;
    case OP_FILL16: for (size_t i = 0; i < o->fill.n; i++) o->fill.p[i] = o->fill.v; break;
    case OP_KERNEL: run_kernel(o->k); break;
    case OP_ADD:
        for (int i = 0; i < o->add.n; i++) o->add.x[i] += o->add.a;
        o->add.x[o->add.n] = o->add.mark;
        break;
    case OP_RECORD:
        pthread_mutex_lock(&regmu);
        fake_clock += 0.5;
        if (o->rec.e->s == s && o->rec.e->ticket == o->rec.ticket) o->rec.e->t = fake_clock;
        pthread_mutex_unlock(&regmu);
        break;
    case OP_WAIT: wait_done(o->wait.s, o->wait.ticket); break;
    case OP_HOST:
        o->host.fn(o->host.arg);
        if (!o->keep && o->host.release) o->host.release(o->host.arg);
        break;
    case OP_BATCH:
        for (size_t i = 0; i < o->batch.count; i++) memcpy((void *)o->batch.d[i], (void *)o->batch.s[i], o->batch.n[i]);
        if (!o->keep) free(o->batch.d);
        break;
    }
}

static void *stream_main(void *p) {
    fstream *s = p;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->destroyed) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) break;
        op *o = s->head;
        pthread_mutex_unlock(&s->mu);
        exec(s, o);
        pthread_mutex_lock(&s->mu);
        s->head = o->next;
        if (!s->head) s->tail = 0;
        s->done++;
        pthread_cond_broadcast(&s->cv);
        free(o);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static fstream *new_stream(void *ctx) {
    pthread_mutex_lock(&regmu);
    if (nstreams == MAXS) { pthread_mutex_unlock(&regmu); return 0; }
    fstream *s = calloc(1, sizeof *s);
    s->ctx = ctx;
    pthread_mutex_init(&s->mu, 0);
    pthread_cond_init(&s->cv, 0);
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 1 << 20);
    pthread_create(&s->thread, &a, stream_main, s);
    pthread_attr_destroy(&a);
    streams[nstreams++] = s;
    pthread_mutex_unlock(&regmu);
    return s;
}

// stream resolves a handle: NULL is the current context's default stream.
static pthread_mutex_t defmu = PTHREAD_MUTEX_INITIALIZER;
static fstream *stream(void *h) {
    if (h) return h;
    if (!cur) return 0;
    int d = CTXDEV(cur);
    pthread_mutex_lock(&defmu);
    if (!defstream[d]) defstream[d] = new_stream(cur);
    fstream *s = defstream[d];
    pthread_mutex_unlock(&defmu);
    return s;
}
static void *sctx(void *h) { return h ? ((fstream *)h)->ctx : cur; }

// ---- stream capture (CUDA graphs)
// Between cuStreamBeginCapture and cuStreamEndCapture the work queued on the
// capturing stream is recorded, not run, and so is the work of every stream
// that waits for an event recorded in the capture (it joins); cuGraphLaunch
// replays the recorded calls, each on its own stream, in the order they were
// made (after the launching stream's earlier work; the launching stream's
// later work after all of them). As a driver does, it refuses what cannot
// be captured, and the capture is then invalidated (cuStreamEndCapture
// says so): a synchronization (stream, context, an event of the capture),
// allocating or freeing memory, loading or unloading a module, a copy from
// or into pageable host memory, a batch copy, a wait for an event recorded
// outside the capture, and work of another library that cannot be replayed
// (fakecuda_enqueue; fakecuda_enqueue2 can). Ending the capture on another
// stream than the one that began it, or while a joined stream was not
// joined back (an event recorded after its last work that the origin
// waited for), fails as the driver's does.
// An event recorded in a capture with cuEventRecord is capture-internal:
// it only orders the capture's work (a fork or a join), the event itself
// is never recorded by a launch and cuEventElapsedTime refuses it; one
// recorded with cuEventRecordWithFlags(CU_EVENT_RECORD_EXTERNAL) is an
// event record node, recorded by each launch (see cuEventRecordWithFlags).
enum { C_OP, C_RECORD, C_WAIT, C_NODE };
// e: C_RECORD's and C_WAIT's capture-internal event (the record's own),
// C_NODE's the caller's; ev: C_RECORD's caller's event
typedef struct { int kind; fstream *s; op *o; fevent *e, *ev; } centry;
typedef struct capture {
    fstream *origin;
    centry *v;
    int n, cap;
    fstream *joined[MAXS];
    int njoined;
    int invalid, active, refs;
} capture;
typedef struct { capture *c; } fgraph;
static int active_captures; // regmu
static void cap_add(capture *c, int kind, fstream *s, op *o, fevent *e, fevent *ev) {
    if (c->n == c->cap) c->cap = c->cap ? 2 * c->cap : 64, c->v = realloc(c->v, c->cap * sizeof *c->v);
    c->v[c->n++] = (centry){kind, s, o, e, ev};
}
// refuse: a call a capture cannot take, on s (0: whatever is capturing)
static CUresult refuse(fstream *s) {
    pthread_mutex_lock(&regmu);
    for (int i = 0; i < nstreams; i++)
        if (streams[i]->cap && (!s || streams[i]->cap == s->cap)) streams[i]->cap->invalid = 1;
    pthread_mutex_unlock(&regmu);
    return CAPTURE_UNSUPPORTED;
}
static int capturing(fstream *s) { return s && s->cap; }
// invalidated: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED for a call into a
// capture that an earlier refused call invalidated (the driver's error for
// a capture sequence invalidated by a previous error)
static CUresult invalidated(fstream *s) {
    pthread_mutex_lock(&regmu);
    int bad = s && s->cap && s->cap->invalid;
    pthread_mutex_unlock(&regmu);
    return bad ? CAPTURE_INVALIDATED : OK;
}
static int any_capture(void) {
    pthread_mutex_lock(&regmu);
    int n = active_captures;
    pthread_mutex_unlock(&regmu);
    return n > 0;
}

// enqueue appends o to s and returns its ticket (s's work count once o is
// done); on a capturing stream it records o instead (ticket 0).
static uint64_t enqueue(fstream *s, op *o) {
    o->next = 0;
    if (s->cap) { // threads issuing to several joined streams share the capture
        if (o->kind == OP_KERNEL) klaunch_keep(o->k); // the graph owns it
        pthread_mutex_lock(&regmu);
        cap_add(s->cap, C_OP, s, o, 0, 0);
        pthread_mutex_unlock(&regmu);
        return 0;
    }
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    uint64_t t = ++s->queued;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return t;
}
static uint64_t queued(fstream *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t t = s->queued;
    pthread_mutex_unlock(&s->mu);
    return t;
}
static op *newop(int kind) { op *o = calloc(1, sizeof *o); o->kind = kind; return o; }


// drain waits for the work queued so far on every stream (of ctx, or all).
static void drain(void *ctx) {
    fstream *ss[MAXS];
    pthread_mutex_lock(&regmu);
    int n = nstreams;
    memcpy(ss, streams, n * sizeof *ss);
    pthread_mutex_unlock(&regmu);
    for (int i = 0; i < n; i++)
        if (!ctx || ss[i]->ctx == ctx) wait_done(ss[i], queued(ss[i]));
}

// fakecuda_advance moves the event clock on by ms (the fake cuBLASLt's
// algorithms take different times).
void fakecuda_advance(double ms) {
    pthread_mutex_lock(&regmu);
    fake_clock += ms;
    pthread_mutex_unlock(&regmu);
}

// fakecuda_enqueue queues fn(arg) on stream s (NULL: the current context's
// default stream) after the work queued on it so far: the other fake
// libraries' work (cuBLASLt, cuBLAS, NCCL) runs in stream order with it.
// fn frees arg: a capture cannot take it (see fakecuda_enqueue2).
int fakecuda_enqueue(void *s, void (*fn)(void *), void *arg) {
    fstream *st = stream(s);
    if (!st) return INVALID_CONTEXT;
    if (capturing(st)) return refuse(st);
    op *o = newop(OP_HOST);
    o->host.fn = fn, o->host.arg = arg;
    enqueue(st, o);
    return OK;
}

// fakecuda_enqueue2 is fakecuda_enqueue for work that a graph may replay:
// fn leaves arg as it found it, and release(arg) frees it once the work has
// run, or, captured, once the graph is destroyed.
int fakecuda_enqueue2(void *s, void (*fn)(void *), void *arg, void (*release)(void *)) {
    fstream *st = stream(s);
    if (!st) return INVALID_CONTEXT;
    op *o = newop(OP_HOST);
    o->host.fn = fn, o->host.arg = arg, o->host.release = release;
    enqueue(st, o);
    return OK;
}

CUresult cuStreamCreateWithPriority(void **s, unsigned flags, int prio) {
    if (flags != 1 || prio > 0 || prio < -5) return INVALID_VALUE; // non-blocking, within the range
    if (!cur) return INVALID_CONTEXT;
    fstream *f = new_stream(cur);
    if (!f) return OUT_OF_MEMORY;
    *s = f; return OK;
}
// the stream's thread ends once its work is done; the stream itself is kept
// (events recorded on it may still be asked about)
CUresult cuStreamDestroy_v2(void *h) {
    fstream *s = h;
    if (!s) return INVALID_HANDLE;
    pthread_mutex_lock(&s->mu);
    s->destroyed = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return OK;
}
CUresult cuStreamSynchronize(void *h) {
    fstream *s = stream(h);
    if (!s) return INVALID_CONTEXT;
    if (capturing(s)) return refuse(s);
    wait_done(s, queued(s));
    return sticky(s->ctx);
}
CUresult cuCtxSynchronize(void) {
    if (!cur) return INVALID_CONTEXT;
    if (any_capture()) return refuse(0);
    drain(cur);
    return sticky(cur);
}

// ---- events

CUresult cuEventCreate(void **e, unsigned flags) {
    if (!cur) return INVALID_CONTEXT;
    fevent *f = calloc(1, sizeof *f); f->ctx = cur, f->flags = flags; *e = f; return OK;
}
CUresult cuEventDestroy_v2(void *e) { return e ? OK : INVALID_HANDLE; } // kept: a record may still be queued
static void record_on(fevent *e, fstream *s);
CUresult cuEventRecord(void *h, void *sh) {
    fevent *e = h;
    fstream *s = stream(sh);
    if (!s || e->ctx != s->ctx) return INVALID_HANDLE;
    if (invalidated(s)) return CAPTURE_INVALIDATED;
    if (capturing(s)) { // capture-internal: a launch records the record's own event, never e
        fevent *n = calloc(1, sizeof *n);
        n->ctx = e->ctx;
        pthread_mutex_lock(&regmu);
        cap_add(s->cap, C_RECORD, s, 0, n, e);
        e->cap = s->cap, e->node = n, e->s = 0, e->ticket = 0, e->internal = 1;
        pthread_mutex_unlock(&regmu);
        return OK;
    }
    record_on(e, s);
    return OK;
}
// CU_EVENT_RECORD_EXTERNAL (CUevent_record_flags): "When using stream
// capture, create an event record node instead of the default behavior.
// This flag is invalid when used outside of capture."
// (https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__TYPES.html,
// https://nvidia.github.io/cuda-python/pr-preview/pr-3095/cuda-bindings/latest/module/generated/driver_v2/cuda.bindings._v2.driver.EventRecordFlags.html);
// "Each launch of the graph will record event to capture execution of the
// node's dependencies" (cuGraphAddEventRecordNode,
// https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html), so
// it times as a plain record does.
#define RECORD_EXTERNAL 1
CUresult cuEventRecordWithFlags(void *h, void *sh, unsigned flags) {
    fevent *e = h;
    fstream *s = stream(sh);
    if (!s || !e || e->ctx != s->ctx) return INVALID_HANDLE;
    if (flags & ~RECORD_EXTERNAL) return INVALID_VALUE;
    if (!flags) return cuEventRecord(h, sh);
    if (!capturing(s)) return INVALID_VALUE;
    if (invalidated(s)) return CAPTURE_INVALIDATED;
    pthread_mutex_lock(&regmu);
    cap_add(s->cap, C_NODE, s, 0, e, 0);
    e->cap = 0, e->internal = 0; // no dependency inside the capture: the fake refuses a wait for it there, as for any event not recorded in it (the driver's documentation does not say)
    pthread_mutex_unlock(&regmu);
    return OK;
}
static void record_on(fevent *e, fstream *s) {
    op *o = newop(OP_RECORD);
    o->rec.e = e;
    pthread_mutex_lock(&regmu); // the record's ticket is set before its op can run
    pthread_mutex_lock(&s->mu);
    uint64_t t = s->queued + 1;
    pthread_mutex_unlock(&s->mu);
    e->s = s, e->ticket = t, e->t = 0, e->cap = 0, e->internal = 0;
    o->rec.ticket = t;
    enqueue(s, o);
    pthread_mutex_unlock(&regmu);
}
static void event_at(fevent *e, fstream **s, uint64_t *t) {
    pthread_mutex_lock(&regmu);
    *s = e->s, *t = e->ticket;
    pthread_mutex_unlock(&regmu);
}
// a stream may wait for another context's event, as CUDA allows; an event
// never recorded is no wait
CUresult cuStreamWaitEvent(void *sh, void *eh, unsigned flags) {
    fstream *s = stream(sh), *es;
    uint64_t t;
    if (!s || !eh || flags) return INVALID_HANDLE;
    fevent *e = eh;
    if (invalidated(s)) return CAPTURE_INVALIDATED;
    pthread_mutex_lock(&regmu);
    capture *ec = e->cap && e->cap->active ? e->cap : 0;
    if (ec && (!s->cap || s->cap == ec)) { // a dependency in the capture; s joins it
        if (!s->cap) s->cap = ec, ec->joined[ec->njoined++] = s;
        cap_add(ec, C_WAIT, s, 0, e->node, 0);
        pthread_mutex_unlock(&regmu);
        return OK;
    }
    pthread_mutex_unlock(&regmu);
    if (ec || s->cap) { // across captures, or an event recorded outside this one
        refuse(s);
        if (ec) ec->invalid = 1;
        return CAPTURE_ISOLATION;
    }
    event_at(eh, &es, &t);
    if (!es) return OK;
    op *o = newop(OP_WAIT);
    o->wait.s = es, o->wait.ticket = t;
    enqueue(s, o);
    return OK;
}
CUresult cuEventSynchronize(void *eh) {
    fstream *s;
    uint64_t t;
    if (((fevent *)eh)->cap) return ((fevent *)eh)->cap->active ? refuse(0) : INVALID_HANDLE; // never recorded outside a capture
    event_at(eh, &s, &t);
    if (!s) return OK;
    wait_done(s, t);
    return sticky(s->ctx);
}
// cuEventElapsedTime: "If either event was created with the
// CU_EVENT_DISABLE_TIMING flag, then this function will return
// CUDA_ERROR_INVALID_HANDLE"; never recorded: CUDA_ERROR_INVALID_HANDLE; not
// complete: CUDA_ERROR_NOT_READY
// (https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html).
// An event whose last record was capture-internal (cuEventRecord during a
// stream capture, without CU_EVENT_RECORD_EXTERNAL) holds no time however
// often the graph ran: CUDA_ERROR_INVALID_VALUE, as an H200 with driver
// 580.159.04 returned for moebench's phase events (and as
// https://forums.developer.nvidia.com/t/cuda-graphs-error-with-cudaeventelapsedtime-cudaeventinvalidvalue/205299
// and https://github.com/NVIDIA/warp/issues/556 report).
#define DISABLE_TIMING 2
CUresult cuEventElapsedTime_v2(float *ms, void *ah, void *bh) {
    fevent *a = ah, *b = bh;
    fstream *as, *bs;
    uint64_t at, bt;
    if (!a || !b || a->ctx != b->ctx) return INVALID_HANDLE;
    if ((a->flags | b->flags) & DISABLE_TIMING) return INVALID_HANDLE;
    pthread_mutex_lock(&regmu);
    int internal = a->internal || b->internal;
    pthread_mutex_unlock(&regmu);
    if (internal) return INVALID_VALUE;
    event_at(a, &as, &at);
    event_at(b, &bs, &bt);
    if (!as || !bs) return INVALID_HANDLE;
    if (!is_done(as, at) || !is_done(bs, bt)) return NOT_READY;
    pthread_mutex_lock(&regmu);
    *ms = (float)(b->t - a->t);
    pthread_mutex_unlock(&regmu);
    return OK;
}

// ---- memory
// Allocations: a table of (base, size, context; host: flags of
// cuMemHostAlloc). Each is mapped on its own with an inaccessible page right
// after its last 256-byte granule, so that a kernel (on the host simulation)
// or a copy that runs past the end of a buffer faults at once instead of
// reading or overwriting a neighbour.
#define MAXA 4096
#define PAGE 4096
static pthread_mutex_t allocmu = PTHREAD_MUTEX_INITIALIZER;
static struct { CUdeviceptr p; size_t n; void *ctx; void *map; size_t maplen; int host; unsigned flags; } allocs[MAXA];
static int find(CUdeviceptr p) { // allocmu held
    for (int i = 0; i < MAXA; i++)
        if (allocs[i].p && p >= allocs[i].p && p < allocs[i].p + allocs[i].n + (allocs[i].n == 0)) return i;
    return -1;
}
static void *owner(CUdeviceptr p) {
    pthread_mutex_lock(&allocmu);
    int i = find(p);
    void *c = i >= 0 && !allocs[i].host ? allocs[i].ctx : 0;
    pthread_mutex_unlock(&allocmu);
    return c;
}
// pinned: p lies in memory of cuMemHostAlloc
static int pinned(const void *p) {
    pthread_mutex_lock(&allocmu);
    int i = find((CUdeviceptr)p);
    int h = i >= 0 && allocs[i].host;
    pthread_mutex_unlock(&allocmu);
    return h;
}
// Poison: cuMemAlloc's memory "is not cleared" and cuMemHostAlloc promises
// nothing of its contents either; a real GPU hands back what a freed buffer
// held. Every allocation here is filled with the 16-bit word 0x7FFF (bytes
// FF 7F), so that code reading memory it never wrote fails loudly rather
// than finding the zeros anonymous pages hold: bf16, fp16, fp32 and fp64 read
// it as NaN, fp8 (e4m3, e5m2) too, int32 as 2147450879 and int64 as a huge
// positive count, a pointer as a non-canonical address. Zero what must start
// at zero (cuMemsetD16Async) before its first use.
#define POISON16 0x7FFFu
// fakecuda_owner is owner for fakenccl.c.
void *fakecuda_owner(CUdeviceptr p) { return owner(p); }
static CUresult map(CUdeviceptr *p, size_t n, int host, unsigned flags) {
    size_t r = ((n ? n : 1) + 255) / 256 * 256; // 256-byte aligned, as cuMemAlloc's
    size_t body = (r + PAGE - 1) / PAGE * PAGE;
    char *m = mmap(0, body + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return OUT_OF_MEMORY;
    if (mprotect(m + body, PAGE, PROT_NONE)) { munmap(m, body + PAGE); return OUT_OF_MEMORY; }
    for (uint16_t *w = (uint16_t *)m, *e = (uint16_t *)(m + body); w < e; w++) *w = POISON16;
    pthread_mutex_lock(&allocmu);
    for (int i = 0; i < MAXA; i++) {
        if (allocs[i].p) continue;
        allocs[i].p = (CUdeviceptr)(m + body - r);
        allocs[i].n = n, allocs[i].ctx = cur, allocs[i].map = m, allocs[i].maplen = body + PAGE;
        allocs[i].host = host, allocs[i].flags = flags;
        *p = allocs[i].p;
        pthread_mutex_unlock(&allocmu);
        return OK;
    }
    pthread_mutex_unlock(&allocmu);
    munmap(m, body + PAGE);
    return OUT_OF_MEMORY;
}
// unmap frees an allocation after the work queued that may use it: for
// device memory its context's (cuMemFree synchronizes the device, not its
// peers: a peer's work still reading it is the caller's bug, and faults
// here), for page-locked host memory every context's.
static CUresult unmap(CUdeviceptr p, int host) {
    void *ctx = host ? 0 : owner(p);
    if (!host && !ctx) return INVALID_VALUE;
    drain(ctx);
    pthread_mutex_lock(&allocmu);
    for (int i = 0; i < MAXA; i++)
        if (allocs[i].p == p && allocs[i].host == host) {
            allocs[i].p = 0;
            munmap(allocs[i].map, allocs[i].maplen);
            pthread_mutex_unlock(&allocmu);
            return OK;
        }
    pthread_mutex_unlock(&allocmu);
    return INVALID_VALUE;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (any_capture()) return refuse(0); // may synchronize: refused while capturing
    return cur ? map(p, n, 0, 0) : INVALID_CONTEXT;
}
CUresult cuMemFree_v2(CUdeviceptr p) { return any_capture() ? refuse(0) : unmap(p, 0); }
// Page-locked host memory: flags PORTABLE (1), DEVICEMAP (2) and
// WRITECOMBINED (4), any others refused; the device pointer of a mapped
// allocation is its host address (unified addressing).
CUresult cuMemHostAlloc(void **pp, size_t n, unsigned flags) {
    if (!cur) return INVALID_CONTEXT;
    if (any_capture()) return refuse(0);
    if (flags & ~7u) return INVALID_VALUE;
    CUdeviceptr p;
    CUresult r = map(&p, n, 1, flags);
    if (r == OK) *pp = (void *)p;
    return r;
}
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
    if (!cur) return INVALID_CONTEXT;
    if (flags != 0) return INVALID_VALUE; // "for now, it must be set to 0"
    pthread_mutex_lock(&allocmu);
    int i = find((CUdeviceptr)p);
    int ok = i >= 0 && allocs[i].host && (allocs[i].flags & 2);
    pthread_mutex_unlock(&allocmu);
    if (!ok) return INVALID_VALUE; // not from cuMemHostAlloc with DEVICEMAP
    *d = (CUdeviceptr)p;
    return OK;
}
CUresult cuMemFreeHost(void *p) { return any_capture() ? refuse(0) : unmap((CUdeviceptr)p, 1); }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = (size_t)1 << 30; *t = (size_t)2 << 30; return OK; }

#define ON_STREAM(p, st) if (owner(p) != sctx(st)) return INVALID_VALUE
#define STREAM_OR_FAIL(s, h) fstream *s = stream(h); if (!s) return INVALID_CONTEXT; if (sticky(s->ctx)) return sticky(s->ctx); if (invalidated(s)) return CAPTURE_INVALIDATED
static void copy_op(fstream *s, void *dst, const void *src, size_t n, int stage) {
    op *o = newop(OP_COPY);
    o->copy.dst = dst, o->copy.src = src, o->copy.n = n;
    if (stage) { // pageable source: staged now, as the driver does
        o->copy.staged = malloc(n ? n : 1);
        memcpy(o->copy.staged, src, n);
        o->copy.src = o->copy.staged;
    }
    enqueue(s, o);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *src, size_t n, void *st) {
    ON_STREAM(d, st);
    STREAM_OR_FAIL(s, st);
    if (capturing(s) && !pinned(src)) return refuse(s);
    copy_op(s, (void *)d, src, n, !pinned(src));
    return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *st) {
    ON_STREAM(src, st);
    STREAM_OR_FAIL(s, st);
    if (capturing(s) && !pinned(dst)) return refuse(s);
    op *o = newop(OP_COPY);
    o->copy.dst = dst, o->copy.src = (void *)src, o->copy.n = n;
    uint64_t t = enqueue(s, o);
    if (!pinned(dst)) wait_done(s, t); // into pageable memory: returns when copied
    return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, void *st) {
    ON_STREAM(d, st); ON_STREAM(src, st);
    STREAM_OR_FAIL(s, st);
    copy_op(s, (void *)d, (void *)src, n, 0);
    return OK;
}
CUresult cuMemcpyPeerAsync(CUdeviceptr d, void *dc, CUdeviceptr src, void *sc, size_t n, void *st) {
    if (dc == sc || owner(d) != dc || owner(src) != sc || (sctx(st) != dc && sctx(st) != sc)) return INVALID_VALUE;
    STREAM_OR_FAIL(s, st);
    copy_op(s, (void *)d, (void *)src, n, 0);
    return OK;
}
// The CUDA 13 batch copy: checks the attributes moebench passes (one set,
// stream-ordered sources, device hints naming the GPUs that own the
// pointers, the prefer-overlap flag).
CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, mb_memcpy_attrs *a, size_t *idx, size_t nattrs, void *st) {
    if ( nattrs != 1 || idx[0] != 0 || a->srcAccessOrder != 1 || a->srcLocHint.type != 1 ||
        a->dstLocHint.type != 1 || a->flags != 1 || st == 0) return INVALID_VALUE;
    if (getenv("FAKECUDA_REFUSE_BATCH")) return INVALID_VALUE; /* as a driver might */
    if (capturing(stream(st))) return refuse(stream(st)); /* no graph node form */
    for (size_t i = 0; i < count; i++)
        if (owner(s[i]) != CTX(100 + a->srcLocHint.id) || owner(d[i]) != CTX(100 + a->dstLocHint.id)) return INVALID_VALUE;
    STREAM_OR_FAIL(fs, st);
    op *o = newop(OP_BATCH);
    o->batch.count = count;
    o->batch.d = malloc(3 * count * sizeof(CUdeviceptr) + 1); // the three arrays in one
    o->batch.s = o->batch.d + count;
    o->batch.n = (size_t *)(o->batch.s + count);
    memcpy(o->batch.d, d, count * sizeof *d);
    memcpy(o->batch.s, s, count * sizeof *s);
    memcpy(o->batch.n, n, count * sizeof *n);
    enqueue(fs, o);
    return OK;
}
CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, void *st) {
    ON_STREAM(d, st);
    STREAM_OR_FAIL(s, st);
    op *o = newop(OP_FILL16);
    o->fill.p = (unsigned short *)d, o->fill.v = v, o->fill.n = n;
    enqueue(s, o);
    return OK;
}

// ---- modules and kernels
// Host modules: the image (a 64-bit ELF shared object, whose size is where
// its section headers end) is written to a file and dlopened; kernel NAME is
// its mbhost_kernel_NAME. Any other ELF image (a cubin: machine 190,
// EM_CUDA) is the one-kernel module of "add".
typedef struct { unsigned gx, gy, gz, bx, by, bz, smem, cx, cy, cz; } mbhost_geom;
typedef struct {
    unsigned abi;
    int max_threads, min_blocks, regs;
    void *(*bind)(void **);
    void (*unbind)(void *);
    int (*run)(void *, const mbhost_geom *, int (*)(void *), void *);
} mbhost_kernel;
#define MBHOST_ABI 2
#define HOSTMAGIC 0x6d62686fu
// a module (dl) or a kernel (k), with the kernel's attributes
typedef struct hostobj {
    unsigned magic;
    void *dl;
    const mbhost_kernel *k;
    struct hostobj *next;
    int static_smem; // the module's __shared__ bytes
    int max_dyn;     // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    char name[128];  // a kernel's
} hostobj;
// skipped: $FAKECUDA_SKIP_KERNELS (read at each launch) names kernel k, or
// is "*": its launches are checked, then do nothing (a benchmark of the
// host's issue cost alone)
static int skipped(const hostobj *k) {
    const char *skip = getenv("FAKECUDA_SKIP_KERNELS");
    if (!skip || !k->name[0]) return 0;
    if (strcmp(skip, "*") == 0) return 1;
    char list[1024], want[140];
    snprintf(list, sizeof list, ",%s,", skip);
    snprintf(want, sizeof want, ",%s,", k->name);
    return strstr(list, want) != 0;
}
// delay_us: $FAKECUDA_DELAY_KERNELS (read at each launch), a test-only
// planted delay, "NAME=US[,NAME=US...]": each launch of kernel NAME ends
// US microseconds later, its stream held meanwhile, and the event clock
// moves on by US, as a slower kernel would (a test makes one design
// clearly slower this way; without the clock's share the events, which
// time every step, would not see it)
static long delay_us(const hostobj *k) {
    const char *v = getenv("FAKECUDA_DELAY_KERNELS");
    if (!v || !k->name[0]) return 0;
    size_t n = strlen(k->name);
    for (const char *p = v; *p;) {
        if (strncmp(p, k->name, n) == 0 && p[n] == '=') return atol(p + n + 1);
        const char *c = strchr(p, ',');
        if (!c) break;
        p = c + 1;
    }
    return 0;
}
static hostobj add_kernel = {0, 0, 0, 0, 0, BLOCK_SMEM}; // the cubin's "add"
#define ADD ((void *)&add_kernel)
#define CUBIN_MODULE ((void *)0x3000)
static int elf_machine(const unsigned char *img) { return img[18] | img[19] << 8; }
// tls_bytes: the memory size of the image's PT_TLS segment (0 without)
static size_t tls_bytes(const unsigned char *e) {
    Elf64_Ehdr h;
    memcpy(&h, e, sizeof h);
    for (int i = 0; i < h.e_phnum; i++) {
        Elf64_Phdr ph;
        memcpy(&ph, e + h.e_phoff + (size_t)i * h.e_phentsize, sizeof ph);
        if (ph.p_type == PT_TLS) return ph.p_memsz;
    }
    return 0;
}
CUresult cuModuleLoadData(void **m, const void *img) {
    if (!cur) return INVALID_CONTEXT;
    if (any_capture()) return refuse(0);
    const unsigned char *e = img;
    if (memcmp(e, "\x7f" "ELF", 4) != 0) return INVALID_IMAGE;
    if (e[4] != 2 || elf_machine(e) == 190) { *m = CUBIN_MODULE; return OK; } // not a 64-bit host ELF
    uint64_t shoff; uint16_t shentsize, shnum;
    memcpy(&shoff, e + 0x28, 8); memcpy(&shentsize, e + 0x3a, 2); memcpy(&shnum, e + 0x3c, 2);
    char path[] = "/tmp/fakecuda-module-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return OUT_OF_MEMORY;
    size_t n = shoff + (size_t)shentsize * shnum;
    int ok = write(fd, e, n) == (ssize_t)n;
    close(fd);
    void *dl = ok ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : 0;
    unlink(path);
    if (!dl) return INVALID_IMAGE;
    unsigned long (*own)(void) = (unsigned long (*)(void))dlsym(dl, "mbhost_tls_own");
    hostobj *h = calloc(1, sizeof *h); h->magic = HOSTMAGIC; h->dl = dl;
    size_t tls = tls_bytes(e), mine = own ? own() : 0;
    h->static_smem = tls > mine ? (int)(tls - mine) : 0;
    *m = h; return OK;
}
static hostobj *host(void *p) { return p && p != CUBIN_MODULE && p != ADD && ((hostobj *)p)->magic == HOSTMAGIC ? p : 0; }
CUresult cuModuleUnload(void *m) {
    if (any_capture()) return refuse(0);
    drain(0); // its kernels may still run
    hostobj *h = host(m);
    while (h) { // the module, then the kernels looked up in it
        hostobj *next = h->next;
        if (h->dl) dlclose(h->dl);
        h->magic = 0; free(h); h = next;
    }
    return OK;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
    hostobj *h = host(m);
    if (h) {
        char sym[256];
        snprintf(sym, sizeof sym, "mbhost_kernel_%s", name);
        const mbhost_kernel *(*get)(void) = (const mbhost_kernel *(*)(void))dlsym(h->dl, sym);
        if (!get) return NOT_FOUND;
        if (get()->abi != MBHOST_ABI) return INVALID_IMAGE;
        hostobj *k = calloc(1, sizeof *k); k->magic = HOSTMAGIC; k->k = get(); k->next = h->next; h->next = k;
        snprintf(k->name, sizeof k->name, "%s", name);
        k->static_smem = h->static_smem;
        k->max_dyn = BLOCK_SMEM - k->static_smem > 0 ? BLOCK_SMEM - k->static_smem : 0;
        *f = k; return OK;
    }
    if (m != CUBIN_MODULE || strcmp(name, "add") != 0) return NOT_FOUND;
    *f = ADD; return OK;
}
static hostobj *kernel(void *f) { hostobj *h = host(f); return f == ADD ? &add_kernel : h && h->k ? h : 0; }
static int kregs(hostobj *k) { return k->k ? k->k->regs : 32; }
// maxThreads: the most threads per block a launch of k may have (its
// launch bounds, and registers: 64 Ki per block)
static int max_threads(hostobj *k) {
    int n = BLOCK_REGS / kregs(k) / 32 * 32;
    if (n > 1024) n = 1024;
    if (k->k && k->k->max_threads > 0 && k->k->max_threads < n) n = k->k->max_threads;
    return n;
}
CUresult cuFuncGetAttribute(int *v, int attr, void *f) {
    hostobj *k = kernel(f);
    if (!k) return INVALID_HANDLE;
    switch (attr) {
    case 0: *v = max_threads(k); break;     // MAX_THREADS_PER_BLOCK
    case 1: *v = k->static_smem; break;     // SHARED_SIZE_BYTES
    case 2: case 3: *v = 0; break;          // CONST_SIZE_BYTES, LOCAL_SIZE_BYTES
    case 4: *v = kregs(k); break;           // NUM_REGS
    case 5: case 6: *v = 90; break;         // PTX_VERSION, BINARY_VERSION
    case 8: *v = k->max_dyn; break;         // MAX_DYNAMIC_SHARED_SIZE_BYTES
    default: return INVALID_VALUE;
    }
    return OK;
}
// only the dynamic shared memory limit can be set: its sum with the static
// size may not exceed the opt-in limit
CUresult cuFuncSetAttribute(void *f, int attr, int v) {
    hostobj *k = kernel(f);
    if (!k) return INVALID_HANDLE;
    if (attr != 8 || v < 0 || v + k->static_smem > smem_optin) return INVALID_VALUE;
    k->max_dyn = v;
    return OK;
}

// need: what one block of k takes of an SM (threads in whole warps,
// registers given to warps in units of 256, shared memory with the
// driver's reserve)
static sm_use need(hostobj *k, int threads, int dyn) {
    int warps = (threads + 31) / 32, perWarp = (kregs(k) * 32 + 255) / 256 * 256;
    return (sm_use){warps * 32, perWarp * warps, k->static_smem + dyn + SMEM_RESERVED, 1};
}
static int occupancy(hostobj *k, int threads, int dyn) {
    if (threads <= 0 || threads > max_threads(k)) return 0;
    sm_use u = need(k, threads, dyn);
    int n = SM_BLOCKS;
    if (SM_THREADS / u.threads < n) n = SM_THREADS / u.threads;
    if (SM_REGS / u.regs < n) n = SM_REGS / u.regs;
    if (SM_SMEM / u.smem < n) n = SM_SMEM / u.smem;
    return n;
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, void *f, int block, size_t dyn, unsigned flags) {
    hostobj *k = kernel(f);
    if (!k) return INVALID_HANDLE;
    if (flags > 1 || block <= 0) return INVALID_VALUE;
    *n = occupancy(k, block, (int)dyn);
    return OK;
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, void *f, int block, size_t dyn) {
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, f, block, dyn, 0);
}

// A host kernel's launch: its arguments (bound), shape and the blocks
// handed out so far; run_kernel places them on the SMs.
struct klaunch {
    hostobj *k;
    void *args;
    mbhost_geom g;
    int coop, dev;
    unsigned blocks;
    sm_use need;
    atomic_uint next;   // the next block to hand out
    atomic_int status;  // the first failure of a block
    int keep;           // a graph's: run again at each launch, freed with the graph
};
static void klaunch_keep(klaunch *l) { l->keep = 1; }
static void klaunch_free(klaunch *l) { l->k->k->unbind(l->args); free(l); }
static int next_block(void *p) {
    klaunch *l = p;
    unsigned b = atomic_fetch_add(&l->next, 1);
    return b < l->blocks ? (int)b : -1;
}
static int fits(const sm_use *u, const sm_use *n) {
    return u->threads + n->threads <= SM_THREADS && u->regs + n->regs <= SM_REGS && u->smem + n->smem <= SM_SMEM &&
           u->blocks + n->blocks <= SM_BLOCKS;
}
// place takes room for one block on the least loaded SM that has it (mu
// held); −1 when none has
static int place(fgpu *g, const sm_use *n) {
    int best = -1;
    for (int i = 0; i < nsms; i++)
        if (fits(&g->sm[i], n) && (best < 0 || g->sm[i].blocks < g->sm[best].blocks)) best = i;
    if (best >= 0) g->sm[best].threads += n->threads, g->sm[best].regs += n->regs, g->sm[best].smem += n->smem, g->sm[best].blocks++;
    return best;
}
static void unplace(fgpu *g, int sm, const sm_use *n) { // mu held
    g->sm[sm].threads -= n->threads, g->sm[sm].regs -= n->regs, g->sm[sm].smem -= n->smem, g->sm[sm].blocks--;
    pthread_cond_broadcast(&g->cv);
}
typedef struct { klaunch *l; int sm; pthread_t th; } kworker;
static void *kworker_main(void *p) {
    kworker *w = p;
    klaunch *l = w->l;
    int st = l->k->k->run(l->args, &l->g, next_block, l);
    if (st) {
        int zero = 0;
        atomic_compare_exchange_strong(&l->status, &zero, st);
        atomic_store(&l->next, l->blocks); // hand out no more
    }
    fgpu *g = &gpu[l->dev];
    pthread_mutex_lock(&g->mu);
    unplace(g, w->sm, &l->need);
    pthread_mutex_unlock(&g->mu);
    return 0;
}
static void spawn(kworker *w) {
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 1 << 20);
    pthread_create(&w->th, &a, kworker_main, w);
    pthread_attr_destroy(&a);
}
// run_kernel runs on the stream's thread: it places blocks (a cooperative
// launch all at once), each on a thread of its own, and waits for them.
static CUresult run_kernel(klaunch *l) {
    fgpu *g = &gpu[l->dev];
    atomic_store(&l->next, 0);
    atomic_store(&l->status, 0);
    if (skipped(l->k)) { // replayed from a graph (launch() checks the others)
        if (!l->keep) klaunch_free(l);
        return OK;
    }
    int cap = nsms * SM_BLOCKS, n = 0;
    kworker *ws = calloc(cap, sizeof *ws);
    pthread_mutex_lock(&g->mu);
    if (l->coop && l->blocks > (unsigned)(occupancy(l->k, l->g.bx * l->g.by * l->g.bz, l->g.smem) * nsms)) {
        atomic_store(&l->status, 1); // never placeable (launch refuses it): fail, not hang
        pthread_mutex_unlock(&g->mu);
    } else if (l->coop) {
        for (;;) { // until every block has room at once
            for (n = 0; n < (int)l->blocks; n++) {
                int s = place(g, &l->need);
                if (s < 0) break;
                ws[n].sm = s;
            }
            if (n == (int)l->blocks) break;
            while (n > 0) unplace(g, ws[--n].sm, &l->need);
            pthread_cond_wait(&g->cv, &g->mu);
        }
        pthread_mutex_unlock(&g->mu);
        for (int i = 0; i < n; i++) ws[i].l = l, spawn(&ws[i]);
    } else {
        while (atomic_load(&l->next) < l->blocks && n < cap) {
            int s = place(g, &l->need);
            if (s < 0) { // full: wait for a block to end
                pthread_cond_wait(&g->cv, &g->mu);
                continue;
            }
            pthread_mutex_unlock(&g->mu);
            ws[n].l = l, ws[n].sm = s;
            spawn(&ws[n++]);
            pthread_mutex_lock(&g->mu);
        }
        pthread_mutex_unlock(&g->mu);
    }
    for (int i = 0; i < n; i++) pthread_join(ws[i].th, 0);
    free(ws);
    long us = delay_us(l->k);
    if (us > 0) { // held, and seen by the event clock (which wall time is not)
        usleep((useconds_t)us);
        fakecuda_advance(us / 1e3);
    }
    int st = atomic_load(&l->status);
    if (!l->keep) klaunch_free(l);
    if (st) {
        pthread_mutex_lock(&g->mu);
        if (!g->failed) g->failed = LAUNCH_FAILED;
        pthread_mutex_unlock(&g->mu);
        return LAUNCH_FAILED;
    }
    return OK;
}

// launch checks a launch as the driver does and queues it. A host kernel
// runs on the host simulation; the cubin's "add" does x[i] += a for i < n,
// then x[n] = the launch geometry (grid·(100,10,1) + block·(1000,1,1) +
// shared/1024), plus 10⁶ for a cooperative launch and 2·10⁶·cluster x for
// a clustered one, for the test.
static CUresult launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned smem, void *st, void **params, int coop, unsigned cx, unsigned cy, unsigned cz) {
    hostobj *k = kernel(f);
    if (!k) return INVALID_HANDLE;
    if (sctx(st) != cur || !cur) return INVALID_VALUE;
    STREAM_OR_FAIL(s, st);
    unsigned long blocks = (unsigned long)gx * gy * gz;
    int threads = bx * by * bz;
    if (blocks == 0 || threads == 0 || bx > 1024 || by > 1024 || bz > 64) return INVALID_VALUE;
    if ((int)smem > k->max_dyn) return INVALID_VALUE;
    if (threads > max_threads(k)) return OUT_OF_RESOURCES;
    int per = occupancy(k, threads, smem);
    if (per == 0) return OUT_OF_RESOURCES;
    if (coop && blocks > (unsigned long)per * nsms) return COOP_TOO_LARGE;
    if (cx && (gx % cx || gy % (cy ? cy : 1) || gz % (cz ? cz : 1))) return INVALID_VALUE; // whole clusters
    if (k == &add_kernel) {
        ON_STREAM(*(CUdeviceptr *)params[0], st);
        op *o = newop(OP_ADD);
        o->add.x = (float *)*(CUdeviceptr *)params[0];
        o->add.n = *(int *)params[1];
        o->add.a = *(float *)params[2];
        o->add.mark = (float)(gx * 100 + gy * 10 + gz + bx * 1000 + by + bz + smem / 1024) + 1e6f * coop + 2e6f * cx;
        enqueue(s, o);
        return OK;
    }
    if (threads % 32) {
        fprintf(stderr, "fakecuda: the host simulation runs whole warps; a block of %d threads\n", threads);
        return INVALID_VALUE;
    }
    if (skipped(k)) return OK;
    klaunch *l = calloc(1, sizeof *l);
    l->k = k, l->args = k->k->bind(params);
    l->g = (mbhost_geom){gx, gy, gz, bx, by, bz, smem, cx, cy, cz};
    l->coop = coop, l->dev = CTXDEV(cur), l->blocks = blocks;
    l->need = need(k, threads, smem);
    op *o = newop(OP_KERNEL);
    o->k = l;
    enqueue(s, o);
    return OK;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void *st, void **params, void **extra) {
    if (extra != 0) return INVALID_VALUE;
    return launch(f, gx, gy, gz, bx, by, bz, smem, st, params, 0, 0, 0, 0);
}
CUresult cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                   unsigned smem, void *st, void **params) {
    return launch(f, gx, gy, gz, bx, by, bz, smem, st, params, 1, 0, 0, 0);
}
// cuLaunchKernelEx with CUDA's layouts (abi.h's mb_launch_config and
// mb_launch_attr, which TestABIHeaders checks against cuda.h):
// CUlaunchAttribute is an enum id, padding to 8 bytes and a 64-byte union
// with pointer members, so an array of them is 8-byte aligned (a driver
// may read 8-byte members); attributes 2 (cooperative) and 4 (cluster
// dimension) are understood, others refused.
CUresult cuLaunchKernelEx(const mb_launch_config *c, void *f, void **params, void **extra) {
    if (extra != 0 || (c->numAttrs && (!c->attrs || (uintptr_t)c->attrs % 8))) return INVALID_VALUE;
    int coop = 0;
    unsigned cx = 0, cy = 0, cz = 0;
    for (unsigned i = 0; i < c->numAttrs; i++) {
        const mb_launch_attr *a = &c->attrs[i];
        if (a->id == 2) coop = a->value.cooperative;
        else if (a->id == 4 && a->value.cluster.x && a->value.cluster.y && a->value.cluster.z)
            cx = a->value.cluster.x, cy = a->value.cluster.y, cz = a->value.cluster.z;
        else return INVALID_VALUE;
    }
    return launch(f, c->gridX, c->gridY, c->gridZ, c->blockX, c->blockY, c->blockZ, c->sharedBytes, c->stream, params, coop != 0, cx, cy, cz);
}
// ---- graphs: the capture entry points (see "stream capture" above)

CUresult cuStreamBeginCapture_v2(void *h, int mode) {
    fstream *s = h;
    if (!s) return CAPTURE_UNSUPPORTED; // the legacy stream cannot be captured
    if (mode < 0 || mode > 2) return INVALID_VALUE;
    pthread_mutex_lock(&regmu);
    if (s->cap) { pthread_mutex_unlock(&regmu); return ILLEGAL_STATE; }
    capture *c = calloc(1, sizeof *c);
    c->origin = s, c->active = 1, c->joined[c->njoined++] = s;
    s->cap = c;
    active_captures++;
    pthread_mutex_unlock(&regmu);
    return OK;
}
// free_capture frees a capture's calls (no launch of it may be queued)
static void free_capture(capture *c) {
    drain(0);
    for (int i = 0; i < c->n; i++) {
        fevent *ev = c->v[i].ev;
        pthread_mutex_lock(&regmu);
        if (c->v[i].kind == C_RECORD && ev->cap == c) ev->cap = 0, ev->node = 0; // still capture-internal (ev->internal)
        pthread_mutex_unlock(&regmu);
        if (c->v[i].kind == C_RECORD) free(c->v[i].e); // the record's own event: the launches' work is done
        op *o = c->v[i].o;
        if (!o) continue;
        switch (o->kind) {
        case OP_KERNEL: klaunch_free(o->k); break;
        case OP_BATCH: free(o->batch.d); break;
        case OP_COPY: free(o->copy.staged); break;
        case OP_HOST: if (o->host.release) o->host.release(o->host.arg); break;
        }
        free(o);
    }
    free(c->v);
    free(c);
}
// joined_back: every stream that joined c was joined back: its last call
// records an event that the origin, or a stream joined back itself, waits
// for later (a fork joined into another stream that is joined counts, as
// for the driver)
static int joined_back(capture *c) {
    int back[MAXS] = {0}, changed = 1, n = 1;
    back[0] = 1; // the origin
    while (changed) {
        changed = 0;
        for (int j = 1; j < c->njoined; j++) {
            if (back[j]) continue;
            int last = -1;
            for (int i = 0; i < c->n; i++) if (c->v[i].s == c->joined[j]) last = i;
            if (last < 0 || c->v[last].kind != C_RECORD) continue;
            for (int i = last + 1; i < c->n && !back[j]; i++) {
                if (c->v[i].kind != C_WAIT || c->v[i].e != c->v[last].e) continue;
                for (int k = 0; k < c->njoined; k++)
                    if (back[k] && c->joined[k] == c->v[i].s) back[j] = 1;
            }
            if (back[j]) changed = 1, n++;
        }
    }
    return n == c->njoined;
}
CUresult cuStreamEndCapture(void *h, void **graph) {
    fstream *s = h;
    *graph = 0;
    pthread_mutex_lock(&regmu);
    capture *c = s ? s->cap : 0;
    if (!c) { pthread_mutex_unlock(&regmu); return ILLEGAL_STATE; }
    if (c->origin != s) { c->invalid = 1; pthread_mutex_unlock(&regmu); return CAPTURE_UNMATCHED; }
    for (int j = 0; j < c->njoined; j++) c->joined[j]->cap = 0;
    c->active = 0;
    active_captures--;
    pthread_mutex_unlock(&regmu);
    CUresult r = c->invalid ? CAPTURE_INVALIDATED : !joined_back(c) ? CAPTURE_UNJOINED : OK;
    if (r != OK) { free_capture(c); return r; }
    fgraph *g = malloc(sizeof *g);
    g->c = c, c->refs = 1;
    *graph = g;
    return OK;
}
CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
    fgraph *g = graph;
    if (!g || flags) return INVALID_VALUE;
    fgraph *x = malloc(sizeof *x);
    x->c = g->c, g->c->refs++;
    *exec = x;
    return OK;
}
// cuGraphLaunch replays the capture's calls, each on its own stream, after
// the launching stream's work so far; the launching stream's later work
// follows all of them
CUresult cuGraphLaunch(void *exec, void *h) {
    fgraph *x = exec;
    if (!x) return INVALID_HANDLE;
    STREAM_OR_FAIL(s, h);
    capture *c = x->c;
    for (int j = 0; j < c->njoined; j++)
        if (c->joined[j]->cap || s->cap) return refuse(s); // not while capturing
    for (int j = 0; j < c->njoined; j++)
        if (c->joined[j] != s) {
            op *o = newop(OP_WAIT);
            o->wait.s = s, o->wait.ticket = queued(s);
            enqueue(c->joined[j], o);
        }
    for (int i = 0; i < c->n; i++) {
        centry *e = &c->v[i];
        if (e->kind == C_RECORD || e->kind == C_NODE) record_on(e->e, e->s); // C_RECORD: the record's own event
        else if (e->kind == C_WAIT) cuStreamWaitEvent(e->s, e->e, 0);
        else {
            op *o = malloc(sizeof *o);
            *o = *e->o;
            o->keep = 1;
            enqueue(e->s, o);
        }
    }
    for (int j = 0; j < c->njoined; j++)
        if (c->joined[j] != s) {
            op *o = newop(OP_WAIT);
            o->wait.s = c->joined[j], o->wait.ticket = queued(c->joined[j]);
            enqueue(s, o);
        }
    return OK;
}
static CUresult graph_free(fgraph *g) {
    if (!g) return INVALID_HANDLE;
    if (--g->c->refs == 0) free_capture(g->c);
    free(g);
    return OK;
}
CUresult cuGraphExecDestroy(void *exec) { return graph_free(exec); }
CUresult cuGraphDestroy(void *graph) { return graph_free(graph); }

CUresult cuGetErrorName(CUresult r, const char **s) {
    switch (r) {
    case ILLEGAL_STATE: *s = "CUDA_ERROR_ILLEGAL_STATE"; return OK;
    case CAPTURE_UNSUPPORTED: *s = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; return OK;
    case CAPTURE_INVALIDATED: *s = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; return OK;
    case CAPTURE_UNMATCHED: *s = "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED"; return OK;
    case CAPTURE_UNJOINED: *s = "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"; return OK;
    case CAPTURE_ISOLATION: *s = "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"; return OK;
    case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
    case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
    case INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; return OK;
    case INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; return OK;
    case PEER_ALREADY: *s = "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"; return OK;
    case INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; return OK;
    case NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; return OK;
    case NOT_READY: *s = "CUDA_ERROR_NOT_READY"; return OK;
    case OUT_OF_RESOURCES: *s = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"; return OK;
    case LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; return OK;
    case COOP_TOO_LARGE: *s = "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"; return OK;
    }
    return INVALID_VALUE;
}
