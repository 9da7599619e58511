package layer

import (
	"errors"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	_ "github.com/moebench/moebench/dispatchers/all"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
)

func TestValidateNamesFlag(t *testing.T) {
	cases := []struct {
		flag string
		mut  func(*setup.Config)
	}{
		{"topk", func(c *setup.Config) { c.TopK = c.Experts + 1 }},
		{"ep", func(c *setup.Config) { c.EP = 3 }},
		{"groups", func(c *setup.Config) { c.Groups = 5 }},
		{"topk-groups", func(c *setup.Config) { c.Groups, c.GroupTopK = 4, 3 }},
		{"tokens", func(c *setup.Config) { c.Tokens = 0 }},
		{"hidden", func(c *setup.Config) { c.Hidden = -1 }},
		{"hidden", func(c *setup.Config) { c.Hidden, c.Device = 100, "cuda" }},
		{"topk", func(c *setup.Config) { c.Experts, c.TopK, c.Device = 64, 33, "cuda" }},
		{"ffn", func(c *setup.Config) { c.FFN = 0 }},
		{"iters", func(c *setup.Config) { c.Iters = 0 }},
		{"warmup", func(c *setup.Config) { c.Warmup = -1 }},
		{"score", func(c *setup.Config) { c.Score = "relu" }},
		{"device", func(c *setup.Config) { c.Device = "tpu" }},
		{"sms", func(c *setup.Config) { c.SMs = -4 }},
		{"gpus", func(c *setup.Config) { c.GPUs = -1 }},
		{"gpus", func(c *setup.Config) { c.GPUs = c.EP + 1 }},
		{"gpus", func(c *setup.Config) { c.GPUs, c.Device = 1, "host" }},
		{"topk-scale", func(c *setup.Config) { c.TopKScale = math.NaN() }},
		{"routing", func(c *setup.Config) { c.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: -1} }},
	}
	for _, tc := range cases {
		c := harnesstest.Small()
		tc.mut(&c)
		var ce *setup.ConfigError
		if err := c.Validate(); !errors.As(err, &ce) || ce.Flag != tc.flag {
			t.Errorf("%s: Validate() = %v, want a ConfigError for --%s", tc.flag, err, tc.flag)
		}
	}
	if err := harnesstest.Small().Validate(); err != nil {
		t.Errorf("valid config rejected: %v", err)
	}
	for _, p := range setup.Presets {
		c := setup.DefaultConfig()
		c.Shape = p.Shape
		if err := c.Validate(); err != nil {
			t.Errorf("preset %s at EP 8: %v", p.Name, err)
		}
	}
}

func TestReadTrace(t *testing.T) {
	tr, err := setup.ReadTrace(harnesstest.WriteTrace(t, "# recorded\n0 5\n\n3 1\n"), 8, 2)
	if err != nil || tr.Lines() != 2 || tr.Probs != nil {
		t.Fatalf("ReadTrace: %v, %+v", err, tr)
	}
	if idx, _ := tr.Token(3); idx[0] != 3 || idx[1] != 1 { // wraps: token 3 → line 1
		t.Errorf("Token(3) = %v, want [3 1]", idx)
	}
	tr, err = setup.ReadTrace(harnesstest.WriteTrace(t, "0:0.7 5:0.3\n"), 8, 2)
	if err != nil || tr.Probs[1] != 0.3 {
		t.Fatalf("with probs: %v, %+v", err, tr)
	}
	bad := map[string]string{
		"0 5\n1 9\n":       ":2: expert 9 out of range [0, 8)",
		"0 5\n1 1\n":       ":2: expert 1 appears twice",
		"0 5 6\n":          ":1: 3 experts, want --topk = 2",
		"0 x\n":            `:1: expert "x" is not an integer`,
		"0:0.5 5:0.5\n1 2": `:2: "1": probabilities must be given on every line or on none`,
		"0:-1 5:1\n":       `:1: probability "-1" must be a number in [0, 1e+06]`,
		"0:NaN 5:1\n":      `:1: probability "NaN"`,
		"# nothing\n":      "no routing lines",
	}
	for body, want := range bad {
		_, err := setup.ReadTrace(harnesstest.WriteTrace(t, body), 8, 2)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("trace %q: err = %v, want it to contain %q", body, err, want)
		}
	}
	if _, err := setup.ReadTrace(filepath.Join(t.TempDir(), "missing"), 8, 2); err == nil {
		t.Error("missing file accepted")
	}
}

// TestHostMemoryGuardCUDATraining: a cuda training step whose check covers
// every token computes the float64 gradient reference on the host, so the
// guard counts it; forward-only, or with the check sampling tokens, not.
func TestHostMemoryGuardCUDATraining(t *testing.T) {
	has := func(c setup.Config) bool {
		for _, p := range setup.MemParts(c, c.ResolvedHostExperts()) {
			if p.Name == "float64 gradient reference" {
				return true
			}
		}
		return false
	}
	c := harnesstest.Small()
	c.Device = "cuda"
	if !has(c) {
		t.Errorf("cuda training step at %d tokens: no float64 gradient reference counted", c.Tokens)
	}
	c.ForwardOnly = true
	if has(c) {
		t.Error("cuda forward-only: a gradient reference counted")
	}
	c.ForwardOnly = false
	p, _ := setup.LookupPreset("deepseek-v3")
	c.Shape = p.Shape
	if setup.SampledTokens(c) == c.Tokens || has(c) {
		t.Errorf("deepseek-v3 on cuda: sampled %d of %d tokens, gradient reference counted %v", setup.SampledTokens(c), c.Tokens, has(c))
	}
}

// TestFEPLBEqualOutput: the layer's output with FEPLB's rebalance equals the
// output without it, bit for bit (each row's arithmetic is the same wherever
// it runs), and the rebalance did move work and cut the token straggler;
// paused, it moves nothing and the output is the same again.
func TestFEPLBEqualOutput(t *testing.T) {
	c := harnesstest.Small()
	c.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}
	c.EP, c.Domain = 4, 2
	rb := feplbEqualOutput(t, c)
	before, after := slices.Max(rb.TokensBefore)-slices.Min(rb.TokensBefore), slices.Max(rb.TokensAfter)-slices.Min(rb.TokensAfter)
	if rb.Moves == 0 || after >= before {
		t.Errorf("feplb: %d moves, spread of rows per rank %d → %d", rb.Moves, before, after)
	}
	// moves stay inside the 2-rank domains: ranks 0,1 and 2,3 keep their totals
	for d := 0; d < 4; d += 2 {
		if rb.TokensBefore[d]+rb.TokensBefore[d+1] != rb.TokensAfter[d]+rb.TokensAfter[d+1] {
			t.Errorf("domain %d: rows %v → %v: work left the domain", d/2, rb.TokensBefore, rb.TokensAfter)
		}
	}
	// one expert split over two helpers (only expert 0 has rows to move)
	c, _ = harnesstest.SplitCase(t)
	c.Device = "host"
	if rb := feplbEqualOutput(t, c); rb.Moves < 2 {
		t.Errorf("split case: %d moves, want expert 0 on two helpers", rb.Moves)
	}
}

// feplbEqualOutput runs c's layer on the host with alltoall, with feplb and
// with feplb paused, checks that all three give the same output and that
// paused feplb moves nothing, and returns feplb's rebalance.
func feplbEqualOutput(t *testing.T, c setup.Config) dispatchers.RebalanceStats {
	t.Helper()
	out := map[string][][]float32{}
	stats := map[string]dispatchers.RebalanceStats{}
	for _, run := range []string{"alltoall", "feplb", "paused"} {
		name := run
		if run == "paused" {
			name = "feplb"
		}
		l, err := NewLayer(c)
		if err != nil {
			t.Fatal(err)
		}
		d, err := dispatchers.New(name, "native", dispatchers.Env{Device: "host", Domain: c.Domain, Policy: c.FeplbPolicy, Hidden: c.Hidden, FFN: c.FFN})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Bind(l.Shape, l.Ranks); err != nil {
			t.Fatal(err)
		}
		r := d.Capabilities().Rebalance
		rebalances := r != nil
		if run == "paused" {
			r.Pause(true)
		}
		for range 2 { // a second step reuses every buffer
			if err := l.Step(d, func(_ string, _ int, fn func() error) error { return fn() }); err != nil {
				t.Fatal(err)
			}
		}
		for _, rk := range l.Ranks {
			out[run] = append(out[run], append([]float32(nil), rk.Y...))
		}
		if rebalances {
			stats[run] = r.Stats()
		}
	}
	for _, run := range []string{"feplb", "paused"} {
		if !reflect.DeepEqual(out["alltoall"], out[run]) {
			t.Errorf("output with %s differs from the output without feplb", run)
		}
	}
	if p := stats["paused"]; p.Moves != 0 || !slices.Equal(p.TokensAfter, p.TokensBefore) {
		t.Errorf("paused feplb moved work: %+v", p)
	}
	return stats["feplb"]
}
