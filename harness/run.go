package harness

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/montanaflynn/stats"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/check"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/harness/summary"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/results"
)

// steps is how many steps a run of cfg with d takes: warm-up and timed,
// twice for a rebalancing dispatcher (its paused steps first).
func steps(cfg setup.Config, c dispatchers.Capabilities) int {
	n := cfg.Warmup + cfg.Iters
	if c.Rebalance != nil {
		n *= 2
	}
	return n
}

// Run builds the layer, checks it (unless cfg.Check is false), times
// cfg.Iters steps after cfg.Warmup and returns the record. cfg.Device must be
// resolved (host or cuda). On failure or unavailability it returns a record
// without timings, saying why, together with the error; a *ConfigError means
// bad input and comes without a record.
func Run(cfg setup.Config, env setup.Env) (*results.Record, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	why := env.ForwardOnlyReason(cfg)
	cfg.ForwardOnly = cfg.ForwardOnly || why != ""
	forced := cfg.HostExperts != "" && cfg.HostExperts != setup.HostExpertsAuto
	if cfg.Device == "host" {
		cfg.HostExperts = cfg.ResolvedHostExperts() // decided once, before the record says it
	}
	noDump, err := dumpRefusal(cfg, env, forced)
	if err != nil {
		return nil, err
	}
	rec := NewRecord(cfg, env)
	rec.Config.PassNote = why
	if cfg.Device != "host" {
		return runDevice(cfg, env, rec)
	}
	return runHost(cfg, env, rec, forced, noDump)
}

// dumpRefusal is why env.Dump cannot be written for cfg: a *ConfigError
// (err) where the configuration asks for what a dump cannot hold, else
// noDump, the reason the run ends unavailable before any step (a training
// step's dump on the host needs every weight gradient held; forced: the
// user chose --host-experts).
func dumpRefusal(cfg setup.Config, env setup.Env, forced bool) (noDump, err error) {
	if cfg.Device == "host" && env.Dump != "" && !cfg.ForwardOnly && cfg.HostExperts != setup.HostExpertsHeld {
		why := fmt.Sprintf("a training step's dump writes every expert's weight gradients, which this layer does not hold (--host-experts %s); "+
			"add --forward-only, or use a layer whose experts' weights and weight gradients fit in memory", cfg.HostExperts)
		if forced {
			return nil, &setup.ConfigError{Flag: "dump", Value: env.Dump, Allowed: why}
		}
		noDump = errors.New("--dump: " + why)
	}
	if env.Dump != "" && cfg.Overlaps(setup.OverlapA2A) {
		return nil, &setup.ConfigError{Flag: "dump", Value: env.Dump, Allowed: "with --overlap a2a the weight gradients are the sum of two micro-batches' while a dump holds " +
			"micro-batch 0's inputs only, so its backward could not be recomputed from it; dump a run without --overlap a2a"}
	}
	return noDump, nil
}

// hostRun is what runHost's steps share.
type hostRun struct {
	cfg     setup.Config
	env     setup.Env
	rec     *results.Record
	d       dispatchers.Dispatcher
	l       *layer.Layer
	prog    *setup.Progress
	m       layer.Measurements
	samples map[string][][]float64 // where timed records: samples[phase][rank][iter] in milliseconds
	iter    int                    // the step being run (< 0: a warm-up step, not recorded)
	work    map[string]float64     // each phase's share of a step, for the progress line
	plant   time.Duration          // plant.go's test-only delay, or 0
}

// runHost is Run on the host device. Its steps are hostRun's methods;
// each that returns a record or an error ends the run with them.
func runHost(cfg setup.Config, env setup.Env, rec *results.Record, forced bool, noDump error) (*results.Record, error) {
	h := &hostRun{cfg: cfg, env: env, rec: rec, iter: -1}
	fresh := func() (dispatchers.Dispatcher, error) {
		return dispatchers.New(h.cfg.Dispatcher, h.cfg.Impl, h.cfg.DispatcherEnv())
	}
	d, err := fresh()
	if err != nil {
		return dispatcherError(rec, h.cfg, err)
	}
	h.d = d
	h.prog = setup.StartProgress(env.Progress, env.ProgressEvery, steps(h.cfg, d.Capabilities()))
	defer h.prog.Finish()
	h.cfg.AttachRunState(h.prog, env.Interrupt)
	if err := checkHostMemory(h.cfg); err != nil {
		return failed(rec, results.StatusUnavailable, err)
	}
	if noDump != nil {
		return failed(rec, results.StatusUnavailable, noDump)
	}
	note := layer.HostExpertsNote(h.cfg.HostExperts, forced)
	if note != "" && env.Progress != nil {
		fmt.Fprintf(env.Progress, "moebench: %s\n", note)
	}
	if out, err := h.buildLayer(); out != nil || err != nil {
		return out, err
	}
	if out, err := h.check(fresh); out != nil || err != nil {
		return out, err
	}
	if status, err := h.newMeasured(note); err != nil {
		return failed(rec, status, err)
	}
	if out, err := h.timeSteps(); out != nil || err != nil {
		return out, err
	}
	rec.Status = results.StatusOK
	m, l := &h.m, h.l
	m.Traffic = d.Traffic() // after the steps: it counts the last one
	m.Buffers = buffers(d.Capabilities(), h.cfg.EP)
	m.Recv = segmentRows(l.Ranks)
	for r := range l.Ranks {
		m.Mem.PerRankBytes = append(m.Mem.PerRankBytes, l.Footprint(d, r))
	}

	m.Phase2SMs = "not measured on the host device"
	fillMeasurements(rec, h.cfg, *m)
	if h.cfg.Overlapping() { // overlap.go: the host runs every phase in turn
		if rec.Overlap, err = check.HostOverlap(h.cfg, fresh, rec.Memory); err != nil {
			return failed(rec, results.StatusFailed, err)
		}
	}
	if rec.Interrupted != "" { // stop now: no dump
		return rec, nil
	}
	return rec, dump(env, l, rec)
}

// buildLayer draws the layer and binds the dispatcher to it.
func (h *hostRun) buildLayer() (*results.Record, error) {
	cfg, rec := h.cfg, h.rec
	if cfg.HostExperts != setup.HostExpertsDrawn {
		h.prog.Work(setup.BuildExperts, float64(cfg.Experts))
	}
	l, err := layer.NewLayer(cfg)
	if err != nil {
		var ce *setup.ConfigError
		if errors.As(err, &ce) {
			return nil, err
		}
		return failed(rec, results.StatusFailed, err)
	}
	h.l = l
	if err := h.d.Bind(l.Shape, l.Ranks); dispatchers.IsUnavailable(err) { // the design's limits on this shape
		return dispatcherError(rec, cfg, err)
	} else if err != nil {
		return failed(rec, results.StatusFailed, err)
	}
	if err := h.env.Interrupt.Interrupted(setup.WhileBuilding); err != nil {
		return interruptedRecord(rec, err)
	}
	return nil, nil
}

// check runs the layer's check (cfg.Check; fresh makes the reference's
// dispatchers) and records it; a failed check ends the run with the
// check's step dumped.
func (h *hostRun) check(fresh func() (dispatchers.Dispatcher, error)) (*results.Record, error) {
	rec := h.rec
	if !h.cfg.Check {
		rec.Correctness = &results.Correctness{Checked: false, Detail: "check disabled by --check off"}
		return nil, nil
	}
	h.prog.Set(setup.Checking)
	c, err := check.Check(h.l, h.d, fresh)
	if ierr := h.env.Interrupt.Interrupted(setup.WhileChecking); ierr != nil {
		return checkInterrupted(rec, c, err, ierr)
	}
	if err != nil {
		return failed(rec, results.StatusFailed, err)
	}
	rec.Correctness = c
	if !c.Passed {
		rec.Status, rec.Reason = results.StatusFailed, "correctness check failed: "+c.Detail
		return rec, errors.Join(errors.New(rec.Reason), dump(h.env, h.l, rec))
	}
	return nil, nil
}

// newMeasured makes the timed steps' samples, empty, with the clock, the
// timing model and the memory method they are read by (note: the host
// experts' note, or ""), each phase's share of a step and the planted
// delay; on an error, the status the run ends with.
func (h *hostRun) newMeasured(note string) (string, error) {
	cfg := h.cfg
	m := &h.m
	*m = layer.Measurements{
		Clock: "host wall clock (Go time.Now); not comparable with GPU timings",
		Model: "each phase's sample is its slowest rank in that iteration; step = sum of the phase samples (ranks in lockstep, a barrier between phases)",
		Mem: &results.Memory{Method: "host buffers, accounted: the rank's host buffers after the run, float32 storage (its share of expert weights, shared/router weights, activations, " +
			"dispatcher buffers; in a training step also what the forward keeps for the backward, the gradients and the experts' fp32 weight gradients); not a measured peak"}}
	if note != "" {
		m.Clock += "; " + note
		m.Mem.Method += "; " + layer.HostExpertsHeldNote(cfg.HostExperts)
	}
	var err error
	if m.Phases, err = h.l.Phases(h.d); err != nil {
		return results.StatusUnavailable, err
	}
	if !cfg.ForwardOnly {
		m.Forward = len(h.l.Steps(h.d))
		m.Model += "; fwd and bwd are the sums of their passes' phases, step = fwd + bwd"
	}
	m.Samples = m.NewSamples(cfg.EP)
	h.samples = m.Samples
	h.work = map[string]float64{}
	for _, ph := range m.Phases {
		h.work[ph] = check.PhaseWork(cfg, ph)
	}
	if h.plant, err = setup.PlantedDelay(cfg.Dispatcher); err != nil { // a test-only hook (plant.go)
		return results.StatusFailed, err
	}
	if h.plant > 0 {
		m.Clock += "; " + setup.PlantNote(h.plant)
	}
	return "", nil
}

// timed runs rank r's phase ph (fn) and records its time in h.samples
// once the warm-up is over.
func (h *hostRun) timed(ph string, r int, fn func() error) error {
	t0 := time.Now()
	err := fn()
	if h.plant > 0 && h.iter >= 0 && r == 0 && ph == h.m.Phases[0] {
		time.Sleep(h.plant)
	}
	if h.iter >= 0 {
		h.samples[ph][r] = append(h.samples[ph][r], float64(time.Since(t0).Nanoseconds())/1e6)
	}
	h.prog.StepAdd(h.work[ph])
	return err
}

// timeSteps runs the paused steps (a dispatcher that rebalances) and the
// timed ones; cfg.Iters becomes the steps done.
func (h *hostRun) timeSteps() (*results.Record, error) {
	cfg, env, l, d, m := h.cfg, h.env, h.l, h.d, &h.m
	stepWork := 0.0
	for _, ph := range m.Phases {
		stepWork += h.work[ph] * float64(cfg.EP)
	}
	rb := d.Capabilities().Rebalance
	h.prog.Stepping(stepWork)
	pausedEnd, end := cfg.Deadlines(rb != nil)
	if rb != nil { // after the warm-up, the paused steps (see measured.paused)
		if err := h.pausedSteps(rb, pausedEnd); setup.IsInterrupted(err) {
			return interruptedRecord(h.rec, err)
		} else if err != nil {
			return failed(h.rec, results.StatusFailed, err)
		}
	}
	done, err := setup.Iterate(cfg.Warmup, cfg.Iters, end, func(i int) error {
		if err := env.Interrupt.BeforeStep("", i, cfg); err != nil {
			return err
		}
		h.iter = i
		h.prog.Set(setup.StepStage(i, cfg))
		l.SetRouting(cfg.Warmup + i + 1)
		if err := l.Iteration(d, h.timed); err != nil {
			return err
		}
		h.prog.StepDone()
		if i < 0 {
			return nil
		}
		if rb != nil {
			m.Rebalance = append(m.Rebalance, rb.Stats())
		}
		m.RecvSteps = append(m.RecvSteps, segmentRows(l.Ranks))
		return nil
	})
	var stopped string // why the timed steps stopped early
	switch {
	case setup.IsInterrupted(err) && done > 0:
		stopped = interruptedSteps(h.rec, err, done, cfg.Iters)
	case setup.IsInterrupted(err):
		return interruptedRecord(h.rec, err)
	case err != nil:
		return failed(h.rec, results.StatusFailed, err)
	}
	h.cfg.Iters, m.Stopped = done, cfg.Stopped(done)
	if stopped != "" {
		m.Stopped = stopped
	}
	return nil, nil
}

// pausedSteps runs the steps with phase 2 paused: the straggler before
// rebalancing (measured.paused).
func (h *hostRun) pausedSteps(rb *dispatchers.Rebalance, deadline time.Time) error {
	cfg, env, m := h.cfg, h.env, &h.m
	h.prog.Set("steps with phase 2 paused (the straggler before rebalancing)")
	m.Paused = m.NewSamples(cfg.EP)
	h.samples = m.Paused
	rb.Pause(true)
	if _, err := setup.Iterate(cfg.Warmup, cfg.Iters, deadline, func(i int) error {
		if err := env.Interrupt.BeforeStep("the paused ", i, cfg); err != nil {
			return err
		}
		h.iter = i
		h.l.SetRouting(cfg.Warmup + i + 1) // the same routing as the timed step i
		if err := h.l.Iteration(h.d, h.timed); err != nil {
			return err
		}
		h.prog.StepDone()
		return nil
	}); err != nil {
		return err
	}
	rb.Pause(false)
	h.samples = m.Samples
	return nil
}

// segmentRows is the rows each rank's experts computed in the last step
// (its last expert phase's, for a rebalancing dispatcher).
func segmentRows(ranks []*dispatchers.Rank) []int {
	rows := make([]int, len(ranks))
	for r, rk := range ranks {
		for _, sg := range rk.Segments {
			rows[r] += sg.Len
		}
	}
	return rows
}

// failed gives rec, without timings, the status and the reason.
func failed(rec *results.Record, status string, err error) (*results.Record, error) {
	rec.Status, rec.Reason = status, err.Error()
	return rec, err
}

// dispatcherError is the outcome of a dispatcher that could not be built:
// unavailable, recorded with the reason, or a bad --dispatcher/--impl.
func dispatcherError(rec *results.Record, cfg setup.Config, err error) (*results.Record, error) {
	if dispatchers.IsUnavailable(err) {
		return failed(rec, results.StatusUnavailable, err)
	}
	return nil, &setup.ConfigError{Flag: "dispatcher", Value: cfg.Dispatcher, Allowed: err.Error()}
}

func dump(env setup.Env, l *layer.Layer, rec *results.Record) error {
	if env.Dump == "" {
		return nil
	}
	return Dump(env.Dump, l, rec)
}

func NewRecord(cfg setup.Config, env setup.Env) *results.Record {
	if cfg.Device == "cuda" { // before the stack records the environment (and before the driver initializes)
		cuda.SetMaxConnections()
	}
	now := time.Now
	if env.Now != nil {
		now = env.Now
	}
	rec := &results.Record{Schema: results.Schema, Time: now().UTC().Format(time.RFC3339),
		Config: cfg.Record(),
		Stack:  setup.Fingerprint(cfg.Device, env.DeviceNote, env.Version),
		Ranks:  results.Ranks{EP: cfg.EP, Devices: make([]int, cfg.EP)},
		SMs:    results.SMs{Configured: cfg.SMs, Measured: "not measured on the host device"},
	}
	if b, ok := dispatchers.SMBudgetOf(cfg.Dispatcher, cfg.Impl); ok {
		rec.SMs.Budget, rec.SMs.HeldNote = b.Resolve(cfg.SMs), layer.HostHeldNote // a device run fits it to its GPUs (fitSMs)
	}
	if cfg.Device == "host" {
		for r := range rec.Ranks.Devices {
			rec.Ranks.Devices[r] = -1
		}
		rec.Ranks.Note = "host ranks are independent objects in one process, run one after another within each phase"
	}
	return rec
}

// buffers are d's buffers on each of ep ranks, where it describes them.
func buffers(c dispatchers.Capabilities, ep int) []results.Buffer {
	if c.Buffers == nil {
		return nil
	}
	var out []results.Buffer
	for r := range ep {
		for i, b := range c.Buffers(r) {
			if r == 0 {
				out = append(out, results.Buffer{Name: b.Name, About: b.About})
			}
			out[i].PerRankBytes = append(out[i].PerRankBytes, b.Bytes)
		}
	}
	return out
}

// expertTimes sums each rank's phases (expert phases) per iteration:
// [rank][iter], ms.
func expertTimes(samples map[string][][]float64, ranks int, phases []string) [][]float64 {
	t := make([][]float64, ranks)
	for _, name := range phases {
		for r, rs := range samples[name] {
			t[r] = kernels.Reslice(t[r], len(rs))
			for i, v := range rs {
				t[r][i] += v
			}
		}
	}
	return t
}

// gemmStraggler is the straggler of the ranks' median times of the expert
// phases (ExpertPhases, or ExpertBackwardPhases), and the absolute
// straggler of each iteration.
func gemmStraggler(samples map[string][][]float64, ranks int, phases []string) (results.Straggler, []float64) {
	t := expertTimes(samples, ranks, phases)
	med := make([]float64, ranks)
	var steps []float64
	for r, ts := range t {
		med[r], _ = stats.Median(ts)
	}
	v := make([]float64, ranks) // one step's expert times
	for i := range t[0] {
		for r := range t {
			v[r] = t[r][i]
		}
		steps = append(steps, summary.Straggler(v).Abs)
	}
	return summary.Straggler(med), steps
}

func fillMeasurements(rec *results.Record, cfg setup.Config, m layer.Measurements) {
	gs, gsSteps := gemmStraggler(m.Samples, cfg.EP, dispatchers.ExpertPhases)
	if len(m.Rebalance) > 0 { // the segments left are the last expert phase's only: count what the plan says
		m.Recv = m.Rebalance[len(m.Rebalance)-1].TokensAfter
		rb := rebalanceRecord(m.Rebalance, m.Phase2SMs)
		rb.GEMMAfter, rb.PerStep.GEMMAfterMS = gs, gsSteps
		if m.Paused != nil {
			rb.GEMMBefore, rb.PerStep.GEMMBeforeMS = gemmStraggler(m.Paused, cfg.EP, dispatchers.ExpertPhases)
		}
		rec.Rebalance = rb
	}
	t := &results.Timing{Unit: "ms", Clock: m.Clock, Warmup: cfg.Warmup, Iters: cfg.Iters, Model: m.Model, Stopped: m.Stopped}
	// each rank's own step time, and the lockstep step (sum of slowest ranks)
	stepPerRank := make([][]float64, cfg.EP)
	lockstep := make([]float64, cfg.Iters)
	for _, name := range m.Phases {
		p := summary.Phase(name, m.Samples[name])
		if hc := m.HostCall[name]; hc != nil {
			s := summary.Phase(name, hc).Stat
			p.HostCall = &s
		}
		for i, v := range p.Samples {
			lockstep[i] += v
		}
		for r, rs := range m.Samples[name] {
			stepPerRank[r] = kernels.Reslice(stepPerRank[r], cfg.Iters)
			for i, v := range rs {
				stepPerRank[r][i] += v
			}
		}
		t.Phases = append(t.Phases, p)
	}
	// the two steps: the slowest rank's own (measured on a device, its
	// phases summed on the host) and the lockstep bound; Step is the
	// device's measured one, and on the host, where ranks run a phase one
	// after another, the lockstep bound
	own := stepPerRank
	if m.Step != nil {
		own = m.Step
	}
	slowest := summary.Phase("step_slowest_rank", own)
	lock := results.Phase{Name: "step_lockstep", Stat: summary.Stat(lockstep), Samples: lockstep}
	t.SlowestRank, t.Lockstep = &slowest, &lock
	t.Step, t.StepIs = slowest, results.StepSlowestRank
	if m.Step == nil {
		t.Step.Stat, t.Step.Samples, t.StepIs = lock.Stat, lock.Samples, results.StepLockstep
	}
	t.Step.Name = "step"
	if m.Forward > 0 { // a training step's passes, each summed as the host's step is
		fwd, bwd := m.SumPhases("fwd", m.Phases[:m.Forward], cfg), m.SumPhases("bwd", m.Phases[m.Forward:], cfg)
		t.Forward, t.Backward = &fwd, &bwd
	}
	if m.Issue != nil {
		s := summary.Stat(m.Issue)
		t.HostIssue = &s
	}
	if m.HostWait != nil {
		s := summary.Stat(m.HostWait)
		t.HostWait = &s
	}
	rec.Timing = t

	tok := make([]float64, cfg.EP)
	var routed float64
	for r, n := range m.Recv {
		tok[r] = float64(n)
		routed += tok[r] * 6 * float64(cfg.Hidden) * float64(cfg.FFN)
	}
	rec.Tokens = &results.Tokens{Received: m.Recv, Straggler: summary.Straggler(tok)}
	perStep := m.RecvSteps
	if len(m.Rebalance) > 0 {
		perStep = nil
		for _, s := range m.Rebalance {
			perStep = append(perStep, s.TokensAfter)
		}
	}
	for _, rows := range perStep {
		rec.Tokens.ReceivedPerStep = append(rec.Tokens.ReceivedPerStep, rows)
		rec.Tokens.StragglerPerStep = append(rec.Tokens.StragglerPerStep, summary.Straggler(summary.Floats(rows)).Abs)
	}

	var ms float64
	for _, v := range gs.PerRank {
		ms += v
	}
	shared := float64(cfg.EP*cfg.Tokens) * 6 * float64(cfg.Hidden) * float64(cfg.FFN*cfg.SharedExperts)
	rec.GEMM = &results.GEMM{FLOPsPerIter: routed + shared,
		Formula:   "6·hidden·ffn per routed token copy (fc1 h→2f: 4hf, fc2 f→h: 2hf) + 6·hidden·ffn·shared_experts per token for the shared expert; all ranks",
		Straggler: gs}
	if ms > 0 {
		rec.GEMM.TFLOPS = routed / (ms / 1e3) / 1e12
	}
	if cfg.IsFP8() && cfg.Device == "host" {
		rec.GEMM.Method, rec.GEMM.FP8Path, rec.GEMM.FP8PathReason = layer.HostFP8GEMMNote()
	}
	if cfg.IsMXFP8() && cfg.Device == "host" {
		rec.GEMM.Method, rec.GEMM.FP8Path, rec.GEMM.FP8PathReason = layer.HostMXGEMMNote()
	}
	if m.Forward > 0 {
		backwardGEMM(rec.GEMM, m, cfg)
		for _, rows := range m.Recv {
			m.Mem.SavedPerRankBytes = append(m.Mem.SavedPerRankBytes,
				kernels.SavedBytes(rows, cfg.Tokens, cfg.Hidden, cfg.FFN, cfg.FFN*cfg.SharedExperts, cfg.RouterConfig(nil).SavedScores()))
		}
		m.Mem.SavedFormula = savedFormula
	}
	rec.Traffic = summary.Traffic(m.Traffic)
	summary.Bandwidth(rec.Traffic, t, cfg.EP, rec.SMs.Budget, results.CopyPayload(rec.Config))
	t.DispatchAsDesigned = summary.AsDesigned(cfg.Dispatcher, m.Phases, m.Samples, rec.Traffic.DispatchAlgorithm, cfg.EP, rec.SMs.Budget) // harness/summary
	if m.Nodes {
		summary.NodeBandwidth(rec.Traffic, t, cfg.EP, m.InterNode, m.IntraNode)
	}
	rec.Memory = m.Mem
	rec.Memory.Buffers = m.Buffers
}

// savedFormula says how Memory.SavedPerRankBytes counts.
const savedFormula = "kernels.SavedBytes: per token copy a rank's experts computed, its input row, fc1 output and activation (bf16 hidden + 3·ffn) " +
	"and probability (fp32); per token, the logits the score function's backward reads (fp32: the k chosen, all experts with pre-softmax) " +
	"and the shared expert's fc1 output and activation (bf16 3·ffn·shared)"

// backwardGEMM adds the backward's expert GEMMs to g: their FLOPs by
// kernels' accounting (dgrad and wgrad, twice the forward), the rate over
// the ranks' median expert-backward times, and their straggler.
func backwardGEMM(g *results.GEMM, m layer.Measurements, cfg setup.Config) {
	h, f, fs := cfg.Hidden, cfg.FFN, cfg.FFN*cfg.SharedExperts
	var routed float64
	for _, n := range m.Recv {
		routed += kernels.ExpertGEMMWork(n, h, f).Backward().FLOPs
	}
	shared := float64(cfg.EP) * kernels.ExpertGEMMWork(cfg.Tokens, h, fs).Backward().FLOPs
	gs, _ := gemmStraggler(m.Samples, cfg.EP, dispatchers.ExpertBackwardPhases)
	g.BackwardFLOPsPerIter, g.BackwardFormula, g.BackwardStraggler = routed+shared, kernels.GEMMFormula, &gs
	var ms float64
	for _, v := range gs.PerRank {
		ms += v
	}
	if ms > 0 {
		g.BackwardTFLOPS = routed / (ms / 1e3) / 1e12
	}
}

// rebalanceRecord summarises the rebalance of the timed steps; sms says
// what the SMs did during phase 2's copies, or why it was not measured.
func rebalanceRecord(steps []dispatchers.RebalanceStats, sms string) *results.Rebalance {
	last := steps[len(steps)-1]
	var ps results.RebalanceSteps
	var exposed, backCopy []float64
	moves := 0
	for _, s := range steps {
		ps.CopyMS = append(ps.CopyMS, 1e3*s.CopySeconds)
		ps.SchedulerMS = append(ps.SchedulerMS, 1e3*s.PlanSeconds)
		ps.SchedulerWaitMS = append(ps.SchedulerWaitMS, 1e3*s.PlanWait)
		x := -1.0
		if !math.IsNaN(s.Exposed) {
			x = 1e3 * s.Exposed
			exposed = append(exposed, x)
		}
		ps.ExposedMS = append(ps.ExposedMS, x)
		moves += s.Moves
		backCopy = append(backCopy, 1e3*s.BackwardCopySeconds)
	}
	r := &results.Rebalance{Policy: last.Policy, Note: last.Note, TokensBefore: last.TokensBefore, TokensAfter: last.TokensAfter,
		TokenBefore: summary.Straggler(summary.Floats(last.TokensBefore)), TokenAfter: summary.Straggler(summary.Floats(last.TokensAfter)),
		ModelledBefore: last.ModelledBefore, ModelledAfter: last.ModelledAfter, Moves: last.Moves, CopyBytes: last.CopyBytes,
		CopyMethod: last.CopyMethod, ExposedNote: last.ExposedNote, PhaseTwoSMs: sms, PerStep: ps,
		BackwardCopyBytes: last.BackwardCopyBytes, WGradBytes: last.WGradBytes}
	if last.BackwardCopyBytes > 0 {
		r.BackwardCopyMS, _ = stats.Median(backCopy)
	}
	if len(exposed) > 0 {
		r.ExposedMS, _ = stats.Median(exposed)
		r.ExposedNote = fmt.Sprintf("median of %d steps; %s", len(exposed), last.ExposedNote)
	}
	switch {
	case last.NoOp != "":
		r.Warnings = append(r.Warnings, last.NoOp)
	case moves == 0:
		r.Warnings = append(r.Warnings, fmt.Sprintf("%s moved nothing in %d timed steps: the run equals its base dispatcher's (%s)", last.Policy, len(steps), last.Note))
	}
	r.CopyMS, _ = stats.Median(ps.CopyMS)
	r.SchedulerMS, _ = stats.Median(ps.SchedulerMS)
	r.SchedulerWaitMS, _ = stats.Median(ps.SchedulerWaitMS)
	return r
}

// HostFLOPs is the expert GEMM work of one step (all ranks), for warnings:
// the forward's, and a training step's backward twice that again.
func HostFLOPs(cfg setup.Config) float64 {
	fwd := 6 * float64(cfg.Hidden) * float64(cfg.FFN) * float64(cfg.EP*cfg.Tokens) * float64(cfg.TopK+cfg.SharedExperts)
	if cfg.ForwardOnly {
		return fwd
	}
	return 3 * fwd
}
