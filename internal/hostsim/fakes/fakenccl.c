// A fake libnccl for the binding tests, to be loaded after fakecuda.c
// (whose "device" memory is host memory): communicators of one process or
// of several, one rank per GPU, each rank joined from its GPU's own thread,
// and grouped send/recv. TEST-ONLY code: loopback sockets stand in for
// NCCL's network, and nothing here is a network layer of moebench's.
//
// Bootstrap as nccl.h says: ncclGetUniqueId makes an id naming a root
// that listens on a loopback port of the calling process (as NCCL's
// bootstrap root does), unless NCCL_COMM_ID ("host:port") is set, in which
// case every process makes the same id from it and rank 0's
// ncclCommInitRank starts the root there. ncclCommInitRank connects each
// rank to the root, which answers once every rank has joined (with each
// rank's process, GPU and data port) or after the timeout; it returns once
// all have joined. A communicator whose ranks are all in this process
// moves data in memory (below); one spanning processes (each process a
// "node" of its own: fake GPU ordinals repeat across processes) moves
// each send over a loopback connection to its peer, where a receiving
// thread keeps it until the matching receive takes it.
//
// Groups are the calling thread's, as NCCL's are; each rank's part of a
// group runs on its stream in stream order (fakecuda_enqueue): it posts its
// sends, waits for the send that matches each of its receives (the k-th
// send from a peer to it meets its k-th receive from that peer), copies,
// and waits until its own sends were taken. Every wait of a rank on the
// others (the communicator's setup, a part waiting for a peer) gives up
// after $FAKENCCL_TIMEOUT_S seconds (default 10) where NCCL would hang:
// init then fails; a part marks its GPU's context failed, as a kernel
// fault does, so the next synchronization fails. A peer process that dies
// leaves its partners waiting until then, as NCCL's kernels would. It
// refuses what NCCL refuses: two ranks on one GPU of a process, a transfer
// outside a group, a send and its receive of different sizes, a stream of
// another GPU, a buffer another GPU owns.
//
// It also answers ncclCommCount, ncclCommUserRank and ncclCommCuDevice
// (which libraries built on NCCL call: fakencclep.c) and, the fake's own,
// fakenccl_clique: which ranks make one communicator (NULL for one
// spanning processes), fakenccl_wait: the wait of the calling thread's
// next groups (fakencclep.c bounds its exchanges by NCCL EP's timeout),
// and fakenccl_live: whether a communicator is not yet destroyed.
// $FAKENCCL_NET makes every communicator one that spans processes, each
// rank as if in a process of its own (tests of that path in one process).
#define MB_ABI_DECLARE // moebench's prototypes: a definition here that differs does not compile
#include "abi.h"
#define _GNU_SOURCE
#include "fakedriver.h"
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>
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

// deadline is now + $FAKENCCL_TIMEOUT_S; deadline_in now + s seconds (0:
// $FAKENCCL_TIMEOUT_S).
static struct timespec deadline_in(double s);
static struct timespec deadline(void) { return deadline_in(0); }
static struct timespec deadline_in(double s) {
    const char *e = getenv("FAKENCCL_TIMEOUT_S");
    if (s <= 0) s = e && atof(e) > 0 ? atof(e) : 10;
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
// A communicator spanning processes: a connection to every other rank for
// its sends, and what each peer sent, kept by a receiving thread per peer
// until a receive takes it.
typedef struct msg { struct msg *next; unsigned long seq; size_t bytes; char data[]; } msg;
typedef struct {
    int nranks, rank, lfd;
    int *out;                 // [nranks] connection to each peer (−1: self)
    msg **inbox;              // [nranks] what each peer sent, in order
    int *closed;              // [nranks] the peer's connection ended
    unsigned long *sent, *recvd;
    pthread_t acceptor;
    pthread_t *rx;            // [nranks] receiving threads
    int *rxfd;                // [nranks]
    int nrx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} net;
typedef struct { int rank, nranks, dev; clique *c; net *n; unsigned live; } fcomm;
#define COMM_LIVE 0x6c697665u

static pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
static clique *cliques[256];
static int ncliques, ids;

// fakenccl_live is the fake's own: whether comm is a communicator not yet
// destroyed (a library built on NCCL must not outlive its communicator). A
// destroyed communicator's own struct is kept, marked, so that the
// question has an answer (and a use after destruction is not a crash).
int fakenccl_live(void *comm) { return comm && ((fcomm *)comm)->live == COMM_LIVE; }

static int past(struct timespec t) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return now.tv_sec > t.tv_sec || (now.tv_sec == t.tv_sec && now.tv_nsec >= t.tv_nsec);
}
// io moves n bytes over fd (send or receive) before the deadline t (none:
// t.tv_sec 0); 0 on success.
static int io(int fd, void *p, size_t n, int out, struct timespec t) {
    char *b = p;
    while (n > 0) {
        if (t.tv_sec) {
            struct pollfd pf = {fd, out ? POLLOUT : POLLIN, 0};
            int r = poll(&pf, 1, 100);
            if (r < 0 && errno != EINTR) return -1;
            if (r <= 0) {
                if (past(t)) return -1;
                continue;
            }
        }
        ssize_t k = out ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        b += k, n -= (size_t)k;
    }
    return 0;
}
static int listen_on(const char *host, int port, int *bound) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, MAXR) || getsockname(fd, (struct sockaddr *)&a, &l)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    *bound = ntohs(a.sin_port);
    return fd;
}
// dial connects to host:port, retrying until the deadline (a root or peer
// not listening yet).
static int dial(const char *host, int port, struct timespec t) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            return fd;
        }
        if (fd >= 0) close(fd);
        if (past(t)) return -1;
        usleep(20000);
    }
}

// The bootstrap: a rank's hello to the root, the root's answer (status,
// then every rank's place).
typedef struct { int magic, nranks, rank, pid, dev, port; } hello;
typedef struct { int pid, dev, port; } place;
typedef struct { int status; char why[200]; place p[MAXR]; } answer;
#define MAGIC 0x6e63636c

typedef struct { int lfd; } rootarg;
// root serves one communicator's setup: it waits for every rank's hello
// (or the timeout), then answers each.
static void *root(void *arg) {
    int lfd = ((rootarg *)arg)->lfd;
    free(arg);
    struct timespec t = deadline();
    int fds[MAXR], n = 0, nranks = 0, joined = 0;
    hello h[MAXR];
    answer *ans = calloc(1, sizeof *ans);
    int seen[MAXR] = {0};
    while (n < MAXR && (!nranks || joined < nranks) && !past(t)) {
        struct pollfd pf = {lfd, POLLIN, 0};
        if (poll(&pf, 1, 100) <= 0) continue;
        int fd = accept(lfd, 0, 0);
        if (fd < 0) continue;
        hello x;
        if (io(fd, &x, sizeof x, 0, t) || x.magic != MAGIC) { close(fd); continue; }
        fds[n] = fd, h[n++] = x;
        if (!nranks) nranks = x.nranks;
        if (x.nranks != nranks || x.rank < 0 || x.rank >= nranks || seen[x.rank]) {
            ans->status = invalidArgument;
            snprintf(ans->why, sizeof ans->why, "ncclCommInitRank: a rank joined twice, or with another rank count");
            break;
        }
        seen[x.rank] = 1, joined++;
        ans->p[x.rank] = (place){x.pid, x.dev, x.port};
        for (int i = 0; i < n - 1 && !ans->status; i++)
            if (h[i].pid == x.pid && h[i].dev == x.dev) {
                ans->status = invalidUsage;
                snprintf(ans->why, sizeof ans->why, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d", h[i].rank, x.rank, x.dev);
            }
    }
    close(lfd);
    for (int i = 0; i < n; i++) {
        answer a = *ans;
        if (!a.status && joined < nranks) {
            a.status = internalError;
            snprintf(a.why, sizeof a.why, "ncclCommInitRank: rank %d waited %s s for the other ranks of %d (%d joined): NCCL would hang",
                     h[i].rank, getenv("FAKENCCL_TIMEOUT_S") ? getenv("FAKENCCL_TIMEOUT_S") : "10", nranks, joined);
        }
        struct timespec t2 = deadline();
        io(fds[i], &a, sizeof a, 1, t2);
        close(fds[i]);
    }
    free(ans);
    return 0;
}
static int start_root(const char *host, int port, int *bound) {
    int lfd = listen_on(host, port, bound);
    if (lfd < 0) return -1;
    rootarg *a = malloc(sizeof *a);
    a->lfd = lfd;
    pthread_t th;
    pthread_create(&th, 0, root, a);
    pthread_detach(th);
    return 0;
}

ncclResult_t ncclGetUniqueId(mb_nccl_id *id) {
    memset(id, 0, sizeof *id);
    const char *env = getenv("NCCL_COMM_ID");
    if (env) { // every process makes the same id; rank 0's init starts the root
        char host[64];
        int port;
        if (sscanf(env, "%63[^:]:%d", host, &port) != 2) return fail(invalidArgument, "Invalid NCCL_COMM_ID, please use format: <ipv4>:<port>");
        snprintf(id->internal, sizeof id->internal, "fakenccl env %s %d", host, port);
        return ok;
    }
    int port;
    if (start_root("127.0.0.1", 0, &port)) return fail(internalError, "fakenccl: the bootstrap root cannot listen");
    pthread_mutex_lock(&gmu);
    snprintf(id->internal, sizeof id->internal, "fakenccl root 127.0.0.1 %d %d %d %ld", port, (int)getpid(), ++ids, (long)time(0));
    pthread_mutex_unlock(&gmu);
    return ok;
}

// rx keeps what one peer sends until the communicator ends.
typedef struct { net *n; int fd; } rxarg;
static void *rx(void *arg) {
    rxarg a = *(rxarg *)arg;
    free(arg);
    net *n = a.n;
    struct timespec none = {0};
    int from;
    if (io(a.fd, &from, sizeof from, 0, none) || from < 0 || from >= n->nranks) return 0;
    for (;;) {
        unsigned long hdr[2];
        if (io(a.fd, hdr, sizeof hdr, 0, none)) break;
        msg *m = malloc(sizeof *m + hdr[1]);
        m->next = 0, m->seq = hdr[0], m->bytes = hdr[1];
        if (hdr[1] && io(a.fd, m->data, hdr[1], 0, none)) { free(m); break; }
        pthread_mutex_lock(&n->mu);
        msg **q = &n->inbox[from];
        while (*q) q = &(*q)->next;
        *q = m;
        pthread_cond_broadcast(&n->cv);
        pthread_mutex_unlock(&n->mu);
    }
    pthread_mutex_lock(&n->mu);
    n->closed[from] = 1;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    return 0;
}
// acceptor takes the other ranks' connections, a receiving thread each.
static void *acceptor(void *arg) {
    net *n = arg;
    for (int i = 0; i < n->nranks - 1; i++) {
        int fd = accept(n->lfd, 0, 0);
        if (fd < 0) break;
        rxarg *a = malloc(sizeof *a);
        *a = (rxarg){n, fd};
        pthread_mutex_lock(&n->mu);
        n->rxfd[n->nrx] = fd;
        pthread_create(&n->rx[n->nrx++], 0, rx, a);
        pthread_mutex_unlock(&n->mu);
    }
    return 0;
}

static ncclResult_t join_clique(void **comm, int nranks, mb_nccl_id id, int rank, int dev);

ncclResult_t ncclCommInitRank(void **comm, int nranks, mb_nccl_id id, int rank) {
    if (nranks < 1 || nranks > MAXR || rank < 0 || rank >= nranks) return fail(invalidArgument, "ncclCommInitRank: rank or nranks out of range");
    void *ctx = current();
    if (!ctx) return fail(invalidUsage, "ncclCommInitRank: no CUDA context current on the calling thread (NCCL takes the rank's GPU from it)");
    int dev = CTXDEV(ctx);
    char kind[8] = "", host[64] = "";
    int port = 0, bound;
    if (sscanf(id.internal, "fakenccl %7s %63s %d", kind, host, &port) != 3) return fail(invalidArgument, "ncclCommInitRank: not an id of this NCCL");
    if (!strcmp(kind, "env") && rank == 0 && start_root(host, port, &bound))
        return fail(internalError, "ncclCommInitRank: the bootstrap root cannot listen at NCCL_COMM_ID");
    struct timespec t = deadline();
    t.tv_sec += 2; // the root answers by its own deadline; this one covers a root that is gone
    net *n = calloc(1, sizeof *n);
    n->nranks = nranks, n->rank = rank;
    n->lfd = listen_on("127.0.0.1", 0, &bound);
    int fd = n->lfd < 0 ? -1 : dial(host, port, t);
    answer *a = calloc(1, sizeof *a);
    hello h = {MAGIC, nranks, rank, (int)getpid(), dev, bound};
    if (fd < 0 || io(fd, &h, sizeof h, 1, t) || io(fd, a, sizeof *a, 0, t)) {
        a->status = internalError;
        snprintf(a->why, sizeof a->why, "ncclCommInitRank: rank %d: no answer from the bootstrap root at %s:%d before the timeout", rank, host, port);
    }
    if (fd >= 0) close(fd);
    int local = !getenv("FAKENCCL_NET"); // the tests' switch: every rank as if in a process of its own
    for (int r = 0; r < nranks && !a->status; r++) local &= a->p[r].pid == (int)getpid();
    if (a->status || local) { // fails, or stays in this process
        if (n->lfd >= 0) close(n->lfd);
        free(n);
        ncclResult_t r = a->status ? fail(a->status, a->why) : join_clique(comm, nranks, id, rank, dev);
        free(a);
        return r;
    }
    n->out = calloc(nranks, sizeof(int)), n->inbox = calloc(nranks, sizeof(msg *)), n->closed = calloc(nranks, sizeof(int));
    n->sent = calloc(nranks, sizeof(long)), n->recvd = calloc(nranks, sizeof(long));
    n->rx = calloc(nranks, sizeof(pthread_t)), n->rxfd = calloc(nranks, sizeof(int));
    pthread_mutex_init(&n->mu, 0);
    pthread_cond_init(&n->cv, 0);
    pthread_create(&n->acceptor, 0, acceptor, n);
    ncclResult_t r = ok;
    for (int p = 0; p < nranks; p++) {
        n->out[p] = -1;
        if (p == rank || r) continue;
        n->out[p] = dial("127.0.0.1", a->p[p].port, t);
        if (n->out[p] < 0 || io(n->out[p], &rank, sizeof rank, 1, t))
            r = fail(internalError, "ncclCommInitRank: a peer's connection failed");
    }
    free(a);
    fcomm *fc = malloc(sizeof *fc);
    *fc = (fcomm){rank, nranks, dev, 0, n, COMM_LIVE};
    *comm = fc;
    if (r) {
        ncclCommDestroy(fc);
        *comm = 0;
    }
    return r;
}

static ncclResult_t join_clique(void **comm, int nranks, mb_nccl_id id, int rank, int dev) {
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
    *fc = (fcomm){rank, nranks, dev, c, 0, COMM_LIVE};
    *comm = fc;
    return ok;
}
ncclResult_t ncclCommDestroy(void *c) {
    if (!c) return fail(invalidArgument, "ncclCommDestroy: null communicator");
    if (!fakenccl_live(c)) return fail(invalidUsage, "ncclCommDestroy: not a live communicator (destroyed twice?)");
    net *n = ((fcomm *)c)->n;
    if (n) { // end the connections, then the threads that read them
        shutdown(n->lfd, SHUT_RDWR);
        pthread_join(n->acceptor, 0);
        close(n->lfd);
        for (int p = 0; p < n->nranks; p++)
            if (n->out[p] >= 0) close(n->out[p]);
        for (int i = 0; i < n->nrx; i++) shutdown(n->rxfd[i], SHUT_RDWR);
        for (int i = 0; i < n->nrx; i++) pthread_join(n->rx[i], 0), close(n->rxfd[i]);
        for (int p = 0; p < n->nranks; p++)
            for (msg *m = n->inbox[p], *next; m; m = next) next = m->next, free(m);
        free(n->out), free(n->inbox), free(n->closed), free(n->sent), free(n->recvd), free(n->rx), free(n->rxfd);
        free(n);
    }
    ((fcomm *)c)->live = 0; // kept: fakenccl_live answers for it
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
static __thread double group_wait; // the calling thread's groups' wait (0: $FAKENCCL_TIMEOUT_S)

// fakenccl_wait is the fake's own, for a library built on NCCL that bounds
// its waits itself (fakencclep.c: NCCL EP's timeout_ns): the parts of the
// calling thread's groups ended from now on give up after s seconds (0:
// $FAKENCCL_TIMEOUT_S).
void fakenccl_wait(double s) { group_wait = s; }

ncclResult_t ncclGroupStart(void) { depth++; return ok; }

static ncclResult_t post(int send, CUdeviceptr buf, size_t count, int type, int peer, fcomm *c, void *stream) {
    if (!depth) return fail(invalidUsage, "a transfer outside a group");
    if (type != 1) return fail(invalidArgument, "the fake moves bytes (ncclUint8) only");
    if (!c || peer < 0 || peer >= c->nranks) return fail(invalidArgument, "peer out of range");
    if (!stream || *(void **)stream != CTX(c->dev)) return fail(invalidArgument, "a stream of another GPU");
    if (count && owner(buf) != CTX(c->dev)) return fail(invalidArgument, "a buffer another GPU owns");
    if (nops == capops) capops = capops ? 2 * capops : 64, ops = realloc(ops, capops * sizeof *ops);
    unsigned long seq;
    if (c->n) seq = send ? c->n->sent[peer]++ : c->n->recvd[peer]++; // only the rank's thread uses its communicator
    else {
        pthread_mutex_lock(&c->c->mu);
        seq = send ? c->c->sent[c->rank][peer]++ : c->c->recvd[peer][c->rank]++;
        pthread_mutex_unlock(&c->c->mu);
    }
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
typedef struct { fcomm *c; double wait; int n; op x[]; } part;
static void part_fail(part *p, const char *why) {
    fprintf(stderr, "fakenccl: rank %d (GPU %d): %s\n", p->c->rank, p->c->dev, why);
    gpu_failed(p->c->dev);
}
// run_net is a part of a communicator spanning processes: its sends go
// out over their connections (a peer's receiving thread takes them at
// once), its receives wait for their peers' sends.
static void run_net(part *p) {
    net *n = p->c->n;
    int me = p->c->rank;
    struct timespec t = deadline_in(p->wait);
    char why[200] = "";
    for (int i = 0; i < p->n && !why[0]; i++) {
        op *x = &p->x[i];
        if (!x->send) continue;
        if (x->peer == me) {
            msg *m = malloc(sizeof *m + x->bytes);
            m->next = 0, m->seq = x->seq, m->bytes = x->bytes;
            memcpy(m->data, (void *)x->buf, x->bytes);
            pthread_mutex_lock(&n->mu);
            msg **q = &n->inbox[me];
            while (*q) q = &(*q)->next;
            *q = m;
            pthread_mutex_unlock(&n->mu);
            continue;
        }
        unsigned long hdr[2] = {x->seq, x->bytes};
        if (io(n->out[x->peer], hdr, sizeof hdr, 1, t) || io(n->out[x->peer], (void *)x->buf, x->bytes, 1, t))
            snprintf(why, sizeof why, "send %lu to rank %d: its connection failed before the timeout (NCCL would hang)", x->seq, x->peer);
    }
    pthread_mutex_lock(&n->mu);
    for (int i = 0; i < p->n && !why[0]; i++) {
        op *x = &p->x[i];
        if (x->send) continue;
        int timedOut = 0;
        while (!n->inbox[x->peer] && !timedOut) timedOut = pthread_cond_timedwait(&n->cv, &n->mu, &t) == ETIMEDOUT;
        msg *m = n->inbox[x->peer];
        if (!m) snprintf(why, sizeof why, "receive %lu from rank %d: no matching send before the timeout (NCCL would hang%s)", x->seq, x->peer,
                         n->closed[x->peer] ? "; the peer's connection closed" : "");
        else if (m->seq != x->seq) snprintf(why, sizeof why, "receive %lu from rank %d met its send %lu", x->seq, x->peer, m->seq);
        else if (m->bytes != x->bytes) snprintf(why, sizeof why, "receive %lu from rank %d: %zu bytes, its send %zu", x->seq, x->peer, x->bytes, m->bytes);
        else {
            memcpy((void *)x->buf, m->data, x->bytes);
            n->inbox[x->peer] = m->next;
            free(m);
        }
    }
    pthread_mutex_unlock(&n->mu);
    if (why[0]) part_fail(p, why);
    free(p);
}

static void run_part(void *arg) {
    part *p = arg;
    if (p->c->n) {
        run_net(p);
        return;
    }
    clique *c = p->c->c;
    int me = p->c->rank;
    struct timespec t = deadline_in(p->wait);
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
        p->c = ops[i].c, p->n = 0, p->wait = group_wait;
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
