package harness

import (
	"errors"
	"fmt"

	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// interruptedRecord marks rec interrupted by err: failed, nothing timed.
func interruptedRecord(rec *results.Record, err error) (*results.Record, error) {
	var ie *setup.InterruptedError
	errors.As(err, &ie)
	rec.Interrupted = ie.Why + " " + ie.While
	rec.Timing = nil
	return failed(rec, results.StatusFailed, fmt.Errorf("%w: nothing was timed", err))
}

// checkInterrupted is the record of a run whose check (c, err) the
// interrupt ierr cut: interrupted, nothing timed, with the check's verdict
// where it passed before the interrupt. Both pipelines' (run.go's and
// device.go's).
func checkInterrupted(rec *results.Record, c *results.Correctness, err, ierr error) (*results.Record, error) {
	if err == nil && c.Passed { // it ended before the interrupt
		rec.Correctness = c
	}
	return interruptedRecord(rec, ierr)
}

// interruptedSteps marks rec, whose timed steps the interrupt err cut
// after done of iters, interrupted: its timings are those done steps'.
func interruptedSteps(rec *results.Record, err error, done, iters int) string {
	var ie *setup.InterruptedError
	errors.As(err, &ie)
	rec.Interrupted = ie.Why + " " + ie.While
	return fmt.Sprintf("interrupted by %s after %d of %d timed iterations", ie.Why, done, iters)
}
