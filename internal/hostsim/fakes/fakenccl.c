// A fake libnccl for the binding tests, to be loaded after fakecuda.c
// (whose "device" memory is host memory): communicators of one process,
// one rank per GPU, each rank joined from its GPU's own thread
// (ncclGetUniqueId, then ncclCommInitRank on every rank's thread: it
// returns once all have joined), and grouped send/recv. Groups are the
// calling thread's, as NCCL's are; each rank's part of a group runs on its
// stream in stream order (fakecuda_enqueue): it posts its sends, waits for
// the send that matches each of its receives (the k-th send from a peer
// to it meets its k-th receive from that peer), copies, and waits until
// its own sends were taken. Every wait of a rank on the others (the
// communicator's setup, a part waiting for a peer) gives up after
// $FAKENCCL_TIMEOUT_S seconds (default 10) where NCCL would hang: init then
// fails; a part marks its GPU's context failed, as a kernel fault does, so
// the next synchronization fails. It refuses what NCCL refuses: two ranks
// on one GPU, a transfer outside a group, a send and its receive of
// different sizes, a stream of another GPU, a buffer another GPU owns.
//
// It also answers ncclCommCount, ncclCommUserRank and ncclCommCuDevice
// (which libraries built on NCCL call: fakencclep.c) and
// fakenccl_clique, the fake's own: which ranks make one communicator.
#define MB_ABI_DECLARE // moebench's prototypes: a definition here that differs does not compile
#include "abi.h"
#define _GNU_SOURCE
#include "fakedriver.h"
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int ncclResult_t;
typedef unsigned long long CUdeviceptr;
enum { ok = 0, internalError = 3, invalidArgument = 4, invalidUsage = 5 };
#define MAXR 64

static __thread char last[256];
static ncclResult_t fail(ncclResult_t r, const char *msg) { snprintf(last, sizeof last, "%s", msg); return r; }

ncclResult_t ncclGetVersion(int *v) {
    const char *e = getenv("FAKENCCL_VERSION");
    *v = e ? atoi(e) : 22105; // 2.21.5
    return ok;
}
const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case internalError: return "internal error - please report this issue to the NCCL developers";
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
#define CTXDEV(c) ((int)((long)(c) - 0x1000 - 100))
static void *current(void) {
    void *(*f)(void) = (void *(*)(void))fakecuda_sym("fakecuda_current");
    return f ? f() : 0;
}
static void *owner(CUdeviceptr p) {
    void *(*f)(CUdeviceptr) = (void *(*)(CUdeviceptr))fakecuda_sym("fakecuda_owner");
    return f ? f(p) : 0;
}
static void gpu_failed(int dev) {
    void (*f)(void *) = (void (*)(void *))fakecuda_sym("fakecuda_fail");
    if (f) f(CTX(dev));
}

// deadline is now + $FAKENCCL_TIMEOUT_S.
static struct timespec deadline(void) {
    const char *e = getenv("FAKENCCL_TIMEOUT_S");
    double s = e && atof(e) > 0 ? atof(e) : 10;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += (time_t)s;
    t.tv_nsec += (long)((s - (time_t)s) * 1e9);
    if (t.tv_nsec >= 1000000000) t.tv_sec++, t.tv_nsec -= 1000000000;
    return t;
}

// A posted send, waiting in its (from, to) mailbox for its receive.
typedef struct mail { struct mail *next; unsigned long seq; CUdeviceptr buf; size_t bytes; int taken; } mail;

// A communicator's ranks (a clique): who joined, and the mailboxes.
typedef struct clique {
    char id[128];
    int nranks, joined, failed;
    int dev[MAXR];
    char why[200];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    mail *box[MAXR][MAXR];                          // [from][to], in seq order
    unsigned long sent[MAXR][MAXR], recvd[MAXR][MAXR]; // sends and receives posted so far, per pair
} clique;
typedef struct { int rank, nranks, dev; clique *c; } fcomm;

static pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
static clique *cliques[256];
static int ncliques, ids;

ncclResult_t ncclGetUniqueId(mb_nccl_id *id) {
    memset(id, 0, sizeof *id);
    pthread_mutex_lock(&gmu);
    snprintf(id->internal, sizeof id->internal, "fakenccl %d %ld", ++ids, (long)time(0));
    pthread_mutex_unlock(&gmu);
    return ok;
}

ncclResult_t ncclCommInitRank(void **comm, int nranks, mb_nccl_id id, int rank) {
    if (nranks < 1 || nranks > MAXR || rank < 0 || rank >= nranks) return fail(invalidArgument, "ncclCommInitRank: rank or nranks out of range");
    void *ctx = current();
    if (!ctx) return fail(invalidUsage, "ncclCommInitRank: no CUDA context current on the calling thread (NCCL takes the rank's GPU from it)");
    int dev = CTXDEV(ctx);
    pthread_mutex_lock(&gmu);
    clique *c = 0;
    for (int i = 0; i < ncliques && !c; i++)
        if (memcmp(cliques[i]->id, id.internal, sizeof id.internal) == 0) c = cliques[i];
    if (!c) {
        if (ncliques == 256) { pthread_mutex_unlock(&gmu); return fail(internalError, "fakenccl: too many communicators"); }
        c = calloc(1, sizeof *c);
        memcpy(c->id, id.internal, sizeof c->id);
        c->nranks = nranks;
        for (int r = 0; r < MAXR; r++) c->dev[r] = -1;
        pthread_mutex_init(&c->mu, 0);
        pthread_cond_init(&c->cv, 0);
        cliques[ncliques++] = c;
    }
    pthread_mutex_unlock(&gmu);
    pthread_mutex_lock(&c->mu);
    if (c->nranks != nranks || c->dev[rank] >= 0) {
        pthread_mutex_unlock(&c->mu);
        return fail(invalidArgument, "ncclCommInitRank: a rank joined twice, or with another rank count");
    }
    for (int r = 0; r < nranks; r++)
        if (c->dev[r] == dev) {
            c->failed = invalidUsage;
            snprintf(c->why, sizeof c->why, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d", r, rank, dev);
        }
    c->dev[rank] = dev;
    c->joined++;
    pthread_cond_broadcast(&c->cv);
    struct timespec t = deadline();
    int timedOut = 0;
    while (c->joined < nranks && !c->failed && !timedOut) timedOut = pthread_cond_timedwait(&c->cv, &c->mu, &t) == ETIMEDOUT;
    ncclResult_t r = c->failed;
    char why[200];
    snprintf(why, sizeof why, "%s", c->why);
    if (!r && c->joined < nranks) {
        r = internalError;
        snprintf(why, sizeof why, "ncclCommInitRank: rank %d waited %s s for the other ranks of %d (%d joined): NCCL would hang",
                 rank, getenv("FAKENCCL_TIMEOUT_S") ? getenv("FAKENCCL_TIMEOUT_S") : "10", nranks, c->joined);
    }
    pthread_mutex_unlock(&c->mu);
    if (r) return fail(r, why);
    fcomm *fc = malloc(sizeof *fc);
    *fc = (fcomm){rank, nranks, dev, c};
    *comm = fc;
    return ok;
}
ncclResult_t ncclCommDestroy(void *c) {
    if (!c) return fail(invalidArgument, "ncclCommDestroy: null communicator");
    free(c);
    return ok;
}
ncclResult_t ncclCommCount(void *c, int *n) { *n = ((fcomm *)c)->nranks; return ok; }
ncclResult_t ncclCommUserRank(void *c, int *r) { *r = ((fcomm *)c)->rank; return ok; }
ncclResult_t ncclCommCuDevice(void *c, int *d) { *d = ((fcomm *)c)->dev; return ok; }
// fakenccl_clique is the fake's own: an id of the communicator comm is a
// rank of (the same for all its ranks).
void *fakenccl_clique(void *comm) { return ((fcomm *)comm)->c; }
// Two entry points of NCCL's Device API (2.29), present so that a library
// built on it finds them (NCCL EP's fake does not call them): they refuse.
// Built with -DFAKENCCL_NO_DEVICE_API it lacks them (an NCCL built without).
#ifndef FAKENCCL_NO_DEVICE_API
ncclResult_t ncclDevCommCreate(void *comm, const void *reqs, void *devComm) { return fail(invalidUsage, "the fake has no Device API"); }
ncclResult_t ncclCommWindowRegister(void *comm, void *buf, size_t size, void **win, int flags) { return fail(invalidUsage, "the fake has no windows"); }
#endif

// A thread's open group: its transfers, each with its place in its pair's
// order.
typedef struct { fcomm *c; int peer, send; unsigned long seq; CUdeviceptr buf; size_t bytes; void *stream; } op;
static __thread op *ops;
static __thread int nops, capops, depth;

ncclResult_t ncclGroupStart(void) { depth++; return ok; }

static ncclResult_t post(int send, CUdeviceptr buf, size_t count, int type, int peer, fcomm *c, void *stream) {
    if (!depth) return fail(invalidUsage, "a transfer outside a group");
    if (type != 1) return fail(invalidArgument, "the fake moves bytes (ncclUint8) only");
    if (!c || peer < 0 || peer >= c->nranks) return fail(invalidArgument, "peer out of range");
    if (!stream || *(void **)stream != CTX(c->dev)) return fail(invalidArgument, "a stream of another GPU");
    if (count && owner(buf) != CTX(c->dev)) return fail(invalidArgument, "a buffer another GPU owns");
    if (nops == capops) capops = capops ? 2 * capops : 64, ops = realloc(ops, capops * sizeof *ops);
    pthread_mutex_lock(&c->c->mu);
    unsigned long seq = send ? c->c->sent[c->rank][peer]++ : c->c->recvd[peer][c->rank]++;
    pthread_mutex_unlock(&c->c->mu);
    ops[nops++] = (op){c, peer, send, seq, buf, count, stream};
    return ok;
}
ncclResult_t ncclSend(const void *buf, size_t count, int type, int peer, void *c, void *stream) {
    return post(1, (CUdeviceptr)buf, count, type, peer, c, stream);
}
ncclResult_t ncclRecv(void *buf, size_t count, int type, int peer, void *c, void *stream) {
    return post(0, (CUdeviceptr)buf, count, type, peer, c, stream);
}

// A rank's part of a group, run on its stream.
typedef struct { fcomm *c; int n; op x[]; } part;
static void part_fail(part *p, const char *why) {
    fprintf(stderr, "fakenccl: rank %d (GPU %d): %s\n", p->c->rank, p->c->dev, why);
    gpu_failed(p->c->dev);
}
static void run_part(void *arg) {
    part *p = arg;
    clique *c = p->c->c;
    int me = p->c->rank;
    struct timespec t = deadline();
    char why[200] = "";
    pthread_mutex_lock(&c->mu);
    mail *mine[p->n];
    for (int i = 0; i < p->n; i++) { // post the sends, in order
        mine[i] = 0;
        if (!p->x[i].send) continue;
        mail *m = calloc(1, sizeof *m), **tail = &c->box[me][p->x[i].peer];
        *m = (mail){0, p->x[i].seq, p->x[i].buf, p->x[i].bytes, 0};
        while (*tail) tail = &(*tail)->next;
        *tail = m;
        mine[i] = m;
    }
    pthread_cond_broadcast(&c->cv);
    for (int i = 0; i < p->n && !why[0]; i++) { // each receive meets its send
        op *x = &p->x[i];
        if (x->send) continue;
        mail *m = 0;
        int timedOut = 0;
        while (!timedOut) {
            for (m = c->box[x->peer][me]; m && m->seq != x->seq; m = m->next) {}
            if (m) break;
            timedOut = pthread_cond_timedwait(&c->cv, &c->mu, &t) == ETIMEDOUT;
        }
        if (!m) snprintf(why, sizeof why, "receive %lu from rank %d: no matching send before the timeout (NCCL would hang)", x->seq, x->peer);
        else if (m->bytes != x->bytes) snprintf(why, sizeof why, "receive %lu from rank %d: %zu bytes, its send %zu", x->seq, x->peer, x->bytes, m->bytes);
        else {
            memcpy((void *)x->buf, (void *)m->buf, x->bytes);
            m->taken = 1;
            mail **q = &c->box[x->peer][me];
            while (*q != m) q = &(*q)->next;
            *q = m->next;
            pthread_cond_broadcast(&c->cv);
        }
    }
    for (int i = 0; i < p->n && !why[0]; i++) { // the sends leave their buffers
        int timedOut = 0;
        while (mine[i] && !mine[i]->taken && !timedOut) timedOut = pthread_cond_timedwait(&c->cv, &c->mu, &t) == ETIMEDOUT;
        if (mine[i] && !mine[i]->taken) snprintf(why, sizeof why, "send %lu to rank %d: not received before the timeout (NCCL would hang)", p->x[i].seq, p->x[i].peer);
    }
    for (int i = 0; i < p->n; i++) { // taken sends are freed here; those left are withdrawn
        if (!mine[i]) continue;
        if (!mine[i]->taken) {
            mail **q = &c->box[me][p->x[i].peer];
            while (*q && *q != mine[i]) q = &(*q)->next;
            if (*q) *q = mine[i]->next;
        }
        free(mine[i]);
    }
    pthread_mutex_unlock(&c->mu);
    if (why[0]) part_fail(p, why);
    free(p);
}

ncclResult_t ncclGroupEnd(void) {
    if (!depth) return fail(invalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--depth) return ok;
    enqueue_fn q = (enqueue_fn)fakecuda_sym("fakecuda_enqueue");
    ncclResult_t r = q ? ok : fail(invalidUsage, "no fake driver to queue the group on");
    for (int i = 0; i < nops && r == ok; i++) { // one part per communicator, on the stream of its first transfer
        int seen = 0;
        for (int j = 0; j < i; j++) seen |= ops[j].c == ops[i].c;
        if (seen) continue;
        part *p = malloc(sizeof *p + nops * sizeof(op));
        p->c = ops[i].c, p->n = 0;
        for (int j = i; j < nops; j++)
            if (ops[j].c == ops[i].c && ops[j].bytes > 0) p->x[p->n++] = ops[j];
        if (q(ops[i].stream, run_part, p)) {
            free(p);
            r = fail(invalidUsage, "the group's stream refused it (a capture?)");
        }
    }
    nops = 0;
    return r;
}
