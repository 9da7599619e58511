// A fake libcublas for the binding tests: cublasGemmGroupedBatchedEx with
// cuBLAS's column-major semantics on bf16 data in host memory ("device"
// pointer arrays are host arrays here, as in the fake libcuda), checking the
// types and per-group arguments the binding passes. Like cuBLAS, setting
// the stream drops the workspace set before; unlike it, a grouped call
// without a workspace of the caller's own fails (moebench gives each stream
// its own, so that calls on several streams never share one).
#define MB_ABI_DECLARE // moebench's prototypes: a definition here that differs does not compile
#include "abi.h"
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include "fakedriver.h"

// A handle holds its stream and workspace (each GPU's thread has its own
// handle, as with cuBLAS, whose handles are not shared between threads).
#define HANDLE_MAGIC 0x6362ul
typedef struct { unsigned long magic; void *stream, *ws; size_t ws_size; } handle_t;
static handle_t *handle(void *h) { return h && ((handle_t *)h)->magic == HANDLE_MAGIC ? h : 0; }
int cublasCreate_v2(void **h) {
    handle_t *b = calloc(1, sizeof *b);
    b->magic = HANDLE_MAGIC;
    *h = b;
    return 0;
}
int cublasDestroy_v2(void *h) {
    handle_t *b = handle(h);
    if (!b) return 7;
    b->magic = 0; // kept: a use after destroy is refused, not a crash
    return 0;
}
int cublasGetVersion_v2(void *h, int *v) { *v = 130000; return 0; }
int cublasSetStream_v2(void *h, void *s) {
    handle_t *b = handle(h);
    if (!b) return 7;
    b->stream = s, b->ws = 0;
    return s ? 0 : 7;
}
int cublasSetWorkspace_v2(void *h, void *ws, size_t n) {
    handle_t *b = handle(h);
    if (!b) return 7;
    b->ws = ws, b->ws_size = n;
    return ((uintptr_t)ws % 256) ? 7 : 0;
}

static float bf(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t tobf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (uint16_t)(u >> 16); }
// element (i, j) of op(X) for a column-major X with leading dimension ld
static float at(const uint16_t *x, int ld, int trans, int i, int j) { return trans ? bf(x[j + i * ld]) : bf(x[i + j * ld]); }

// fakecuda's fakecuda_enqueue (see fakecublaslt.c): the GEMMs run in the
// bound stream's order; the per-group host arrays are copied at the call,
// the device arrays of operand addresses read when the GEMMs run.
typedef struct { int groups; const void *const *A, *const *B; void *const *C; int v[]; } grouped_t; // v: ta tb m n k lda ldb ldc size, each [groups]
static void grouped(void *p) {
    grouped_t *g = p;
    int G = g->groups, *ta = g->v, *tb = ta + G, *m = tb + G, *n = m + G, *k = n + G, *lda = k + G, *ldb = lda + G, *ldc = ldb + G, *size = ldc + G;
    int idx = 0;
    for (int q = 0; q < G; q++)
        for (int b = 0; b < size[q]; b++, idx++)
            for (int j = 0; j < n[q]; j++)
                for (int i = 0; i < m[q]; i++) {
                    float s = 0;
                    for (int r = 0; r < k[q]; r++) s += at(g->A[idx], lda[q], ta[q], i, r) * at(g->B[idx], ldb[q], tb[q], r, j);
                    ((uint16_t *)g->C[idx])[i + j * ldc[q]] = tobf(s);
                }
}
int cublasGemmGroupedBatchedEx(void *h, const int *ta, const int *tb, const int *m, const int *n, const int *k, const void *alpha,
                               const void *const *A, int at_, const int *lda, const void *const *B, int bt, const int *ldb,
                               const void *beta, void *const *C, int ct, const int *ldc, int groups, const int *size, int compute) {
    handle_t *b = handle(h);
    if (!b || b->stream == 0 || b->ws == 0 || b->ws_size < 4096 || at_ != 14 || bt != 14 || ct != 14 || compute != 68) return 7;
    const float *al = alpha, *be = beta;
    for (int q = 0; q < groups; q++) {
        int rowsA = ta[q] ? k[q] : m[q], rowsB = tb[q] ? n[q] : k[q];
        if (lda[q] < rowsA || ldb[q] < rowsB || ldc[q] < m[q] || al[q] != 1.f || be[q] != 0.f) return 7;
    }
    grouped_t *g = malloc(sizeof *g + 9 * sizeof(int) * groups);
    g->groups = groups, g->A = A, g->B = B, g->C = C;
    const int *src[9] = {ta, tb, m, n, k, lda, ldb, ldc, size};
    for (int i = 0; i < 9; i++) memcpy(g->v + i * groups, src[i], sizeof(int) * groups);
    enqueue2_fn q = (enqueue2_fn)fakecuda_sym("fakecuda_enqueue2");
    if (!q) grouped(g), free(g);
    else if (q(b->stream, grouped, g, free)) { free(g); return 7; } // a refusal (e.g. in a capture that cannot take it)
    return 0;
}
