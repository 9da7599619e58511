package harness

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/balance"
	"github.com/moebench/moebench/dispatchers"
	_ "github.com/moebench/moebench/dispatchers/all"
	"github.com/moebench/moebench/harness/check"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

func TestLayerMatchesReference(t *testing.T) {
	trace := harnesstest.WriteTrace(t, "1 7 12 3\n2 4 6 8\n15 14 13 0\n")
	traceP := harnesstest.WriteTrace(t, "1:0.1 7:0.2 12:0.3 3:0.4\n2:1 4:0 6:0.5 8:0.5\n")
	cases := map[string]func(*setup.Config){
		"balanced":    func(c *setup.Config) {},
		"ep1":         func(c *setup.Config) { c.EP = 1 },
		"uniform":     func(c *setup.Config) { c.Routing = setup.Routing{Kind: setup.RoutingUniform} },
		"skewed":      func(c *setup.Config) { c.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 2} },
		"natural":     func(c *setup.Config) { c.Routing = setup.Routing{Kind: setup.RoutingNatural} },
		"trace":       func(c *setup.Config) { c.Routing = setup.Routing{Kind: setup.RoutingTrace, File: trace} },
		"trace-probs": func(c *setup.Config) { c.Routing = setup.Routing{Kind: setup.RoutingTrace, File: traceP} },
		"sigmoid-grouped": func(c *setup.Config) {
			c.Score, c.Groups, c.GroupTopK, c.TopKScale, c.SharedExperts = "sigmoid", 4, 2, 2.5, 2
		},
		"no-shared-top1-pre-softmax": func(c *setup.Config) { c.SharedExperts, c.TopK, c.PreSoftmax = 0, 1, true },
	}
	for name, mut := range cases {
		t.Run(name, func(t *testing.T) {
			c := harnesstest.Small()
			mut(&c)
			rec, err := Run(c, setup.Env{Version: "test"})
			if err != nil {
				t.Fatal(err)
			}
			cc := rec.Correctness
			if rec.Status != results.StatusOK || !cc.Passed || cc.RoundTrip != "exact" {
				t.Fatalf("status %s, correctness %+v", rec.Status, cc)
			}
			// bf16 storage must show some error; none would mean the check compared nothing
			if !(cc.MaxRelErr > 0 && cc.MaxRelErr <= check.Tolerance) {
				t.Errorf("max rel err %g, want in (0, %g]", cc.MaxRelErr, check.Tolerance)
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

func init() { harnesstest.RegisterBroken() }

func TestCheckCatchesWrongDispatch(t *testing.T) {
	c := harnesstest.Small()
	c.Dispatcher = "broken"
	rec, err := Run(c, setup.Env{Version: "test"})
	if err == nil || rec == nil || rec.Status != results.StatusFailed {
		t.Fatalf("broken dispatcher: status %v, err %v; want failed", rec, err)
	}
	if rec.Timing != nil {
		t.Error("a failed check recorded timings")
	}
	if cc := rec.Correctness; cc.MaxRelErr <= check.Tolerance || cc.RoundTrip == "exact" {
		t.Errorf("correctness %+v: both the layer check and the round trip should fail", cc)
	}
}

func TestUnavailableDispatcherRecordsNoTiming(t *testing.T) {
	for name, why := range map[string]string{
		"hybridep":  "NCCL EP cannot run here: it runs on GPUs, and this run is on the host device",
		"deepep-ll": "NCCL EP cannot run here: it runs on GPUs, and this run is on the host device",
		"deepep":    "no library of DeepEP's normal mode is reachable from Go",
	} {
		c := harnesstest.Small()
		c.Dispatcher, c.Impl = name, "library"
		rec, err := Run(c, setup.Env{Version: "test"})
		if !dispatchers.IsUnavailable(err) || rec.Status != results.StatusUnavailable || rec.Timing != nil || !strings.Contains(rec.Reason, why) {
			t.Errorf("%s: status %s, reason %q, err %v; want unavailable: %q", name, rec.Status, rec.Reason, err, why)
		}
	}
}

func TestHostMemoryGuard(t *testing.T) {
	c := setup.DefaultConfig()
	p, _ := setup.LookupPreset("deepseek-v3")
	c.Shape, c.Device = p.Shape, "host"
	if held := float64(setup.HostBytesForExpertMode(c, setup.HostExpertsHeld)); held < 40e9 {
		t.Fatalf("deepseek-v3 host estimate, holding its experts, %.1f GB, want > 40 GB (its float32 expert weights alone are 45 GB)", held/1e9)
	}
	if avail, ok := setup.MemAvailable(); ok && float64(setup.HostBytes(c)) > 0.9*avail {
		rec, err := Run(c, setup.Env{Version: "test"})
		if err == nil || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, "GiB") {
			t.Fatalf("deepseek-v3 on host: %v, %v; want refused for memory", rec.Status, err)
		}
	}
}

// TestHostMemoryGuardParts: on a machine with little memory the guard
// refuses, before allocating anything, a host run that holds its experts
// for their weights and a cuda run (whose host side holds no expert
// weights) for the float64 reference's widened weights, naming the parts;
// what fits runs.
func TestHostMemoryGuardParts(t *testing.T) {
	old := setup.MemAvailable
	defer func() { setup.MemAvailable = old }()
	setup.MemAvailable = func() (float64, bool) { return 256 << 20, true }
	c := harnesstest.Small()
	c.Experts, c.Hidden, c.FFN, c.Tokens = 64, 1024, 1024, 8 // 0.75 GiB of float32 expert weights
	noDevices := func(int, int) ([]device.Device, error) { return nil, errors.New("the guard let the run in") }
	for _, dev := range []string{"host", "cuda"} {
		c.Device, c.HostExperts = dev, setup.HostExpertsHeld
		if dev == "cuda" {
			c.HostExperts = ""
		}
		rec, err := Run(c, setup.Env{Version: "test", OpenDevices: noDevices})
		if err == nil || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, dev+" device: this layer needs about") ||
			!strings.Contains(rec.Reason, "float64 reference") || (dev == "host") != strings.Contains(rec.Reason, "expert weights (float32) 0.8 GiB") {
			t.Errorf("%s: %v, %v", dev, rec.Status, err)
		}
	}
	if rec, err := Run(harnesstest.Small(), setup.Env{Version: "test"}); err != nil || rec.Status != results.StatusOK {
		t.Errorf("a small layer with 256 MiB: %v, %v", rec.Status, err)
	}
}

func TestFEPLBRunRecord(t *testing.T) {
	c := harnesstest.Small()
	c.Dispatcher, c.Routing = "feplb", setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}
	rec, err := Run(c, setup.Env{Version: "test"})
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
	harnesstest.GEMMBeforeAfter(t, rec)
	c.FeplbBase = "deepep"
	rec, err = Run(c, setup.Env{Version: "test"})
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
	c, _ := harnesstest.SplitCase(t)
	c.Device, c.Dispatcher, c.Warmup, c.Iters = "host", "feplb", 0, 2
	c.ForwardOnly = true // the policies' plans; feplb's backward: TestTrainingStepDispatchersAgree
	for _, policy := range balance.FEPLBPolicies {
		c.FeplbPolicy = policy
		rec, err := Run(c, setup.Env{Version: "test"})
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
	rec, _ := Run(c, setup.Env{Version: "test"})
	if err := results.Write(&out, rec, "table"); err != nil || !strings.Contains(out.String(), "rebalance warning") {
		t.Errorf("the table does not warn: %v\n%s", err, out.String())
	}
	c = harnesstest.Small()
	c.Dispatcher, c.Experts, c.TopK, c.PreSoftmax = "feplb", c.EP, 1, true
	rec, err := Run(c, setup.Env{Version: "test"})
	if err != nil || rec.Rebalance == nil || !strings.Contains(strings.Join(rec.Rebalance.Warnings, ";"), "one expert per rank") {
		t.Errorf("one expert per rank: %v, %+v", err, rec.Rebalance)
	}
	c.FeplbPolicy = "magic"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "feplb-policy") {
		t.Errorf("--feplb-policy=magic: %v", err)
	}
}
