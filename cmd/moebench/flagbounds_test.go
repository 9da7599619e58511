package main

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// commandFlags are the commands with numeric flags: each one's flag set,
// made by the function the command parses with (bound to throwaway
// values), the arguments that let the command reach its checks without
// other work (the flag under test follows them), and, per flag, what
// makes it apply (feplb's flags need the feplb dispatcher).
type commandFlags struct {
	name  string
	args  []string
	fs    *pflag.FlagSet
	extra map[string][]string
}

func walkedCommands(dir string) []commandFlags {
	type cf = commandFlags
	var o options
	var so sweepOptions
	var aa adviseArgs
	var sa stragglerArgs
	var ca compareArgs
	var s1, s2 string
	var wide bool
	var names []string
	var sms []int
	feplb := func(flag string) map[string][]string { // feplb's own flags apply to it alone
		return map[string][]string{"feplb-dynamic": {"--" + flag, "feplb"}}
	}
	out := filepath.Join(dir, "sweep.jsonl")
	missing := filepath.Join(dir, "missing.jsonl")
	return []cf{
		{"run", []string{"--device", "host"}, newFlags(&options{}), feplb("dispatcher")},
		{"sweep", []string{"sweep", "--out", out, "--device", "host"}, sweepFlags(&options{}, &so), feplb("dispatcher")},
		{"straggler", []string{"straggler", "--steps", "20", "--sched-us", "1"}, stragglerFlags(&sa), nil},
		{"bench kernels", []string{"bench", "kernels"}, benchKernelsFlags(&o, &s1, &s2), nil},
		{"bench dispatch", []string{"bench", "dispatch", "--device", "host", "--ep", "2", "--tokens", "16", "--hidden", "32", "--iters", "2", "--warmup", "0"},
			benchDispatchFlags(&options{}, &names, &sms, &s1, &s2), nil},
		{"compare", []string{"compare", missing, missing}, compareFlags(&ca), nil},
		{"advise", []string{"advise", "--device", "host", "--out", filepath.Join(dir, "advise")}, adviseFlags(&options{}, &aa), nil},
		{"report", []string{"report", missing}, reportFlags(&s1, &s2, &wide), nil},
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
	for _, c := range walkedCommands(dir) {
		seen[c.name] = true
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
				type result struct {
					code   int
					stderr string
				}
				done := make(chan result, 1)
				go func() { // a value let through may run for hours: give up on it after a minute
					code, _, stderr := cli(args...)
					done <- result{code, stderr}
				}()
				select {
				case r := <-done:
					if testing.Verbose() {
						t.Logf("%s --%s=%s: %s", c.name, f.Name, v, strings.SplitN(r.stderr, "\n", 2)[0])
					}
					if r.code != exitUsage || !strings.Contains(r.stderr, "--"+f.Name+"=") {
						t.Errorf("%s --%s=%s: exit %d, stderr %q; want exit 2 naming --%s=VALUE", c.name, f.Name, v, r.code, r.stderr, f.Name)
					}
				case <-time.After(60 * time.Second):
					t.Errorf("%s --%s=%s: still running after 60 s; want exit 2 at once", c.name, f.Name, v)
				}
			}
		})
	}
	// the other commands have no numeric flag: their help lists none
	numeric := regexp.MustCompile(`--[a-z-]+ (int|ints|uint|uints|float|floats|duration|durations|int64|uint64)\b`)
	for _, name := range []string{"presets", "doctor", "version", "help"} {
		seen[name] = true
		_, help, _ := cli(name, "--help")
		if m := numeric.FindString(help); m != "" || help == "" {
			t.Errorf("%s --help lists %q: walk its flags in walkedCommands", name, m)
		}
	}
	for _, name := range commandOrder {
		if name == "bench" {
			continue
		}
		if !seen[name] {
			t.Errorf("command %s: not walked (add it to walkedCommands)", name)
		}
	}
}
