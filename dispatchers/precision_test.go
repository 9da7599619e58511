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

// mxMover moves FP8 rows and MX rows except at hidden 96.
type mxMover struct{ classic }

func (mxMover) Capabilities() Capabilities {
	return Capabilities{FP8: func(Env) string { return "" }, MXFP8: func(env Env) string {
		if env.Hidden == 96 {
			return "not at 96"
		}
		return ""
	}}
}

func init() {
	Register("test-mover", func(string, Env) (Dispatcher, error) { return mover{}, nil })
	Register("test-mxmover", func(string, Env) (Dispatcher, error) { return mxMover{}, nil })
}

// TestPrecisionGate: at fp8 New gives a dispatcher only when it moves FP8
// rows (Capabilities.FP8) and says it can here; else it is unavailable with the
// reason (a library through NCCL EP, the cuda device, or the design's own
// constraint); at mxfp8 likewise with Capabilities.MXFP8 on the host, and
// never on the cuda device (MXFP8HostOnly); bf16 is never gated.
func TestPrecisionGate(t *testing.T) {
	for _, c := range []struct {
		name, impl string
		env        Env
		want       string // "" : available
	}{
		{"test-classic", ImplNative, Env{Device: "host"}, ""},
		{"test-classic", ImplNative, Env{Device: "host", Precision: PrecisionBF16}, ""},
		{"test-mover", ImplNative, Env{Device: "host", Precision: PrecisionFP8, Hidden: 512}, ""},
		{"test-mover", ImplNative, Env{Device: "host", Precision: PrecisionFP8, Hidden: 384}, "--precision fp8: not at 384"},
		{"test-classic", ImplNative, Env{Device: "host", Precision: PrecisionFP8}, "test-classic has no FP8 dispatch path"},
		{"test-classic", ImplNative, Env{Device: "cuda", Precision: PrecisionFP8}, "on the cuda device has no FP8 dispatch path"},
		{"test-classic", ImplLibrary, Env{Device: "cuda", Precision: PrecisionFP8}, "library implementation has no FP8 dispatch path"},
		{"test-mover", ImplNative, Env{Device: "host", Precision: PrecisionMXFP8}, "--precision mxfp8: test-mover has no MXFP8 dispatch path"},
		{"test-mxmover", ImplNative, Env{Device: "host", Precision: PrecisionMXFP8, Hidden: 512}, ""},
		{"test-mxmover", ImplNative, Env{Device: "host", Precision: PrecisionMXFP8, Hidden: 96}, "--precision mxfp8: not at 96"},
		{"test-mxmover", ImplNative, Env{Device: "cuda", Precision: PrecisionMXFP8, Hidden: 512}, "sm_100"},
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

// TestRowBytes: a dispatched row's bytes at each precision — bf16 2 B an
// element; fp8 1 B e4m3 and a 4 B fp32 scale per 128; mxfp8 1 B e4m3 and
// a 1 B E8M0 scale per 32 — and the scales a row.
func TestRowBytes(t *testing.T) {
	for _, c := range []struct {
		p            string
		h            int
		bytes        int64
		scales       int
		formulaPiece string
	}{
		{PrecisionBF16, 512, 1024, 0, "hidden×2 B bf16"},
		{PrecisionFP8, 512, 512 + 16, 4, "hidden/128 × 4 B fp32"},
		{PrecisionMXFP8, 512, 512 + 16, 16, "hidden/32 × 1 B E8M0"},
		{PrecisionMXFP8, 7168, 7168 + 224, 224, "E8M0"},
		{PrecisionFP8, 7168, 7168 + 224, 56, "fp32"},
	} {
		if got := RowBytes(c.p, c.h); got != c.bytes {
			t.Errorf("RowBytes(%s, %d) = %d, want %d", c.p, c.h, got, c.bytes)
		}
		if ScaleWidth(c.p, c.h) != c.scales {
			t.Errorf("ScaleWidth(%s, %d) = %d, want %d", c.p, c.h, ScaleWidth(c.p, c.h), c.scales)
		}
		if f := RowFormula(c.p); !strings.Contains(f, c.formulaPiece) {
			t.Errorf("RowFormula(%s) = %q, want %q in it", c.p, f, c.formulaPiece)
		}
	}
}
