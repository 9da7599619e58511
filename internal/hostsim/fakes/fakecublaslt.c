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
//
// FP8 (CUDA_R_8F_E4M3 A and B, cublasLt.h's contract): A_SCALE_POINTER and
// B_SCALE_POINTER (void *, device pointers to fp32 multipliers) must be set;
// only the TN form (TRANSA = T, TRANSB = N) is supported, as on the real
// library's Hopper/Ada FP8 kernels, with a bf16 or fp32 C = D and beta 0.
// A_SCALE_MODE / B_SCALE_MODE (int32_t, attributes of 12.8+; refused by an
// older fake) take SCALAR_32F (0), VEC128_32F (4) or BLK128x128_32F (5);
// the last two need version 12.9 (the fake .so.12 is 12.0: refused), and
// the pairs are those of the Hopper table: VEC128·VEC128, BLK·VEC128,
// VEC128·BLK (BLK·BLK and a scalar beside a block mode are refused). Scale
// layouts: VEC128 a[(k/128)·outer + o] (outer-contiguous), BLK128x128
// a[(o/128)·ld + k/128] with ld = ceil(K/128) rounded up to 4. With a
// VEC128 or BLK128x128 mode, as the cuBLAS documentation's "Scaling
// factors layouts" (§3.1.4.5.1,
// https://docs.nvidia.com/cuda/cublas/#scaling-factors-layouts) requires,
// cuBLAS's M and N (D's rows and columns) must be multiples of 4 — the
// heuristic and cublasLtMatmul refuse others with
// CUBLAS_STATUS_INVALID_VALUE (7), the status the real cuBLASLt 13.1 gave
// on an H200 for N = 130 — and the scale pointers must be 16-byte
// aligned (cublasLtMatmul: 7). Any FP8 product needs the "Tensor Core
// Usage" conditions (https://docs.nvidia.com/cuda/cublas/#tensor-core-usage):
// lda, ldb, and M and ldc in bytes, multiples of 16 (for TN these include
// k); the heuristic offers no algorithm otherwise (CUBLAS_STATUS_NOT_SUPPORTED,
// 15). Arithmetic
// (moebench's kernels.FP8GEMM emulates it bit for bit): products of e4m3
// values are exact in fp32; per-tensor: D = fl(fl(sA·sB)·Σ) with Σ the
// fp32 sum in k order; block: for each 128-long k block p = its fp32 sum in
// k order, acc = fl(acc + fl(fl(sA·sB)·p)), blocks in k order.
#define _GNU_SOURCE // dladdr
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off") // each fp32 operation rounds as written: no FMA (the Go emulation's order)
#endif
#define MB_ABI_DECLARE // moebench's prototypes: a definition here that differs does not compile
#include "abi.h"
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <math.h>
#include "fakedriver.h"

typedef struct { int transa, transb; const float *sa, *sb; int modeA, modeB; } desc_t;
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
    desc_t *x = d;
    if (attr == 17 || attr == 18) { // A_SCALE_POINTER, B_SCALE_POINTER: void *
        if (n != sizeof(void *)) return 7;
        memcpy(attr == 17 ? &x->sa : &x->sb, buf, sizeof(void *));
        return 0;
    }
    if (n != 4) return 7;
    if (attr == 3) x->transa = *(const int *)buf;
    else if (attr == 4) x->transb = *(const int *)buf;
    else if ((attr == 31 || attr == 32) && major() * 10000 >= 120800) (attr == 31 ? &x->modeA : &x->modeB)[0] = *(const int *)buf;
    else return 7;
    return 0;
}
int cublasLtMatrixLayoutCreate(void **l, int type, uint64_t rows, uint64_t cols, int64_t ld) {
    if ((type != 14 && type != 0 && type != 28) || ld < (int64_t)rows) return 7; // CUDA_R_16BF, CUDA_R_32F or CUDA_R_8F_E4M3, column-major
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
// fp8ok says whether the descriptor and layouts form an FP8 product the
// library supports (0), or the status it refuses it with.
static int fp8ok(const desc_t *d, const layout_t *la, const layout_t *lb, const layout_t *ld) {
    if ((la->type == 28) != (lb->type == 28)) return 15; // e4m3 beside bf16/fp32: CUBLAS_STATUS_NOT_SUPPORTED
    if (la->type != 28) return d->modeA || d->modeB ? 15 : 0; // a scale mode without fp8 operands
    if (d->transa != 1 || d->transb != 0 || ld->type == 28) return 15; // TN only, bf16/fp32 D
    uint64_t cs = ld->type == 0 ? 4 : 2; // the tensor-core conditions: 16-byte leading dimensions and rows
    if (la->ld % 16 || lb->ld % 16 || (la->rows % 16) || (ld->rows * cs) % 16 || ((uint64_t)ld->ld * cs) % 16) return 15;
    int a = d->modeA, b = d->modeB;
    if ((a == 4 || a == 5 || b == 4 || b == 5) && major() * 10000 < 120900) return 15;
    if (a == 0 && b == 0) return 0;
    if ((a == 4 && b == 4) || (a == 5 && b == 4) || (a == 4 && b == 5)) return 0;
    return 15;
}
// blockdims says whether a block-scaled product's shape is one the real
// library takes (0): M and N multiples of 4 (see the top), else 7.
static int blockdims(const desc_t *d, const layout_t *ld) {
    int block = d->modeA == 4 || d->modeA == 5 || d->modeB == 4 || d->modeB == 5;
    return block && (ld->rows % 4 != 0 || ld->cols % 4 != 0) ? 7 : 0;
}
int cublasLtMatmulAlgoGetHeuristic(void *h, void *op, void *A, void *B, void *C, void *D, void *pref, int req, mb_lt_heuristic *res, int *got) {
    if (h == 0 || req < 1) return 7;
    if (fp8ok(op, A, B, D)) { *got = 0; return 15; }
    if (blockdims(op, D)) { *got = 0; return 7; }
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
// e4m3 (OCP E4M3FN) decoded, exact
static float pow2(int x) { uint32_t u = (uint32_t)(x + 127) << 23; float f; memcpy(&f, &u, 4); return f; } // normal range only
static float e4m3(uint8_t c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    float v = e == 0 ? (float)m * pow2(-9) : (e == 15 && m == 7 ? NAN : (float)(8 + m) * pow2(e - 10));
    return s ? -v : v;
}
static float bf(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t tobf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (uint16_t)(u >> 16); }
// element (i, j) of op(X) for a column-major X of its layout's type
static float at(const void *x, const layout_t *l, int trans, uint64_t i, uint64_t j) {
    uint64_t o = trans ? j + i * l->ld : i + j * l->ld;
    if (l->type == 28) return e4m3(((const uint8_t *)x)[o]);
    return l->type == 0 ? ((const float *)x)[o] : bf(((const uint16_t *)x)[o]);
}
// the multiplier of element (o, q) of an operand of k extent K and outer
// extent O under scale mode m (cublasLt.h's layouts, see the top)
static float scale(const float *s, int m, uint64_t o, uint64_t q, uint64_t O, uint64_t K) {
    if (m == 4) return s[(q / 128) * O + o];
    if (m == 5) return s[(o / 128) * (((K + 127) / 128 + 3) / 4 * 4) + q / 128];
    return s[0];
}
// fakecuda's fakecuda_enqueue (the driver loaded from $MOEBENCH_LIBCUDA):
// the GEMM runs in its stream's order, as cuBLASLt's kernels do; without
// the fake driver it runs at once.
typedef struct { desc_t d; layout_t a, b, c; const void *A, *B; void *D; float beta; double ms; } gemm_t;
static float fp8sum(const gemm_t *g, uint64_t i, uint64_t j, uint64_t M, uint64_t N, uint64_t K) {
    const desc_t *d = &g->d;
    if (d->modeA == 0 && d->modeB == 0) {
        float s = 0;
        for (uint64_t q = 0; q < K; q++) s += at(g->A, &g->a, 1, i, q) * at(g->B, &g->b, 0, q, j);
        return (d->sa[0] * d->sb[0]) * s;
    }
    float acc = 0;
    for (uint64_t q0 = 0; q0 < K; q0 += 128) {
        float p = 0;
        for (uint64_t q = q0; q < K && q < q0 + 128; q++) p += at(g->A, &g->a, 1, i, q) * at(g->B, &g->b, 0, q, j);
        float s = scale(d->sa, d->modeA, i, q0, M, K) * scale(d->sb, d->modeB, j, q0, N, K);
        acc += s * p;
    }
    return acc;
}
typedef void (*advance_fn)(double ms);
static void gemm(void *p) {
    gemm_t *g = p;
    const desc_t *d = &g->d; const layout_t *la = &g->a, *lb = &g->b, *ld = &g->c;
    uint64_t M = d->transa ? la->cols : la->rows, K = d->transa ? la->rows : la->cols;
    uint64_t N = d->transb ? lb->rows : lb->cols;
    for (uint64_t j = 0; j < N; j++)
        for (uint64_t i = 0; i < M; i++) {
            float s = 0;
            if (la->type == 28) s = fp8sum(g, i, j, M, N, K);
            else for (uint64_t q = 0; q < K; q++) s += at(g->A, la, d->transa, i, q) * at(g->B, lb, d->transb, q, j);
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
    if (fp8ok(d, la, lb, ld)) return 15;
    if (la->type == 28 && (b != 0.f || !d->sa || !d->sb)) return 7; // fp8: beta 0, both scale pointers set
    if (blockdims(d, ld)) return 7;
    if ((d->modeA == 4 || d->modeA == 5) && (uintptr_t)d->sa % 16) return 7; // block scales: 16-byte aligned
    if ((d->modeB == 4 || d->modeB == 5) && (uintptr_t)d->sb % 16) return 7;
    if (getenv("FAKECUBLASLT_SKIP")) return 0; // a benchmark of the host's issue cost alone: checked, not computed
    gemm_t *g = malloc(sizeof *g); // the descriptors may be destroyed once the call returns
    *g = (gemm_t){*d, *la, *lb, *ld, A, B, D, b, algoMs[ai]};
    enqueue2_fn q = (enqueue2_fn)fakecuda_sym("fakecuda_enqueue2");
    if (!q) gemm(g), free(g);
    else if (q(st, gemm, g, free)) { free(g); return 7; } // a refusal (e.g. in a capture that cannot take it)
    return 0;
}
