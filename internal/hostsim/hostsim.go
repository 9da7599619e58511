// Package hostsim compiles moebench's CUDA kernels for the CPU, for the
// tests only. The kernel sources go, unchanged, through a C++ compiler with
// mbhost.h (CUDA's built-ins on fibers and OS threads) into a shared
// object; the fake libcuda (fakes/fakecuda.c, see BuildFake) loads it as a
// module and runs its kernels when they are launched, with the concurrency
// a GPU has: every block that fits the fake device at once on its own OS
// thread, later ones in waves, launches on different streams and fake GPUs
// overlapping in time, the memory primitives of moebench.cuh as C++
// atomics. So, without a GPU, the kernels' logic is checked against the
// host functions, cross-rank protocols (queues, barriers, timeouts) run
// against each other, and the cuda device's launches (argument order and
// types, grid and block sizes, modules, residency) are exercised end to
// end. Not checked this way: timing, the GPU's weaker memory model (the
// host's x86 orders more than PTX promises), PTX itself (moebench.cuh's
// inline PTX is replaced), real co-residency and the GPU's floating point
// to the last bit (expf).
package hostsim

import (
	"embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/internal/cuda/abi"
)

//go:embed mbhost.h
var header string

// Compiler compiles kernel sources for the CPU with a C++20 compiler; it
// satisfies kernels.Compiler.
type Compiler struct {
	CXX string // the compiler's path
}

// New finds the C++ compiler: $CXX, else c++ on the PATH.
func New() (*Compiler, error) {
	name := os.Getenv("CXX")
	if name == "" {
		name = "c++"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return nil, fmt.Errorf("hostsim: no C++ compiler (%v; set CXX)", err)
	}
	return &Compiler{CXX: p}, nil
}

// ID names the compiler (kernels.JIT's cache key).
func (c *Compiler) ID() string { return "hostsim " + c.CXX }

// kernelDecl finds kernels and their __launch_bounds__ (before or after void).
var kernelDecl = regexp.MustCompile(`extern "C" __global__\s+(?:__launch_bounds__\(([^()]*)\)\s+)?void\s+(?:__launch_bounds__\(([^()]*)\)\s+)?(\w+)\s*\(`)

// Compile builds source (file name) with headers as a shared object and
// returns its bytes. Of options, only -D definitions are used (NVRTC's
// architecture and language options do not apply). Every kernel
// (extern "C" __global__) is exported as mbhost_launch_NAME.
func (c *Compiler) Compile(name, source string, headers map[string]string, options []string) ([]byte, error) {
	dir, err := os.MkdirTemp("", "hostsim-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	files := map[string]string{name: source, "mbhost.h": header}
	for k, v := range headers {
		files[k] = v
	}
	var gen strings.Builder
	fmt.Fprintf(&gen, "#include \"mbhost.h\"\n#include %q\n", name)
	for _, m := range kernelDecl.FindAllStringSubmatch(source, -1) {
		bounds := strings.Split(m[1]+m[2], ",")
		for len(bounds) < 2 {
			bounds = append(bounds, "")
		}
		for i, b := range bounds[:2] {
			if b = strings.TrimSpace(b); b == "" {
				bounds[i] = "0"
			}
		}
		fmt.Fprintf(&gen, "MBHOST_KERNEL(%s, (%s), (%s))\n", m[3], bounds[0], bounds[1])
	}
	gen.WriteString("MBHOST_MODULE\n")
	files["hostsim_main.cpp"] = gen.String()
	for f, text := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(text), 0o644); err != nil {
			return nil, err
		}
	}
	out := filepath.Join(dir, "kernels.so")
	// -fno-gnu-unique: a __shared__ array (a static thread_local) in an
	// inline device function would otherwise be one object process-wide
	// (STB_GNU_UNIQUE binds across RTLD_LOCAL modules), shared by modules
	// compiled with other sizes.
	args := []string{"-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-fno-gnu-unique", "-Wno-unknown-pragmas", "-U_FORTIFY_SOURCE", "-DMB_HOST"}
	for _, o := range options {
		if strings.HasPrefix(o, "-D") {
			args = append(args, o)
		}
	}
	args = append(args, "-o", out, filepath.Join(dir, "hostsim_main.cpp"))
	if msg, err := exec.Command(c.CXX, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("hostsim: compiling %s: %v\n%s", name, err, msg)
	}
	return os.ReadFile(out)
}

// fakeSources are the fake CUDA libraries (the driver, cuBLASLt, cuBLAS,
// NCCL, NVML) the tests load in place of the real ones; embedded, so that a
// test binary built here runs anywhere (the GPU machine's checkout lies
// elsewhere).
//
//go:embed fakes/*.c fakes/*.h
var fakeSources embed.FS

// BuildFake compiles the fake library fakes/NAME.c (e.g. "fakecuda") with
// cc into dir as file and returns its path. Each fake includes moebench's
// abi.h with its declarations on (MB_ABI_DECLARE), so that a fake whose
// entry point differs from moebench's prototype — which TestABIHeaders
// checks against the real headers — fails to build.
func BuildFake(name, dir, file string) (string, error) {
	src, err := fakeSources.ReadFile("fakes/" + name + ".c")
	if err != nil {
		return "", fmt.Errorf("hostsim: no fake library %q: %w", name, err)
	}
	c := filepath.Join(dir, name+".c")
	if err := os.WriteFile(c, src, 0o644); err != nil {
		return "", fmt.Errorf("hostsim: %w", err)
	}
	hdr, _ := fakeSources.ReadFile("fakes/fakedriver.h") // embedded: cannot fail
	for f, text := range map[string][]byte{"fakedriver.h": hdr, "abi.h": []byte(abi.Header)} {
		if err := os.WriteFile(filepath.Join(dir, f), text, 0o644); err != nil {
			return "", fmt.Errorf("hostsim: %w", err)
		}
	}
	so := filepath.Join(dir, file)
	if out, err := exec.Command("cc", "-O2", "-shared", "-fPIC", "-pthread", "-Werror=incompatible-pointer-types", "-o", so, c).CombinedOutput(); err != nil {
		return "", fmt.Errorf("hostsim: building %s: %v\n%s", name, err, out)
	}
	return so, nil
}

// fakes are the fake libraries a cuda device needs (the driver, cuBLASLt,
// cuBLAS) and the variables that name them.
var fakes = []struct{ name, file, env string }{
	{"fakecuda", "libcuda.so.1", "MOEBENCH_LIBCUDA"},
	{"fakecublaslt", "libcublasLt.so.13", "MOEBENCH_CUBLASLT"},
	{"fakecublas", "libcublas.so.13", "MOEBENCH_CUBLAS"},
}

// Setup prepares a test to open cuda devices on the simulation: it builds
// the fake driver, cuBLASLt and cuBLAS, points MOEBENCH_LIBCUDA,
// MOEBENCH_CUBLASLT and MOEBENCH_CUBLAS at them, keeps telemetry off (no
// NVML) and the kernel cache in a temporary folder, stops blocks that only
// spin after 20 s (MBHOST_SPIN_LIMIT_S, unless set), and returns the
// compiler the test installs as kernels.NewCompiler. It skips without a
// C++ compiler, and fails instead under MOEBENCH_REQUIRE_NVRTC=1 (CI); it
// skips under MOEBENCH_REQUIRE_GPU=1, where the GPU check runs the kernels
// on the GPU itself.
func Setup(t testing.TB) *Compiler {
	t.Helper()
	if os.Getenv("MOEBENCH_REQUIRE_GPU") == "1" {
		t.Skip("the GPU check runs the kernels on the GPU")
	}
	c, err := New()
	if err != nil {
		if os.Getenv("MOEBENCH_REQUIRE_NVRTC") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	dir := t.TempDir()
	for _, f := range fakes {
		so, err := BuildFake(f.name, dir, f.file)
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv(f.env, so)
	}
	if os.Getenv("MBHOST_SPIN_LIMIT_S") == "" {
		t.Setenv("MBHOST_SPIN_LIMIT_S", "20") // a kernel that only spins fails its launch within a test's patience
	}
	t.Setenv("MOEBENCH_NVML", filepath.Join(dir, "no-nvml.so"))
	t.Setenv("MOEBENCH_CACHE", filepath.Join(dir, "cache"))
	return c
}

// FakeNCCLEPRuntime makes what NCCL EP's run-time compile looks for exist
// for a test (placeholders: an nvcc and the headers' folders; the fake
// libnccl_ep compiles nothing) and names them as a wheel install does:
// NCCL_EP_HOME, NCCL_HOME and CUDA_HOME set, the variables that would
// override them unset.
func FakeNCCLEPRuntime(t testing.TB) {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"ep/include/nccl_ep/device/ht_ep.cuh", "nccl/include/nccl_device.h", "cuda/include/cuda_runtime.h", "cuda/bin/nvcc"} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("NCCL_EP_HOME", filepath.Join(dir, "ep"))
	t.Setenv("NCCL_HOME", filepath.Join(dir, "nccl"))
	t.Setenv("CUDA_HOME", filepath.Join(dir, "cuda"))
	for _, e := range []string{"NCCL_EP_JIT_NVCC", "NVCC", "CUDA_PATH", "NCCL_EP_JIT_SOURCE_DIR", "NCCL_EP_JIT_BUILD_INCLUDE_DIR", "NCCL_EP_JIT_CUDA_INCLUDE_DIR"} {
		t.Setenv(e, "")
	}
}

// Within runs f and ends the test binary if f has not returned after d: a
// test of cross-rank waits must fail, not hang. (Setup stops a block that
// only spins after MBHOST_SPIN_LIMIT_S, shorter than the tests' d, so a
// kernel wait without a timeout fails its launch first.) f runs on an OS
// thread of its own (locked: the CUDA driver's current context is per
// thread), which ends with it.
func Within(t *testing.T, d time.Duration, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		panic(fmt.Sprintf("%s: still running after %v: a wait without a timeout?", t.Name(), d))
	}
}
