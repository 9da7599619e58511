package harnesstest

import (
	"math"
	"testing"

	"github.com/moebench/moebench/results"
)

// checkTwoSteps: the record's lockstep bound is, per iteration, the sum of
// each phase's slowest rank; the slowest rank's step is never above it;
// Step is the one StepIs names (want); and the per-copy bandwidth is the
// workload's copies over each phase's p50.
func CheckTwoSteps(t *testing.T, rec *results.Record, want string) {
	t.Helper()
	tm := rec.Timing
	if tm.SlowestRank == nil || tm.Lockstep == nil || tm.StepIs != want {
		t.Fatalf("steps: slowest %v, lockstep %v, step is %q (want %q)", tm.SlowestRank, tm.Lockstep, tm.StepIs, want)
	}
	for i := range tm.Lockstep.Samples {
		var sum float64
		for _, p := range tm.Phases {
			sum += p.Samples[i]
		}
		if math.Abs(sum-tm.Lockstep.Samples[i]) > 1e-9*sum {
			t.Errorf("iteration %d: lockstep %v, phases' slowest ranks sum to %v", i, tm.Lockstep.Samples[i], sum)
		}
		if tm.SlowestRank.Samples[i] > tm.Lockstep.Samples[i]*(1+1e-12) && want == results.StepLockstep {
			t.Errorf("iteration %d: the slowest rank's own step %v is above the lockstep bound %v", i, tm.SlowestRank.Samples[i], tm.Lockstep.Samples[i])
		}
	}
	step := tm.Lockstep
	if want == results.StepSlowestRank {
		step = tm.SlowestRank
	}
	if tm.Step.P50 != step.P50 || len(tm.Step.Samples) != len(step.Samples) || tm.Step.Name != "step" {
		t.Errorf("step p50 %v (%d samples), want %s's %v", tm.Step.P50, len(tm.Step.Samples), want, step.P50)
	}
	if len(tm.SlowestRank.PerRank) != rec.Config.EP {
		t.Errorf("slowest rank's step has %d ranks' medians", len(tm.SlowestRank.PerRank))
	}
	c, tr := rec.Config, rec.Traffic
	copies := int64(c.EP * c.Tokens * c.TopK * c.Hidden * 2)
	var dispatch float64
	for _, p := range tm.Phases {
		if p.Name == "dispatch" {
			dispatch = p.P50
		}
	}
	if tr.CopyBytes != copies || tr.DispatchCopyGBps != results.GBps(copies, c.EP, dispatch) || tr.CombineCopyGBps <= 0 {
		t.Errorf("copy bytes %d (want %d), GB/s %v and %v", tr.CopyBytes, copies, tr.DispatchCopyGBps, tr.CombineCopyGBps)
	}
}
