package cuda

/*
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
typedef int (*lt_pp)(void **);
typedef int (*lt_p)(void *);
typedef int (*lt_desc)(void **, int, int);
typedef int (*lt_setattr)(void *, int, const void *, size_t);
typedef int (*lt_layout)(void **, int, uint64_t, uint64_t, int64_t);
typedef int (*lt_heur)(void *, void *, void *, void *, void *, void *, void *, int, void *, int *);
typedef int (*lt_matmul)(void *, void *, const void *, const void *, void *, const void *, void *, const void *,
                         const void *, void *, void *, void *, const void *, void *, size_t, void *);
typedef size_t (*lt_ver)(void);
static int lt_call_pp(void *f, void **p) { return ((lt_pp)f)(p); }
static int lt_call_p(void *f, void *p) { return ((lt_p)f)(p); }
static int lt_call_desc(void *f, void **d, int c, int s) { return ((lt_desc)f)(d, c, s); }
static int lt_call_setattr(void *f, void *o, int a, const void *b, size_t n) { return ((lt_setattr)f)(o, a, b, n); }
static int lt_call_layout(void *f, void **l, int t, uint64_t r, uint64_t c, int64_t ld) { return ((lt_layout)f)(l, t, r, c, ld); }
static int lt_call_heur(void *f, void *h, void *op, void *a, void *b, void *c, void *d, void *pref, int n, void *res, int *got) {
	return ((lt_heur)f)(h, op, a, b, c, d, pref, n, res, got);
}
// device addresses arrive as integers and become pointers here
static int lt_call_matmul(void *f, void *h, void *desc, const void *alpha, unsigned long long A, void *Ad, unsigned long long B,
                          void *Bd, const void *beta, unsigned long long C, void *Cd, unsigned long long D, void *Dd, const void *algo,
                          unsigned long long ws, size_t wss, void *st) {
	return ((lt_matmul)f)(h, desc, alpha, (const void *)A, Ad, (const void *)B, Bd, beta, (const void *)C, Cd, (void *)D, Dd,
	                      algo, (void *)ws, wss, st);
}
static size_t lt_call_ver(void *f) { return ((lt_ver)f)(); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// cuBLASLt constants (cudaDataType, cublasComputeType, attribute ids).
const (
	dataR32F                = 0
	dataR16BF               = 14
	compute32F              = 68
	descTransA              = 3
	descTransB              = 4
	opN, opT                = 0, 1
	prefMaxWorkspaceBytes   = 1
	prefMinAlignA           = 5  // then B, C, D: 6, 7, 8
	heuristicResultBytes    = 96 // cublasLtMatmulHeuristicResult_t
	heuristicWorkspaceField = 64 // offset of its size_t workspaceSize, after the 64-byte algo
)

// CuBLASLt is cuBLASLt opened with dlopen. OpenCuBLASLt only loads the
// library; Init creates the handle (on the current context).
//
// Proven here against a fake library (argument order, the row-major to
// column-major mapping) and, where Debian's libcublasLt 11 is installed,
// the descriptor attributes; not yet run on a GPU.
type CuBLASLt struct {
	Path    string
	Version int
	fn      map[string]unsafe.Pointer
	handle  unsafe.Pointer
	scalars *[2]C.float // alpha = 1, beta = 0 in C memory, made by Init
}

// OpenCuBLASLt loads libcublasLt (MOEBENCH_CUBLASLT overrides).
func OpenCuBLASLt() (*CuBLASLt, error) {
	lib, err := openLibrary("MOEBENCH_CUBLASLT", "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", "libcublasLt.so")
	if err != nil {
		return nil, err
	}
	b := &CuBLASLt{Path: lib.path, fn: map[string]unsafe.Pointer{}}
	for _, s := range []string{"cublasLtCreate", "cublasLtDestroy", "cublasLtGetVersion", "cublasLtMatmulDescCreate",
		"cublasLtMatmulDescDestroy", "cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy",
		"cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy", "cublasLtMatmulPreferenceSetAttribute",
		"cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmul"} {
		if b.fn[s], err = lib.sym(s); err != nil {
			return nil, err
		}
	}
	b.Version = int(C.lt_call_ver(b.fn["cublasLtGetVersion"]))
	return b, nil
}

func ltErr(call string, st C.int) error {
	if st == 0 {
		return nil
	}
	return fmt.Errorf("%s: cuBLAS status %d", call, int(st))
}

// Init creates the cuBLASLt handle on the current context.
func (b *CuBLASLt) Init() error {
	if b.scalars == nil {
		b.scalars = (*[2]C.float)(C.malloc(8)) // lives as long as the process: one per library opened
		b.scalars[0], b.scalars[1] = 1, 0
	}
	return ltErr("cublasLtCreate", C.lt_call_pp(b.fn["cublasLtCreate"], &b.handle))
}

// GEMM is a planned product c[m,n] = a[m,k] · w[n,k]ᵀ in row-major storage
// (w in a linear layer's [out,in] layout) of bf16 operands with fp32
// accumulation, c stored as bf16 or, for F32Out, fp32 (the router's logits) —
// the same product as kernels.MatMulNT. In cuBLAS's column-major terms it is
// Dᵀ[n,m] = op_T(w stored k×n) · op_N(a stored k×m): a "TN" GEMM.
type GEMM struct {
	M, N, K       int
	F32Out        bool
	WorkspaceSize int64
	desc, la      unsafe.Pointer // op descriptor; layout of w (cuBLAS's A)
	lb, lc        unsafe.Pointer // layout of a (cuBLAS's B); of c (C and D)
	heuristic     unsafe.Pointer // C memory: one cublasLtMatmulHeuristicResult_t
}

// Align is the byte alignment the operands of a GEMM are guaranteed to have
// (powers of two; 0 means cuBLASLt's default, 256). The heuristic only offers
// algorithms that work at those alignments.
type Align struct{ A, W, C uint32 }

// AlignOf is the alignment of address p, at most 256.
func AlignOf(p DevicePtr) uint32 {
	a := uint32(256)
	for a > 1 && uint64(p)%uint64(a) != 0 {
		a /= 2
	}
	return a
}

// PlanGEMM describes the product and asks cuBLASLt's heuristic for an
// algorithm within maxWorkspace bytes that works at the alignments al.
func (b *CuBLASLt) PlanGEMM(m, n, k int, f32Out bool, al Align, maxWorkspace int64) (*GEMM, error) {
	if m < 1 || n < 1 || k < 1 {
		return nil, fmt.Errorf("PlanGEMM: m=%d n=%d k=%d must all be ≥ 1", m, n, k)
	}
	g := &GEMM{M: m, N: n, K: k, F32Out: f32Out}
	ok := false
	defer func() {
		if !ok {
			b.Free(g)
		}
	}()
	if err := b.describe(g); err != nil {
		return nil, err
	}
	pref, err := b.preference(maxWorkspace, al)
	if err != nil {
		return nil, err
	}
	defer b.freePreference(pref)
	g.heuristic = C.calloc(1, heuristicResultBytes)
	var got C.int
	if err := ltErr("cublasLtMatmulAlgoGetHeuristic", C.lt_call_heur(b.fn["cublasLtMatmulAlgoGetHeuristic"], b.handle, g.desc,
		g.la, g.lb, g.lc, g.lc, pref, 1, g.heuristic, &got)); err != nil {
		return nil, err
	}
	if got < 1 {
		return nil, fmt.Errorf("cublasLtMatmulAlgoGetHeuristic: no algorithm for m=%d n=%d k=%d within %d bytes of workspace", m, n, k, maxWorkspace)
	}
	g.WorkspaceSize = int64(*(*C.size_t)(unsafe.Add(g.heuristic, heuristicWorkspaceField)))
	ok = true
	return g, nil
}

// describe creates the operation descriptor (fp32 compute and scale,
// TRANSA = T, TRANSB = N) and the column-major layouts of w, a (bf16) and c
// (bf16, or fp32 for F32Out).
func (b *CuBLASLt) describe(g *GEMM) error {
	m, n, k := g.M, g.N, g.K
	if err := ltErr("cublasLtMatmulDescCreate", C.lt_call_desc(b.fn["cublasLtMatmulDescCreate"], &g.desc, compute32F, dataR32F)); err != nil {
		return err
	}
	for _, a := range [][2]int32{{descTransA, opT}, {descTransB, opN}} {
		v := C.int(a[1])
		if err := ltErr(fmt.Sprintf("cublasLtMatmulDescSetAttribute(%d)", a[0]),
			C.lt_call_setattr(b.fn["cublasLtMatmulDescSetAttribute"], g.desc, C.int(a[0]), unsafe.Pointer(&v), C.size_t(unsafe.Sizeof(v)))); err != nil {
			return err
		}
	}
	cType := dataR16BF
	if g.F32Out {
		cType = dataR32F
	}
	layouts := []struct {
		dst                 *unsafe.Pointer
		typ, rows, cols, ld int
		what                string
	}{{&g.la, dataR16BF, k, n, k, "w"}, {&g.lb, dataR16BF, k, m, k, "a"}, {&g.lc, cType, n, m, n, "c"}}
	for _, l := range layouts {
		if err := ltErr("cublasLtMatrixLayoutCreate("+l.what+")", C.lt_call_layout(b.fn["cublasLtMatrixLayoutCreate"], l.dst, C.int(l.typ),
			C.uint64_t(l.rows), C.uint64_t(l.cols), C.int64_t(l.ld))); err != nil {
			return err
		}
	}
	return nil
}

// preference asks for algorithms within maxWorkspace bytes that work at the
// alignments al; the caller destroys it.
func (b *CuBLASLt) preference(maxWorkspace int64, al Align) (unsafe.Pointer, error) {
	var pref unsafe.Pointer
	if err := ltErr("cublasLtMatmulPreferenceCreate", C.lt_call_pp(b.fn["cublasLtMatmulPreferenceCreate"], &pref)); err != nil {
		return nil, err
	}
	ws := C.uint64_t(maxWorkspace)
	if err := ltErr("cublasLtMatmulPreferenceSetAttribute", C.lt_call_setattr(b.fn["cublasLtMatmulPreferenceSetAttribute"], pref,
		prefMaxWorkspaceBytes, unsafe.Pointer(&ws), C.size_t(unsafe.Sizeof(ws)))); err != nil {
		b.freePreference(pref)
		return nil, err
	}
	// cuBLAS's A is w, B is a, C and D are c
	for i, v := range []uint32{al.W, al.A, al.C, al.C} {
		if v == 0 {
			continue
		}
		x := C.uint32_t(v)
		if err := ltErr(fmt.Sprintf("cublasLtMatmulPreferenceSetAttribute(alignment %d)", prefMinAlignA+i), C.lt_call_setattr(
			b.fn["cublasLtMatmulPreferenceSetAttribute"], pref, C.int(prefMinAlignA+i), unsafe.Pointer(&x), C.size_t(unsafe.Sizeof(x)))); err != nil {
			b.freePreference(pref)
			return nil, err
		}
	}
	return pref, nil
}

// freePreference destroys a preference.
func (b *CuBLASLt) freePreference(p unsafe.Pointer) {
	C.lt_call_p(b.fn["cublasLtMatmulPreferenceDestroy"], p)
}

// setAttr sets an attribute of a descriptor from raw bytes (tests use it
// to show that a wrong size is refused).
func (b *CuBLASLt) setAttr(obj unsafe.Pointer, attr int, v []byte) error {
	buf := C.CBytes(v)
	defer C.free(buf)
	return ltErr("cublasLtMatmulDescSetAttribute", C.lt_call_setattr(b.fn["cublasLtMatmulDescSetAttribute"], obj, C.int(attr), buf, C.size_t(len(v))))
}

// Run computes c = a · wᵀ on s; workspace must hold g.WorkspaceSize bytes.
func (b *CuBLASLt) Run(g *GEMM, c, a, w, workspace DevicePtr, s Stream) error {
	alpha, beta := &b.scalars[0], &b.scalars[1]
	ptr := func(p DevicePtr) C.ulonglong { return C.ulonglong(p) }
	return ltErr(fmt.Sprintf("cublasLtMatmul(m=%d n=%d k=%d)", g.M, g.N, g.K), C.lt_call_matmul(b.fn["cublasLtMatmul"], b.handle, g.desc,
		unsafe.Pointer(alpha), ptr(w), g.la, ptr(a), g.lb, unsafe.Pointer(beta), ptr(c), g.lc, ptr(c), g.lc,
		g.heuristic, ptr(workspace), C.size_t(g.WorkspaceSize), unsafe.Pointer(s)))
}

// Free releases a plan's descriptors.
func (b *CuBLASLt) Free(g *GEMM) {
	for _, l := range []unsafe.Pointer{g.la, g.lb, g.lc} {
		if l != nil {
			C.lt_call_p(b.fn["cublasLtMatrixLayoutDestroy"], l)
		}
	}
	if g.desc != nil {
		C.lt_call_p(b.fn["cublasLtMatmulDescDestroy"], g.desc)
	}
	if g.heuristic != nil {
		C.free(g.heuristic)
	}
	*g = GEMM{M: g.M, N: g.N, K: g.K, F32Out: g.F32Out}
}
