package cuda

/*
#include <stdlib.h>
#include <string.h>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;

typedef CUresult (*d_u)(unsigned int);
typedef CUresult (*d_pi_i)(int *, int);
typedef CUresult (*d_pi_ii)(int *, int, int);
typedef CUresult (*d_psz_i)(size_t *, int);
typedef CUresult (*d_pp_i)(void **, int);
typedef CUresult (*d_i)(int);
typedef CUresult (*d_p)(void *);
typedef CUresult (*d_v)(void);
typedef CUresult (*d_pi_pi)(int *, int *);
typedef CUresult (*d_pint)(int *);
typedef CUresult (*d_pp_u_i)(void **, unsigned int, int);
typedef CUresult (*d_pp_u)(void **, unsigned int);
typedef CUresult (*d_p_p)(void *, void *);
typedef CUresult (*d_p_p_u)(void *, void *, unsigned int);
typedef CUresult (*d_pf_p_p)(float *, void *, void *);
typedef CUresult (*d_pd_sz)(CUdeviceptr *, size_t);
typedef CUresult (*d_d)(CUdeviceptr);
typedef CUresult (*d_psz_psz)(size_t *, size_t *);
typedef CUresult (*d_d_p_sz_p)(CUdeviceptr, const void *, size_t, void *);
typedef CUresult (*d_p_d_sz_p)(void *, CUdeviceptr, size_t, void *);
typedef CUresult (*d_d_d_sz_p)(CUdeviceptr, CUdeviceptr, size_t, void *);
typedef CUresult (*d_peer)(CUdeviceptr, void *, CUdeviceptr, void *, size_t, void *);
typedef CUresult (*d_memset16)(CUdeviceptr, unsigned short, size_t, void *);
typedef CUresult (*d_pp_cp)(void **, const void *);
typedef CUresult (*d_pp_p_cs)(void **, void *, const char *);
typedef CUresult (*d_p_i_i)(void *, int, int);
typedef CUresult (*d_launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
typedef CUresult (*d_errname)(CUresult, const char **);
typedef CUresult (*d_name)(char *, int, int);

static CUresult c_u(void *f, unsigned a) { return ((d_u)f)(a); }
static CUresult c_pi_i(void *f, int *a, int b) { return ((d_pi_i)f)(a, b); }
static CUresult c_pi_ii(void *f, int *a, int b, int c) { return ((d_pi_ii)f)(a, b, c); }
static CUresult c_psz_i(void *f, size_t *a, int b) { return ((d_psz_i)f)(a, b); }
static CUresult c_pp_i(void *f, void **a, int b) { return ((d_pp_i)f)(a, b); }
static CUresult c_i(void *f, int a) { return ((d_i)f)(a); }
static CUresult c_p(void *f, void *a) { return ((d_p)f)(a); }
static CUresult c_v(void *f) { return ((d_v)f)(); }
static CUresult c_pi_pi(void *f, int *a, int *b) { return ((d_pi_pi)f)(a, b); }
static CUresult c_pint(void *f, int *a) { return ((d_pint)f)(a); }
static CUresult c_pp_u_i(void *f, void **a, unsigned b, int c) { return ((d_pp_u_i)f)(a, b, c); }
static CUresult c_pp_u(void *f, void **a, unsigned b) { return ((d_pp_u)f)(a, b); }
static CUresult c_p_p(void *f, void *a, void *b) { return ((d_p_p)f)(a, b); }
static CUresult c_p_p_u(void *f, void *a, void *b, unsigned c) { return ((d_p_p_u)f)(a, b, c); }
static CUresult c_pf_p_p(void *f, float *a, void *b, void *c) { return ((d_pf_p_p)f)(a, b, c); }
static CUresult c_pd_sz(void *f, CUdeviceptr *a, size_t b) { return ((d_pd_sz)f)(a, b); }
static CUresult c_d(void *f, CUdeviceptr a) { return ((d_d)f)(a); }
static CUresult c_psz_psz(void *f, size_t *a, size_t *b) { return ((d_psz_psz)f)(a, b); }
static CUresult c_htod(void *f, CUdeviceptr d, const void *s, size_t n, void *st) { return ((d_d_p_sz_p)f)(d, s, n, st); }
static CUresult c_dtoh(void *f, void *d, CUdeviceptr s, size_t n, void *st) { return ((d_p_d_sz_p)f)(d, s, n, st); }
static CUresult c_dtod(void *f, CUdeviceptr d, CUdeviceptr s, size_t n, void *st) { return ((d_d_d_sz_p)f)(d, s, n, st); }
static CUresult c_peer(void *f, CUdeviceptr d, void *dc, CUdeviceptr s, void *sc, size_t n, void *st) { return ((d_peer)f)(d, dc, s, sc, n, st); }
static CUresult c_memset16(void *f, CUdeviceptr d, unsigned short v, size_t n, void *st) { return ((d_memset16)f)(d, v, n, st); }
static CUresult c_pp_cp(void *f, void **a, const void *b) { return ((d_pp_cp)f)(a, b); }
static CUresult c_pp_p_cs(void *f, void **a, void *b, const char *c) { return ((d_pp_p_cs)f)(a, b, c); }
static CUresult c_p_i_i(void *f, void *a, int b, int c) { return ((d_p_i_i)f)(a, b, c); }
// cuLaunchCooperativeKernel: cuLaunchKernel without extra.
typedef CUresult (*d_coop)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **);
static CUresult c_coop(void *f, void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned smem, void *st, void **params) {
	return ((d_coop)f)(fn, gx, gy, gz, bx, by, bz, smem, st, params);
}
// cuLaunchKernelEx: CUlaunchConfig and CUlaunchAttribute (an enum id, 4
// bytes of padding, a 64-byte value union); attribute ids 2 (cooperative)
// and 4 (cluster dimension).
typedef struct { int id; int pad; union { char pad[64]; int cooperative; struct { unsigned x, y, z; } cluster; } v; } lx_attr;
typedef struct { unsigned gx, gy, gz, bx, by, bz, smem; void *stream; lx_attr *attrs; unsigned nattrs; } lx_config;
_Static_assert(sizeof(lx_attr) == 72 && sizeof(lx_config) == 56, "CUlaunchAttribute is 72 bytes, CUlaunchConfig 56");
typedef CUresult (*d_launchex)(const lx_config *, void *, void **, void **);
static CUresult c_launchex(void *f, void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                           unsigned smem, void *st, void **params, int coop, unsigned cx, unsigned cy, unsigned cz) {
	lx_attr a[2];
	memset(a, 0, sizeof a);
	lx_config c = {gx, gy, gz, bx, by, bz, smem, st, a, 0};
	if (coop) { a[c.nattrs].id = 2; a[c.nattrs].v.cooperative = 1; c.nattrs++; }
	if (cx) { a[c.nattrs].id = 4; a[c.nattrs].v.cluster.x = cx; a[c.nattrs].v.cluster.y = cy; a[c.nattrs].v.cluster.z = cz; c.nattrs++; }
	return ((d_launchex)f)(&c, fn, params, 0);
}
static CUresult c_launch(void *f, void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned smem, void *st, void **params) {
	return ((d_launch)f)(fn, gx, gy, gz, bx, by, bz, smem, st, params, 0);
}
static CUresult c_name(void *f, char *s, int n, int d) { return ((d_name)f)(s, n, d); }
// cuMemHostAlloc(void **pp, size_t bytesize, unsigned Flags);
// cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned Flags)
typedef CUresult (*d_hostalloc)(void **, size_t, unsigned);
typedef CUresult (*d_hostdev)(CUdeviceptr *, void *, unsigned);
static CUresult c_hostalloc(void *f, void **p, size_t n, unsigned flags) { return ((d_hostalloc)f)(p, n, flags); }
static CUresult c_hostdev(void *f, CUdeviceptr *d, void *p, unsigned flags) { return ((d_hostdev)f)(d, p, flags); }
// cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func, int blockSize,
//     size_t dynamicSMemSize, unsigned flags); cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
typedef CUresult (*d_occ)(int *, void *, int, size_t, unsigned);
typedef CUresult (*d_fattr)(int *, int, void *);
static CUresult c_occ(void *f, int *n, void *fn, int block, size_t smem) { return ((d_occ)f)(n, fn, block, smem, 0); }
static CUresult c_fattr(void *f, int *v, int attr, void *fn) { return ((d_fattr)f)(v, attr, fn); }

// cuMemcpyBatchAsync: CUmemcpyAttributes and its two ABIs (12.8/12.9 with
// failIdx; 13.0's _v2 without).
typedef struct { int type; int id; } mc_loc;
typedef struct { int srcAccessOrder; mc_loc srcLocHint, dstLocHint; unsigned flags; } mc_attrs;
typedef CUresult (*d_batch1)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, mc_attrs *, size_t *, size_t, size_t *, void *);
typedef CUresult (*d_batch2)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, mc_attrs *, size_t *, size_t, void *);
static CUresult c_batch(void *f, int v2, CUdeviceptr *dst, CUdeviceptr *src, size_t *n, size_t count, int sdev, int ddev, unsigned flags, void *st) {
	mc_attrs a;
	memset(&a, 0, sizeof a);
	a.srcAccessOrder = 1; // CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
	a.srcLocHint.type = 1; // CU_MEM_LOCATION_TYPE_DEVICE
	a.srcLocHint.id = sdev;
	a.dstLocHint.type = 1;
	a.dstLocHint.id = ddev;
	a.flags = flags;
	size_t idx = 0, fail = 0;
	if (v2) return ((d_batch2)f)(dst, src, n, count, &a, &idx, 1, st);
	return ((d_batch1)f)(dst, src, n, count, &a, &idx, 1, &fail, st);
}
static const char *c_errname(void *f, CUresult r) {
	const char *s = 0;
	if (f == 0 || ((d_errname)f)(r, &s) != 0 || s == 0) return "CUDA_ERROR_UNKNOWN_CODE";
	return s;
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Driver is the CUDA driver API, opened with dlopen. Versioned symbols
// (cuMemAlloc_v2, …) are used where the ABI changed; contexts are primary
// contexts (never cuCtxCreate, whose ABI changed in CUDA 13).
//
// Proven here only against a fake libcuda (argument passing and the copy
// data path, see driver_test.go); not yet run against a real GPU.
type Driver struct {
	Path    string
	fn      map[string]unsafe.Pointer
	devs    []C.int // CUdevice handle of each ordinal (cuDeviceGet)
	current Context // the context this driver last made current (see SetCurrent)
}

// Handles are the driver's opaque pointers; DevicePtr is a device address.
type (
	Context   unsafe.Pointer
	Stream    unsafe.Pointer
	Event     unsafe.Pointer
	Module    unsafe.Pointer
	Function  unsafe.Pointer
	DevicePtr uint64
)

// Device attributes moebench reads (CUdevice_attribute values).
const (
	AttrMaxSharedPerBlockOptin = 97
	AttrMultiprocessorCount    = 16
	AttrClockRateKHz           = 13
	AttrMemoryClockRateKHz     = 36
	AttrAsyncEngineCount       = 40
	AttrComputeCapabilityMajor = 75
	AttrComputeCapabilityMinor = 76
)

// Function attributes (CUfunction_attribute values).
const (
	FuncAttrMaxThreadsPerBlock = 0 // the most threads a launch of it may have
	FuncAttrSharedBytes        = 1 // its static shared memory per block
	FuncAttrNumRegs            = 4 // registers per thread
	FuncAttrMaxDynamicShared   = 8 // the dynamic shared memory it may use (cuFuncSetAttribute raises it)
)

// Flags of cuMemHostAlloc (CU_MEMHOSTALLOC_*).
const (
	HostAllocPortable  = 1 // pinned for every context, not only the current one
	HostAllocDeviceMap = 2 // mapped into the devices' address space
)

// ErrCooperativeTooLarge is CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE's code:
// a cooperative launch with more blocks than the GPU can hold at once.
const ErrCooperativeTooLarge = 720

// driverSymbols are the entry points moebench uses; the first name that
// resolves is taken.
var driverSymbols = [][]string{
	{"cuInit"}, {"cuDriverGetVersion"}, {"cuDeviceGetCount"}, {"cuDeviceGet"}, {"cuDeviceGetName"}, {"cuDeviceGetPCIBusId"},
	{"cuDeviceGetAttribute"}, {"cuDeviceTotalMem_v2"}, {"cuDeviceCanAccessPeer"},
	{"cuDevicePrimaryCtxRetain"}, {"cuDevicePrimaryCtxRelease_v2"}, {"cuCtxSetCurrent"}, {"cuCtxSynchronize"},
	{"cuCtxEnablePeerAccess"}, {"cuCtxGetStreamPriorityRange"},
	{"cuStreamCreateWithPriority"}, {"cuStreamDestroy_v2"}, {"cuStreamSynchronize"}, {"cuStreamWaitEvent"},
	{"cuEventCreate"}, {"cuEventDestroy_v2"}, {"cuEventRecord"}, {"cuEventSynchronize"},
	{"cuEventElapsedTime_v2", "cuEventElapsedTime"},
	{"cuMemAlloc_v2"}, {"cuMemFree_v2"}, {"cuMemGetInfo_v2"},
	{"cuMemcpyHtoDAsync_v2"}, {"cuMemcpyDtoHAsync_v2"}, {"cuMemcpyDtoDAsync_v2"}, {"cuMemcpyPeerAsync"},
	{"cuMemsetD16Async"},
	{"cuModuleLoadData"}, {"cuModuleUnload"}, {"cuModuleGetFunction"}, {"cuFuncSetAttribute"}, {"cuLaunchKernel"},
	{"cuLaunchCooperativeKernel"},
	{"cuGetErrorName"},
	{"cuMemHostAlloc"}, {"cuMemHostGetDevicePointer_v2"}, {"cuMemFreeHost"},
	{"cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"}, {"cuFuncGetAttribute"},
}

// optionalSymbols are entry points newer drivers have; the first name that
// resolves is kept under it (batch copies: CUDA 13's ABI first, then 12.8's).
var optionalSymbols = []string{"cuMemcpyBatchAsync_v2", "cuMemcpyBatchAsync"}

// launchEx is the extensible launch (CUDA 12.0 and later).
const launchEx = "cuLaunchKernelEx"

// OpenDriver loads libcuda (MOEBENCH_LIBCUDA overrides) and resolves every
// entry point, then calls cuInit.
func OpenDriver() (*Driver, error) {
	lib, err := openLibrary("MOEBENCH_LIBCUDA", "libcuda.so.1")
	if err != nil {
		return nil, err
	}
	d := &Driver{Path: lib.path, fn: map[string]unsafe.Pointer{}}
	for _, names := range driverSymbols {
		var last error
		for _, n := range names {
			p, err := lib.sym(n)
			if err == nil {
				d.fn[names[0]] = p
				last = nil
				break
			}
			last = err
		}
		if last != nil {
			return nil, last
		}
	}
	for _, n := range optionalSymbols {
		if p, err := lib.sym(n); err == nil {
			d.fn[n] = p
			break
		}
	}
	if p, err := lib.sym(launchEx); err == nil {
		d.fn[launchEx] = p
	}
	if err := d.check("cuInit", C.c_u(d.fn["cuInit"], 0)); err != nil {
		return nil, err
	}
	var n C.int
	if err := d.check("cuDeviceGetCount", C.c_pint(d.fn["cuDeviceGetCount"], &n)); err != nil {
		return nil, err
	}
	d.devs = make([]C.int, n)
	for i := range d.devs {
		if err := d.check(fmt.Sprintf("cuDeviceGet(%d)", i), C.c_pi_i(d.fn["cuDeviceGet"], &d.devs[i], C.int(i))); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// dev is the CUdevice of ordinal i (an out-of-range ordinal passes through,
// and the driver call reports CUDA_ERROR_INVALID_DEVICE).
func (d *Driver) dev(i int) C.int {
	if i >= 0 && i < len(d.devs) {
		return d.devs[i]
	}
	return C.int(i)
}

// Error is a failed driver call: the call and the CUDA error name.
type Error struct {
	Call string
	Code int
	Name string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, e.Code) }

func (d *Driver) check(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(r), Name: C.GoString(C.c_errname(d.fn["cuGetErrorName"], r))}
}

// Version is the driver API version, e.g. 13000.
func (d *Driver) Version() (int, error) {
	var v C.int
	return int(v), d.check("cuDriverGetVersion", C.c_pint(d.fn["cuDriverGetVersion"], &v))
}

// DeviceCount is the number of GPUs.
func (d *Driver) DeviceCount() (int, error) { return len(d.devs), nil }

// Attribute reads a device attribute.
func (d *Driver) Attribute(dev, attr int) (int, error) {
	var v C.int
	err := d.check(fmt.Sprintf("cuDeviceGetAttribute(attr %d, device %d)", attr, dev), C.c_pi_ii(d.fn["cuDeviceGetAttribute"], &v, C.int(attr), d.dev(dev)))
	return int(v), err
}

// Name is the device's name, e.g. "NVIDIA H100 80GB HBM3".
func (d *Driver) Name(dev int) (string, error) { return d.text("cuDeviceGetName", dev) }

// PCIBusID is the device's PCI address, "domain:bus:device.function" in
// hex (e.g. "0000:1B:00.0"): how NVML, whose GPU order can differ from
// CUDA's (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER), finds the same GPU.
func (d *Driver) PCIBusID(dev int) (string, error) { return d.text("cuDeviceGetPCIBusId", dev) }

// text reads the string a device query (call: char *, int, CUdevice) writes.
func (d *Driver) text(call string, dev int) (string, error) {
	buf := (*C.char)(C.calloc(256, 1))
	defer C.free(unsafe.Pointer(buf))
	if err := d.check(fmt.Sprintf("%s(%d)", call, dev), C.c_name(d.fn[call], buf, 256, d.dev(dev))); err != nil {
		return "", err
	}
	return C.GoString(buf), nil
}

// TotalMem is the device's memory in bytes.
func (d *Driver) TotalMem(dev int) (int64, error) {
	var n C.size_t
	err := d.check("cuDeviceTotalMem_v2", C.c_psz_i(d.fn["cuDeviceTotalMem_v2"], &n, d.dev(dev)))
	return int64(n), err
}

// CanAccessPeer reports whether dev can access peer's memory.
func (d *Driver) CanAccessPeer(dev, peer int) (bool, error) {
	var v C.int
	err := d.check("cuDeviceCanAccessPeer", C.c_pi_ii(d.fn["cuDeviceCanAccessPeer"], &v, d.dev(dev), d.dev(peer)))
	return v != 0, err
}

// PrimaryContext retains dev's primary context and makes it current on this
// OS thread, which it locks (the current context is per thread).
func (d *Driver) PrimaryContext(dev int) (Context, error) {
	var ctx unsafe.Pointer
	if err := d.check("cuDevicePrimaryCtxRetain", C.c_pp_i(d.fn["cuDevicePrimaryCtxRetain"], &ctx, d.dev(dev))); err != nil {
		return nil, err
	}
	runtime.LockOSThread()
	d.current = nil
	return Context(ctx), d.SetCurrent(Context(ctx))
}

// SetCurrent makes ctx the current context of this OS thread, unless this
// driver made it current last: a process that drives several GPUs from one
// goroutine switches contexts through one Driver. It assumes that nothing
// else on the thread changes the current context (cuBLAS and cuBLASLt calls
// run in the current one and leave it); after a library that may (NCCL),
// call ContextChanged.
func (d *Driver) SetCurrent(ctx Context) error {
	if ctx == d.current && ctx != nil {
		return nil
	}
	if err := d.check("cuCtxSetCurrent", C.c_p(d.fn["cuCtxSetCurrent"], unsafe.Pointer(ctx))); err != nil {
		return err
	}
	d.current = ctx
	return nil
}

// ContextChanged forgets which context this driver made current, so that
// the next SetCurrent sets it again: call it after a library call that may
// have made another context current (NCCL switches to each GPU it works on).
func (d *Driver) ContextChanged() { d.current = nil }

// ReleasePrimaryContext releases dev's primary context.
func (d *Driver) ReleasePrimaryContext(dev int) error {
	d.current = nil
	return d.check("cuDevicePrimaryCtxRelease_v2", C.c_i(d.fn["cuDevicePrimaryCtxRelease_v2"], d.dev(dev)))
}

// Synchronize waits for the current context.
func (d *Driver) Synchronize() error {
	return d.check("cuCtxSynchronize", C.c_v(d.fn["cuCtxSynchronize"]))
}

// EnablePeerAccess lets the current context access peer's memory.
func (d *Driver) EnablePeerAccess(peer Context) error {
	return d.check("cuCtxEnablePeerAccess", C.c_p_p_u(d.fn["cuCtxEnablePeerAccess"], unsafe.Pointer(peer), nil, 0))
}

// StreamPriorities is the current context's range (least, greatest): the
// greatest priority is the lowest number.
func (d *Driver) StreamPriorities() (least, greatest int, err error) {
	var l, g C.int
	err = d.check("cuCtxGetStreamPriorityRange", C.c_pi_pi(d.fn["cuCtxGetStreamPriorityRange"], &l, &g))
	return int(l), int(g), err
}

// NewStream creates a non-blocking stream with a priority.
func (d *Driver) NewStream(priority int) (Stream, error) {
	var s unsafe.Pointer
	const nonBlocking = 1
	err := d.check("cuStreamCreateWithPriority", C.c_pp_u_i(d.fn["cuStreamCreateWithPriority"], &s, nonBlocking, C.int(priority)))
	return Stream(s), err
}

// DestroyStream destroys s.
func (d *Driver) DestroyStream(s Stream) error {
	return d.check("cuStreamDestroy_v2", C.c_p(d.fn["cuStreamDestroy_v2"], unsafe.Pointer(s)))
}

// SyncStream waits for s.
func (d *Driver) SyncStream(s Stream) error {
	return d.check("cuStreamSynchronize", C.c_p(d.fn["cuStreamSynchronize"], unsafe.Pointer(s)))
}

// WaitEvent makes s wait for e.
func (d *Driver) WaitEvent(s Stream, e Event) error {
	return d.check("cuStreamWaitEvent", C.c_p_p_u(d.fn["cuStreamWaitEvent"], unsafe.Pointer(s), unsafe.Pointer(e), 0))
}

// NewEvent creates a timing event.
func (d *Driver) NewEvent() (Event, error) {
	var e unsafe.Pointer
	err := d.check("cuEventCreate", C.c_pp_u(d.fn["cuEventCreate"], &e, 0))
	return Event(e), err
}

// DestroyEvent destroys e.
func (d *Driver) DestroyEvent(e Event) error {
	return d.check("cuEventDestroy_v2", C.c_p(d.fn["cuEventDestroy_v2"], unsafe.Pointer(e)))
}

// Record records e on s.
func (d *Driver) Record(e Event, s Stream) error {
	return d.check("cuEventRecord", C.c_p_p(d.fn["cuEventRecord"], unsafe.Pointer(e), unsafe.Pointer(s)))
}

// SyncEvent waits for e.
func (d *Driver) SyncEvent(e Event) error {
	return d.check("cuEventSynchronize", C.c_p(d.fn["cuEventSynchronize"], unsafe.Pointer(e)))
}

// Elapsed is the time between two recorded events, in milliseconds.
func (d *Driver) Elapsed(start, end Event) (float32, error) {
	var ms C.float
	err := d.check("cuEventElapsedTime", C.c_pf_p_p(d.fn["cuEventElapsedTime_v2"], &ms, unsafe.Pointer(start), unsafe.Pointer(end)))
	return float32(ms), err
}

// Alloc allocates n bytes of device memory (plain cuMemAlloc, never managed).
func (d *Driver) Alloc(n int64) (DevicePtr, error) {
	var p C.CUdeviceptr
	err := d.check(fmt.Sprintf("cuMemAlloc_v2(%d bytes)", n), C.c_pd_sz(d.fn["cuMemAlloc_v2"], &p, C.size_t(n)))
	return DevicePtr(p), err
}

// Free frees device memory.
func (d *Driver) Free(p DevicePtr) error {
	return d.check("cuMemFree_v2", C.c_d(d.fn["cuMemFree_v2"], C.CUdeviceptr(p)))
}

// HostAlloc allocates n bytes of page-locked host memory (cuMemHostAlloc)
// with flags (HostAlloc*); free it with FreeHost.
func (d *Driver) HostAlloc(n int64, flags uint32) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	err := d.check(fmt.Sprintf("cuMemHostAlloc(%d bytes, flags %#x)", n, flags), C.c_hostalloc(d.fn["cuMemHostAlloc"], &p, C.size_t(n), C.uint(flags)))
	return p, err
}

// HostDevicePtr is the device address of mapped host memory p (allocated
// with HostAllocDeviceMap).
func (d *Driver) HostDevicePtr(p unsafe.Pointer) (DevicePtr, error) {
	var dp C.CUdeviceptr
	err := d.check("cuMemHostGetDevicePointer_v2", C.c_hostdev(d.fn["cuMemHostGetDevicePointer_v2"], &dp, p, 0))
	return DevicePtr(dp), err
}

// FreeHost frees memory of HostAlloc.
func (d *Driver) FreeHost(p unsafe.Pointer) error {
	return d.check("cuMemFreeHost", C.c_p(d.fn["cuMemFreeHost"], p))
}

// Occupancy is how many blocks of f (block threads, sharedBytes of dynamic
// shared memory each) one SM holds at once
// (cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, default flags).
func (d *Driver) Occupancy(f Function, block, sharedBytes int) (int, error) {
	var n C.int
	err := d.check("cuOccupancyMaxActiveBlocksPerMultiprocessor", C.c_occ(d.fn["cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"], &n, unsafe.Pointer(f), C.int(block), C.size_t(sharedBytes)))
	return int(n), err
}

// FuncAttribute reads an attribute of f (FuncAttr*).
func (d *Driver) FuncAttribute(f Function, attr int) (int, error) {
	var v C.int
	err := d.check(fmt.Sprintf("cuFuncGetAttribute(%d)", attr), C.c_fattr(d.fn["cuFuncGetAttribute"], &v, C.int(attr), unsafe.Pointer(f)))
	return int(v), err
}

// MemInfo is the free and total device memory of the current context.
func (d *Driver) MemInfo() (free, total int64, err error) {
	var f, t C.size_t
	err = d.check("cuMemGetInfo_v2", C.c_psz_psz(d.fn["cuMemGetInfo_v2"], &f, &t))
	return int64(f), int64(t), err
}

// CopyToDevice copies len(src) elements of host memory to dst on s; src must
// stay alive and unchanged until s has run the copy (synchronize before
// reusing it).
func CopyToDevice[T any](d *Driver, dst DevicePtr, src []T, s Stream) error {
	if len(src) == 0 {
		return nil
	}
	n := C.size_t(len(src)) * C.size_t(unsafe.Sizeof(src[0]))
	return d.check("cuMemcpyHtoDAsync_v2", C.c_htod(d.fn["cuMemcpyHtoDAsync_v2"], C.CUdeviceptr(dst), unsafe.Pointer(&src[0]), n, unsafe.Pointer(s)))
}

// CopyFromDevice copies len(dst) elements from src into host memory on s.
func CopyFromDevice[T any](d *Driver, dst []T, src DevicePtr, s Stream) error {
	if len(dst) == 0 {
		return nil
	}
	n := C.size_t(len(dst)) * C.size_t(unsafe.Sizeof(dst[0]))
	return d.check("cuMemcpyDtoHAsync_v2", C.c_dtoh(d.fn["cuMemcpyDtoHAsync_v2"], unsafe.Pointer(&dst[0]), C.CUdeviceptr(src), n, unsafe.Pointer(s)))
}

// CopyDevice copies n bytes between device buffers of one context on s.
func (d *Driver) CopyDevice(dst, src DevicePtr, n int64, s Stream) error {
	return d.check("cuMemcpyDtoDAsync_v2", C.c_dtod(d.fn["cuMemcpyDtoDAsync_v2"], C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), unsafe.Pointer(s)))
}

// CopyPeer copies n bytes from src in srcCtx to dst in dstCtx on s.
func (d *Driver) CopyPeer(dst DevicePtr, dstCtx Context, src DevicePtr, srcCtx Context, n int64, s Stream) error {
	return d.check("cuMemcpyPeerAsync", C.c_peer(d.fn["cuMemcpyPeerAsync"], C.CUdeviceptr(dst), unsafe.Pointer(dstCtx),
		C.CUdeviceptr(src), unsafe.Pointer(srcCtx), C.size_t(n), unsafe.Pointer(s)))
}

// BatchCopy names the driver's batch-copy entry point, or "" when it has
// none (drivers before CUDA 12.8).
func (d *Driver) BatchCopy() string {
	for _, n := range optionalSymbols {
		if d.fn[n] != nil {
			return n
		}
	}
	return ""
}

// CopyBatch queues copies from buffers of GPU srcDev to buffers of GPU
// dstDev (the same GPU or a peer) on s as one batch (cuMemcpyBatchAsync,
// stream-ordered sources); preferCE sets
// CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE, the hint to keep the copies off
// the SMs. It fails when the driver has no batch copy (see BatchCopy).
func (d *Driver) CopyBatch(dst, src []DevicePtr, bytes []int64, srcDev, dstDev int, preferCE bool, s Stream) error {
	name := d.BatchCopy()
	if name == "" {
		return fmt.Errorf("cuMemcpyBatchAsync: not in this driver (CUDA 12.8 or later has it)")
	}
	n := len(dst)
	if len(src) != n || len(bytes) != n {
		return fmt.Errorf("%s: %d destinations, %d sources, %d sizes", name, n, len(src), len(bytes))
	}
	if n == 0 {
		return nil
	}
	mem := C.malloc(C.size_t(3 * n * 8))
	defer C.free(mem)
	words := unsafe.Slice((*uint64)(mem), 3*n)
	for i := range n {
		words[i], words[n+i], words[2*n+i] = uint64(dst[i]), uint64(src[i]), uint64(bytes[i])
	}
	flags := C.uint(0)
	if preferCE {
		flags = 1
	}
	v2 := C.int(0)
	if name == optionalSymbols[0] {
		v2 = 1
	}
	p := (*C.CUdeviceptr)(mem)
	return d.check(name, C.c_batch(d.fn[name], v2, p, (*C.CUdeviceptr)(unsafe.Add(mem, 8*n)), (*C.size_t)(unsafe.Add(mem, 16*n)),
		C.size_t(n), C.int(srcDev), C.int(dstDev), flags, unsafe.Pointer(s)))
}

// Fill16 sets n 16-bit words at p to v on s (e.g. poisoning bf16 with NaN 0x7fc0).
func (d *Driver) Fill16(p DevicePtr, v uint16, n int64, s Stream) error {
	return d.check("cuMemsetD16Async", C.c_memset16(d.fn["cuMemsetD16Async"], C.CUdeviceptr(p), C.ushort(v), C.size_t(n), unsafe.Pointer(s)))
}

// LoadModule loads a cubin.
func (d *Driver) LoadModule(image []byte) (Module, error) {
	if len(image) == 0 {
		return nil, fmt.Errorf("cuModuleLoadData: empty image")
	}
	img := C.CBytes(image)
	defer C.free(img)
	var m unsafe.Pointer
	err := d.check("cuModuleLoadData", C.c_pp_cp(d.fn["cuModuleLoadData"], &m, img))
	return Module(m), err
}

// UnloadModule unloads m.
func (d *Driver) UnloadModule(m Module) error {
	return d.check("cuModuleUnload", C.c_p(d.fn["cuModuleUnload"], unsafe.Pointer(m)))
}

// Function looks a kernel up by name.
func (d *Driver) Function(m Module, name string) (Function, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var f unsafe.Pointer
	err := d.check("cuModuleGetFunction("+name+")", C.c_pp_p_cs(d.fn["cuModuleGetFunction"], &f, unsafe.Pointer(m), cs))
	return Function(f), err
}

// SetMaxDynamicShared lets f use more than 48 KB of dynamic shared memory.
func (d *Driver) SetMaxDynamicShared(f Function, bytes int) error {
	return d.check("cuFuncSetAttribute", C.c_p_i_i(d.fn["cuFuncSetAttribute"], unsafe.Pointer(f), FuncAttrMaxDynamicShared, C.int(bytes)))
}

// Launch runs f on s. Each argument is a device pointer, an int32, a
// uint32, a float32, a uint64 or an int64, or the bytes of a struct
// (Bytes), passed by value (see params).
func (d *Driver) Launch(f Function, grid, block [3]uint32, sharedBytes uint32, s Stream, args ...any) error {
	return d.launch("cuLaunchKernel", args, func(p *unsafe.Pointer) C.CUresult {
		return C.c_launch(d.fn["cuLaunchKernel"], unsafe.Pointer(f), C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]),
			C.uint(block[0]), C.uint(block[1]), C.uint(block[2]), C.uint(sharedBytes), unsafe.Pointer(s), p)
	})
}

// LaunchCooperative runs f on s with every block resident at once, so that
// the grid may synchronize as a whole (cuLaunchCooperativeKernel; the grid
// must fit on the GPU at once, else the driver refuses it).
func (d *Driver) LaunchCooperative(f Function, grid, block [3]uint32, sharedBytes uint32, s Stream, args ...any) error {
	return d.launch("cuLaunchCooperativeKernel", args, func(p *unsafe.Pointer) C.CUresult {
		return C.c_coop(d.fn["cuLaunchCooperativeKernel"], unsafe.Pointer(f), C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]),
			C.uint(block[0]), C.uint(block[1]), C.uint(block[2]), C.uint(sharedBytes), unsafe.Pointer(s), p)
	})
}

// LaunchOptions are what LaunchEx adds to a plain launch.
type LaunchOptions struct {
	Cooperative bool      // every block resident at once (grid-wide sync)
	Cluster     [3]uint32 // thread-block cluster shape (sm_90 and later); zero: no clusters
}

// LaunchEx runs f on s through cuLaunchKernelEx with opt's attributes; it
// fails when the driver has no cuLaunchKernelEx (before CUDA 12.0).
func (d *Driver) LaunchEx(f Function, grid, block [3]uint32, sharedBytes uint32, s Stream, opt LaunchOptions, args ...any) error {
	if d.fn[launchEx] == nil {
		return fmt.Errorf("%s: not in this driver (CUDA 12.0 or later has it)", launchEx)
	}
	if opt.Cluster != [3]uint32{} && (opt.Cluster[0] == 0 || opt.Cluster[1] == 0 || opt.Cluster[2] == 0) {
		return fmt.Errorf("%s: cluster %v has a zero dimension", launchEx, opt.Cluster)
	}
	coop := C.int(0)
	if opt.Cooperative {
		coop = 1
	}
	return d.launch(launchEx, args, func(p *unsafe.Pointer) C.CUresult {
		return C.c_launchex(d.fn[launchEx], unsafe.Pointer(f), C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]),
			C.uint(block[0]), C.uint(block[1]), C.uint(block[2]), C.uint(sharedBytes), unsafe.Pointer(s), p, coop,
			C.uint(opt.Cluster[0]), C.uint(opt.Cluster[1]), C.uint(opt.Cluster[2]))
	})
}

// launch copies args to C memory (see params) and makes call with them.
func (d *Driver) launch(call string, args []any, c func(p *unsafe.Pointer) C.CUresult) error {
	mem, p, err := params(call, args)
	defer C.free(mem)
	if err != nil {
		return err
	}
	return d.check(call, c(p))
}

// Bytes is a kernel argument passed by value as its bytes: a struct laid
// out as the kernel declares it (8-byte aligned at most).
type Bytes []byte

// params copies kernel arguments (device pointers, int32, uint32, float32,
// uint64, int64, Bytes) to one block of C memory: the parameter pointers,
// then a slot per value, 8 bytes or a Bytes' length rounded up to 8. The
// caller frees mem, also on error.
func params(call string, args []any) (mem unsafe.Pointer, p *unsafe.Pointer, err error) {
	n := len(args)
	const slot = 8
	size := max(n, 1) * 2 * slot
	for _, a := range args {
		if b, ok := a.(Bytes); ok {
			size += (len(b) + slot - 1) / slot * slot
		}
	}
	mem = C.malloc(C.size_t(size))
	ps := unsafe.Slice((*unsafe.Pointer)(mem), max(n, 1))
	extra := 2 * n * slot // where the next Bytes go
	for i, a := range args {
		v := unsafe.Add(mem, (n+i)*slot)
		switch x := a.(type) {
		case uint64:
			*(*uint64)(v) = x
		case int64:
			*(*int64)(v) = x
		case Bytes:
			v = unsafe.Add(mem, extra)
			copy(unsafe.Slice((*byte)(v), len(x)), x)
			extra += (len(x) + slot - 1) / slot * slot
		case DevicePtr:
			*(*DevicePtr)(v) = x
		case int32:
			*(*int32)(v) = x
		case uint32:
			*(*uint32)(v) = x
		case float32:
			*(*float32)(v) = x
		default:
			return mem, nil, fmt.Errorf("%s: argument %d has unsupported type %T", call, i, a)
		}
		ps[i] = v
	}
	return mem, &ps[0], nil
}
