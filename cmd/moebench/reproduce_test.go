package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/moebench/moebench/advise"
	"github.com/moebench/moebench/harness/setup"
)

// reproduceChanges are, for the settings that measuringFlags does not
// change, a command line and another value than it gives them.
var reproduceChanges = map[string]runFlagChange{
	"warmup":           {nil, "5"},
	"iters":            {nil, "7"},
	"max-seconds":      {nil, "30.5"},
	"check":            {nil, "all"},
	"comm-timeout":     {nil, "2s"},
	"ncclep-timeout":   {nil, "3s"},
	"watchdog-timeout": {nil, "1m30s"},
}

// runConfig is the Config 'moebench run' builds from args.
func runConfig(t *testing.T, args []string) setup.Config {
	t.Helper()
	var o options
	fs := newFlags(&o)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	c, err := o.config(fs)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return c
}

// shellWords splits a command line as a shell does words, single quotes
// and backslashes (all advise.Reproduce writes).
func shellWords(t *testing.T, line string) []string {
	var words []string
	var w strings.Builder
	in, quoted, escaped := false, false, false
	for _, r := range line {
		switch {
		case escaped:
			w.WriteRune(r)
			escaped = false
		case r == '\\' && !quoted:
			escaped, in = true, true
		case r == '\'':
			quoted, in = !quoted, true
		case r == ' ' && !quoted:
			if in {
				words = append(words, w.String())
			}
			w.Reset()
			in = false
		default:
			w.WriteRune(r)
			in = true
		}
	}
	if quoted {
		t.Fatalf("unbalanced quote in %s", line)
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// TestReproduceRoundTrips: for every setting of a run (each Config field
// by its flag, setup.Settings), a config with it changed gives a
// command (advise.Reproduce) that 'moebench run' parses back into the
// same config; so does a config with several changed at once and a trace
// file whose name needs quoting.
func TestReproduceRoundTrips(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "a trace's file")
	if err := os.WriteFile(trace, []byte("0 1\n2 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := map[string][]string{
		"several": {"--dispatcher=feplb", "--feplb-base=deepep", "--domain=4", "--routing=skewed:1.5", "--precision=fp8", "--check=off", "--seed=9", "--pre-softmax"},
		"trace":   {"--routing=trace:" + trace, "--topk=2", "--experts=4", "--ep=4"},
	}
	for _, flag := range setup.SettingFlags() {
		ch, ok := measuringFlags[flag]
		if !ok {
			ch, ok = reproduceChanges[flag]
		}
		if !ok {
			t.Errorf("--%s: no change to reproduce: add one to reproduceChanges", flag)
			continue
		}
		cases[flag] = append(append([]string{}, ch.base...), "--"+flag+"="+ch.value)
	}
	baseline := setup.Settings(runConfig(t, nil))
	for name, args := range cases {
		c := runConfig(t, args)
		changed := false
		for i, s := range setup.Settings(c) {
			changed = changed || s.Value != baseline[i].Value
		}
		if !changed {
			t.Errorf("%s: %v changes no setting", name, args)
			continue
		}
		line := advise.Reproduce(c)
		words := shellWords(t, line)
		if words[0] != "moebench" {
			t.Fatalf("%s: %s", name, line)
		}
		if again := runConfig(t, words[1:]); !reflect.DeepEqual(again, c) {
			for i, s := range setup.Settings(again) {
				if want := setup.Settings(c)[i]; s != want {
					t.Errorf("%s: %s gives %s %q, want %q", name, line, s.Name, s.Value, want.Value)
				}
			}
			if !t.Failed() {
				t.Errorf("%s: %s gives %+v, want %+v", name, line, again, c)
			}
		}
	}
}
