// A fake libcuda for the binding tests: the entry points moebench uses, with
// "device" memory in host RAM, a clock that advances per event record, and one
// kernel, "add", that adds a float to n floats — so that launch parameters,
// copies and error names are checked end to end without a GPU. A module
// whose image is a shared object for this CPU rather than a cubin holds
// kernels compiled for the host (internal/hostsim/mbhost.h): their launches
// run them, on the CPU, as the stream is queued.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;

static double fake_clock;

CUresult cuInit(unsigned flags) { return flags == 0 ? 0 : 1; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 2; return 0; }
// CUdevice handles are 100 + ordinal, so that a binding passing ordinals
// where handles belong is caught (CUDA_ERROR_INVALID_DEVICE, 101).
#define HANDLE_OK(d) ((d) == 100 || (d) == 101)
CUresult cuDeviceGet(int *d, int ord) { *d = 100 + ord; return ord < 2 ? 0 : 101; }
CUresult cuDeviceGetName(char *s, int n, int d) {
    if (!HANDLE_OK(d)) return 101;
    strncpy(s, d == 100 ? "Fake GPU 0" : "Fake GPU 1", n); return 0;
}
CUresult cuDeviceGetPCIBusId(char *s, int n, int d) {
    if (!HANDLE_OK(d)) return 101;
    strncpy(s, d == 100 ? "0000:1B:00.0" : "0000:2C:00.0", n); return 0;
}
CUresult cuDeviceGetAttribute(int *v, int attr, int d) { if (!HANDLE_OK(d)) return 101; *v = attr * 100 + d - 100; return 0; }
CUresult cuDeviceTotalMem_v2(size_t *n, int d) { if (!HANDLE_OK(d)) return 101; *n = (size_t)80 << 30; return 0; }
CUresult cuDeviceCanAccessPeer(int *v, int a, int b) { if (!HANDLE_OK(a) || !HANDLE_OK(b)) return 101; *v = a != b; return 0; }
// Contexts are 0x1000 + handle. The fake tracks the current context and
// which context owns each stream, event and allocation, and refuses what a
// driver refuses across contexts (or stricter): a stream or allocation made
// with no current context, an event recorded on another context's stream,
// elapsed time between contexts, a copy on a stream of a context that owns
// neither side, a peer copy whose contexts do not own its pointers, and a
// launch on a stream that is not the current context's.
#define CTX(d) ((void *)(0x1000L + (d)))
static void *cur;
static int peer[2][2];
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { if (!HANDLE_OK(d)) return 101; *c = CTX(d); return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { return HANDLE_OK(d) ? 0 : 101; }
CUresult cuCtxSetCurrent(void *c) { if (!c) return 201; cur = c; return 0; }
CUresult cuCtxSynchronize(void) { return cur ? 0 : 201; }
CUresult cuCtxEnablePeerAccess(void *c, unsigned flags) {
    if (!cur || c == cur || flags) return 1;
    int a = (long)cur - 0x1000 - 100, b = (long)c - 0x1000 - 100;
    if (peer[a][b]) return 704; // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
    peer[a][b] = 1; return 0;
}
CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) { *least = 0; *greatest = -5; return 0; }
typedef struct { void *ctx; } fstream;
typedef struct { double t; void *ctx; } fevent;
static void *sctx(void *s) { return s ? ((fstream *)s)->ctx : cur; }
CUresult cuStreamCreateWithPriority(void **s, unsigned flags, int prio) {
    if (flags != 1 || prio > 0 || prio < -5) return 1; // non-blocking, within the range
    if (!cur) return 201;
    fstream *f = malloc(sizeof *f); f->ctx = cur; *s = f; return 0;
}
CUresult cuStreamDestroy_v2(void *s) { free(s); return 0; }
CUresult cuStreamSynchronize(void *s) { return 0; }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned f) { return 0; } // across contexts too, as CUDA allows
CUresult cuEventCreate(void **e, unsigned flags) {
    if (!cur) return 201;
    fevent *f = malloc(sizeof *f); f->t = 0; f->ctx = cur; *e = f; return 0;
}
CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
CUresult cuEventRecord(void *e, void *s) {
    if (((fevent *)e)->ctx != sctx(s)) return 400; // CUDA_ERROR_INVALID_HANDLE
    fake_clock += 0.5; ((fevent *)e)->t = fake_clock; return 0;
}
CUresult cuEventSynchronize(void *e) { return 0; }
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) {
    if (((fevent *)a)->ctx != ((fevent *)b)->ctx) return 400;
    *ms = (float)(((fevent *)b)->t - ((fevent *)a)->t); return 0;
}
// allocations: a table of (base, size, context). Each is mapped on its own
// with an inaccessible page right after its last 256-byte granule, so that a
// kernel (on the host simulation) or a copy that runs past the end of a
// buffer faults at once instead of reading or overwriting a neighbour.
#define MAXA 4096
#define PAGE 4096
static struct { CUdeviceptr p; size_t n; void *ctx; void *map; size_t maplen; } allocs[MAXA];
static void *owner(CUdeviceptr p) {
    for (int i = 0; i < MAXA; i++)
        if (allocs[i].p && p >= allocs[i].p && p < allocs[i].p + allocs[i].n + (allocs[i].n == 0)) return allocs[i].ctx;
    return 0;
}
// fakecuda_owner is owner for testdata/fakenccl.c.
void *fakecuda_owner(CUdeviceptr p) { return owner(p); }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (!cur) return 201;
    for (int i = 0; i < MAXA; i++) {
        if (allocs[i].p) continue;
        size_t r = ((n ? n : 1) + 255) / 256 * 256; // 256-byte aligned, as cuMemAlloc's
        size_t body = (r + PAGE - 1) / PAGE * PAGE;
        char *m = mmap(0, body + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return 2;
        if (mprotect(m + body, PAGE, PROT_NONE)) { munmap(m, body + PAGE); return 2; }
        allocs[i].p = (CUdeviceptr)(m + body - r);
        allocs[i].n = n, allocs[i].ctx = cur, allocs[i].map = m, allocs[i].maplen = body + PAGE;
        *p = allocs[i].p;
        return 0;
    }
    return 2;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    for (int i = 0; i < MAXA; i++)
        if (allocs[i].p == p) { allocs[i].p = 0; munmap(allocs[i].map, allocs[i].maplen); return 0; }
    return 1;
}
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = (size_t)1 << 30; *t = (size_t)2 << 30; return 0; }
#define ON_STREAM(p, st) if (owner(p) != sctx(st)) return 1
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) { ON_STREAM(d, st); memcpy((void *)d, s, n); return 0; }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) { ON_STREAM(s, st); memcpy(d, (void *)s, n); return 0; }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) {
    ON_STREAM(d, st); ON_STREAM(s, st); memcpy((void *)d, (void *)s, n); return 0;
}
CUresult cuMemcpyPeerAsync(CUdeviceptr d, void *dc, CUdeviceptr s, void *sc, size_t n, void *st) {
    if (dc == sc || owner(d) != dc || owner(s) != sc || (sctx(st) != dc && sctx(st) != sc)) return 1;
    memcpy((void *)d, (void *)s, n); return 0;
}
// The CUDA 13 batch copy: checks the attributes moebench passes (one set,
// stream-ordered sources, device hints naming the GPUs that own the
// pointers, the prefer-overlap flag).
typedef struct { int type; int id; } mc_loc;
typedef struct { int srcAccessOrder; mc_loc srcLocHint, dstLocHint; unsigned flags; } mc_attrs;
CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, mc_attrs *a, size_t *idx, size_t nattrs, void *st) {
    if (sizeof(mc_attrs) != 24 || nattrs != 1 || idx[0] != 0 || a->srcAccessOrder != 1 || a->srcLocHint.type != 1 ||
        a->dstLocHint.type != 1 || a->flags != 1 || st == 0) return 1;
    if (getenv("FAKECUDA_REFUSE_BATCH")) return 1; /* CUDA_ERROR_INVALID_VALUE, as a driver might */
    for (size_t i = 0; i < count; i++)
        if (owner(s[i]) != CTX(100 + a->srcLocHint.id) || owner(d[i]) != CTX(100 + a->dstLocHint.id)) return 1;
    for (size_t i = 0; i < count; i++) memcpy((void *)d[i], (void *)s[i], n[i]);
    return 0;
}
CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, void *st) {
    ON_STREAM(d, st);
    for (size_t i = 0; i < n; i++) ((unsigned short *)d)[i] = v;
    return 0;
}
// Host modules: the image (a 64-bit ELF shared object, whose size is where
// its section headers end) is written to a file and dlopened; kernel NAME is
// its function mbhost_launch_NAME. Any other ELF image (a cubin: machine 190,
// EM_CUDA) is the one-kernel module of "add".
#define HOSTMAGIC 0x6d62686fu
typedef int (*hostlaunch)(unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void **);
typedef struct hostobj { unsigned magic; void *dl; hostlaunch fn; struct hostobj *next; } hostobj; // a module (dl) or a kernel (fn)
static int elf_machine(const unsigned char *img) { return img[18] | img[19] << 8; }
CUresult cuModuleLoadData(void **m, const void *img) {
    if (!cur) return 201;
    const unsigned char *e = img;
    if (memcmp(e, "\x7f" "ELF", 4) != 0) return 200; // CUDA_ERROR_INVALID_IMAGE
    if (e[4] != 2 || elf_machine(e) == 190) { *m = (void *)0x3000; return 0; } // not a 64-bit host ELF
    uint64_t shoff; uint16_t shentsize, shnum;
    memcpy(&shoff, e + 0x28, 8); memcpy(&shentsize, e + 0x3a, 2); memcpy(&shnum, e + 0x3c, 2);
    char path[] = "/tmp/fakecuda-module-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 2;
    size_t n = shoff + (size_t)shentsize * shnum;
    int ok = write(fd, e, n) == (ssize_t)n;
    close(fd);
    void *dl = ok ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : 0;
    unlink(path);
    if (!dl) return 200;
    hostobj *h = calloc(1, sizeof *h); h->magic = HOSTMAGIC; h->dl = dl;
    *m = h; return 0;
}
static hostobj *host(void *p) { return p != (void *)0x3000 && p != (void *)0x4000 && p && ((hostobj *)p)->magic == HOSTMAGIC ? p : 0; }
CUresult cuModuleUnload(void *m) {
    hostobj *h = host(m);
    while (h) { // the module, then the kernels looked up in it
        hostobj *next = h->next;
        if (h->dl) dlclose(h->dl);
        h->magic = 0; free(h); h = next;
    }
    return 0;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
    hostobj *h = host(m);
    if (h) {
        char sym[256];
        snprintf(sym, sizeof sym, "mbhost_launch_%s", name);
        hostlaunch fn = (hostlaunch)dlsym(h->dl, sym);
        if (!fn) return 500;
        hostobj *k = calloc(1, sizeof *k); k->magic = HOSTMAGIC; k->fn = fn; k->next = h->next; h->next = k;
        *f = k; return 0;
    }
    if (strcmp(name, "add") != 0) return 500; // CUDA_ERROR_NOT_FOUND
    *f = (void *)0x4000; return 0;
}
CUresult cuFuncSetAttribute(void *f, int attr, int v) { return attr == 8 && v == 200 << 10 ? 0 : 1; }
// run launches f: a host module's kernel runs on the CPU; otherwise f is
// the cubin's one kernel, "add": x[i] += a for i < n, then x[n] = the launch
// geometry (grid·(100,10,1) + block·(1000,1,1) + shared/1024), plus 10⁶ for
// a cooperative launch and 2·10⁶·cluster x for a clustered one, for the test.
static CUresult run(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                    unsigned smem, void *st, void **params, int coop, unsigned cx) {
    hostobj *h = host(f);
    if (h && h->fn && sctx(st) == cur) return h->fn(gx, gy, gz, bx, by, bz, params) == 0 ? 0 : 1;
    if (f != (void *)0x4000 || sctx(st) != cur) return 1;
    ON_STREAM(*(CUdeviceptr *)params[0], st);
    float *x = (float *)*(CUdeviceptr *)params[0];
    int n = *(int *)params[1];
    float a = *(float *)params[2];
    for (int i = 0; i < n; i++) x[i] += a;
    x[n] = (float)(gx * 100 + gy * 10 + gz + bx * 1000 + by + bz + smem / 1024) + 1e6f * coop + 2e6f * cx;
    return 0;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void *st, void **params, void **extra) {
    if (extra != 0) return 1;
    return run(f, gx, gy, gz, bx, by, bz, smem, st, params, 0, 0);
}
CUresult cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                   unsigned smem, void *st, void **params) {
    return run(f, gx, gy, gz, bx, by, bz, smem, st, params, 1, 0);
}
// cuLaunchKernelEx with CUDA's layouts: CUlaunchAttribute is an enum id,
// padding to 8 bytes and a 64-byte union; attributes 2 (cooperative) and 4
// (cluster dimension, y and z 1 here) are understood, others refused.
typedef struct { int id; char pad[4]; union { char pad[64]; int cooperative; struct { unsigned x, y, z; } cluster; } v; } fattr;
typedef struct { unsigned gx, gy, gz, bx, by, bz, smem; void *stream; fattr *attrs; unsigned nattrs; } fconfig;
CUresult cuLaunchKernelEx(const fconfig *c, void *f, void **params, void **extra) {
    if (sizeof(fattr) != 72 || sizeof(fconfig) != 56 || extra != 0) return 1;
    int coop = 0;
    unsigned cx = 0;
    for (unsigned i = 0; i < c->nattrs; i++) {
        if (c->attrs[i].id == 2) coop = c->attrs[i].v.cooperative;
        else if (c->attrs[i].id == 4 && c->attrs[i].v.cluster.y == 1 && c->attrs[i].v.cluster.z == 1) cx = c->attrs[i].v.cluster.x;
        else return 1;
    }
    return run(f, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->smem, c->stream, params, coop, cx);
}
CUresult cuGetErrorName(CUresult r, const char **s) {
    switch (r) {
    case 1: *s = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; return 0;
    case 400: *s = "CUDA_ERROR_INVALID_HANDLE"; return 0;
    case 704: *s = "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"; return 0;
    case 200: *s = "CUDA_ERROR_INVALID_IMAGE"; return 0;
    case 500: *s = "CUDA_ERROR_NOT_FOUND"; return 0;
    }
    return 1;
}
