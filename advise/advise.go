// Package advise answers the question the dispatcher selection guides
// answer with a static table — which dispatcher, and how many SMs, for this
// model on this node? — by measuring it, within a time budget: the
// availability gate of every design and implementation, a coarse-to-fine
// search of each SM-driven design's budget (bench dispatch) confirmed by
// the full layer step, and the finalists' training steps, interleaved and
// repeated until compare's statistical test separates the two fastest or
// the budget ends. It uses package harness to run and package results to
// decide and to print; cmd/moebench's advise command is its front end.
package advise

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// Schema names the JSON of an answer.
const Schema = "moebench.advise/v1"

// HostWarning is said first and last by an answer measured on the host
// device.
const HostWarning = "HOST DEVICE: these are wall-clock times of Go code running every rank on the CPU; they do not predict GPU performance. " +
	"Run moebench advise on the GPU node to choose a dispatcher."

// Within is the relative slack of "the smallest SM budget within 2% of the
// best".
const Within = 0.02

// Options are what Advise measures and how.
type Options struct {
	// Base is the workload (shape, EP, routing, seed, device resolved to
	// host or cuda); its dispatcher, implementation, SMs, iterations and
	// check are set by each measurement.
	Base setup.Config
	// Env is every run's and benchmark's environment (its Interrupt, when
	// set, stops Advise between measurements, and a run within its steps).
	Env    setup.Env
	Budget time.Duration
	// Rounds bounds the finalists' rounds; 0: DefaultRounds of the device.
	Rounds int
	// Designs and Impls are gated; nil: every registered dispatcher, both
	// implementations.
	Designs, Impls []string
	// Compare is the statistical test that separates the finalists.
	Compare results.CompareOptions
	// Progress gets a line per measurement with the time left; nil: none.
	Progress io.Writer
	// Record gets every record measured (written for report and compare).
	Record func(*results.Record) error
	// Now is the clock of the budget; nil: time.Now.
	Now func() time.Time
	// Command and Scaled are told in the answer: how advise was called,
	// and how the workload was scaled (host device), or "".
	Command, Scaled string
}

// Steps are the warm-up and timed iterations of each kind of measurement.
type Steps struct{ BenchWarmup, BenchIters, Warmup, Iters, Rounds int }

// DefaultSteps are each device's iteration counts: few and short on the
// host device (its times are not GPU performance; the host run shows the
// pipeline), as DeepEP's tests and moebench run on a GPU.
func DefaultSteps(device string) Steps {
	if device == "host" {
		return Steps{BenchWarmup: 1, BenchIters: 3, Warmup: 1, Iters: 5, Rounds: 3}
	}
	return Steps{BenchWarmup: 3, BenchIters: 20, Warmup: 3, Iters: 20, Rounds: 10}
}

// Answer is advise's decision and its evidence.
type Answer struct {
	Schema    string   `json:"schema"`
	Time      string   `json:"time"`
	Command   string   `json:"command,omitempty"`
	Device    string   `json:"device"`
	Stack     string   `json:"stack"`
	GPU       string   `json:"gpu,omitempty"` // model, cuda device
	Preset    string   `json:"preset"`
	Workload  string   `json:"workload"`
	Precision string   `json:"precision,omitempty"` // fp8, mxfp8; "" = bf16
	Scaled    string   `json:"scaled,omitempty"`
	BudgetS   float64  `json:"budget_s"`
	ElapsedS  float64  `json:"elapsed_s"`
	Stopped   string   `json:"stopped,omitempty"` // why measuring stopped before a decision
	Gate      []Gate   `json:"gate"`
	Tuning    []Tuning `json:"tuning,omitempty"`
	Finalists []*Final `json:"finalists"`
	Rounds    int      `json:"rounds"`
	Decision  Decision `json:"decision"`
	Guide     Guide    `json:"guide"`
	Reproduce string   `json:"reproduce,omitempty"`
	Notes     []string `json:"notes,omitempty"`
}

// Gate is one design and implementation at the availability gate.
type Gate struct {
	Dispatcher string `json:"dispatcher"`
	Impl       string `json:"impl"`
	Available  bool   `json:"available"`
	Reason     string `json:"reason,omitempty"`
	Stage      string `json:"stage,omitempty"` // where it was found unavailable: gate, tuning, steps
}

// Tuning is an SM-driven design's budget search.
type Tuning struct {
	Dispatcher string    `json:"dispatcher"`
	Impl       string    `json:"impl"`
	Points     []SMPoint `json:"points"`    // bench dispatch: dispatch + combine p50, in the order measured
	Confirmed  []SMPoint `json:"confirmed"` // the full layer step's p50 at the best two budgets
	Best       int       `json:"best"`      // the budget the finalist runs with (0: none worked)
	// Smallest is the smallest budget whose dispatch + combine was within
	// Within of the best budget's.
	Smallest int    `json:"smallest_within_2pct"`
	Note     string `json:"note,omitempty"` // why the search stopped short
}

// SMPoint is one budget's measurement.
type SMPoint struct {
	SMs    int     `json:"sms"`
	Ms     float64 `json:"ms,omitempty"`
	Status string  `json:"status"`
	Reason string  `json:"reason,omitempty"`
}

// Final is a finalist: a design at its budget, its training steps pooled
// over the rounds.
type Final struct {
	Dispatcher string    `json:"dispatcher"`
	Impl       string    `json:"impl"`
	SMs        int       `json:"sms"`                 // as run (0: the default, or not SM-driven)
	Precision  string    `json:"precision,omitempty"` // fp8, mxfp8; "" = bf16
	Status     string    `json:"status"`
	Reason     string    `json:"reason,omitempty"`
	Correct    string    `json:"correctness,omitempty"`
	Samples    []float64 `json:"step_samples_ms"`
	P50        float64   `json:"step_p50_ms"`
	MemPerRank int64     `json:"memory_per_rank_bytes"`
	MemNote    string    `json:"memory_note,omitempty"`
	// SMs held per rank and what is left to the GEMMs, as words.
	SMsLeft   string `json:"sms_left"`
	Reproduce string `json:"reproduce"`
	cfg       setup.Config
}

// Label is "dispatcher/impl sms=N" (sms only for SM-driven designs),
// followed by the precision when it is not bf16.
func (f *Final) Label() string {
	l := f.Dispatcher + "/" + f.Impl
	if _, ok := dispatchers.SMBudgetOf(f.Dispatcher, f.Impl); ok {
		l = fmt.Sprintf("%s/%s sms=%d", f.Dispatcher, f.Impl, f.SMs)
	}
	if f.Precision != "" {
		l += " " + f.Precision
	}
	return l
}

// precisionOf is c's precision, "" for bf16.
func precisionOf(c setup.Config) string {
	if c.Precision == setup.PrecisionBF16 {
		return ""
	}
	return c.Precision
}

// setPrecision tells the workload's precision, when not bf16, in the
// answer's workload and in its finalists' labels.
func (a *Answer) setPrecision(o Options) {
	p := precisionOf(o.Base)
	a.Precision = p
	if p != "" && !strings.Contains(a.Workload, " precision=") {
		a.Workload += " precision=" + p
	}
	for _, f := range a.Finalists {
		f.Precision = p
	}
}

// Decision is the answer: the winner and the runner-up with compare's
// statistics.
type Decision struct {
	Winner   string `json:"winner,omitempty"`
	RunnerUp string `json:"runner_up,omitempty"`
	// Separated: compare's test says the runner-up is slower; else there
	// is no significant difference (Why says which test).
	Separated bool          `json:"separated"`
	Verdict   string        `json:"verdict"` // compare's verdict of runner-up against winner
	Shift     results.Shift `json:"shift"`   // runner-up / winner − 1, with its interval
	Why       string        `json:"why,omitempty"`
	Summary   string        `json:"summary"`
}

// Guide is the static advice beside the measured answer.
type Guide struct {
	Hardware  string `json:"hardware"`  // the guide's hardware row
	Model     string `json:"model"`     // its model-family row, or ""
	Pick      string `json:"pick"`      // the design it names first ("" when it names none)
	Advice    string `json:"advice"`    // in its words, rounded
	Agreement string `json:"agreement"` // a sentence comparing it with the measurement
}

// Advise measures and decides. It returns the answer also when it stops
// early (budget, interrupt), with what it measured; the error is set when
// no finalist ran correctly or a record could not be written.
func Advise(o Options) (*Answer, error) {
	now := o.Now
	if now == nil {
		now = time.Now
	}
	start := now()
	steps := DefaultSteps(o.Base.Device)
	if o.Rounds > 0 {
		steps.Rounds = o.Rounds
	}
	designs, impls := o.Designs, o.Impls
	if designs == nil {
		designs = dispatchers.Names()
	}
	if impls == nil {
		impls = []string{dispatchers.ImplNative, dispatchers.ImplLibrary}
	}
	a := &Answer{Schema: Schema, Time: start.UTC().Format(time.RFC3339), Command: o.Command, Device: o.Base.Device,
		Preset: o.Base.Preset, Workload: o.Base.Record().Workload(), Scaled: o.Scaled, BudgetS: o.Budget.Seconds()}
	a.setPrecision(o)
	p := &pacer{o: o, now: now, start: start}
	defer func() { a.ElapsedS = now().Sub(start).Seconds() }()

	avail := a.gate(o, designs, impls) // a. the availability gate
	// plan: per SM-driven design its search and two confirmations, then
	// the finalists' rounds (for the estimate of the time left)
	for _, g := range avail {
		if _, ok := dispatchers.SMBudgetOf(g.Dispatcher, g.Impl); ok {
			p.plannedBench += len(coarseGrid(o.Base.Device)) + 2 // coarse, one refinement
			p.plannedRuns += 2                                   // two confirmations
		}
	}
	p.plannedRuns += len(avail) * steps.Rounds
	p.line("gate", fmt.Sprintf("%d of %d designs × implementations available here", len(avail), len(a.Gate)))

	finals, err := a.tuneAll(o, p, steps, avail) // b. each SM-driven design's budget
	if err != nil {
		return a, err
	}
	a.Finalists = finals

	// c. the finalists' training steps, interleaved and repeated
	for round := 0; round < steps.Rounds; round++ {
		if why := p.stop(); why != "" {
			a.Stopped = why
			break
		}
		if err := a.round(o, p, steps, finals, round); err != nil {
			return a, err
		}
		a.Rounds = round + 1
		if a.Stopped != "" {
			break
		}
		if round >= 1 { // two rounds at least: interleaved and repeated
			if d := decide(finals, o); d.Separated || d.Winner != "" && d.RunnerUp == "" {
				break
			}
		}
	}
	return a, a.conclude(o, p, finals)
}

// gate records every design × implementation's availability (its
// Validate and setup.CheckDispatcherAvailable) and returns the available ones.
func (a *Answer) gate(o Options, designs, impls []string) []Gate {
	var avail []Gate
	for _, d := range designs {
		for _, im := range impls {
			c := o.Base
			c.Dispatcher, c.Impl, c.SMs = d, im, 0
			g := Gate{Dispatcher: d, Impl: im, Available: true}
			err := c.Validate()
			if err == nil {
				err = setup.CheckDispatcherAvailable(c)
			}
			if err != nil {
				g.Available, g.Reason, g.Stage = false, err.Error(), "gate"
			}
			a.Gate = append(a.Gate, g)
			if g.Available {
				avail = append(avail, g)
			}
		}
	}
	return avail
}

// unavailable marks design d with implementation im unavailable at stage,
// for why, in the gate.
func (a *Answer) unavailable(d, im, stage, why string) {
	for i := range a.Gate {
		if g := &a.Gate[i]; g.Dispatcher == d && g.Impl == im && g.Available {
			g.Available, g.Reason, g.Stage = false, why, stage
		}
	}
}

// tuneAll searches each SM-driven design's budget and returns the
// finalists: every available design but those unavailable at every
// budget tried.
func (a *Answer) tuneAll(o Options, p *pacer, steps Steps, avail []Gate) ([]*Final, error) {
	var finals []*Final
	for _, g := range avail {
		f := &Final{Dispatcher: g.Dispatcher, Impl: g.Impl, Status: results.StatusOK, Precision: precisionOf(o.Base)}
		b, smDriven := dispatchers.SMBudgetOf(g.Dispatcher, g.Impl)
		if smDriven {
			t, err := tune(o, p, steps, g.Dispatcher, g.Impl, b)
			a.Tuning = append(a.Tuning, *t)
			if err != nil {
				return finals, err
			}
			switch st, why := searchFailed(t); {
			case len(t.Points) == 0: // the searches' half of the budget had passed
				a.Tuning[len(a.Tuning)-1].Note = "not searched: the budget's half for the searches had passed; its default budget runs"
			case st == results.StatusUnavailable: // at every budget tried
				a.unavailable(g.Dispatcher, g.Impl, "tuning", why)
				continue
			case st != "":
				f.Status, f.Reason = st, why
			default:
				f.SMs = t.Best
			}
		}
		finals = append(finals, f)
	}
	return finals, nil
}

// round runs each finalist still correct once, starting with another
// finalist each round; it sets a.Stopped when the budget or an interrupt
// stops it, and returns an error when a run or its record failed.
func (a *Answer) round(o Options, p *pacer, steps Steps, finals []*Final, round int) error {
	n := len(finals)
	for k := range n {
		f := finals[(k+round)%n] // each round starts with another finalist
		if f.Status != results.StatusOK {
			continue
		}
		if why := p.stop(); why != "" {
			a.Stopped = why
			return nil
		}
		c := o.Base
		c.Dispatcher, c.Impl, c.SMs = f.Dispatcher, f.Impl, f.SMs
		c.Warmup, c.Iters = steps.Warmup, steps.Iters
		c.Check = round == 0 && o.Base.Check // correct first; later rounds time only
		c.MaxSeconds = p.left().Seconds()
		rec, err := p.run(c, fmt.Sprintf("round %d of at most %d: %s", round+1, steps.Rounds, f.Label()))
		if rec == nil {
			return err
		}
		if werr := record(o, rec); werr != nil {
			return werr
		}
		f.absorb(rec, c)
		if f.Status == results.StatusUnavailable {
			a.unavailable(f.Dispatcher, f.Impl, "steps", f.Reason)
		}
		if setup.IsInterrupted(err) {
			a.Stopped = "interrupted: " + o.Env.Interrupt.Why()
			return nil
		}
	}
	return nil
}

// conclude decides, adds the notes and fills the answer; the error is set
// when no design ran correctly.
func (a *Answer) conclude(o Options, p *pacer, finals []*Final) error {
	a.Decision = decide(finals, o)
	for _, t := range a.Tuning {
		if f := find(finals, t.Dispatcher, t.Impl); f != nil && f.Status == results.StatusOK {
			a.Notes = append(a.Notes, smallestNote(t))
		}
	}
	if !o.Base.Check {
		a.Notes = append(a.Notes, "--check off: no finalist was checked against the float64 reference, so the answer is the fastest configuration, not the fastest correct one")
	}
	a.fill(o, p.stack)
	if a.Decision.Winner == "" && a.Stopped != "" {
		a.Decision.Summary = "no answer: " + a.Stopped + " before any design finished a correct run"
		return errors.New("advise: " + a.Decision.Summary)
	}
	if a.Decision.Winner == "" {
		return errors.New("advise: no design ran correctly here; see the gate and the finalists")
	}
	return nil
}

// searchFailed is, when no budget of a search ran, the status ("failed"
// where any budget failed, else "unavailable") and the first reason; ""
// when one ran or none was tried.
func searchFailed(t *Tuning) (status, why string) {
	if t.Best > 0 || len(t.Points) == 0 {
		return "", ""
	}
	status = results.StatusUnavailable
	for _, pt := range append(slices.Clone(t.Confirmed), t.Points...) {
		if pt.Status == results.StatusFailed && status != results.StatusFailed {
			status, why = results.StatusFailed, pt.Reason
		}
		if why == "" {
			why = pt.Reason
		}
	}
	return status, why
}

// record hands rec to o.Record.
func record(o Options, rec *results.Record) error {
	if o.Record == nil {
		return nil
	}
	return o.Record(rec)
}

// absorb adds a round's record to the finalist.
func (f *Final) absorb(rec *results.Record, c setup.Config) {
	if f.cfg.Dispatcher == "" {
		f.cfg = c
	}
	if rec.Status != results.StatusOK {
		f.Status, f.Reason = rec.Status, rec.Reason
		return
	}
	if want := c.Record().PassName(); rec.Config.PassName() != want { // e.g. a library with no backward
		f.Status = results.StatusUnavailable
		f.Reason = fmt.Sprintf("%s/%s times %s, not %s as the others do, so it cannot be ranked with them: %s",
			f.Dispatcher, f.Impl, rec.Config.PassName(), want, rec.Config.PassNote)
		return
	}
	if cr := rec.Correctness; cr != nil && cr.Checked {
		f.Correct = "PASS"
		if !cr.Passed {
			f.Status, f.Correct, f.Reason = results.StatusFailed, "FAIL", "correctness check failed: "+cr.Detail
			return
		}
	}
	if rec.Timing != nil {
		f.Samples = append(f.Samples, rec.Timing.Step.Samples...)
		f.P50 = medianOf(f.Samples)
	}
	if rec.Memory != nil && len(rec.Memory.PerRankBytes) > 0 {
		f.MemPerRank, f.MemNote = slices.Max(rec.Memory.PerRankBytes), rec.Memory.Method
	}
	f.SMsLeft = smsLeft(rec)
}

// smsLeft says what SMs a rank's transfers hold and what is left to the
// GEMMs, from the record.
func smsLeft(rec *results.Record) string {
	if rec.Config.Device == "host" {
		return "— (host device: no SMs are held)"
	}
	g := rec.Stack.GPU
	if g == nil || g.SMs == 0 {
		return "— (GPU's SM count not recorded)"
	}
	if rec.SMs.Held == 0 {
		return fmt.Sprintf("%d of %d (the dispatcher holds no SM budget)", g.SMs, g.SMs)
	}
	perGPU := ranksPerGPU(rec)
	held := rec.SMs.Held * perGPU
	return fmt.Sprintf("%d of %d (%d held per rank × %d rank(s) per GPU)", max(0, g.SMs-held), g.SMs, rec.SMs.Held, perGPU)
}

// ranksPerGPU is how many of the run's ranks share a GPU.
func ranksPerGPU(rec *results.Record) int {
	gpus := rec.Config.GPUs
	if gpus == 0 && rec.Stack.GPU != nil {
		gpus = min(rec.Stack.GPU.Count, rec.Config.EP)
	}
	if gpus <= 0 {
		return 1
	}
	return (rec.Config.EP + gpus - 1) / gpus
}

// decide ranks the finalists that ran correctly by their pooled step
// median and tests the runner-up against the winner with compare's test.
func decide(finals []*Final, o Options) Decision {
	var ok []*Final
	for _, f := range finals {
		if f.Status == results.StatusOK && len(f.Samples) > 0 {
			ok = append(ok, f)
		}
	}
	sort.SliceStable(ok, func(i, j int) bool { return ok[i].P50 < ok[j].P50 })
	var d Decision
	switch len(ok) {
	case 0:
		d.Summary = "no design ran correctly here: no answer"
		return d
	case 1:
		d.Winner = ok[0].Label()
		d.Summary = ok[0].Label() + " is the only design that ran correctly here: nothing to compare it with"
		return d
	}
	w, r := ok[0], ok[1]
	host := o.Base.Device == "host"
	d.Shift, d.Verdict, d.Why = results.DecideSamples(w.Samples, r.Samples, host, o.Compare)
	if d.Shift.Est < 0 { // the medians and compare's estimate (all pairs) disagree: the estimate decides
		w, r = r, w
		d.Shift, d.Verdict, d.Why = results.DecideSamples(w.Samples, r.Samples, host, o.Compare)
	}
	d.Winner, d.RunnerUp = w.Label(), r.Label()
	s := d.Shift
	ci := fmt.Sprintf("%+.1f%% (%.0f%% CI %+.1f%%…%+.1f%%)", 100*s.Est, 100*o.Compare.Confidence, 100*s.Lo, 100*s.Hi)
	if d.Verdict == results.VerdictRegression {
		d.Separated = true
		d.Summary = fmt.Sprintf("%s is the fastest: the runner-up, %s, takes %s longer per training step", w.Label(), r.Label(), ci)
		return d
	}
	why := d.Why
	if rest, ok := strings.CutPrefix(why, "step "); ok { // the change is told already
		if _, after, found := strings.Cut(rest, ": "); found {
			why = after
		}
	}
	if why == "" {
		why = fmt.Sprintf("the difference is within compare's %.0f%% threshold or its interval includes no change", 100*o.Compare.Threshold)
	}
	d.Summary = fmt.Sprintf("no significant difference between %s (the faster by compare's estimate) and %s: runner-up %s; %s", w.Label(), r.Label(), ci, why)
	return d
}

// find is the finalist of a design and implementation, or nil.
func find(finals []*Final, d, im string) *Final {
	for _, f := range finals {
		if f.Dispatcher == d && f.Impl == im {
			return f
		}
	}
	return nil
}

// fill completes the answer from the measured records: stack, guide,
// reproducing command.
func (a *Answer) fill(o Options, stk *results.Stack) {
	for _, f := range a.Finalists {
		if f.cfg.Dispatcher != "" {
			c := f.cfg
			c.MaxSeconds = 0 // what was left of advise's budget, not a setting of the point
			f.Reproduce = Reproduce(c)
		}
	}
	gpu := ""
	if stk != nil {
		a.Stack = stk.Summary()
		if stk.GPU != nil {
			gpu = stk.GPU.Model
		}
	}
	a.GPU = gpu
	winner := ""
	for _, f := range a.Finalists {
		if f.Label() == a.Decision.Winner {
			winner = f.Dispatcher
			a.Reproduce = f.Reproduce
		}
	}
	a.Guide = StaticGuide(o.Base.Device, gpu, o.Base.Preset)
	a.Guide.Agreement = agreement(a, winner)
}

// medianOf is the median of x (unsorted).
func medianOf(x []float64) float64 {
	if len(x) == 0 {
		return math.NaN()
	}
	s := slices.Clone(x)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
