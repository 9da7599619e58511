package comm

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// nvrtc opens NVRTC or skips; MOEBENCH_REQUIRE_NVRTC=1 (CI, which installs
// Debian's NVRTC) or MOEBENCH_REQUIRE_GPU=1 turn a missing NVRTC into a failure.
func nvrtc(t *testing.T) *cuda.NVRTC {
	n, err := cuda.OpenNVRTC()
	if err != nil {
		if os.Getenv("MOEBENCH_REQUIRE_NVRTC") == "1" || os.Getenv("MOEBENCH_REQUIRE_GPU") == "1" {
			t.Fatalf("NVRTC required: %v", err)
		}
		t.Skipf("no NVRTC: %v", err)
	}
	return n
}

// shapes are the presets' kernel constants at EP 8: the router's, hidden
// and ffn; "tiny-128" is the tiny preset at its former hidden of 128,
// kept as the audit's small case whose hidden is no multiple of 512.
var shapes = map[string]struct {
	rc          kernels.RouterConfig
	hidden, ffn int
}{
	"tiny-128":       {kernels.RouterConfig{Experts: 16, TopK: 4, Score: kernels.ScoreSoftmax, Scale: 1}, 128, 64},
	"deepseek-v3":    {kernels.RouterConfig{Experts: 256, TopK: 8, Score: kernels.ScoreSigmoid, Groups: 8, GroupTopK: 4, Scale: 2.5}, 7168, 2048},
	"qwen3-next-80b": {kernels.RouterConfig{Experts: 512, TopK: 10, Score: kernels.ScoreSoftmax, Scale: 1}, 2048, 512},
	"mixtral-8x7b":   {kernels.RouterConfig{Experts: 8, TopK: 2, Score: kernels.ScoreSoftmax}, 4096, 14336},
	"gpt-oss-120b":   {kernels.RouterConfig{Experts: 128, TopK: 4, Score: kernels.ScoreSoftmax, Scale: 1}, 2880, 2880},
}

// defines are every kernel's constants for a shape, the router's as the
// CUDA device makes them (routerDefs).
func defines(name string) map[string]string {
	s := shapes[name]
	d := device.RouterDefs(s.rc)
	d["MB_HIDDEN"], d["MB_FFN"] = fmt.Sprint(s.hidden), fmt.Sprint(s.ffn)
	d["MB_EP"], d["MB_LOCAL"] = "8", fmt.Sprint(s.rc.Experts/8)
	d["MB_CT_CHANNELS"], d["MB_CT_SLOTS"] = "12", "256" // comm_test: DeepEP's 24 SMs, a 256-token ring
	// deepep: 4096 tokens a rank, 24 SMs (12 channels), DeepEP's rings, the
	// device's default blocks; the offsets as dispatchers/deepep lays the
	// buffers out (their values only place the arrays)
	const T, N, C = 4096, 8, 12
	L := s.rc.Experts / N
	for name, v := range map[string]int{"MB_RANKS": N, "MB_LOCAL": L, "MB_TOKENS": T, "MB_CHANNELS": C, "MB_DRING": 256, "MB_DCHUNK": 6,
		"MB_CRING": 256, "MB_CCHUNK": 4, "MB_WARPS": 16, "MB_MINB": 2, "MB_DE_BUG": 0,
		"MB_Q_ECNT": 4 * N, "MB_Q_FLAGS": 4 * N * (1 + L), "MB_Q_GO": 4 * N * (2 + L), "MB_Q_DMETA": 16 * (N*(2+L)/4 + 1),
		"MB_Q_CMETA": 16*(N*(2+L)/4+1) + 16*C*N, "MB_Q_RINGS": 16*(N*(2+L)/4+1) + 24*C*N,
		"MB_F_PER_RANK": T * N, "MB_F_PER_EXPERT": T*N + 4*N, "MB_F_CHAN_END": T*N + 4*N*(1+L), "MB_F_SRC_END": T*N + 4*N*(1+L+C),
		"MB_F_RECV_CHAN": T*N + 4*N*(2+L+C), "MB_F_SEND_HEAD": T*N + 4*N*(2+L+3*C)} {
		d[name] = fmt.Sprint(v)
	}
	d["MB_FT_HIDDEN"], d["MB_FT_STAGES"], d["MB_FT_WARPS"] = fmt.Sprint(s.hidden), "2", "3"
	d["MB_NO_BULK"] = "0"
	// hybridep: two domains of 4 (the inter-domain path compiled in)
	d["MB_HE_EP"], d["MB_HE_DOMAIN"], d["MB_HE_TOKENS"], d["MB_HE_CHUNK"], d["MB_HE_STAGES"] = "8", "4", "4096", "64", "6"
	d["MB_HE_EXPERTS"], d["MB_HE_TOPK"], d["MB_HE_HIDDEN"] = fmt.Sprint(s.rc.Experts), fmt.Sprint(s.rc.TopK), fmt.Sprint(s.hidden)
	d["MB_HE_DHIDDEN"] = fmt.Sprint(s.hidden) // bf16 dispatch rows (TestKernelsCompileFP8 builds the packed fp8 ones)
	return d
}

// TestKernelsCompile compiles every kernel for sm_80 and sm_90 with every
// preset's constants, and the router with every configuration the GPU test
// checks: a kernel that does not compile fails CI. Where cuobjdump is found,
// every cubin passes the SASS audit (sass_test.go), the opcode rules checked
// on the presets' sm_90 cubins. The router refuses more than 32 choices (one
// per lane) at compile time.
func TestKernelsCompile(t *testing.T) {
	n := nvrtc(t)
	t.Logf("NVRTC %d.%d from %s", n.Major, n.Minor, n.Path)
	tool := cuobjdump(t)
	if tool == "" {
		t.Log("no cuobjdump: the SASS audit is skipped")
	}
	// the audits run on every CPU while the compiles go on
	type audit struct {
		i       int // the compile's number
		cubin   []byte
		d       map[string]string
		opcodes bool
	}
	type audited struct{ lines, problems []string }
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		out = map[int]audited{}
	)
	work := make(chan audit)
	for range runtime.NumCPU() {
		wg.Go(func() {
			for a := range work {
				lines, problems, err := auditSASS(tool, a.cubin, a.d, a.opcodes)
				if err != nil {
					problems = append(problems, err.Error())
				}
				mu.Lock()
				out[a.i] = audited{lines, problems}
				mu.Unlock()
			}
		})
	}
	j := &device.JIT{Compiler: n}
	var whats []string // what each compile was, by its number
	compile := func(what, file, arch string, d map[string]string, opcodes bool) {
		t.Helper()
		what = fmt.Sprintf("%s %s %s", what, file, arch)
		cubin, err := j.Compile(file, arch, d)
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return
		}
		if !bytes.HasPrefix(cubin, []byte("\x7fELF")) {
			t.Errorf("%s: not an ELF cubin", what)
			return
		}
		if tool != "" {
			work <- audit{len(whats), cubin, d, opcodes}
		}
		whats = append(whats, what)
	}
	archs, presets := []string{"sm_80", "sm_90"}, slices.Collect(maps.Keys(shapes))
	if testing.Short() { // the edit loop's tier: the largest preset where the opcode rules apply
		archs, presets = []string{"sm_90"}, []string{"deepseek-v3"}
		t.Logf("-short: %v only, for %v", presets, archs)
	}
	for _, arch := range archs {
		for _, name := range presets {
			for file, names := range device.CUDAKernels {
				d := defines(name)
				if !slices.Contains(names, "MB_NO_BULK") {
					compile(name, file, arch, d, arch == "sm_90")
					if h := shapes[name].hidden; file == "deepep.cu" && h%kernels.FP8Block == 0 {
						// --precision fp8: the forward dispatch's packed rows
						d := maps.Clone(d)
						d["MB_DE_DHIDDEN"] = fmt.Sprint(kernels.FP8RowPitch(h) / 2)
						compile(name+" fp8", file, arch, d, arch == "sm_90")
					}
					continue
				}
				// the bulk-copy path where this NVRTC compiles it (sm_90,
				// NVRTC ≥ 12: PTX ISA 8.0), and the 16-byte path (elsewhere
				// the one path compiled either way)
				for _, noBulk := range []string{"0", "1"} {
					if noBulk == "1" && (arch != "sm_90" || n.Major < 12) {
						continue
					}
					d := maps.Clone(d)
					d["MB_NO_BULK"] = noBulk
					if noBulk == "0" && arch == "sm_90" && n.Major >= 12 {
						d[bulkExpected] = "1"
					}
					compile(name+" MB_NO_BULK="+noBulk, file, arch, d, arch == "sm_90")
					if h := shapes[name].hidden; file == "hybridep.cu" && h%512 == 0 {
						// --precision fp8: the forward dispatch's packed rows
						d := maps.Clone(d)
						d["MB_HE_DHIDDEN"] = fmt.Sprint(kernels.FP8RowPitch(h) / 2)
						compile(name+" fp8 MB_NO_BULK="+noBulk, file, arch, d, arch == "sm_90")
					}
				}
			}
		}
		for name, rc := range checkedRouterCases(t) {
			compile("router "+name, "router.cu", arch, device.RouterDefs(rc), false)
		}
	}
	close(work)
	_, err := j.Compile("router.cu", "sm_90", device.RouterDefs(kernels.RouterConfig{Experts: 64, TopK: 33, Score: kernels.ScoreSoftmax}))
	if ce, ok := err.(*cuda.CompileError); !ok || !strings.Contains(ce.Log, "MB_TOPK must be at most 32") {
		t.Errorf("router with k = 33: %v, want the kernel's refusal", err)
	}
	wg.Wait()
	for i, what := range whats {
		for _, l := range out[i].lines {
			t.Logf("%s: %s", what, l)
		}
		for _, p := range out[i].problems {
			t.Errorf("%s: %s", what, p)
		}
	}
}

// TestKernelsCompileNVRTC12 runs TestKernelsCompile again, in a child
// process, with the NVRTC ≥ 12 that MOEBENCH_NVRTC12 names (CI unpacks
// Debian trixie's 12.4): NVRTC 11.8 cannot compile hybridep's bulk-copy
// path (cp.async.bulk and mbarrier transaction counts, PTX ISA 8.0), which
// the child compiles for sm_90 and whose SASS it audits for UBLKCP. It
// skips without the variable, and fails instead under
// MOEBENCH_REQUIRE_NVRTC12=1.
func TestKernelsCompileNVRTC12(t *testing.T) {
	lib := os.Getenv("MOEBENCH_NVRTC12")
	switch {
	case lib == "" && os.Getenv("MOEBENCH_REQUIRE_NVRTC12") == "1":
		t.Fatal("MOEBENCH_REQUIRE_NVRTC12=1 but MOEBENCH_NVRTC12 names no NVRTC")
	case lib == "":
		t.Skip("MOEBENCH_NVRTC12 names no NVRTC ≥ 12: the bulk-copy path is not compiled")
	case os.Getenv("MOEBENCH_NVRTC") == lib:
		t.Skip("the child itself")
	}
	hostsim.SkipIfShort(t, "TestKernelsCompile (NVRTC 11.8, the 16-byte path)")
	cmd := exec.Command(os.Args[0], "-test.run", "^TestKernelsCompile$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "MOEBENCH_NVRTC="+lib, "LD_LIBRARY_PATH="+filepath.Dir(lib)+":"+os.Getenv("LD_LIBRARY_PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("TestKernelsCompile with %s: %v\n%s", lib, err, out)
	}
	if !regexp.MustCompile(`NVRTC 1[2-9]\.\d+ from`).Match(out) || !bytes.Contains(out, []byte("MB_NO_BULK=0 hybridep.cu sm_90")) {
		t.Fatalf("the child did not compile the bulk-copy path with NVRTC ≥ 12:\n%s", out)
	}
}

func TestJITCacheAndErrors(t *testing.T) {
	n := nvrtc(t)
	j := &device.JIT{Compiler: n, CacheDir: t.TempDir()}
	d := defines("tiny-128")
	a, err := j.Compile("permute.cu", "sm_90", d)
	if err != nil {
		t.Fatal(err)
	}
	b, err := j.Compile("permute.cu", "sm_90", d)
	if err != nil || !bytes.Equal(a, b) || j.Hits != 1 || j.Compiled != 1 {
		t.Errorf("second compile: hits %d, compiled %d, same %v, %v", j.Hits, j.Compiled, bytes.Equal(a, b), err)
	}
	d["MB_HIDDEN"] = "256" // other constants: another cache entry
	if _, err := j.Compile("permute.cu", "sm_90", d); err != nil || j.Compiled != 2 {
		t.Errorf("new constants: compiled %d, %v", j.Compiled, err)
	}
	delete(d, "MB_HIDDEN")
	if _, err := j.Compile("permute.cu", "sm_90", d); err == nil {
		t.Error("missing constant accepted")
	}
	// a compile error carries NVRTC's log
	if _, err := n.Compile("bad.cu", "extern \"C\" __global__ void k() { undefined_thing(); }", nil, []string{"--gpu-architecture=sm_90"}); err == nil {
		t.Error("bad source compiled")
	} else if ce, ok := err.(*cuda.CompileError); !ok || ce.Log == "" {
		t.Errorf("compile error without log: %v", err)
	}
}

// primitivesSource uses every memory primitive and wait of moebench.cuh,
// so that their inline PTX goes through ptxas (unused inline functions
// are never emitted).
const primitivesSource = `#include "moebench.cuh"
extern "C" __global__ void __launch_bounds__(128, 2) primitives(mb_comm c, int *p, unsigned long long *q, int *const *flags, int rank) {
    int v = mb_ld_volatile(p) + mb_ld_acquire_gpu(p) + mb_ld_acquire_sys(p);
    mb_st_volatile(p + 1, v);
    mb_st_relaxed_sys(p + 2, v);
    mb_st_release_gpu(p + 3, v);
    mb_st_release_sys(p + 4, v);
    v += mb_atomic_add_sys(p + 5, 1) + mb_atomic_add_release_sys(p + 6, 2) + mb_atomic_cas_sys(p + 7, 0, 1) + mb_atomic_exch_sys(p + 8, 3);
    unsigned long long w = mb_ld_acquire_sys_u64(q) + mb_atomic_add_sys_u64(q + 1, 1);
    mb_st_release_sys_u64(q + 2, w);
    mb_fence_gpu();
    mb_fence_sys();
    mb_nanosleep(100);
    unsigned char *sm = mb_dynamic_smem();
    sm[threadIdx.x] = (unsigned char)v;
    uint4 u = mb_ld_cg((const uint4 *)q + 4);
    mb_bar_sync(1, 64);
    __syncthreads();
    if (!mb_check(c, rank, 1, 5, u.x, v)) return;
    if (mb_wait_ge(c, rank, 1, 2, p + 9, v) && mb_wait_eq(c, rank, 1, 3, p + 10, v) && mb_barrier(c, rank, 2, 1, 4, flags, 1))
        *mb_counter(c.sig, 2, 0) = sm[0] + (int)mb_globaltimer();
}`

// TestPrimitivesCompile compiles moebench.cuh's memory primitives and
// waits with NVRTC for sm_80 and sm_90 (CI's NVRTC 11.8 included), and for
// the host simulation.
func TestPrimitivesCompile(t *testing.T) {
	if comp, err := hostsim.New(); err == nil {
		if _, err := comp.Compile("primitives.cu", primitivesSource, map[string]string{device.CUDAHeader: header(t)}, nil); err != nil {
			t.Errorf("host simulation: %v", err)
		}
	}
	n := nvrtc(t)
	for _, arch := range []string{"sm_80", "sm_90"} {
		t.Run(arch, func(t *testing.T) {
			cubin, err := n.Compile("primitives.cu", primitivesSource, map[string]string{device.CUDAHeader: header(t)}, []string{"--gpu-architecture=" + arch, "-std=c++17"})
			if err != nil {
				t.Errorf("%s: %v", arch, err)
				return
			}
			if tool := cuobjdump(t); tool != "" {
				ks, err := readSASS(tool, cubin, true)
				if err != nil {
					t.Fatal(err)
				}
				k := ks["primitives"]
				if k == nil || k.has("NANOSLEEP") == 0 || k.has("ATOM") == 0 || k.has("MEMBAR") == 0 {
					t.Errorf("%s: no NANOSLEEP, ATOM or MEMBAR in the SASS: %v", arch, k)
				}
			}
		})
	}
}

func header(t *testing.T) string {
	b, err := kernels.Sources.ReadFile("cuda/" + device.CUDAHeader)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// recordingCompiler keeps the options of the last compilation.
type recordingCompiler struct{ opts []string }

func (r *recordingCompiler) Compile(_, _ string, _ map[string]string, opts []string) ([]byte, error) {
	r.opts = opts
	return []byte("image"), nil
}
func (r *recordingCompiler) ID() string { return "recording" }

func (r *recordingCompiler) GPU() bool { return false }

// TestCompilePassesOptionalDefines: a constant a source takes under #ifdef
// (hybridep's MB_HE_PSTAGES, the permute's ring where shared memory is
// short) reaches the compiler when given, and is not needed otherwise;
// one the source does not take is still dropped.
func TestCompilePassesOptionalDefines(t *testing.T) {
	d := map[string]string{}
	for _, n := range device.CUDAKernels["hybridep.cu"] {
		d[n] = "1"
	}
	rc := &recordingCompiler{}
	j := &device.JIT{Compiler: rc}
	if _, err := j.Compile("hybridep.cu", "sm_90", d); err != nil {
		t.Fatal(err)
	}
	if opts := strings.Join(rc.opts, " "); strings.Contains(opts, "MB_HE_PSTAGES") {
		t.Errorf("not given, yet passed: %s", opts)
	}
	d["MB_HE_PSTAGES"], d["MB_NOT_TAKEN"] = "1", "1"
	if _, err := j.Compile("hybridep.cu", "sm_90", d); err != nil {
		t.Fatal(err)
	}
	if opts := strings.Join(rc.opts, " "); !strings.Contains(opts, "-DMB_HE_PSTAGES=1") || strings.Contains(opts, "MB_NOT_TAKEN") {
		t.Errorf("options %s: want -DMB_HE_PSTAGES=1 and no MB_NOT_TAKEN", opts)
	}
}
