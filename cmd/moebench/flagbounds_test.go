package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// commandFlags makes the flag set of each command that has numeric flags,
// with the arguments that make a command reach its checks without other
// work: each command's flags are those it parses.
func commandFlags(dir string) []struct {
	name   string
	args   []string       // the command and its context; the flag under test follows
	fs     *pflag.FlagSet // bound to throwaway values
	extra  map[string][]string
	noFlag []string // commands without numeric flags
} {
	type cf = struct {
		name   string
		args   []string
		fs     *pflag.FlagSet
		extra  map[string][]string
		noFlag []string
	}
	var o options
	var so sweepOptions
	var sa stragglerArgs
	var ca compareArgs
	var s1, s2 string
	var names []string
	var sms []int
	feplb := func(flag string) map[string][]string {
		m := map[string][]string{}
		for _, f := range []string{"feplb-dynamic"} {
			m[f] = []string{"--" + flag, "feplb"}
		}
		return m
	}
	out := filepath.Join(dir, "sweep.jsonl")
	missing := filepath.Join(dir, "missing.jsonl")
	return []cf{
		{"run", []string{"--device", "host"}, newFlags(&options{}), feplb("dispatcher"), nil},
		{"sweep", []string{"sweep", "--out", out, "--device", "host"}, sweepFlags(&options{}, &so), feplb("dispatchers"), nil},
		{"straggler", []string{"straggler", "--steps", "20", "--sched-us", "1"}, stragglerFlags(&sa), nil, nil},
		{"bench kernels", []string{"bench", "kernels"}, benchKernelsFlags(&o, &s1, &s2), nil, nil},
		{"bench dispatch", []string{"bench", "dispatch", "--device", "host", "--ep", "2", "--tokens", "16", "--hidden", "32", "--iters", "2", "--warmup", "0"},
			benchDispatchFlags(&options{}, &names, &sms, &s1, &s2), nil, nil},
		{"compare", []string{"compare", missing, missing}, compareFlags(&ca), nil, nil},
		{"report", []string{"report", missing}, reportFlags(&s1, &s2), nil, []string{"presets", "doctor", "version", "help"}},
	}
}

// unbounded are the numeric flags whose every value is valid: a seed is a
// draw's name, not a count.
var unbounded = []string{"seed"}

// TestEveryNumericFlagBounded walks every command's flag set and gives each
// numeric flag a value far above any real use and one below its range (and
// NaN for a float): each must be refused at once, exit 2, naming the flag
// and the value, before any work.
func TestEveryNumericFlagBounded(t *testing.T) {
	dir := t.TempDir()
	seen := map[string]bool{}
	for _, c := range commandFlags(dir) {
		seen[c.name] = true
		for _, n := range c.noFlag {
			seen[n] = true
		}
		c.fs.VisitAll(func(f *pflag.Flag) {
			var values []string
			switch typ := f.Value.Type(); typ {
			case "int", "int64", "intSlice", "uint", "uint64", "int32", "uint32":
				values = []string{"1000000000000", "-1"}
			case "float64", "float32":
				values = []string{"1e300", "-1e300", "NaN"}
			case "duration":
				values = []string{"1000000h", "-1s"}
			case "string", "bool", "stringSlice":
				return
			default:
				t.Errorf("%s --%s: a flag of type %s; give the test its values", c.name, f.Name, typ)
				return
			}
			if slices.Contains(unbounded, f.Name) {
				return
			}
			for _, v := range values {
				args := append(append(append([]string(nil), c.args...), c.extra[f.Name]...), "--"+f.Name+"="+v)
				if c.name == "compare" || c.name == "report" { // the files last
					args = append(append([]string{c.args[0]}, "--"+f.Name+"="+v), c.args[1:]...)
				}
				done := make(chan [3]string, 1)
				go func() {
					code, stdout, stderr := cli(args...)
					done <- [3]string{string(rune('0' + code)), stdout, stderr}
				}()
				select {
				case r := <-done:
					if testing.Verbose() {
						t.Logf("%s --%s=%s: %s", c.name, f.Name, v, strings.SplitN(r[2], "\n", 2)[0])
					}
					if r[0] != "2" || !strings.Contains(r[2], "--"+f.Name+"=") {
						t.Errorf("%s --%s=%s: exit %s, stderr %q; want exit 2 naming --%s=VALUE", c.name, f.Name, v, r[0], r[2], f.Name)
					}
				case <-time.After(60 * time.Second):
					t.Errorf("%s --%s=%s: still running after 60 s; want exit 2 at once", c.name, f.Name, v)
				}
			}
		})
	}
	for _, name := range commandOrder {
		if name == "bench" {
			continue
		}
		if !seen[name] {
			t.Errorf("command %s: not walked (add it to commandFlags)", name)
		}
	}
}
