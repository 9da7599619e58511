package main

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/results"
)

// runFlagChange is a flag of 'moebench run' that changes what a run
// measures: base is a command line it applies to, value another value
// than base gives it.
type runFlagChange struct {
	base  []string
	value string
}

// measuringFlags are the flags of 'moebench run' that change what a run
// measures. Each must change the record's config and the point compare
// matches records by (Workload and Settings).
var measuringFlags = map[string]runFlagChange{
	"dispatcher":     {nil, "deepep"},
	"impl":           {nil, "library"},
	"sms":            {[]string{"--dispatcher", "hybridep"}, "8"},
	"preprocess-sms": {[]string{"--dispatcher", "hybridep"}, "8"},
	"permute-sms":    {[]string{"--dispatcher", "hybridep"}, "8"},
	"ep":             {nil, "4"},
	"gpus":           {[]string{"--device", "cuda"}, "2"},
	"domain":         {nil, "4"},
	"feplb-base":     {[]string{"--dispatcher", "feplb"}, "deepep"},
	"feplb-dynamic":  {[]string{"--dispatcher", "feplb"}, "2"},
	"feplb-policy":   {[]string{"--dispatcher", "feplb"}, "feplb-split"},
	"preset":         {nil, "qwen3-30b-a3b"},
	"tokens":         {nil, "64"},
	"hidden":         {nil, "256"},
	"ffn":            {nil, "32"},
	"experts":        {nil, "32"},
	"topk":           {nil, "2"},
	"shared-experts": {nil, "0"},
	"score":          {nil, "sigmoid"},
	"groups":         {[]string{"--groups", "2", "--topk-groups", "1"}, "4"},
	"topk-groups":    {[]string{"--groups", "4", "--topk-groups", "1"}, "2"},
	"topk-scale":     {nil, "2.5"},
	"pre-softmax":    {nil, "true"},
	"routing":        {nil, "uniform"},
	"seed":           {nil, "2"},
	"routing-fixed":  {nil, "true"},
	"forward-only":   {nil, "true"},
	"device":         {nil, "host"},
	"host-experts":   {[]string{"--device", "host"}, "drawn"},
	"cuda-graph":     {[]string{"--device", "cuda"}, "true"},
	"precision":      {nil, "fp8"},
	"overlap":        {nil, "a2a"},
	"delay-wgrad":    {nil, "true"},
	"attention-ms":   {[]string{"--device", "cuda"}, "0.5"},
}

// notMeasuring are the flags of 'moebench run' that do not change what a
// run measures, each with the reason.
var notMeasuring = map[string]string{
	"warmup":      "how many untimed steps run first; recorded (config.warmup, timing.warmup), not a different point",
	"iters":       "how many samples of the same step are taken; recorded (config.iters, timing.iters), compare weighs the sample counts",
	"max-seconds": "a bound on how many samples are taken; recorded (config.max_seconds, timing.stopped)",
	"check":       "the check is one untimed step before the warm-up; recorded (config.check, config.check_tokens, correctness)",
	"comm-timeout": "a bound on each of moebench's own cross-rank waits: a run that reaches it fails, one that does not is not changed by it; " +
		"recorded for native SM-driven dispatchers (config.comm_timeout_s)",
	"ncclep-timeout": "NCCL EP's timeout_ns, a bound on the library's waits: a run that reaches it fails, one that does not is not changed by it; " +
		"recorded for NCCL EP's modes (config.ncclep_timeout_s)",
	"watchdog-timeout": "a bound on one call on a GPU's thread: a run that reaches it stops, one that does not is not changed by it; " +
		"recorded on the cuda device (config.watchdog_timeout_s)",
	"rendezvous":         "where the processes of a run over several meet (a file); the run is the same (ranks.processes records them)",
	"rendezvous-timeout": "a bound on the processes' first meeting: a run that reaches it fails before any work, one that does not is not changed by it",
	"cuda-libs":          "which CUDA libraries load: the stack records their versions, and compare refuses different stacks (StackDiff)",
	"out":                "where the record goes",
	"format":             "how the result is printed",
	"wide":               "how the table is printed",
	"dump":               "writes the layer's tensors after the run",
}

// TestRunFlagsReachTheRecord walks every flag of 'moebench run': each that
// changes what a run measures must change the record's config and the
// point compare matches records by; every other is listed, with the
// reason, in notMeasuring.
func TestRunFlagsReachTheRecord(t *testing.T) {
	var o options
	newFlags(&o).VisitAll(func(f *pflag.Flag) {
		_, measures := measuringFlags[f.Name]
		_, listed := notMeasuring[f.Name]
		if measures == listed {
			t.Errorf("--%s: in measuringFlags %v, in notMeasuring %v: put it in exactly one", f.Name, measures, listed)
		}
	})
	for name, ch := range measuringFlags {
		config := func(args []string) (rec any, point string) {
			var o options
			fs := newFlags(&o)
			if err := fs.Parse(args); err != nil {
				t.Fatalf("--%s: %v: %v", name, args, err)
			}
			c, err := o.config(fs)
			if err != nil {
				t.Fatalf("--%s: %v: %v", name, args, err)
			}
			r := c.Record()
			return r, r.Workload() + " | " + r.Settings()
		}
		base, basePoint := config(ch.base)
		changed, point := config(append(ch.base, "--"+name+"="+ch.value))
		if reflect.DeepEqual(base, changed) {
			t.Errorf("--%s=%s does not change the record's config (%+v)", name, ch.value, changed)
		}
		if point == basePoint {
			t.Errorf("--%s=%s does not change the point compare matches records by: %s", name, ch.value, point)
		}
	}
}

// TestCheckFlag: --check takes sample, all or off (true and false, its
// older values, are sample and off), the record says which, a bad value
// is a usage error naming the allowed ones, and the advice for a slow
// host layer names --check.
func TestCheckFlag(t *testing.T) {
	for arg, want := range map[string][2]bool{"": {true, false}, "sample": {true, false}, "true": {true, false},
		"all": {true, true}, "off": {false, false}, "false": {false, false}} {
		var o options
		fs := newFlags(&o)
		args := []string{}
		if arg != "" {
			args = append(args, "--check="+arg)
		}
		if err := fs.Parse(args); err != nil {
			t.Fatalf("--check=%s: %v", arg, err)
		}
		c, err := o.config(fs)
		if err != nil || c.Check != want[0] || c.CheckAll != want[1] {
			t.Errorf("--check=%s: check %v, all %v (%v); want %v", arg, c.Check, c.CheckAll, err, want)
		}
	}
	code, _, e := cli(append(quick, "--check", "most")...)
	if code != exitUsage || !strings.Contains(e, "allowed: sample, all, off") {
		t.Errorf("--check most: exit %d, %s", code, e)
	}
	out := filepath.Join(t.TempDir(), "r.jsonl")
	if code, _, e := cli(append(quick, "--check", "all", "--out", out)...); code != exitOK {
		t.Fatalf("--check all: exit %d, %s", code, e)
	}
	recs, err := results.ReadFile(out, nil)
	if err != nil || len(recs) != 1 || recs[0].Config.CheckTokens != results.CheckAll || !strings.HasPrefix(recs[0].Correctness.Sample, "all 64 tokens") {
		t.Errorf("--check all: %v, %+v", err, recs)
	}
	var o options
	fs := newFlags(&o)
	fs.Parse([]string{"--device", "host", "--preset", "qwen3-30b-a3b", "--tokens", "256", "--dispatcher", "hybridep", "--sms", "32"})
	c, _ := o.config(fs)
	if a := hostAdvice(c); !strings.Contains(a, "--check off") || !strings.Contains(a, "--forward-only") {
		t.Errorf("the advice for a slow host layer: %q", a)
	}
}
