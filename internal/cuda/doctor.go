package cuda

/*
#include <stddef.h>
typedef size_t (*fn_szv)(void);
typedef int (*fn_iptr)(int *);
static size_t call_szv(void *f) { return ((fn_szv)f)(); }
static int call_iptr(void *f, int *v) { return ((fn_iptr)f)(v); }
*/
import "C"

import "fmt"

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
