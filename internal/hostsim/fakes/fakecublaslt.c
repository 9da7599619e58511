// A fake libcublasLt for the binding tests: it checks the constants and
// attribute sizes the binding passes and computes D = op(A)·op(B) with
// cuBLAS's column-major semantics on bf16 data in host memory, in its
// stream's order on the fake driver, so that the binding's row-major to
// column-major mapping is tested without a GPU.
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "fakedriver.h"

typedef struct { int transa, transb; } desc_t;
typedef struct { int type; uint64_t rows, cols; int64_t ld; } layout_t;

int cublasLtCreate(void **h) { *h = (void *)0x10; return 0; }
int cublasLtDestroy(void *h) { return 0; }
size_t cublasLtGetVersion(void) { return 130000; }
int cublasLtMatmulDescCreate(void **d, int compute, int scale) {
    if (compute != 68 || scale != 0) return 7; // CUBLAS_COMPUTE_32F, CUDA_R_32F
    *d = calloc(1, sizeof(desc_t)); return 0;
}
int cublasLtMatmulDescDestroy(void *d) { free(d); return 0; }
int cublasLtMatmulDescSetAttribute(void *d, int attr, const void *buf, size_t n) {
    if (n != 4) return 7;
    if (attr == 3) ((desc_t *)d)->transa = *(const int *)buf;
    else if (attr == 4) ((desc_t *)d)->transb = *(const int *)buf;
    else return 7;
    return 0;
}
int cublasLtMatrixLayoutCreate(void **l, int type, uint64_t rows, uint64_t cols, int64_t ld) {
    if ((type != 14 && type != 0) || ld < (int64_t)rows) return 7; // CUDA_R_16BF or CUDA_R_32F, column-major
    layout_t *x = malloc(sizeof *x); x->type = type; x->rows = rows; x->cols = cols; x->ld = ld; *l = x; return 0;
}
int cublasLtMatrixLayoutDestroy(void *l) { free(l); return 0; }
int cublasLtMatmulPreferenceCreate(void **p) { *p = calloc(1, 8); return 0; }
int cublasLtMatmulPreferenceDestroy(void *p) { free(p); return 0; }
int cublasLtMatmulPreferenceSetAttribute(void *p, int attr, const void *buf, size_t n) {
    if (attr >= 5 && attr <= 8) { // MIN_ALIGNMENT_{A,B,C,D}_BYTES, uint32, a power of two
        uint32_t a; if (n != 4) return 7; memcpy(&a, buf, 4);
        return a == 0 || (a & (a - 1)) != 0 ? 7 : 0;
    }
    if (attr != 1 || n != 8) return 7; // MAX_WORKSPACE_BYTES, uint64
    memcpy(p, buf, 8); return 0;
}
int cublasLtMatmulAlgoGetHeuristic(void *h, void *op, void *A, void *B, void *C, void *D, void *pref, int req, void *res, int *got) {
    if (h == 0 || req < 1) return 7;
    unsigned char *r = res;
    for (int i = 0; i < 64; i++) r[i] = (unsigned char)i; // the algo
    size_t ws = 1024; memcpy(r + 64, &ws, sizeof ws);     // workspaceSize
    *got = 1; return 0;
}
static float bf(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t tobf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (uint16_t)(u >> 16); }
// element (i, j) of op(X) for a column-major X
static float at(const uint16_t *x, const layout_t *l, int trans, uint64_t i, uint64_t j) {
    return trans ? bf(x[j + i * l->ld]) : bf(x[i + j * l->ld]);
}
// fakecuda's fakecuda_enqueue (the driver loaded from $MOEBENCH_LIBCUDA):
// the GEMM runs in its stream's order, as cuBLASLt's kernels do; without
// the fake driver it runs at once.
typedef struct { desc_t d; layout_t a, b, c; const void *A, *B; void *D; } gemm_t;
static void gemm(void *p) {
    gemm_t *g = p;
    const desc_t *d = &g->d; const layout_t *la = &g->a, *lb = &g->b, *ld = &g->c;
    uint64_t M = d->transa ? la->cols : la->rows, K = d->transa ? la->rows : la->cols;
    uint64_t N = d->transb ? lb->rows : lb->cols;
    for (uint64_t j = 0; j < N; j++)
        for (uint64_t i = 0; i < M; i++) {
            float s = 0;
            for (uint64_t q = 0; q < K; q++) s += at(g->A, la, d->transa, i, q) * at(g->B, lb, d->transb, q, j);
            if (ld->type == 0) ((float *)g->D)[i + j * ld->ld] = s;
            else ((uint16_t *)g->D)[i + j * ld->ld] = tobf(s);
        }
    free(g);
}
int cublasLtMatmul(void *h, void *desc, const void *alpha, const void *A, void *Ad, const void *B, void *Bd, const void *beta,
                   const void *C, void *Cd, void *D, void *Dd, const void *algo, void *ws, size_t wss, void *st) {
    const desc_t *d = desc; const layout_t *la = Ad, *lb = Bd, *lc = Cd, *ld = Dd;
    const unsigned char *a = algo;
    for (int i = 0; i < 64; i++) if (a[i] != i) return 7; // the heuristic's algo, passed back
    if (wss != 1024 || *(const float *)alpha != 1.f || *(const float *)beta != 0.f || C != D || lc != ld) return 7;
    uint64_t M = d->transa ? la->cols : la->rows, K = d->transa ? la->rows : la->cols;
    uint64_t KB = d->transb ? lb->cols : lb->rows, N = d->transb ? lb->rows : lb->cols;
    if (K != KB || ld->rows != M || ld->cols != N) return 7; // shapes must agree
    if (la->type != 14 || lb->type != 14) return 7;          // bf16 operands
    gemm_t *g = malloc(sizeof *g); // the descriptors may be destroyed once the call returns
    *g = (gemm_t){*d, *la, *lb, *ld, A, B, D};
    enqueue_fn q = (enqueue_fn)fakecuda_sym("fakecuda_enqueue");
    if (!q) gemm(g);
    else if (q(st, gemm, g)) { free(g); return 7; }
    return 0;
}
