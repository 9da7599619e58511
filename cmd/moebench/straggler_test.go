package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/balance"
)

func TestStragglerCLI(t *testing.T) {
	code, out, e := cli("straggler", "--wide", "--ep", "8", "--experts", "64", "--steps", "50", "--explain", "3", "--routing", "skewed:1")
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

// TestStragglerTieWithNone: a policy within 0.5% of none's effective
// straggler (above or below) prints "= none", not "−0%" or "0%", and is
// ranked with none in the order given, not by the difference; one just
// outside the tie is ranked and given its reduction.
func TestStragglerTieWithNone(t *testing.T) {
	r := func(name string, eff float64) balance.SimResult {
		return balance.SimResult{Policy: name, Effective: balance.Stat{Abs: eff}, Token: balance.Stat{Abs: 1e9 * eff}, BytesPerStep: map[string]float64{}}
	}
	res := []balance.SimResult{r("none", 640e-6), r("eplb", 641e-6), r("fastermoe", 639.9e-6), r("feplb", 600e-6), r("feplb-split", 650e-6)}
	var b strings.Builder
	writeStraggler(&b, "markdown", [][]balance.SimResult{res}, "t")
	var got []string
	for _, line := range strings.Split(b.String(), "\n") {
		if f := strings.Split(line, "|"); len(f) > 4 && strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| policy") {
			got = append(got, strings.TrimSpace(f[1])+" "+strings.TrimSpace(f[4]))
		}
	}
	want := []string{"feplb 6%", "none 0%", "eplb = none", "fastermoe = none", "feplb-split -2%"}
	if !slices.Equal(got, want) {
		t.Errorf("rows (policy, eff_reduction) %q, want %q:\n%s", got, want, b.String())
	}
	if !strings.Contains(b.String(), "worse than none (effective straggler): feplb-split (+2%)") {
		t.Errorf("no note naming the policy worse than none:\n%s", b.String())
	}
	if !strings.Contains(b.String(), "= none: eplb, fastermoe within 0.5%") {
		t.Errorf("no note naming the tied policies:\n%s", b.String())
	}
}

// TestStragglerSeeds: --seeds N prints means over N seeds with their
// [min, max]; the mean of identical runs is the run itself in every field
// (so that no field is left out of the mean), warnings once each.
func TestStragglerSeeds(t *testing.T) {
	args := []string{"straggler", "--ep", "8", "--experts", "64", "--steps", "20", "--sched-us", "50", "--format", "markdown", "--policies", "none,fastermoe,feplb"}
	code, one, e := cli(append(args, "--seed", "3")...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, e)
	}
	code, three, e := cli(append(args, "--seed", "2", "--seeds", "3")...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, e)
	}
	for _, want := range []string{"seeds 2–4 (means; [min, max] over seeds)", "eff_straggler_us_range", "token_straggler_range", "(ratio of the means; per seed ["} {
		if !strings.Contains(three, want) {
			t.Errorf("--seeds 3 output lacks %q:\n%s", want, three)
		}
	}
	if strings.Contains(one, "_range") || one == three {
		t.Errorf("one seed: want no range columns, and a table unlike the 3 seeds':\n%s", one)
	}
	code, _, e = cli("straggler", "--routing", "trace:x", "--seeds", "2")
	if code != exitUsage || !strings.Contains(e, "--seeds=2: a trace has no seed") {
		t.Errorf("--seeds 2 with a trace: exit %d, %q", code, e)
	}
	tp := balance.Topology{Ranks: 8, Experts: 64, Domain: 8}
	res, err := balance.Simulate(balance.SimConfig{Topology: tp, Model: balance.H100(4096, 4096), Options: balance.DefaultOptions,
		Source: balance.NewSkewed(tp, 8, 4096, 0.8, 0.3, 1, 10), Steps: 10, Policies: balance.PolicyNames, Tokens: 4096, TopK: 8,
		Counts: 10e-6, Sched: 50e-6, Backward: true})
	if err != nil {
		t.Fatal(err)
	}
	res[0].Warnings = []string{"w"}
	mean := meanResults([][]balance.SimResult{res, res, res, res})
	for i := range res {
		if !near(reflect.ValueOf(res[i]), reflect.ValueOf(mean[i])) {
			t.Errorf("mean of 4 identical runs of %s:\n%+v\nwant\n%+v", res[i].Policy, mean[i], res[i])
		}
	}
}

// near compares two values field by field, floats to 1e-9 relative (NaN
// equal to NaN).
func near(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.Float64:
		x, y := a.Float(), b.Float()
		return x == y || math.IsNaN(x) && math.IsNaN(y) || math.Abs(x-y) <= 1e-9*math.Abs(x)
	case reflect.Struct:
		for i := range a.NumField() {
			if !near(a.Field(i), b.Field(i)) {
				return false
			}
		}
		return true
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
		return near(a.Elem(), b.Elem())
	case reflect.Map:
		if a.Len() != b.Len() {
			return false
		}
		for _, k := range a.MapKeys() {
			if !b.MapIndex(k).IsValid() || !near(a.MapIndex(k), b.MapIndex(k)) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}

// TestStragglerFallbackFlag: --feplb-fallback stop is the strict reading,
// named in the title; a value other than next or stop is refused.
func TestStragglerFallbackFlag(t *testing.T) {
	code, out, e := cli("straggler", "--ep", "8", "--experts", "64", "--steps", "10", "--sched-us", "50", "--policies", "none,feplb", "--feplb-fallback", "stop")
	if code != exitOK || !strings.Contains(out, "feplb fallback: stop") {
		t.Errorf("exit %d, %s:\n%s", code, e, out)
	}
	code, _, e = cli("straggler", "--feplb-fallback", "maybe")
	if code != exitUsage || !strings.Contains(e, "--feplb-fallback=maybe: allowed: next, stop") {
		t.Errorf("--feplb-fallback maybe: exit %d, %q", code, e)
	}
}

// TestStragglerDefaultDynamicFits: left at its default, --feplb-dynamic is
// fitted to the layer (2 experts per rank: 1 dynamic, no "asked, used"
// warning); asked for explicitly, more than fit are capped with a warning.
func TestStragglerDefaultDynamicFits(t *testing.T) {
	args := []string{"straggler", "--ep", "8", "--experts", "16", "--steps", "5", "--sched-us", "50", "--policies", "none,feplb"}
	code, _, e := cli(args...)
	if code != exitOK || strings.Contains(e, "asked") {
		t.Errorf("default: exit %d, stderr %q; want no cap warning", code, e)
	}
	code, _, e = cli(append(args, "--feplb-dynamic", "4")...)
	if code != exitOK || !strings.Contains(e, "4 dynamic experts per rank asked, 1 used") {
		t.Errorf("--feplb-dynamic 4: exit %d, stderr %q; want the cap warning", code, e)
	}
}
