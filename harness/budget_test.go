package harness

import (
	"strings"
	"testing"
)

// TestMaxSeconds: a time budget stops a run of many iterations cleanly on
// both devices and with a rebalancing dispatcher: the record holds the
// iterations timed and says that --max-seconds stopped it. The host's run
// times training steps; the others the forward alone (the budget's
// subject, cheaper on Emu under the race detector).
func TestMaxSeconds(t *testing.T) {
	for name, c := range map[string]Config{"host": small(), "host-feplb": feplbCase(), "device": small(), "device-feplb": feplbCase()} {
		t.Run(name, func(t *testing.T) {
			c.Warmup, c.Iters, c.MaxSeconds, c.Check, c.ForwardOnly = 5, MaxIters, 0.3, false, name != "host"
			env := Env{Version: "test"}
			c.Device = "host"
			if strings.HasPrefix(name, "device") {
				c.Device, env.OpenDevices = "cuda", emus(1)
			}
			rec, err := Run(c, env)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			tm := rec.Timing
			if tm.Iters < 1 || tm.Iters >= MaxIters || len(tm.Step.Samples) != tm.Iters || rec.Config.Iters != MaxIters ||
				!strings.Contains(tm.Stopped, "stopped by --max-seconds 0.3 after") {
				t.Errorf("%s: %d iterations timed, %d samples, config iters %d, stopped %q", name, tm.Iters, len(tm.Step.Samples), rec.Config.Iters, tm.Stopped)
			}
		})
	}
	c := small()
	rec, err := Run(c, Env{Version: "test"})
	if err != nil || rec.Timing.Stopped != "" || rec.Timing.Iters != c.Iters {
		t.Errorf("without a budget: %v, %+v", err, rec.Timing)
	}
}
