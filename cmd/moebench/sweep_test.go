package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/dispatchers/alltoall"
	"github.com/moebench/moebench/results"
)

// failing is alltoall whose combine breaks: a point that fails at run time.
type failing struct{ dispatchers.Dispatcher }

// Forward is alltoall's with a combine that fails.
func (f failing) Forward(experts func(rank int) error) []dispatchers.Step {
	s := f.Dispatcher.Forward(experts)
	for i := range s {
		if s[i].Name == "combine" {
			s[i].Run = func(int) error { return errors.New("combine: simulated failure") }
		}
	}
	return s
}

func init() {
	dispatchers.Register("failing", func(impl string, env dispatchers.Env) (dispatchers.Dispatcher, error) {
		d, err := alltoall.New(impl, env)
		return failing{d}, err
	})
}

var sweepQuick = []string{"--device", "host", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--warmup", "0", "--iters", "3"}

func TestSweepContinuesAfterFailure(t *testing.T) {
	out := filepath.Join(t.TempDir(), "s.jsonl")
	code, _, stderr := cli(append([]string{"sweep", "--out", out, "--dispatchers", "failing,alltoall,deepep,hybridep",
		"--sms", "8,16", "--ep", "2,16"}, sweepQuick...)...)
	if code != exitRuntime { // a point failed
		t.Fatalf("exit %d, want 1: %s", code, stderr)
	}
	recs, err := results.ReadFile(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	// per EP size: failing, alltoall (once: no SMs), deepep (unavailable at
	// EP 16) and hybridep at 8 and 16 SMs
	got := map[string]int{}
	for _, r := range recs {
		got[r.Config.Dispatcher+":"+r.Status]++
	}
	want := map[string]int{"failing:failed": 2, "alltoall:ok": 2, "deepep:ok": 2, "deepep:unavailable": 2, "hybridep:ok": 4}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %d records, want %d (all: %v)", k, got[k], v, got)
		}
	}
	if !strings.Contains(stderr, "[12/12]") || !strings.Contains(stderr, "12 of 12 points: 8 ok, 2 unavailable, 2 failed") ||
		!strings.Contains(stderr, "simulated failure") {
		t.Errorf("progress:\n%s", stderr)
	}
}

func TestSweepFileAndValidation(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "sweep.json")
	os.WriteFile(file, []byte(`{"dispatchers": ["alltoall"], "ep": [2, 4], "routings": ["balanced", "skewed:1"],
		"tokens": 16, "hidden": 32, "ffn": 16, "iters": 3, "warmup": 0, "device": "host", "ep": [2, 4]}`), 0o644)
	out := filepath.Join(dir, "s.jsonl")
	// the command line wins over the file: --ep 2 only
	code, _, stderr := cli("sweep", "--file", file, "--out", out, "--ep", "2")
	recs, err := results.ReadFile(out, nil)
	if code != exitOK || err != nil || len(recs) != 2 || recs[0].Config.EP != 2 || recs[1].Config.Routing != "skewed:1" {
		t.Fatalf("exit %d, %d records, %v: %s", code, len(recs), err, stderr)
	}
	os.WriteFile(file, []byte(`{"dispatchers": ["alltoall"], "dispatcherz": "alltoall"}`), 0o644)
	if code, _, e := cli("sweep", "--file", file, "--out", out); code != exitUsage || !strings.Contains(e, `unknown key "dispatcherz"`) {
		t.Errorf("unknown key: exit %d, %s", code, e)
	}
	// a bad point is refused before anything runs
	code, _, e := cli(append([]string{"sweep", "--out", out, "--ep", "4,3"}, sweepQuick...)...)
	if code != exitUsage || !strings.Contains(e, "ep=3") || !strings.Contains(e, "--ep=3: must divide --experts (16)") {
		t.Errorf("bad point: exit %d, %s", code, e)
	}
	if code, _, e := cli("sweep"); code != exitUsage || !strings.Contains(e, "--out FILE is required") {
		t.Errorf("no --out: exit %d, %s", code, e)
	}
}

// TestSweepInterrupt runs a real moebench binary, interrupts it after the
// first point and checks that the results file is valid and partial.
func TestSweepInterrupt(t *testing.T) {
	bin, dir := buildBinary(t)
	out := filepath.Join(dir, "s.jsonl")
	cmd := exec.Command(bin, append([]string{"sweep", "--out", out, "--ep", "1,2,4,8,16", "--routings", "balanced,uniform,natural"},
		"--device", "host", "--tokens", "64", "--iters", "30")...)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.HasPrefix(sc.Text(), "[1/15]") {
			cmd.Process.Signal(syscall.SIGINT)
		}
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("exit: %v, want 130\n%s", err, strings.Join(lines, "\n"))
	}
	recs, err := results.ReadFile(out, nil)
	if err != nil || len(recs) < 1 || len(recs) >= 15 {
		t.Fatalf("after interrupt: %d records, %v", len(recs), err)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "stopping after the current point") {
		t.Errorf("no interrupt message:\n%s", strings.Join(lines, "\n"))
	}
}

func TestCompareCLI(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.jsonl")
	if code, _, e := cli(append(quick, "--out", base, "--iters", "12")...); code != exitOK {
		t.Fatal(e)
	}
	// controlled samples (1% ripple) so that the test proves the CLI path;
	// the decision itself is tested on synthetic data in package results
	recs, _ := results.ReadFile(base, nil)
	withSamples := func(scale float64, device string) results.Record {
		r := recs[0]
		tm := *r.Timing
		tm.Step.Samples = nil
		for i := range 12 {
			tm.Step.Samples = append(tm.Step.Samples, scale*(1+0.01*math.Sin(float64(i))))
		}
		r.Timing = &tm
		r.Config.Device, r.Stack.Device = device, device
		return r
	}
	write := func(name string, rs ...results.Record) string {
		f := filepath.Join(dir, name)
		for i := range rs {
			if _, err := results.Append(f, &rs[i]); err != nil {
				t.Fatal(err)
			}
		}
		return f
	}
	// the fine test, on cuda-device records
	base = write("base2.jsonl", withSamples(1, "cuda"))
	if code, out, e := cli("compare", base, base); code != exitOK || !strings.Contains(out, "0 regressions") {
		t.Errorf("A/A: exit %d\n%s%s", code, out, e)
	}
	slow := withSamples(1.1, "cuda")
	newFile := write("new.jsonl", slow)
	code, out, _ := cli("compare", base, newFile)
	if code != exitRegression || !strings.Contains(out, "REGRESSION") || !strings.Contains(out, "+10.0") {
		t.Errorf("10%% slower: exit %d\n%s", code, out)
	}
	if code, _, _ := cli("compare", "--threshold-pct", "20", base, newFile); code != exitOK {
		t.Errorf("10%% slower with a 20%% threshold: exit %d", code)
	}
	// host records: a 10% shift is undecided (exit 0, or 5 when undecided
	// points fail the job); a 10× slowdown is a regression
	hostBase := write("host-base.jsonl", withSamples(1, "host"))
	hostSlow := write("host-slow.jsonl", withSamples(1.1, "host"))
	if code, out, e := cli("compare", hostBase, hostSlow); code != exitOK || !strings.Contains(out, "host timing") || !strings.Contains(e, "could not be decided") {
		t.Errorf("10%% slower on the host: exit %d\n%s%s", code, out, e)
	}
	if code, _, _ := cli("compare", "--fail-on-undecided", hostBase, hostSlow); code != exitUndecided {
		t.Errorf("--fail-on-undecided: exit %d, want %d", code, exitUndecided)
	}
	if code, out, _ := cli("compare", hostBase, write("host-10x.jsonl", withSamples(10, "host"))); code != exitRegression || !strings.Contains(out, "gross slowdown") {
		t.Errorf("10× slower on the host: exit %d\n%s", code, out)
	}
	// a stack that differs in what changes results is refused (a new
	// baseline is needed), then compared with the differences named
	other := slow
	other.Stack.CPU = "Another CPU"
	otherFile := write("other.jsonl", other)
	if code, _, e := cli("compare", base, otherFile); code != exitStackChange || !strings.Contains(e, "different stacks") || !strings.Contains(e, "Another CPU") {
		t.Errorf("stack change: exit %d, %s", code, e)
	}
	if code, out, _ := cli("compare", "--allow-stack-change", base, otherFile); code != exitRegression || !strings.Contains(out, "# stacks differ") {
		t.Errorf("allowed stack change: exit %d\n%s", code, out)
	}
	// another precision: a new baseline is needed, as for a stack change
	fp8 := slow
	fp8.Config.Precision = "fp8"
	if code, _, e := cli("compare", base, write("fp8.jsonl", fp8)); code != exitStackChange || !strings.Contains(e, "precision: bf16 → fp8") {
		t.Errorf("bf16 base, fp8 new: exit %d, %s", code, e)
	}
	// a forward-only baseline against training steps: a new baseline is needed
	fwdOnly := withSamples(1, "cuda")
	fwdOnly.Config.Pass = results.PassForward
	if code, _, e := cli("compare", write("fwd.jsonl", fwdOnly), base); code != exitStackChange || !strings.Contains(e, "base times fwd and new fwd+bwd") {
		t.Errorf("forward-only base, training steps new: exit %d, %s", code, e)
	}
	// harmless differences (memory rounding, the kernel's patch level) are a note
	rebooted := withSamples(1, "cuda")
	rebooted.Stack.MemoryBytes += 8192
	rebooted.Stack.OS += "-patched"
	if code, out, e := cli("compare", base, write("rebooted.jsonl", rebooted)); code != exitOK || !strings.Contains(out, "# note: the stacks differ only") || !strings.Contains(out, "memory_bytes") {
		t.Errorf("harmless stack change: exit %d\n%s%s", code, out, e)
	}
	// bad input
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte("{}\n"), 0o644)
	if code, _, e := cli("compare", base, bad); code != exitUsage || !strings.Contains(e, "bad.jsonl:1:") {
		t.Errorf("malformed file: exit %d, %s", code, e)
	}
	if code, _, _ := cli("compare", base); code != exitUsage {
		t.Errorf("one file: exit %d", code)
	}
}

func TestReportCLI(t *testing.T) {
	f := filepath.Join(t.TempDir(), "r.jsonl")
	cli(append(quick, "--out", f)...)
	cli(append(quick, "--out", f, "--dispatcher", "hybridep", "--impl", "library", "--sms", "16")...)
	for _, format := range results.ReportFormats {
		code, out, e := cli("report", "--format", format, f)
		if code != exitOK || !strings.Contains(out, "hybridep") || !strings.Contains(out, "unavailable") {
			t.Errorf("%s: exit %d %s\n%s", format, code, e, out)
		}
	}
	if code, _, _ := cli("report", "--format", "pdf", f); code != exitUsage {
		t.Errorf("bad format: exit %d", code)
	}
	if code, _, e := cli("report", filepath.Join(t.TempDir(), "none")); code != exitUsage || !strings.Contains(e, "no such file") {
		t.Errorf("missing file: exit %d %s", code, e)
	}
	var js map[string]any
	_, out, _ := cli(append(quick, "--format", "json")...)
	if json.Unmarshal([]byte(out), &js) != nil || js["stack"].(map[string]any)["kernel_source_hash"] == "" {
		t.Errorf("json record lacks the kernel source hash: %s", out)
	}
}

// TestPublishedReadmeInSync: results/published/README.md must be exactly what
// `moebench report --format markdown results/published/*.jsonl` prints (run
// from the repository root).
func TestPublishedReadmeInSync(t *testing.T) {
	t.Chdir("../..")
	files, _ := filepath.Glob("results/published/*.jsonl")
	if len(files) == 0 {
		t.Fatal("no published records")
	}
	code, out, e := cli(append([]string{"report", "--format", "markdown"}, files...)...)
	if code != exitOK {
		t.Fatal(e)
	}
	want, err := os.ReadFile("results/published/README.md")
	if err != nil || string(want) != out {
		t.Errorf("results/published/README.md is out of date; regenerate it with\n  go run ./cmd/moebench report --format markdown results/published/*.jsonl > results/published/README.md")
	}
}

// TestPublishedRunReportsInSync: each GPU run's report.md under
// results/published/DATE/RUN/ must be exactly what `moebench report
// --format markdown RUN/*/*.jsonl` prints, run from DATE's folder.
func TestPublishedRunReportsInSync(t *testing.T) {
	reports, _ := filepath.Glob("../../results/published/*/*/report.md")
	for _, rep := range reports {
		run := filepath.Dir(rep)
		date, name := filepath.Dir(run), filepath.Base(run)
		t.Run(filepath.Base(date)+"/"+name, func(t *testing.T) {
			t.Chdir(date)
			files, _ := filepath.Glob(filepath.Join(name, "*", "*.jsonl"))
			slices.Sort(files)
			code, out, e := cli(append([]string{"report", "--format", "markdown"}, files...)...)
			if code != exitOK {
				t.Fatal(e)
			}
			if want, err := os.ReadFile(filepath.Join(name, "report.md")); err != nil || string(want) != out {
				t.Errorf("%s is out of date; regenerate it in %s with\n  moebench report --format markdown %s > %s/report.md", rep, date, strings.Join(files, " "), name)
			}
		})
	}
}

// TestSweepGPUs: --gpus is an axis of the matrix; a count above a point's EP
// size is no point, and on the host device (auto without a GPU) the counts
// do not apply, so points that differ only in them run once.
func TestSweepGPUs(t *testing.T) {
	t.Setenv("MOEBENCH_LIBCUDA", "/nonexistent/libcuda.so.1") // auto: the host
	out := filepath.Join(t.TempDir(), "s.jsonl")
	quick := append([]string{}, sweepQuick[2:]...) // without --device host
	code, _, stderr := cli(append([]string{"sweep", "--out", out, "--ep", "1,2", "--gpus", "0,2"}, quick...)...)
	recs, err := results.ReadFile(out, nil)
	if code != exitOK || err != nil || len(recs) != 2 || recs[0].Config.GPUs != 0 || recs[1].Config.EP != 2 ||
		!strings.Contains(stderr, "2 points on the host device") || !strings.Contains(stderr, "--gpus does not apply: 1 point(s) that differed only in it left out") {
		t.Fatalf("exit %d, %d records, %v: %s", code, len(recs), err, stderr)
	}
	if code, _, e := cli(append([]string{"sweep", "--out", out, "--ep", "1,2", "--gpus", "4"}, quick...)...); code != exitUsage ||
		!strings.Contains(e, "--gpus=[4]: every count is above every EP size (--ep [1 2]): no point left") {
		t.Errorf("no point left: exit %d, %s", code, e)
	}
	if code, _, e := cli(append([]string{"sweep", "--out", out, "--gpus", "2"}, sweepQuick...)...); code != exitUsage ||
		!strings.Contains(e, "gpus=2") || !strings.Contains(e, "the host device has no GPUs") {
		t.Errorf("--device host --gpus 2: exit %d, %s", code, e)
	}
}
