package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moebench/moebench/results"
)

// TestDeepEPNamesCLI: deepep --impl library and native deepep-ll are
// recorded unavailable, each with its reason and no timing (exit 1), and
// read back under their own names; a record of deepep --impl library
// written before deepep-ll had its name (NCCL EP's low-latency mode) reads
// back as deepep-ll, and report and compare say the name was mapped.
func TestDeepEPNamesCLI(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "r.jsonl")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--dispatcher", "deepep", "--impl", "library"}, "no library of DeepEP's normal mode is reachable from Go"},
		{[]string{"--dispatcher", "deepep-ll"}, "not built yet"},
	} {
		code, _, e := cli(append(append(quick, c.args...), "--out", out)...)
		if code != exitRuntime || !strings.Contains(e, c.want) {
			t.Errorf("%v: exit %d, %s", c.args, code, e)
		}
	}
	recs, err := results.ReadFile(out, nil)
	if err != nil || len(recs) != 2 {
		t.Fatalf("%d records, %v", len(recs), err)
	}
	for i, want := range [][2]string{{"deepep", "library"}, {"deepep-ll", "native"}} {
		r := recs[i]
		if r.Status != results.StatusUnavailable || r.Timing != nil || r.Config.Dispatcher != want[0] || r.Config.Impl != want[1] || r.Mapped != "" {
			t.Errorf("record %d: %s %s/%s (%q): %s", i, r.Status, r.Config.Dispatcher, r.Config.Impl, r.Mapped, r.Reason)
		}
	}

	// an older record: deepep --impl library that ran NCCL EP's low-latency mode
	code, _, e := cli(append(quick, "--dispatcher", "alltoall", "--format", "json", "--out", filepath.Join(dir, "new.jsonl"))...)
	if code != exitOK {
		t.Fatalf("alltoall: exit %d, %s", code, e)
	}
	b, err := os.ReadFile(filepath.Join(dir, "new.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	cfg := m["config"].(map[string]any)
	cfg["dispatcher"], cfg["impl"] = "deepep", "library"
	old, _ := json.Marshal(m)
	oldFile := filepath.Join(dir, "old.jsonl")
	os.WriteFile(oldFile, append(old, '\n'), 0o644)
	code, o, e := cli("report", oldFile)
	if code != exitOK || !strings.Contains(o, "deepep-ll") || !strings.Contains(o, "recorded as deepep --impl library") {
		t.Errorf("report: exit %d\n%s\n%s", code, o, e)
	}
	code, o, e = cli("compare", oldFile, oldFile)
	if code == exitUsage || !strings.Contains(o, "# note: BASE: 1 record: recorded as deepep --impl library") || !strings.Contains(o, "deepep-ll/library") {
		t.Errorf("compare: exit %d\n%s\n%s", code, o, e)
	}
}
