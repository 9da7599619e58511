package setup

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// Interrupt asks a run to stop early (a signal): the run stops at the next
// step it would start, or where its check or reference next looks, and
// returns a record of what it measured, marked interrupted. In a run over
// several processes, every process stops where all agree to, after the
// same step (agreeStop; docs/interrupts.md). A nil *Interrupt never fires.
type Interrupt struct {
	mu  sync.Mutex
	why string
}

// Stop fires i, saying why (e.g. "SIGINT"); later calls change nothing.
func (i *Interrupt) Stop(why string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.why == "" {
		i.why = why
	}
}

// Why is why i fired, "" while it has not.
func (i *Interrupt) Why() string {
	if i == nil {
		return ""
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.why
}

// InterruptedError is a run stopped by its Interrupt: why, and while doing
// what.
type InterruptedError struct{ Why, While string }

func (e *InterruptedError) Error() string { return fmt.Sprintf("interrupted by %s %s", e.Why, e.While) }

// IsInterrupted reports whether err is (or wraps) an InterruptedError.
func IsInterrupted(err error) bool {
	var ie *InterruptedError
	return errors.As(err, &ie)
}

// Interrupted is an InterruptedError while doing while, once i has fired;
// nil before.
func (i *Interrupt) Interrupted(while string) error {
	if why := i.Why(); why != "" {
		return &InterruptedError{why, while}
	}
	return nil
}

// BeforeStep is interrupted before step i of cfg's loop (kind: "" or
// "the paused "), its stage named only once i has fired: the timed loop
// builds no string per step.
func (i *Interrupt) BeforeStep(kind string, step int, cfg Config) error {
	if i.Why() == "" {
		return nil
	}
	return i.Interrupted("before " + kind + StepStage(step, cfg))
}

// Where an interrupt before the timed steps stops a run, as its record
// says.
const (
	WhileBuilding = "while building the layer"
	WhileChecking = "while checking the output against the float64 reference"
)

// stopSignals are the interrupts a run over several processes names in
// its agreement (agreeStop), by their place + 1; any other reason is
// stopOther.
var stopSignals = []string{"SIGINT", "SIGTERM"}

const stopOther = "an interrupt"

// InterruptCode is why's code in the agreement: 0 while it has not fired.
func InterruptCode(why string) uint64 {
	if why == "" {
		return 0
	}
	for i, s := range stopSignals {
		if why == s {
			return uint64(i + 1)
		}
	}
	return uint64(len(stopSignals) + 1)
}

// DescribeInterrupts names the interrupts of a run over several processes from
// each process's code (in process order), e.g. "SIGTERM to process 1" or
// "SIGINT to processes 0, 1"; "" when none fired.
func DescribeInterrupts(codes []uint64) string {
	var parts []string
	for code := uint64(1); code <= uint64(len(stopSignals)+1); code++ {
		var ps []string
		for p, c := range codes {
			if c == code || code == uint64(len(stopSignals)+1) && c > code {
				ps = append(ps, strconv.Itoa(p))
			}
		}
		if ps == nil {
			continue
		}
		name := stopOther
		if int(code) <= len(stopSignals) {
			name = stopSignals[code-1]
		}
		if len(ps) == 1 {
			parts = append(parts, name+" to process "+ps[0])
		} else {
			parts = append(parts, name+" to processes "+strings.Join(ps, ", "))
		}
	}
	return strings.Join(parts, ", ")
}
