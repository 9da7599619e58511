// A fake libcublasLt for the binding tests: it checks the constants and
// attribute sizes the binding passes and computes D = alpha·op(A)·op(B) +
// beta·C with cuBLAS's column-major semantics (cublasLt.h: C is read only
// when beta is not zero; C and D may be one matrix when their layouts are
// the same) on data in host memory, in its stream's order on the fake
// driver, so that the binding's row-major to column-major mapping, its
// transposes and its accumulation are tested without a GPU. Operand and
// output types are those cuBLASLt supports for CUBLAS_COMPUTE_32F with an
// fp32 scale (its documentation's table of cublasLtMatmul's type
// combinations): bf16 A and B with a bf16 or fp32 C, fp32 A and B with an
// fp32 C. alpha must be 1, beta 0 or 1: the only scales moebench passes.
#define _GNU_SOURCE // dladdr
#define MB_ABI_DECLARE // moebench's prototypes: a definition here that differs does not compile
#include "abi.h"
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "fakedriver.h"

typedef struct { int transa, transb; } desc_t;
typedef struct { int type; uint64_t rows, cols; int64_t ld; } layout_t;

// Its CUDA major is its file's (libcublasLt.so.12: 12, else 13), and like
// the real library it needs a driver of that major or later: with an older
// fake driver, cublasLtCreate fails (CUBLAS_STATUS_NOT_INITIALIZED).
static int major(void) {
    Dl_info i;
    if (dladdr((void *)major, &i) && i.dli_fname && strstr(i.dli_fname, ".so.12")) return 12;
    return 13;
}
int cublasLtCreate(void **h) {
    int (*ver)(int *) = (int (*)(int *))fakecuda_sym("cuDriverGetVersion");
    int v = 0;
    if (ver && (ver(&v) || v / 1000 < major())) return 1;
    *h = calloc(1, 16); // an address, as the real one's: Go keeps handles as unsafe.Pointer, and its stack copier refuses a value like 0x10
    return *h ? 0 : 3;
}
int cublasLtDestroy(void *h) { free(h); return 0; }
size_t cublasLtGetVersion(void) { return major() * 10000; }
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
// The heuristic offers up to three algorithms: algo i's data is 64 bytes
// i·64, i·64+1, …; its workspace is (i+1) KiB; its run costs algoMs[i]
// on the fake driver's event clock, so that a caller timing the
// algorithms finds the heuristic's second the fastest.
#define NALGOS 3
static const double algoMs[NALGOS] = {3, 1, 2};
int cublasLtMatmulAlgoGetHeuristic(void *h, void *op, void *A, void *B, void *C, void *D, void *pref, int req, mb_lt_heuristic *res, int *got) {
    if (h == 0 || req < 1) return 7;
    int n = req < NALGOS ? req : NALGOS;
    memset(res, 0, sizeof *res * n);
    for (int i = 0; i < n; i++) {
        unsigned char *r = (unsigned char *)&res[i].algo;
        for (int j = 0; j < 64; j++) r[j] = (unsigned char)(i * 64 + j);
        res[i].workspaceSize = 1024 * (i + 1);
    }
    *got = n; return 0;
}
// which is the index of the heuristic's algo a, or −1
static int which(const mb_lt_algo *a) {
    const unsigned char *r = (const unsigned char *)a;
    int i = r[0] / 64;
    if (i >= NALGOS) return -1;
    for (int j = 0; j < 64; j++) if (r[j] != (unsigned char)(i * 64 + j)) return -1;
    return i;
}
static float bf(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t tobf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (uint16_t)(u >> 16); }
// element (i, j) of op(X) for a column-major X of its layout's type
static float at(const void *x, const layout_t *l, int trans, uint64_t i, uint64_t j) {
    uint64_t o = trans ? j + i * l->ld : i + j * l->ld;
    return l->type == 0 ? ((const float *)x)[o] : bf(((const uint16_t *)x)[o]);
}
// fakecuda's fakecuda_enqueue (the driver loaded from $MOEBENCH_LIBCUDA):
// the GEMM runs in its stream's order, as cuBLASLt's kernels do; without
// the fake driver it runs at once.
typedef struct { desc_t d; layout_t a, b, c; const void *A, *B; void *D; float beta; double ms; } gemm_t;
typedef void (*advance_fn)(double ms);
static void gemm(void *p) {
    gemm_t *g = p;
    const desc_t *d = &g->d; const layout_t *la = &g->a, *lb = &g->b, *ld = &g->c;
    uint64_t M = d->transa ? la->cols : la->rows, K = d->transa ? la->rows : la->cols;
    uint64_t N = d->transb ? lb->rows : lb->cols;
    for (uint64_t j = 0; j < N; j++)
        for (uint64_t i = 0; i < M; i++) {
            float s = 0;
            for (uint64_t q = 0; q < K; q++) s += at(g->A, la, d->transa, i, q) * at(g->B, lb, d->transb, q, j);
            if (g->beta != 0.f) s += at(g->D, ld, 0, i, j); // C (= D), read only when beta ≠ 0
            if (ld->type == 0) ((float *)g->D)[i + j * ld->ld] = s;
            else ((uint16_t *)g->D)[i + j * ld->ld] = tobf(s);
        }
    advance_fn adv = (advance_fn)fakecuda_sym("fakecuda_advance");
    if (adv) adv(g->ms);
}
int cublasLtMatmul(void *h, void *desc, const void *alpha, const void *A, void *Ad, const void *B, void *Bd, const void *beta,
                   const void *C, void *Cd, void *D, void *Dd, const mb_lt_algo *algo, void *ws, size_t wss, void *st) {
    const desc_t *d = desc; const layout_t *la = Ad, *lb = Bd, *lc = Cd, *ld = Dd;
    int ai = which(algo); // one of the heuristic's algos, passed back, with at least its workspace
    float b = *(const float *)beta;
    if (ai < 0 || wss < (size_t)1024 * (ai + 1) || *(const float *)alpha != 1.f || (b != 0.f && b != 1.f) || C != D || lc != ld) return 7;
    uint64_t M = d->transa ? la->cols : la->rows, K = d->transa ? la->rows : la->cols;
    uint64_t KB = d->transb ? lb->cols : lb->rows, N = d->transb ? lb->rows : lb->cols;
    if (K != KB || ld->rows != M || ld->cols != N) return 7; // shapes must agree
    if (la->type != lb->type || (la->type == 0 && ld->type != 0)) return 7; // bf16 operands, or fp32 ones with an fp32 C
    if (getenv("FAKECUBLASLT_SKIP")) return 0; // a benchmark of the host's issue cost alone: checked, not computed
    gemm_t *g = malloc(sizeof *g); // the descriptors may be destroyed once the call returns
    *g = (gemm_t){*d, *la, *lb, *ld, A, B, D, b, algoMs[ai]};
    enqueue2_fn q = (enqueue2_fn)fakecuda_sym("fakecuda_enqueue2");
    if (!q) gemm(g), free(g);
    else if (q(st, gemm, g, free)) { free(g); return 7; } // a refusal (e.g. in a capture that cannot take it)
    return 0;
}
