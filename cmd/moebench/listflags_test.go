package main

import (
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/moebench/moebench/results"
)

// TestRunTakesLists: run's --dispatcher, --impl, --sms, --ep, --gpus,
// --preset and --routing take lists, and a run over more than one point is
// the sweep over them: the same points, the same records (appended to
// --out), the same progress, and on stdout the report's table of them.
// One value each is the single run, as before. sweep's plural names are
// aliases of the singular ones, deprecated: each still works, warns, and
// --help says so.
func TestRunTakesLists(t *testing.T) {
	dir := t.TempDir()
	viaRun, viaSweep := filepath.Join(dir, "run.jsonl"), filepath.Join(dir, "sweep.jsonl")
	points := []string{"--dispatcher", "alltoall,deepep", "--sms", "8,16", "--ep", "2,4"}
	code, stdout, stderr := cli(append(append(append([]string(nil), sweepQuick...), points...), "--out", viaRun)...)
	if code != exitOK || !strings.Contains(stderr, "6 points on the host device") || !strings.Contains(stderr, "[6/6]") {
		t.Fatalf("run with lists: exit %d\n%s", code, stderr)
	}
	if !regexp.MustCompile(`(?m)^\s+deepep\s+native\s+16\s+ok\s`).MatchString(stdout) {
		t.Errorf("run with lists: no table of the points on stdout:\n%s", stdout)
	}
	for _, l := range strings.Split(stdout, "\n") {
		if n := utf8.RuneCountInString(l); n > results.TermWidth {
			t.Errorf("run with lists: a line of %d columns (more than %d without --wide): %q", n, results.TermWidth, l)
		}
	}
	configs := func(path string) []results.Config {
		recs, err := results.ReadFile(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		var c []results.Config
		for _, r := range recs {
			if r.Status != results.StatusOK {
				t.Errorf("%s: %s/%s ep %d: %s %s", path, r.Config.Dispatcher, r.Config.Impl, r.Config.EP, r.Status, r.Reason)
			}
			c = append(c, r.Config)
		}
		sort.Slice(c, func(i, j int) bool { return c[i].Settings()+c[i].Workload() < c[j].Settings()+c[j].Workload() })
		return c
	}
	// --sms of a dispatcher without an SM budget: the same point alone and
	// in a list (0, as the help says), so that compare matches them
	one, two := filepath.Join(dir, "one.jsonl"), filepath.Join(dir, "two.jsonl")
	cli(append(append([]string(nil), sweepQuick...), "--dispatcher", "alltoall", "--sms", "16", "--ep", "2", "--out", one)...)
	cli(append(append([]string(nil), sweepQuick...), "--dispatcher", "alltoall,feplb", "--sms", "16", "--ep", "2", "--out", two)...)
	if a, b := configs(one), configs(two); len(a) != 1 || len(b) != 2 || a[0].Settings() != b[0].Settings() || a[0].SMs != 0 {
		t.Errorf("alltoall --sms 16 alone %+v, in a list %+v", a, b)
	}
	// a point unavailable: the run exits 1, as a run of that point alone does
	if code, _, e := cli(append(append([]string(nil), sweepQuick...), "--dispatcher", "alltoall,deepep-ll", "--ep", "2", "--out", filepath.Join(dir, "ll.jsonl"))...); code != exitRuntime || !strings.Contains(e, "1 ok, 1 unavailable") {
		t.Errorf("run with lists, one point unavailable: exit %d, want 1\n%s", code, e)
	}
	if code, _, e := cli(append(append([]string{"sweep"}, sweepQuick...), append(points, "--out", viaSweep)...)...); code != exitOK {
		t.Fatalf("sweep: exit %d\n%s", code, e)
	}
	if a, b := configs(viaRun), configs(viaSweep); len(a) != 6 || !reflect.DeepEqual(a, b) {
		t.Errorf("run's points %+v\nsweep's %+v", a, b)
	}
	for _, c := range []struct{ args, want string }{
		{"--dispatcher alltoall,deepep --dump " + filepath.Join(dir, "d"), "--dump="},
		{"--dispatcher alltoall,deepep --format json", "--format=json: a run over several points prints the report's table"},
		{"--ep 2,3", "--ep=3: must divide --experts"},
		{"--sms 8,2000 --dispatcher hybridep", "--sms=2000: must be in [0, 1024]"},
		{"--dispatcher alltoall,nonesuch", "--dispatcher=nonesuch: allowed: "},
	} {
		code, _, e := cli(append(append([]string(nil), quick...), strings.Fields(c.args)...)...)
		if code != exitUsage || !strings.Contains(e, c.want) {
			t.Errorf("%s: exit %d, %s; want exit 2 and %q", c.args, code, e, c.want)
		}
	}
	// the plural names: aliases, deprecated
	alias := filepath.Join(dir, "alias.jsonl")
	code, _, stderr = cli(append(append([]string{"sweep"}, sweepQuick...), "--dispatchers", "alltoall", "--impls", "native", "--presets", "tiny", "--routings", "uniform", "--ep", "2", "--out", alias)...)
	if code != exitOK || !strings.Contains(stderr, "--dispatchers is deprecated: an alias of --dispatcher, kept for one release") ||
		!strings.Contains(stderr, "--routings is deprecated") {
		t.Errorf("sweep with the plural names: exit %d\n%s", code, stderr)
	}
	for _, cmd := range [][]string{{"--help"}, {"sweep", "--help"}} {
		_, help, _ := cli(cmd...)
		for _, w := range []string{"--dispatcher strings", "--impl strings", "--sms ints", "--ep ints", "--preset strings", "--routing strings",
			"--dispatchers: alias of --dispatcher, kept for one release", "--routings: alias of --routing, kept for one release",
			"--precisions: alias of --precision, kept for one release"} {
			if !strings.Contains(help, w) {
				t.Errorf("%v: help lacks %q", cmd, w)
			}
		}
	}
}
