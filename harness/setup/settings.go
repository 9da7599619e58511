package setup

// What every process of a run over several processes must share: every
// field of the run's Config (the layer, the dispatcher and its options,
// the routing, the seed, the iterations, the check…) by the flag that
// sets it, and the binary's version. The processes exchange them before
// any builds its layer (launch.Meet) and refuse to run when one differs.

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/moebench/moebench/internal/launch"
	"github.com/moebench/moebench/results"
)

// settingFlags names the flag of each field of Config (Shape's fields
// among them). Every exported field must be here: settingsOf panics on one
// that is not, so that a new setting cannot be left out of the processes'
// comparison (TestSettingsOf walks them).
var settingFlags = map[string]string{
	"Preset": "preset", "Tokens": "tokens", "Hidden": "hidden", "FFN": "ffn", "Experts": "experts", "TopK": "topk",
	"SharedExperts": "shared-experts", "Score": "score", "Groups": "groups", "GroupTopK": "topk-groups", "TopKScale": "topk-scale",
	"PreSoftmax": "pre-softmax", "Dispatcher": "dispatcher", "Impl": "impl", "SMs": "sms", "EP": "ep", "GPUs": "gpus", "Domain": "domain",
	"CommTimeout": "comm-timeout", "NCCLEPTimeout": "ncclep-timeout", "WatchdogTimeout": "watchdog-timeout", "FeplbBase": "feplb-base", "FeplbDyn": "feplb-dynamic", "FeplbPolicy": "feplb-policy",
	"Routing": "routing", "RoutingFixed": "routing-fixed", "Seed": "seed", "Warmup": "warmup", "Iters": "iters",
	"MaxSeconds": "max-seconds", "Check": "check", "CheckAll": "check", "Device": "device", "ForwardOnly": "forward-only", "CUDAGraph": "cuda-graph",
	"HostExperts": "host-experts", "Precision": "precision", "PreprocessSMs": "preprocess-sms", "PermuteSMs": "permute-sms",
	"Overlap": "overlap", "DelayWgrad": "delay-wgrad", "AttentionMS": "attention-ms",
}

// SettingFlags are the flags of the settings every process of a run must
// share (without their "--").
func SettingFlags() []string {
	var out []string
	for _, f := range settingFlags {
		out = append(out, f)
	}
	slices.Sort(out)
	return out
}

// Settings is every setting of cfg as its flag ("--name") and value, in
// Config's order: what a command line spells to run cfg again.
func Settings(cfg Config) []launch.Setting {
	s := SettingsOf(cfg, "")
	return s[:len(s)-1]
}

// SettingsOf is every setting of cfg as its flag and value, in Config's
// order, then the binary's version.
func SettingsOf(cfg Config, version string) []launch.Setting {
	var out []launch.Setting
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			if f.Anonymous {
				walk(v.Field(i))
				continue
			}
			flag, ok := settingFlags[f.Name]
			if !ok {
				panic(fmt.Sprintf("harness: Config.%s has no flag in settingFlags: every setting is compared between a run's processes", f.Name))
			}
			val := fmt.Sprint(v.Field(i).Interface())
			if l, ok := v.Field(i).Interface().([]string); ok { // a list flag's own spelling
				val = strings.Join(l, ",")
			}
			switch f.Name { // --check sets both: compared once, as the flag's word
			case "CheckAll":
				continue
			case "Check":
				val = results.CheckOff
				if cfg.Check {
					val = map[bool]string{false: results.CheckSample, true: results.CheckAll}[cfg.CheckAll]
				}
			}
			out = append(out, launch.Setting{Name: "--" + flag, Value: val})
		}
	}
	walk(reflect.ValueOf(cfg))
	return append(out, launch.Setting{Name: "moebench's version", Value: version})
}

// settingsError is a *launch.DifferError as the command line's usage
// error (exit 2): errors.As finds a *ConfigError in it.
type settingsError struct{ err *launch.DifferError }

func (e *settingsError) Error() string { return e.err.Error() }
func (e *settingsError) Unwrap() error { return e.err }
func (e *settingsError) As(target any) bool {
	if ce, ok := target.(**ConfigError); ok && len(e.err.Lines) > 0 {
		*ce = &ConfigError{Flag: "rendezvous", Value: "", Allowed: e.err.Error()}
		return true
	}
	return false
}

// AsSettingsError is err, a launch.Meet's, with a *launch.DifferError made
// a usage error.
func AsSettingsError(err error) error {
	var de *launch.DifferError
	if errors.As(err, &de) {
		return &settingsError{de}
	}
	return err
}
