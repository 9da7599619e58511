package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/abi
#include <stdlib.h>
#include "abi.h"
// ints: transa, transb, m, n, k, lda, ldb, ldc, group_size (count each);
// scal: alpha, beta (count each); ptrs: device arrays of count pointers each,
// cuBLAS's A (the weights), B (the inputs), C
static int bl_call_grouped(void *f, void *h, int *ints, float *scal, int count, unsigned long long ptrs, int type, int compute) {
	const void *const *A = (const void *const *)ptrs;
	const void *const *B = A + count;
	void *const *C = (void *const *)(B + count);
	return mbcall_cublasGemmGroupedBatchedEx(f, h, ints, ints + count, ints + 2 * count, ints + 3 * count, ints + 4 * count, scal,
	                                         A, type, ints + 5 * count, B, type, ints + 6 * count, scal + count,
	                                         C, type, ints + 7 * count, count, ints + 8 * count, compute);
}
// a device address arrives as an integer and becomes a pointer here
static int bl_set_ws(void *f, void *h, unsigned long long ws, size_t n) { return mbcall_cublasSetWorkspace_v2(f, h, (void *)ws, n); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// CuBLAS is the part of cuBLAS moebench uses: cublasGemmGroupedBatchedEx
// (cuBLAS 12.5 and later), which runs GEMMs of different shapes in one call.
// OpenCuBLAS only loads the library; Init creates the handle on the current
// context.
//
// Proven here against a fake library (argument order, the row-major to
// column-major mapping); not yet run on a GPU.
type CuBLAS struct {
	Path    string
	Version int
	fn      map[string]unsafe.Pointer
	handle  unsafe.Pointer
}

// OpenCuBLAS loads libcublas (MOEBENCH_CUBLAS overrides), of the CUDA
// driver's major first (see majors). A library without
// the grouped GEMM (before 12.5) is refused, naming the symbol.
func OpenCuBLAS() (*CuBLAS, error) {
	groups := majors("libcublas", map[int][]string{13: {"libcublas.so.13"}, 12: {"libcublas.so.12"}})
	lib, err := openPreferred("MOEBENCH_CUBLAS", groups)
	if err != nil {
		return nil, err
	}
	b := &CuBLAS{Path: lib.path, fn: map[string]unsafe.Pointer{}}
	for _, s := range []string{"cublasCreate_v2", "cublasDestroy_v2", "cublasGetVersion_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasGemmGroupedBatchedEx"} {
		if b.fn[s], err = lib.sym(s); err != nil {
			return nil, fmt.Errorf("%s: %w (cublasGemmGroupedBatchedEx needs cuBLAS 12.5 or later)", lib.path, err)
		}
	}
	return b, nil
}

// Init creates the handle on the current context and reads the version.
func (b *CuBLAS) Init() error {
	if err := ltErr("cublasCreate_v2", C.mbcall_cublasCreate_v2(b.fn["cublasCreate_v2"], &b.handle)); err != nil {
		return err
	}
	var v C.int
	if err := ltErr("cublasGetVersion_v2", C.mbcall_cublasGetVersion_v2(b.fn["cublasGetVersion_v2"], b.handle, &v)); err != nil {
		return err
	}
	b.Version = int(v)
	return nil
}

// Close destroys the handle.
func (b *CuBLAS) Close() error {
	if b.handle == nil {
		return nil
	}
	err := ltErr("cublasDestroy_v2", C.mbcall_cublasDestroy_v2(b.fn["cublasDestroy_v2"], b.handle))
	b.handle = nil
	return err
}

// GroupedGEMM runs len(ms) GEMMs c_i[ms[i], n] = a_i[ms[i], k] · w_i[n, k]ᵀ
// (row-major bf16, fp32 accumulation, bf16 out) as one
// cublasGemmGroupedBatchedEx call on s, one group per GEMM. ptrs is a device
// array of 3·len(ms) addresses: the w_i, then the a_i, then the c_i. In
// cuBLAS's column-major terms each is the "TN" GEMM of CuBLASLt's GEMM.
// The call uses ws (wsBytes bytes, 256-byte aligned) as its workspace,
// not the handle's default pool: calls on different streams must not
// share one.
func (b *CuBLAS) GroupedGEMM(ms []int, n, k int, ptrs, ws DevicePtr, wsBytes int64, s Stream) error {
	count := len(ms)
	if count == 0 {
		return nil
	}
	if err := ltErr("cublasSetStream_v2", C.mbcall_cublasSetStream_v2(b.fn["cublasSetStream_v2"], b.handle, unsafe.Pointer(s))); err != nil {
		return err
	}
	// after the stream: setting it drops the workspace set before
	if err := ltErr("cublasSetWorkspace_v2", C.bl_set_ws(b.fn["cublasSetWorkspace_v2"], b.handle, C.ulonglong(ws), C.size_t(wsBytes))); err != nil {
		return err
	}
	mem := C.malloc(C.size_t(11 * count * 4))
	defer C.free(mem)
	ints := unsafe.Slice((*C.int)(mem), 9*count)
	scal := unsafe.Slice((*C.float)(unsafe.Add(mem, 9*count*4)), 2*count)
	for i, m := range ms {
		// transa (T, the weights), transb (N), m = n, n = m_i, k, lda = k, ldb = k, ldc = n, group size 1
		for j, v := range []int{opT, opN, n, m, k, k, k, n, 1} {
			ints[j*count+i] = C.int(v)
		}
		scal[i], scal[count+i] = 1, 0
	}
	return ltErr("cublasGemmGroupedBatchedEx", C.bl_call_grouped(b.fn["cublasGemmGroupedBatchedEx"], b.handle, &ints[0], &scal[0],
		C.int(count), C.ulonglong(ptrs), dataR16BF, compute32F))
}
