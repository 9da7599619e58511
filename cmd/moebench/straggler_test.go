package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestStragglerCLI(t *testing.T) {
	code, out, e := cli("straggler", "--ep", "8", "--experts", "64", "--steps", "50", "--explain", "3", "--routing", "skewed:1")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, e)
	}
	for _, want := range []string{"step 3, policy none", "step 3, policy feplb:", "over ce", "# policy", "feplb+place", "feplb-split", "fastermoe ÷ feplb: token straggler",
		"ranked by effective straggler", "plan known 10 µs (counts) + measured (scheduler)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	bad := map[string][]string{
		"--ep=6: must divide --experts (64)":               {"--ep", "6", "--experts", "64"},
		"--domain=3: must be in [1, --ep=8] and divide it": {"--domain", "3"},
		`unknown policy "magic"`:                           {"--policies", "none,magic"},
		"--explain=99: want a step in [0, 10)":             {"--steps", "10", "--explain", "99"},
		"--routing=uniform: allowed: skewed":               {"--routing", "uniform"},
		"--drift=-1: must be in [0, 10]":                   {"--drift", "-1"},
		"--gemm-rate-from=/none":                           {"--gemm-rate-from", "/none"},
		"--sched-us=soon: want 'measured'":                 {"--sched-us", "soon"},
		"--nvlink-ce-share=0: must be in (0, 1]":           {"--nvlink-ce-share", "0"},
		"--counts-us=-1: must be in [0, 1e6]":              {"--counts-us", "-1"},
		"give one of them":                                 {"--gemm-tflops", "400", "--gemm-rate-from", "x.jsonl"},
	}
	for want, args := range bad {
		code, _, e := cli(append([]string{"straggler"}, args...)...)
		if code != exitUsage || !strings.Contains(e, want) {
			t.Errorf("%v: exit %d, %q; want %q", args, code, e, want)
		}
	}
}

// TestStragglerTrace: a trace whose every token picks experts 0..3 loads rank
// 0 only; the straggler table must show it for policy none.
func TestStragglerTrace(t *testing.T) {
	p := filepath.Join(t.TempDir(), "t.txt")
	os.WriteFile(p, []byte("0 1 2 3\n"), 0o644)
	code, out, e := cli("straggler", "--routing", "trace:"+p, "--ep", "4", "--domain", "4", "--experts", "16", "--topk", "4",
		"--tokens", "10", "--steps", "3", "--policies", "none")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, e)
	}
	// 40 tokens × 4 copies all on rank 0: max 160, mean 40 → straggler 120 copies, 300%
	if !strings.Contains(out, fmt.Sprintf("%d", 120)) || !strings.Contains(out, "300.0") {
		t.Errorf("trace straggler:\n%s", out)
	}
}

// TestStragglerBounds: sizes the simulation cannot hold in memory or count
// in int are refused up front, naming the limit.
func TestStragglerBounds(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--experts", "2000000000"}, "--experts=2000000000: must be in [1, 1048576]"},
		{[]string{"--steps", "2000000000"}, "--steps=2000000000: must be in [1, 1000000]"},
		{[]string{"--tokens", "4611686018427387904"}, "--tokens=4611686018427387904: must be in [1, 1048576]"},
		{[]string{"--tokens", "9223372036854775807"}, "--tokens=9223372036854775807: must be in [1, 1048576]"},
		{[]string{"--ep", "131072", "--experts", "131072"}, "--ep=131072: must be in [1, 65536]"},
		{[]string{"--ep", "16384", "--experts", "16384"}, "--experts=16384: must be ≤ 4096 with --ep 16384"},
		{[]string{"--experts", "1048576", "--steps", "1000"}, "--steps=1000: must be ≤ 64 with 1048576 experts"},
	} {
		code, out, errOut := cli(append([]string{"straggler"}, c.args...)...)
		if code != exitUsage || !strings.Contains(errOut, c.want) || out != "" {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", c.args, code, errOut, c.want)
		}
	}
}

// TestStragglerRankedAndWarned: rows come in order of effective straggler,
// --backward adds its columns, and a setting that makes FEPLB a no-op is
// warned about on stderr and recorded under the table.
func TestStragglerRankedAndWarned(t *testing.T) {
	code, out, e := cli("straggler", "--ep", "8", "--experts", "64", "--steps", "30", "--routing", "skewed:0.8", "--sched-us", "50",
		"--backward", "--format", "markdown", "--preset", "glm-5")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, e)
	}
	var effs []float64
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "|")
		if len(f) > 3 && strings.TrimSpace(f[1]) != "policy" && !strings.HasPrefix(strings.TrimSpace(f[2]), "-") {
			var v float64
			if _, err := fmt.Sscan(strings.TrimSpace(f[2]), &v); err == nil {
				effs = append(effs, v)
			}
		}
	}
	if len(effs) != 6 || !slices.IsSorted(effs) || !strings.Contains(out, "bwd_exposed_us") || !strings.Contains(out, "hidden 6144 ffn 2048") {
		t.Errorf("want 6 rows in order of effective straggler, backward columns, the glm-5 shape; got %v:\n%s", effs, out)
	}
	code, out, e = cli("straggler", "--ep", "8", "--experts", "8", "--topk", "2", "--steps", "5", "--policies", "none,feplb", "--format", "markdown")
	if code != exitOK || !strings.Contains(e, "warning: feplb is a no-op") || !strings.Contains(out, "- warning: feplb is a no-op, identical to none: one expert per rank") {
		t.Errorf("exit %d, stderr %q, output:\n%s", code, e, out)
	}
}
