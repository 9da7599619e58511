package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/bench"
	"github.com/moebench/moebench/results"
)

// benchSmall is a bench dispatch that runs in well under a second.
var benchSmall = []string{"bench", "dispatch", "--device", "host", "--ep", "2", "--tokens", "16", "--hidden", "32", "--warmup", "0", "--iters", "2"}

// benchBanner is what bench dispatch prints once it starts the benchmark.
const benchBanner = "bench dispatch on the host device"

// TestBenchOutChecked: bench dispatch's --out is checked before the
// benchmark runs (exit 2, no banner): a file of run records or of the other
// benchmark is refused and left as it was, a missing folder is refused;
// runs append one line each of the documented schema.
func TestBenchOutChecked(t *testing.T) {
	dir := t.TempDir()
	recs := filepath.Join(dir, "runs.jsonl")
	if code, _, e := cli(append(quick, "--out", recs)...); code != exitOK {
		t.Fatalf("run: exit %d: %s", code, e)
	}
	kernels := filepath.Join(dir, "kernels.jsonl")
	os.WriteFile(kernels, []byte(`{"schema":"`+bench.KernelSchema+`","rows":[]}`+"\n"), 0o644)
	for _, c := range []struct{ out, want string }{
		{recs, "runs.jsonl:1: not a " + bench.DispatchSchema + ` result (schema "` + results.Schema + `")`},
		{kernels, "kernels.jsonl:1: not a " + bench.DispatchSchema + ` result (schema "` + bench.KernelSchema + `")`},
		{filepath.Join(dir, "no-such-folder", "b.jsonl"), "cannot create it"},
		{dir, "is a directory"},
	} {
		before, _ := os.ReadFile(c.out)
		code, out, e := cli(append(benchSmall, "--dispatcher", "alltoall", "--out", c.out)...)
		if code != exitUsage || !strings.Contains(e, "--out="+c.out+": ") || !strings.Contains(e, c.want) || strings.Contains(e, benchBanner) || out != "" {
			t.Errorf("--out %s: exit %d, stdout %q, stderr %q; want exit 2 before the benchmark, naming %q", c.out, code, out, e, c.want)
		}
		if after, _ := os.ReadFile(c.out); string(after) != string(before) {
			t.Errorf("--out %s: the file changed", c.out)
		}
	}
	if _, err := results.ReadFile(recs, nil); err != nil {
		t.Errorf("the run records no longer read: %v", err)
	}
	out := filepath.Join(dir, "bench.jsonl")
	for range 2 {
		if code, _, e := cli(append(benchSmall, "--dispatcher", "alltoall", "--out", out)...); code != exitOK {
			t.Fatalf("exit %d: %s", code, e)
		}
	}
	b, _ := os.ReadFile(out)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], `{"schema":"`+bench.DispatchSchema+`"`) || !strings.HasPrefix(lines[1], `{"schema":"`+bench.DispatchSchema+`"`) {
		t.Fatalf("two runs appended %d lines:\n%.300s", len(lines), b)
	}
	torn := filepath.Join(dir, "torn.jsonl")
	os.WriteFile(torn, []byte(lines[0]+"\n"+lines[1][:20]), 0o644)
	if code, _, e := cli(append(benchSmall, "--dispatcher", "alltoall", "--out", torn)...); code != exitUsage || !strings.Contains(e, "torn.jsonl:2: the last line is unfinished") {
		t.Errorf("torn --out: exit %d, %s", code, e)
	}
}

// TestBenchDispatchListsChecked: an unknown dispatcher, an empty list or an
// empty entry (which would run as bf16) is
// a usage error (exit 2) found before the benchmark starts.
func TestBenchDispatchListsChecked(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--dispatcher", "bogus"}, "--dispatcher=bogus: allowed: alltoall, "},
		{[]string{"--dispatcher", "alltoall,bogus"}, "--dispatcher=bogus: allowed: alltoall, "},
		{[]string{"--dispatcher", ""}, `--dispatcher="": empty list; give one or more of: alltoall, `},
		{[]string{"--precision", ""}, `--precision="": an empty list or entry; give one or more of: bf16, fp8, mxfp8`},
		{[]string{"--precision", ","}, `--precision=",": an empty list or entry; give one or more of: bf16, fp8, mxfp8`},
		{[]string{"--precision", "fp8,"}, `--precision="fp8,": an empty list or entry`},
	} {
		code, out, e := cli(append(append([]string(nil), benchSmall...), c.args...)...)
		if code != exitUsage || !strings.Contains(e, c.want) || strings.Contains(e, benchBanner) || out != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 before the benchmark, naming %q", c.args, code, out, e, c.want)
		}
	}
}

// TestCommTimeoutZeroIsDefault: --comm-timeout 0 means the default (5s), as
// the help says, for a run and for bench dispatch; a negative one is
// refused with the range.
func TestCommTimeoutZeroIsDefault(t *testing.T) {
	_, help, _ := cli("--help")
	if !strings.Contains(help, "(0 = 5s)") {
		t.Fatal("--help no longer says what --comm-timeout 0 means")
	}
	out := filepath.Join(t.TempDir(), "r.jsonl")
	if code, _, e := cli(append(quick, "--dispatcher", "deepep", "--comm-timeout", "0", "--out", out)...); code != exitOK {
		t.Fatalf("--comm-timeout 0: exit %d: %s", code, e)
	}
	recs, err := results.ReadFile(out, nil)
	if err != nil || len(recs) != 1 || recs[0].Config.CommTimeoutS != 5 {
		t.Errorf("--comm-timeout 0 recorded %v, want 5 s (%v)", recs, err)
	}
	if code, _, e := cli(append(benchSmall, "--dispatcher", "deepep", "--sms", "8", "--comm-timeout", "0")...); code != exitOK {
		t.Errorf("bench dispatch --comm-timeout 0: exit %d: %s", code, e)
	}
	if code, _, e := cli(append(quick, "--comm-timeout", "-1s")...); code != exitUsage || !strings.Contains(e, "--comm-timeout=-1s: must be in [1ms, 1h] (0 = the default, 5s)") {
		t.Errorf("--comm-timeout -1s: exit %d, %s", code, e)
	}
}

// TestReportRefusesInconsistentRecord: report refuses (exit 2) an ok record
// with a negative p50, or one that passed its check with a NaN error,
// naming the file, the line and the field.
func TestReportRefusesInconsistentRecord(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.jsonl")
	if code, _, e := cli(append(quick, "--out", good)...); code != exitOK {
		t.Fatalf("run: exit %d: %s", code, e)
	}
	recs, err := results.ReadFile(good, nil)
	if err != nil || len(recs) != 1 {
		t.Fatal(recs, err)
	}
	for _, c := range []struct {
		name string
		edit func(r *results.Record)
		want string
	}{
		{"negative p50", func(r *results.Record) { r.Timing.Step.P50 = -1 }, "bad.jsonl:2: an inconsistent ok record: timing.step.p50 = -1: must be finite and ≥ 0"},
		{"passed with NaN", func(r *results.Record) { r.Correctness.MaxRelErr = math.NaN() }, "bad.jsonl:2: an inconsistent ok record: correctness.max_rel_err = NaN"},
	} {
		bad := filepath.Join(dir, "bad.jsonl")
		os.Remove(bad)
		r := recs[0]
		tm, cr := *r.Timing, *r.Correctness
		r.Timing, r.Correctness = &tm, &cr
		c.edit(&r)
		for _, rec := range []*results.Record{&recs[0], &r} {
			if _, err := results.Append(bad, rec); err != nil {
				t.Fatal(err)
			}
		}
		code, out, e := cli("report", bad)
		if code != exitUsage || !strings.Contains(e, c.want) || out != "" {
			t.Errorf("%s: exit %d, stderr %q; want exit 2 and %q", c.name, code, e, c.want)
		}
	}
}
