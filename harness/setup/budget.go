package setup

import (
	"fmt"
	"time"
)

// The time budget of a run (--max-seconds): it stops the warm-up and timed
// iterations cleanly, keeping what was timed.

// Deadlines are when the paused steps of a rebalancing dispatcher (half
// the --max-seconds budget) and all steps must stop; zero without a budget.
func (c Config) Deadlines(rebalances bool) (paused, end time.Time) {
	if c.MaxSeconds == 0 {
		return time.Time{}, time.Time{}
	}
	now, budget := time.Now(), time.Duration(c.MaxSeconds*float64(time.Second))
	paused = now.Add(budget)
	if rebalances {
		paused = now.Add(budget / 2)
	}
	return paused, now.Add(budget)
}

// Stopped says why a run timed done of its c.Iters iterations ("" if all).
func (c Config) Stopped(done int) string {
	if done == c.Iters {
		return ""
	}
	return fmt.Sprintf("stopped by --max-seconds %g after %d of %d timed iterations", c.MaxSeconds, done, c.Iters)
}

// Iterate runs step for the warm-up (i < 0) and the timed iterations (i ≥
// 0). Past deadline (zero: none) the warm-up ends and the timed iterations
// stop after the one running, with at least one run. It returns how many
// timed iterations ran.
func Iterate(warmup, iters int, deadline time.Time, step func(i int) error) (int, error) {
	for i := -warmup; i < iters; i++ {
		if !deadline.IsZero() && time.Now().After(deadline) {
			if i > 0 {
				return i, nil
			}
			i = 0
		}
		if err := step(i); err != nil {
			return i, err
		}
	}
	return iters, nil
}
