package cuda

/*
#include <stddef.h>
typedef size_t (*fn_szv)(void);
typedef int (*fn_iptr)(int *);
typedef int (*fn_void)(void);
typedef int (*fn_str)(char *, unsigned int);
static size_t call_szv(void *f) { return ((fn_szv)f)(); }
static int call_iptr(void *f, int *v) { return ((fn_iptr)f)(v); }
static int call_void(void *f) { return ((fn_void)f)(); }
static int call_str(void *f, char *s, unsigned int n) { return ((fn_str)f)(s, n); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Component is one library or device moebench can use, as found here.
type Component struct {
	Name    string
	Found   bool
	Path    string // as loaded: a file, or a name resolved by the loader's path
	Version string
	Detail  string // what it offers, or why it is missing
}

// Doctor probes every CUDA library moebench uses and the GPUs; nothing it
// finds missing is an error: it says why.
func Doctor() []Component {
	var out []Component
	drv, gpus, err := Probe()
	c := Component{Name: "driver (libcuda)"}
	switch {
	case err != nil:
		c.Detail = err.Error()
	default:
		c.Found, c.Version = true, fmt.Sprintf("CUDA %d.%d", drv/1000, drv%1000/10)
		c.Detail = fmt.Sprintf("%d GPU(s)", len(gpus))
		for _, g := range gpus {
			c.Detail += fmt.Sprintf("; %d: %s", g.Ordinal, g.Name)
		}
	}
	out = append(out, c)

	c = Component{Name: "NVRTC"}
	if n, err := OpenNVRTC(); err != nil {
		c.Detail = err.Error()
	} else {
		c.Found, c.Path, c.Version, c.Detail = true, n.Path, fmt.Sprintf("%d.%d", n.Major, n.Minor), "compiles the kernels"
	}
	out = append(out, c)

	out = append(out, probeVersion("cuBLASLt", "MOEBENCH_CUBLASLT", "cublasLtGetVersion", true,
		"expert and router GEMMs", "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", "libcublasLt.so"))
	out = append(out, probeVersion("NCCL", "MOEBENCH_NCCL", "ncclGetVersion", false,
		"collectives between distinct GPUs and nodes", "libnccl.so.2", "libnccl.so"))

	return append(out, probeNVML())
}

// probeNVML loads NVML and reads the driver version (nvmlInit_v2,
// nvmlSystemGetDriverVersion, nvmlShutdown).
func probeNVML() Component {
	c := Component{Name: "NVML"}
	lib, err := openLibrary("MOEBENCH_NVML", "libnvidia-ml.so.1")
	if err != nil {
		c.Detail = err.Error() + "; telemetry would say \"not measured\""
		return c
	}
	syms := map[string]unsafe.Pointer{}
	for _, n := range []string{"nvmlInit_v2", "nvmlSystemGetDriverVersion", "nvmlShutdown"} {
		if syms[n], err = lib.sym(n); err != nil {
			c.Detail = err.Error()
			return c
		}
	}
	if st := C.call_void(syms["nvmlInit_v2"]); st != 0 {
		c.Detail = fmt.Sprintf("nvmlInit_v2: NVML error %d", int(st))
		return c
	}
	defer C.call_void(syms["nvmlShutdown"])
	buf := make([]byte, 96)
	if st := C.call_str(syms["nvmlSystemGetDriverVersion"], (*C.char)(unsafe.Pointer(&buf[0])), C.uint(len(buf))); st != 0 {
		c.Detail = fmt.Sprintf("nvmlSystemGetDriverVersion: NVML error %d", int(st))
		return c
	}
	c.Found, c.Path, c.Version = true, lib.path, C.GoString((*C.char)(unsafe.Pointer(&buf[0])))
	c.Detail = "telemetry: memory, clocks, power"
	return c
}

// probeVersion loads a library and reads its version: a size_t f(void)
// (sized) or an int f(int *) returning status 0.
func probeVersion(name, env, sym string, sized bool, use string, names ...string) Component {
	c := Component{Name: name}
	lib, err := openLibrary(env, names...)
	if err != nil {
		c.Detail = err.Error()
		return c
	}
	f, err := lib.sym(sym)
	if err != nil {
		c.Detail = err.Error()
		return c
	}
	c.Found, c.Path, c.Detail = true, lib.path, use
	if sized {
		c.Version = fmt.Sprint(uint64(C.call_szv(f)))
	} else {
		var v C.int
		if st := C.call_iptr(f, &v); st != 0 {
			c.Found, c.Detail = false, fmt.Sprintf("%s: error %d", sym, int(st))
			return c
		}
		c.Version = fmt.Sprint(int(v))
	}
	return c
}
