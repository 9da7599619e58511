package cuda

/*
#cgo LDFLAGS: -ldl
#cgo CFLAGS: -I${SRCDIR}/abi
#include <dlfcn.h>
#include <stdlib.h>
#include "abi.h"
*/
import "C"

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"unsafe"
)

// library is a dlopen'ed shared library.
type library struct {
	handle unsafe.Pointer
	path   string
}

// searchDirs are where CUDA libraries are looked for after the loader's own
// path: CUDA toolkit folders ($CUDA_HOME's too) and the Python wheels'
// nvidia/*/lib folders and nccl/*/lib folders (NCCL EP's: the
// nccl-extensions and nccl4py wheels' nccl/ep/lib), of the system, the
// user, the environment of the python3 on the path — a virtual
// environment's need not be activated —, the active virtual or conda
// environment (and a conda environment's lib), and /opt/conda.
func searchDirs() []string {
	var dirs []string
	pats := []string{"/usr/local/cuda/lib64", "/usr/local/cuda-*/lib64", "/usr/local/cuda/targets/*/lib"}
	for _, home := range []string{os.Getenv("CUDA_HOME"), os.Getenv("CUDA_PATH")} {
		if home != "" {
			pats = append(pats, home+"/lib64", home+"/lib")
		}
	}
	var sites []string // site-packages folders
	sites = append(sites, "/usr/local/lib/python3*/dist-packages", "/usr/lib/python3/dist-packages",
		"/usr/local/lib/python3*/site-packages", os.Getenv("HOME")+"/.local/lib/python3*/site-packages")
	envs := []string{os.Getenv("VIRTUAL_ENV"), os.Getenv("CONDA_PREFIX"), "/opt/conda"}
	if py, err := exec.LookPath("python3"); err == nil { // PREFIX/bin/python3, not resolved: a venv's is a link
		envs = append([]string{filepath.Dir(filepath.Dir(py))}, envs...)
	}
	for _, env := range envs {
		if env != "" && env != "/usr" && env != "/usr/local" { // those are searched above
			sites = append(sites, env+"/lib/python3*/site-packages")
		}
	}
	for _, site := range sites {
		pats = append(pats, site+"/nvidia/*/lib", site+"/nccl/*/lib")
	}
	if p := os.Getenv("CONDA_PREFIX"); p != "" {
		pats = append(pats, p+"/lib")
	}
	for _, pat := range pats {
		m, _ := filepath.Glob(pat)
		sort.Sort(sort.Reverse(sort.StringSlice(m))) // newest versions first
		dirs = append(dirs, m...)
	}
	return dirs
}

// LibDirsEnv names folders (a path list) searched for every CUDA library
// before the loader's path; moebench's --cuda-libs flag sets it.
const LibDirsEnv = "MOEBENCH_CUDA_LIBS"

// InLibDirs is the first file called name in the folders of LibDirsEnv, or
// "" (for libraries opened elsewhere: go-nvml's).
func InLibDirs(name string) string {
	if c := candidates(filepath.SplitList(os.Getenv(LibDirsEnv)), name); len(c) > 0 {
		return c[0]
	}
	return ""
}

// candidates are the files called one of names in dirs that exist, folder
// by folder (empty folder names are skipped).
func candidates(dirs []string, names ...string) []string {
	var c []string
	for _, d := range dirs {
		for _, n := range names {
			if p := filepath.Join(d, n); d != "" {
				if _, err := os.Stat(p); err == nil {
					c = append(c, p)
				}
			}
		}
	}
	return c
}

// openLibrary loads the first library that opens: the file named by the
// environment variable env if set (and only it), else each name in the
// folders of LibDirsEnv, through the loader's path, then in searchDirs. The
// error lists what was tried.
func openLibrary(env string, names ...string) (*library, error) {
	return openPreferred(env, [][]string{names})
}

// openPreferred is openLibrary over groups of names, in order of
// preference: a group is looked for everywhere (LibDirsEnv, the loader's
// path, searchDirs) before the next is, so that a library of the major the
// driver supports found late in the search wins over another major found
// early (see majors).
func openPreferred(env string, groups [][]string) (*library, error) {
	var tried []string
	try := func(p string) *library {
		cs := C.CString(p)
		defer C.free(unsafe.Pointer(cs))
		if h := C.dlopen(cs, C.RTLD_NOW|C.RTLD_GLOBAL); h != nil {
			return &library{handle: h, path: p}
		}
		tried = append(tried, strings.TrimPrefix(C.GoString(C.dlerror()), p+": "))
		return nil
	}
	if p := os.Getenv(env); p != "" {
		if l := try(p); l != nil {
			return l, nil
		}
		return nil, fmt.Errorf("%s=%s does not load: %s", env, p, tried[0])
	}
	inDirs := func(dirs, names []string) *library {
		for _, p := range candidates(dirs, names...) {
			if l := try(p); l != nil {
				return l
			}
		}
		return nil
	}
	var all []string
	for _, names := range groups {
		all = append(all, names...)
		if l := inDirs(filepath.SplitList(os.Getenv(LibDirsEnv)), names); l != nil {
			return l, nil
		}
		for _, n := range names {
			if l := try(n); l != nil {
				return l, nil
			}
		}
		if l := inDirs(searchDirs(), names); l != nil {
			return l, nil
		}
	}
	return nil, fmt.Errorf("%s not found (%s; %s may name it, or --cuda-libs its folder)", strings.Join(all, " or "), tried[len(tried)-1], env)
}

// majors orders the sonames of a CUDA library (lib: "libnvrtc",
// "libcublasLt", "libcublas") by preference: first the major of the CUDA
// driver here (cuDriverGetVersion: a CUDA 12 driver cannot run a CUDA 13
// library), then the others, newest first; without a driver (NVRTC compiles
// without one), newest first.
func majors(lib string, sonames map[int][]string) [][]string {
	order := []int{13, 12, 11}
	if v, err := driverVersion(); err == nil {
		if m := v / 1000; sonames[m] != nil {
			order = append([]int{m}, slices.DeleteFunc(order, func(x int) bool { return x == m })...)
		}
	}
	var groups [][]string
	for _, m := range order {
		if s, ok := sonames[m]; ok {
			groups = append(groups, s)
		}
	}
	return append(groups, []string{lib + ".so"})
}

// driverVersion asks libcuda (MOEBENCH_LIBCUDA, as OpenDriver finds it) for
// the CUDA version it supports, without initializing it.
func driverVersion() (int, error) {
	lib, err := openLibrary("MOEBENCH_LIBCUDA", "libcuda.so.1")
	if err != nil {
		return 0, err
	}
	f, err := lib.sym("cuDriverGetVersion")
	if err != nil {
		return 0, err
	}
	var v C.int
	if r := C.mbcall_cuDriverGetVersion(f, &v); r != 0 {
		return 0, fmt.Errorf("cuDriverGetVersion: error %d", int(r))
	}
	return int(v), nil
}

// sym returns a symbol's address or an error naming it.
func (l *library) sym(name string) (unsafe.Pointer, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	p := C.dlsym(l.handle, cs)
	if p == nil {
		return nil, fmt.Errorf("%s: symbol %s missing", l.path, name)
	}
	return p, nil
}
