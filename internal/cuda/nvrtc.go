package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/abi
#include <stdlib.h>
#include "abi.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// NVRTC is the runtime compiler, opened with dlopen.
type NVRTC struct {
	Path         string
	Major, Minor int
	fn           map[string]unsafe.Pointer
}

var (
	nvrtcOnce sync.Once
	nvrtcLib  *NVRTC
	nvrtcErr  error
)

// nvrtcSonames are NVRTC's sonames by CUDA major.
var nvrtcSonames = map[int][]string{13: {"libnvrtc.so.13"}, 12: {"libnvrtc.so.12"}, 11: {"libnvrtc.so.11.2"}}

// OpenNVRTC loads libnvrtc (once): MOEBENCH_NVRTC names the file, else the
// major of the CUDA driver is looked for first (see majors), then the others.
func OpenNVRTC() (*NVRTC, error) {
	nvrtcOnce.Do(func() {
		groups := majors("libnvrtc", nvrtcSonames)
		lib, err := openPreferred("MOEBENCH_NVRTC", groups)
		if err != nil {
			nvrtcErr = err
			return
		}
		n := &NVRTC{Path: lib.path, fn: map[string]unsafe.Pointer{}}
		for _, s := range []string{"nvrtcVersion", "nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize",
			"nvrtcGetProgramLog", "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcDestroyProgram", "nvrtcGetErrorString"} {
			if n.fn[s], err = lib.sym(s); err != nil {
				nvrtcErr = err
				return
			}
		}
		var a, b C.int
		if r := C.mbcall_nvrtcVersion(n.fn["nvrtcVersion"], &a, &b); r != 0 {
			nvrtcErr = n.err("nvrtcVersion", r)
			return
		}
		n.Major, n.Minor = int(a), int(b)
		nvrtcLib = n
	})
	return nvrtcLib, nvrtcErr
}

// ID names NVRTC and its version, e.g. "nvrtc 12.8".
func (n *NVRTC) ID() string { return fmt.Sprintf("nvrtc %d.%d", n.Major, n.Minor) }

func (n *NVRTC) err(call string, r C.int) error {
	return fmt.Errorf("%s: %s (%d)", call, C.GoString(C.mbcall_nvrtcGetErrorString(n.fn["nvrtcGetErrorString"], r)), int(r))
}

// CompileError is a compilation that failed, with NVRTC's log.
type CompileError struct {
	Name, Log string
	Err       error
}

func (e *CompileError) Error() string { return fmt.Sprintf("compile %s: %v\n%s", e.Name, e.Err, e.Log) }

// Compile compiles CUDA C source name with the given headers (name →
// contents, for #include "name") and options, and returns the cubin.
func (n *NVRTC) Compile(name, source string, headers map[string]string, options []string) ([]byte, error) {
	cstr := func(s string) *C.char { return C.CString(s) }
	src, cname := cstr(source), cstr(name)
	defer C.free(unsafe.Pointer(src))
	defer C.free(unsafe.Pointer(cname))
	cArray := func(ss []string) (**C.char, func()) {
		if len(ss) == 0 {
			return nil, func() {}
		}
		arr := (*[1 << 20]*C.char)(C.malloc(C.size_t(len(ss)) * C.size_t(unsafe.Sizeof(uintptr(0)))))[:len(ss):len(ss)]
		for i, s := range ss {
			arr[i] = cstr(s)
		}
		return &arr[0], func() {
			for _, p := range arr {
				C.free(unsafe.Pointer(p))
			}
			C.free(unsafe.Pointer(&arr[0]))
		}
	}
	var hnames, hsrcs []string
	for k, v := range headers {
		hnames, hsrcs = append(hnames, k), append(hsrcs, v)
	}
	hs, freeH := cArray(hsrcs)
	defer freeH()
	hn, freeN := cArray(hnames)
	defer freeN()
	opts, freeO := cArray(options)
	defer freeO()
	var prog unsafe.Pointer
	if r := C.mbcall_nvrtcCreateProgram(n.fn["nvrtcCreateProgram"], &prog, src, cname, C.int(len(headers)), hs, hn); r != 0 {
		return nil, n.err("nvrtcCreateProgram", r)
	}
	defer C.mbcall_nvrtcDestroyProgram(n.fn["nvrtcDestroyProgram"], &prog)
	cr := C.mbcall_nvrtcCompileProgram(n.fn["nvrtcCompileProgram"], prog, C.int(len(options)), opts)
	var logSize C.size_t
	log := ""
	if C.mbcall_nvrtcGetProgramLogSize(n.fn["nvrtcGetProgramLogSize"], prog, &logSize) == 0 && logSize > 1 {
		buf := make([]byte, logSize)
		if C.mbcall_nvrtcGetProgramLog(n.fn["nvrtcGetProgramLog"], prog, (*C.char)(unsafe.Pointer(&buf[0]))) == 0 {
			log = string(buf[:logSize-1])
		}
	}
	if cr != 0 {
		return nil, &CompileError{Name: name, Log: log, Err: n.err("nvrtcCompileProgram", cr)}
	}
	var size C.size_t
	if r := C.mbcall_nvrtcGetCUBINSize(n.fn["nvrtcGetCUBINSize"], prog, &size); r != 0 {
		return nil, n.err("nvrtcGetCUBINSize", r)
	}
	if size == 0 {
		return nil, fmt.Errorf("compile %s: NVRTC produced no cubin (compile for a real sm_XX architecture)", name)
	}
	cubin := make([]byte, size)
	if r := C.mbcall_nvrtcGetCUBIN(n.fn["nvrtcGetCUBIN"], prog, (*C.char)(unsafe.Pointer(&cubin[0]))); r != 0 {
		return nil, n.err("nvrtcGetCUBIN", r)
	}
	return cubin, nil
}
