package advise

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness"
	"github.com/moebench/moebench/harness/bench"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// pacer keeps the budget and reports progress: one line per measurement,
// with an estimate of the time left (the mean bench point and the mean
// run so far, each × those planned, at most the budget left).
type pacer struct {
	o                         Options
	now                       func() time.Time
	start                     time.Time
	plannedBench, plannedRuns int
	doneBench, doneRuns       int
	spentBench, spentRuns     time.Duration
	stack                     *results.Stack
	longest                   time.Duration
}

// left is the budget left.
func (p *pacer) left() time.Duration { return p.o.Budget - p.now().Sub(p.start) }

// stop says why no further measurement may start: the budget is spent (or
// less of it is left than half the longest measurement so far), or the
// run was interrupted; "" when one may.
func (p *pacer) stop() string {
	if i := p.o.Env.Interrupt; i != nil && i.Why() != "" {
		return "interrupted: " + i.Why()
	}
	if l := p.left(); l <= 0 || l < p.longest/2 {
		return fmt.Sprintf("the budget (%v) ended", p.o.Budget.Round(time.Second))
	}
	return ""
}

// estimate is the time the planned measurements left will take, or false
// before any was timed.
func (p *pacer) estimate() (time.Duration, bool) {
	if p.doneBench+p.doneRuns == 0 {
		return 0, false
	}
	mean := func(spent time.Duration, n int) time.Duration {
		if n == 0 {
			return 0
		}
		return spent / time.Duration(n)
	}
	run, bench := mean(p.spentRuns, p.doneRuns), mean(p.spentBench, p.doneBench)
	if run == 0 {
		run = 4 * bench // a run's check and training steps: several bench points' work
	}
	if bench == 0 {
		bench = run / 4
	}
	rest := run*time.Duration(max(0, p.plannedRuns-p.doneRuns)) + bench*time.Duration(max(0, p.plannedBench-p.doneBench))
	return min(rest, max(0, p.left())), true
}

// line prints a progress line.
func (p *pacer) line(stage, what string) {
	if p.o.Progress == nil {
		return
	}
	est := "estimating the time left"
	if e, ok := p.estimate(); ok {
		est = "~" + e.Round(time.Second).String() + " left"
	}
	fmt.Fprintf(p.o.Progress, "moebench advise: [%d/%d] %s: %s · %s (budget: %v left)\n", p.doneBench+p.doneRuns, p.plannedBench+p.plannedRuns,
		stage, what, est, max(0, p.left()).Round(time.Second))
}

// run is harness.Run of c, paced and reported.
func (p *pacer) run(c setup.Config, what string) (*results.Record, error) {
	p.line("steps", what)
	t0 := p.now()
	rec, err := harness.Run(c, p.o.Env)
	dt := p.now().Sub(t0)
	p.doneRuns++
	p.spentRuns += dt
	p.longest = max(p.longest, dt)
	if rec != nil && p.stack == nil && rec.Status == results.StatusOK {
		s := rec.Stack
		p.stack = &s
	}
	return rec, err
}

// bench is bench.Dispatch of one design at budgets, paced and
// reported: each budget's dispatch + combine p50 (ms).
func (p *pacer) bench(c setup.Config, budgets []int) []SMPoint {
	p.line("SM budget", fmt.Sprintf("%s/%s bench dispatch at --sms %v", c.Dispatcher, c.Impl, budgets))
	t0 := p.now()
	b, err := bench.Dispatch(c, []string{c.Dispatcher}, budgets, p.o.Env)
	dt := p.now().Sub(t0)
	p.doneBench += len(budgets) // a bench of n budgets is n planned measurements
	p.spentBench += dt
	p.longest = max(p.longest, dt)
	pts := make([]SMPoint, 0, len(budgets))
	if b == nil {
		for _, n := range budgets {
			pts = append(pts, SMPoint{SMs: n, Status: results.StatusFailed, Reason: fmt.Sprint(err)})
		}
		return pts
	}
	for _, bp := range b.Points {
		pt := SMPoint{SMs: bp.SMs, Status: bp.Status, Reason: bp.Reason}
		if bp.Status == results.StatusOK {
			pt.Ms = roundTripMs(bp)
		}
		pts = append(pts, pt)
	}
	return pts
}

// roundTripMs is a bench point's dispatch (as its design's test times it)
// plus combine p50, as bench dispatch's table shows them.
func roundTripMs(bp bench.DispatchPoint) float64 {
	var d, c float64
	p50 := map[string]float64{}
	for _, ph := range bp.Phases {
		p50[ph.Name] = ph.P50
	}
	d, c = p50["dispatch"], p50["combine"]
	if dd := bp.DispatchAsDesigned; dd != nil {
		d = dd.P50
	}
	return d + c
}

// coarseGrid is the first budgets searched: spread over what a GPU's SMs
// allow one rank (a budget that does not fit is unavailable, with the
// reason, and left out); fewer on the host device, where a budget holds
// no SM.
func coarseGrid(device string) []int {
	if device == "host" {
		return []int{8, 16, 32}
	}
	return []int{8, 16, 32, 64}
}

// tune searches design d's SM budget: bench dispatch over the coarse
// grid, then once more between the best budget and its measured
// neighbours (the fine step), then the full layer step at the best two
// budgets (SMs given to communication are taken from the GEMMs), whose
// faster is the budget the finalist runs with. The step records are
// handed to o.Record.
func tune(o Options, p *pacer, steps Steps, d, im string, b dispatchers.SMBudget) (*Tuning, error) {
	t := &Tuning{Dispatcher: d, Impl: im}
	c := o.Base
	c.Dispatcher, c.Impl = d, im
	c.Warmup, c.Iters = steps.BenchWarmup, steps.BenchIters
	// the searches end by half the budget, so that the finalists' rounds
	// keep the rest
	late := func() bool { return p.stop() != "" || p.now().Sub(p.start) > p.o.Budget/2 }
	measure := func(budgets []int) {
		var todo []int
		for _, n := range budgets {
			if n > 0 && b.Check(n) == nil && !slices.ContainsFunc(t.Points, func(q SMPoint) bool { return q.SMs == n }) {
				todo = append(todo, n)
			}
		}
		if len(todo) > 0 && !late() {
			t.Points = append(t.Points, p.bench(c, todo)...)
		}
	}
	measure(coarseGrid(c.Device))
	measure(Refine(t.Points, b.Even))
	ranked := okPoints(t.Points)
	if len(ranked) == 0 {
		return t, nil
	}
	t.Smallest = Smallest(t.Points, Within)
	for _, pt := range ranked[:min(2, len(ranked))] {
		if late() {
			t.Note = "the budget left no time to confirm every budget with the full step"
			if why := p.stop(); why != "" {
				t.Note = why + " before every budget was confirmed with the full step"
			}
			break
		}
		s := o.Base
		s.Dispatcher, s.Impl, s.SMs = d, im, pt.SMs
		s.Warmup, s.Iters = steps.Warmup, steps.Iters
		s.MaxSeconds = max(1, p.left().Seconds())
		rec, err := p.run(s, fmt.Sprintf("confirming %s/%s sms=%d with the full layer step", d, im, pt.SMs))
		if rec == nil {
			return t, err
		}
		if err := record(o, rec); err != nil {
			return t, err
		}
		cp := SMPoint{SMs: pt.SMs, Status: rec.Status, Reason: rec.Reason}
		if rec.Status == results.StatusOK && rec.Timing != nil {
			cp.Ms = rec.Timing.Step.P50
		}
		t.Confirmed = append(t.Confirmed, cp)
	}
	if ok := okPoints(t.Confirmed); len(ok) > 0 {
		t.Best = ok[0].SMs
	} else if len(t.Confirmed) == 0 { // none confirmed (budget): bench dispatch's best
		t.Best = ranked[0].SMs
	}
	return t, nil
}

// okPoints are the points that ran, fastest first (ties: fewer SMs).
func okPoints(pts []SMPoint) []SMPoint {
	var ok []SMPoint
	for _, pt := range pts {
		if pt.Status == results.StatusOK && pt.Ms > 0 && !math.IsNaN(pt.Ms) {
			ok = append(ok, pt)
		}
	}
	sort.SliceStable(ok, func(i, j int) bool {
		if ok[i].Ms != ok[j].Ms {
			return ok[i].Ms < ok[j].Ms
		}
		return ok[i].SMs < ok[j].SMs
	})
	return ok
}

// Refine is the fine step of the search: the budgets halfway between the
// best measured budget and its measured neighbours (even where the design
// needs it), those not measured yet.
func Refine(pts []SMPoint, even bool) []int {
	ok := okPoints(pts)
	if len(ok) == 0 {
		return nil
	}
	best := ok[0].SMs
	var measured []int
	for _, pt := range pts {
		measured = append(measured, pt.SMs)
	}
	slices.Sort(measured)
	measured = slices.Compact(measured)
	i := slices.Index(measured, best)
	var out []int
	half := func(a, b int) {
		m := (a + b) / 2
		if even {
			m -= m % 2
		}
		if m > min(a, b) && m < max(a, b) && !slices.Contains(measured, m) && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	if i > 0 {
		half(measured[i-1], best)
	}
	if i+1 < len(measured) {
		half(best, measured[i+1])
	}
	return out
}

// Smallest is the smallest budget whose time is within slack of the best
// budget's (0 when none ran).
func Smallest(pts []SMPoint, slack float64) int {
	ok := okPoints(pts)
	if len(ok) == 0 {
		return 0
	}
	limit := ok[0].Ms * (1 + slack)
	n := ok[0].SMs
	for _, pt := range ok {
		if pt.Ms <= limit && pt.SMs < n {
			n = pt.SMs
		}
	}
	return n
}

// smallestNote says, for a tuned design, its best budget and the
// smallest within Within of it.
func smallestNote(t Tuning) string {
	if t.Note != "" {
		return fmt.Sprintf("%s/%s: budget %d SMs, bench dispatch's fastest (%s); the smallest budget within %.0f%% of the best dispatch + combine: %d SMs",
			t.Dispatcher, t.Impl, t.Best, t.Note, 100*Within, t.Smallest)
	}
	return fmt.Sprintf("%s/%s: best budget %d SMs (the full step at the two fastest budgets of bench dispatch); the smallest budget within %.0f%% of the best dispatch + combine: %d SMs",
		t.Dispatcher, t.Impl, t.Best, 100*Within, t.Smallest)
}
