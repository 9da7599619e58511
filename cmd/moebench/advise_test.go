package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moebench/moebench/advise"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/results"
)

// adviseTiny is a small layer of the qwen3-30b-a3b preset's routing (128
// experts, top-8) that the host device runs in a fraction of a second.
var adviseTiny = []string{"advise", "--device", "host", "--preset", "qwen3-30b-a3b", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--budget", "5m"}

// readAnswer reads the answer.json advise wrote into dir.
func readAnswer(t *testing.T, dir string) advise.Answer {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "answer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var a advise.Answer
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestAdviseHostEndToEnd: 'moebench advise --preset qwen3-30b-a3b --ep 8'
// runs end to end on the host device: it says first and last that host
// times do not predict GPU performance, reports progress with the time
// left, gates every design (the library implementations unavailable, with
// the reason), tunes the SM-driven designs, decides, and writes the answer
// in every format with the records, which report and compare read; its
// one-line command reproduces the winner's workload and settings; a second
// advise into the same folder is refused (it replaces no file).
func TestAdviseHostEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (a minute under -race); the advise package's tests still run")
	}
	out := filepath.Join(t.TempDir(), "advice")
	code, stdout, stderr := cli(append(adviseTiny, "--ep", "8", "--rounds", "2", "--out", out)...)
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	errLines := strings.Split(strings.TrimSpace(stderr), "\n")
	for _, l := range [][]string{lines, errLines} {
		if !strings.Contains(l[0], advise.HostWarning) || !strings.Contains(l[len(l)-1], advise.HostWarning) {
			t.Errorf("the host warning is not first and last:\n%s", strings.Join(l, "\n"))
		}
	}
	for _, want := range []string{"ANSWER: ", "reproduce the winner: moebench --preset qwen3-30b-a3b --tokens 16 --hidden 32 --ffn 16 --ep 8",
		"alltoall    library  gate", "deepep/native sms=", "hybridep/native sms=", "feplb/native", "smallest budget within 2%"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("answer: no %q in\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, " left (budget: ") || !strings.Contains(stderr, "confirming deepep/native") || !strings.Contains(stderr, "round 2 of at most 2") {
		t.Errorf("progress:\n%s", stderr)
	}
	for _, f := range []string{"answer.txt", "answer.md", "answer.html", "answer.json", "records.jsonl", "report.html"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	a := readAnswer(t, out)
	// the test binary registers "failing" (sweep_test.go), a design
	// whose combine fails: a finalist that is never the answer
	if a.Decision.Winner == "" || a.Decision.RunnerUp == "" || a.Rounds != 2 || len(a.Finalists) != 5 || len(a.Tuning) != 2 ||
		strings.HasPrefix(a.Decision.Winner, "failing") || strings.HasPrefix(a.Decision.RunnerUp, "failing") {
		t.Fatalf("answer: %+v", a)
	}
	for _, f := range a.Finalists {
		if f.Dispatcher == "failing" {
			if f.Status != results.StatusFailed || !strings.Contains(f.Reason, "simulated failure") || !strings.Contains(stdout, "simulated failure") {
				t.Errorf("the failing design: %+v", f)
			}
			continue
		}
		if f.Status != results.StatusOK || f.Correct != "PASS" || len(f.Samples) != 10 || f.MemPerRank <= 0 || f.Reproduce == "" {
			t.Errorf("finalist %s: %+v", f.Label(), f)
		}
	}
	recs, err := results.ReadFile(filepath.Join(out, "records.jsonl"), nil)
	if err != nil || len(recs) != 4*2+1+2*2 { // the rounds (failing's first only), and two confirmations per tuned design
		t.Fatalf("records: %d, %v", len(recs), err)
	}
	if code, _, e := cli("report", filepath.Join(out, "records.jsonl")); code != exitOK {
		t.Errorf("report: exit %d: %s", code, e)
	}
	if code, _, e := cli("compare", filepath.Join(out, "records.jsonl"), filepath.Join(out, "records.jsonl")); code != exitOK {
		t.Errorf("compare: exit %d: %s", code, e)
	}
	// the reproducing command runs the winner's point again
	args := strings.Fields(a.Reproduce)[1:]
	rep := filepath.Join(t.TempDir(), "rep.jsonl")
	if code, _, e := cli(append(args, "--iters", "2", "--warmup", "0", "--out", rep)...); code != exitOK {
		t.Fatalf("%s: exit %d: %s", a.Reproduce, code, e)
	}
	again, err := results.ReadFile(rep, nil)
	if err != nil || len(again) != 1 {
		t.Fatal(err)
	}
	var winner *results.Record
	for i := range recs {
		if strings.HasPrefix(a.Decision.Winner, recs[i].Config.Dispatcher+"/"+recs[i].Config.Impl) {
			winner = &recs[i]
		}
	}
	if winner == nil || again[0].Config.Workload() != winner.Config.Workload() || again[0].Config.Settings() != winner.Config.Settings() {
		t.Errorf("the reproducing command ran another point: %s | %s", again[0].Config.Workload(), again[0].Config.Settings())
	}
	if code, _, e := cli(append(adviseTiny, "--ep", "8", "--out", out)...); code != exitUsage || !strings.Contains(e, "--out="+out) {
		t.Errorf("a second advise into the same folder: exit %d: %s", code, e)
	}
}

// TestAdvisePlantedDelay: with one design made clearly slower by the
// test-only planted delay (setup.PlantEnv), advise separates the two
// and picks the other — either way round, so the pick is not the order
// of the designs; with the same delay planted in both, they are equal and
// advise says there is no significant difference. (Host times separate
// only on a gross difference: --host-gross-pct 100 lets a planted delay
// of several steps' length be one.)
func TestAdvisePlantedDelay(t *testing.T) {
	if testing.Short() {
		t.Skip("slow; TestDecide in package advise still runs")
	}
	for _, c := range []struct{ plant, winner, runnerUp string }{
		{"deepep=500ms", "alltoall/native", "deepep/native"},
		{"alltoall=500ms", "deepep/native", "alltoall/native"},
		{"alltoall=500ms,deepep=500ms", "", ""},
	} {
		t.Setenv(setup.PlantEnv, c.plant)
		out := filepath.Join(t.TempDir(), "advice")
		code, stdout, stderr := cli(append(adviseTiny, "--preset", "tiny", "--ep", "4", "--dispatcher", "alltoall,deepep", "--rounds", "2", "--host-gross-pct", "100", "--out", out)...)
		if code != exitOK {
			t.Fatalf("%s: exit %d\n%s\n%s", c.plant, code, stdout, stderr)
		}
		d := readAnswer(t, out).Decision
		if c.winner == "" {
			if d.Separated || !strings.Contains(stdout, "ANSWER: no significant difference") {
				t.Errorf("%s: equal designs separated: %+v", c.plant, d)
			}
			continue
		}
		if !d.Separated || !strings.HasPrefix(d.Winner, c.winner) || !strings.HasPrefix(d.RunnerUp, c.runnerUp) || d.Shift.Lo <= 1 ||
			!strings.Contains(stdout, "ANSWER: "+d.Winner+" is the fastest") {
			t.Errorf("%s: %+v\n%s", c.plant, d, stdout)
		}
		recs, err := results.ReadFile(filepath.Join(out, "records.jsonl"), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs { // a record of a planted run says so
			if strings.HasPrefix(c.plant, r.Config.Dispatcher+"=") && (r.Timing == nil || !strings.Contains(r.Timing.Clock, "TEST-ONLY")) {
				t.Errorf("%s: record of %s does not say the delay was planted", c.plant, r.Config.Settings())
			}
		}
	}
}

// TestAdviseUsage: bad input exits 2 naming the flag and value, before any
// work; help reads as the command's.
func TestAdviseUsage(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "full")
	os.MkdirAll(full, 0o755)
	os.WriteFile(filepath.Join(full, "mine.txt"), []byte("the user's"), 0o644)
	bad := filepath.Join(dir, "bad-history")
	os.WriteFile(bad, []byte("not json\n"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--budget", "1s"}, "--budget=1s: must be in [10s, 24h]"},
		{[]string{"--dispatcher", "nope"}, "--dispatcher=nope: allowed:"},
		{[]string{"--precision", "fp9"}, "--precision=fp9: allowed: bf16, fp8, mxfp8"},
		{[]string{"--dispatchers", "nope"}, "--dispatcher=nope: allowed:"}, // the deprecated plural
		{[]string{"--format", "pdf"}, "--format=pdf: allowed: text, markdown, html, json"},
		{[]string{"--out", full}, "--out=" + full + ": holds 1 entries"},
		{[]string{"--history", bad}, "--history=" + bad},
		{[]string{"--preset", "gpt-5"}, "--preset=gpt-5: allowed:"},
		{[]string{"--ep", "7"}, "--ep=7: must divide --experts"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		code, _, e := cli(append(append([]string(nil), adviseTiny...), c.args...)...)
		if code != exitUsage || !strings.Contains(e, c.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", c.args, code, e, c.want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(full, "mine.txt")); string(b) != "the user's" {
		t.Error("advise changed a file of the user's")
	}
	if code, out, _ := cli("advise", "--help"); code != exitOK || !strings.HasPrefix(out, "moebench advise answers") || !strings.Contains(out, "--budget duration") {
		t.Errorf("help: exit %d\n%s", code, out)
	}
}

// TestAdviseBudget: a budget too short for the whole plan ends the
// measuring — the searches by half of it, the rounds at its end — and the
// answer says so and still decides from what was measured.
func TestAdviseBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("slow; TestAdviseUsage checks --budget's range")
	}
	out := filepath.Join(t.TempDir(), "advice")
	start := time.Now()
	// each timed step planted 40 ms longer (the test-only hook), so that
	// 100 rounds of three finalists cannot fit in 10 s however fast the
	// host, while the tiny layer's own steps leave rounds to measure
	// however loaded it is (a layer sized for an idle host either finished
	// every round there or measured none under load)
	t.Setenv(setup.PlantEnv, "alltoall=40ms,deepep=40ms,hybridep=40ms")
	code, stdout, stderr := cli(append(adviseTiny, "--preset", "tiny", "--ep", "4",
		"--dispatcher", "alltoall,deepep,hybridep", "--budget", "10s", "--rounds", "100", "--out", out)...)
	took := time.Since(start)
	a := readAnswer(t, out)
	if code != exitOK || !strings.Contains(a.Stopped, "the budget (10s) ended") || !strings.Contains(stdout, "stopped early: the budget (10s) ended") || a.Rounds >= 100 {
		t.Fatalf("exit %d, stopped %q, %d rounds\n%s\n%s", code, a.Stopped, a.Rounds, stdout, stderr)
	}
	if a.Decision.Winner == "" {
		t.Errorf("no decision from what was measured: %+v", a.Decision)
	}
	if took > 10*time.Second+hostsim.Patience(t, 20*time.Second) { // the budget, and the measurement under way when it ended
		t.Errorf("a 10 s budget took %v", took)
	}
}

// TestAdviseInterrupt: SIGINT stops advise after the measurement under
// way; it exits 130 and still writes the answer from what was measured,
// which says it was interrupted.
func TestAdviseInterrupt(t *testing.T) {
	hostsim.SkipIfShort(t, "TestInterruptKeepsWhatWasMeasured's run (skipped too) and the advise package's tests")
	out := filepath.Join(t.TempDir(), "advice")
	cmd := exec.Command(os.Args[0], "advise", "--device", "host", "--preset", "qwen3-30b-a3b", "--ep", "8", "--dispatcher", "alltoall,deepep", "--out", out)
	cmd.Env = append(os.Environ(), "MOEBENCH_TEST_PROCESS=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := watchLines(stderr, "confirming deepep/native")
	if found, late := lines.wait(hostsim.Patience(t, 2*time.Minute)); !found {
		cmd.Process.Kill()
		if late {
			t.Fatal("no confirmation started in time")
		}
		t.Fatalf("advise ended before confirming a budget:\n%s", lines.text())
	}
	cmd.Process.Signal(syscall.SIGINT)
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitInterrupted {
		t.Fatalf("exit %v, want 130:\n%s", err, lines.text())
	}
	a := readAnswer(t, out)
	if a.Stopped != "interrupted: SIGINT" || a.Rounds > 1 {
		t.Errorf("answer: stopped %q after %d rounds", a.Stopped, a.Rounds)
	}
	if _, err := results.ReadFile(filepath.Join(out, "records.jsonl"), nil); err != nil {
		t.Errorf("records: %v", err)
	}
}

// TestAdviseHostScaleFP8: on the host device advise scales a real model's
// hidden down; at fp8 it rounds it up to a multiple of 512, so that the
// layer is valid at fp8 (whose blocks are 128 wide: deepseek-v3's and
// glm-4.5's ÷ 16 are not) and hybridep's FP8 dispatch (hidden % 512) stays
// in; bf16 scales as before.
func TestAdviseHostScaleFP8(t *testing.T) {
	for _, c := range []struct {
		preset, precision string
		hidden            int
	}{
		{"deepseek-v3", "fp8", 512}, {"glm-4.5", "fp8", 512}, {"qwen3-30b-a3b", "fp8", 512},
		{"deepseek-v3", "bf16", 448}, {"glm-4.5", "bf16", 320}, {"qwen3-30b-a3b", "bf16", 128},
	} {
		var o options
		var a adviseArgs
		fs := adviseFlags(&o, &a)
		if err := fs.Parse([]string{"--preset", c.preset, "--precision", c.precision, "--device", "host"}); err != nil {
			t.Fatal(err)
		}
		d := setup.DefaultConfig()
		o.dispatcher, o.impl, o.feplbBase, o.feplbDyn, o.feplbPolicy = d.Dispatcher, d.Impl, d.FeplbBase, d.FeplbDyn, d.FeplbPolicy
		o.warmup, o.iters = d.Warmup, d.Iters
		cfg, err := o.config(fs)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Device = "host"
		hostScale(fs, &cfg)
		if cfg.Hidden != c.hidden {
			t.Errorf("%s at %s: hidden scaled to %d, want %d", c.preset, c.precision, cfg.Hidden, c.hidden)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s at %s: %v", c.preset, c.precision, err)
		}
		if c.precision == "fp8" {
			cfg.Dispatcher = "hybridep"
			if err := setup.CheckDispatcherAvailable(cfg); err != nil {
				t.Errorf("%s at fp8: hybridep unavailable on the host: %v", c.preset, err)
			}
		}
	}
}

// TestAdviseTimeoutFlags: advise runs the library implementations and
// moebench's own SM-driven ones as run does, so its timeouts are run's:
// the same flags with the same meaning, help and default.
func TestAdviseTimeoutFlags(t *testing.T) {
	var aa adviseArgs
	run, adv := newFlags(&options{}), adviseFlags(&options{}, &aa)
	for _, name := range []string{"comm-timeout", "ncclep-timeout", "watchdog-timeout"} {
		r, a := run.Lookup(name), adv.Lookup(name)
		if r == nil || a == nil {
			t.Errorf("--%s: run has it %v, advise %v", name, r != nil, a != nil)
			continue
		}
		if r.Usage != a.Usage || r.DefValue != a.DefValue {
			t.Errorf("--%s: advise's help %q (default %s), not run's %q (default %s)", name, a.Usage, a.DefValue, r.Usage, r.DefValue)
		}
	}
}
