package main

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// TestBuildGPUBins: scripts/build-gpu-bins.sh, with a stand-in go that
// writes a file of FAKE_GO_BYTES where -o names it, builds every binary
// stripped (-ldflags=-s -w) and stamped with its commit, says each file's size and the total, and fails
// (exit 1, naming the limit) above MAX_MIB (48 MiB unless set); quick builds
// what gpu-check.sh quick runs alone; a MAX_MIB that is no number or an
// unknown argument is a usage error.
func TestBuildGPUBins(t *testing.T) {
	dir := t.TempDir()
	fakeGo := filepath.Join(dir, "path", "go")
	os.MkdirAll(filepath.Dir(fakeGo), 0o755)
	os.WriteFile(fakeGo, []byte(`#!/bin/sh
echo "$*" >> "$FAKE_GO_LOG"
while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
head -c "$FAKE_GO_BYTES" /dev/zero > "$out"
`), 0o755)
	const mib = 1 << 20
	build := func(t *testing.T, bytes int, maxMiB string, args ...string) (code int, out, log string, bins []string) {
		t.Helper()
		bin, goLog := t.TempDir(), filepath.Join(t.TempDir(), "go.log")
		os.WriteFile(filepath.Join(bin, "stale.test"), []byte("an old package's"), 0o755)
		cmd := exec.Command("bash", append([]string{"../../scripts/build-gpu-bins.sh"}, args...)...)
		cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(fakeGo)+":"+os.Getenv("PATH"), "BIN_DIR="+bin, "FAKE_GO_LOG="+goLog,
			fmt.Sprintf("FAKE_GO_BYTES=%d", bytes), "MAX_MIB="+maxMiB)
		b, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		l, _ := os.ReadFile(goLog)
		ents, _ := os.ReadDir(bin)
		for _, e := range ents {
			bins = append(bins, e.Name())
		}
		return code, string(b), string(l), bins
	}
	all := []string{"dispatchers_deepep.test", "dispatchers_hybridep.test", "harness.test", "internal_cuda.test", "kernels_comm.test", "moebench"}
	t.Run("within", func(t *testing.T) {
		code, out, log, bins := build(t, mib, "")
		if code != 0 || strings.Join(bins, " ") != strings.Join(all, " ") {
			t.Fatalf("exit %d, built %v:\n%s", code, bins, out)
		}
		for _, name := range all {
			if !strings.Contains(out, fmt.Sprintf("%10d B     1.0 MiB  ", mib)) || !strings.Contains(out, "/"+name+"\n") {
				t.Errorf("no size of %s:\n%s", name, out)
			}
		}
		if !strings.Contains(out, fmt.Sprintf("%10d B     6.0 MiB  ", 6*mib)) || !strings.Contains(out, "in all (limit 48 MiB)") {
			t.Errorf("no total:\n%s", out)
		}
		lines := strings.Split(strings.TrimSpace(log), "\n")
		if len(lines) != len(all) {
			t.Fatalf("go ran %d times:\n%s", len(lines), log)
		}
		for _, l := range lines {
			if !strings.Contains(l, "-ldflags=-s -w ") {
				t.Errorf("not stripped: go %s", l)
			}
			if !strings.Contains(l, "-buildvcs=auto ") { // the binary's own commit in its records, whatever GOFLAGS says
				t.Errorf("no VCS stamp asked for: go %s", l)
			}
		}
	})
	t.Run("above", func(t *testing.T) {
		code, out, _, _ := build(t, 9*mib, "") // 54 MiB
		if code != 1 || !strings.Contains(out, fmt.Sprintf("holds %d B of binaries, above the limit of MAX_MIB=48 MiB", 54*mib)) {
			t.Errorf("exit %d:\n%s", code, out)
		}
		if code, out, _, _ := build(t, 9*mib, "60"); code != 0 || !strings.Contains(out, "in all (limit 60 MiB)") {
			t.Errorf("MAX_MIB=60: exit %d:\n%s", code, out)
		}
	})
	t.Run("quick", func(t *testing.T) {
		code, out, _, bins := build(t, mib, "", "quick")
		if want := "dispatchers_deepep.test dispatchers_hybridep.test kernels_comm.test moebench"; code != 0 || strings.Join(bins, " ") != want {
			t.Errorf("exit %d, built %v, want %s:\n%s", code, bins, want, out)
		}
	})
	t.Run("usage", func(t *testing.T) {
		if code, out, _, _ := build(t, mib, "lots"); code != 2 || !strings.Contains(out, "MAX_MIB=lots: must be a whole number of MiB") {
			t.Errorf("exit %d:\n%s", code, out)
		}
		if code, out, _, _ := build(t, mib, "", "all"); code != 2 || !strings.Contains(out, "unknown argument 'all' (known: quick)") {
			t.Errorf("exit %d:\n%s", code, out)
		}
	})
}

// fakeTests writes stand-ins for the GPU test binaries into a new folder:
// each logs its name, arguments and MOEBENCH_REQUIRE_GPU to log and passes,
// except those that how names: "hang" waits (a test that never ends),
// "timeout" ends as a test binary past its -test.timeout does.
func fakeTests(t *testing.T, log string, how map[string]string) string {
	dir := t.TempDir()
	for _, name := range []string{"kernels_comm.test", "dispatchers_deepep.test", "dispatchers_hybridep.test"} {
		body := map[string]string{
			"":        "echo '=== RUN   TestGPUFake'; echo '--- PASS: TestGPUFake (0.00s)'; echo PASS\n",
			"hang":    "exec sleep 600\n",
			"timeout": "echo '=== RUN   TestGPUFake'; echo 'panic: test timed out after 1s'; echo '\trunning tests:'; echo '\t\tTestGPUFake (1s)'; exit 2\n",
		}[how[name]]
		os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\necho \"$(basename \"$0\") $* MOEBENCH_REQUIRE_GPU=$MOEBENCH_REQUIRE_GPU\" >> "+log+"\n"+body), 0o755)
	}
	return dir
}

// gpuCheckQuick runs scripts/gpu-check.sh quick into a new OUTDIR with env
// added; it returns OUTDIR, the output, the exit status and the wall time.
func gpuCheckQuick(t *testing.T, env ...string) (outdir, out string, code int, took time.Duration) {
	t.Helper()
	outdir = filepath.Join(t.TempDir(), "out")
	cmd := exec.Command("bash", "../../scripts/gpu-check.sh", "quick", outdir)
	cmd.Env = append(os.Environ(), env...)
	start := time.Now()
	b, err := cmd.CombinedOutput()
	took = time.Since(start)
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return outdir, string(b), code, took
}

// untar reads a .tgz: each file's name (without ./) and contents.
func untar(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	r := tar.NewReader(z)
	for {
		h, err := r.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(r)
			files[strings.TrimPrefix(h.Name, "./")] = string(b)
		}
	}
}

// summaryLine is the summary's status of step name ("" if none).
func summaryLine(out, name string) string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == name {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), name))
		}
	}
	return ""
}

// TestGPUCheckQuick: scripts/gpu-check.sh quick end to end on the host
// simulation (the fake driver, cuBLASLt and cuBLAS; this test binary as
// moebench; stand-ins for the GPU test binaries, hybridep's hanging): every
// step with the limit it has on a GPU, the layers, bench dispatch and bench
// kernels at a small shape (16 tokens a rank, EP 8 packed on two fake
// GPUs, QUICK_GPUS=2: on one GPU feplb's layer runs the copy probe, 50
// GEMMs of 4096³ that a GPU does in milliseconds and the simulation's CPU
// cuBLASLt not in minutes; bench kernels' ceilings at 1 MiB copies and a
// 64³ GEMM, where the GPU's are 1 GiB and 8192³). The budget is the GPU's, QUICK_BUDGET's 360 s: on the
// simulation each step must fit the limit it has on a GPU, where the layers
// are much larger but run on the GPU. The hanging test is stopped at its
// limit (LIMIT_test_hybridep=4) and the check goes on; every other step
// passes; the summary, printed last, names the step that timed out; OUTDIR
// holds the archive and summary.txt alone; the archive holds every step's
// log, doctor.txt, the five layers' records (one per dispatcher, each
// checked, and alltoall's under --cuda-graph), bench dispatch's and bench kernels' results (with their
// ceilings), the report and the summary, and no kernel cache.
func TestGPUCheckQuick(t *testing.T) {
	hostsim.SkipIfShort(t, "TestGPUCheckQuickDeadline (quick's budget, with a step that hangs) and TestBuildGPUBins")
	t.Setenv("FAKECUDA_SMS", "32")
	comp := hostsim.Setup(t)
	// the kernels compiled first, into the kernel cache the check's runs
	// share (MOEBENCH_CACHE): the C++ compiler takes minutes for what the
	// GPU's NVRTC compiles in about 16 s (every kernel file for sm_90,
	// measured with NVRTC 12.4 on a loaded CPU)
	old := device.NewCompiler
	device.NewCompiler = func() (device.Compiler, error) { return comp, nil }
	t.Cleanup(func() { device.NewCompiler = old })
	// hidden 128 (tiny's before it became 512): the simulation's work this test's budget was sized for
	shape := []string{"--preset", "tiny", "--tokens", "16", "--hidden", "128", "--ffn", "16", "--ep", "8", "--warmup", "0", "--iters", "1"}
	start := time.Now()
	for _, args := range [][]string{{"--dispatcher", "alltoall"}, {"--dispatcher", "deepep", "--sms", "2"}, {"--dispatcher", "feplb"},
		{"--dispatcher", "hybridep", "--sms", "2"}, {"bench", "dispatch", "--dispatcher", "deepep,hybridep", "--sms", "2,4"},
		{"--dispatcher", "hybridep", "--sms", "2", "--precision", "fp8"}} {
		if args[0] != "bench" {
			args = append([]string{"--device", "cuda"}, args...)
		}
		args = append(args, shape...)
		if slices.Contains(args, "fp8") { // HybridEP's fp8 needs hidden a multiple of 512 (QUICK_FP8 below)
			args = append(args, "--hidden", "512")
		}
		if code, _, e := cli(args...); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, e)
		}
	}
	t.Logf("the kernels compiled in %v", time.Since(start).Round(time.Second))
	testsLog := filepath.Join(t.TempDir(), "tests.log")
	const budget = 360 * time.Second
	outdir, out, code, took := gpuCheckQuick(t, "MOEBENCH_TEST_PROCESS=1", "MOEBENCH_TEST_SMALL_BENCH=1", "MOEBENCH_BIN="+os.Args[0],
		"BIN_DIR="+fakeTests(t, testsLog, map[string]string{"dispatchers_hybridep.test": "hang"}), "LIMIT_test_hybridep=4",
		"QUICK_SHAPE="+strings.Join(shape[:10], " "), "QUICK_FP8=--hidden 512", "QUICK_LAYER_SMS=2", "QUICK_SMS=2,4", "QUICK_ITERS=2", "QUICK_WARMUP=1", "QUICK_GPUS=2",
		fmt.Sprintf("QUICK_BUDGET=%.0f", budget.Seconds()))
	t.Logf("gpu-check.sh quick on the simulation: %v (budget %v)", took.Round(time.Second), budget)
	i := strings.LastIndex(out, "== gpu-check quick summary ==")
	if i < 0 {
		t.Fatalf("exit %d after %v, no summary:\n%s", code, took, out)
	}
	summary := out[i:]
	if code != 1 || took > budget || summaryLine(summary, "test-hybridep") != "FAIL (timed out after 4s)" ||
		!strings.Contains(summary, "failed, timed out or skipped: test-hybridep\n") {
		t.Errorf("exit %d after %v:\n%s", code, took, summary)
	}
	steps := []string{"doctor", "test-kernels", "test-deepep", "layer-alltoall", "layer-deepep", "layer-feplb", "layer-hybridep", "layer-alltoall-graph", "bench-dispatch", "bench-kernels", "layer-hybridep-fp8"}
	for _, s := range steps {
		if st := summaryLine(summary, s); !strings.HasPrefix(st, "exit 0 (") {
			t.Errorf("%s: %q", s, st)
		}
	}
	tests, _ := os.ReadFile(testsLog)
	for _, want := range []string{"kernels_comm.test -test.v -test.timeout 47s -test.run ^TestGPU -test.skip ^TestGPUNCCL$ MOEBENCH_REQUIRE_GPU=1",
		"dispatchers_deepep.test -test.v -test.timeout 27s -test.run ^TestGPUDeepEP$ MOEBENCH_REQUIRE_GPU=1",
		"dispatchers_hybridep.test -test.v -test.timeout 1s -test.run ^TestGPUHybridEPDevice$ MOEBENCH_REQUIRE_GPU=1"} {
		if !strings.Contains(string(tests), want+"\n") {
			t.Errorf("no %q in the tests' log:\n%s", want, tests)
		}
	}
	ents, _ := os.ReadDir(outdir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "gpu-check-quick.tgz summary.txt" {
		t.Errorf("OUTDIR holds %v", names)
	}
	if s, _ := os.ReadFile(filepath.Join(outdir, "summary.txt")); len(s) < 100 || !strings.HasPrefix(summary, string(s)) {
		t.Errorf("summary.txt:\n%s\nthe output's summary:\n%s", s, summary)
	}
	files := untar(t, filepath.Join(outdir, "gpu-check-quick.tgz"))
	defer func() {
		if t.Failed() {
			for _, s := range steps {
				if log := files[s+".log"]; !strings.HasPrefix(summaryLine(summary, s), "exit 0 (") {
					t.Logf("%s.log:\n%s", s, log[max(0, len(log)-3000):])
				}
			}
		}
	}()
	for _, f := range []string{"doctor.txt", "records.jsonl", "bench-dispatch.json", "bench-kernels.json", "report.txt", "summary.txt"} {
		if files[f] == "" {
			t.Errorf("no %s in the archive", f)
		}
	}
	for _, s := range append(steps, "test-hybridep") {
		if _, ok := files[s+".log"]; !ok {
			t.Errorf("no %s.log in the archive", s)
		}
	}
	for f := range files {
		if strings.HasPrefix(f, "kernel-cache") {
			t.Errorf("the archive holds the kernel cache: %s", f)
		}
	}
	recs, err := results.Read(strings.NewReader(files["records.jsonl"]), "records.jsonl", nil)
	if err != nil || len(recs) != 6 {
		t.Fatalf("%d records, %v", len(recs), err)
	}
	if r := recs[4]; !r.Config.CUDAGraph {
		t.Errorf("record 4: %s without --cuda-graph", r.Config.Dispatcher)
	}
	if r := recs[5]; r.Config.PrecisionName() != "fp8" || r.Config.Hidden != 512 || r.GEMM == nil || r.GEMM.FP8Path != "cublaslt-fp8-block" {
		t.Errorf("record 5: %s at %s, hidden %d, gemm %+v: want hybridep's fp8 layer at hidden 512 through cuBLASLt's block-scaled FP8 GEMM", r.Config.Dispatcher, r.Config.PrecisionName(), r.Config.Hidden, r.GEMM)
	}
	for i, d := range []string{"alltoall", "deepep", "feplb", "hybridep", "alltoall", "hybridep"} {
		if r := recs[i]; r.Config.Dispatcher != d || r.Status != results.StatusOK || r.Config.EP != 8 || r.Config.Device != "cuda" ||
			r.Correctness == nil || !r.Correctness.Passed || len(r.Ranks.Devices) != 8 || slices.Max(r.Ranks.Devices) != 1 || !r.Ranks.Emulated {
			t.Errorf("record %d: %s on %s at EP %d: %s (%s); ranks %+v", i, r.Config.Dispatcher, r.Config.Device, r.Config.EP, r.Status, r.Reason, r.Ranks)
		}
	}
	if !strings.Contains(files["bench-kernels.json"], "eiling") || strings.Count(files["bench-dispatch.log"], "round trip exact") != 5 {
		t.Errorf("bench kernels:\n%s\nbench dispatch:\n%s", files["bench-kernels.json"], files["bench-dispatch.log"])
	}
}

// TestGPUCheckQuickDeadline: gpu-check.sh quick keeps to QUICK_BUDGET
// whatever hangs. With a budget of 25 s (10 of them kept for the report
// and the archive) and a moebench that never ends, deaf to SIGTERM: doctor
// and two of the tests pass, deepep's is reported timed out by its own
// -test.timeout (a Go test binary's panic), the first layer is cut where the budget ends (12 s,
// its limit of 24 s shortened) and killed 3 s later, every later step is
// skipped, saying why; the whole stays within the budget, and the archive,
// with the summary, is written all the same.
func TestGPUCheckQuickDeadline(t *testing.T) {
	hostsim.SkipIfShort(t, "TestBuildGPUBins (the binaries quick carries)")
	dir := t.TempDir()
	mb := filepath.Join(dir, "moebench")
	os.WriteFile(mb, []byte("#!/bin/sh\n[ \"$1\" = doctor ] && { echo 'driver (libcuda)  found  a fake'; exit 0; }\ntrap '' TERM\nexec sleep 600\n"), 0o755)
	outdir, out, code, took := gpuCheckQuick(t, "MOEBENCH_BIN="+mb, "BIN_DIR="+fakeTests(t, filepath.Join(dir, "tests.log"), map[string]string{"dispatchers_deepep.test": "timeout"}), "QUICK_BUDGET=25")
	i := strings.LastIndex(out, "== gpu-check quick summary ==")
	if code != 1 || i < 0 || took > 25*time.Second {
		t.Fatalf("exit %d after %v:\n%s", code, took, out)
	}
	summary := out[i:]
	want := map[string]string{"doctor": "exit 0 (", "test-kernels": "exit 0 (", "test-hybridep": "exit 0 (",
		"test-deepep":    "FAIL (timed out after 0s: the test binary's -test.timeout; the log names the test)",
		"layer-alltoall": "FAIL (timed out after "}
	// layer-alltoall's limit is what the budget leaves (12 s on an idle
	// machine; less where the steps before it were slowed by load), never
	// under the 5 s below which a step is skipped
	var limit int
	if _, err := fmt.Sscanf(summaryLine(summary, "layer-alltoall"), "FAIL (timed out after %ds)", &limit); err != nil || limit < 5 || limit > 12 {
		t.Errorf("layer-alltoall: %q, want a limit in [5, 12] s", summaryLine(summary, "layer-alltoall"))
	}
	for _, s := range []string{"layer-deepep", "layer-feplb", "layer-hybridep", "layer-alltoall-graph", "bench-dispatch", "bench-kernels", "layer-hybridep-fp8"} {
		want[s] = "skipped (the quick check's 25s would be spent)"
	}
	for s, w := range want {
		if st := summaryLine(summary, s); !strings.HasPrefix(st, w) {
			t.Errorf("%s: %q, want %q", s, st, w)
		}
	}
	if !strings.Contains(summary, "failed, timed out or skipped: test-deepep layer-alltoall layer-deepep layer-feplb layer-hybridep layer-alltoall-graph bench-dispatch bench-kernels layer-hybridep-fp8\n") {
		t.Errorf("summary:\n%s", summary)
	}
	files := untar(t, filepath.Join(outdir, "gpu-check-quick.tgz"))
	if !strings.Contains(files["summary.txt"], "layer-alltoall") || !strings.Contains(files["doctor.txt"], "a fake") {
		t.Errorf("archive: %v", slices.Sorted(maps.Keys(files)))
	}
	t.Logf("%v in all", took.Round(time.Second))
}

// TestGPUTestsAreBuilt: every package with a TestGPU* test is one that
// scripts/build-gpu-bins.sh builds a test binary of (its full list), so the
// GPU check runs every GPU test; a GPU test moved to another package would
// otherwise never run on a node. cmd/moebench's TestGPU* test the check
// script itself, on the CPU.
func TestGPUTestsAreBuilt(t *testing.T) {
	script, err := os.ReadFile("../../scripts/build-gpu-bins.sh")
	if err != nil {
		t.Fatal(err)
	}
	var built []string
	for _, l := range strings.Split(string(script), "\n") {
		if v, ok := strings.CutPrefix(l, `pkgs="`); ok {
			built = strings.Fields(strings.TrimSuffix(v, `"`))
			break
		}
	}
	if len(built) == 0 {
		t.Fatal(`build-gpu-bins.sh: no pkgs="…" line`)
	}
	err = filepath.WalkDir("../..", func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		pkg, _ := filepath.Rel("../..", filepath.Dir(p))
		if !strings.Contains(string(b), "\nfunc TestGPU") || filepath.ToSlash(pkg) == "cmd/moebench" {
			return nil
		}
		if !slices.Contains(built, filepath.ToSlash(pkg)) {
			t.Errorf("%s has GPU tests, but build-gpu-bins.sh builds only %v", p, built)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
