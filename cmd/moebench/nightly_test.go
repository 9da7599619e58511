package main

import (
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/results"
)

// buildBinary builds moebench into a temporary directory and returns the
// binary and the directory; it skips the test under -short.
func buildBinary(t *testing.T) (bin, dir string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds a binary")
	}
	dir = t.TempDir()
	bin = filepath.Join(dir, "moebench")
	if b, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	return bin, dir
}

// TestNightlyScript runs scripts/nightly.sh twice with a small sweep: the
// first run stores the baseline, the second is compared with it.
func TestNightlyScript(t *testing.T) {
	bin, dir := buildBinary(t)
	sweep := filepath.Join(dir, "sweep.json")
	os.WriteFile(sweep, []byte(`{"dispatcher": ["alltoall", "hybridep"], "sms": [16], "ep": [4], "tokens": 16,
		"hidden": 32, "ffn": 16, "iters": 8, "warmup": 1, "device": "host"}`), 0o644)
	night := filepath.Join(dir, "nightly")
	run := func() (int, string) {
		cmd := exec.Command("bash", "../../scripts/nightly.sh", sweep)
		cmd.Env = append(os.Environ(), "MOEBENCH_BIN="+bin, "MOEBENCH_NIGHTLY_DIR="+night)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	if code, out := run(); code != 0 || !strings.Contains(out, "this run is now") {
		t.Fatalf("first night: exit %d\n%s", code, out)
	}
	// host timings of identical runs drift, but only a gross slowdown (5×)
	// decides a host point: the second night passes, its points undecided
	code, out := run()
	if code != 0 || !strings.Contains(out, "points,") || !strings.Contains(out, "host timing") {
		t.Fatalf("second night: exit %d\n%s", code, out)
	}
	hist, err := results.ReadFile(filepath.Join(night, "history.jsonl"), nil)
	if err != nil || len(hist) != 4 {
		t.Errorf("history: %d records, %v", len(hist), err)
	}
	reports, _ := filepath.Glob(filepath.Join(night, "reports", "*"))
	if len(reports) != 3 { // two html pages, one comparison
		t.Errorf("reports: %v", reports)
	}
	// a baseline from another stack (e.g. a new CPU) asks for a new
	// baseline, with an exit status of its own
	host, _ := os.Hostname()
	host, _, _ = strings.Cut(host, ".")
	baseline := filepath.Join(night, "baseline-"+host+".jsonl")
	recs, err := results.ReadFile(baseline, nil)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(baseline)
	for i := range recs {
		recs[i].Stack.CPU = "Another CPU"
		if _, err := results.Append(baseline, &recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if code, out := run(); code != 4 || !strings.Contains(out, "a new baseline is needed") {
		t.Errorf("changed stack: exit %d, want 4\n%s", code, out)
	}
}

// TestStragglerTableInSync re-runs scripts/straggler-table.sh and compares
// its output with the committed results/straggler/README.md.
func TestStragglerTableInSync(t *testing.T) {
	bin, dir := buildBinary(t)
	out := filepath.Join(dir, "README.md")
	cmd := exec.Command("bash", "../../scripts/straggler-table.sh", out)
	cmd.Env = append(os.Environ(), "MOEBENCH_BIN="+bin)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("straggler-table.sh: %v\n%s", err, b)
	}
	got, _ := os.ReadFile(out)
	want, err := os.ReadFile("../../results/straggler/README.md")
	if err != nil || string(got) != string(want) {
		t.Error("results/straggler/README.md is out of date: run scripts/straggler-table.sh")
	}
}

// TestNightlyScriptUsage: scripts/nightly.sh refuses extra arguments (exit
// 2, naming them) and a MOEBENCH_BIN that is not an executable file (exit
// 1, as documented for a sweep that cannot run), before any work.
func TestNightlyScriptUsage(t *testing.T) {
	dir := t.TempDir()
	night := filepath.Join(dir, "nightly")
	for _, c := range []struct {
		args []string
		bin  string
		code int
		want string
	}{
		{[]string{"a.json", "b.json"}, "/bin/true", 2, `nightly: unexpected argument "b.json"`},
		{[]string{"a.json", "--threshold-pct", "3"}, "/bin/true", 2, `nightly: unexpected argument "--threshold-pct"`},
		{nil, filepath.Join(dir, "no-such-moebench"), 1, "nightly: MOEBENCH_BIN=" + filepath.Join(dir, "no-such-moebench") + ": not an executable file"},
		{nil, dir, 1, "nightly: MOEBENCH_BIN=" + dir + ": not an executable file"},
		{[]string{"--bogus"}, "/bin/true", 2, `nightly: unexpected argument "--bogus"`},
		{[]string{"--help"}, "/bin/true", 0, "Nightly regression run for this node"},
	} {
		cmd := exec.Command("bash", append([]string{"../../scripts/nightly.sh"}, c.args...)...)
		cmd.Env = append(os.Environ(), "MOEBENCH_BIN="+c.bin, "MOEBENCH_NIGHTLY_DIR="+night)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != c.code || !strings.Contains(string(out), c.want) {
			t.Errorf("%v, MOEBENCH_BIN=%s: exit %d, want %d and %q\n%s", c.args, c.bin, code, c.code, c.want, out)
		}
	}
	if runs, _ := filepath.Glob(filepath.Join(night, "runs", "*")); len(runs) > 0 {
		t.Errorf("a refused night left runs: %v", runs)
	}
}

// TestNightlyAdviseWinnerChange: with MOEBENCH_NIGHTLY_ADVISE the nightly
// script runs advise after the sweep and keeps its answer in the advice
// history; when the next night's winner differs (here: the test-only
// planted delay moves from deepep to alltoall), the night says the winner
// changed, and a night with the same winner does not.
func TestNightlyAdviseWinnerChange(t *testing.T) {
	bin, dir := buildBinary(t)
	sweep := filepath.Join(dir, "sweep.json")
	os.WriteFile(sweep, []byte(`{"dispatchers": ["hybridep"], "sms": [16], "ep": [4], "tokens": 16,
		"hidden": 32, "ffn": 16, "iters": 5, "warmup": 1, "device": "host"}`), 0o644)
	night := filepath.Join(dir, "nightly")
	advice := "--device host --preset tiny --tokens 16 --hidden 32 --ffn 16 --ep 4 --dispatchers alltoall,deepep --rounds 2 --host-gross-pct 100 --budget 3m"
	run := func(plant string) (int, string) {
		cmd := exec.Command("bash", "../../scripts/nightly.sh", sweep)
		cmd.Env = append(os.Environ(), "MOEBENCH_BIN="+bin, "MOEBENCH_NIGHTLY_DIR="+night, "MOEBENCH_NIGHTLY_ADVISE="+advice,
			"MOEBENCH_TEST_PLANT_DELAY="+plant, "MOEBENCH_COMPARE_ARGS=--allow-stack-change") // the plant is part of the stack
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	for i, c := range []struct {
		plant, winner string
		changed       bool
	}{{"deepep=300ms", "alltoall/native", false}, {"deepep=300ms", "alltoall/native", false}, {"alltoall=300ms", "deepep/native", true}} {
		code, out := run(c.plant)
		if code != 0 || !strings.Contains(out, "ANSWER: "+c.winner) {
			t.Fatalf("night %d (%s): exit %d, want 0 and the winner %s\n%s", i+1, c.plant, code, c.winner, out)
		}
		if got := strings.Contains(out, "nightly: advise: the winner changed since"); got != c.changed {
			t.Errorf("night %d (%s): winner change reported: %v, want %v\n%s", i+1, c.plant, got, c.changed, out)
		}
	}
	hist, err := os.ReadFile(filepath.Join(night, "advise-history.jsonl"))
	if err != nil || strings.Count(string(hist), "\n") != 3 {
		t.Errorf("advice history: %v\n%s", err, hist)
	}
	answers, _ := filepath.Glob(filepath.Join(night, "advise", "*", "answer.md"))
	if len(answers) != 3 {
		t.Errorf("answers: %v", answers)
	}
}

// TestNightlyPrecisionAxis: the shipped nightly sweep has --precision as
// an axis (bf16 and fp8); MOEBENCH_NIGHTLY_PRECISION overrides it. A node
// whose baseline is bf16 only (an earlier night, MOEBENCH_NIGHTLY_PRECISION
// =bf16) runs the file's bf16 and fp8 points the next night: the fp8
// points are new (only in new), the bf16 ones compare, exit 0 and no new
// baseline; hybridep's fp8 at hidden 128 is recorded unavailable with its
// reason, never run at bf16.
func TestNightlyPrecisionAxis(t *testing.T) {
	var shipped struct {
		Precision []string `json:"precision"`
	}
	if b, err := os.ReadFile("../../scripts/nightly-sweep.json"); err != nil || json.Unmarshal(b, &shipped) != nil ||
		!slices.Equal(shipped.Precision, []string{"bf16", "fp8"}) {
		t.Errorf("scripts/nightly-sweep.json: precision %v, want [bf16 fp8] (%v)", shipped.Precision, err)
	}
	bin, dir := buildBinary(t)
	sweep := filepath.Join(dir, "sweep.json")
	os.WriteFile(sweep, []byte(`{"dispatcher": ["alltoall", "hybridep"], "ep": [4], "tokens": 16, "hidden": 128, "ffn": 16,
		"iters": 4, "warmup": 1, "device": "host", "precision": ["bf16", "fp8"]}`), 0o644)
	night := filepath.Join(dir, "nightly")
	run := func(env ...string) (int, string) {
		cmd := exec.Command("bash", "../../scripts/nightly.sh", sweep)
		cmd.Env = append(append(os.Environ(), "MOEBENCH_BIN="+bin, "MOEBENCH_NIGHTLY_DIR="+night), env...)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	if code, out := run("MOEBENCH_NIGHTLY_PRECISION=bf16"); code != 0 || !strings.Contains(out, "this run is now") {
		t.Fatalf("first night (bf16): exit %d\n%s", code, out)
	}
	code, out := run()
	if code != 0 || !strings.Contains(out, "only in new") {
		t.Fatalf("second night (bf16 and fp8): exit %d\n%s", code, out)
	}
	hist, err := results.ReadFile(filepath.Join(night, "history.jsonl"), nil)
	if err != nil || len(hist) != 6 {
		t.Fatalf("history: %d records, %v", len(hist), err)
	}
	got := map[string]string{}
	for _, r := range hist[2:] {
		p := r.Config.Precision
		if p == "" {
			p = "bf16"
		}
		got[r.Config.Dispatcher+" "+p] = r.Status
		if r.Config.Dispatcher == "hybridep" && p == "fp8" && !strings.Contains(r.Reason, "multiple of 512") {
			t.Errorf("hybridep fp8 at hidden 128: %s %q", r.Status, r.Reason)
		}
	}
	want := map[string]string{"alltoall bf16": results.StatusOK, "alltoall fp8": results.StatusOK, "hybridep bf16": results.StatusOK, "hybridep fp8": results.StatusUnavailable}
	if !maps.Equal(got, want) {
		t.Errorf("second night's points %v, want %v", got, want)
	}
}

// TestNightlyOverlapAxis: a sweep file's "overlap" list reaches the
// nightly's sweep: one point per setting, each recorded with its overlap.
func TestNightlyOverlapAxis(t *testing.T) {
	bin, dir := buildBinary(t)
	sweep := filepath.Join(dir, "sweep.json")
	os.WriteFile(sweep, []byte(`{"dispatcher": ["deepep"], "sms": [16], "ep": [2], "tokens": 16, "hidden": 32, "ffn": 16,
		"iters": 2, "warmup": 0, "device": "host", "overlap": ["none", "a2a"], "delay-wgrad": true}`), 0o644)
	cmd := exec.Command("bash", "../../scripts/nightly.sh", sweep)
	cmd.Env = append(os.Environ(), "MOEBENCH_BIN="+bin, "MOEBENCH_NIGHTLY_DIR="+filepath.Join(dir, "nightly"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nightly: %v\n%s", err, out)
	}
	hist, err := results.ReadFile(filepath.Join(dir, "nightly", "history.jsonl"), nil)
	if err != nil || len(hist) != 2 {
		t.Fatalf("history: %d records, %v", len(hist), err)
	}
	var got []string
	for _, r := range hist {
		got = append(got, r.Config.Overlap)
		if r.Status != results.StatusOK || !r.Config.DelayWgrad || r.Overlap == nil || (r.Overlap.MicroBatches == 2) != (r.Config.Overlap == "a2a") {
			t.Errorf("point overlap %q: %s %q, delay-wgrad %v, overlap record %v", r.Config.Overlap, r.Status, r.Reason, r.Config.DelayWgrad, r.Overlap != nil)
		}
	}
	if !slices.Equal(got, []string{"", "a2a"}) {
		t.Errorf("points' overlap %q, want none and a2a", got)
	}
}
