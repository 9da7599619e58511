package harness

import (
	"bytes"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/moebench/moebench/balance"
	"github.com/moebench/moebench/dispatchers"
	_ "github.com/moebench/moebench/dispatchers/all"
	"github.com/moebench/moebench/dispatchers/alltoall"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// small is a quick layer for tests (fast under -race).
func small() Config {
	c := DefaultConfig()
	c.Device = "host"
	c.Tokens, c.Hidden, c.FFN, c.EP, c.Warmup, c.Iters = 32, 64, 32, 4, 1, 2
	return c
}

func TestValidateNamesFlag(t *testing.T) {
	cases := []struct {
		flag string
		mut  func(*Config)
	}{
		{"topk", func(c *Config) { c.TopK = c.Experts + 1 }},
		{"ep", func(c *Config) { c.EP = 3 }},
		{"groups", func(c *Config) { c.Groups = 5 }},
		{"topk-groups", func(c *Config) { c.Groups, c.GroupTopK = 4, 3 }},
		{"tokens", func(c *Config) { c.Tokens = 0 }},
		{"hidden", func(c *Config) { c.Hidden = -1 }},
		{"hidden", func(c *Config) { c.Hidden, c.Device = 100, "cuda" }},
		{"topk", func(c *Config) { c.Experts, c.TopK, c.Device = 64, 33, "cuda" }},
		{"ffn", func(c *Config) { c.FFN = 0 }},
		{"iters", func(c *Config) { c.Iters = 0 }},
		{"warmup", func(c *Config) { c.Warmup = -1 }},
		{"score", func(c *Config) { c.Score = "relu" }},
		{"device", func(c *Config) { c.Device = "tpu" }},
		{"sms", func(c *Config) { c.SMs = -4 }},
		{"gpus", func(c *Config) { c.GPUs = -1 }},
		{"gpus", func(c *Config) { c.GPUs = c.EP + 1 }},
		{"gpus", func(c *Config) { c.GPUs, c.Device = 1, "host" }},
		{"topk-scale", func(c *Config) { c.TopKScale = math.NaN() }},
		{"routing", func(c *Config) { c.Routing = Routing{Kind: RoutingSkewed, Alpha: -1} }},
	}
	for _, tc := range cases {
		c := small()
		tc.mut(&c)
		var ce *ConfigError
		if err := c.Validate(); !errors.As(err, &ce) || ce.Flag != tc.flag {
			t.Errorf("%s: Validate() = %v, want a ConfigError for --%s", tc.flag, err, tc.flag)
		}
	}
	if err := small().Validate(); err != nil {
		t.Errorf("valid config rejected: %v", err)
	}
	for _, p := range Presets {
		c := DefaultConfig()
		c.Shape = p.Shape
		if err := c.Validate(); err != nil {
			t.Errorf("preset %s at EP 8: %v", p.Name, err)
		}
	}
}

func TestParseRouting(t *testing.T) {
	for _, ok := range []string{"balanced", "uniform", "skewed:1.2", "skewed:0", "trace:x.txt", "natural"} {
		r, err := ParseRouting(ok)
		if err != nil || r.String() != ok {
			t.Errorf("ParseRouting(%q) = %v, %v", ok, r, err)
		}
	}
	for _, bad := range []string{"", "zipf", "skewed", "skewed:abc", "skewed:-1", "trace:", "balanced:3"} {
		if _, err := ParseRouting(bad); err == nil {
			t.Errorf("ParseRouting(%q) accepted", bad)
		}
	}
}

// counts routes ranks·tokens random tokens with r and returns per-expert counts.
func counts(t *testing.T, r Routing, ranks, tokens, experts, k int) []int {
	c := DefaultConfig()
	c.Tokens, c.Experts, c.TopK, c.EP, c.Routing = tokens, experts, k, ranks, r
	rc := c.RouterConfig(nil)
	n := make([]int, experts)
	for rank := range ranks {
		logits := r.Logits(c.Seed, rank, tokens, experts)
		if logits == nil {
			t.Fatalf("%v gives no logits", r)
		}
		idx, probs := make([]int32, tokens*k), make([]float32, tokens*k)
		kernels.Route(rc, logits, tokens, idx, probs)
		for _, e := range idx {
			n[e]++
		}
	}
	return n
}

func TestRoutingStatistics(t *testing.T) {
	const ranks, tokens, E, k = 8, 512, 16, 4
	mean := float64(ranks*tokens*k) / E
	sigma := math.Sqrt(mean * (1 - float64(k)/E))
	for _, r := range []Routing{{Kind: RoutingBalanced}, {Kind: RoutingUniform}} {
		n := counts(t, r, ranks, tokens, E, k)
		for e, c := range n {
			if math.Abs(float64(c)-mean) > 6*sigma {
				t.Errorf("%v: expert %d got %d copies, mean %.0f ± 6σ (%.0f)", r, e, c, mean, 6*sigma)
			}
		}
	}
	// skewed routing breaks that bound, and follows its popularity order
	r := Routing{Kind: RoutingSkewed, Alpha: 1.2}
	n := counts(t, r, ranks, tokens, E, k)
	lp := ZipfLogPopularity(DefaultConfig().Seed, E, r.Alpha)
	order := make([]int, E)
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return lp[order[a]] > lp[order[b]] })
	if hot, cold := n[order[0]], n[order[E-1]]; float64(hot-cold) < 6*sigma || hot < 2*cold {
		t.Errorf("skewed:1.2: most popular expert %d copies, least %d: not skewed", hot, cold)
	}
	inversions := 0
	for i := 0; i+1 < E; i++ {
		if n[order[i]] < n[order[i+1]] {
			inversions++
		}
	}
	if inversions > 3 {
		t.Errorf("skewed counts %v do not follow the popularity order (%d inversions)", n, inversions)
	}
}

func TestRoutingReproducibleBySeed(t *testing.T) {
	r := Routing{Kind: RoutingSkewed, Alpha: 1}
	a, b, c := r.Logits(7, 2, 16, 8), r.Logits(7, 2, 16, 8), r.Logits(8, 2, 16, 8)
	if !slices.Equal(a, b) || slices.Equal(a, c) || slices.Equal(a, r.Logits(7, 3, 16, 8)) {
		t.Error("logits must repeat for the same seed and rank and differ otherwise")
	}
}

func writeTrace(t *testing.T, body string) string {
	p := filepath.Join(t.TempDir(), "trace.txt")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadTrace(t *testing.T) {
	tr, err := ReadTrace(writeTrace(t, "# recorded\n0 5\n\n3 1\n"), 8, 2)
	if err != nil || tr.Lines() != 2 || tr.Probs != nil {
		t.Fatalf("ReadTrace: %v, %+v", err, tr)
	}
	if idx, _ := tr.Token(3); idx[0] != 3 || idx[1] != 1 { // wraps: token 3 → line 1
		t.Errorf("Token(3) = %v, want [3 1]", idx)
	}
	tr, err = ReadTrace(writeTrace(t, "0:0.7 5:0.3\n"), 8, 2)
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
		_, err := ReadTrace(writeTrace(t, body), 8, 2)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("trace %q: err = %v, want it to contain %q", body, err, want)
		}
	}
	if _, err := ReadTrace(filepath.Join(t.TempDir(), "missing"), 8, 2); err == nil {
		t.Error("missing file accepted")
	}
}

func TestLayerMatchesReference(t *testing.T) {
	trace := writeTrace(t, "1 7 12 3\n2 4 6 8\n15 14 13 0\n")
	traceP := writeTrace(t, "1:0.1 7:0.2 12:0.3 3:0.4\n2:1 4:0 6:0.5 8:0.5\n")
	cases := map[string]func(*Config){
		"balanced":    func(c *Config) {},
		"ep1":         func(c *Config) { c.EP = 1 },
		"uniform":     func(c *Config) { c.Routing = Routing{Kind: RoutingUniform} },
		"skewed":      func(c *Config) { c.Routing = Routing{Kind: RoutingSkewed, Alpha: 2} },
		"natural":     func(c *Config) { c.Routing = Routing{Kind: RoutingNatural} },
		"trace":       func(c *Config) { c.Routing = Routing{Kind: RoutingTrace, File: trace} },
		"trace-probs": func(c *Config) { c.Routing = Routing{Kind: RoutingTrace, File: traceP} },
		"sigmoid-grouped": func(c *Config) {
			c.Score, c.Groups, c.GroupTopK, c.TopKScale, c.SharedExperts = "sigmoid", 4, 2, 2.5, 2
		},
		"no-shared-top1-pre-softmax": func(c *Config) { c.SharedExperts, c.TopK, c.PreSoftmax = 0, 1, true },
	}
	for name, mut := range cases {
		t.Run(name, func(t *testing.T) {
			c := small()
			mut(&c)
			rec, err := Run(c, Env{Version: "test"})
			if err != nil {
				t.Fatal(err)
			}
			cc := rec.Correctness
			if rec.Status != results.StatusOK || !cc.Passed || cc.RoundTrip != "exact" {
				t.Fatalf("status %s, correctness %+v", rec.Status, cc)
			}
			// bf16 storage must show some error; none would mean the check compared nothing
			if !(cc.MaxRelErr > 0 && cc.MaxRelErr <= Tolerance) {
				t.Errorf("max rel err %g, want in (0, %g]", cc.MaxRelErr, Tolerance)
			}
			if rec.Timing == nil || len(rec.Timing.Step.Samples) != c.Iters {
				t.Fatalf("timing %+v, want %d step samples", rec.Timing, c.Iters)
			}
			total := 0
			for _, n := range rec.Tokens.Received {
				total += n
			}
			if total != c.EP*c.Tokens*c.TopK {
				t.Errorf("ranks received %d copies, want %d", total, c.EP*c.Tokens*c.TopK)
			}
		})
	}
}

// broken wraps alltoall and swaps the first and last rows delivered to rank
// 0 (copies of different tokens): a dispatcher bug the check must catch.
type broken struct {
	*alltoall.A2A
	ranks  []*dispatchers.Rank
	hidden int
}

func (b *broken) Name() string { return "broken" }

func (b *broken) Bind(s dispatchers.Shape, ranks []*dispatchers.Rank) error {
	b.ranks, b.hidden = ranks, s.Hidden
	return b.A2A.Bind(s, ranks)
}

// Forward is alltoall's with Dispatch in place of its dispatch.
func (b *broken) Forward(experts func(rank int) error) []dispatchers.Step {
	return replace(b.A2A.Forward(experts), "dispatch", b.Dispatch)
}

// replace is steps with the step named name running run.
func replace(steps []dispatchers.Step, name string, run func(rank int) error) []dispatchers.Step {
	for i := range steps {
		if steps[i].Name == name {
			steps[i].Run = run
		}
	}
	return steps
}

func (b *broken) Dispatch(r int) error {
	if err := b.A2A.Dispatch(r); err != nil || r != 0 {
		return err
	}
	x, h := b.ranks[0].ExpertX, b.hidden
	last := len(x) - h
	for j := range h {
		x[j], x[last+j] = x[last+j], x[j]
	}
	return nil
}

func init() {
	dispatchers.Register("broken", func(impl string, env dispatchers.Env) (dispatchers.Dispatcher, error) {
		d, err := alltoall.New(impl, env)
		if err != nil {
			return nil, err
		}
		return &broken{A2A: d.(*alltoall.A2A)}, nil
	})
}

func TestCheckCatchesWrongDispatch(t *testing.T) {
	c := small()
	c.Dispatcher = "broken"
	rec, err := Run(c, Env{Version: "test"})
	if err == nil || rec == nil || rec.Status != results.StatusFailed {
		t.Fatalf("broken dispatcher: status %v, err %v; want failed", rec, err)
	}
	if rec.Timing != nil {
		t.Error("a failed check recorded timings")
	}
	if cc := rec.Correctness; cc.MaxRelErr <= Tolerance || cc.RoundTrip == "exact" {
		t.Errorf("correctness %+v: both the layer check and the round trip should fail", cc)
	}
}

func TestUnavailableDispatcherRecordsNoTiming(t *testing.T) {
	for name, why := range map[string]string{
		"hybridep":  "NCCL EP cannot run here: it runs on GPUs, and this run is on the host device",
		"deepep-ll": "NCCL EP cannot run here: it runs on GPUs, and this run is on the host device",
		"deepep":    "no library of DeepEP's normal mode is reachable from Go",
	} {
		c := small()
		c.Dispatcher, c.Impl = name, "library"
		rec, err := Run(c, Env{Version: "test"})
		if !dispatchers.IsUnavailable(err) || rec.Status != results.StatusUnavailable || rec.Timing != nil || !strings.Contains(rec.Reason, why) {
			t.Errorf("%s: status %s, reason %q, err %v; want unavailable: %q", name, rec.Status, rec.Reason, err, why)
		}
	}
}

func TestHostMemoryGuard(t *testing.T) {
	c := DefaultConfig()
	p, _ := LookupPreset("deepseek-v3")
	c.Shape, c.Device = p.Shape, "host"
	if held := float64(hostBytes(c, HostExpertsHeld)); held < 40e9 {
		t.Fatalf("deepseek-v3 host estimate, holding its experts, %.1f GB, want > 40 GB (its float32 expert weights alone are 45 GB)", held/1e9)
	}
	if avail, ok := memAvailable(); ok && float64(HostBytes(c)) > 0.9*avail {
		rec, err := Run(c, Env{Version: "test"})
		if err == nil || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, "GiB") {
			t.Fatalf("deepseek-v3 on host: %v, %v; want refused for memory", rec.Status, err)
		}
	}
}

// TestHostMemoryGuardCUDATraining: a cuda training step whose check covers
// every token computes the float64 gradient reference on the host, so the
// guard counts it; forward-only, or with the check sampling tokens, not.
func TestHostMemoryGuardCUDATraining(t *testing.T) {
	has := func(c Config) bool {
		for _, p := range memParts(c, c.hostExperts()) {
			if p.name == "float64 gradient reference" {
				return true
			}
		}
		return false
	}
	c := small()
	c.Device = "cuda"
	if !has(c) {
		t.Errorf("cuda training step at %d tokens: no float64 gradient reference counted", c.Tokens)
	}
	c.ForwardOnly = true
	if has(c) {
		t.Error("cuda forward-only: a gradient reference counted")
	}
	c.ForwardOnly = false
	p, _ := LookupPreset("deepseek-v3")
	c.Shape = p.Shape
	if sampledTokens(c) == c.Tokens || has(c) {
		t.Errorf("deepseek-v3 on cuda: sampled %d of %d tokens, gradient reference counted %v", sampledTokens(c), c.Tokens, has(c))
	}
}

// TestHostMemoryGuardParts: on a machine with little memory the guard
// refuses, before allocating anything, a host run that holds its experts
// for their weights and a cuda run (whose host side holds no expert
// weights) for the float64 reference's widened weights, naming the parts;
// what fits runs.
func TestHostMemoryGuardParts(t *testing.T) {
	old := memAvailable
	defer func() { memAvailable = old }()
	memAvailable = func() (float64, bool) { return 256 << 20, true }
	c := small()
	c.Experts, c.Hidden, c.FFN, c.Tokens = 64, 1024, 1024, 8 // 0.75 GiB of float32 expert weights
	noDevices := func(int, int) ([]device.Device, error) { return nil, errors.New("the guard let the run in") }
	for _, dev := range []string{"host", "cuda"} {
		c.Device, c.HostExperts = dev, HostExpertsHeld
		if dev == "cuda" {
			c.HostExperts = ""
		}
		rec, err := Run(c, Env{Version: "test", OpenDevices: noDevices})
		if err == nil || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, dev+" device: this layer needs about") ||
			!strings.Contains(rec.Reason, "float64 reference") || (dev == "host") != strings.Contains(rec.Reason, "expert weights (float32) 0.8 GiB") {
			t.Errorf("%s: %v, %v", dev, rec.Status, err)
		}
	}
	if rec, err := Run(small(), Env{Version: "test"}); err != nil || rec.Status != results.StatusOK {
		t.Errorf("a small layer with 256 MiB: %v, %v", rec.Status, err)
	}
}

// TestFEPLBEqualOutput: the layer's output with FEPLB's rebalance equals the
// output without it, bit for bit (each row's arithmetic is the same wherever
// it runs), and the rebalance did move work and cut the token straggler;
// paused, it moves nothing and the output is the same again.
func TestFEPLBEqualOutput(t *testing.T) {
	c := small()
	c.Routing = Routing{Kind: RoutingSkewed, Alpha: 1.5}
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
	c, _ = splitCase(t)
	c.Device = "host"
	if rb := feplbEqualOutput(t, c); rb.Moves < 2 {
		t.Errorf("split case: %d moves, want expert 0 on two helpers", rb.Moves)
	}
}

// feplbEqualOutput runs c's layer on the host with alltoall, with feplb and
// with feplb paused, checks that all three give the same output and that
// paused feplb moves nothing, and returns feplb's rebalance.
func feplbEqualOutput(t *testing.T, c Config) dispatchers.RebalanceStats {
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

func TestFEPLBRunRecord(t *testing.T) {
	c := small()
	c.Dispatcher, c.Routing = "feplb", Routing{Kind: RoutingSkewed, Alpha: 1.5}
	rec, err := Run(c, Env{Version: "test"})
	if err != nil || rec.Status != results.StatusOK || rec.Rebalance == nil || !rec.Correctness.Passed {
		t.Fatalf("feplb run: %v, %+v", err, rec)
	}
	rb := rec.Rebalance
	if rb.TokenAfter.Abs >= rb.TokenBefore.Abs || rb.Moves == 0 || rb.CopyBytes == 0 {
		t.Errorf("rebalance record %+v", rb)
	}
	if !slices.Equal(rec.Tokens.Received, rb.TokensAfter) {
		t.Errorf("tokens computed %v, rebalance says %v", rec.Tokens.Received, rb.TokensAfter)
	}
	gemmBeforeAfter(t, rec)
	c.FeplbBase = "deepep"
	rec, err = Run(c, Env{Version: "test"})
	if !dispatchers.IsUnavailable(err) || !strings.Contains(rec.Reason, "base dispatcher deepep") {
		t.Errorf("feplb over deepep on host: %v, %q", err, rec.Reason)
	}
}

// TestFEPLBPolicies (items 5 and 9, the dispatcher): --feplb-policy picks
// the scheduler — on a layer whose one hot expert outweighs the gap, the
// paper's whole-expert policy moves nothing, and the record and its table
// say so, while feplb-split spreads the expert's rows; a layer with one
// expert per rank is a no-op whatever the policy, and says why.
func TestFEPLBPolicies(t *testing.T) {
	c, _ := splitCase(t)
	c.Device, c.Dispatcher, c.Warmup, c.Iters = "host", "feplb", 0, 2
	c.ForwardOnly = true // the policies' plans; feplb's backward: TestTrainingStepDispatchersAgree
	for _, policy := range balance.FEPLBPolicies {
		c.FeplbPolicy = policy
		rec, err := Run(c, Env{Version: "test"})
		if err != nil || rec.Rebalance == nil || rec.Config.FeplbPolicy != policy {
			t.Fatalf("%s: %v, %+v", policy, err, rec)
		}
		rb, warned := rec.Rebalance, strings.Join(rec.Rebalance.Warnings, "; ")
		switch {
		case policy == "feplb" && (rb.Moves != 0 || !strings.Contains(warned, "feplb moved nothing in 2 timed steps")):
			t.Errorf("feplb: %d moves, warnings %q; want none, and a warning", rb.Moves, warned)
		case policy == "feplb-split" && (rb.Moves < 2 || warned != ""):
			t.Errorf("feplb-split: %d moves, warnings %q; want expert 0 spread over helpers", rb.Moves, warned)
		}
	}
	var out bytes.Buffer
	c.FeplbPolicy = "feplb"
	rec, _ := Run(c, Env{Version: "test"})
	if err := results.Write(&out, rec, "table"); err != nil || !strings.Contains(out.String(), "rebalance warning") {
		t.Errorf("the table does not warn: %v\n%s", err, out.String())
	}
	c = small()
	c.Dispatcher, c.Experts, c.TopK, c.PreSoftmax = "feplb", c.EP, 1, true
	rec, err := Run(c, Env{Version: "test"})
	if err != nil || rec.Rebalance == nil || !strings.Contains(strings.Join(rec.Rebalance.Warnings, ";"), "one expert per rank") {
		t.Errorf("one expert per rank: %v, %+v", err, rec.Rebalance)
	}
	c.FeplbPolicy = "magic"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "feplb-policy") {
		t.Errorf("--feplb-policy=magic: %v", err)
	}
}

// gemmBeforeAfter checks a rebalancing run's measured GEMM straggler: after
// is the record's, before comes from as many paused steps, and every step
// of both has its straggler.
func gemmBeforeAfter(t *testing.T, rec *results.Record) {
	t.Helper()
	rb, ep, iters := rec.Rebalance, rec.Config.EP, rec.Config.Iters
	if !reflect.DeepEqual(rb.GEMMAfter, rec.GEMM.Straggler) {
		t.Errorf("GEMM straggler after %+v, the record's %+v", rb.GEMMAfter, rec.GEMM.Straggler)
	}
	if len(rb.GEMMBefore.PerRank) != ep || slices.Min(rb.GEMMBefore.PerRank) <= 0 || rb.GEMMBefore.Abs < 0 {
		t.Errorf("GEMM straggler before %+v", rb.GEMMBefore)
	}
	if len(rb.PerStep.GEMMBeforeMS) != iters || len(rb.PerStep.GEMMAfterMS) != iters {
		t.Errorf("per-step GEMM stragglers: %d before, %d after; want %d", len(rb.PerStep.GEMMBeforeMS), len(rb.PerStep.GEMMAfterMS), iters)
	}
}

// TestCommitFromCheckout: a binary without Go's VCS stamp (go run, go test)
// still records the checkout's commit.
func TestCommitFromCheckout(t *testing.T) {
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	want := strings.TrimSpace(string(head))
	if got := Commit(); strings.TrimSuffix(got, "+dirty") != want {
		t.Errorf("Commit() = %q, want %q (+dirty)", got, want)
	}
	// another directory: no commit rather than a wrong one
	t.Chdir(t.TempDir())
	if got := checkoutCommit(); got != "" {
		t.Errorf("outside the checkout: %q", got)
	}
}
