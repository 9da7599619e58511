package main

import (
	"bytes"
	"encoding/binary"
	"encoding/csv"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/results"
)

// quick keeps CLI runs fast under -race.
var quick = []string{"--device", "host", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--ep", "4", "--warmup", "0", "--iters", "2"}

func cli(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--topk", "20"}, "--topk=20: must be in [1, --experts=16]"},
		{[]string{"--ep", "3"}, "--ep=3: must divide --experts (16); allowed: 1, 2, 4, 8, 16"},
		{[]string{"--groups", "3", "--topk-groups", "1"}, "--groups=3: must divide --experts (16)"},
		{[]string{"--hidden", "0"}, "--hidden=0: must be in [1, 1048576]"},
		{[]string{"--tokens", "-5"}, "--tokens=-5: must be in [1, 1048576]"},
		{[]string{"--preset", "gpt-5"}, "--preset=gpt-5: allowed: tiny, deepseek-v3"},
		{[]string{"--dispatcher", "nccl"}, "--dispatcher=nccl: allowed: alltoall, deepep, "},
		{[]string{"--routing", "zipf:2"}, "--routing=zipf:2: allowed: balanced"},
		{[]string{"--routing", "trace:/no/such/file"}, "--routing=trace:/no/such/file: open /no/such/file"},
		{[]string{"--format", "xml"}, "--format=xml: allowed: table, json, csv"},
		{[]string{"--score", "relu"}, "--score=relu: allowed: softmax, sigmoid"},
		{[]string{"--impl", "fast"}, "--impl=fast: allowed: native, library"},
		{[]string{"--iters", "x"}, `invalid argument "x" for "--iters"`},
		{[]string{"--iters", "2000000000"}, "--iters=2000000000: must be in [1, 1000000] (use --max-seconds to bound a run by time)"},
		{[]string{"--warmup", "2000000000"}, "--warmup=2000000000: must be in [0, 1000000]"},
		{[]string{"--max-seconds", "-1"}, "--max-seconds=-1: must be in [0, 604800] (0 = no limit)"},
		{[]string{"--max-seconds", "nan"}, "--max-seconds=NaN: must be in [0, 604800]"},
		{[]string{"--topk", "1"}, "--topk=1: with --score softmax, top-1 takes the softmax over the chosen logit alone, which is 1 for every token"},
		{[]string{"--score", "sigmoid", "--pre-softmax"}, "--pre-softmax=true: applies to --score softmax only"},
		{[]string{"--dispatcher", "feplb", "--feplb-base", "bogus"}, "--feplb-base=bogus: the dispatcher of feplb's phase 1; allowed: alltoall, deepep, "},
		{[]string{"--feplb-base", "deepep"}, "--feplb-base=deepep: applies only to --dispatcher feplb"},
		{[]string{"--feplb-dynamic", "3"}, "--feplb-dynamic=3: applies only to --dispatcher feplb"},
		{[]string{"--permute-sms", "4"}, "--permute-sms=4: applies only to --dispatcher hybridep"},
		{[]string{"--dispatcher", "hybridep", "--preprocess-sms", "2000"}, "--preprocess-sms=2000: must be in [0, 1024] (0 = the default)"},
		{[]string{"--bogus"}, "unknown flag: --bogus"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
	}
	for _, c := range cases {
		code, out, errOut := cli(c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) || out != "" {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", c.args, code, errOut, c.want)
		}
	}
}

func TestBadTraceNamesLine(t *testing.T) {
	p := filepath.Join(t.TempDir(), "t.txt")
	for body, want := range map[string]string{
		"0 1 2 3\n0 1 2 99\n":                       p + ":2: expert 99 out of range [0, 16)",
		"0:.4 1:.3 2:.2 3:.1\n0:3e38 1:0 2:0 3:0\n": p + `:2: probability "3e38" must be a number in [0, 1e+06]`,
		"0 1 2 3\n" + strings.Repeat(" ", 2<<20):    p + ":2: line longer than 1048576 bytes, the longest a trace line may be",
	} {
		os.WriteFile(p, []byte(body), 0o644)
		code, _, errOut := cli("--routing", "trace:"+p)
		if code != exitUsage || !strings.Contains(errOut, want) {
			t.Errorf("exit %d, stderr %q; want %q", code, errOut, want)
		}
	}
	code, _, errOut := cli("--routing", "trace:/dev/zero")
	if code != exitUsage || !strings.Contains(errOut, "/dev/zero:1: line longer than 1048576 bytes") {
		t.Errorf("trace:/dev/zero: exit %d, stderr %q", code, errOut)
	}
}

// TestRecordWithoutSections: a record the reader would once accept without
// its sections is refused by report and compare, naming the file, line and
// section, instead of crashing them.
func TestRecordWithoutSections(t *testing.T) {
	p := filepath.Join(t.TempDir(), "r.jsonl")
	os.WriteFile(p, []byte(`{"schema":"moebench.record/v1","status":"ok"}`+"\n"), 0o644)
	for _, args := range [][]string{{"report", p}, {"compare", p, p}} {
		code, _, errOut := cli(args...)
		if code != exitUsage || !strings.Contains(errOut, p+`:1: an ok record without "timing"`) {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
}

func TestDoctor(t *testing.T) {
	code, out, _ := cli("doctor")
	for _, want := range []string{"component", "NVRTC", "cuBLASLt", "NCCL", "NVML", "the host device is always available"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("doctor: exit %d, missing %q\n%s", code, want, out)
		}
	}
}

func TestHelpAndPresets(t *testing.T) {
	code, out, _ := cli("--help")
	for _, want := range []string{"Usage:", "--dispatcher", "--routing", "skewed:ALPHA", "Exit status"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("--help: exit %d, missing %q", code, want)
		}
	}
	code, out, _ = cli("presets")
	for _, want := range []string{"deepseek-v3", "7168", "qwen3-next-80b", "glm-4.5", "8/top-4"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("presets: exit %d, missing %q in\n%s", code, want, out)
		}
	}
}

func TestRunWritesAndRereadsRecord(t *testing.T) {
	out := filepath.Join(t.TempDir(), "results.jsonl")
	code, stdout, stderr := cli(append(quick, "--out", out, "--routing", "skewed:1")...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stderr, "running on the host device") || !strings.Contains(stdout, "correctness            PASS") {
		t.Errorf("stderr %q\nstdout %s", stderr, stdout)
	}
	code, stdout, _ = cli(append(quick, "--out", out, "--format", "json", "--dispatcher", "hybridep", "--impl", "library")...)
	if code != exitRuntime || !strings.Contains(stdout, `"status":"unavailable"`) {
		t.Errorf("hybridep: exit %d, stdout %s", code, stdout)
	}
	recs, err := results.ReadFile(out, nil)
	if err != nil || len(recs) != 2 {
		t.Fatalf("re-read: %d records, %v", len(recs), err)
	}
	ok, un := recs[0], recs[1]
	if ok.Status != results.StatusOK || ok.Config.Routing != "skewed:1" || ok.Config.Preset != "tiny+custom" ||
		ok.Timing == nil || len(ok.Timing.Phases) != 14 || ok.Config.Pass != results.PassTraining || ok.Correctness == nil || !ok.Correctness.Passed {
		t.Errorf("first record: %+v", ok)
	}
	if un.Status != results.StatusUnavailable || un.Timing != nil || !strings.Contains(un.Reason, "hybridep") {
		t.Errorf("second record: %+v", un)
	}
}

func TestDeviceCUDAWithoutGPU(t *testing.T) {
	if os.Getenv("MOEBENCH_REQUIRE_GPU") == "1" {
		t.Skip("a GPU is present")
	}
	code, out, e := cli(append(quick, "--device", "cuda", "--format", "json")...)
	if code != exitRuntime || !strings.Contains(out, `"status":"unavailable"`) || !strings.Contains(e, "device cuda") {
		t.Errorf("--device cuda: exit %d\n%s\n%s", code, out, e)
	}
}

// TestGPUsFlag: --gpus is checked against --ep and the device; when auto
// falls back to the host it does not apply, and the run says so.
func TestGPUsFlag(t *testing.T) {
	t.Setenv("MOEBENCH_LIBCUDA", "/nonexistent")
	for _, args := range [][]string{{"--gpus", "5"}, {"--gpus", "-1"}, {"--gpus", "2"}} { // quick has --ep 4 --device host
		if code, _, e := cli(append(quick, args...)...); code != exitUsage || !strings.Contains(e, "--gpus="+args[1]) {
			t.Errorf("%v: exit %d, %s", args, code, e)
		}
	}
	code, _, e := cli(append(quick, "--device", "auto", "--gpus", "2")...)
	if code != exitOK || !strings.Contains(e, "running on the host device") || !strings.Contains(e, "--gpus 2 does not apply") {
		t.Errorf("auto without a GPU, --gpus 2: exit %d, %s", code, e)
	}
}

// TestCudaLibsFlag: doctor --cuda-libs finds a library in the folder given,
// and rejects a stray argument.
func TestCudaLibsFlag(t *testing.T) {
	dir := t.TempDir()
	so, err := hostsim.BuildFake("fakecublaslt", dir, "libcublasLt.so.13")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(cuda.LibDirsEnv, "")
	t.Setenv("MOEBENCH_CUBLASLT", "")
	code, out, _ := cli("doctor", "--cuda-libs", dir)
	if code != exitOK || !strings.Contains(out, so) {
		t.Errorf("doctor --cuda-libs: exit %d\n%s", code, out)
	}
	if code, _, _ := cli("doctor", "extra"); code != exitUsage {
		t.Errorf("doctor extra: exit %d", code)
	}
}

func TestCSVAndNoCheck(t *testing.T) {
	code, stdout, _ := cli(append(quick, "--format", "csv", "--check=false")...)
	rows, err := csv.NewReader(strings.NewReader(stdout)).ReadAll()
	if code != exitOK || err != nil || len(rows) != 2 {
		t.Fatalf("exit %d, %v, csv:\n%s", code, err, stdout)
	}
	got := map[string]string{}
	for i, h := range rows[0] {
		got[h] = rows[1][i]
	}
	for k, v := range map[string]string{"preset": "tiny+custom", "dispatcher": "alltoall", "impl": "native", "ep": "4", "device": "host", "status": "ok", "checked": "false", "max_rel_err": ""} {
		if got[k] != v {
			t.Errorf("csv %s = %q, want %q", k, got[k], v)
		}
	}
}

func TestDump(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dump")
	code, _, stderr := cli(append(quick, "--dump", dir, "--score", "sigmoid")...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var idx struct {
		Files []struct {
			File  string
			DType string
			Shape []int
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil || json.Unmarshal(b, &idx) != nil {
		t.Fatalf("index.json: %v", err)
	}
	names := map[string][]int{}
	for _, f := range idx.Files {
		names[f.File] = f.Shape
		checkNpy(t, filepath.Join(dir, f.File), f.Shape)
	}
	for f, shape := range map[string][]int{"x.npy": {64, 32}, "fc1.npy": {16, 32, 32}, "routing_idx.npy": {64, 4},
		"output.npy": {64, 32}, "router_bias.npy": {16}, "shared_fc2.npy": {32, 16}, "router_logits_override.npy": {64, 16}} {
		if got := names[f]; len(got) != len(shape) {
			t.Errorf("%s: shape %v, want %v", f, got, shape)
		}
	}
	if code, _, errOut := cli(append(quick, "--dump", dir)...); code != exitUsage || !strings.Contains(errOut, "new or empty directory") {
		t.Errorf("dump into a full dir: exit %d, %q", code, errOut)
	}
}

// checkNpy reads an NPY v1 header and checks the shape and the data size.
func checkNpy(t *testing.T, path string, shape []int) {
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 10 || string(b[:8]) != "\x93NUMPY\x01\x00" {
		t.Fatalf("%s: not NPY v1 (%v)", path, err)
	}
	hl := int(binary.LittleEndian.Uint16(b[8:10]))
	if (10+hl)%64 != 0 || b[10+hl-1] != '\n' {
		t.Fatalf("%s: header length %d not aligned to 64 or not newline-terminated", path, hl)
	}
	n := 4
	for _, s := range shape {
		n *= s
	}
	if len(b)-10-hl != n {
		t.Fatalf("%s: %d data bytes, shape %v needs %d", path, len(b)-10-hl, shape, n)
	}
}

// TestDeviceCUDAFingerprintWithFakeDriver: with a (fake) driver and GPUs but
// no cuBLASLt, --device cuda records unavailable, naming the library, and
// its stack carries the GPU fingerprint; auto falls back to the host.
func TestDeviceCUDAFingerprintWithFakeDriver(t *testing.T) {
	so, err := hostsim.BuildFake("fakecuda", t.TempDir(), "libfakecuda.so")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOEBENCH_LIBCUDA", so)
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	t.Setenv("MOEBENCH_CUBLASLT", "/nonexistent")
	out := filepath.Join(t.TempDir(), "r.jsonl")
	code, _, e := cli(append(quick, "--device", "cuda", "--out", out)...)
	recs, err := results.ReadFile(out, nil)
	if code != exitRuntime || err != nil || len(recs) != 1 {
		t.Fatalf("exit %d, %v: %s", code, err, e)
	}
	g := recs[0].Stack.GPU
	if recs[0].Status != results.StatusUnavailable || !strings.Contains(recs[0].Reason, "MOEBENCH_CUBLASLT") || g == nil || g.Model != "Fake GPU 0" || g.Count != 2 || g.SMs != 4 ||
		!strings.Contains(recs[0].Stack.Note, "2 GPU(s), Fake GPU 0, driver API 13.0") {
		t.Errorf("record: status %s, note %q, gpu %+v", recs[0].Status, recs[0].Stack.Note, g)
	}
	// auto sees the GPU but, as the cuda device does not open without
	// cuBLASLt, runs on the host and says why
	_, _, e = cli(append(quick, "--device", "auto")...)
	if !strings.Contains(e, "running on the host device (2 GPU(s), Fake GPU 0") || !strings.Contains(e, "the cuda device does not open: MOEBENCH_CUBLASLT") {
		t.Errorf("auto with a GPU: %s", e)
	}
}

func TestBenchKernelsCLI(t *testing.T) {
	t.Setenv("MOEBENCH_LIBCUDA", "/nonexistent")
	if code, _, e := cli("bench", "kernels", "--preset", "tiny"); code != exitRuntime || !strings.Contains(e, "needs the cuda device") {
		t.Errorf("without a GPU: exit %d, %s", code, e)
	}
	for _, args := range [][]string{{"bench"}, {"bench", "gemm"}, {"bench", "kernels", "--format", "csv"}, {"bench", "kernels", "--hidden", "12"}} {
		if code, _, e := cli(args...); code != exitUsage {
			t.Errorf("%v: exit %d, %s", args, code, e)
		}
	}
	if code, out, _ := cli("bench", "kernels", "--help"); code != exitOK || !strings.Contains(out, "ceilings") {
		t.Errorf("help: exit %d", code)
	}
}

// TestEveryCommandHelps: each command answers --help with its own usage, and
// 'moebench help CMD' prints the same; --version works; a wrong benchmark is
// named.
func TestEveryCommandHelps(t *testing.T) {
	for _, args := range [][]string{{"run"}, {"sweep"}, {"report"}, {"compare"}, {"straggler"}, {"bench"}, {"bench", "kernels"},
		{"bench", "dispatch"}, {"advise"}, {"presets"}, {"doctor"}, {"version"}, {"help"}} {
		code, out, errOut := cli(append(append([]string(nil), args...), "--help")...)
		want := "moebench " + strings.Join(args, " ")
		if args[0] == "run" {
			want = "moebench runs one"
		}
		if code != exitOK || !strings.HasPrefix(out, want) || errOut != "" {
			t.Errorf("%v --help: exit %d, starts %.60q, stderr %q", args, code, out, errOut)
			continue
		}
		if code, viaHelp, _ := cli(append([]string{"help"}, args...)...); code != exitOK || viaHelp != out {
			t.Errorf("help %v: exit %d, differs from %v --help", args, code, args)
		}
	}
	if code, out, _ := cli("--version"); code != exitOK || !strings.HasPrefix(out, "moebench 0.") {
		t.Errorf("--version: exit %d, %q", code, out)
	}
	_, top, _ := cli("--help")
	for _, name := range commandOrder {
		if !strings.Contains(top, "moebench "+name) {
			t.Errorf("--help does not list %s", name)
		}
	}
	if code, _, e := cli("bench", "foo"); code != exitUsage || !strings.Contains(e, `unknown benchmark "foo" (known: kernels, dispatch)`) {
		t.Errorf("bench foo: exit %d, %s", code, e)
	}
	if code, _, e := cli("help", "nope"); code != exitUsage || !strings.Contains(e, `unknown command "nope"`) {
		t.Errorf("help nope: exit %d, %s", code, e)
	}
}

// TestNoGPUReasonOnce: a host run gives the long reason for not using a GPU
// once (stderr); the table's header keeps its first clause.
func TestNoGPUReasonOnce(t *testing.T) {
	t.Setenv("MOEBENCH_LIBCUDA", filepath.Join(t.TempDir(), "no-libcuda.so"))
	code, out, errOut := cli("--iters", "2", "--warmup", "0", "--tokens", "16")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if n := strings.Count(out+errOut, "cannot open shared object file"); n != 1 {
		t.Errorf("the no-GPU reason appears %d times:\n%s%s", n, errOut, out)
	}
	if !strings.Contains(out, "device host (no GPU") {
		t.Errorf("the table's header lost the device note:\n%s", out)
	}
}
