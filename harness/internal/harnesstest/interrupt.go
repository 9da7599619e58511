package harnesstest

import (
	"strings"

	"github.com/moebench/moebench/harness/setup"
)

// Interrupter fires its interrupt once a progress line names a timed step.
type Interrupter struct{ Intr *setup.Interrupt }

func (w Interrupter) Write(b []byte) (int, error) {
	if strings.Contains(string(b), "timed step") {
		w.Intr.Stop("SIGINT")
	}
	return len(b), nil
}
