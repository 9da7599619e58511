package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/abi
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include "abi.h"
// device addresses arrive as integers and become pointers here
static int lt_call_matmul(void *f, void *h, void *desc, const void *alpha, unsigned long long A, void *Ad, unsigned long long B,
                          void *Bd, const void *beta, unsigned long long C, void *Cd, unsigned long long D, void *Dd,
                          const mb_lt_algo *algo, unsigned long long ws, size_t wss, void *st) {
	return mbcall_cublasLtMatmul(f, h, desc, alpha, (const void *)A, Ad, (const void *)B, Bd, beta, (const void *)C, Cd,
	                             (void *)D, Dd, algo, (void *)ws, wss, st);
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// cuBLASLt constants (cudaDataType, cublasComputeType, attribute ids).
const (
	dataR32F              = 0
	dataR16BF             = 14
	compute32F            = 68
	descTransA            = 3
	descTransB            = 4
	opN, opT              = 0, 1
	prefMaxWorkspaceBytes = 1
	prefMinAlignA         = 5 // then B, C, D: 6, 7, 8

	// FP8 (cublasLt.h; CUDA_R_8F_E4M3 and the scale pointers since CUDA 11.8,
	// the scale modes since 12.8, VEC128/BLK128x128 usable since 12.9)
	dataR8FE4M3       = 28
	descAScalePointer = 17 // void *: device pointer to A's scale(s)
	descBScalePointer = 18
	descAScaleMode    = 31 // int32_t cublasLtMatmulMatrixScale_t
	descBScaleMode    = 32
	scaleScalar32F    = 0 // CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
	scaleVec128F32    = 4 // CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
	scaleBlk128F32    = 5 // CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
)

// FP8Scale is how an FP8 GEMM's operands are scaled (MatMul.FP8).
type FP8Scale int

const (
	FP8None   FP8Scale = iota // bf16/fp32 operands
	FP8Tensor                 // e4m3 operands, one fp32 multiplier each (SCALAR_32F)
	// FP8Block: e4m3 operands; a (cuBLAS's B) one fp32 multiplier per 1×128
	// block along k (VEC128_32F), w (cuBLAS's A) one per 128×128 block
	// (BLK128x128_32F). Layouts: see FP8ScaleLayout.
	FP8Block
)

// String names the scaling as the record does.
func (s FP8Scale) String() string {
	return [...]string{"none", "per-tensor", "block"}[s]
}

// BlockScalingVersion is the first cuBLASLt (cublasLtGetVersion) with the
// VEC128_32F and BLK128x128_32F scale modes (CUDA 12.9, Hopper).
const BlockScalingVersion = 120900

// FP8TensorVersion is the first cuBLASLt with e4m3 operands: cuBLAS 11.11,
// CUDA 11.8's (cublasLtGetVersion is major·10000 + minor·100 + patch).
const FP8TensorVersion = 111100

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
	scalars *[3]C.float // alpha = 1, beta = 0, beta = 1 in C memory, made by Init
}

// OpenCuBLASLt loads libcublasLt (MOEBENCH_CUBLASLT overrides), of the
// CUDA driver's major first (see majors).
func OpenCuBLASLt() (*CuBLASLt, error) {
	groups := majors("libcublasLt", map[int][]string{13: {"libcublasLt.so.13"}, 12: {"libcublasLt.so.12"}, 11: {"libcublasLt.so.11"}})
	lib, err := openPreferred("MOEBENCH_CUBLASLT", groups)
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
	b.Version = int(C.mbcall_cublasLtGetVersion(b.fn["cublasLtGetVersion"]))
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
		b.scalars = (*[3]C.float)(C.malloc(12)) // lives as long as the process: one per library opened
		b.scalars[0], b.scalars[1], b.scalars[2] = 1, 0, 1
	}
	if err := ltErr("cublasLtCreate", C.mbcall_cublasLtCreate(b.fn["cublasLtCreate"], &b.handle)); err != nil {
		return fmt.Errorf("%s (cuBLASLt %d): %w (a library newer than the CUDA driver fails so)", b.Path, b.Version, err)
	}
	return nil
}

// MatMul is a product in row-major storage with fp32 accumulation:
// c[m,n] = op(a) · op(b), plus c itself when Add (cuBLAS's beta = 1: the
// wgrad GEMM accumulating into fp32 main_grad). op(a) is a [m,k], or with
// TransA aᵀ of a stored [k,m]; op(b) is b [k,n], or with TransB bᵀ of b
// stored [n,k] (a linear layer's [out,in] weight). a and b are bf16, or
// fp32 for F32In (the fp32 router's backward); c is bf16, or fp32 for
// F32Out. Combinations cuBLASLt's CUBLAS_COMPUTE_32F supports: bf16
// operands with a bf16 or fp32 c, fp32 operands with an fp32 c; Add needs
// an fp32 c here (main_grad).
type MatMul struct {
	M, N, K        int
	TransA, TransB bool
	F32In, F32Out  bool
	Add            bool
	// FP8: a and w are e4m3 with fp32 multipliers (RunFP8 passes them);
	// only the forward's TN form (TransB, not TransA: cuBLASLt's FP8
	// kernels need op(A) = T and op(B) = N) with a bf16 or fp32 c, no Add;
	// k a multiple of 16, n·sizeof(c) of 16 bytes, and at FP8Block m and n
	// multiples of 4 (see Plan).
	FP8 FP8Scale
}

// GEMM is a planned MatMul. In cuBLAS's column-major terms the row-major
// c[m,n] is cᵀ[n,m] = op(b)ᵀ · op(a)ᵀ: cuBLAS's A is our b, its B our a.
// The forward's product c = a · wᵀ (MatMul{TransB: true}, the same as
// kernels.MatMulNT) is a "TN" GEMM: Dᵀ[n,m] = op_T(w stored k×n) · op_N(a
// stored k×m).
type GEMM struct {
	MatMul
	WorkspaceSize int64          // of the chosen algorithm
	desc, la      unsafe.Pointer // op descriptor; layout of b (cuBLAS's A)
	lb, lc        unsafe.Pointer // layout of a (cuBLAS's B); of c (C and D)
	// the heuristic's algorithms, best first (C memory), and the one Run uses
	algos  *C.mb_lt_heuristic
	nalgos int
	chosen int
}

// MaxAlgorithms is how many algorithms PlanGEMM asks the heuristic for.
const MaxAlgorithms = 8

// Algorithms is how many algorithms the heuristic offered for g (best
// first, by its own estimate); Choose picks the one Run uses.
func (g *GEMM) Algorithms() int { return g.nalgos }

// Choose makes Run use algorithm i (0: the heuristic's first).
func (g *GEMM) Choose(i int) {
	if i < 0 || i >= g.nalgos {
		panic(fmt.Sprintf("GEMM.Choose(%d) of %d algorithms", i, g.nalgos))
	}
	g.chosen = i
	g.WorkspaceSize = int64(g.algo(i).workspaceSize)
}

// Chosen is the algorithm Run uses.
func (g *GEMM) Chosen() int { return g.chosen }

// Algorithm is algorithm i's configuration (cublasLtMatmulAlgo_t's bytes):
// the same bytes are the same kernel and tiling.
func (g *GEMM) Algorithm(i int) [64]byte { return *(*[64]byte)(unsafe.Pointer(&g.algo(i).algo)) }

func (g *GEMM) algo(i int) *C.mb_lt_heuristic {
	return (*C.mb_lt_heuristic)(unsafe.Add(unsafe.Pointer(g.algos), i*C.sizeof_mb_lt_heuristic))
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

// PlanGEMM plans the forward's c[m,n] = a[m,k] · w[n,k]ᵀ (see Plan).
func (b *CuBLASLt) PlanGEMM(m, n, k int, f32Out bool, al Align, maxWorkspace int64) (*GEMM, error) {
	return b.Plan(MatMul{M: m, N: n, K: k, TransB: true, F32Out: f32Out}, al, maxWorkspace)
}

// Plan describes the product and asks cuBLASLt's heuristic for up to
// MaxAlgorithms algorithms within maxWorkspace bytes that work at the
// alignments al (Align.A of a, W of b, C of c); Run uses the first until
// Choose picks another.
func (b *CuBLASLt) Plan(mm MatMul, al Align, maxWorkspace int64) (*GEMM, error) {
	return b.PlanScaled(mm, al, maxWorkspace, 0, 0)
}

// PlanScaled is Plan with an FP8 product's multipliers (RunFP8's aScale and
// wScale; 0: none) set on the descriptor before the heuristic is asked, as
// NVIDIA's cuBLASLt FP8 samples do (e.g. CUDALibrarySamples'
// LtBlk128x128Fp8Matmul): whether the heuristic takes block scale modes
// with no scale pointers set is not documented. RunFP8 sets them again
// for each run.
func (b *CuBLASLt) PlanScaled(mm MatMul, al Align, maxWorkspace int64, aScale, wScale DevicePtr) (*GEMM, error) {
	m, n, k := mm.M, mm.N, mm.K
	if m < 1 || n < 1 || k < 1 {
		return nil, fmt.Errorf("PlanGEMM: m=%d n=%d k=%d must all be ≥ 1", m, n, k)
	}
	if mm.F32In && !mm.F32Out || mm.Add && !mm.F32Out {
		return nil, fmt.Errorf("PlanGEMM: fp32 operands (%v) and accumulation (%v) need an fp32 output", mm.F32In, mm.Add)
	}
	if mm.FP8 != FP8None {
		if mm.F32In || mm.Add || mm.TransA || !mm.TransB || mm.FP8 > FP8Block {
			return nil, fmt.Errorf("PlanGEMM: fp8 (%v) runs the TN product c = a·wᵀ only (TransA %v TransB %v F32In %v Add %v)", mm.FP8, mm.TransA, mm.TransB, mm.F32In, mm.Add)
		}
		if mm.FP8 == FP8Block && b.Version < BlockScalingVersion {
			return nil, fmt.Errorf("PlanGEMM: fp8 block scaling needs cuBLASLt %d or later, this is %d", BlockScalingVersion, b.Version)
		}
		// cuBLAS's "Scaling factors layouts" (§3.1.4.5.1,
		// https://docs.nvidia.com/cuda/cublas/#scaling-factors-layouts):
		// with VEC128_32F / BLK128x128_32F scales, M and N must be
		// multiples of 4; cuBLAS's M is our n, its N our m. The heuristic
		// refuses others with CUBLAS_STATUS_INVALID_VALUE (seen on an H200,
		// cuBLASLt 13.1, m = 130). A caller pads m (CUDA.MatMul does).
		if mm.FP8 == FP8Block && (m%BlockScalingRows != 0 || n%BlockScalingRows != 0) {
			return nil, fmt.Errorf("PlanGEMM: fp8 block scaling needs m=%d and n=%d (cuBLAS's N and M) multiples of %d", m, n, BlockScalingRows)
		}
		// FP8 needs cuBLAS's "Tensor Core Usage" conditions
		// (https://docs.nvidia.com/cuda/cublas/#tensor-core-usage), which
		// for TN are k·1, lda·1, ldb·1 (= k), and M·sizeof(C), ldc·sizeof(C)
		// (= n·sizeof(C)) multiples of 16 bytes; the pointers' 16 bytes
		// RunFP8 checks.
		cBytes := 2
		if mm.F32Out {
			cBytes = 4
		}
		if k%16 != 0 || n*cBytes%16 != 0 {
			return nil, fmt.Errorf("PlanGEMM: fp8 needs k=%d a multiple of 16 and n=%d a multiple of %d (cuBLAS's tensor-core conditions: 16-byte rows)", k, n, 16/cBytes)
		}
	}
	return b.plan(mm, al, maxWorkspace, aScale, wScale)
}

// plan is PlanScaled past its own checks: describe, then ask the heuristic.
func (b *CuBLASLt) plan(mm MatMul, al Align, maxWorkspace int64, aScale, wScale DevicePtr) (*GEMM, error) {
	g := &GEMM{MatMul: mm}
	ok := false
	defer func() {
		if !ok {
			b.Free(g)
		}
	}()
	if err := b.describe(g); err != nil {
		return nil, err
	}
	if mm.FP8 != FP8None && (aScale != 0 || wScale != 0) {
		if err := b.setScales(g, aScale, wScale); err != nil {
			return nil, err
		}
	}
	pref, err := b.preference(maxWorkspace, al)
	if err != nil {
		return nil, err
	}
	defer b.freePreference(pref)
	g.algos = (*C.mb_lt_heuristic)(C.calloc(MaxAlgorithms, C.sizeof_mb_lt_heuristic))
	var got C.int
	if err := ltErr("cublasLtMatmulAlgoGetHeuristic", C.mbcall_cublasLtMatmulAlgoGetHeuristic(b.fn["cublasLtMatmulAlgoGetHeuristic"], b.handle, g.desc,
		g.la, g.lb, g.lc, g.lc, pref, MaxAlgorithms, g.algos, &got)); err != nil {
		return nil, fmt.Errorf("%w (%s; alignments %+v, cuBLASLt %d)", err, g.describeString(), al, b.Version)
	}
	if got < 1 {
		return nil, fmt.Errorf("cublasLtMatmulAlgoGetHeuristic: no algorithm within %d bytes of workspace (%s; alignments %+v, cuBLASLt %d)", maxWorkspace, g.describeString(), al, b.Version)
	}
	g.nalgos = int(min(got, MaxAlgorithms))
	g.Choose(0)
	ok = true
	return g, nil
}

// BlockScalingRows: with block scaling, cuBLAS's M and N (our n and m)
// must be multiples of it (see Plan).
const BlockScalingRows = 4

// describeString says, in cuBLAS's column-major terms, what describe set:
// for an error that the next GPU run can be read from.
func (g *GEMM) describeString() string {
	op := func(t bool) string {
		if t {
			return "T"
		}
		return "N"
	}
	typ := func(f32, fp8 bool) string {
		switch {
		case fp8:
			return "e4m3"
		case f32:
			return "fp32"
		}
		return "bf16"
	}
	in := typ(g.F32In, g.FP8 != FP8None)
	modeA, modeB := "scalar", "scalar"
	if g.FP8 == FP8Block {
		modeA, modeB = "BLK128x128_32F", "VEC128_32F"
	}
	bRows, aRows := g.N, g.K
	if g.TransB {
		bRows = g.K
	}
	if g.TransA {
		aRows = g.M
	}
	return fmt.Sprintf("cuBLAS M=%d N=%d K=%d, transa=%s transb=%s, A %s ld %d scale %s, B %s ld %d scale %s, C=D %s ld %d, compute 32F scale 32F",
		g.N, g.M, g.K, op(g.TransB), op(g.TransA), in, bRows, modeA, in, aRows, modeB, typ(g.F32Out, false), g.N)
}

// describe creates the operation descriptor (fp32 compute and scale; TRANSA
// for our b, TRANSB for our a) and the column-major layouts of b, a (bf16,
// or fp32 for F32In) and c (bf16, or fp32 for F32Out).
func (b *CuBLASLt) describe(g *GEMM) error {
	m, n, k := g.M, g.N, g.K
	if err := ltErr("cublasLtMatmulDescCreate", C.mbcall_cublasLtMatmulDescCreate(b.fn["cublasLtMatmulDescCreate"], &g.desc, compute32F, dataR32F)); err != nil {
		return err
	}
	op := func(t bool) int32 {
		if t {
			return opT
		}
		return opN
	}
	// b row-major [k,n] is column-major n×k (ld n), already op(b)ᵀ; b
	// row-major [n,k] (TransB) is column-major k×n (ld k), transposed. The
	// same for a with m.
	bRows, bCols := n, k
	if g.TransB {
		bRows, bCols = k, n
	}
	aRows, aCols := k, m
	if g.TransA {
		aRows, aCols = m, k
	}
	for _, a := range [][2]int32{{descTransA, op(g.TransB)}, {descTransB, op(g.TransA)}} {
		v := C.int(a[1])
		if err := ltErr(fmt.Sprintf("cublasLtMatmulDescSetAttribute(%d)", a[0]),
			C.mbcall_cublasLtMatmulDescSetAttribute(b.fn["cublasLtMatmulDescSetAttribute"], g.desc, C.int(a[0]), unsafe.Pointer(&v), C.size_t(unsafe.Sizeof(v)))); err != nil {
			return err
		}
	}
	cType, inType := dataR16BF, dataR16BF
	if g.F32Out {
		cType = dataR32F
	}
	if g.F32In {
		inType = dataR32F
	}
	if g.FP8 != FP8None {
		inType = dataR8FE4M3
		modeW, modeA := int32(scaleScalar32F), int32(scaleScalar32F)
		if g.FP8 == FP8Block {
			modeW, modeA = scaleBlk128F32, scaleVec128F32
		}
		// cuBLAS's A is w, B is a. The modes are set only when not the
		// default, so that a library before 12.8 (no such attribute) runs
		// per-tensor FP8.
		for _, a := range [][2]int32{{descAScaleMode, modeW}, {descBScaleMode, modeA}} {
			if a[1] == scaleScalar32F {
				continue
			}
			v := C.int32_t(a[1])
			if err := ltErr(fmt.Sprintf("cublasLtMatmulDescSetAttribute(scale mode %d = %d)", a[0], a[1]),
				C.mbcall_cublasLtMatmulDescSetAttribute(b.fn["cublasLtMatmulDescSetAttribute"], g.desc, C.int(a[0]), unsafe.Pointer(&v), C.size_t(unsafe.Sizeof(v)))); err != nil {
				return err
			}
		}
	}
	layouts := []struct {
		dst                 *unsafe.Pointer
		typ, rows, cols, ld int
		what                string
	}{{&g.la, inType, bRows, bCols, bRows, "b"}, {&g.lb, inType, aRows, aCols, aRows, "a"}, {&g.lc, cType, n, m, n, "c"}}
	for _, l := range layouts {
		if err := ltErr("cublasLtMatrixLayoutCreate("+l.what+")", C.mbcall_cublasLtMatrixLayoutCreate(b.fn["cublasLtMatrixLayoutCreate"], l.dst, C.int(l.typ),
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
	if err := ltErr("cublasLtMatmulPreferenceCreate", C.mbcall_cublasLtMatmulPreferenceCreate(b.fn["cublasLtMatmulPreferenceCreate"], &pref)); err != nil {
		return nil, err
	}
	ws := C.uint64_t(maxWorkspace)
	if err := ltErr("cublasLtMatmulPreferenceSetAttribute", C.mbcall_cublasLtMatmulPreferenceSetAttribute(b.fn["cublasLtMatmulPreferenceSetAttribute"], pref,
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
		if err := ltErr(fmt.Sprintf("cublasLtMatmulPreferenceSetAttribute(alignment %d)", prefMinAlignA+i), C.mbcall_cublasLtMatmulPreferenceSetAttribute(b.fn["cublasLtMatmulPreferenceSetAttribute"], pref, C.int(prefMinAlignA+i), unsafe.Pointer(&x), C.size_t(unsafe.Sizeof(x)))); err != nil {
			b.freePreference(pref)
			return nil, err
		}
	}
	return pref, nil
}

// freePreference destroys a preference.
func (b *CuBLASLt) freePreference(p unsafe.Pointer) {
	C.mbcall_cublasLtMatmulPreferenceDestroy(b.fn["cublasLtMatmulPreferenceDestroy"], p)
}

// setAttr sets an attribute of a descriptor from raw bytes (tests use it
// to show that a wrong size is refused).
func (b *CuBLASLt) setAttr(obj unsafe.Pointer, attr int, v []byte) error {
	buf := C.CBytes(v)
	defer C.free(buf)
	return ltErr("cublasLtMatmulDescSetAttribute", C.mbcall_cublasLtMatmulDescSetAttribute(b.fn["cublasLtMatmulDescSetAttribute"], obj, C.int(attr), buf, C.size_t(len(v))))
}

// Run computes c = op(a) · op(w) (+ c) on s; workspace must hold
// g.WorkspaceSize bytes. Nothing is allocated or formatted unless the call
// fails (it runs once per GEMM of every step).
func (b *CuBLASLt) Run(g *GEMM, c, a, w, workspace DevicePtr, s Stream) error {
	alpha, beta := &b.scalars[0], &b.scalars[1]
	if g.Add {
		beta = &b.scalars[2]
	}
	ptr := func(p DevicePtr) C.ulonglong { return C.ulonglong(p) }
	st := C.lt_call_matmul(b.fn["cublasLtMatmul"], b.handle, g.desc,
		unsafe.Pointer(alpha), ptr(w), g.la, ptr(a), g.lb, unsafe.Pointer(beta), ptr(c), g.lc, ptr(c), g.lc,
		&g.algo(g.chosen).algo, ptr(workspace), C.size_t(g.WorkspaceSize), unsafe.Pointer(s))
	if st == 0 {
		return nil
	}
	return ltErr(fmt.Sprintf("cublasLtMatmul(m=%d n=%d k=%d, algorithm %d of %d; %s)", g.M, g.N, g.K, g.chosen+1, g.nalgos, g.describeString()), st)
}

// RunFP8 computes c = a·wᵀ for an FP8 plan: a and w e4m3, aScale and
// wScale their fp32 multipliers (one each for FP8Tensor; FP8ScaleLayout's
// for FP8Block). The scale pointers are descriptor attributes, set here
// before each run (the descriptor is read when cublasLtMatmul enqueues).
func (b *CuBLASLt) RunFP8(g *GEMM, c, a, aScale, w, wScale, workspace DevicePtr, s Stream) error {
	if g.FP8 == FP8None {
		return fmt.Errorf("RunFP8: the plan (m=%d n=%d k=%d) is not fp8", g.M, g.N, g.K)
	}
	// block scales must start 16-byte aligned (cuBLAS, "Scaling factors
	// layouts", https://docs.nvidia.com/cuda/cublas/#scaling-factors-layouts)
	if g.FP8 == FP8Block && (aScale%16 != 0 || wScale%16 != 0) {
		return fmt.Errorf("RunFP8: block scales at %#x (a) and %#x (w) must be 16-byte aligned", uint64(aScale), uint64(wScale))
	}
	// and the operands too (https://docs.nvidia.com/cuda/cublas/#tensor-core-usage)
	if (a|w|c)%16 != 0 {
		return fmt.Errorf("RunFP8: a at %#x, w at %#x and c at %#x must be 16-byte aligned", uint64(a), uint64(w), uint64(c))
	}
	if err := b.setScales(g, aScale, wScale); err != nil {
		return err
	}
	return b.Run(g, c, a, w, workspace, s)
}

// setScales sets g's scale pointers: cuBLAS's A is w, its B a.
func (b *CuBLASLt) setScales(g *GEMM, aScale, wScale DevicePtr) error {
	for _, p := range [][2]uint64{{descAScalePointer, uint64(wScale)}, {descBScalePointer, uint64(aScale)}} {
		v := C.ulonglong(p[1]) // a device pointer, 8 bytes as void *
		if st := C.mbcall_cublasLtMatmulDescSetAttribute(b.fn["cublasLtMatmulDescSetAttribute"], g.desc, C.int(p[0]), unsafe.Pointer(&v), C.size_t(unsafe.Sizeof(v))); st != 0 {
			return ltErr(fmt.Sprintf("cublasLtMatmulDescSetAttribute(scale pointer %d)", p[0]), st)
		}
	}
	return nil
}

// FP8ScaleLayout is the number of fp32 multipliers FP8Block's operands
// take and where block (row i or n, k-block kb) of each lies: a [m,k] (cuBLAS's
// B, VEC128_32F) holds ceil(k/128)·m multipliers, m-contiguous: a[kb·m + i];
// w [n,k] (cuBLAS's A, BLK128x128_32F) holds ceil(n/128)·ldW multipliers,
// ldW = ceil(k/128) rounded up to 4: w[(i/128)·ldW + kb]. (Counts as
// NVIDIA's cuBLASLt samples size them; the orders as cuBLAS's "Scaling
// factors layouts" describe them,
// https://docs.nvidia.com/cuda/cublas/#scaling-factors-layouts: VEC128
// "N-major for B with shape N × L", BLK128x128 "K-major" with a column
// stride that is a multiple of 4 — not yet run on a GPU.)
func FP8ScaleLayout(m, n, k int) (aCount, wCount, ldW int) {
	kb := (k + 127) / 128
	ldW = (kb + 3) / 4 * 4
	return kb * m, (n + 127) / 128 * ldW, ldW
}

// Free releases a plan's descriptors.
func (b *CuBLASLt) Free(g *GEMM) {
	for _, l := range []unsafe.Pointer{g.la, g.lb, g.lc} {
		if l != nil {
			C.mbcall_cublasLtMatrixLayoutDestroy(b.fn["cublasLtMatrixLayoutDestroy"], l)
		}
	}
	if g.desc != nil {
		C.mbcall_cublasLtMatmulDescDestroy(b.fn["cublasLtMatmulDescDestroy"], g.desc)
	}
	if g.algos != nil {
		C.free(unsafe.Pointer(g.algos))
	}
	*g = GEMM{MatMul: g.MatMul}
}
