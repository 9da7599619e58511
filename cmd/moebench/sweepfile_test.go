package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/results"
)

// fileKeys is a value for each flag a sweep file may set (every sweep flag
// but --file), none of them a default, and where its value shows in the
// records (nil: it shows elsewhere, said in the comment).
var fileKeys = map[string]struct {
	v   any
	got func(r *results.Record) any
}{
	"dispatcher":       {[]any{"alltoall", "feplb", "hybridep"}, func(r *results.Record) any { return r.Config.Dispatcher }},
	"impl":             {[]any{"native"}, func(r *results.Record) any { return r.Config.Impl }},
	"sms":              {[]any{16}, func(r *results.Record) any { return r.Config.SMs }},   // hybridep's point
	"preprocess-sms":   {3, func(r *results.Record) any { return r.Config.PreprocessSMs }}, // hybridep's point
	"permute-sms":      {5, func(r *results.Record) any { return r.Config.PermuteSMs }},    // hybridep's point
	"ep":               {[]any{4}, func(r *results.Record) any { return r.Config.EP }},
	"gpus":             {[]any{0}, nil}, // the host device has none: tested by TestSweepGPUs
	"domain":           {2, func(r *results.Record) any { return r.Config.Domain }},
	"feplb-base":       {"deepep", func(r *results.Record) any { return r.Config.FeplbBase }}, // feplb's point
	"feplb-dynamic":    {3, func(r *results.Record) any { return r.Config.FeplbDynamic }},
	"feplb-policy":     {"feplb-split", func(r *results.Record) any { return r.Config.FeplbPolicy }},
	"preset":           {[]any{"glm-4.5"}, func(r *results.Record) any { return r.Config.Preset }},
	"tokens":           {8, func(r *results.Record) any { return r.Config.Tokens }},
	"hidden":           {24, func(r *results.Record) any { return r.Config.Hidden }},
	"ffn":              {8, func(r *results.Record) any { return r.Config.FFN }},
	"experts":          {8, func(r *results.Record) any { return r.Config.Experts }},
	"topk":             {2, func(r *results.Record) any { return r.Config.TopK }},
	"shared-experts":   {2, func(r *results.Record) any { return r.Config.SharedExperts }},
	"score":            {"softmax", func(r *results.Record) any { return r.Config.Score }},
	"groups":           {2, func(r *results.Record) any { return r.Config.Groups }},
	"topk-groups":      {1, func(r *results.Record) any { return r.Config.GroupTopK }},
	"topk-scale":       {1.5, func(r *results.Record) any { return r.Config.TopKScale }},
	"pre-softmax":      {true, func(r *results.Record) any { return r.Config.PreSoftmax }},
	"routing":          {[]any{"skewed:0.5"}, func(r *results.Record) any { return r.Config.Routing }},
	"precision":        {[]any{"bf16"}, func(r *results.Record) any { return r.Config.PrecisionName() }}, // fp8 needs --hidden a multiple of 128: TestSweepPrecisions
	"routing-fixed":    {true, func(r *results.Record) any { return !r.Config.RoutingPerStep }},
	"seed":             {7, func(r *results.Record) any { return r.Config.Seed }},
	"warmup":           {1, func(r *results.Record) any { return r.Config.Warmup }},
	"iters":            {2, func(r *results.Record) any { return r.Config.Iters }},
	"max-seconds":      {60, func(r *results.Record) any { return r.Config.MaxSeconds }},
	"check":            {false, func(r *results.Record) any { return r.Config.Check }},
	"forward-only":     {true, func(r *results.Record) any { return r.Config.Pass == results.PassForward }},
	"comm-timeout":     {"2s", func(r *results.Record) any { return r.Config.CommTimeoutS }}, // hybridep's point
	"ncclep-timeout":   {"3s", nil},                                                          // recorded for NCCL EP's modes alone (cuda): TestTimeoutsOneMeaningEach
	"watchdog-timeout": {"1m", nil},                                                          // recorded on the cuda device alone: TestTimeoutsOneMeaningEach
	"device":           {"host", func(r *results.Record) any { return r.Config.Device }},
	"cuda-libs":        {"/nonexistent/cuda", func(r *results.Record) any { return r.Stack.Env["MOEBENCH_CUDA_LIBS"] }},
	"out":              {"", nil}, // the file the records are in
	"overlap":          {[]any{"shared"}, func(r *results.Record) any { return r.Config.Overlap }},
}

// flagArgs spells fileKeys as a command line.
func flagArgs(out string) []string {
	var args []string
	for k, fk := range fileKeys {
		v := fk.v
		if k == "out" {
			v = out
		}
		if l, ok := v.([]any); ok {
			parts := make([]string, len(l))
			for i, x := range l {
				parts[i] = fmt.Sprint(x)
			}
			v = strings.Join(parts, ",")
		}
		args = append(args, fmt.Sprintf("--%s=%v", k, v))
	}
	return args
}

// TestSweepFileKeysActAsFlags: every flag of sweep is a key of its file that
// reaches the records exactly as the flag on the command line does (but
// --rendezvous and --rendezvous-timeout, which apply only to a sweep
// launched over several processes and are in no record: TestDistributedRun's
// sweep gives the first, TestDistributedRendezvous the second).
func TestSweepFileKeysActAsFlags(t *testing.T) {
	t.Setenv("MOEBENCH_CUDA_LIBS", "") // --cuda-libs sets it
	var o options
	var so sweepOptions
	sweepFlags(&o, &so).VisitAll(func(f *pflag.Flag) {
		// --delay-wgrad needs a training step and --attention-ms the cuda device, which this
		// file's point (forward-only, host) is not: TestOverlapSweepAxis sets them from a file
		overlapOnly := f.Name == "delay-wgrad" || f.Name == "attention-ms"
		if _, ok := fileKeys[f.Name]; !ok && f.Name != "file" && f.Name != "rendezvous" && f.Name != "rendezvous-timeout" && !overlapOnly {
			t.Errorf("sweep flag --%s has no entry in fileKeys: add one, with where it shows in the records", f.Name)
		}
	})
	dir := t.TempDir()
	viaFile, viaFlags := filepath.Join(dir, "file.jsonl"), filepath.Join(dir, "flags.jsonl")
	m := map[string]any{}
	for k, fk := range fileKeys {
		m[k] = fk.v
	}
	m["out"] = viaFile
	b, _ := json.Marshal(m)
	file := filepath.Join(dir, "sweep.json")
	os.WriteFile(file, b, 0o644)
	read := func(out string, args ...string) []results.Record {
		code, _, errOut := cli(append([]string{"sweep"}, args...)...)
		if code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		recs, err := results.ReadFile(out, nil)
		if err != nil || len(recs) != 3 {
			t.Fatalf("%v: %d records, %v", args, len(recs), err)
		}
		sort.Slice(recs, func(i, j int) bool { return recs[i].Config.Dispatcher < recs[j].Config.Dispatcher })
		return recs
	}
	fromFile := read(viaFile, "--file", file)
	fromFlags := read(viaFlags, flagArgs(viaFlags)...)
	for i := range fromFile {
		a, b := fromFile[i], fromFlags[i]
		if !reflect.DeepEqual(a.Config, b.Config) || a.Stack.Env["MOEBENCH_CUDA_LIBS"] != b.Stack.Env["MOEBENCH_CUDA_LIBS"] {
			t.Errorf("point %d: from the file %+v, from the flags %+v", i, a.Config, b.Config)
		}
	}
	if fromFile[0].Status != results.StatusOK || fromFile[0].Timing.Iters != 2 {
		t.Errorf("the alltoall point did not run: %s %s", fromFile[0].Status, fromFile[0].Reason)
	}
	for k, fk := range fileKeys {
		if fk.got == nil {
			continue
		}
		want := fk.v
		if l, ok := want.([]any); ok {
			want = l[0]
		}
		for _, r := range fromFile {
			got := fk.got(&r)
			switch k {
			case "dispatcher":
				continue
			case "sms", "comm-timeout", "preprocess-sms", "permute-sms":
				if r.Config.Dispatcher != "hybridep" {
					continue
				}
				if k == "comm-timeout" {
					want = 2
				}
			case "feplb-base", "feplb-dynamic", "feplb-policy":
				if r.Config.Dispatcher != "feplb" {
					continue
				}
			case "preset":
				want = "glm-4.5+custom"
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("key %q: the %s record has %v, want %v", k, r.Config.Dispatcher, got, want)
			}
		}
	}
}

// TestSweepFileValidation: a bad value is refused from the file with the
// same message as from the command line, and a bad file names its fault.
func TestSweepFileValidation(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "s.jsonl")
	file := filepath.Join(dir, "sweep.json")
	base := []string{"--device", "host", "--hidden", "32", "--ffn", "16", "--warmup", "0"} // no --tokens, --iters
	for _, c := range []struct {
		file string
		flag []string // the same value on the command line ("" when none)
		want string
	}{
		{`{"tokens": 0}`, []string{"--tokens", "0"}, "--tokens=0: must be in [1, 1048576]"},
		{`{"topk-scale": "nan"}`, []string{"--topk-scale", "nan"}, "--topk-scale=NaN: must be in (0, 1e6]"},
		{`{"score": "relu"}`, []string{"--score", "relu"}, "--score=relu: allowed: softmax, sigmoid"},
		{`{"topk": 1}`, []string{"--topk", "1"}, "--topk=1: with --score softmax, top-1"},
		{`{"iters": 2000000000}`, []string{"--iters", "2000000000"}, "--iters=2000000000: must be in [1, 1000000]"},
		{`{"feplb-base": "deepep"}`, []string{"--feplb-base", "deepep"}, "--feplb-base=deepep: applies only to --dispatcher feplb"},
		{`{"presets": []}`, []string{"--presets", ""}, "empty list"},
		{`{"presets": ["tiny", "gpt-5"]}`, []string{"--presets", "tiny,gpt-5"}, "--preset=gpt-5: allowed: tiny"},
		{`null`, nil, "want one JSON object whose keys are flag names"},
		{`{"tokens": 1} {}`, nil, "want one JSON object whose keys are flag names"},
		{`{"tokens": [16, 32]}`, nil, `key "tokens": takes one value, not a list`},
		{`{"tokens": {"a": 1}}`, nil, `key "tokens": want a string, number, boolean or a list of them`},
		{`{"preset": "tiny", "presets": ["tiny"]}`, nil, `keys "preset" and "presets" both set --preset`},
		{`{"bogus": 1}`, nil, `unknown key "bogus"`},
	} {
		os.WriteFile(file, []byte(c.file), 0o644)
		code, stdout, errOut := cli(append([]string{"sweep", "--file", file, "--out", out}, base...)...)
		if code != exitUsage || !strings.Contains(errOut, c.want) || stdout != "" {
			t.Errorf("file %s: exit %d, %q; want exit 2 and %q", c.file, code, errOut, c.want)
		}
		if c.flag == nil {
			continue
		}
		if code, _, errOut := cli(append(append([]string{"sweep", "--out", out}, base...), c.flag...)...); code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("flags %v: exit %d, %q; want exit 2 and %q", c.flag, code, errOut, c.want)
		}
	}
	if code, _, errOut := cli("sweep", "--file", "/dev/zero", "--out", out); code != exitUsage || !strings.Contains(errOut, "--file=/dev/zero: larger than 1048576 bytes") {
		t.Errorf("--file /dev/zero: exit %d, %q", code, errOut)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a refused sweep wrote %s", out)
	}
	// the run command's spellings of the list flags, in a file and as flags
	os.WriteFile(file, []byte(`{"preset": "tiny", "routing": "uniform"}`), 0o644)
	code, _, errOut := cli(append([]string{"sweep", "--file", file, "--out", out, "--dispatcher", "alltoall", "--impl", "native", "--ep", "2"}, sweepQuick...)...)
	recs, err := results.ReadFile(out, nil)
	if code != exitOK || err != nil || len(recs) != 1 || recs[0].Config.Routing != "uniform" {
		t.Errorf("singular spellings: exit %d, %d records (%v): %s", code, len(recs), err, errOut)
	}
}
