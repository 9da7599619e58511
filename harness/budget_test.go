package harness

import (
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
)

// TestMaxSeconds: a time budget stops a run of many iterations cleanly on
// both devices and with a rebalancing dispatcher: the record holds the
// iterations timed and says that --max-seconds stopped it. The host's run
// times training steps; the others the forward alone (the budget's
// subject, cheaper on Emu under the race detector).
func TestMaxSeconds(t *testing.T) {
	for name, c := range map[string]setup.Config{"host": harnesstest.Small(), "host-feplb": harnesstest.FEPLBCase(), "device": harnesstest.Small(), "device-feplb": harnesstest.FEPLBCase()} {
		t.Run(name, func(t *testing.T) {
			c.Warmup, c.Iters, c.MaxSeconds, c.Check, c.ForwardOnly = 5, setup.MaxIters, 0.3, false, name != "host"
			env := setup.Env{Version: "test"}
			c.Device = "host"
			if strings.HasPrefix(name, "device") {
				c.Device, env.OpenDevices = "cuda", harnesstest.Emus(1)
			}
			rec, err := Run(c, env)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			tm := rec.Timing
			if tm.Iters < 1 || tm.Iters >= setup.MaxIters || len(tm.Step.Samples) != tm.Iters || rec.Config.Iters != setup.MaxIters ||
				!strings.Contains(tm.Stopped, "stopped by --max-seconds 0.3 after") {
				t.Errorf("%s: %d iterations timed, %d samples, config iters %d, stopped %q", name, tm.Iters, len(tm.Step.Samples), rec.Config.Iters, tm.Stopped)
			}
		})
	}
	c := harnesstest.Small()
	rec, err := Run(c, setup.Env{Version: "test"})
	if err != nil || rec.Timing.Stopped != "" || rec.Timing.Iters != c.Iters {
		t.Errorf("without a budget: %v, %+v", err, rec.Timing)
	}
}
