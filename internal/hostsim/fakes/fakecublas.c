// A fake libcublas for the binding tests: cublasGemmGroupedBatchedEx with
// cuBLAS's column-major semantics on bf16 data in host memory ("device"
// pointer arrays are host arrays here, as in the fake libcuda), checking the
// types and per-group arguments the binding passes. Like cuBLAS, setting
// the stream drops the workspace set before; unlike it, a grouped call
// without a workspace of the caller's own fails (moebench gives each stream
// its own, so that calls on several streams never share one).
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static void *bound_stream, *bound_ws;
static size_t bound_ws_size;
int cublasCreate_v2(void **h) { *h = (void *)0x20; return 0; }
int cublasDestroy_v2(void *h) { return h == (void *)0x20 ? 0 : 7; }
int cublasGetVersion_v2(void *h, int *v) { *v = 130000; return 0; }
int cublasSetStream_v2(void *h, void *s) { bound_stream = s; bound_ws = 0; return s ? 0 : 7; }
int cublasSetWorkspace_v2(void *h, void *ws, size_t n) { bound_ws = ws; bound_ws_size = n; return ((uintptr_t)ws % 256) ? 7 : 0; }

static float bf(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t tobf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (uint16_t)(u >> 16); }
// element (i, j) of op(X) for a column-major X with leading dimension ld
static float at(const uint16_t *x, int ld, int trans, int i, int j) { return trans ? bf(x[j + i * ld]) : bf(x[i + j * ld]); }

int cublasGemmGroupedBatchedEx(void *h, const int *ta, const int *tb, const int *m, const int *n, const int *k, const void *alpha,
                               const void *const *A, int at_, const int *lda, const void *const *B, int bt, const int *ldb,
                               const void *beta, void *const *C, int ct, const int *ldc, int groups, const int *size, int compute) {
    if (h != (void *)0x20 || bound_stream == 0 || bound_ws == 0 || bound_ws_size < 4096 || at_ != 14 || bt != 14 || ct != 14 || compute != 68) return 7;
    const float *al = alpha, *be = beta;
    int idx = 0;
    for (int g = 0; g < groups; g++) {
        int rowsA = ta[g] ? k[g] : m[g], rowsB = tb[g] ? n[g] : k[g];
        if (lda[g] < rowsA || ldb[g] < rowsB || ldc[g] < m[g] || al[g] != 1.f || be[g] != 0.f) return 7;
        for (int b = 0; b < size[g]; b++, idx++)
            for (int j = 0; j < n[g]; j++)
                for (int i = 0; i < m[g]; i++) {
                    float s = 0;
                    for (int p = 0; p < k[g]; p++) s += at(A[idx], lda[g], ta[g], i, p) * at(B[idx], ldb[g], tb[g], p, j);
                    ((uint16_t *)C[idx])[i + j * ldc[g]] = tobf(s);
                }
    }
    return 0;
}
