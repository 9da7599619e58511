package dispatchers

import (
	"strings"
	"testing"
)

// mover moves FP8 rows except at hidden 384.
type mover struct{ classic }

func (mover) Capabilities() Capabilities {
	return Capabilities{FP8: func(env Env) string {
		if env.Hidden == 384 {
			return "not at 384"
		}
		return ""
	}}
}

func init() { Register("test-mover", func(string, Env) (Dispatcher, error) { return mover{}, nil }) }

// TestPrecisionGate: at fp8 New gives a dispatcher only when it moves FP8
// rows (Capabilities.FP8) and says it can here; else it is unavailable with the
// reason (a library through NCCL EP, the cuda device, or the design's own
// constraint); mxfp8 is unavailable; bf16 is never gated.
func TestPrecisionGate(t *testing.T) {
	for _, c := range []struct {
		name, impl string
		env        Env
		want       string // "" : available
	}{
		{"test-classic", ImplNative, Env{Device: "host"}, ""},
		{"test-classic", ImplNative, Env{Device: "host", Precision: PrecisionBF16}, ""},
		{"test-mover", ImplNative, Env{Device: "host", Precision: PrecisionFP8, Hidden: 512}, ""},
		{"test-mover", ImplNative, Env{Device: "host", Precision: PrecisionFP8, Hidden: 384}, "not at 384"},
		{"test-classic", ImplNative, Env{Device: "host", Precision: PrecisionFP8}, "test-classic has no FP8 dispatch path"},
		{"test-classic", ImplNative, Env{Device: "cuda", Precision: PrecisionFP8}, "on the cuda device has no FP8 dispatch path"},
		{"test-classic", ImplLibrary, Env{Device: "cuda", Precision: PrecisionFP8}, "library implementation has no FP8 dispatch path"},
		{"test-mover", ImplNative, Env{Device: "host", Precision: PrecisionMXFP8}, "mxfp8 is not wired"},
	} {
		_, err := New(c.name, c.impl, c.env)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s %+v: %v", c.name, c.env, err)
		case c.want != "" && (!IsUnavailable(err) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s %+v: %v; want unavailable: %q", c.name, c.env, err, c.want)
		}
	}
}
