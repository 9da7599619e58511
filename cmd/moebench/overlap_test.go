package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moebench/moebench/results"
)

// TestOverlapCLI: the run on the host device runs both
// micro-batches, passes the check and records overlap; --overlap
// shared,a2a and a bad form are usage errors naming the flag.
func TestOverlapCLI(t *testing.T) {
	out := filepath.Join(t.TempDir(), "results.jsonl")
	code, stdout, stderr := cli(append(quick, "--dispatcher", "deepep", "--sms", "24", "--overlap", "a2a", "--delay-wgrad", "--out", out)...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "correctness            PASS") || !strings.Contains(stdout, "a2a, delay-wgrad, 2 micro-batch") {
		t.Errorf("stdout %s", stdout)
	}
	recs, err := results.ReadFile(out, nil)
	if err != nil || len(recs) != 1 || recs[0].Overlap == nil || recs[0].Config.Overlap != "a2a" || !recs[0].Config.DelayWgrad || recs[0].Overlap.Equal ||
		!strings.Contains(recs[0].Overlap.Note, "only their order") {
		t.Fatalf("record: %v %+v", err, recs)
	}
	for args, want := range map[string]string{
		"shared,a2a": "--overlap=shared,a2a: shared and a2a together are refused: Megatron-Core refuses moe_shared_expert_overlap with overlap_moe_expert_parallel_comm",
		"fast":       "--overlap=fast: allowed: a comma-separated list of shared, a2a (or none)",
	} {
		code, out, errOut := cli(append(quick, "--overlap", args)...)
		if code != exitUsage || !strings.Contains(errOut, want) || out != "" {
			t.Errorf("--overlap %s: exit %d, stderr %q; want exit 2 and %q", args, code, errOut, want)
		}
	}
}

// TestOverlapSweepAxis: sweep's --overlap, on the command line or as a
// sweep file's list, makes one point per setting.
func TestOverlapSweepAxis(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "sweep.json")
	os.WriteFile(file, []byte(`{"dispatcher": ["deepep"], "overlap": ["none", "a2a"], "delay-wgrad": true, "ep": [2],
		"tokens": 16, "hidden": 32, "ffn": 16, "iters": 2, "warmup": 0, "device": "host"}`), 0o644)
	for name, args := range map[string][]string{"file": {"sweep", "--file", file}, "flag": {"sweep", "--file", file, "--overlap", "none,shared"}} {
		out := filepath.Join(dir, name+".jsonl")
		code, _, stderr := cli(append(args, "--out", out)...)
		recs, err := results.ReadFile(out, nil)
		if code != exitOK || err != nil || len(recs) != 2 {
			t.Fatalf("%s: exit %d, %d records, %v: %s", name, code, len(recs), err, stderr)
		}
		want := map[string][2]string{"file": {"", "a2a"}, "flag": {"", "shared"}}[name]
		if recs[0].Config.Overlap != want[0] || recs[1].Config.Overlap != want[1] || recs[1].Overlap == nil || !recs[0].Config.DelayWgrad {
			t.Errorf("%s: overlap %q, %q", name, recs[0].Config.Overlap, recs[1].Config.Overlap)
		}
	}
	// --attention-ms from a file reaches the point's validation (the host device refuses it)
	os.WriteFile(file, []byte(`{"attention-ms": 0.5, "device": "host"}`), 0o644)
	if code, _, e := cli("sweep", "--file", file, "--out", filepath.Join(dir, "a.jsonl")); code != exitUsage || !strings.Contains(e, "--attention-ms=0.5: applies to the cuda device") {
		t.Errorf("attention-ms from a file: exit %d, %s", code, e)
	}
}

// TestBenchRefusesOverlap: the bench commands time one part alone, with
// nothing to overlap: --overlap other than none is a usage error saying
// why, before anything runs; none runs.
func TestBenchRefusesOverlap(t *testing.T) {
	for _, c := range []struct {
		args []string
		why  string
	}{
		{[]string{"bench", "kernels"}, benchKernelsNoOverlap},
		{[]string{"bench", "dispatch", "--device", "host"}, benchDispatchNoOverlap},
	} {
		code, out, errOut := cli(append(c.args, "--overlap", "a2a")...)
		if want := "--overlap=a2a: allowed: none only: " + c.why; code != exitUsage || !strings.Contains(errOut, want) || out != "" {
			t.Errorf("%v --overlap a2a: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, code, out, errOut, want)
		}
	}
	code, out, errOut := cli("bench", "dispatch", "--device", "host", "--dispatcher", "deepep", "--sms", "4", "--ep", "2", "--tokens", "16", "--hidden", "32", "--iters", "1", "--warmup", "0", "--overlap", "none")
	if code != exitOK || !strings.Contains(out, "deepep") {
		t.Errorf("bench dispatch --overlap none: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
