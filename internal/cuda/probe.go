// Package cuda opens the CUDA libraries at run time with dlopen — no cuda.h,
// no toolkit at build time — through small cgo trampolines over moebench's
// own prototypes: the driver (so far a probe for the driver and its GPUs) and
// NVRTC. A missing library is an ordinary error, never a crash.
package cuda

/*
typedef int (*fn_u)(unsigned int);
typedef int (*fn_pi)(int *);
typedef int (*fn_name)(char *, int, int);
typedef int (*fn_dev)(int *, int);

static int call_u(void *f, unsigned int a) { return ((fn_u)f)(a); }
static int call_pi(void *f, int *a) { return ((fn_pi)f)(a); }
static int call_name(void *f, char *s, int n, int d) { return ((fn_name)f)(s, n, d); }
static int call_dev(void *f, int *d, int i) { return ((fn_dev)f)(d, i); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// GPU is one device the driver reports.
type GPU struct {
	Ordinal int
	Name    string
}

// Probe reports the driver's version (e.g. 13000 for CUDA 13.0) and its GPUs.
// An error says what was missing: the library, a symbol, or cuInit's status.
// MOEBENCH_LIBCUDA overrides where libcuda.so.1 is looked for.
func Probe() (driver int, gpus []GPU, err error) {
	lib, err := openLibrary("MOEBENCH_LIBCUDA", "libcuda.so.1")
	if err != nil {
		return 0, nil, err
	}
	syms := map[string]unsafe.Pointer{}
	for _, n := range []string{"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName"} {
		if syms[n], err = lib.sym(n); err != nil {
			return 0, nil, err
		}
	}
	if st := C.call_u(syms["cuInit"], 0); st != 0 {
		return 0, nil, fmt.Errorf("cuInit: CUDA error %d", int(st))
	}
	var v, n C.int
	if st := C.call_pi(syms["cuDriverGetVersion"], &v); st != 0 {
		return 0, nil, fmt.Errorf("cuDriverGetVersion: CUDA error %d", int(st))
	}
	if st := C.call_pi(syms["cuDeviceGetCount"], &n); st != 0 {
		return int(v), nil, fmt.Errorf("cuDeviceGetCount: CUDA error %d", int(st))
	}
	for i := range int(n) {
		var dev C.int
		if st := C.call_dev(syms["cuDeviceGet"], &dev, C.int(i)); st != 0 {
			return int(v), gpus, fmt.Errorf("cuDeviceGet(%d): CUDA error %d", i, int(st))
		}
		buf := make([]byte, 256)
		if st := C.call_name(syms["cuDeviceGetName"], (*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf)), dev); st != 0 {
			return int(v), gpus, fmt.Errorf("cuDeviceGetName(%d): CUDA error %d", i, int(st))
		}
		gpus = append(gpus, GPU{Ordinal: i, Name: C.GoString((*C.char)(unsafe.Pointer(&buf[0])))})
	}
	return int(v), gpus, nil
}
