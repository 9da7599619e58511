package harness

import (
	"strings"
	"testing"

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
	l.Cfg.intr = intr
	if _, _, err := Reference(l, nil); !IsInterrupted(err) {
		t.Errorf("reference after the interrupt: %v", err)
	}
}
