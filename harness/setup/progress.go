package setup

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// Progress reports a long run's progress: from every after the start, a line
// saying what the run is doing, how many of its steps are done and, once
// one is, an estimate of the time left; then again every every, or every
// sixth of the time elapsed when that is longer (at most a minute apart),
// so that a long run's log stays short. Lines go to the writer (stderr),
// never into the record. A nil *progress reports nothing.
type Progress struct {
	w     io.Writer
	every time.Duration
	Now   func() time.Time

	mu         sync.Mutex
	start      time.Time
	stage      string
	done       int // steps finished (warm-up, paused and timed)
	total      int // steps to run
	stepsStart time.Time
	// a step's work (0: not counted) and the current step's work done
	stepWork, inStep float64
	// a stage of counted work (work): its units done of total, since
	// workStart; total 0: the stage is not counted
	workDone, workTotal float64
	workStart           time.Time
	// Stages are the counted stages ended, each "STAGE: DONE/TOTAL" (tests)
	Stages []string

	stop chan struct{}
	wg   sync.WaitGroup
}

// DefaultProgressEvery is how long a run stays silent, and then how often it
// reports.
const DefaultProgressEvery = 5 * time.Second

// StartProgress starts reporting to w every every (0: the default) a run of
// total steps; nil when w is nil.
func StartProgress(w io.Writer, every time.Duration, total int) *Progress {
	if w == nil {
		return nil
	}
	if every <= 0 {
		every = DefaultProgressEvery
	}
	p := &Progress{w: w, every: every, Now: time.Now, total: total, stage: "building the layer", stop: make(chan struct{})}
	p.start = p.Now()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTimer(every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				fmt.Fprintf(p.w, "moebench: %s\n", p.line())
				t.Reset(min(max(every, p.Now().Sub(p.start)/6), time.Minute))
			}
		}
	}()
	return p
}

// Set names what the run does now.
func (p *Progress) Set(stage string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.endWork()
	p.stage, p.workTotal, p.workDone = stage, 0, 0
	p.mu.Unlock()
}

// Work names what the run does now and how many units of work it is
// (experts drawn, phases run, experts' references computed), which add
// counts as they finish: the line then says the share done and the time
// left at the stage's rate so far.
func (p *Progress) Work(stage string, total float64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.endWork()
	p.stage, p.workTotal, p.workDone, p.workStart = stage, total, 0, p.Now()
	p.mu.Unlock()
}

// endWork notes the counted stage that ends (p.mu held).
func (p *Progress) endWork() {
	if p.workTotal > 0 {
		p.Stages = append(p.Stages, fmt.Sprintf("%s: %g/%g", p.stage, p.workDone, p.workTotal))
	}
}

// Add counts n units of the stage's work done; safe from any goroutine.
func (p *Progress) Add(n float64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.workDone += n
	p.mu.Unlock()
}

// StepDone counts a finished step.
func (p *Progress) StepDone() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.done++
	p.inStep = 0
	p.mu.Unlock()
}

// Stepping marks the start of the steps, for the estimate; work, when
// not 0, is a step's work, which stepAdd counts as its phases end, so
// that the share done and the estimate move within a long step.
func (p *Progress) Stepping(work float64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.stepsStart.IsZero() {
		p.stepsStart = p.Now()
	}
	p.stepWork = work
	p.mu.Unlock()
}

// StepAdd counts n units of the current step's work done.
func (p *Progress) StepAdd(n float64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.inStep += n
	p.mu.Unlock()
}

// Finish stops the reports.
func (p *Progress) Finish() {
	if p == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
}

// line is the report: the stage, steps done, time elapsed and left.
func (p *Progress) line() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.Now()
	s := p.stage
	counted := p.workTotal > 0
	if counted {
		s += fmt.Sprintf(" · %d%%", percent(p.workDone, p.workTotal))
	}
	done := float64(p.done) // and the share of the current step done
	if p.stepWork > 0 {
		done += min(1, p.inStep/p.stepWork)
	}
	if !p.stepsStart.IsZero() {
		s += fmt.Sprintf(" · %d of %d steps done (%d%%)", p.done, p.total, percent(done, float64(p.total)))
	}
	s += fmt.Sprintf(" · %s elapsed", roundDuration(now.Sub(p.start)))
	switch {
	case counted && p.workDone > 0:
		left := float64(now.Sub(p.workStart)) / p.workDone * max(0, p.workTotal-p.workDone)
		s += fmt.Sprintf(" · about %s left in this stage", roundDuration(time.Duration(left)))
	case !counted && done > 0 && !p.stepsStart.IsZero():
		left := float64(now.Sub(p.stepsStart)) / done * max(0, float64(p.total)-done)
		s += fmt.Sprintf(" · about %s left", roundDuration(time.Duration(left)))
	}
	return s
}

// roundDuration rounds d to what a person reads: seconds, or tenths below
// ten seconds.
func roundDuration(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}

// percent is done of total in whole percent, at most 100.
func percent(done, total float64) int {
	if total <= 0 {
		return 0
	}
	return int(min(100, 100*done/total))
}
