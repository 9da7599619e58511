package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/abi
#include <stdlib.h>
#include <string.h>
#include "abi.h"

// cuLaunchKernelEx with the cooperative attribute and a cluster dimension
// when asked.
static int c_launchex(void *f, void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                      unsigned smem, void *st, void **params, int coop, unsigned cx, unsigned cy, unsigned cz) {
	mb_launch_attr a[2];
	memset(a, 0, sizeof a);
	mb_launch_config c = {gx, gy, gz, bx, by, bz, smem, st, a, 0};
	if (coop) { a[c.numAttrs].id = MB_LAUNCH_ATTRIBUTE_COOPERATIVE; a[c.numAttrs].value.cooperative = 1; c.numAttrs++; }
	if (cx) {
		a[c.numAttrs].id = MB_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
		a[c.numAttrs].value.cluster.x = cx, a[c.numAttrs].value.cluster.y = cy, a[c.numAttrs].value.cluster.z = cz;
		c.numAttrs++;
	}
	return mbcall_cuLaunchKernelEx(f, &c, fn, params, 0);
}
// cuMemcpyBatchAsync (12.8/12.9, with failIdx) or _v2 (13.0, without): one
// set of attributes, stream-ordered sources, device location hints.
static int c_batch(void *f, int v2, mb_dptr *dst, mb_dptr *src, size_t *n, size_t count, int sdev, int ddev, unsigned flags, void *st) {
	mb_memcpy_attrs a;
	memset(&a, 0, sizeof a);
	a.srcAccessOrder = MB_MEMCPY_SRC_ACCESS_ORDER_STREAM;
	a.srcLocHint.type = MB_MEM_LOCATION_TYPE_DEVICE;
	a.srcLocHint.id = sdev;
	a.dstLocHint.type = MB_MEM_LOCATION_TYPE_DEVICE;
	a.dstLocHint.id = ddev;
	a.flags = flags;
	size_t idx = 0, fail = 0;
	if (v2) return mbcall_cuMemcpyBatchAsync_v2(f, dst, src, n, count, &a, &idx, 1, st);
	return mbcall_cuMemcpyBatchAsync(f, dst, src, n, count, &a, &idx, 1, &fail, st);
}
// The context this OS thread last made current through moebench, and the
// driver's entry point it went through (the current context is per thread,
// and per loaded driver: tests load several fakes): SetCurrent skips the
// call when it is already the one.
static __thread void *c_current, *c_current_fn;
// c_set_current returns the call's result times two, plus one when it
// called the driver (no out-parameter: a Go variable whose address cgo
// passes is allocated on the heap, and this runs for every launch).
static int c_set_current(void *f, void *ctx) {
	if (ctx != 0 && ctx == c_current && f == c_current_fn) return 0;
	int r = mbcall_cuCtxSetCurrent(f, ctx);
	c_current = r == 0 ? ctx : 0;
	c_current_fn = f;
	return 2 * r + 1;
}
static void c_forget_current(void) { c_current = 0; }
static const char *c_errname(void *f, int r) {
	const char *s = 0;
	if (f == 0 || mbcall_cuGetErrorName(f, r, &s) != 0 || s == 0) return "CUDA_ERROR_UNKNOWN_CODE";
	return s;
}
*/
import "C"

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"unsafe"
)

// Driver is the CUDA driver API, opened with dlopen. Versioned symbols
// (cuMemAlloc_v2, …) are used where the ABI changed; contexts are primary
// contexts (never cuCtxCreate, whose ABI changed in CUDA 13).
//
// Proven here only against a fake libcuda (argument passing and the copy
// data path, see driver_test.go); not yet run against a real GPU.
type Driver struct {
	Path string
	fn   map[string]unsafe.Pointer
	devs []C.int // CUdevice handle of each ordinal (cuDeviceGet)
	// kernel parameters' C memory, reused by every launch (see params)
	pmu  sync.Mutex
	pmem unsafe.Pointer
	pcap int
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
	AttrMaxSharedPerSM         = 81  // shared memory an SM gives its blocks
	AttrReservedSharedPerBlock = 111 // shared memory the driver takes for each block
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

// streamNonBlocking is CU_STREAM_NON_BLOCKING; memcpyPreferOverlap is
// CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE (12.8).
const (
	streamNonBlocking   = 1
	memcpyPreferOverlap = 1
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

// MaxConnections is the CUDA_DEVICE_MAX_CONNECTIONS moebench sets for the
// process when it is not set: the most hardware work queues a GPU gives a
// process (the default is 8). With EP ranks packed on one GPU, 8 ranks × 4
// streams each (the expert GEMMs over four) would otherwise share 8
// queues, and streams sharing a queue wait for each other.
const MaxConnections = "32"

// SetMaxConnections sets CUDA_DEVICE_MAX_CONNECTIONS to MaxConnections when
// the environment does not set it. The driver reads it when it
// initializes, so it must run before the first cuInit of the process
// (OpenDriver calls it; a run calls it before recording its stack, which
// keeps the environment's CUDA_* variables).
func SetMaxConnections() {
	if os.Getenv("CUDA_DEVICE_MAX_CONNECTIONS") == "" {
		os.Setenv("CUDA_DEVICE_MAX_CONNECTIONS", MaxConnections) // with cgo, the C environment too
	}
}

// OpenDriver loads libcuda (MOEBENCH_LIBCUDA overrides) and resolves every
// entry point, then sets CUDA_DEVICE_MAX_CONNECTIONS (SetMaxConnections) and
// calls cuInit.
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
	for _, n := range append([]string{launchEx}, graphSymbols...) {
		if p, err := lib.sym(n); err == nil {
			d.fn[n] = p
		}
	}
	SetMaxConnections()
	if err := d.check("cuInit", C.mbcall_cuInit(d.fn["cuInit"], 0)); err != nil {
		return nil, err
	}
	var n C.int
	if err := d.check("cuDeviceGetCount", C.mbcall_cuDeviceGetCount(d.fn["cuDeviceGetCount"], &n)); err != nil {
		return nil, err
	}
	d.devs = make([]C.int, n)
	for i := range d.devs {
		if err := d.check(fmt.Sprintf("cuDeviceGet(%d)", i), C.mbcall_cuDeviceGet(d.fn["cuDeviceGet"], &d.devs[i], C.int(i))); err != nil {
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

func (d *Driver) check(call string, r C.int) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(r), Name: C.GoString(C.c_errname(d.fn["cuGetErrorName"], r))}
}

// Version is the driver API version, e.g. 13000.
func (d *Driver) Version() (int, error) {
	var v C.int
	return int(v), d.check("cuDriverGetVersion", C.mbcall_cuDriverGetVersion(d.fn["cuDriverGetVersion"], &v))
}

// DeviceCount is the number of GPUs.
func (d *Driver) DeviceCount() (int, error) { return len(d.devs), nil }

// Attribute reads a device attribute.
func (d *Driver) Attribute(dev, attr int) (int, error) {
	var v C.int
	err := d.check(fmt.Sprintf("cuDeviceGetAttribute(attr %d, device %d)", attr, dev), C.mbcall_cuDeviceGetAttribute(d.fn["cuDeviceGetAttribute"], &v, C.int(attr), d.dev(dev)))
	return int(v), err
}

// Name is the device's name, e.g. "NVIDIA H100 80GB HBM3".
func (d *Driver) Name(dev int) (string, error) { return d.text("cuDeviceGetName", dev) }

// PCIBusID is the device's PCI address, "domain:bus:device.function" in
// hex (e.g. "0000:1B:00.0"): how NVML, whose GPU order can differ from
// CUDA's (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER), finds the same GPU.
func (d *Driver) PCIBusID(dev int) (string, error) { return d.text("cuDeviceGetPCIBusId", dev) }

// text reads the string a device query writes (call: cuDeviceGetName or
// cuDeviceGetPCIBusId, which share a prototype).
func (d *Driver) text(call string, dev int) (string, error) {
	buf := (*C.char)(C.calloc(256, 1))
	defer C.free(unsafe.Pointer(buf))
	if err := d.check(fmt.Sprintf("%s(%d)", call, dev), C.mbcall_cuDeviceGetName(d.fn[call], buf, 256, d.dev(dev))); err != nil {
		return "", err
	}
	return C.GoString(buf), nil
}

// TotalMem is the device's memory in bytes.
func (d *Driver) TotalMem(dev int) (int64, error) {
	var n C.size_t
	err := d.check("cuDeviceTotalMem_v2", C.mbcall_cuDeviceTotalMem_v2(d.fn["cuDeviceTotalMem_v2"], &n, d.dev(dev)))
	return int64(n), err
}

// CanAccessPeer reports whether dev can access peer's memory.
func (d *Driver) CanAccessPeer(dev, peer int) (bool, error) {
	var v C.int
	err := d.check("cuDeviceCanAccessPeer", C.mbcall_cuDeviceCanAccessPeer(d.fn["cuDeviceCanAccessPeer"], &v, d.dev(dev), d.dev(peer)))
	return v != 0, err
}

// PrimaryContext retains dev's primary context and makes it current on this
// OS thread, which it locks (the current context is per thread).
func (d *Driver) PrimaryContext(dev int) (Context, error) {
	var ctx unsafe.Pointer
	if err := d.check("cuDevicePrimaryCtxRetain", C.mbcall_cuDevicePrimaryCtxRetain(d.fn["cuDevicePrimaryCtxRetain"], &ctx, d.dev(dev))); err != nil {
		return nil, err
	}
	runtime.LockOSThread()
	C.c_forget_current()
	return Context(ctx), d.SetCurrent(Context(ctx))
}

// SetCurrent makes ctx the current context of the calling OS thread,
// unless moebench made it current on this thread last: each thread
// remembers its own, so that several threads, one per GPU, and a thread
// that drives several GPUs in turn all switch only when needed. The
// current context is per thread, so when it sets one it locks the calling
// goroutine to its thread (for good: a thread that remembers a context is
// one goroutine's). It assumes that nothing else on the thread changes the
// current context (cuBLAS and cuBLASLt calls run in the current one and
// leave it); after a library that may (NCCL), call ContextChanged on that
// thread.
func (d *Driver) SetCurrent(ctx Context) error {
	r := C.c_set_current(d.fn["cuCtxSetCurrent"], unsafe.Pointer(ctx))
	if r%2 == 1 {
		runtime.LockOSThread()
	}
	return d.check("cuCtxSetCurrent", r/2)
}

// ContextChanged forgets which context moebench made current on the
// calling OS thread, so that the next SetCurrent there sets it again: call
// it after a library call that may have made another context current
// (NCCL switches to each GPU it works on).
func (d *Driver) ContextChanged() { C.c_forget_current() }

// ReleasePrimaryContext releases dev's primary context.
func (d *Driver) ReleasePrimaryContext(dev int) error {
	C.c_forget_current()
	return d.check("cuDevicePrimaryCtxRelease_v2", C.mbcall_cuDevicePrimaryCtxRelease_v2(d.fn["cuDevicePrimaryCtxRelease_v2"], d.dev(dev)))
}

// Synchronize waits for the current context.
func (d *Driver) Synchronize() error {
	return d.check("cuCtxSynchronize", C.mbcall_cuCtxSynchronize(d.fn["cuCtxSynchronize"]))
}

// EnablePeerAccess lets the current context access peer's memory.
func (d *Driver) EnablePeerAccess(peer Context) error {
	return d.check("cuCtxEnablePeerAccess", C.mbcall_cuCtxEnablePeerAccess(d.fn["cuCtxEnablePeerAccess"], unsafe.Pointer(peer), 0))
}

// StreamPriorities is the current context's range (least, greatest): the
// greatest priority is the lowest number.
func (d *Driver) StreamPriorities() (least, greatest int, err error) {
	var l, g C.int
	err = d.check("cuCtxGetStreamPriorityRange", C.mbcall_cuCtxGetStreamPriorityRange(d.fn["cuCtxGetStreamPriorityRange"], &l, &g))
	return int(l), int(g), err
}

// NewStream creates a non-blocking stream with a priority.
func (d *Driver) NewStream(priority int) (Stream, error) {
	var s unsafe.Pointer
	err := d.check("cuStreamCreateWithPriority", C.mbcall_cuStreamCreateWithPriority(d.fn["cuStreamCreateWithPriority"], &s, streamNonBlocking, C.int(priority)))
	return Stream(s), err
}

// DestroyStream destroys s.
func (d *Driver) DestroyStream(s Stream) error {
	return d.check("cuStreamDestroy_v2", C.mbcall_cuStreamDestroy_v2(d.fn["cuStreamDestroy_v2"], unsafe.Pointer(s)))
}

// SyncStream waits for s.
func (d *Driver) SyncStream(s Stream) error {
	return d.check("cuStreamSynchronize", C.mbcall_cuStreamSynchronize(d.fn["cuStreamSynchronize"], unsafe.Pointer(s)))
}

// WaitEvent makes s wait for e.
func (d *Driver) WaitEvent(s Stream, e Event) error {
	return d.check("cuStreamWaitEvent", C.mbcall_cuStreamWaitEvent(d.fn["cuStreamWaitEvent"], unsafe.Pointer(s), unsafe.Pointer(e), 0))
}

// NewEvent creates a timing event.
func (d *Driver) NewEvent() (Event, error) {
	var e unsafe.Pointer
	err := d.check("cuEventCreate", C.mbcall_cuEventCreate(d.fn["cuEventCreate"], &e, 0))
	return Event(e), err
}

// DestroyEvent destroys e.
func (d *Driver) DestroyEvent(e Event) error {
	return d.check("cuEventDestroy_v2", C.mbcall_cuEventDestroy_v2(d.fn["cuEventDestroy_v2"], unsafe.Pointer(e)))
}

// Record records e on s.
func (d *Driver) Record(e Event, s Stream) error {
	return d.check("cuEventRecord", C.mbcall_cuEventRecord(d.fn["cuEventRecord"], unsafe.Pointer(e), unsafe.Pointer(s)))
}

// SyncEvent waits for e.
func (d *Driver) SyncEvent(e Event) error {
	return d.check("cuEventSynchronize", C.mbcall_cuEventSynchronize(d.fn["cuEventSynchronize"], unsafe.Pointer(e)))
}

// Elapsed is the time between two recorded events, in milliseconds.
func (d *Driver) Elapsed(start, end Event) (float32, error) {
	var ms C.float
	err := d.check("cuEventElapsedTime", C.mbcall_cuEventElapsedTime_v2(d.fn["cuEventElapsedTime_v2"], &ms, unsafe.Pointer(start), unsafe.Pointer(end)))
	return float32(ms), err
}

// Alloc allocates n bytes of device memory (plain cuMemAlloc, never managed).
func (d *Driver) Alloc(n int64) (DevicePtr, error) {
	var p C.mb_dptr
	err := d.check(fmt.Sprintf("cuMemAlloc_v2(%d bytes)", n), C.mbcall_cuMemAlloc_v2(d.fn["cuMemAlloc_v2"], &p, C.size_t(n)))
	return DevicePtr(p), err
}

// Free frees device memory.
func (d *Driver) Free(p DevicePtr) error {
	return d.check("cuMemFree_v2", C.mbcall_cuMemFree_v2(d.fn["cuMemFree_v2"], C.mb_dptr(p)))
}

// HostAlloc allocates n bytes of page-locked host memory (cuMemHostAlloc)
// with flags (HostAlloc*); free it with FreeHost.
func (d *Driver) HostAlloc(n int64, flags uint32) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	err := d.check(fmt.Sprintf("cuMemHostAlloc(%d bytes, flags %#x)", n, flags), C.mbcall_cuMemHostAlloc(d.fn["cuMemHostAlloc"], &p, C.size_t(n), C.uint(flags)))
	return p, err
}

// HostDevicePtr is the device address of mapped host memory p (allocated
// with HostAllocDeviceMap).
func (d *Driver) HostDevicePtr(p unsafe.Pointer) (DevicePtr, error) {
	var dp C.mb_dptr
	err := d.check("cuMemHostGetDevicePointer_v2", C.mbcall_cuMemHostGetDevicePointer_v2(d.fn["cuMemHostGetDevicePointer_v2"], &dp, p, 0))
	return DevicePtr(dp), err
}

// FreeHost frees memory of HostAlloc.
func (d *Driver) FreeHost(p unsafe.Pointer) error {
	return d.check("cuMemFreeHost", C.mbcall_cuMemFreeHost(d.fn["cuMemFreeHost"], p))
}

// Occupancy is how many blocks of f (block threads, sharedBytes of dynamic
// shared memory each) one SM holds at once
// (cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, default flags).
func (d *Driver) Occupancy(f Function, block, sharedBytes int) (int, error) {
	var n C.int
	err := d.check("cuOccupancyMaxActiveBlocksPerMultiprocessor", C.mbcall_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(d.fn["cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"], &n, unsafe.Pointer(f), C.int(block), C.size_t(sharedBytes), 0))
	return int(n), err
}

// FuncAttribute reads an attribute of f (FuncAttr*).
func (d *Driver) FuncAttribute(f Function, attr int) (int, error) {
	var v C.int
	err := d.check(fmt.Sprintf("cuFuncGetAttribute(%d)", attr), C.mbcall_cuFuncGetAttribute(d.fn["cuFuncGetAttribute"], &v, C.int(attr), unsafe.Pointer(f)))
	return int(v), err
}

// MemInfo is the free and total device memory of the current context.
func (d *Driver) MemInfo() (free, total int64, err error) {
	var f, t C.size_t
	err = d.check("cuMemGetInfo_v2", C.mbcall_cuMemGetInfo_v2(d.fn["cuMemGetInfo_v2"], &f, &t))
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
	return d.check("cuMemcpyHtoDAsync_v2", C.mbcall_cuMemcpyHtoDAsync_v2(d.fn["cuMemcpyHtoDAsync_v2"], C.mb_dptr(dst), unsafe.Pointer(&src[0]), n, unsafe.Pointer(s)))
}

// CopyFromDevice copies len(dst) elements from src into host memory on s.
func CopyFromDevice[T any](d *Driver, dst []T, src DevicePtr, s Stream) error {
	if len(dst) == 0 {
		return nil
	}
	n := C.size_t(len(dst)) * C.size_t(unsafe.Sizeof(dst[0]))
	return d.check("cuMemcpyDtoHAsync_v2", C.mbcall_cuMemcpyDtoHAsync_v2(d.fn["cuMemcpyDtoHAsync_v2"], unsafe.Pointer(&dst[0]), C.mb_dptr(src), n, unsafe.Pointer(s)))
}

// CopyDevice copies n bytes between device buffers of one context on s.
func (d *Driver) CopyDevice(dst, src DevicePtr, n int64, s Stream) error {
	return d.check("cuMemcpyDtoDAsync_v2", C.mbcall_cuMemcpyDtoDAsync_v2(d.fn["cuMemcpyDtoDAsync_v2"], C.mb_dptr(dst), C.mb_dptr(src), C.size_t(n), unsafe.Pointer(s)))
}

// CopyPeer copies n bytes from src in srcCtx to dst in dstCtx on s.
func (d *Driver) CopyPeer(dst DevicePtr, dstCtx Context, src DevicePtr, srcCtx Context, n int64, s Stream) error {
	return d.check("cuMemcpyPeerAsync", C.mbcall_cuMemcpyPeerAsync(d.fn["cuMemcpyPeerAsync"], C.mb_dptr(dst), unsafe.Pointer(dstCtx),
		C.mb_dptr(src), unsafe.Pointer(srcCtx), C.size_t(n), unsafe.Pointer(s)))
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
		flags = memcpyPreferOverlap
	}
	v2 := C.int(0)
	if name == optionalSymbols[0] {
		v2 = 1
	}
	p := (*C.mb_dptr)(mem)
	return d.check(name, C.c_batch(d.fn[name], v2, p, (*C.mb_dptr)(unsafe.Add(mem, 8*n)), (*C.size_t)(unsafe.Add(mem, 16*n)),
		C.size_t(n), C.int(srcDev), C.int(dstDev), flags, unsafe.Pointer(s)))
}

// Fill16 sets n 16-bit words at p to v on s (e.g. poisoning bf16 with NaN 0x7fc0).
func (d *Driver) Fill16(p DevicePtr, v uint16, n int64, s Stream) error {
	return d.check("cuMemsetD16Async", C.mbcall_cuMemsetD16Async(d.fn["cuMemsetD16Async"], C.mb_dptr(p), C.ushort(v), C.size_t(n), unsafe.Pointer(s)))
}

// LoadModule loads a cubin.
func (d *Driver) LoadModule(image []byte) (Module, error) {
	if len(image) == 0 {
		return nil, fmt.Errorf("cuModuleLoadData: empty image")
	}
	img := C.CBytes(image)
	defer C.free(img)
	var m unsafe.Pointer
	err := d.check("cuModuleLoadData", C.mbcall_cuModuleLoadData(d.fn["cuModuleLoadData"], &m, img))
	return Module(m), err
}

// UnloadModule unloads m.
func (d *Driver) UnloadModule(m Module) error {
	return d.check("cuModuleUnload", C.mbcall_cuModuleUnload(d.fn["cuModuleUnload"], unsafe.Pointer(m)))
}

// Function looks a kernel up by name.
func (d *Driver) Function(m Module, name string) (Function, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var f unsafe.Pointer
	err := d.check("cuModuleGetFunction("+name+")", C.mbcall_cuModuleGetFunction(d.fn["cuModuleGetFunction"], &f, unsafe.Pointer(m), cs))
	return Function(f), err
}

// SetMaxDynamicShared lets f use more than 48 KB of dynamic shared memory.
func (d *Driver) SetMaxDynamicShared(f Function, bytes int) error {
	return d.check("cuFuncSetAttribute", C.mbcall_cuFuncSetAttribute(d.fn["cuFuncSetAttribute"], unsafe.Pointer(f), FuncAttrMaxDynamicShared, C.int(bytes)))
}

// Launch runs f on s. Each argument is a device pointer, an int32, a
// uint32, a float32, a uint64 or an int64, or the bytes of a struct
// (Bytes), passed by value (see params). LaunchArgs is the same without
// boxing the arguments (for launches on every step).
func (d *Driver) Launch(f Function, grid, block [3]uint32, sharedBytes uint32, s Stream, args ...any) error {
	as, err := argsOf("cuLaunchKernel", args)
	if err != nil {
		return err
	}
	return d.LaunchArgs(f, grid, block, sharedBytes, s, as...)
}

// LaunchArgs is Launch with typed arguments (see Arg).
func (d *Driver) LaunchArgs(f Function, grid, block [3]uint32, sharedBytes uint32, s Stream, args ...Arg) error {
	p := d.params(args)
	r := C.mbcall_cuLaunchKernel(d.fn["cuLaunchKernel"], unsafe.Pointer(f), C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]),
		C.uint(block[0]), C.uint(block[1]), C.uint(block[2]), C.uint(sharedBytes), unsafe.Pointer(s), p, nil)
	d.pmu.Unlock()
	return d.check("cuLaunchKernel", r)
}

// LaunchCooperative runs f on s with every block resident at once, so that
// the grid may synchronize as a whole (cuLaunchCooperativeKernel; the grid
// must fit on the GPU at once, else the driver refuses it).
func (d *Driver) LaunchCooperative(f Function, grid, block [3]uint32, sharedBytes uint32, s Stream, args ...any) error {
	as, err := argsOf("cuLaunchCooperativeKernel", args)
	if err != nil {
		return err
	}
	p := d.params(as)
	r := C.mbcall_cuLaunchCooperativeKernel(d.fn["cuLaunchCooperativeKernel"], unsafe.Pointer(f), C.uint(grid[0]), C.uint(grid[1]),
		C.uint(grid[2]), C.uint(block[0]), C.uint(block[1]), C.uint(block[2]), C.uint(sharedBytes), unsafe.Pointer(s), p)
	d.pmu.Unlock()
	return d.check("cuLaunchCooperativeKernel", r)
}

// LaunchOptions are what LaunchEx adds to a plain launch.
type LaunchOptions struct {
	Cooperative bool      // every block resident at once (grid-wide sync)
	Cluster     [3]uint32 // thread-block cluster shape (sm_90 and later); zero: no clusters
}

// LaunchEx runs f on s through cuLaunchKernelEx with opt's attributes; it
// fails when the driver has no cuLaunchKernelEx (before CUDA 11.8).
func (d *Driver) LaunchEx(f Function, grid, block [3]uint32, sharedBytes uint32, s Stream, opt LaunchOptions, args ...any) error {
	if d.fn[launchEx] == nil {
		return fmt.Errorf("%s: not in this driver (CUDA 11.8 or later has it)", launchEx)
	}
	if opt.Cluster != [3]uint32{} && (opt.Cluster[0] == 0 || opt.Cluster[1] == 0 || opt.Cluster[2] == 0) {
		return fmt.Errorf("%s: cluster %v has a zero dimension", launchEx, opt.Cluster)
	}
	coop := C.int(0)
	if opt.Cooperative {
		coop = 1
	}
	as, err := argsOf(launchEx, args)
	if err != nil {
		return err
	}
	p := d.params(as)
	r := C.c_launchex(d.fn[launchEx], unsafe.Pointer(f), C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]),
		C.uint(block[0]), C.uint(block[1]), C.uint(block[2]), C.uint(sharedBytes), unsafe.Pointer(s), p, coop,
		C.uint(opt.Cluster[0]), C.uint(opt.Cluster[1]), C.uint(opt.Cluster[2]))
	d.pmu.Unlock()
	return d.check(launchEx, r)
}

// Bytes is a kernel argument passed by value as its bytes: a struct laid
// out as the kernel declares it (8-byte aligned at most).
type Bytes []byte

// Arg is one kernel argument by value, typed so that passing it boxes
// nothing: P, I32, U32, F32, U64, I64 or Struct makes one.
type Arg struct {
	v uint64 // the value's bits
	n uint8  // its bytes: 4 or 8; 0 for a struct
	b Bytes  // a struct's bytes
}

// Kernel arguments of each type.
func P(p DevicePtr) Arg  { return Arg{v: uint64(p), n: 8} }
func I32(x int32) Arg    { return Arg{v: uint64(uint32(x)), n: 4} }
func U32(x uint32) Arg   { return Arg{v: uint64(x), n: 4} }
func F32(x float32) Arg  { return Arg{v: uint64(math.Float32bits(x)), n: 4} }
func U64(x uint64) Arg   { return Arg{v: x, n: 8} }
func I64(x int64) Arg    { return Arg{v: uint64(x), n: 8} }
func Struct(b Bytes) Arg { return Arg{b: b} }

// argsOf converts Launch's untyped arguments.
func argsOf(call string, args []any) ([]Arg, error) {
	out := make([]Arg, len(args))
	for i, a := range args {
		switch x := a.(type) {
		case uint64:
			out[i] = U64(x)
		case int64:
			out[i] = I64(x)
		case Bytes:
			out[i] = Struct(x)
		case DevicePtr:
			out[i] = P(x)
		case int32:
			out[i] = I32(x)
		case uint32:
			out[i] = U32(x)
		case float32:
			out[i] = F32(x)
		default:
			return nil, fmt.Errorf("%s: argument %d has unsupported type %T", call, i, a)
		}
	}
	return out, nil
}

// params copies kernel arguments to the driver's block of C memory, which
// is kept and grown as needed (a launch copies its arguments, so the block
// is free again when it returns): the parameter pointers, then a slot per
// value, 8 bytes or a struct's length rounded up to 8. It returns with
// d.pmu held, for the caller to release after the launch.
func (d *Driver) params(args []Arg) *unsafe.Pointer {
	n := len(args)
	const slot = 8
	size := max(n, 1) * 2 * slot
	for _, a := range args {
		size += (len(a.b) + slot - 1) / slot * slot
	}
	d.pmu.Lock()
	if size > d.pcap {
		C.free(d.pmem)
		d.pmem, d.pcap = C.malloc(C.size_t(max(size, 512))), max(size, 512)
	}
	mem := d.pmem
	ps := unsafe.Slice((*unsafe.Pointer)(mem), max(n, 1))
	extra := 2 * n * slot // where the next struct goes
	for i, a := range args {
		v := unsafe.Add(mem, (n+i)*slot)
		switch a.n {
		case 4:
			*(*uint32)(v) = uint32(a.v)
		case 8:
			*(*uint64)(v) = a.v
		default:
			v = unsafe.Add(mem, extra)
			copy(unsafe.Slice((*byte)(v), len(a.b)), a.b)
			extra += (len(a.b) + slot - 1) / slot * slot
		}
		ps[i] = v
	}
	return &ps[0]
}
