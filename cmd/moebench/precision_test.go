package main

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/moebench/moebench/results"
)

// TestPrecisionFlag: --precision takes bf16, fp8 or mxfp8; another value,
// or fp8 with --hidden not a multiple of 128, is a usage error (exit 2)
// naming the flag, the value and what is allowed.
func TestPrecisionFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--precision", "fp16"}, "--precision=fp16: allowed: bf16, fp8, mxfp8"},
		{[]string{"--precision", "fp8", "--hidden", "192"}, "--precision=fp8: needs --hidden a multiple of 128 (it quantizes rows in blocks of 128; --hidden is 192)"},
		{[]string{"--precision", "mxfp8", "--hidden", "48"}, "--precision=mxfp8: needs --hidden a multiple of 32"},
	} {
		code, _, e := cli(append(append([]string{}, quick...), c.args...)...)
		if code != exitUsage || !strings.Contains(e, c.want) {
			t.Errorf("%v: exit %d, %s; want exit %d and %q", c.args, code, e, exitUsage, c.want)
		}
	}
}

// TestSweepPrecisions: --precisions is a sweep axis (--precision its
// singular spelling): each point runs at its precision and the records
// say which; a hybridep point below its FP8 constraint is recorded
// unavailable with the reason, and the sweep goes on.
func TestSweepPrecisions(t *testing.T) {
	out := filepath.Join(t.TempDir(), "s.jsonl")
	code, _, e := cli("sweep", "--out", out, "--device", "host", "--tokens", "16", "--hidden", "128", "--ffn", "16", "--ep", "2",
		"--warmup", "0", "--iters", "2", "--dispatchers", "alltoall,hybridep", "--precision", "bf16,fp8")
	recs, err := results.ReadFile(out, nil)
	if code != exitOK || err != nil || len(recs) != 4 {
		t.Fatalf("exit %d, %v, %d records: %s", code, err, len(recs), e)
	}
	got := map[string]string{}
	for _, r := range recs {
		got[r.Config.Dispatcher+"/"+r.Config.PrecisionName()] = r.Status + " " + r.Reason
	}
	for point, want := range map[string]string{"alltoall/bf16": "ok", "alltoall/fp8": "ok", "hybridep/bf16": "ok",
		"hybridep/fp8": "unavailable hybridep (native): unavailable: --precision fp8: HybridEP's FP8 dispatch needs --hidden a multiple of 512"} {
		if !strings.HasPrefix(got[point], want) {
			t.Errorf("%s: %q, want %q", point, got[point], want)
		}
	}
}

// TestBenchDispatchPrecisions: bench dispatch --precision bf16,fp8 prints
// each point at both precisions side by side; a bad value is a usage error.
func TestBenchDispatchPrecisions(t *testing.T) {
	args := []string{"bench", "dispatch", "--device", "host", "--ep", "2", "--tokens", "16", "--hidden", "128", "--iters", "2", "--warmup", "0", "--dispatcher", "alltoall"}
	code, out, e := cli(append(args, "--precision", "bf16,fp8")...)
	if code != exitOK || !regexp.MustCompile(`alltoall +bf16 .*round trip exact\n +alltoall +fp8 .*round trip exact`).MatchString(out) {
		t.Errorf("exit %d:\n%s%s", code, out, e)
	}
	// --wide: the dispatch's bytes a step (MiB), fp8's about half of bf16's
	code, out, e = cli(append(args, "--precision", "bf16,fp8", "--wide")...)
	m := regexp.MustCompile(`alltoall +bf16 .*round trip exact +([0-9.]+) +([0-9.e+-]+)\n +alltoall +fp8 .*round trip exact +([0-9.]+) +([0-9.e+-]+)\n`).FindStringSubmatch(out)
	if code != exitOK || m == nil || !strings.Contains(out, "# MiB: ") {
		t.Fatalf("--wide: exit %d, no MiB and buf MiB columns:\n%s%s", code, out, e)
	}
	if atof(t, m[2]) <= 0 || atof(t, m[4]) <= 0 {
		t.Errorf("--wide: the dispatcher's buffers %s MiB (bf16) and %s MiB (fp8)", m[2], m[4])
	}
	m = []string{m[0], m[1], m[3]}
	if bf, fp := atof(t, m[1]), atof(t, m[2]); !(fp > 0.4*bf && fp < 0.6*bf) {
		t.Errorf("--wide: dispatch MiB %v at bf16, %v at fp8; want about (1 + 4/128)/2 of bf16's", bf, fp)
	}
	if code, _, e := cli(append(args, "--precision", "fp4")...); code != exitUsage || !strings.Contains(e, "--precision=fp4: allowed: bf16, fp8, mxfp8") {
		t.Errorf("--precision fp4: exit %d, %s", code, e)
	}
}

// atof parses a table's number.
func atof(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
