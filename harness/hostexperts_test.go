package harness

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/check"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/testutil"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/results"
)

// stepTensors runs two training steps of c's host layer (the second with
// the next step's routing, so that released weight gradients are taken
// again) and returns, for each, the output and every gradient by name; a
// layer that releases its experts' weight gradients has them copied as
// each rank's become complete. A drawn layer must hold no more experts'
// weights at once than ExpertsDrawnAtOnce allows, and none for the whole run.
func stepTensors(t *testing.T, c setup.Config) []map[string][]float32 {
	t.Helper()
	l, d := bound(t, c)
	h, f, L := c.Hidden, c.FFN, l.Shape.LocalExperts()
	wgrads := make([]dispatchers.ExpertWeights, c.Experts) // nil: no segment added to them (zeros)
	if l.Hold != setup.HostExpertsHeld {
		l.GradsDone = func(r int) {
			for i, g := range l.Ranks[r].ExpertGrads {
				wgrads[r*L+i] = dispatchers.ExpertWeights{FC1: append([]float32(nil), g.FC1...), FC2: append([]float32(nil), g.FC2...)}
			}
		}
	}
	untimed := func(_ string, _ int, fn func() error) error { return fn() }
	var out []map[string][]float32
	for step := range 2 {
		l.SetRouting(step)
		if err := l.Iteration(d, untimed); err != nil {
			t.Fatal(err)
		}
		if l.Hold == setup.HostExpertsDrawn && (l.FC1 != nil || len(l.Ranks[0].Experts) > 0) {
			t.Fatal("drawn: the layer holds every expert's weights")
		}
		if n := setup.ExpertsDrawnAtOnce(c); len(l.Drawn) > n {
			t.Fatalf("drawn: %d experts' weights held at once, at most %d allowed", len(l.Drawn), n)
		}
		m := layerGrads(l)
		delete(m, "expert fc1")
		delete(m, "expert fc2")
		for r, rk := range l.Ranks {
			m["output"] = append(m["output"], rk.Y...)
			for i := range L {
				g := rk.ExpertGrads[i]
				if l.Hold != setup.HostExpertsHeld {
					if g.FC1 != nil {
						t.Fatalf("%s: rank %d kept expert %d's weight gradients after its backward", l.Hold, r, r*L+i)
					}
					g = wgrads[r*L+i]
				}
				if g.FC1 == nil {
					g = dispatchers.ExpertWeights{FC1: make([]float32, 2*f*h), FC2: make([]float32, h*f)}
				}
				m["expert fc1"], m["expert fc2"] = append(m["expert fc1"], g.FC1...), append(m["expert fc2"], g.FC2...)
			}
		}
		out = append(out, m)
	}
	return out
}

// TestHostExpertsSameNumbers: a layer that releases each rank's weight
// gradients after its expert backward, and one that also draws its
// experts' weights when it computes their rows (in groups as large as the
// memory allows, or one expert at a time), compute the output and every
// gradient of held mode bit for bit, with each dispatcher that can run so
// (feplb moves weights: held only), and their checks report the same
// errors.
func TestHostExpertsSameNumbers(t *testing.T) {
	blocks := harnesstest.Small() // segments longer than a block of rows
	blocks.Experts, blocks.TopK, blocks.SharedExperts, blocks.EP, blocks.Tokens, blocks.Hidden, blocks.FFN = 8, 2, 0, 2, 512, 32, 16
	skewed := harnesstest.Small() // experts without tokens; a sigmoid router with groups
	skewed.Routing, skewed.Score, skewed.TopKScale, skewed.Groups, skewed.GroupTopK = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 2}, kernels.ScoreSigmoid, 2.5, 4, 2
	cases := map[string]setup.Config{"small": harnesstest.Small(), "blocks": blocks, "skewed": skewed}
	for _, name := range []string{"deepep", "hybridep"} {
		c := harnesstest.Small()
		c.Dispatcher = name
		cases[name] = c
	}
	old := setup.DrawBudget
	defer func() { setup.DrawBudget = old }()
	for name, c := range cases {
		c.HostExperts = setup.HostExpertsHeld
		want := stepTensors(t, c)
		_, _, wantCheck := trained(t, c)
		for _, mode := range []string{setup.HostExpertsByRank, setup.HostExpertsDrawn, setup.HostExpertsDrawn + "/1"} {
			c.HostExperts, setup.DrawBudget = strings.TrimSuffix(mode, "/1"), old
			if strings.HasSuffix(mode, "/1") { // one expert at a time
				setup.DrawBudget = 4 * 3 * float64(c.Hidden*c.FFN)
			}
			got := stepTensors(t, c)
			for step := range got {
				for tensor, w := range want[step] {
					if g := got[step][tensor]; !testutil.SameBits(g, w) {
						t.Errorf("%s, %s, step %d: %s differs from held mode's", name, mode, step, tensor)
					}
				}
			}
			_, _, check := trained(t, c)
			// the same errors but for the last digits: the reference adds
			// its experts' input gradients in the order they finish
			same := func(a, b float64) bool { return math.Abs(a-b) <= 1e-12*b }
			if !check.Passed || check.MaxRelErr != wantCheck.MaxRelErr || !maps.EqualFunc(check.Grads.PerTensor, wantCheck.Grads.PerTensor, same) {
				t.Errorf("%s, %s: check passed %v, error %g, gradient errors %v; held mode's %g, %v", name, mode, check.Passed, check.MaxRelErr,
					check.Grads.PerTensor, wantCheck.MaxRelErr, wantCheck.Grads.PerTensor)
			}
		}
	}
}

// TestGradCompareByRank: where each rank's weight gradients are compared
// as its expert backward hands them over, one wrong value in one expert's
// fails the check, and so does an expert's that were never computed
// (released before the comparison: compared as zeros).
func TestGradCompareByRank(t *testing.T) {
	c := harnesstest.Small()
	c.HostExperts = setup.HostExpertsByRank
	for _, fault := range []string{"", "value", "released"} {
		t.Run("fault="+fault, func(t *testing.T) {
			l, d := bound(t, c)
			untimed := func(_ string, _ int, fn func() error) error { return fn() }
			if err := l.Step(d, untimed); err != nil {
				t.Fatal(err)
			}
			cmp := check.NewGradCompare(l)
			cmp.Start()
			l.GradsDone = func(r int) {
				if r == 2 {
					g := &l.Ranks[r].ExpertGrads[1]
					switch fault {
					case "value":
						g.FC2[7] += 0.5
					case "released":
						*g = dispatchers.ExpertWeights{}
					}
				}
				cmp.RankDone(r)
			}
			if err := l.Backward(d, untimed); err != nil {
				t.Fatal(err)
			}
			errs := cmp.Finish()
			bad := errs["expert fc1"] > kernels.GradTolerance || errs["expert fc2"] > kernels.GradTolerance
			if bad != (fault != "") {
				t.Errorf("fault %q: expert gradient errors %g, %g", fault, errs["expert fc1"], errs["expert fc2"])
			}
		})
	}
}

// TestHostExpertsAuto: auto holds everything when it fits, else releases
// each rank's weight gradients, else draws the weights too (a
// forward-only run has no gradients to release); feplb, which moves
// weights, is always held; a run says which it chose in its record and
// its times, and passes its check.
func TestHostExpertsAuto(t *testing.T) {
	old := setup.MemAvailable
	defer func() { setup.MemAvailable = old }()
	c := harnesstest.Small()
	c.Hidden, c.FFN, c.Tokens, c.Warmup, c.Iters = 128, 128, 16, 0, 1 // led by the expert weights
	fwd := c
	fwd.ForwardOnly = true
	held, byRank, drawn := float64(setup.HostBytesForExpertMode(c, setup.HostExpertsHeld)), float64(setup.HostBytesForExpertMode(c, setup.HostExpertsByRank)), float64(setup.HostBytesForExpertMode(c, setup.HostExpertsDrawn))
	if !(drawn < byRank && byRank < held) {
		t.Fatalf("estimates: held %g, grads by rank %g, drawn %g; want decreasing", held, byRank, drawn)
	}
	for _, tc := range []struct {
		c           setup.Config
		avail       float64
		want, clock string
	}{
		{c, held / 0.9, setup.HostExpertsHeld, ""},
		{c, held/0.9 - 1, setup.HostExpertsByRank, "one rank at a time (the experts' weights and weight gradients do not all fit"},
		{c, byRank/0.9 - 1, setup.HostExpertsDrawn, "drawn on demand (the experts' weights do not all fit"},
		{fwd, float64(setup.HostBytesForExpertMode(fwd, setup.HostExpertsHeld))/0.9 - 1, setup.HostExpertsDrawn, "host times include drawing them"},
	} {
		t.Run(fmt.Sprintf("%s,forward-only=%v", tc.want, tc.c.ForwardOnly), func(t *testing.T) {
			setup.MemAvailable = func() (float64, bool) { return tc.avail, true }
			if got := tc.c.ResolvedHostExperts(); got != tc.want {
				t.Errorf("forward-only %v, %.0f available: %s, want %s", tc.c.ForwardOnly, tc.avail, got, tc.want)
				return
			}
			rec, err := Run(tc.c, setup.Env{Version: "test"})
			if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
				t.Fatalf("%s: %v, %v", tc.want, rec.Status, err)
			}
			recorded := tc.want // held is not recorded
			if tc.want == setup.HostExpertsHeld {
				recorded = ""
			}
			if rec.Config.HostExperts != recorded || !strings.Contains(rec.Timing.Clock, tc.clock) {
				t.Errorf("%s: recorded %q, clock %q", tc.want, rec.Config.HostExperts, rec.Timing.Clock)
			}
		})
	}
	setup.MemAvailable = func() (float64, bool) { return drawn, true }
	f := c
	f.Dispatcher = "feplb"
	if got := f.ResolvedHostExperts(); got != setup.HostExpertsHeld {
		t.Errorf("feplb: %s, want held", got)
	}
}

// TestHostExpertsRefusals: a layer that fits in no mode is refused naming
// the drawn layer's parts (and no --host-experts to try); --host-experts is refused where it cannot
// apply; a training step's --dump, which writes every weight gradient, is
// refused when the layer does not hold them.
func TestHostExpertsRefusals(t *testing.T) {
	old := setup.MemAvailable
	defer func() { setup.MemAvailable = old }()
	c := harnesstest.Small()
	c.Hidden, c.FFN = 1024, 1024
	setup.MemAvailable = func() (float64, bool) {
		return float64(setup.HostBytesForExpertMode(c, setup.HostExpertsDrawn)) / 2, true
	}
	rec, err := Run(c, setup.Env{Version: "test"})
	if err == nil || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, "expert weight gradients (float32 main_grad, one rank's at a time)") ||
		strings.Contains(rec.Reason, "--host-experts") {
		t.Errorf("no mode fits: %v, %v", rec.Status, err)
	}
	held := c
	held.HostExperts = setup.HostExpertsHeld
	if rec, err := Run(held, setup.Env{Version: "test"}); err == nil || !strings.Contains(rec.Reason, "--host-experts drawn") {
		t.Errorf("held does not fit: %v, %v", rec.Status, err)
	}
	c.Hidden, c.FFN = 256, 256
	setup.MemAvailable = func() (float64, bool) {
		return float64(setup.HostBytesForExpertMode(c, setup.HostExpertsByRank)) / 0.9, true
	} // grads by rank fits, held not
	for _, tc := range []struct {
		mut  func(*setup.Config)
		flag string
	}{
		{func(c *setup.Config) { c.HostExperts = "lazy" }, "host-experts"},
		{func(c *setup.Config) { c.HostExperts, c.Device = setup.HostExpertsDrawn, "cuda" }, "host-experts"},
		{func(c *setup.Config) { c.HostExperts, c.Dispatcher = setup.HostExpertsByRank, "feplb" }, "host-experts"},
		{func(c *setup.Config) { c.HostExperts = setup.HostExpertsDrawn }, "dump"},
	} {
		bad := c
		tc.mut(&bad)
		var ce *setup.ConfigError
		if _, err := Run(bad, setup.Env{Version: "test", Dump: filepath.Join(t.TempDir(), "d")}); !errors.As(err, &ce) || ce.Flag != tc.flag {
			t.Errorf("%+v: %v, want a --%s error", bad.HostExperts, err, tc.flag)
		}
	}
	rec, err = Run(c, setup.Env{Version: "test", Dump: filepath.Join(t.TempDir(), "d")}) // auto: grads by rank
	if err == nil || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, "--dump: a training step's dump") {
		t.Errorf("auto, --dump: %v, %v", rec.Status, err)
	}
	fwd := c
	fwd.ForwardOnly, fwd.HostExperts = true, setup.HostExpertsDrawn
	if rec, err := Run(fwd, setup.Env{Version: "test", Dump: filepath.Join(t.TempDir(), "d")}); err != nil || rec.Status != results.StatusOK {
		t.Errorf("forward-only drawn, --dump: %v, %v", rec.Status, err)
	}
}
