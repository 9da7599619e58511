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
//
// How the tests use it: docs/testing.md.
package hostsim

import (
	"embed"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moebench/moebench/internal/cuda/abi"
)

//go:embed mbhost.h
var header string

// Compiler compiles kernel sources for the CPU with a C++20 compiler; it
// satisfies device.Compiler.
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

// ID names the compiler (device.JIT's cache key).
func (c *Compiler) ID() string { return "hostsim " + c.CXX }

// GPU is false: the kernels run on the host's CPUs.
func (c *Compiler) GPU() bool { return false }

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
// NVML) and the kernel cache in a temporary folder that the test binary's
// tests share (see kernelCache), stops blocks that only
// spin after 20 s × MOEBENCH_TEST_TIMEOUT_SCALE (MBHOST_SPIN_LIMIT_S,
// unless set), and returns the
// compiler the test installs as device.NewCompiler. It skips without a
// C++ compiler, and fails instead under MOEBENCH_REQUIRE_NVRTC=1 (CI); it
// skips under MOEBENCH_REQUIRE_GPU=1, where the GPU check runs the kernels
// on the GPU itself.
func Setup(t testing.TB) *Compiler {
	t.Helper()
	if os.Getenv("MOEBENCH_REQUIRE_GPU") == "1" {
		t.Skip("the GPU check runs the kernels on the GPU")
	}
	if err := poisoned(); err != nil {
		t.Fatal(err)
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
	scale, err := Scale()
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("MBHOST_SPIN_LIMIT_S") == "" {
		// a kernel that only spins fails its launch within a test's patience
		t.Setenv("MBHOST_SPIN_LIMIT_S", strconv.Itoa(int(math.Ceil(20*scale))))
	}
	t.Setenv("MOEBENCH_NVML", filepath.Join(dir, "no-nvml.so"))
	cache, err := kernelCache()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOEBENCH_CACHE", cache)
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

// ScaleEnv names the factor by which a test's patience is multiplied on a
// slow or loaded machine: every Within's nominal time and the spin limit
// Setup sets. A number above 0; 1 when unset.
const ScaleEnv = "MOEBENCH_TEST_TIMEOUT_SCALE"

// Scale reads ScaleEnv: 1 when unset, an error naming the variable, its
// value and the allowed range when it is not a number above 0.
func Scale() (float64, error) {
	v := os.Getenv(ScaleEnv)
	if v == "" {
		return 1, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("hostsim: %s=%q: want a number above 0 (a factor on the tests' time limits)", ScaleEnv, v)
	}
	return f, nil
}

// Limits returns Within's two limits for a test whose nominal time (on an
// idle machine) is d: soft, after which the test fails and the stacks of
// what it waits for are reported, and hard, after which f is abandoned.
// soft is d×scale, or a quarter of the time left before the test binary's
// deadline (go test -timeout) when that is longer; hard is nine tenths of
// the time left, so that the watchdog, not go test's alarm (which kills the
// whole package), ends a test; soft is at most hard. Without a deadline
// (-timeout 0) hard is four times soft. why says how soft was found.
func Limits(d time.Duration, scale float64, deadline time.Time, hasDeadline bool, now time.Time) (soft, hard time.Duration, why string) {
	soft = time.Duration(float64(d) * scale)
	why = fmt.Sprintf("%v × %s %g", d, ScaleEnv, scale)
	if !hasDeadline {
		return soft, 4 * soft, why + "; no test deadline"
	}
	left := deadline.Sub(now)
	if left/4 > soft {
		soft, why = left/4, fmt.Sprintf("a quarter of the %v left before go test's deadline (more than %s)", left.Round(time.Second), why)
	}
	hard = left * 9 / 10
	if soft > hard {
		soft, why = hard, fmt.Sprintf("nine tenths of the %v left before go test's deadline (less than %s)", left.Round(time.Second), why)
	}
	return soft, hard, why
}

// Patience is how long a test waits for what takes d on an idle machine
// (a child process, a browser) before it fails: Within's soft limit, d ×
// MOEBENCH_TEST_TIMEOUT_SCALE or a quarter of the time left before go
// test's deadline when that is longer (see Limits).
func Patience(t testing.TB, d time.Duration) time.Duration {
	t.Helper()
	scale, err := Scale()
	if err != nil {
		t.Fatal(err)
	}
	deadline, has := deadlineOf(t)
	soft, _, _ := Limits(d, scale, deadline, has, time.Now())
	return soft
}

// poison, once set, names the test whose f Within abandoned still running:
// its kernels may still use the fake driver and its devices, so no later
// test on the simulation can trust them (Setup and Within fail at once).
var poison atomic.Pointer[string]

// poisoned returns why the simulation cannot be trusted, or nil.
func poisoned() error {
	if p := poison.Load(); p != nil {
		return fmt.Errorf("hostsim: %s", *p)
	}
	return nil
}

// Hooks for the watchdog's own tests: onExpire runs when the soft limit
// passes, abandoned counts the goroutines Within gave up on that still run,
// and late receives what such a goroutine panicked with after its test
// ended (a t.Error or t.Fatal there panics in the testing package).
var (
	onExpire  func()
	abandoned sync.WaitGroup
	late      = make(chan any, 16)
)

// Within runs f and fails the test if f has not returned within its limit:
// a test of cross-rank waits must fail, not hang, and must not end the
// test binary either (a panic would, with every later test of the
// package). It is WithinNamed with f described by the test's name.
func Within(t testing.TB, d time.Duration, f func()) {
	t.Helper()
	WithinNamed(t, d, "", f)
}

// WithinNamed runs f on an OS thread of its own (locked: the CUDA driver's
// current context is per thread, and the thread ends with f) and waits for
// it. d is f's nominal time on an idle machine; Limits derives the soft and
// hard limits from it, MOEBENCH_TEST_TIMEOUT_SCALE and the test's deadline.
// (Setup stops a block that only spins after MBHOST_SPIN_LIMIT_S, shorter
// than the tests' d, so a kernel wait without a timeout fails its launch
// first.)
//
// Past the soft limit the test fails, naming what (what f waits for) and
// how long it ran, with the stacks of f's goroutine and of the goroutines
// it started (also written to stderr at once, in case the binary dies
// later), and Within keeps waiting: f, which may be in the simulation's C
// code, cannot be stopped, and the test's cleanups (closing its devices)
// must not run under it. When f returns, the test ends (t.FailNow). Past
// the hard limit f is abandoned: the test ends while f runs on (a leak),
// the simulation is poisoned so that every later Setup and Within fails
// naming this test, and what f's goroutine panics with later (a t.Error
// after its test ended) is recovered, not fatal. A panic in f fails the
// test with f's stack instead of ending the binary. When f ends by
// t.FailNow or t.SkipNow, so does the test (the caller does not go on to
// check what f did not compute).
func WithinNamed(t testing.TB, d time.Duration, what string, f func()) {
	t.Helper()
	if err := poisoned(); err != nil {
		t.Fatal(err)
	}
	scale, err := Scale()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	deadline, has := deadlineOf(t)
	soft, hard, why := Limits(d, scale, deadline, has, start)
	if what == "" {
		what = t.Name() + "'s function"
	}
	var (
		done     = make(chan struct{})
		id       = make(chan string, 1)
		gaveUp   atomic.Bool
		expired  bool
		returned bool // f returned: it did not panic or end its goroutine (t.FailNow in f)
		panicked any
		pstack   []byte
	)
	go func() {
		runtime.LockOSThread()
		id <- goroutineID()
		defer close(done)
		defer func() {
			r := recover()
			if r == nil {
				return
			}
			if gaveUp.Load() {
				select {
				case late <- r:
				default:
				}
				fmt.Fprintf(os.Stderr, "hostsim: %s, abandoned by %s, panicked after its test ended (recovered): %v\n", what, t.Name(), r)
				return
			}
			panicked, pstack = r, debug.Stack()
		}()
		f()
		returned = true
	}()
	gid := <-id
	report := func(after time.Duration, verdict string) string {
		return fmt.Sprintf("%s: %s still running after %v (limit %v: %s); %s\nits goroutines:\n%s",
			t.Name(), what, after.Round(time.Millisecond), soft, why, verdict, goroutinesOf(gid))
	}
	softC, hardC := time.After(soft), time.After(hard)
	select {
	case <-done:
	case <-softC:
		expired = true
		msg := report(time.Since(start), "waiting for it to return before the test's cleanups run")
		fmt.Fprintln(os.Stderr, msg)
		t.Error(msg)
		if onExpire != nil {
			onExpire()
		}
		select {
		case <-done:
		case <-hardC:
			gaveUp.Store(true)
			abandoned.Add(1)
			go func() { <-done; abandoned.Done() }()
			why := fmt.Sprintf("%s abandoned %s still running after %v; its kernels may still use the fake devices", t.Name(), what, time.Since(start).Round(time.Millisecond))
			poison.Store(&why)
			msg := report(time.Since(start), "abandoned (it leaks; later tests on the simulation fail)")
			fmt.Fprintln(os.Stderr, msg)
			t.Fatal(msg)
		}
	}
	if panicked != nil {
		t.Fatalf("%s panicked: %v\n%s", what, panicked, pstack)
	}
	if !returned && t.Skipped() {
		t.SkipNow() // f skipped the test
	}
	if expired || !returned {
		// past its limit, or f ended by t.FailNow: what f left is not for
		// the caller to check
		t.FailNow()
	}
}

// deadlineOf is t.Deadline where t has one (a *testing.T does).
func deadlineOf(t testing.TB) (time.Time, bool) {
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		return d.Deadline()
	}
	return time.Time{}, false
}

// goroutineID is the calling goroutine's number as its stack names it.
func goroutineID() string {
	var buf [64]byte
	s := string(buf[:runtime.Stack(buf[:], false)])
	s = strings.TrimPrefix(s, "goroutine ")
	if i := strings.IndexByte(s, ' '); i > 0 {
		return s[:i]
	}
	return "?"
}

// goroutinesOf returns the stacks of goroutine id and of every goroutine
// it started, directly or not (a rank's locked thread, a host wait).
func goroutinesOf(id string) string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	type g struct{ id, parent, text string }
	var gs []g
	for _, block := range strings.Split(string(buf), "\n\n") {
		var x g
		x.text = block
		if rest, ok := strings.CutPrefix(block, "goroutine "); ok {
			x.id, _, _ = strings.Cut(rest, " ")
		}
		if i := strings.LastIndex(block, " in goroutine "); i >= 0 {
			x.parent, _, _ = strings.Cut(block[i+len(" in goroutine "):], "\n")
		}
		gs = append(gs, x)
	}
	in := map[string]bool{id: true}
	for changed := true; changed; {
		changed = false
		for _, x := range gs {
			if !in[x.id] && in[x.parent] {
				in[x.id], changed = true, true
			}
		}
	}
	var out []string
	for _, x := range gs {
		if in[x.id] {
			out = append(out, x.text)
		}
	}
	if len(out) == 0 {
		return "(goroutine " + id + " not found)"
	}
	return strings.Join(out, "\n\n")
}

// SkipIfShort skips t under go test -short (the edit loop's tier, see
// docs/testing.md): t is slow, and kept says which faster test or case of the same
// kind still runs there. The full suite runs it.
func SkipIfShort(t testing.TB, kept string) {
	t.Helper()
	if testing.Short() {
		t.Skip("slow, skipped under -short; " + kept + " still runs")
	}
}

// kernelCache returns the kernel cache folder the tests of this process
// share: device.JIT keys a kernel by its source, headers, options and
// compiler, so a test finds there only what it would have compiled itself,
// and the tests of a package compile a kernel once, not once per test (the
// compiles are most of the host simulation's time). A folder that an
// earlier test binary left (its process has ended, an hour ago or more)
// is removed.
func kernelCache() (string, error) {
	cacheOnce.Do(func() {
		removeStaleCaches(os.TempDir())
		cacheDir, cacheErr = os.MkdirTemp("", fmt.Sprintf("%s%d-", cachePrefix, os.Getpid()))
	})
	return cacheDir, cacheErr
}

const cachePrefix = "moebench-hostsim-kernels-"

// removeStaleCaches removes the kernel cache folders in tmp whose process
// has ended. A process of another PID namespace may look ended, so the
// folder must also be an hour old (a test binary's life is its -timeout).
func removeStaleCaches(tmp string) {
	old, _ := filepath.Glob(filepath.Join(tmp, cachePrefix+"*"))
	for _, d := range old {
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(d), cachePrefix), "-", 2)[0])
		fi, serr := os.Stat(d)
		if err == nil && serr == nil && pid != os.Getpid() && syscall.Kill(pid, 0) == syscall.ESRCH && time.Since(fi.ModTime()) > time.Hour {
			os.RemoveAll(d)
		}
	}
}

var (
	cacheOnce sync.Once
	cacheDir  string
	cacheErr  error
)
