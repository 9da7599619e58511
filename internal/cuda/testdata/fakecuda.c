// A fake libcuda for the binding tests: the entry points moebench uses, with
// "device" memory in host RAM, a clock that advances per event record, and one
// kernel, "add", that adds a float to n floats — so that launch parameters,
// copies and error names are checked end to end without a GPU.
#include <stdlib.h>
#include <string.h>
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
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { if (!HANDLE_OK(d)) return 101; *c = (void *)(0x1000 + (long)d); return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { return HANDLE_OK(d) ? 0 : 101; }
CUresult cuCtxSetCurrent(void *c) { return c ? 0 : 201; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuCtxEnablePeerAccess(void *c, unsigned flags) { return 0; }
CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) { *least = 0; *greatest = -5; return 0; }
CUresult cuStreamCreateWithPriority(void **s, unsigned flags, int prio) {
    if (flags != 1 || prio > 0 || prio < -5) return 1; // non-blocking, within the range
    *s = malloc(1); return 0;
}
CUresult cuStreamDestroy_v2(void *s) { free(s); return 0; }
CUresult cuStreamSynchronize(void *s) { return 0; }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned f) { return 0; }
CUresult cuEventCreate(void **e, unsigned flags) { *e = malloc(sizeof(double)); return 0; }
CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
CUresult cuEventRecord(void *e, void *s) { fake_clock += 0.5; *(double *)e = fake_clock; return 0; }
CUresult cuEventSynchronize(void *e) { return 0; }
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) { *ms = (float)(*(double *)b - *(double *)a); return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { void *m = malloc(n); *p = (CUdeviceptr)m; return m ? 0 : 2; }
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)p); return 0; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = (size_t)1 << 30; *t = (size_t)2 << 30; return 0; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) { memcpy((void *)d, s, n); return 0; }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) { memcpy(d, (void *)s, n); return 0; }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) { memcpy((void *)d, (void *)s, n); return 0; }
CUresult cuMemcpyPeerAsync(CUdeviceptr d, void *dc, CUdeviceptr s, void *sc, size_t n, void *st) {
    if (dc == sc) return 1; // a peer copy between one context is a test bug
    memcpy((void *)d, (void *)s, n); return 0;
}
// The CUDA 13 batch copy: checks the attributes moebench passes (one set,
// stream-ordered sources, device hints, the prefer-overlap flag).
typedef struct { int type; int id; } mc_loc;
typedef struct { int srcAccessOrder; mc_loc srcLocHint, dstLocHint; unsigned flags; } mc_attrs;
CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, mc_attrs *a, size_t *idx, size_t nattrs, void *st) {
    if (sizeof(mc_attrs) != 24 || nattrs != 1 || idx[0] != 0 || a->srcAccessOrder != 1 || a->srcLocHint.type != 1 ||
        a->dstLocHint.type != 1 || a->flags != 1 || st == 0) return 1;
    if (getenv("FAKECUDA_REFUSE_BATCH")) return 1; /* CUDA_ERROR_INVALID_VALUE, as a driver might */
    for (size_t i = 0; i < count; i++) memcpy((void *)d[i], (void *)s[i], n[i]);
    return 0;
}
CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, void *st) {
    for (size_t i = 0; i < n; i++) ((unsigned short *)d)[i] = v;
    return 0;
}
CUresult cuModuleLoadData(void **m, const void *img) {
    if (memcmp(img, "\x7f" "ELF", 4) != 0) return 200; // CUDA_ERROR_INVALID_IMAGE
    *m = (void *)0x3000; return 0;
}
CUresult cuModuleUnload(void *m) { return 0; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
    if (strcmp(name, "add") != 0) return 500; // CUDA_ERROR_NOT_FOUND
    *f = (void *)0x4000; return 0;
}
CUresult cuFuncSetAttribute(void *f, int attr, int v) { return attr == 8 && v == 200 << 10 ? 0 : 1; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void *st, void **params, void **extra) {
    if (f != (void *)0x4000 || extra != 0) return 1;
    float *x = (float *)*(CUdeviceptr *)params[0];
    int n = *(int *)params[1];
    float a = *(float *)params[2];
    for (int i = 0; i < n; i++) x[i] += a;
    x[n] = (float)(gx * 100 + gy * 10 + gz + bx * 1000 + by + bz + smem / 1024); // the geometry, for the test
    return 0;
}
CUresult cuGetErrorName(CUresult r, const char **s) {
    switch (r) {
    case 1: *s = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 200: *s = "CUDA_ERROR_INVALID_IMAGE"; return 0;
    case 500: *s = "CUDA_ERROR_NOT_FOUND"; return 0;
    }
    return 1;
}
