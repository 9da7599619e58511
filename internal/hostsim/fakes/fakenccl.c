// A fake libnccl for the binding tests, to be loaded after fakecuda.c
// (whose "device" memory is host memory): communicators of one process over
// GPU ordinals, and grouped send/recv matched at ncclGroupEnd (each send
// with the receive its peer posted for it, in order) and run on the GPUs'
// streams in their order (fakecuda_enqueue). It refuses
// what NCCL refuses and what would hang a single thread driving several
// GPUs: a GPU named twice, a transfer outside a group, a send with no
// matching receive (or a different size), a stream of another GPU, a buffer
// another GPU owns. Like the CUDA runtime, it leaves the context of the last
// GPU it worked on current, so that a caller caching the current context is
// caught.
#define MB_ABI_DECLARE // moebench's prototypes: a definition here that differs does not compile
#include "abi.h"
#define _GNU_SOURCE
#include "fakedriver.h"
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <pthread.h>

typedef int ncclResult_t;
typedef unsigned long long CUdeviceptr;
enum { ok = 0, invalidArgument = 4, invalidUsage = 5 };

static char last[256];
static ncclResult_t fail(ncclResult_t r, const char *msg) { snprintf(last, sizeof last, "%s", msg); return r; }

ncclResult_t ncclGetVersion(int *v) {
    const char *e = getenv("FAKENCCL_VERSION");
    *v = e ? atoi(e) : 22105; // 2.21.5
    return ok;
}
const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case invalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case invalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    }
    return "unknown result code";
}
const char *ncclGetLastError(void *comm) { return last; }

// fakecuda's context of a GPU ordinal (CUdevice 100 + ordinal, context
// 0x1000 + CUdevice), its streams' first field (their context), and its
// allocation owners; the fake driver is the one loaded from
// $MOEBENCH_LIBCUDA (tests load several, one per test).
#define CTX(dev) ((void *)(0x1000L + 100 + (dev)))
static void setCurrent(int dev) {
    int (*set)(void *) = (int (*)(void *))fakecuda_sym("cuCtxSetCurrent");
    if (set) set(CTX(dev));
}
static void *owner(CUdeviceptr p) {
    void *(*f)(CUdeviceptr) = (void *(*)(CUdeviceptr))fakecuda_sym("fakecuda_owner");
    return f ? f(p) : 0;
}

typedef struct { int rank, nranks, dev, clique; } fcomm;
static int cliques;

ncclResult_t ncclCommInitAll(void **comms, int n, const int *devs) {
    if (n < 1) return fail(invalidArgument, "ncclCommInitAll: no devices");
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (devs[i] == devs[j]) {
                snprintf(last, sizeof last, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d", j, i, devs[i]);
                return invalidUsage;
            }
    cliques++;
    for (int i = 0; i < n; i++) {
        fcomm *c = malloc(sizeof(fcomm));
        *c = (fcomm){i, n, devs[i], cliques};
        comms[i] = c;
        setCurrent(devs[i]);
    }
    return ok;
}
ncclResult_t ncclCommDestroy(void *c) {
    if (!c) return fail(invalidArgument, "ncclCommDestroy: null communicator");
    free(c);
    return ok;
}

#define MAXOPS 4096
typedef struct { fcomm *c; int peer, send, done; CUdeviceptr buf; size_t bytes; void *stream; } op;
static op ops[MAXOPS];
static int nops, depth;

ncclResult_t ncclGroupStart(void) { depth++; return ok; }

static ncclResult_t post(int send, CUdeviceptr buf, size_t count, int type, int peer, fcomm *c, void *stream) {
    if (!depth) return fail(invalidUsage, "a transfer outside a group: one thread driving several GPUs would hang");
    if (type != 1) return fail(invalidArgument, "the fake moves bytes (ncclUint8) only");
    if (!c || peer < 0 || peer >= c->nranks) return fail(invalidArgument, "peer out of range");
    if (!stream || *(void **)stream != CTX(c->dev)) return fail(invalidArgument, "a stream of another GPU");
    if (count && owner(buf) != CTX(c->dev)) return fail(invalidArgument, "a buffer another GPU owns");
    if (nops == MAXOPS) return fail(invalidUsage, "too many transfers in one group");
    ops[nops++] = (op){c, peer, send, 0, buf, count, stream};
    return ok;
}
ncclResult_t ncclSend(const void *buf, size_t count, int type, int peer, void *c, void *stream) {
    return post(1, (CUdeviceptr)buf, count, type, peer, c, stream);
}
ncclResult_t ncclRecv(void *buf, size_t count, int type, int peer, void *c, void *stream) {
    return post(0, (CUdeviceptr)buf, count, type, peer, c, stream);
}

// A group runs as NCCL's does: one piece of work on the stream of each GPU
// that takes part, in stream order; each waits until every part has
// started, copies the receives of its GPU from their senders' buffers, and
// waits until every part has copied (so no buffer is reused, and no
// receive is read, early).
typedef struct { CUdeviceptr dst, src; size_t bytes; int dev; } xfer;
typedef struct {
    pthread_mutex_t mu; pthread_cond_t cv;
    int parts, arrived, copied, refs;
    int n; xfer x[];
} group;
typedef struct { group *g; int dev; } part;
static void rendezvous(group *g, int *count) { // mu held
    (*count)++;
    pthread_cond_broadcast(&g->cv);
    while (*count < g->parts) pthread_cond_wait(&g->cv, &g->mu);
}
static void run_part(void *p) {
    part *pt = p;
    group *g = pt->g;
    pthread_mutex_lock(&g->mu);
    rendezvous(g, &g->arrived);
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < g->n; i++)
        if (g->x[i].dev == pt->dev) memcpy((void *)g->x[i].dst, (void *)g->x[i].src, g->x[i].bytes);
    pthread_mutex_lock(&g->mu);
    rendezvous(g, &g->copied);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last) free(g);
    free(pt);
}

ncclResult_t ncclGroupEnd(void) {
    if (!depth) return fail(invalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--depth) return ok;
    ncclResult_t r = ok;
    group *g = calloc(1, sizeof *g + nops * sizeof(xfer));
    void *streams[MAXOPS];
    int devs[MAXOPS], nparts = 0;
    for (int i = 0; i < nops && r == ok; i++) {
        op *s = &ops[i];
        if (!s->send) continue;
        op *m = 0;
        for (int j = 0; j < nops && !m; j++) {
            op *o = &ops[j];
            if (!o->send && !o->done && o->c->clique == s->c->clique && o->c->rank == s->peer && o->peer == s->c->rank) m = o;
        }
        if (!m) r = fail(invalidUsage, "a send with no matching receive");
        else if (m->bytes != s->bytes) r = fail(invalidUsage, "a send and its receive differ in size");
        else {
            g->x[g->n++] = (xfer){m->buf, s->buf, s->bytes, m->c->dev};
            m->done = s->done = 1;
            setCurrent(m->c->dev);
        }
    }
    for (int i = 0; i < nops && r == ok; i++)
        if (!ops[i].done) r = fail(invalidUsage, "a receive with no matching send");
    for (int i = 0; i < nops && r == ok; i++) { // one part per GPU, on the stream of its first transfer
        int seen = 0;
        for (int j = 0; j < nparts; j++) seen |= devs[j] == ops[i].c->dev;
        if (!seen) devs[nparts] = ops[i].c->dev, streams[nparts++] = ops[i].stream;
    }
    enqueue_fn q = (enqueue_fn)fakecuda_sym("fakecuda_enqueue");
    if (r == ok && !q) r = fail(invalidUsage, "no fake driver to queue the group on");
    if (r != ok || nparts == 0) {
        free(g);
        nops = 0;
        return r;
    }
    pthread_mutex_init(&g->mu, 0);
    pthread_cond_init(&g->cv, 0);
    g->parts = g->refs = nparts;
    for (int i = 0; i < nparts; i++) {
        part *p = malloc(sizeof *p);
        *p = (part){g, devs[i]};
        q(streams[i], run_part, p);
    }
    nops = 0;
    return r;
}
