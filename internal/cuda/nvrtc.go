package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/abi
#include <stdlib.h>
#include "abi.h"
*/
import "C"

import (
	"fmt"
	"slices"
	"strings"
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
	nvrtcOnce.Do(func() { nvrtcLib, nvrtcErr = openNVRTC() })
	return nvrtcLib, nvrtcErr
}

// openNVRTC is OpenNVRTC without the cache.
func openNVRTC() (*NVRTC, error) {
	lib, err := openPreferred("MOEBENCH_NVRTC", majors("libnvrtc", nvrtcSonames))
	if err != nil {
		return nil, err
	}
	n := &NVRTC{Path: lib.path, fn: map[string]unsafe.Pointer{}}
	for _, s := range []string{"nvrtcVersion", "nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize",
		"nvrtcGetProgramLog", "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcGetPTXSize", "nvrtcGetPTX", "nvrtcDestroyProgram",
		"nvrtcGetErrorString"} {
		if n.fn[s], err = lib.sym(s); err != nil {
			return nil, err
		}
	}
	for _, s := range []string{"nvrtcGetNumSupportedArchs", "nvrtcGetSupportedArchs"} { // NVRTC 11.2 and later
		n.fn[s], _ = lib.sym(s)
	}
	var a, b C.int
	if r := C.mbcall_nvrtcVersion(n.fn["nvrtcVersion"], &a, &b); r != 0 {
		return nil, n.err("nvrtcVersion", r)
	}
	n.Major, n.Minor = int(a), int(b)
	return n, nil
}

// SupportedArchs are the architectures this NVRTC compiles for (compute
// capability × 10, e.g. 90), ascending (nvrtcGetSupportedArchs); an error
// when it cannot say (before NVRTC 11.2).
func (n *NVRTC) SupportedArchs() ([]int, error) {
	if n.fn["nvrtcGetSupportedArchs"] == nil || n.fn["nvrtcGetNumSupportedArchs"] == nil {
		return nil, fmt.Errorf("%s: NVRTC %d.%d cannot list its architectures (11.2 or later can)", n.Path, n.Major, n.Minor)
	}
	var c C.int
	if r := C.mbcall_nvrtcGetNumSupportedArchs(n.fn["nvrtcGetNumSupportedArchs"], &c); r != 0 {
		return nil, n.err("nvrtcGetNumSupportedArchs", r)
	}
	if c <= 0 || c > 1024 {
		return nil, fmt.Errorf("nvrtcGetNumSupportedArchs: %d architectures", int(c))
	}
	archs := make([]C.int, c)
	if r := C.mbcall_nvrtcGetSupportedArchs(n.fn["nvrtcGetSupportedArchs"], &archs[0]); r != 0 {
		return nil, n.err("nvrtcGetSupportedArchs", r)
	}
	out := make([]int, c)
	for i, a := range archs {
		out[i] = int(a)
	}
	slices.Sort(out)
	return out, nil
}

// ID names NVRTC and its version, e.g. "nvrtc 12.8".
func (n *NVRTC) ID() string { return fmt.Sprintf("nvrtc %d.%d", n.Major, n.Minor) }

// GPU is true: NVRTC's images run on a GPU.
func (n *NVRTC) GPU() bool { return true }

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
// contents, for #include "name") and options, and returns the cubin — or,
// when the options ask for a virtual architecture
// (--gpu-architecture=compute_XY), the PTX text, NUL-terminated, which the
// driver compiles when the module is loaded.
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
	sizeCall, getCall := "nvrtcGetCUBINSize", "nvrtcGetCUBIN"
	if slices.ContainsFunc(options, func(o string) bool { return strings.HasPrefix(o, "--gpu-architecture=compute_") }) {
		sizeCall, getCall = "nvrtcGetPTXSize", "nvrtcGetPTX"
	}
	var size C.size_t
	r := C.int(0)
	if sizeCall == "nvrtcGetPTXSize" {
		r = C.mbcall_nvrtcGetPTXSize(n.fn[sizeCall], prog, &size)
	} else {
		r = C.mbcall_nvrtcGetCUBINSize(n.fn[sizeCall], prog, &size)
	}
	if r != 0 {
		return nil, n.err(sizeCall, r)
	}
	if size == 0 {
		return nil, fmt.Errorf("compile %s: NVRTC produced no image (%s: 0 bytes)", name, sizeCall)
	}
	image := make([]byte, size)
	if getCall == "nvrtcGetPTX" {
		r = C.mbcall_nvrtcGetPTX(n.fn[getCall], prog, (*C.char)(unsafe.Pointer(&image[0])))
	} else {
		r = C.mbcall_nvrtcGetCUBIN(n.fn[getCall], prog, (*C.char)(unsafe.Pointer(&image[0])))
	}
	if r != 0 {
		return nil, n.err(getCall, r)
	}
	return image, nil
}
