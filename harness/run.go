package harness

import (
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/montanaflynn/stats"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/summary"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/internal/launch"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// Env is what a run needs besides its configuration.
type Env struct {
	Version    string // moebench version for the record
	DeviceNote string // why this device was chosen (recorded and printed)
	// Now stamps the record; nil means time.Now.
	Now func() time.Time
	// Dump, if set, is a directory to write the layer's tensors to (see Dump)
	// once it has run, also when its check failed.
	Dump string
	// OpenDevices opens the devices of a cuda run: n of them, or when n is
	// 0 as many as there are up to most (one per rank). Nil opens GPUs
	// (device.OpenGPUs); tests pass Emus (device.Emu).
	OpenDevices func(n, most int) ([]device.Device, error)
	// Progress, if set, gets a line every ProgressEvery (default
	// DefaultProgressEvery) once a run has taken that long: what it is
	// doing, the steps done and the time left. Nothing of it goes into the
	// record.
	Progress      io.Writer
	ProgressEvery time.Duration
	// Rendezvous, in a run launched over several processes
	// (internal/launch), meets them and watches them; nil or one process:
	// a run of this process alone.
	Rendezvous *launch.Rendezvous
	// Interrupt, if set, stops the run early when it fires (a signal): the
	// record holds what was measured and is marked interrupted. In a run
	// over several processes, every process is given one or none: they
	// stop together, where all agree to (agreeStop).
	Interrupt *Interrupt
}

// steps is how many steps a run of cfg with d takes: warm-up and timed,
// twice for a rebalancing dispatcher (its paused steps first).
func steps(cfg Config, c dispatchers.Capabilities) int {
	n := cfg.Warmup + cfg.Iters
	if c.Rebalance != nil {
		n *= 2
	}
	return n
}

// buildExperts is the progress stage of drawing the experts' weights.
const buildExperts = "building the layer: drawing the experts' weights (experts)"

// checking is the progress stage of the correctness check.
const checking = "checking the output against the float64 reference"

// Run builds the layer, checks it (unless cfg.Check is false), times
// cfg.Iters steps after cfg.Warmup and returns the record. cfg.Device must be
// resolved (host or cuda). On failure or unavailability it returns a record
// without timings, saying why, together with the error; a *ConfigError means
// bad input and comes without a record.
func Run(cfg Config, env Env) (*results.Record, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	why := env.ForwardOnlyReason(cfg)
	cfg.ForwardOnly = cfg.ForwardOnly || why != ""
	forced := cfg.HostExperts != "" && cfg.HostExperts != HostExpertsAuto
	if cfg.Device == "host" {
		cfg.HostExperts = cfg.hostExperts() // decided once, before the record says it
	}
	noDump, err := dumpRefusal(cfg, env, forced)
	if err != nil {
		return nil, err
	}
	rec := newRecord(cfg, env)
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
func dumpRefusal(cfg Config, env Env, forced bool) (noDump, err error) {
	if cfg.Device == "host" && env.Dump != "" && !cfg.ForwardOnly && cfg.HostExperts != HostExpertsHeld {
		why := fmt.Sprintf("a training step's dump writes every expert's weight gradients, which this layer does not hold (--host-experts %s); "+
			"add --forward-only, or use a layer whose experts' weights and weight gradients fit in memory", cfg.HostExperts)
		if forced {
			return nil, &ConfigError{"dump", env.Dump, why}
		}
		noDump = errors.New("--dump: " + why)
	}
	if env.Dump != "" && cfg.overlaps(OverlapA2A) {
		return nil, &ConfigError{"dump", env.Dump, "with --overlap a2a the weight gradients are the sum of two micro-batches' while a dump holds " +
			"micro-batch 0's inputs only, so its backward could not be recomputed from it; dump a run without --overlap a2a"}
	}
	return noDump, nil
}

// hostRun is what runHost's steps share.
type hostRun struct {
	cfg     Config
	env     Env
	rec     *results.Record
	d       dispatchers.Dispatcher
	l       *Layer
	prog    *progress
	m       measured
	samples map[string][][]float64 // where timed records: samples[phase][rank][iter] in milliseconds
	iter    int                    // the step being run (< 0: a warm-up step, not recorded)
	work    map[string]float64     // each phase's share of a step, for the progress line
	plant   time.Duration          // plant.go's test-only delay, or 0
}

// runHost is Run on the host device. Its steps are hostRun's methods;
// each that returns a record or an error ends the run with them.
func runHost(cfg Config, env Env, rec *results.Record, forced bool, noDump error) (*results.Record, error) {
	h := &hostRun{cfg: cfg, env: env, rec: rec, iter: -1}
	fresh := func() (dispatchers.Dispatcher, error) {
		return dispatchers.New(h.cfg.Dispatcher, h.cfg.Impl, h.cfg.dispatcherEnv())
	}
	d, err := fresh()
	if err != nil {
		return dispatcherError(rec, h.cfg, err)
	}
	h.d = d
	h.prog = startProgress(env.Progress, env.ProgressEvery, steps(h.cfg, d.Capabilities()))
	defer h.prog.finish()
	h.cfg.carry(h.prog, env.Interrupt)
	if err := checkHostMemory(h.cfg); err != nil {
		return failed(rec, results.StatusUnavailable, err)
	}
	if noDump != nil {
		return failed(rec, results.StatusUnavailable, noDump)
	}
	note := hostExpertsNote(h.cfg.HostExperts, forced)
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
	m.traffic = d.Traffic() // after the steps: it counts the last one
	m.buffers = buffers(d.Capabilities(), h.cfg.EP)
	m.recv = segmentRows(l.Ranks)
	for r := range l.Ranks {
		m.mem.PerRankBytes = append(m.mem.PerRankBytes, l.Footprint(d, r))
	}

	m.phase2SMs = "not measured on the host device"
	fillMeasurements(rec, h.cfg, *m)
	if h.cfg.overlapping() { // overlap.go: the host runs every phase in turn
		if rec.Overlap, err = hostOverlap(h.cfg, fresh, rec.Memory); err != nil {
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
	if cfg.HostExperts != HostExpertsDrawn {
		h.prog.work(buildExperts, float64(cfg.Experts))
	}
	l, err := NewLayer(cfg)
	if err != nil {
		var ce *ConfigError
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
	if err := h.env.Interrupt.interrupted(whileBuilding); err != nil {
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
	h.prog.set(checking)
	c, err := Check(h.l, h.d, fresh)
	if ierr := h.env.Interrupt.interrupted(whileChecking); ierr != nil {
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
	*m = measured{
		clock: "host wall clock (Go time.Now); not comparable with GPU timings",
		model: "each phase's sample is its slowest rank in that iteration; step = sum of the phase samples (ranks in lockstep, a barrier between phases)",
		mem: &results.Memory{Method: "host buffers, accounted: the rank's host buffers after the run, float32 storage (its share of expert weights, shared/router weights, activations, " +
			"dispatcher buffers; in a training step also what the forward keeps for the backward, the gradients and the experts' fp32 weight gradients); not a measured peak"}}
	if note != "" {
		m.clock += "; " + note
		m.mem.Method += "; " + hostExpertsHeldNote(cfg.HostExperts)
	}
	var err error
	if m.phases, err = h.l.Phases(h.d); err != nil {
		return results.StatusUnavailable, err
	}
	if !cfg.ForwardOnly {
		m.forward = len(h.l.steps(h.d))
		m.model += "; fwd and bwd are the sums of their passes' phases, step = fwd + bwd"
	}
	m.samples = m.newSamples(cfg.EP)
	h.samples = m.samples
	h.work = map[string]float64{}
	for _, ph := range m.phases {
		h.work[ph] = phaseWork(cfg, ph)
	}
	if h.plant, err = plantedDelay(cfg.Dispatcher); err != nil { // a test-only hook (plant.go)
		return results.StatusFailed, err
	}
	if h.plant > 0 {
		m.clock += "; " + plantNote(h.plant)
	}
	return "", nil
}

// timed runs rank r's phase ph (fn) and records its time in h.samples
// once the warm-up is over.
func (h *hostRun) timed(ph string, r int, fn func() error) error {
	t0 := time.Now()
	err := fn()
	if h.plant > 0 && h.iter >= 0 && r == 0 && ph == h.m.phases[0] {
		time.Sleep(h.plant)
	}
	if h.iter >= 0 {
		h.samples[ph][r] = append(h.samples[ph][r], float64(time.Since(t0).Nanoseconds())/1e6)
	}
	h.prog.stepAdd(h.work[ph])
	return err
}

// timeSteps runs the paused steps (a dispatcher that rebalances) and the
// timed ones; cfg.Iters becomes the steps done.
func (h *hostRun) timeSteps() (*results.Record, error) {
	cfg, env, l, d, m := h.cfg, h.env, h.l, h.d, &h.m
	stepWork := 0.0
	for _, ph := range m.phases {
		stepWork += h.work[ph] * float64(cfg.EP)
	}
	rb := d.Capabilities().Rebalance
	h.prog.stepping(stepWork)
	pausedEnd, end := cfg.deadlines(rb != nil)
	if rb != nil { // after the warm-up, the paused steps (see measured.paused)
		if err := h.pausedSteps(rb, pausedEnd); IsInterrupted(err) {
			return interruptedRecord(h.rec, err)
		} else if err != nil {
			return failed(h.rec, results.StatusFailed, err)
		}
	}
	done, err := iterate(cfg.Warmup, cfg.Iters, end, func(i int) error {
		if err := env.Interrupt.beforeStep("", i, cfg); err != nil {
			return err
		}
		h.iter = i
		h.prog.set(stepStage(i, cfg))
		l.SetRouting(cfg.Warmup + i + 1)
		if err := l.Iteration(d, h.timed); err != nil {
			return err
		}
		h.prog.stepDone()
		if i < 0 {
			return nil
		}
		if rb != nil {
			m.rebalance = append(m.rebalance, rb.Stats())
		}
		m.recvSteps = append(m.recvSteps, segmentRows(l.Ranks))
		return nil
	})
	var stopped string // why the timed steps stopped early
	switch {
	case IsInterrupted(err) && done > 0:
		stopped = interruptedSteps(h.rec, err, done, cfg.Iters)
	case IsInterrupted(err):
		return interruptedRecord(h.rec, err)
	case err != nil:
		return failed(h.rec, results.StatusFailed, err)
	}
	h.cfg.Iters, m.stopped = done, cfg.stopped(done)
	if stopped != "" {
		m.stopped = stopped
	}
	return nil, nil
}

// pausedSteps runs the steps with phase 2 paused: the straggler before
// rebalancing (measured.paused).
func (h *hostRun) pausedSteps(rb *dispatchers.Rebalance, deadline time.Time) error {
	cfg, env, m := h.cfg, h.env, &h.m
	h.prog.set("steps with phase 2 paused (the straggler before rebalancing)")
	m.paused = m.newSamples(cfg.EP)
	h.samples = m.paused
	rb.Pause(true)
	if _, err := iterate(cfg.Warmup, cfg.Iters, deadline, func(i int) error {
		if err := env.Interrupt.beforeStep("the paused ", i, cfg); err != nil {
			return err
		}
		h.iter = i
		h.l.SetRouting(cfg.Warmup + i + 1) // the same routing as the timed step i
		if err := h.l.Iteration(h.d, h.timed); err != nil {
			return err
		}
		h.prog.stepDone()
		return nil
	}); err != nil {
		return err
	}
	rb.Pause(false)
	h.samples = m.samples
	return nil
}

// ForwardOnlyReason says why a run of cfg that was not asked to be
// forward-only must be: its dispatcher's implementation on the cuda device
// has no backward in this build (in its own words where it gives them,
// Capabilities.NoBackward); "" when its backward can run (or the
// dispatcher cannot be built, which the run itself reports).
func ForwardOnlyReason(cfg Config) string {
	if cfg.ForwardOnly || cfg.Device == "host" {
		return ""
	}
	d, err := dispatchers.NewDevice(cfg.Dispatcher, cfg.Impl, cfg.dispatcherEnv())
	if err != nil {
		return ""
	}
	return d.Capabilities().NoBackward
}

// ForwardOnlyReason is ForwardOnlyReason(cfg) for a run in env. A run over
// several processes trains as one process does: of the designs that run
// across them, alltoall --impl library and hybridep's native kernels have
// a backward (NCCL EP's modes say why not, as in one process), and each
// process checks its own ranks' gradients (devbackward.go's checkGrads);
// the others are refused across processes (newDist) whatever their pass.
func (env Env) ForwardOnlyReason(cfg Config) string { return ForwardOnlyReason(cfg) }

// stepStage is the progress stage of step i (negative: warm-up).
func stepStage(i int, cfg Config) string {
	if i < 0 {
		return fmt.Sprintf("warm-up step %d of %d", cfg.Warmup+i+1, cfg.Warmup)
	}
	return fmt.Sprintf("timed step %d of %d", i+1, cfg.Iters)
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

// dispatcherEnv is where cfg's dispatcher runs, with its options.
func (c Config) dispatcherEnv() dispatchers.Env {
	return dispatchers.Env{Device: c.Device, Base: c.FeplbBase, Domain: c.Domain, Dynamic: c.FeplbDyn, Policy: c.FeplbPolicy, Hidden: c.Hidden, FFN: c.FFN,
		SMs: c.SMs, PreprocessSMs: c.PreprocessSMs, PermuteSMs: c.PermuteSMs, CommTimeout: c.CommTimeout, LibraryTimeout: c.NCCLEPTimeout, Precision: c.precision()}
}

// dispatcherError is the outcome of a dispatcher that could not be built:
// unavailable, recorded with the reason, or a bad --dispatcher/--impl.
func dispatcherError(rec *results.Record, cfg Config, err error) (*results.Record, error) {
	if dispatchers.IsUnavailable(err) {
		return failed(rec, results.StatusUnavailable, err)
	}
	return nil, &ConfigError{"dispatcher", cfg.Dispatcher, err.Error()}
}

func dump(env Env, l *Layer, rec *results.Record) error {
	if env.Dump == "" {
		return nil
	}
	return Dump(env.Dump, l, rec)
}

func newRecord(cfg Config, env Env) *results.Record {
	if cfg.Device == "cuda" { // before the stack records the environment (and before the driver initializes)
		cuda.SetMaxConnections()
	}
	now := time.Now
	if env.Now != nil {
		now = env.Now
	}
	rec := &results.Record{Schema: results.Schema, Time: now().UTC().Format(time.RFC3339),
		Config: cfg.Record(),
		Stack:  Fingerprint(cfg.Device, env.DeviceNote, env.Version),
		Ranks:  results.Ranks{EP: cfg.EP, Devices: make([]int, cfg.EP)},
		SMs:    results.SMs{Configured: cfg.SMs, Measured: "not measured on the host device"},
	}
	if b, ok := dispatchers.SMBudgetOf(cfg.Dispatcher, cfg.Impl); ok {
		rec.SMs.Budget, rec.SMs.HeldNote = b.Resolve(cfg.SMs), HostHeldNote // a device run fits it to its GPUs (fitSMs)
	}
	if cfg.Device == "host" {
		for r := range rec.Ranks.Devices {
			rec.Ranks.Devices[r] = -1
		}
		rec.Ranks.Note = "host ranks are independent objects in one process, run one after another within each phase"
	}
	return rec
}

// measured is what a run measured, for its record.
type measured struct {
	phases  []string
	samples map[string][][]float64 // [phase][rank][iter], ms
	step    [][]float64            // [rank][iter] each rank's step, ms; nil: the sum of its phases
	recv    []int                  // rows each rank's experts computed, the last step
	// each timed step's recv (a rebalancing dispatcher's come from its stats)
	recvSteps [][]int
	traffic   dispatchers.Traffic
	// a run over several processes: the last step's off-rank bytes to
	// other nodes and within the node (distributed.go's nodeBytes)
	nodes                bool
	interNode, intraNode int64
	mem                  *results.Memory
	clock                string // what measured the times
	model                string // how phases make a step
	// a rebalancing dispatcher's timed steps (nil for other dispatchers); the samples
	// of as many steps, run before them (after their own warm-up) with its
	// phase 2 paused, for the GEMM straggler before rebalancing; and what
	// the SMs did during its copies
	rebalance []dispatchers.RebalanceStats
	paused    map[string][][]float64
	phase2SMs string
	// phases[:forward] are the forward's, the rest the backward's; 0: all
	// are the forward's (the iterations timed the forward only)
	forward  int
	issue    []float64              // device runs: each timed step's host issue time, ms
	hostWait []float64              // device runs: each timed step's host wait before phases (alltoall's counts), ms
	hostCall map[string][][]float64 // a library implementation's: [phase][rank][iter] its calls' wall time, ms
	buffers  []results.Buffer
	stopped  string // why fewer iterations ran than asked for (--max-seconds)
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

// newSamples gives each phase an empty [rank][iter] sample.
func (m *measured) newSamples(ranks int) map[string][][]float64 {
	s := map[string][][]float64{}
	for _, ph := range m.phases {
		s[ph] = make([][]float64, ranks)
	}
	return s
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

func fillMeasurements(rec *results.Record, cfg Config, m measured) {
	gs, gsSteps := gemmStraggler(m.samples, cfg.EP, dispatchers.ExpertPhases)
	if len(m.rebalance) > 0 { // the segments left are the last expert phase's only: count what the plan says
		m.recv = m.rebalance[len(m.rebalance)-1].TokensAfter
		rb := rebalanceRecord(m.rebalance, m.phase2SMs)
		rb.GEMMAfter, rb.PerStep.GEMMAfterMS = gs, gsSteps
		if m.paused != nil {
			rb.GEMMBefore, rb.PerStep.GEMMBeforeMS = gemmStraggler(m.paused, cfg.EP, dispatchers.ExpertPhases)
		}
		rec.Rebalance = rb
	}
	t := &results.Timing{Unit: "ms", Clock: m.clock, Warmup: cfg.Warmup, Iters: cfg.Iters, Model: m.model, Stopped: m.stopped}
	// each rank's own step time, and the lockstep step (sum of slowest ranks)
	stepPerRank := make([][]float64, cfg.EP)
	lockstep := make([]float64, cfg.Iters)
	for _, name := range m.phases {
		p := summary.Phase(name, m.samples[name])
		if hc := m.hostCall[name]; hc != nil {
			s := summary.Phase(name, hc).Stat
			p.HostCall = &s
		}
		for i, v := range p.Samples {
			lockstep[i] += v
		}
		for r, rs := range m.samples[name] {
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
	if m.step != nil {
		own = m.step
	}
	slowest := summary.Phase("step_slowest_rank", own)
	lock := results.Phase{Name: "step_lockstep", Stat: summary.Stat(lockstep), Samples: lockstep}
	t.SlowestRank, t.Lockstep = &slowest, &lock
	t.Step, t.StepIs = slowest, results.StepSlowestRank
	if m.step == nil {
		t.Step.Stat, t.Step.Samples, t.StepIs = lock.Stat, lock.Samples, results.StepLockstep
	}
	t.Step.Name = "step"
	if m.forward > 0 { // a training step's passes, each summed as the host's step is
		fwd, bwd := m.sumPhases("fwd", m.phases[:m.forward], cfg), m.sumPhases("bwd", m.phases[m.forward:], cfg)
		t.Forward, t.Backward = &fwd, &bwd
	}
	if m.issue != nil {
		s := summary.Stat(m.issue)
		t.HostIssue = &s
	}
	if m.hostWait != nil {
		s := summary.Stat(m.hostWait)
		t.HostWait = &s
	}
	rec.Timing = t

	tok := make([]float64, cfg.EP)
	var routed float64
	for r, n := range m.recv {
		tok[r] = float64(n)
		routed += tok[r] * 6 * float64(cfg.Hidden) * float64(cfg.FFN)
	}
	rec.Tokens = &results.Tokens{Received: m.recv, Straggler: summary.Straggler(tok)}
	perStep := m.recvSteps
	if len(m.rebalance) > 0 {
		perStep = nil
		for _, s := range m.rebalance {
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
	if cfg.isFP8() && cfg.Device == "host" {
		rec.GEMM.Method, rec.GEMM.FP8Path, rec.GEMM.FP8PathReason = hostFP8Record()
	}
	if m.forward > 0 {
		backwardGEMM(rec.GEMM, m, cfg)
		for _, rows := range m.recv {
			m.mem.SavedPerRankBytes = append(m.mem.SavedPerRankBytes,
				kernels.SavedBytes(rows, cfg.Tokens, cfg.Hidden, cfg.FFN, cfg.FFN*cfg.SharedExperts, cfg.RouterConfig(nil).SavedScores()))
		}
		m.mem.SavedFormula = savedFormula
	}
	rec.Traffic = summary.Traffic(m.traffic)
	summary.Bandwidth(rec.Traffic, t, cfg.EP, rec.SMs.Budget, results.CopyPayload(rec.Config))
	t.DispatchAsDesigned = summary.AsDesigned(cfg.Dispatcher, m.phases, m.samples, rec.Traffic.DispatchAlgorithm, cfg.EP, rec.SMs.Budget) // harness/summary
	if m.nodes {
		summary.NodeBandwidth(rec.Traffic, t, cfg.EP, m.interNode, m.intraNode)
	}
	rec.Memory = m.mem
	rec.Memory.Buffers = m.buffers
}

// savedFormula says how Memory.SavedPerRankBytes counts.
const savedFormula = "kernels.SavedBytes: per token copy a rank's experts computed, its input row, fc1 output and activation (bf16 hidden + 3·ffn) " +
	"and probability (fp32); per token, the logits the score function's backward reads (fp32: the k chosen, all experts with pre-softmax) " +
	"and the shared expert's fc1 output and activation (bf16 3·ffn·shared)"

// backwardGEMM adds the backward's expert GEMMs to g: their FLOPs by
// kernels' accounting (dgrad and wgrad, twice the forward), the rate over
// the ranks' median expert-backward times, and their straggler.
func backwardGEMM(g *results.GEMM, m measured, cfg Config) {
	h, f, fs := cfg.Hidden, cfg.FFN, cfg.FFN*cfg.SharedExperts
	var routed float64
	for _, n := range m.recv {
		routed += kernels.ExpertGEMMWork(n, h, f).Backward().FLOPs
	}
	shared := float64(cfg.EP) * kernels.ExpertGEMMWork(cfg.Tokens, h, fs).Backward().FLOPs
	gs, _ := gemmStraggler(m.samples, cfg.EP, dispatchers.ExpertBackwardPhases)
	g.BackwardFLOPsPerIter, g.BackwardFormula, g.BackwardStraggler = routed+shared, kernels.GEMMFormula, &gs
	var ms float64
	for _, v := range gs.PerRank {
		ms += v
	}
	if ms > 0 {
		g.BackwardTFLOPS = routed / (ms / 1e3) / 1e12
	}
}

// sumPhases is the phases' sum as a phase named name: each rank's own sum
// per iteration, and the lockstep sum (of each phase's slowest rank) as
// its samples.
func (m *measured) sumPhases(name string, phases []string, cfg Config) results.Phase {
	perRank := make([][]float64, cfg.EP)
	lockstep := make([]float64, cfg.Iters)
	for _, ph := range phases {
		for i, v := range summary.Phase(ph, m.samples[ph]).Samples {
			lockstep[i] += v
		}
		for r, rs := range m.samples[ph] {
			perRank[r] = kernels.Reslice(perRank[r], cfg.Iters)
			for i, v := range rs {
				perRank[r][i] += v
			}
		}
	}
	p := summary.Phase(name, perRank)
	p.Samples, p.Stat = lockstep, summary.Stat(lockstep)
	return p
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
func HostFLOPs(cfg Config) float64 {
	fwd := 6 * float64(cfg.Hidden) * float64(cfg.FFN) * float64(cfg.EP*cfg.Tokens) * float64(cfg.TopK+cfg.SharedExperts)
	if cfg.ForwardOnly {
		return fwd
	}
	return 3 * fwd
}
