package harness

import (
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// TestRecordTwoSteps: on the host device (feplb on skewed routing, where
// the slowest rank differs from phase to phase) and on the device pipeline
// the record holds both steps and says which one Step is.
func TestRecordTwoSteps(t *testing.T) {
	c := harnesstest.Small()
	c.Dispatcher, c.Routing, c.Iters = "feplb", setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}, 4
	rec, err := Run(c, setup.Env{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	harnesstest.CheckTwoSteps(t, rec, results.StepLockstep)
	below := false
	for i, v := range rec.Timing.SlowestRank.Samples {
		below = below || v < rec.Timing.Lockstep.Samples[i]
	}
	if !below {
		t.Error("feplb on skewed routing: no iteration's slowest rank finished before the lockstep bound")
	}

	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	d := harnesstest.Small()
	d.Device = "cuda"
	rec, err = Run(d, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
	if err != nil {
		t.Fatal(err)
	}
	harnesstest.CheckTwoSteps(t, rec, results.StepSlowestRank)
}
