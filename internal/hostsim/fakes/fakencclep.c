// A fake libnccl_ep for the tests: NCCL EP's C API as NVIDIA/nccl-extensions'
// nccl_ep/include/nccl_ep.h (commit 44d2de0d) states its contract, loaded
// after fakecuda.c and fakenccl.c. Like the real library it calls NCCL
// (ncclCommCount, ncclCommUserRank, ncclCommCuDevice), left unresolved
// until load: NCCL must be loaded first with its symbols global, or this
// one does not load.
//
// What it keeps of the contract:
//   - every struct starts with its size and NCCL_EP_MAGIC (tensors with
//     NCCL_EP_TENSOR_MAGIC); a size below the frozen V1 boundary, a wrong
//     magic or a missing required struct is ncclInvalidArgument, and only
//     the bytes a struct's size covers are read (append-only structs);
//   - handles and groups live from their creation to their destruction: a
//     use after destruction, an update before the handle exists, a
//     dispatch before an update or a combine before a dispatch is
//     ncclInvalidUsage; so is a call, or a group's or handle's
//     destruction, after the NCCL communicator the group was created over
//     was destroyed (the library works, and releases its windows, through
//     it);
//   - the collective rule: group creation, the low-latency handle's
//     initialization, and every rank's high-throughput update, dispatch
//     and combine meet the other ranks' (the stream-ordered ones on the
//     rank's stream). A rank that does not call makes the others give up
//     after the group's timeout (timeout_ns, NCCL_EP_TIMEOUT_MS overriding,
//     100 s by default) where the real library hangs or traps: a host call
//     returns ncclInternalError, a stream part marks its GPU's context
//     failed (the next synchronization fails);
//   - a high-throughput dispatch in eager mode (max_recv_tokens_per_rank
//     0) reads the received count back with a host synchronization, so a
//     thread that issues every rank's dispatch blocks on the first;
//   - the dispatch's quant_recipe (recipe below): NONE moves bf16 tokens;
//     NCCL_EP_DISP_QUANT_FWD forwards the caller's quantized tokens and
//     their scales [tokens, ·] as bytes, each slot's scale row beside its
//     token row (across processes the two share the token's max_token_bytes
//     in the exchange); DS_FP8E3M4 is refused (not implemented);
//   - the shapes, data types and limits the header and the library state:
//     bf16 tokens, int32 routing, fp32 weights, rows of 16-byte multiples
//     (high throughput), a hidden size of 128-multiples (low-latency
//     combine), max_num_sms within the GPU's SMs, the low-latency mode's
//     warp groups (ceil(experts / SMs) at most 14), sm_90 or later;
//   - pass_direction (the header's ncclEpPassDir_t: FWD 0, BWD 1, any
//     other value ncclInvalidArgument) is high-throughput only: BWD in
//     low-latency mode is ncclInvalidUsage, as the library returns. A BWD
//     dispatch takes no routing weights in or out (ncclInvalidArgument if
//     given); a BWD combine requires inputs->topk_weights (expert-major: 1D
//     [received rows]) and outputs->topk_weights [tokens, topk] fp32.
// Two hooks for the tests: $FAKENCCLEP_FAIL names a call that returns
// ncclInternalError; $FAKENCCLEP_SKIP="call rank" makes that rank's call of
// it return at once without taking part (as a rank that never called).
//
// What it implements: the expert-major layout of both modes (no padding),
// moving rows on the host (on a communicator that spans processes, through
// the fake NCCL's send/recv: "across processes" at the end): a rank's received slots grouped by local
// expert, in (source rank, token) order; high-throughput combine sums a
// token's slots of each rank (rounded to bf16, the rank's pre-reduction)
// then the ranks' sums in float, into bf16; low-latency combine sums the
// slots times their routing weights in float, into bf16. The
// high-throughput backward over the same handle: a BWD dispatch places
// each token's row (the output gradient) in the slots the forward's did,
// from the routing the handle was updated with; a BWD combine sums rows as
// the forward's does and returns each (token, j) slot's weight (the
// probability gradient) into outputs->topk_weights[token][j], the forward's
// k order (the library scatters its dense per-expert sums back through
// the handle's topk_idx).
#define _GNU_SOURCE // RTLD_DEFAULT
#define MB_ABI_DECLARE // moebench's prototypes: a definition here that differs does not compile
#include "abi.h"
#include "fakedriver.h"
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int ncclResult_t;
enum { ok = 0, internalError = 3, invalidArgument = 4, invalidUsage = 5 };
#define MAXR 64
#define MAX_TOPK 32
#define LL_MAX_WARP_GROUPS 14
#define CTX(dev) ((void *)(0x1000L + 100 + (dev)))

// NCCL's, resolved at load time from the NCCL loaded (globally) before.
extern ncclResult_t ncclCommCount(void *comm, int *n);
extern ncclResult_t ncclCommUserRank(void *comm, int *rank);
extern ncclResult_t ncclCommCuDevice(void *comm, int *dev);

static ncclResult_t bad(ncclResult_t r, const char *msg) {
    fprintf(stderr, "NCCL EP: %s\n", msg);
    return r;
}

ncclResult_t ncclEpGetVersion(int *v) {
    if (!v) return invalidArgument;
    const char *e = getenv("FAKENCCLEP_VERSION");
    *v = e ? atoi(e) : 100; // 0.1.0
    return ok;
}

// ---- the fake driver's services

static void *owner(unsigned long long p) {
    void *(*f)(unsigned long long) = (void *(*)(unsigned long long))fakecuda_sym("fakecuda_owner");
    return f ? f(p) : 0;
}
static int attribute(int attr, int dev) {
    int (*f)(int *, int, int) = (int (*)(int *, int, int))fakecuda_sym("cuDeviceGetAttribute");
    int v = 0;
    if (f) f(&v, attr, 100 + dev);
    return v;
}
static void gpu_failed(int dev) {
    void (*f)(void *) = (void (*)(void *))fakecuda_sym("fakecuda_fail");
    if (f) f(CTX(dev));
}
static void *fakenccl_clique(void *comm) {
    void *(*f)(void *) = (void *(*)(void *))dlsym(RTLD_DEFAULT, "fakenccl_clique");
    return f ? f(comm) : comm;
}

// ---- versioned structs: valid (size, magic), then decoded into a zeroed
// full copy of which only the caller's size is filled

#define VALID(p, v1) valid((p), (p) ? ((const unsigned *)(p))[0] : 0, (p) ? ((const unsigned *)(p))[1] : 0, (v1), #p)
static ncclResult_t valid(const void *p, unsigned size, unsigned magic, unsigned v1, const char *what) {
    char msg[160];
    if (!p) snprintf(msg, sizeof msg, "required %s is NULL", what);
    else if (size < v1) snprintf(msg, sizeof msg, "%s size too small: got %u, expected at least %u", what, size, v1);
    else if (magic != MB_NCCL_EP_MAGIC) snprintf(msg, sizeof msg, "%s magic mismatch: got 0x%x, expected 0x%x", what, magic, MB_NCCL_EP_MAGIC);
    else return ok;
    return bad(invalidArgument, msg);
}
static void decode(void *dst, size_t full, const void *src) {
    memset(dst, 0, full);
    unsigned size = ((const unsigned *)src)[0];
    memcpy(dst, src, size < full ? size : full);
}

// tensor checks a tensor descriptor: magic, size, ndim, data type,
// dimensions (−1: any) and that its memory is the GPU's own.
static ncclResult_t tensor(const mb_ep_tensor *t, const char *what, int ndim, int dtype, long d0, long d1, long d2, int dev) {
    char msg[200];
    if (!t) snprintf(msg, sizeof msg, "%s is required", what);
    else if (t->magic != MB_NCCL_EP_TENSOR_MAGIC || t->size < MB_NCCL_EP_TENSOR_V1_SIZE)
        snprintf(msg, sizeof msg, "%s: not a tensor descriptor (magic 0x%x, size %u)", what, t->magic, t->size);
    else if ((int)t->ndim != ndim || t->datatype != dtype)
        snprintf(msg, sizeof msg, "%s: %u dimensions of type %d, want %d of type %d", what, t->ndim, t->datatype, ndim, dtype);
    else {
        long want[3] = {d0, d1, d2};
        for (int i = 0; i < ndim; i++)
            if (want[i] >= 0 && (long)t->sizes[i] != want[i]) {
                snprintf(msg, sizeof msg, "%s: dimension %d is %zu, want %ld", what, i, t->sizes[i], want[i]);
                return bad(invalidArgument, msg);
            }
        if (t->win) return bad(invalidUsage, "the fake takes no window-backed tensors");
        size_t n = 1;
        for (int i = 0; i < ndim; i++) n *= t->sizes[i];
        if (n && owner((unsigned long long)t->data) != CTX(dev)) {
            snprintf(msg, sizeof msg, "%s: memory of another GPU, or none", what);
            return bad(invalidArgument, msg);
        }
        return ok;
    }
    return bad(invalidArgument, msg);
}

// ---- groups: the ranks of one communicator in one mode

typedef struct world world;
typedef struct {
    unsigned magic; // GROUP_MAGIC while alive
    world *w;       // its ranks' shared state (NULL: a communicator spanning processes, net below)
    int rank, nranks, dev, local, sms;
    mb_ep_group_config cfg;
    long long timeout_ns;
    void *comm;          // its NCCL communicator (net: every exchange goes through it)
    void *stream;        // net: the stream of its host-side exchanges (group creation, handle initialization)
    unsigned long calls; // net: the collective calls issued so far (each exchange's sequence number)
} group;
#define GROUP_MAGIC 0x67727075u

// A handle: its routing and where its ranks' slots are.
typedef struct handle {
    unsigned magic; // HANDLE_MAGIC while alive
    group *g;
    int topk, tokens, updated, dispatched;
    const int32_t *idx; // [tokens, topk] this rank's routing, as last updated
    long rows;          // HT: the output rows the last dispatch filled
    struct handle **all; // every rank's handle (the world's, by rank)
    int *slot;          // this rank's slots: [source rank][token][j] → slot (−1: not here)
    int slots;
    // net: the exchange's blocks, one per rank, each blk bytes (send: to
    // that rank; recv: from it), on the rank's GPU; the sources' token
    // counts at the last dispatch
    unsigned long long send, recv;
    size_t blk;
    int *ntok;
} handle;
#define HANDLE_MAGIC 0x68616e64u

// world is what a communicator's ranks share: their groups, their handles
// and the meeting points of their collective calls.
struct world {
    void *clique;
    int nranks, joined;
    group *g[MAXR];
    handle *h[MAXR];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long gen; // barrier generations passed
    int count;         // arrived at the current one
    const char *op;    // the call the current one is of
    int failed;        // a rank gave up: the others give up too
    // what a collective's ranks publish for the others
    struct { const uint16_t *x; const float *w; const uint16_t *y; long rows; const char *xs; } pub[MAXR];
};
static pthread_mutex_t worldsmu = PTHREAD_MUTEX_INITIALIZER;
static world *worlds[256];
static int nworlds;

static long long timeout_of(const mb_ep_group_config *c) {
    const char *e = getenv("NCCL_EP_TIMEOUT_MS");
    if (e && atoll(e) > 0) return atoll(e) * 1000000LL;
    return c->timeout_ns ? (long long)c->timeout_ns : 100000000000LL; // 100 s, the library's default
}

// meet is a barrier of the world's ranks in call op, for at most
// timeout_ns: 0 once all arrived, else the error (a rank that does not
// call, or calls another collective).
static ncclResult_t meet(world *w, const char *op, int rank, long long timeout_ns) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += timeout_ns / 1000000000LL;
    t.tv_nsec += timeout_ns % 1000000000LL;
    if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
    char msg[200] = "";
    pthread_mutex_lock(&w->mu);
    if (w->count == 0) w->op = op;
    else if (strcmp(w->op, op) != 0) {
        w->failed = 1;
        snprintf(msg, sizeof msg, "rank %d called %s while other ranks called %s: collectives must be called by every rank in the same order", rank, op, w->op);
    }
    unsigned long gen = w->gen;
    if (!msg[0] && ++w->count == w->nranks) {
        w->count = 0, w->gen++;
        pthread_cond_broadcast(&w->cv);
    }
    int timedOut = 0;
    while (!msg[0] && w->gen == gen && !w->failed && !timedOut) timedOut = pthread_cond_timedwait(&w->cv, &w->mu, &t) == ETIMEDOUT;
    if (!msg[0] && w->gen == gen) {
        if (!w->failed) snprintf(msg, sizeof msg, "rank %d: timeout in %s after %lld ms waiting for the other ranks (%d of %d arrived): the real library hangs or traps here",
                                 rank, op, timeout_ns / 1000000, w->count, w->nranks);
        else snprintf(msg, sizeof msg, "rank %d: %s: another rank gave up", rank, op);
        w->failed = 1;
        w->count = 0, w->gen++; // the others stop waiting too
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return msg[0] ? bad(internalError, msg) : ok;
}

static ncclResult_t net_create_group(group *g, void **out);
static ncclResult_t net_init_handle(struct handle *h);

// alike: what every rank of a group must configure alike (the header:
// max_dispatch_tokens_per_rank "must be the same across all ranks"; the
// library: the algorithm and max_recv_tokens_per_rank; the experts they
// share).
#define SAME_CONFIG "ncclEpCreateGroup: algorithm, num_experts, max_dispatch_tokens_per_rank and max_recv_tokens_per_rank must be identical across ranks"
static int alike(const mb_ep_group_config *a, const mb_ep_group_config *b) {
    return a->algorithm == b->algorithm && a->num_experts == b->num_experts && a->max_dispatch_tokens_per_rank == b->max_dispatch_tokens_per_rank &&
           a->max_recv_tokens_per_rank == b->max_recv_tokens_per_rank;
}

ncclResult_t ncclEpCreateGroup(void **out, void *comm, const mb_ep_group_config *in) {
    if (!out || !comm) return bad(invalidArgument, "ncclEpCreateGroup: NULL group or communicator");
    ncclResult_t r = VALID(in, MB_NCCL_EP_GROUP_CONFIG_V1_SIZE);
    if (r) return r;
    group *g = calloc(1, sizeof *g);
    decode(&g->cfg, sizeof g->cfg, in);
    mb_ep_group_config *c = &g->cfg;
    ncclCommCount(comm, &g->nranks);
    ncclCommUserRank(comm, &g->rank);
    ncclCommCuDevice(comm, &g->dev);
    int devSMs = attribute(16, g->dev), cc = 10 * attribute(75, g->dev) + attribute(76, g->dev);
    char msg[200] = "";
    ncclResult_t code = invalidArgument;
    int ht = c->algorithm == MB_NCCL_EP_ALGO_HIGH_THROUGHPUT;
    g->sms = c->max_num_sms ? (int)c->max_num_sms : devSMs;
    if (c->algorithm != MB_NCCL_EP_ALGO_LOW_LATENCY && !ht) snprintf(msg, sizeof msg, "invalid algorithm %d", c->algorithm);
    else if (cc < 90) code = invalidUsage, snprintf(msg, sizeof msg, "NCCL EP requires sm_90 or later (GPU %d is sm_%d)", g->dev, cc);
    else if (!c->num_experts || c->num_experts % g->nranks) snprintf(msg, sizeof msg, "num_experts %u: must be a multiple of the %d ranks", c->num_experts, g->nranks);
    else if (!c->max_dispatch_tokens_per_rank) snprintf(msg, sizeof msg, "max_dispatch_tokens_per_rank must be greater than 0");
    else if (!c->max_token_bytes || (ht && c->max_token_bytes % 16)) snprintf(msg, sizeof msg, "max_token_bytes %u (HT: a multiple of 16)", c->max_token_bytes);
    else if (ht && c->max_recv_tokens_per_rank && c->max_recv_tokens_per_rank < c->max_dispatch_tokens_per_rank)
        snprintf(msg, sizeof msg, "HT mode requires max_recv_tokens_per_rank >= max_dispatch_tokens_per_rank");
    else if ((int)c->max_num_sms > devSMs) code = invalidUsage, snprintf(msg, sizeof msg, "NCCL EP requires max_num_sms <= device_sm_count (%u > %d)", c->max_num_sms, devSMs);
    else if (!ht && ((int)c->num_experts + g->sms - 1) / g->sms > LL_MAX_WARP_GROUPS)
        code = invalidUsage, snprintf(msg, sizeof msg, "insufficient comm SM count for Low-Latency mode: %d SMs with %u experts (need >= %d SMs)", g->sms, c->num_experts,
                 ((int)c->num_experts + LL_MAX_WARP_GROUPS - 1) / LL_MAX_WARP_GROUPS);
    if (msg[0]) {
        free(g);
        return bad(code, msg);
    }
    g->local = c->num_experts / g->nranks;
    g->timeout_ns = timeout_of(c);
    g->comm = comm;
    void *clique = fakenccl_clique(comm);
    if (!clique) return net_create_group(g, out);
    pthread_mutex_lock(&worldsmu);
    world *w = 0;
    for (int i = 0; i < nworlds && !w; i++)
        if (worlds[i]->clique == clique && worlds[i]->joined < worlds[i]->nranks && !worlds[i]->g[g->rank]) w = worlds[i];
    if (!w && nworlds < 256) {
        w = calloc(1, sizeof *w);
        w->clique = clique, w->nranks = g->nranks;
        pthread_mutex_init(&w->mu, 0);
        pthread_cond_init(&w->cv, 0);
        worlds[nworlds++] = w;
    }
    if (w) w->g[g->rank] = g, w->joined++;
    pthread_mutex_unlock(&worldsmu);
    if (!w) return bad(internalError, "the fake's worlds are full");
    g->w = w;
    if ((r = meet(w, "ncclEpCreateGroup", g->rank, g->timeout_ns))) return r; // collective: the real one all-gathers hosts and budgets
    for (int i = 0; i < g->nranks; i++)
        if (!alike(&w->g[i]->cfg, c)) return bad(invalidUsage, SAME_CONFIG);
    g->magic = GROUP_MAGIC;
    *out = g;
    return ok;
}

static group *live_group(void *p) { return p && ((group *)p)->magic == GROUP_MAGIC ? p : 0; }

// comm_gone says, naming call, that g's communicator was destroyed before
// it: the library reaches its peers (and, ending, releases its windows and
// device communicator) through the communicator, which must outlive the
// group and its handles. 0 while the communicator lives (or the NCCL loaded
// cannot tell).
static ncclResult_t comm_gone(group *g, const char *call) {
    int (*live)(void *) = (int (*)(void *))dlsym(RTLD_DEFAULT, "fakenccl_live");
    char msg[200];
    if (!live || live(g->comm)) return ok;
    snprintf(msg, sizeof msg, "%s: rank %d's NCCL communicator was destroyed before its group (the communicator must outlive the group and its handles)", call, g->rank);
    return bad(invalidUsage, msg);
}
static handle *live_handle(void *p) { return p && ((handle *)p)->magic == HANDLE_MAGIC && live_group(((handle *)p)->g) ? p : 0; }

ncclResult_t ncclEpGroupDestroy(void *p) {
    group *g = live_group(p);
    if (!p) return ok;
    if (!g) return bad(invalidUsage, "ncclEpGroupDestroy: not a live group (destroyed twice?)");
    ncclResult_t r = comm_gone(g, "ncclEpGroupDestroy");
    g->magic = 0; // kept: a use after destruction is refused, not a crash
    if (g->stream) {
        int (*destroy)(void *) = (int (*)(void *))fakecuda_sym("cuStreamDestroy_v2");
        if (destroy) destroy(g->stream);
        g->stream = 0;
    }
    return r;
}

ncclResult_t ncclEpInitHandle(void **out, void *gp, int layout, const mb_ep_handle_config *config, int topk, const mb_ep_tensor *mem) {
    group *g = live_group(gp);
    if (!out || !g) return bad(invalidUsage, "ncclEpInitHandle: no live group");
    mb_ep_handle_config c = {0};
    if (config) {
        ncclResult_t r = VALID(config, MB_NCCL_EP_HANDLE_CONFIG_V1_SIZE);
        if (r) return r;
        decode(&c, sizeof c, config);
    }
    if (layout != MB_NCCL_EP_LAYOUT_EXPERT_MAJOR) return bad(invalidUsage, "ncclEpInitHandle: the fake implements the expert-major layout only");
    if (c.dispatch_output_per_expert_alignment > 1) return bad(invalidUsage, "ncclEpInitHandle: the fake pads no expert zones");
    if (topk <= 0 || topk > MAX_TOPK || topk > (int)g->cfg.num_experts) return bad(invalidArgument, "ncclEpInitHandle: top-k must be in [1, min(num_experts, 32)]");
    if (mem) return bad(invalidUsage, "ncclEpInitHandle: the fake allocates the handle's memory itself");
    handle *h = calloc(1, sizeof *h);
    h->magic = HANDLE_MAGIC, h->g = g, h->topk = topk;
    if (!g->w) { // net: the exchange's buffers; low latency: a collective
        ncclResult_t r = net_init_handle(h);
        if (r) return free(h), r;
        *out = h;
        return ok;
    }
    h->all = g->w->h;
    g->w->h[g->rank] = h;
    if (g->cfg.algorithm == MB_NCCL_EP_ALGO_LOW_LATENCY) { // AUTO rdma buffer: may be collective (sized now)
        ncclResult_t r = meet(g->w, "ncclEpInitHandle", g->rank, g->timeout_ns);
        if (r) return r;
    }
    *out = h;
    return ok;
}

ncclResult_t ncclEpHandleDestroy(void *p) {
    handle *h = p;
    if (!h) return ok;
    if (h->magic != HANDLE_MAGIC) return bad(invalidUsage, "ncclEpHandleDestroy: not a live handle (destroyed twice?)");
    ncclResult_t r = comm_gone(h->g, "ncclEpHandleDestroy");
    h->magic = 0;
    int (*memfree)(unsigned long long) = (int (*)(unsigned long long))fakecuda_sym("cuMemFree_v2");
    if (memfree && h->send) memfree(h->send), memfree(h->recv);
    h->send = h->recv = 0;
    return r;
}

// ---- the stream parts of the collective calls

typedef struct part {
    handle *h;
    int kind; // 0 update, 1 dispatch, 2 combine
    const int32_t *idx;
    int32_t *counters, *total;
    const uint16_t *x;
    const float *w;
    uint16_t *out;
    float *outw;
    long rows;
    int bwd; // pass_direction BWD (high throughput): dispatch without weights; combine with them (w in, outw [tokens, topk] out)
    // dispatch: a row's token bytes and scale bytes (sb 0: no scales; with
    // NCCL_EP_DISP_QUANT_FWD the scales xs [tokens, ·] go to outs as the
    // tokens go to out: the same slot, bytes as they are)
    long tb, sb;
    const char *xs;
    char *outs;
    unsigned long seq; // net: the call's place in the group's sequence
} part;

static uint16_t tobf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (uint16_t)(u >> 16); }
static float bf(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }

// run_part runs on the rank's stream: it publishes its inputs, meets the
// other ranks, does its own side, and meets them again (no rank's inputs
// change before every rank has read them).
static void run_part(void *arg) {
    part *p = arg;
    handle *h = p->h;
    group *g = h->g;
    world *w = g->w;
    int me = g->rank, R = g->nranks, L = g->local, k = h->topk, T = h->tokens;
    int hidden = (int)g->cfg.max_token_bytes / 2, ll = g->cfg.algorithm == MB_NCCL_EP_ALGO_LOW_LATENCY;
    static const char *names[] = {"ncclEpUpdateHandle", "ncclEpDispatch", "ncclEpCombine", "", "ncclEpDispatch (BWD)", "ncclEpCombine (BWD)"};
    const char *op = names[p->kind + 3 * p->bwd]; // a rank in the backward's call meets only ranks in it
    hidden = p->kind ? (int)p->rows : hidden;
    w->pub[me].x = p->x, w->pub[me].w = p->w, w->pub[me].y = p->x, w->pub[me].xs = p->xs;
    ncclResult_t r = meet(w, op, me, g->timeout_ns);
    if (!r && p->kind == 0) { // this rank's counts per local expert over every rank's routing
        long total = 0;
        for (int l = 0; l < L; l++) {
            int n = 0;
            for (int s = 0; s < R; s++) {
                handle *o = h->all[s];
                for (int i = 0; i < o->tokens * k; i++) n += o->idx[i] == me * L + l;
            }
            if (p->counters) p->counters[l] = n;
            total += n;
        }
        if (p->total) *p->total = (int32_t)total;
    } else if (!r && p->kind == 1) { // rows and weights into this rank's slots, by local expert, then (source, token)
        int slot = 0;
        for (int l = 0; l < L; l++) {
            int first = slot;
            for (int s = 0; s < R; s++) {
                handle *o = h->all[s];
                for (int t = 0; t < o->tokens; t++)
                    for (int j = 0; j < k; j++) {
                        if (o->idx[t * k + j] != me * L + l) continue;
                        long at = ll ? (long)l * R * g->cfg.max_dispatch_tokens_per_rank + (slot - first) : slot;
                        memcpy((char *)p->out + at * p->tb, (const char *)w->pub[s].x + t * p->tb, (size_t)p->tb);
                        if (p->sb) memcpy(p->outs + at * p->sb, w->pub[s].xs + t * p->sb, (size_t)p->sb);
                        if (p->outw) p->outw[at] = w->pub[s].w[t * k + j];
                        h->slot[(s * (long)g->cfg.max_dispatch_tokens_per_rank + t) * k + j] = (int)at;
                        slot++;
                    }
            }
            if (ll && p->counters) p->counters[l] = slot - first;
        }
        h->rows = slot;
    } else if (!r && p->kind == 2) { // this rank's tokens: their slots on every rank
        float *acc = malloc(sizeof(float) * hidden), *part = malloc(sizeof(float) * hidden);
        for (int t = 0; t < T; t++) {
            memset(acc, 0, sizeof(float) * hidden);
            for (int d = 0; d < R; d++) {
                handle *o = h->all[d];
                memset(part, 0, sizeof(float) * hidden);
                int any = 0;
                for (int j = 0; j < k; j++) {
                    int at = o->slot[(me * (long)g->cfg.max_dispatch_tokens_per_rank + t) * k + j];
                    if (at < 0) continue;
                    float wt = ll ? p->w[t * k + j] : 1;
                    for (int c = 0; c < hidden; c++) part[c] += wt * bf(w->pub[d].y[(long)at * hidden + c]);
                    any = 1;
                }
                for (int c = 0; any && c < hidden; c++) acc[c] += ll ? part[c] : bf(tobf(part[c])); // HT: the rank's pre-reduction in bf16
            }
            for (int c = 0; c < hidden; c++) p->out[(long)t * hidden + c] = tobf(acc[c]);
            for (int j = 0; p->bwd && j < k; j++) { // the (t, j) slot's weight, from the rank that holds it, in the forward's k order
                p->outw[t * k + j] = 0;
                for (int d = 0; d < R; d++) {
                    int at = h->all[d]->slot[(me * (long)g->cfg.max_dispatch_tokens_per_rank + t) * k + j];
                    if (at >= 0) p->outw[t * k + j] += w->pub[d].w[at];
                }
            }
        }
        free(acc);
        free(part);
    }
    if (!r) r = meet(w, op, me, g->timeout_ns);
    if (r) gpu_failed(g->dev);
    free(p);
}

static ncclResult_t net_queue(part *p, void *stream);

// hooked applies the tests' hooks to rank's call: 1 when it fails, 2 when
// it is skipped, 0 otherwise.
static int hooked(const char *call, int rank) {
    const char *f = getenv("FAKENCCLEP_FAIL"), *s = getenv("FAKENCCLEP_SKIP");
    char want[80];
    if (f && strcmp(f, call) == 0) return 1;
    snprintf(want, sizeof want, "%s %d", call, rank);
    return s && strcmp(s, want) == 0 ? 2 : 0;
}

// queue puts a part on the rank's stream (which must be its GPU's).
static ncclResult_t queue(part *p, void *stream) {
    static const char *names[] = {"ncclEpUpdateHandle", "ncclEpDispatch", "ncclEpCombine"};
    switch (hooked(names[p->kind], p->h->g->rank)) {
    case 1: free(p); return bad(internalError, "a failure the test asked for ($FAKENCCLEP_FAIL)");
    case 2: free(p); return ok;
    }
    ncclResult_t gone = comm_gone(p->h->g, names[p->kind]);
    if (gone) return free(p), gone;
    enqueue_fn q = (enqueue_fn)fakecuda_sym("fakecuda_enqueue");
    if (!stream || *(void **)stream != CTX(p->h->g->dev)) {
        free(p);
        return bad(invalidArgument, "a stream of another GPU");
    }
    if (!p->h->g->w) return net_queue(p, stream);
    if (!q || q(stream, run_part, p)) {
        free(p);
        return bad(invalidUsage, "the stream refused the call (a capture?)");
    }
    return ok;
}

ncclResult_t ncclEpUpdateHandle(void *hp, const mb_ep_tensor *idx, const mb_ep_layout_info *li, void *stream) {
    handle *h = live_handle(hp);
    if (!h) return bad(invalidUsage, "ncclEpUpdateHandle: not a live handle");
    group *g = h->g;
    mb_ep_layout_info info = {0};
    if (li) {
        ncclResult_t r = VALID(li, MB_NCCL_EP_LAYOUT_INFO_V1_SIZE);
        if (r) return r;
        decode(&info, sizeof info, li);
    }
    ncclResult_t r = tensor(idx, "topk_idx", 2, MB_ncclInt32, -1, h->topk, -1, g->dev);
    if (r) return r;
    if (idx->sizes[0] > g->cfg.max_dispatch_tokens_per_rank) return bad(invalidArgument, "topk_idx: more tokens than max_dispatch_tokens_per_rank");
    h->tokens = (int)idx->sizes[0];
    size_t n = (size_t)g->nranks * g->cfg.max_dispatch_tokens_per_rank * h->topk;
    h->idx = (const int32_t *)idx->data; // read when the part runs, in stream order
    if (!h->slot) h->slot = malloc(sizeof(int) * n);
    for (size_t i = 0; i < n; i++) h->slot[i] = -1;
    h->updated = 1, h->dispatched = 0;
    if (g->cfg.algorithm == MB_NCCL_EP_ALGO_LOW_LATENCY) {
        if (li) return bad(invalidArgument, "LL mode does not accept local tensors in ncclEpUpdateHandle");
        return ok; // the routing is cached; the dispatch all-gathers it
    }
    part *p = calloc(1, sizeof *p);
    p->h = h, p->kind = 0;
    if (info.expert_counters) {
        if ((r = tensor(info.expert_counters, "expert_counters", 1, MB_ncclInt32, g->local, -1, -1, g->dev))) return free(p), r;
        p->counters = info.expert_counters->data;
    }
    if (info.recv_total_counter) {
        if ((r = tensor(info.recv_total_counter, "recv_total_counter", 1, MB_ncclInt32, 1, -1, -1, g->dev))) return free(p), r;
        p->total = info.recv_total_counter->data;
    }
    return queue(p, stream); // HT: the routing map's all-gather and the scan
}

// direction reads a config's pass_direction into *bwd: NCCL_EP_FWD_PASS (0)
// or NCCL_EP_BWD_PASS (1), the latter high throughput only (the library
// refuses it in low-latency mode with ncclInvalidUsage).
static ncclResult_t direction(int pass, int ll, const char *call, int *bwd) {
    char msg[160];
    *bwd = pass == 1;
    if (pass != 0 && pass != 1) {
        snprintf(msg, sizeof msg, "%s: pass_direction %d (NCCL_EP_FWD_PASS 0 or NCCL_EP_BWD_PASS 1)", call, pass);
        return bad(invalidArgument, msg);
    }
    if (ll && *bwd) {
        snprintf(msg, sizeof msg, "%s: backward pass (pass_direction=%d) is not supported in LL mode", call, pass);
        return bad(invalidUsage, msg);
    }
    return ok;
}

// type_bytes is the bytes of one element of an ncclDataType_t the
// dispatch takes (ncclFloat4x2, 12: one byte holding two FP4 values).
static long type_bytes(int t) {
    switch (t) {
    case MB_ncclFloat32: return 4;
    case 6 /* ncclFloat16 */: case MB_ncclBfloat16: return 2;
    default: return 1; // ncclUint8 (1), ncclFloat8e4m3 (10), ncclFloat8e5m2 (11), ncclFloat4x2 (12)
    }
}

// recipe reads a dispatch config's quant_recipe (nccl_ep.h's "Dispatch
// quantization contracts"; a V1-sized config has none: NONE):
//   - NONE (0): the tokens move in their declared type (the fake: bf16);
//     both scales tensors must be absent;
//   - NCCL_EP_DISP_QUANT_FWD (1): tokens of FP32, FP16, BF16, FP8 (e4m3,
//     e5m2) or ncclFloat4x2 and scales [tokens, ·] of those (FP4 excepted)
//     or ncclUint8 are forwarded as their bytes: the outputs' types and row
//     widths must be the inputs', round_scales zero, rows 16-byte aligned;
//   - NCCL_EP_DISP_QUANT_DS_FP8E3M4 (2): low-latency only, the library
//     quantizes BF16 tokens itself; the fake does not implement it
//     (ncclInvalidUsage), and refuses it in high-throughput mode as the
//     header's "LL-only" says;
//   - any other value: ncclInvalidArgument.
// *fwd says QUANT_FWD, *tt and *st the tokens' and scales' types.
static ncclResult_t recipe(const mb_ep_dispatch_config *c, const mb_ep_dispatch_inputs *in, const mb_ep_dispatch_outputs *out, int *fwd, int *tt, int *st) {
    char msg[200];
    switch (c->quant_recipe) {
    case MB_NCCL_EP_DISP_QUANT_NONE:
        if (in->scales || out->scales) return bad(invalidArgument, "quant_recipe NONE: inputs->scales and outputs->scales must be absent");
        return ok;
    case MB_NCCL_EP_DISP_QUANT_DS_FP8E3M4:
        return bad(invalidUsage, "quant_recipe DS_FP8E3M4: LL-only, and the fake does not implement its internal quantization");
    case MB_NCCL_EP_DISP_QUANT_FWD:
        break;
    default:
        snprintf(msg, sizeof msg, "unknown quant_recipe %d", c->quant_recipe);
        return bad(invalidArgument, msg);
    }
    if (c->round_scales) return bad(invalidArgument, "QUANT_FWD: round_scales must be zero (the scales are forwarded as they are)");
    if (!in->tokens || !in->scales || !out->tokens || !out->scales) return bad(invalidArgument, "QUANT_FWD: inputs and outputs need tokens and scales");
    int t = in->tokens->datatype, s = in->scales->datatype;
    if (t != MB_ncclFloat32 && t != 6 && t != MB_ncclBfloat16 && t != MB_ncclFloat8e4m3 && t != 11 && t != 12) {
        snprintf(msg, sizeof msg, "QUANT_FWD: tokens of type %d (FP32, FP16, BF16, FP8 or ncclFloat4x2)", t);
        return bad(invalidArgument, msg);
    }
    if (s != MB_ncclFloat32 && s != 6 && s != MB_ncclBfloat16 && s != MB_ncclFloat8e4m3 && s != 11 && s != 1) {
        snprintf(msg, sizeof msg, "QUANT_FWD: scales of type %d (FP32, FP16, BF16, FP8 or ncclUint8)", s);
        return bad(invalidArgument, msg);
    }
    *fwd = 1, *tt = t, *st = s;
    return ok;
}

// worst is the high-throughput expert-major slots a rank may receive.
static long worst(group *g, int topk) {
    if (g->cfg.max_recv_tokens_per_rank) return g->cfg.max_recv_tokens_per_rank;
    return (long)g->nranks * g->cfg.max_dispatch_tokens_per_rank * topk; // eager: the bound sizes only internal buffers
}

ncclResult_t ncclEpDispatch(void *hp, const mb_ep_dispatch_inputs *inp, const mb_ep_dispatch_outputs *outp, const mb_ep_layout_info *li,
                            const mb_ep_dispatch_config *cfg, void *stream) {
    ncclResult_t r;
    if ((r = VALID(inp, MB_NCCL_EP_DISPATCH_INPUTS_V1_SIZE)) || (r = VALID(outp, MB_NCCL_EP_DISPATCH_OUTPUTS_V1_SIZE))) return r;
    if (li && (r = VALID(li, MB_NCCL_EP_LAYOUT_INFO_V1_SIZE))) return r;
    if (cfg && (r = VALID(cfg, MB_NCCL_EP_DISPATCH_CONFIG_V1_SIZE))) return r;
    handle *h = live_handle(hp);
    if (!h) return bad(invalidUsage, "ncclEpDispatch: not a live handle");
    if (!h->updated) return bad(invalidUsage, "ncclEpDispatch before ncclEpUpdateHandle");
    group *g = h->g;
    mb_ep_dispatch_inputs in;
    mb_ep_dispatch_outputs out;
    mb_ep_dispatch_config c = {0};
    mb_ep_layout_info info = {0};
    decode(&in, sizeof in, inp);
    decode(&out, sizeof out, outp);
    if (cfg) decode(&c, sizeof c, cfg);
    if (li) decode(&info, sizeof info, li);
    if (c.send_only) return bad(invalidUsage, "the fake dispatches unstaged only");
    int ll = g->cfg.algorithm == MB_NCCL_EP_ALGO_LOW_LATENCY, bwd;
    if ((r = direction(c.pass_direction, ll, "ncclEpDispatch", &bwd))) return r;
    int fwd = 0, tt = MB_ncclBfloat16, st = 0; // QUANT_FWD; the tokens' and the scales' data types
    long S = 0;
    if ((r = recipe(&c, &in, &out, &fwd, &tt, &st))) return r;
    if ((r = tensor(in.tokens, "inputs->tokens", 2, tt, h->tokens, -1, -1, g->dev))) return r;
    long hidden = (long)in.tokens->sizes[1], tb = hidden * type_bytes(tt), sb = 0;
    if (fwd) {
        if ((r = tensor(in.scales, "inputs->scales", 2, st, h->tokens, -1, -1, g->dev))) return r;
        S = (long)in.scales->sizes[1], sb = S * type_bytes(st);
        if (sb % 16 || (uintptr_t)in.tokens->data % 16 || (uintptr_t)in.scales->data % 16)
            return bad(invalidArgument, "QUANT_FWD: token and scale rows and their storage must be 16-byte aligned");
    }
    if (tb + sb > g->cfg.max_token_bytes) return bad(invalidArgument, "token bytes (quantized: tokens and scales) exceed the group's max_token_bytes");
    if (tb % 16) return bad(invalidArgument, "token bytes per token must be 16-byte aligned");
    part *p = calloc(1, sizeof *p);
    p->h = h, p->kind = 1, p->x = in.tokens->data, p->rows = hidden, p->bwd = bwd, p->tb = tb, p->sb = sb;
    if (fwd) p->xs = in.scales->data;
    if (ll) {
        long slots = (long)g->nranks * g->cfg.max_dispatch_tokens_per_rank;
        if (in.topk_weights || out.topk_weights || out.topk_idx) return free(p), bad(invalidArgument, "LL expert-major: no top-k weights or indices in or out");
        if ((r = tensor(out.tokens, "outputs->tokens", 3, tt, g->local, slots, hidden, g->dev))) return free(p), r;
        if (fwd && (r = tensor(out.scales, "outputs->scales", 3, st, g->local, slots, S, g->dev))) return free(p), r;
        if (fwd && ((uintptr_t)out.tokens->data % 16 || (uintptr_t)out.scales->data % 16))
            return free(p), bad(invalidArgument, "QUANT_FWD: the outputs' storage must be 16-byte aligned");
        if (fwd) p->outs = out.scales->data;
        if ((r = tensor(info.expert_counters, "layout_info->expert_counters", 1, MB_ncclInt32, g->local, -1, -1, g->dev))) return free(p), r;
        p->out = out.tokens->data, p->counters = info.expert_counters->data;
        return queue(p, stream);
    }
    if (li) return free(p), bad(invalidArgument, "HT: layout_info must be NULL in ncclEpDispatch (the counts come with the handle's update)");
    if ((g->local * g->nranks * 4) % 16) return free(p), bad(invalidArgument, "HT dispatch requires experts_per_lsa_team to be a multiple of 4");
    if (bwd && (in.topk_weights || out.topk_weights || out.topk_idx))
        return free(p), bad(invalidArgument, "HT backward dispatch: inputs->topk_weights, outputs->topk_weights and outputs->topk_idx must be absent (the routing is the handle's)");
    if (!bwd && (r = tensor(in.topk_weights, "inputs->topk_weights", 2, MB_ncclFloat32, h->tokens, h->topk, -1, g->dev))) return free(p), r;
    if ((r = tensor(out.tokens, "outputs->tokens", 2, tt, -1, hidden, -1, g->dev))) return free(p), r;
    long rows = (long)out.tokens->sizes[0];
    if (fwd && (r = tensor(out.scales, "outputs->scales", 2, st, rows, S, -1, g->dev))) return free(p), r;
    if (fwd && ((uintptr_t)out.tokens->data % 16 || (uintptr_t)out.scales->data % 16))
        return free(p), bad(invalidArgument, "QUANT_FWD: the outputs' storage must be 16-byte aligned");
    if (fwd) p->outs = out.scales->data;
    int eager = !g->cfg.max_recv_tokens_per_rank;
    if (!eager && rows < worst(g, h->topk)) return free(p), bad(invalidArgument, "HT: outputs->tokens must cover max_recv_tokens_per_rank");
    if (!bwd && (r = tensor(out.topk_weights, "outputs->topk_weights", 1, MB_ncclFloat32, rows, -1, -1, g->dev))) return free(p), r;
    p->out = out.tokens->data;
    if (!bwd) p->w = in.topk_weights->data, p->outw = out.topk_weights->data;
    if ((r = queue(p, stream))) return r;
    if (eager) { // the received count read back: a host synchronization (which a part that never meets its peers fails)
        int (*sync)(void *) = (int (*)(void *))fakecuda_sym("cuStreamSynchronize");
        if (sync && sync(stream)) return bad(internalError, "ncclEpDispatch: the received count's read-back failed");
    }
    return ok;
}

ncclResult_t ncclEpCombine(void *hp, const mb_ep_combine_inputs *inp, const mb_ep_combine_outputs *outp, const mb_ep_combine_config *cfg, void *stream) {
    ncclResult_t r;
    if ((r = VALID(inp, MB_NCCL_EP_COMBINE_INPUTS_V1_SIZE)) || (r = VALID(outp, MB_NCCL_EP_COMBINE_OUTPUTS_V1_SIZE))) return r;
    if (cfg && (r = VALID(cfg, MB_NCCL_EP_COMBINE_CONFIG_V1_SIZE))) return r;
    handle *h = live_handle(hp);
    if (!h) return bad(invalidUsage, "ncclEpCombine: not a live handle");
    if (!h->updated) return bad(invalidUsage, "ncclEpCombine before a dispatch");
    group *g = h->g;
    mb_ep_combine_inputs in;
    mb_ep_combine_outputs out;
    mb_ep_combine_config c = {0};
    decode(&in, sizeof in, inp);
    decode(&out, sizeof out, outp);
    if (cfg) decode(&c, sizeof c, cfg);
    if (c.send_only || c.quant_recipe) return bad(invalidUsage, "the fake combines unstaged and unquantized only");
    int ll = g->cfg.algorithm == MB_NCCL_EP_ALGO_LOW_LATENCY, bwd;
    if ((r = direction(c.pass_direction, ll, "ncclEpCombine", &bwd))) return r;
    if (!bwd && in.topk_weights) return bad(invalidArgument, "forward combine: no input top-k weights");
    part *p = calloc(1, sizeof *p);
    p->h = h, p->kind = 2;
    long hidden;
    if (ll) {
        if ((r = tensor(in.tokens, "inputs->tokens", 3, MB_ncclBfloat16, g->local, (long)g->nranks * g->cfg.max_dispatch_tokens_per_rank, -1, g->dev))) return free(p), r;
        hidden = (long)in.tokens->sizes[2];
        if (hidden % 128) return free(p), bad(invalidArgument, "LL combine: the hidden size must be a multiple of 128");
        if ((r = tensor(out.topk_weights, "outputs->topk_weights", 2, MB_ncclFloat32, h->tokens, h->topk, -1, g->dev))) return free(p), r;
        p->w = out.topk_weights->data;
    } else {
        if ((r = tensor(in.tokens, "inputs->tokens", 2, MB_ncclBfloat16, -1, -1, -1, g->dev))) return free(p), r;
        hidden = (long)in.tokens->sizes[1];
        if (bwd) { // the slots' weight gradients in (expert-major: 1D, a slot's one), each token's k out
            if (!in.topk_weights || !out.topk_weights)
                return free(p), bad(invalidArgument, "HT backward combine: inputs->topk_weights and outputs->topk_weights are required");
            if ((r = tensor(in.topk_weights, "inputs->topk_weights (expert-major: 1D [num_recv_tokens])", 1, MB_ncclFloat32, (long)in.tokens->sizes[0], -1, -1, g->dev)))
                return free(p), r;
            if ((r = tensor(out.topk_weights, "outputs->topk_weights", 2, MB_ncclFloat32, h->tokens, h->topk, -1, g->dev))) return free(p), r;
            p->w = in.topk_weights->data, p->outw = out.topk_weights->data, p->bwd = 1;
        }
    }
    if ((r = tensor(out.tokens, "outputs->tokens", 2, MB_ncclBfloat16, h->tokens, hidden, -1, g->dev))) return free(p), r;
    p->x = in.tokens->data, p->out = out.tokens->data, p->rows = hidden;
    return queue(p, stream);
}

// ---- across processes: every collective an exchange over NCCL
//
// A communicator that spans processes (the fake NCCL's clique is NULL)
// has no memory its ranks share, so each collective call is one exchange
// over NCCL's send/recv: a block of fixed size (the same on every rank, set
// by the group's configuration and the handle's top-k) to and from every
// rank, itself included, issued on the call's stream between a pack part,
// which writes this rank's blocks, and an unpack part, which reads the
// others'. Each block starts with a header naming the call and its place
// in the group's sequence of calls: a rank whose block did not come (it did
// not call; the transport gave up after the group's timeout, which bounds
// these exchanges' waits) or came from another call is named, and the GPU's
// context fails as in one process. What each block carries:
//   - update (high throughput): the rank's routing, every rank's counted;
//   - dispatch: the rank's routing and routing weights, and to each rank
//     only the rows of the tokens routed to that rank's experts (the rest
//     of the block zero); the receiver places them as in one process;
//   - combine: to each token's rank, the outputs of that token's (token, j)
//     slots held here, with a byte saying which are; the token's rank sums
//     them in the one-process order and roundings.
// Group creation and the low-latency handle's initialization exchange
// headers only (on a stream of the group's own), and check that every
// rank configured the group alike.

enum { K_UPDATE, K_DISPATCH, K_COMBINE, K_CREATE, K_INIT, K_CALLS };
static const char *call_names[K_CALLS] = {"ncclEpUpdateHandle", "ncclEpDispatch", "ncclEpCombine", "ncclEpCreateGroup", "ncclEpInitHandle"};
#define XMAGIC 0x78636867u
typedef struct {
    uint32_t magic, kind;
    uint64_t seq;
    int32_t rank, tokens, algorithm, topk;
    uint32_t recv, experts, token_bytes, max_tokens;
    int32_t pass, pad[3]; // the call's pass_direction
} xhdr;
#define XHDR 64
_Static_assert(sizeof(xhdr) == XHDR, "the exchange header's size");
#define ALIGN16(n) (((n) + 15) / 16 * 16)

typedef int (*memalloc_fn)(unsigned long long *, size_t);
typedef int (*memfree_fn)(unsigned long long);

// on makes g's GPU current on the calling thread, as the real library does
// (cudaSetDevice(ncclCommCuDevice(comm))).
static void on(group *g) {
    int (*set)(void *) = (int (*)(void *))fakecuda_sym("cuCtxSetCurrent");
    if (set) set(CTX(g->dev));
}

// xchg issues the exchange of g's blocks on stream: send and recv hold
// one block of blk bytes per rank, to and from it.
static ncclResult_t xchg(group *g, unsigned long long send, unsigned long long recv, size_t blk, void *stream) {
    void (*wait)(double) = (void (*)(double))dlsym(RTLD_DEFAULT, "fakenccl_wait");
    if (wait) wait((double)g->timeout_ns / 1e9);
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < g->nranks && !r; p++) {
        r = ncclSend((void *)(send + p * blk), blk, 1 /* ncclUint8 */, p, g->comm, stream);
        if (!r) r = ncclRecv((void *)(recv + p * blk), blk, 1, p, g->comm, stream);
    }
    ncclResult_t e = ncclGroupEnd();
    if (wait) wait(0);
    if (r || e) return bad(internalError, "NCCL refused an exchange of NCCL EP's (its message above)");
    return ok;
}

// header fills x for call kind, number seq, of rank g's handle h (NULL:
// none yet).
static void header(xhdr *x, group *g, handle *h, int kind, uint64_t seq) {
    memset(x, 0, sizeof *x);
    x->magic = XMAGIC, x->kind = (uint32_t)kind, x->seq = seq, x->rank = g->rank;
    x->tokens = h ? h->tokens : 0, x->topk = h ? h->topk : 0, x->algorithm = g->cfg.algorithm;
    x->recv = g->cfg.max_recv_tokens_per_rank, x->experts = g->cfg.num_experts;
    x->token_bytes = g->cfg.max_token_bytes, x->max_tokens = g->cfg.max_dispatch_tokens_per_rank;
}

// heard checks every rank's block in recv (blk bytes each) against call
// kind, number seq: ok, or the error naming the first rank that did not
// take part or took part in another call.
static ncclResult_t heard(group *g, const char *recv, size_t blk, int kind, uint64_t seq, int pass) {
    char msg[320];
    static const char *dir[] = {"", " (BWD)"};
    for (int p = 0; p < g->nranks; p++) {
        const xhdr *x = (const xhdr *)(recv + p * blk);
        if (x->magic != XMAGIC)
            snprintf(msg, sizeof msg, "rank %d: timeout in %s after %lld ms: nothing from rank %d, which did not take part "
                     "(the real library hangs or traps here)", g->rank, call_names[kind], g->timeout_ns / 1000000, p);
        else if (x->kind >= K_CALLS || x->kind != (uint32_t)kind || x->seq != seq || x->pass != pass)
            snprintf(msg, sizeof msg, "rank %d called %s%s (its collective call %llu of the group) while rank %d called %s%s (call %llu): "
                     "collectives must be called by every rank in the same order", p, x->kind < K_CALLS ? call_names[x->kind] : "an unknown call",
                     dir[x->pass == 1], (unsigned long long)x->seq, g->rank, call_names[kind], dir[pass == 1], (unsigned long long)seq);
        else continue;
        return bad(internalError, msg);
    }
    return ok;
}

// host_xchg is a host call's exchange of headers (group creation, handle
// initialization), waited for on the group's stream; all receives every
// rank's header.
static ncclResult_t host_xchg(group *g, handle *h, int kind, xhdr *all) {
    memalloc_fn alloc = (memalloc_fn)fakecuda_sym("cuMemAlloc_v2");
    memfree_fn memfree = (memfree_fn)fakecuda_sym("cuMemFree_v2");
    int (*sync)(void *) = (int (*)(void *))fakecuda_sym("cuStreamSynchronize");
    unsigned long long send = 0, recv = 0;
    size_t n = (size_t)g->nranks * XHDR;
    on(g);
    if (!alloc || !memfree || !sync || alloc(&send, n) || alloc(&recv, n)) {
        if (send) memfree(send);
        return bad(internalError, "no memory for NCCL EP's exchange on the communicator's GPU");
    }
    uint64_t seq = ++g->calls;
    for (int p = 0; p < g->nranks; p++) header((xhdr *)(send + p * XHDR), g, h, kind, seq);
    memset((void *)recv, 0, n);
    ncclResult_t r = xchg(g, send, recv, XHDR, g->stream);
    int failed = !r && sync(g->stream);
    if (!r) r = heard(g, (const char *)recv, XHDR, kind, seq, 0);
    if (!r && failed) r = bad(internalError, "NCCL EP's exchange failed on the communicator's GPU");
    memcpy(all, (void *)recv, n);
    memfree(send), memfree(recv);
    return r;
}

static ncclResult_t net_create_group(group *g, void **out) {
    int (*mk)(void **, unsigned, int) = (int (*)(void **, unsigned, int))fakecuda_sym("cuStreamCreateWithPriority");
    on(g);
    if (!mk || mk(&g->stream, 1, 0)) {
        free(g);
        return bad(internalError, "ncclEpCreateGroup: no stream on the communicator's GPU");
    }
    xhdr *all = calloc(g->nranks, sizeof *all);
    ncclResult_t r = host_xchg(g, 0, K_CREATE, all); // the real one all-gathers hosts and budgets
    for (int p = 0; p < g->nranks && !r; p++) {
        mb_ep_group_config c = g->cfg;
        c.algorithm = all[p].algorithm, c.num_experts = all[p].experts, c.max_dispatch_tokens_per_rank = all[p].max_tokens, c.max_recv_tokens_per_rank = all[p].recv;
        if (!alike(&c, &g->cfg)) r = bad(invalidUsage, SAME_CONFIG);
    }
    free(all);
    if (r) { // the stream is kept: its part may still run
        g->magic = 0;
        return r;
    }
    g->magic = GROUP_MAGIC;
    *out = g;
    return ok;
}

static ncclResult_t net_init_handle(handle *h) {
    group *g = h->g;
    size_t T = g->cfg.max_dispatch_tokens_per_rank, k = (size_t)h->topk, H = g->cfg.max_token_bytes / 2;
    size_t update = XHDR + T * k * 4, dispatch = XHDR + T * k * 8 + T * H * 2, combine = XHDR + ALIGN16(T * k) + T * k * H * 2 + T * k * 4;
    h->blk = ALIGN16(update > dispatch ? (update > combine ? update : combine) : (dispatch > combine ? dispatch : combine));
    memalloc_fn alloc = (memalloc_fn)fakecuda_sym("cuMemAlloc_v2");
    on(g);
    if (!alloc || alloc(&h->send, g->nranks * h->blk) || alloc(&h->recv, g->nranks * h->blk))
        return bad(internalError, "ncclEpInitHandle: no memory for the handle's exchanges on the communicator's GPU");
    h->ntok = calloc(g->nranks, sizeof(int));
    if (g->cfg.algorithm == MB_NCCL_EP_ALGO_LOW_LATENCY) { // AUTO rdma buffer: may be collective (sized now)
        xhdr *all = calloc(g->nranks, sizeof *all);
        ncclResult_t r = host_xchg(g, h, K_INIT, all);
        free(all);
        if (r) return r;
    }
    h->magic = HANDLE_MAGIC;
    return ok;
}

// the parts of a block: routing [T×k] int32, weights [T×k] fp32 and rows
// [T, H] bf16 (dispatch); which slots came [T×k] bytes and their rows
// [T×k, H] (combine)
static int32_t *blk_idx(char *b) { return (int32_t *)(b + XHDR); }
static float *blk_w(char *b, size_t T, size_t k) { return (float *)(b + XHDR + T * k * 4); }
static uint16_t *blk_rows(char *b, size_t T, size_t k) { return (uint16_t *)(b + XHDR + T * k * 8); }
static uint8_t *blk_has(char *b) { return (uint8_t *)(b + XHDR); }
static uint16_t *blk_out(char *b, size_t T, size_t k) { return (uint16_t *)(b + XHDR + ALIGN16(T * k)); }
static float *blk_cw(char *b, size_t T, size_t k, size_t H) { return (float *)(b + XHDR + ALIGN16(T * k) + T * k * H * 2); } // backward combine: the slots' weights

static void net_pack(void *arg) {
    part *p = arg;
    handle *h = p->h;
    group *g = h->g;
    int me = g->rank, R = g->nranks, L = g->local, k = h->topk, T = h->tokens, kind = p->kind;
    size_t Tm = g->cfg.max_dispatch_tokens_per_rank, hidden = (size_t)p->rows, Hm = g->cfg.max_token_bytes / 2;
    memset((void *)h->recv, 0, R * h->blk);
    for (int d = 0; d < R; d++) {
        char *b = (char *)(h->send + d * h->blk);
        memset(b, 0, h->blk);
        header((xhdr *)b, g, h, kind, p->seq);
        ((xhdr *)b)->pass = p->bwd;
        if (kind == K_UPDATE || kind == K_DISPATCH) memcpy(blk_idx(b), h->idx, sizeof(int32_t) * T * k);
        if (kind == K_DISPATCH) {
            if (p->w) memcpy(blk_w(b, Tm, k), p->w, sizeof(float) * T * k);
            for (int t = 0; t < T; t++) {
                int to = 0;
                for (int j = 0; j < k; j++) to |= h->idx[t * k + j] / L == d;
                char *row = (char *)blk_rows(b, Tm, k) + t * (size_t)g->cfg.max_token_bytes; // a token's bytes, then its scales
                if (to) memcpy(row, (const char *)p->x + t * p->tb, (size_t)p->tb);
                if (to && p->sb) memcpy(row + p->tb, p->xs + t * p->sb, (size_t)p->sb);
            }
        } else if (kind == K_COMBINE) {
            for (int t = 0; t < h->ntok[d]; t++)
                for (int j = 0; j < k; j++) {
                    int at = h->slot[(d * (long)Tm + t) * k + j];
                    if (at < 0) continue;
                    blk_has(b)[t * k + j] = 1;
                    memcpy(blk_out(b, Tm, k) + ((size_t)t * k + j) * hidden, p->x + (size_t)at * hidden, 2 * hidden);
                    if (p->bwd) blk_cw(b, Tm, k, Hm)[t * k + j] = p->w[at];
                }
        }
    }
    (void)me;
}

static void net_unpack(void *arg) {
    part *p = arg;
    handle *h = p->h;
    group *g = h->g;
    int me = g->rank, R = g->nranks, L = g->local, k = h->topk, T = h->tokens, kind = p->kind;
    int ll = g->cfg.algorithm == MB_NCCL_EP_ALGO_LOW_LATENCY;
    size_t Tm = g->cfg.max_dispatch_tokens_per_rank, hidden = (size_t)p->rows, Hm = g->cfg.max_token_bytes / 2;
    char *recv = (char *)h->recv;
#define BLK(s) (recv + (size_t)(s) * h->blk)
#define NTOK(s) (((xhdr *)BLK(s))->tokens)
    if (heard(g, recv, h->blk, kind, p->seq, p->bwd)) {
        gpu_failed(g->dev);
        free(p);
        return;
    }
    if (kind == K_UPDATE) { // this rank's counts per local expert over every rank's routing
        long total = 0;
        for (int l = 0; l < L; l++) {
            int n = 0;
            for (int s = 0; s < R; s++)
                for (int i = 0; i < NTOK(s) * k; i++) n += blk_idx(BLK(s))[i] == me * L + l;
            if (p->counters) p->counters[l] = n;
            total += n;
        }
        if (p->total) *p->total = (int32_t)total;
    } else if (kind == K_DISPATCH) { // rows and weights into this rank's slots, by local expert, then (source, token)
        int slot = 0;
        for (int s = 0; s < R; s++) h->ntok[s] = NTOK(s);
        for (int l = 0; l < L; l++) {
            int first = slot;
            for (int s = 0; s < R; s++) {
                const int32_t *idx = blk_idx(BLK(s));
                for (int t = 0; t < NTOK(s); t++)
                    for (int j = 0; j < k; j++) {
                        if (idx[t * k + j] != me * L + l) continue;
                        long at = ll ? (long)l * R * Tm + (slot - first) : slot;
                        const char *row = (const char *)blk_rows(BLK(s), Tm, k) + t * (size_t)g->cfg.max_token_bytes;
                        memcpy((char *)p->out + at * p->tb, row, (size_t)p->tb);
                        if (p->sb) memcpy(p->outs + at * p->sb, row + p->tb, (size_t)p->sb);
                        if (p->outw) p->outw[at] = blk_w(BLK(s), Tm, k)[t * k + j];
                        h->slot[(s * (long)Tm + t) * k + j] = (int)at;
                        slot++;
                    }
            }
            if (ll && p->counters) p->counters[l] = slot - first;
        }
        h->rows = slot;
    } else if (kind == K_COMBINE) { // this rank's tokens: their slots' outputs from every rank
        float *acc = malloc(sizeof(float) * hidden), *sum = malloc(sizeof(float) * hidden);
        for (int t = 0; t < T; t++) {
            memset(acc, 0, sizeof(float) * hidden);
            for (int d = 0; d < R; d++) {
                memset(sum, 0, sizeof(float) * hidden);
                int any = 0;
                for (int j = 0; j < k; j++) {
                    if (!blk_has(BLK(d))[t * k + j]) continue;
                    const uint16_t *y = blk_out(BLK(d), Tm, k) + ((size_t)t * k + j) * hidden;
                    float wt = ll ? p->w[t * k + j] : 1;
                    for (size_t c = 0; c < hidden; c++) sum[c] += wt * bf(y[c]);
                    any = 1;
                }
                for (size_t c = 0; any && c < hidden; c++) acc[c] += ll ? sum[c] : bf(tobf(sum[c])); // HT: the rank's pre-reduction in bf16
            }
            for (size_t c = 0; c < hidden; c++) p->out[(size_t)t * hidden + c] = tobf(acc[c]);
            for (int j = 0; p->bwd && j < k; j++) { // the (t, j) slot's weight, from the rank that holds it
                p->outw[t * k + j] = 0;
                for (int d = 0; d < R; d++)
                    if (blk_has(BLK(d))[t * k + j]) p->outw[t * k + j] += blk_cw(BLK(d), Tm, k, Hm)[t * k + j];
            }
        }
        free(acc);
        free(sum);
    }
#undef BLK
#undef NTOK
    free(p);
}

// net_queue issues p's call: pack, the exchange, unpack, on stream.
static ncclResult_t net_queue(part *p, void *stream) {
    handle *h = p->h;
    group *g = h->g;
    enqueue_fn q = (enqueue_fn)fakecuda_sym("fakecuda_enqueue");
    p->seq = ++g->calls;
    if (!q || q(stream, net_pack, p)) {
        free(p);
        return bad(invalidUsage, "the stream refused the call (a capture?)");
    }
    ncclResult_t r = xchg(g, h->send, h->recv, h->blk, stream);
    if (q(stream, net_unpack, p)) return bad(invalidUsage, "the stream refused the call (a capture?)"); // p stays with the pack queued before
    return r;
}
