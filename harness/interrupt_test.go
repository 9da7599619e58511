package harness

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/harness/check"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// TestInterruptBeforeTheSteps: a run interrupted before its timed steps
// returns a failed record marked interrupted, saying nothing was timed;
// the reference stops at its next expert once the interrupt fires.
func TestInterruptBeforeTheSteps(t *testing.T) {
	intr := &setup.Interrupt{}
	intr.Stop("SIGTERM")
	intr.Stop("SIGINT") // the first one counts
	rec, err := Run(harnesstest.Small(), setup.Env{Version: "test", Interrupt: intr})
	if !setup.IsInterrupted(err) || rec == nil || rec.Status != results.StatusFailed || rec.Timing != nil ||
		rec.Interrupted != "SIGTERM while building the layer" || !strings.Contains(rec.Reason, "nothing was timed") {
		t.Fatalf("interrupted run: %v, %+v", err, rec)
	}
	l, _, _ := trained(t, harnesstest.Small())
	l.Cfg.AttachRunState(l.Cfg.ProgressLine(), intr)
	if _, _, err := check.Reference(l, nil); !setup.IsInterrupted(err) {
		t.Errorf("reference after the interrupt: %v", err)
	}
}

// TestDeviceInterrupt: on the device pipeline an interrupt during the timed
// steps ends the run after the step it is in, with an ok record of the
// steps timed, marked interrupted.
func TestDeviceInterrupt(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	c := harnesstest.DeviceCases()["softmax-natural"]
	c.Warmup, c.Iters = 1, 2000
	intr := &setup.Interrupt{}
	rec, err := Run(c, setup.Env{Version: "test", Interrupt: intr, OpenDevices: harnesstest.OneDevice(&device.Emu{}), Progress: harnesstest.Interrupter{Intr: intr}, ProgressEvery: time.Millisecond})
	if err != nil || rec == nil || rec.Timing == nil {
		t.Fatalf("interrupted device run: %v, %+v", err, rec)
	}
	n := rec.Timing.Iters
	if rec.Status != results.StatusOK || !strings.HasPrefix(rec.Interrupted, "SIGINT before timed step ") || n < 1 || n >= c.Iters || len(rec.Timing.Step.Samples) != n ||
		rec.Timing.Stopped != fmt.Sprintf("interrupted by SIGINT after %d of %d timed iterations", n, c.Iters) {
		t.Errorf("interrupted device run: status %s, interrupted %q, %d timed iterations, stopped %q", rec.Status, rec.Interrupted, n, rec.Timing.Stopped)
	}
}
