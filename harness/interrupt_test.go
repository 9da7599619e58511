package harness

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// TestInterruptBeforeTheSteps: a run interrupted before its timed steps
// returns a failed record marked interrupted, saying nothing was timed;
// the reference stops at its next expert once the interrupt fires.
func TestInterruptBeforeTheSteps(t *testing.T) {
	intr := &Interrupt{}
	intr.Stop("SIGTERM")
	intr.Stop("SIGINT") // the first one counts
	rec, err := Run(small(), Env{Version: "test", Interrupt: intr})
	if !IsInterrupted(err) || rec == nil || rec.Status != results.StatusFailed || rec.Timing != nil ||
		rec.Interrupted != "SIGTERM while building the layer" || !strings.Contains(rec.Reason, "nothing was timed") {
		t.Fatalf("interrupted run: %v, %+v", err, rec)
	}
	l, _, _ := trained(t, small())
	l.Cfg.carry(l.Cfg.progressLine(), intr)
	if _, _, err := Reference(l, nil); !IsInterrupted(err) {
		t.Errorf("reference after the interrupt: %v", err)
	}
}

// interrupter fires its interrupt once a progress line names a timed step.
type interrupter struct{ intr *Interrupt }

func (w interrupter) Write(b []byte) (int, error) {
	if strings.Contains(string(b), "timed step") {
		w.intr.Stop("SIGINT")
	}
	return len(b), nil
}

// TestDeviceInterrupt: on the device pipeline an interrupt during the timed
// steps ends the run after the step it is in, with an ok record of the
// steps timed, marked interrupted.
func TestDeviceInterrupt(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	c := deviceCases()["softmax-natural"]
	c.Warmup, c.Iters = 1, 2000
	intr := &Interrupt{}
	rec, err := Run(c, Env{Version: "test", Interrupt: intr, OpenDevices: one(&device.Emu{}), Progress: interrupter{intr}, ProgressEvery: time.Millisecond})
	if err != nil || rec == nil || rec.Timing == nil {
		t.Fatalf("interrupted device run: %v, %+v", err, rec)
	}
	n := rec.Timing.Iters
	if rec.Status != results.StatusOK || !strings.HasPrefix(rec.Interrupted, "SIGINT before timed step ") || n < 1 || n >= c.Iters || len(rec.Timing.Step.Samples) != n ||
		rec.Timing.Stopped != fmt.Sprintf("interrupted by SIGINT after %d of %d timed iterations", n, c.Iters) {
		t.Errorf("interrupted device run: status %s, interrupted %q, %d timed iterations, stopped %q", rec.Status, rec.Interrupted, n, rec.Timing.Stopped)
	}
}

// TestAgreedWhy: the interrupt that a run over several processes agrees
// on names each signal and the processes it reached; none fired: "".
func TestAgreedWhy(t *testing.T) {
	for _, c := range []struct {
		whys []string
		want string
	}{
		{[]string{"", ""}, ""},
		{[]string{"", "SIGTERM"}, "SIGTERM to process 1"},
		{[]string{"SIGINT", "SIGINT", ""}, "SIGINT to processes 0, 1"},
		{[]string{"SIGTERM", "SIGINT", "a test"}, "SIGINT to process 1, SIGTERM to process 0, an interrupt to process 2"},
	} {
		var codes []uint64
		for _, w := range c.whys {
			codes = append(codes, stopCode(w))
		}
		if got := agreedWhy(codes); got != c.want {
			t.Errorf("%q: %q, want %q", c.whys, got, c.want)
		}
	}
}
