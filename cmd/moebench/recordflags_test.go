package main

import (
	"reflect"
	"testing"

	"github.com/spf13/pflag"
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
}

// notMeasuring are the flags of 'moebench run' that do not change what a
// run measures, each with the reason.
var notMeasuring = map[string]string{
	"warmup":      "how many untimed steps run first; recorded (config.warmup, timing.warmup), not a different point",
	"iters":       "how many samples of the same step are taken; recorded (config.iters, timing.iters), compare weighs the sample counts",
	"max-seconds": "a bound on how many samples are taken; recorded (config.max_seconds, timing.stopped)",
	"check":       "the check is one untimed step before the warm-up; recorded (config.check, config.check_tokens, correctness)",
	"comm-timeout": "a bound on each cross-rank wait: a run that reaches it fails, one that does not is not changed by it; " +
		"recorded for SM-driven dispatchers (config.comm_timeout_s)",
	"rendezvous": "where the processes of a run over several meet (a file); the run is the same (ranks.processes records them)",
	"cuda-libs":  "which CUDA libraries load: the stack records their versions, and compare refuses different stacks (StackDiff)",
	"out":        "where the record goes",
	"format":     "how the result is printed",
	"dump":       "writes the layer's tensors after the run",
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
