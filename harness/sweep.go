package harness

import (
	"errors"
	"fmt"
	"time"

	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// SweepEvent reports one finished sweep point.
type SweepEvent struct {
	Index, Total int // 1-based index of the point that finished
	Config       setup.Config
	Record       *results.Record // nil only if the point could not even start
	Err          error           // why it failed or is unavailable
	Remaining    time.Duration   // estimate: mean time per point so far × points left
}

// Sweep runs the points in order. After each point, record receives its
// record (failed and unavailable ones too) and progress the event; a point's
// failure does not stop the sweep. Sweep stops early, between points, when
// stop is closed, or when record fails (the results file is then unusable).
// It returns how many points finished.
//
// Over several processes (env.Rendezvous), every process runs the same
// points in the same order: each point's set-up ends in an agreement (all
// run it, or none does, with the same status), and a failed point stops
// the sweep on every process (a *SweepStopped): one failure after the
// processes met stops the others (their watch), so none is left to go on.
func Sweep(points []setup.Config, env setup.Env, stop <-chan struct{}, record func(*results.Record) error, progress func(SweepEvent)) (int, error) {
	start := time.Now()
	for i, cfg := range points {
		select {
		case <-stop:
			return i, nil
		default:
		}
		rec, err := Run(cfg, env)
		var ce *setup.ConfigError
		if rec == nil && errors.As(err, &ce) { // e.g. processes launched with different settings: every process refuses
			return i, err
		}
		if rec != nil {
			if rerr := record(rec); rerr != nil {
				return i, rerr
			}
		}
		per := time.Since(start) / time.Duration(i+1)
		progress(SweepEvent{Index: i + 1, Total: len(points), Config: cfg, Record: rec, Err: err,
			Remaining: per * time.Duration(len(points)-i-1)})
		if env.Rendezvous != nil && env.Rendezvous.L.Distributed() && rec != nil && rec.Status == results.StatusFailed && i+1 < len(points) {
			return i + 1, &SweepStopped{Point: i + 1, Err: err}
		}
	}
	return len(points), nil
}

// SweepStopped: a sweep over several processes stopped after a failed
// point.
type SweepStopped struct {
	Point int
	Err   error
}

func (e *SweepStopped) Error() string {
	return fmt.Sprintf("point %d failed in a run over several processes, which stops the sweep on every process (the others may have been stopped by it): %v", e.Point, e.Err)
}
