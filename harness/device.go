package harness

import (
	"errors"
	"fmt"
	"time"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/check"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// runDevice is Run on the cuda device (or env.OpenDevice's): the same
// check-then-time loop as the host, with CUDA-event timings. Its steps are
// devRun's methods; each that returns a record or an error ends the run
// with them.
func runDevice(cfg setup.Config, env setup.Env, rec *results.Record) (*results.Record, error) {
	r := &devRun{cfg: cfg, env: env, rec: rec}
	if out, err := r.joinProcesses(); out != nil || err != nil {
		return out, err
	}
	r.cfg = env.Share(r.cfg)
	if r.cfg.IsMXFP8() { // unavailable: the GPUs' own reason, before any dispatcher or memory estimate
		return r.mxfp8Unavailable()
	}
	if err := checkHostMemory(r.cfg); err != nil { // the host twin and the reference (this process's share)
		return r.Fail(results.StatusUnavailable, err)
	}
	r.denv = r.cfg.DispatcherEnv()
	if r.ds != nil { // the ranks of this process's node (NCCL EP's limit is per node)
		r.denv.NodeRanks = r.ds.PerProcess * max(1, r.ds.Rendezvous.L.LocalWorld)
	}
	d, err := dispatchers.NewDevice(r.cfg.Dispatcher, r.cfg.Impl, r.denv)
	if err != nil {
		r.ds.AnnounceFailure(err, r.cfg)
		return dispatcherError(rec, r.cfg, err)
	}
	r.prog = setup.StartProgress(env.Progress, env.ProgressEvery, steps(r.cfg, d.Capabilities()))
	defer r.prog.Finish()
	r.cfg.AttachRunState(r.prog, env.Interrupt)
	r.ds.SetProgress(r.prog)
	devs, err := layer.OpenDevices(env, r.cfg.GPUs, r.cfg.EP, r.ds)
	if err != nil {
		d.Close()
		return r.Fail(results.StatusUnavailable, fmt.Errorf("device %s: %w", r.cfg.Device, err))
	}
	defer layer.CloseDevices(devs)
	if err := layer.FP8Refusal(r.cfg, devs); err != nil {
		d.Close()
		r.ds.AnnounceFailure(err, r.cfg)
		return dispatcherError(rec, r.cfg, err)
	}
	th := device.NewThreads(devs)
	defer th.Close()
	layer.SetHangWatchdog(th, r.cfg, r.ds)
	if r.ds != nil {
		defer r.ds.Close() // after the dispatcher's: a library's state over the communicator (NCCL EP's groups) goes first
	}
	if d, err = r.fitBudget(d, devs); err != nil {
		return dispatcherError(rec, r.cfg, err)
	}
	defer d.Close() // before the threads end: a library's ranks are closed on them
	r.d, r.devs = d, devs
	layer.SetGEMMTuning(devs, true) // until the timed steps
	rec.Ranks.Devices = layer.RankToDevice(r.cfg.EP, len(devs))
	rec.Ranks.Emulated, rec.Ranks.Note = r.cfg.EP > len(devs), layer.RankPlacementNoteVia(r.cfg.EP, devs, "")
	if out, err := r.buildLayer(th); out != nil || err != nil {
		return out, err
	}
	if out, err := r.check(); out != nil || err != nil {
		return out, err
	}
	m := r.newMeasured()
	method, err := r.dl.ChooseGrouped()
	if err != nil {
		return r.Fail(layer.DeviceStatus(err), err)
	}
	if r.cfg.CUDAGraph { // from the warm-up on: plans, buffers and the GEMM choice are made
		gs, err := layer.NewCUDAGraphs(r.dl)
		if err != nil {
			return r.Fail(results.StatusUnavailable, fmt.Errorf("--cuda-graph: %w", err))
		}
		r.dl.Graph = gs
		defer gs.Free()
	}
	if out, err := r.timeSteps(&m); out != nil || err != nil {
		return out, err
	}
	if err := r.collect(&m); err != nil {
		return r.Fail(results.StatusFailed, err)
	}
	rec.Status = results.StatusOK
	fillMeasurements(rec, r.cfg, m)
	rec.Timing.CUDAGraph = "not used (--cuda-graph off)"
	if r.dl.Graph != nil {
		rec.Timing.CUDAGraph = r.dl.Graph.Describe(r.cfg.Warmup + r.cfg.Iters)
	}
	r.describeGEMM(method)
	if r.cfg.Overlapping() && rec.Interrupted == "" { // overlap.go
		if err := layer.MeasureOverlap(r.dl, r.cfg, r.denv, rec); err != nil {
			return r.Fail(layer.DeviceStatus(err), err)
		}
	}
	if env.Dump == "" || rec.Interrupted != "" {
		return rec, nil
	}
	if err := r.dl.Download(); err != nil { // the last timed step
		return rec, fmt.Errorf("--dump: %w", err)
	}
	return rec, dumpDevice(r.dl, env, rec)
}

// devRun is what runDevice's steps share.
type devRun struct {
	cfg  setup.Config
	env  setup.Env
	rec  *results.Record
	ds   *layer.Distributed // nil: a run of one process
	denv dispatchers.Env
	d    dispatchers.DeviceDispatcher
	devs []device.Device
	dl   *layer.DeviceLayer
	prog *setup.Progress
	tm   *layer.Telemetry // from the first timed step
}

// Fail ends the run with status; the other processes stop too, naming
// this one.
func (r *devRun) Fail(status string, err error) (*results.Record, error) {
	r.ds.AnnounceFailure(err, r.cfg)
	return failed(r.rec, status, err)
}

// joinProcesses meets the other processes of a run that spans several,
// with the same settings on every one, before any work.
func (r *devRun) joinProcesses() (*results.Record, error) {
	cfg, env := r.cfg, r.env
	if env.Rendezvous != nil && env.Rendezvous.L.Distributed() {
		settings, err := layer.MeetProcesses(cfg, env) // the same settings on every process, before any work
		if err != nil {
			return nil, err
		}
		if r.ds, err = layer.NewDistributed(cfg, env.Rendezvous); dispatchers.IsUnavailable(err) {
			return dispatcherError(r.rec, cfg, err)
		} else if err != nil {
			return nil, err // a *ConfigError
		}
		r.ds.Settings = settings
	}
	if r.ds != nil && env.Dump != "" { // before anything is written
		return nil, &setup.ConfigError{Flag: "dump", Value: env.Dump, Allowed: fmt.Sprintf("does not apply to a run that spans processes (%s): each process holds only its own ranks' tensors and gradients; dump a run of one process", env.Rendezvous.L.Via)}
	}
	return nil, nil
}

// fitBudget is d, or d made again with the SM budget that fits devs
// beside the SMs held. On an error d is closed and the other processes
// told.
func (r *devRun) fitBudget(d dispatchers.DeviceDispatcher, devs []device.Device) (dispatchers.DeviceDispatcher, error) {
	budget, held, err := layer.FitSMBudget(r.cfg, devs, r.ds)
	if err != nil {
		d.Close()
		r.ds.AnnounceFailure(err, r.cfg)
		return nil, err
	}
	if held == "" {
		return d, nil
	}
	r.rec.SMs.Budget, r.rec.SMs.Held, r.rec.SMs.HeldNote = budget, budget, held
	if budget == r.denv.SMs {
		return d, nil
	}
	d.Close() // the dispatcher runs with the budget that fits
	r.denv.SMs = budget
	if d, err = dispatchers.NewDevice(r.cfg.Dispatcher, r.cfg.Impl, r.denv); err != nil {
		r.ds.AnnounceFailure(err, r.cfg)
		return nil, err
	}
	return d, nil
}

// buildLayer makes the layer on the devices and records what the
// dispatcher says of itself.
func (r *devRun) buildLayer(th *device.Threads) (*results.Record, error) {
	cfg, rec, d := r.cfg, r.rec, r.d
	l, err := layer.MakeLayer(cfg, false)
	if err != nil {
		r.ds.AnnounceFailure(err, cfg)
		return nil, err // only a trace can fail here: a *ConfigError
	}
	r.dl, err = layer.NewDeviceLayer(l, r.devs, th, d, r.ds)
	if dispatchers.IsUnavailable(err) { // the dispatcher's gate on these devices (or another process's)
		r.ds.AnnounceFailure(err, cfg)
		return dispatcherError(rec, cfg, err)
	}
	if err != nil {
		return r.Fail(layer.DeviceStatus(err), err)
	}
	if b := d.Capabilities().LaunchBudgets; b != nil {
		rec.SMs.Preprocess, rec.SMs.Permute = b()
	}
	if lib := d.Capabilities().Library; lib != nil {
		li := lib.Info()
		rec.Library = &results.Library{Design: li.Design, Name: li.Name, Version: li.Version, Path: li.Path, Detail: li.Detail}
		rec.SMs.Note = li.SMs
	}
	if t := d.Capabilities().Transport; t != nil && t() != "" {
		rec.Ranks.Note = layer.RankPlacementNoteVia(cfg.EP, r.devs, t())
	}
	// a run over several processes stops where all agree to (interruptedAt)
	if err := r.dl.InterruptedAt(r.env.Interrupt, setup.WhileBuilding); setup.IsInterrupted(err) {
		return interruptedRecord(rec, err)
	} else if err != nil {
		return r.Fail(results.StatusFailed, err)
	}
	return nil, nil
}

// check runs the layer's check (cfg.Check) and records it; a failed check
// ends the run with the check's step dumped.
func (r *devRun) check() (*results.Record, error) {
	rec := r.rec
	if !r.cfg.Check {
		rec.Correctness = &results.Correctness{Checked: false, Detail: "check disabled by --check off"}
		return nil, nil
	}
	r.prog.Set(setup.Checking)
	c, err := check.CheckDevice(r.dl)
	if err != nil && r.ds != nil { // the others are told (fail), not asked whether to stop
		return r.Fail(layer.DeviceStatus(err), err)
	}
	if ierr := r.dl.InterruptedAt(r.env.Interrupt, setup.WhileChecking); setup.IsInterrupted(ierr) {
		return checkInterrupted(rec, c, err, ierr)
	} else if ierr != nil {
		return r.Fail(results.StatusFailed, ierr)
	}
	if err != nil {
		return r.Fail(layer.DeviceStatus(err), err)
	}
	rec.Correctness = c
	if !c.Passed { // the check's step is what the dump holds
		rec.Status, rec.Reason = results.StatusFailed, "correctness check failed: "+c.Detail
		return rec, errors.Join(errors.New(rec.Reason), dumpDevice(r.dl, r.env, rec))
	}
	return nil, nil
}

// newMeasured is the timed steps' samples, empty, with the clock, the
// timing model and the memory method they are read by.
func (r *devRun) newMeasured() layer.Measurements {
	cfg, dl, d := r.cfg, r.dl, r.d
	excluded := "cuBLASLt workspaces and the CUDA context"
	if cfg.Impl == dispatchers.ImplLibrary {
		excluded = "cuBLASLt workspaces, the CUDA context and the library's own buffers (NCCL's, NCCL EP's)"
	}
	m := layer.Measurements{Samples: map[string][][]float64{}, Step: make([][]float64, cfg.EP),
		Clock: "CUDA events on each rank's stream (" + r.devs[0].Name() + ")",
		Model: "each phase's sample is its slowest rank's event-timed duration; a rank's step runs from a start event every rank waits for (one per GPU, each after GPU 0's) to the rank's last event, the step sample is the slowest rank's. " +
			"Ranks run concurrently, so phases overlap and do not add up to the step. Each GPU's ranks are issued from the GPU's own thread, the GPUs at once, every GPU finishing a phase's calls before any starts the next. Each phase is timed from its own first GPU operation: a dispatcher's host wait before a phase (alltoall's count exchange) is outside every phase and reported as host_wait_ms; the step's time, from the common start, holds it",
		Mem: &results.Memory{Method: "device buffers, accounted: the bytes moebench allocated for the rank (layer and dispatcher buffers, its share of the router and shared-expert weights), excluding " + excluded}}
	if dl.Train {
		m.Forward = dl.Forward
		m.Model += "; fwd and bwd are the sums of their passes' phases (slowest rank each), the step runs from the common start to the backward's last event"
	}
	for _, ph := range dl.Steps() {
		m.Phases = append(m.Phases, ph.Name)
		if g := d.Capabilities().Grouped; g != nil && g(ph.Name) {
			m.Model += fmt.Sprintf(". %s is issued once per GPU by the GPU's last rank's call: each rank's %s time runs from before its GPU's first rank's call to after the last's", ph.Name, ph.Name)
		}
	}
	m.Samples = m.NewSamples(cfg.EP)
	return m
}

// timeSteps runs the paused steps (a dispatcher that rebalances) and the
// timed ones into m; cfg.Iters becomes the steps done.
func (r *devRun) timeSteps(m *layer.Measurements) (*results.Record, error) {
	rb := r.d.Capabilities().Rebalance
	r.prog.Stepping(0) // the phases run on the devices at once: counted by step
	pausedEnd, end := r.cfg.Deadlines(rb != nil)
	if rb != nil { // the paused steps (see measured.paused)
		if err := r.pausedSteps(m, rb, pausedEnd); setup.IsInterrupted(err) {
			return interruptedRecord(r.rec, err)
		} else if err != nil {
			return r.Fail(layer.DeviceStatus(err), err)
		}
	}
	done, err := r.timedSteps(m, rb, end)
	var stopped string // why the timed steps stopped early
	if setup.IsInterrupted(err) && done > 0 {
		stopped, err = interruptedSteps(r.rec, err, done, r.cfg.Iters), nil
	}
	if err != nil {
		r.tm.Finish()
		if setup.IsInterrupted(err) {
			return interruptedRecord(r.rec, err)
		}
		return r.Fail(layer.DeviceStatus(err), err)
	}
	r.cfg.Iters, m.Stopped = done, r.cfg.Stopped(done)
	if stopped != "" {
		m.Stopped = stopped
	}
	return nil, nil
}

// pausedSteps runs the steps with phase 2 paused: the straggler before
// rebalancing (measured.paused).
func (r *devRun) pausedSteps(m *layer.Measurements, rb *dispatchers.Rebalance, deadline time.Time) error {
	cfg, dl := r.cfg, r.dl
	r.prog.Set("steps with phase 2 paused (the straggler before rebalancing)")
	m.Paused = m.NewSamples(cfg.EP)
	steps := make([][]float64, cfg.EP) // not kept
	rb.Pause(true)
	if _, err := setup.Iterate(cfg.Warmup, cfg.Iters, deadline, func(i int) error {
		if err := dl.BeforeStep(r.env.Interrupt, "the paused ", i, cfg); err != nil {
			return err
		}
		if err := dl.SetRouting(cfg.Warmup + i + 1); err != nil { // the same routing as the timed step i
			return err
		}
		if err := dl.Step(); err != nil {
			return err
		}
		rb.Stats() // every synchronized step: its GEMM rate for the scheduler
		r.prog.StepDone()
		if i < 0 {
			return nil
		}
		return dl.Times(m.Paused, steps)
	}); err != nil {
		return err
	}
	rb.Pause(false)
	return nil
}

// timedSteps runs the warm-up and the timed steps into m (rb: nil, or the
// dispatcher's rebalancing), the telemetry from the first timed step on.
func (r *devRun) timedSteps(m *layer.Measurements, rb *dispatchers.Rebalance, deadline time.Time) (int, error) {
	cfg, dl := r.cfg, r.dl
	return setup.Iterate(cfg.Warmup, cfg.Iters, deadline, func(i int) error {
		if err := dl.BeforeStep(r.env.Interrupt, "", i, cfg); err != nil {
			return err
		}
		if i == 0 {
			layer.SetGEMMTuning(r.devs, false)
			var why string
			if r.tm, why = layer.StartTelemetry(layer.GPUBusID(r.devs[0])); r.tm == nil {
				r.rec.SMs.Measured = "not measured: " + why
			}
		}
		r.prog.Set(setup.StepStage(i, cfg))
		err := dl.SetRouting(cfg.Warmup + i + 1)
		if err == nil {
			err = dl.Step()
		}
		if err != nil {
			return err
		}
		r.prog.StepDone()
		var rs dispatchers.RebalanceStats
		if rb != nil { // every synchronized step: its rates for the scheduler
			rs = rb.Stats()
		}
		if i < 0 {
			return nil
		}
		if err := dl.Times(m.Samples, m.Step); err != nil {
			return err
		}
		m.Issue = append(m.Issue, dl.IssueMS)
		dl.HostCalls(m)
		if r.d.Capabilities().HostWait != nil {
			m.HostWait = append(m.HostWait, dl.WaitMS)
		}
		if rb != nil {
			m.Rebalance = append(m.Rebalance, rs)
		}
		var rows []int
		for _, rk := range dl.Ranks {
			rows = append(rows, rk.Rows())
		}
		m.RecvSteps = append(m.RecvSteps, rows)
		return nil
	})
}

// collect adds to m what the steps leave: the traffic, the rows received,
// the memory, every process's ranks (to rank 0's record), the telemetry
// and the copy probe.
func (r *devRun) collect(m *layer.Measurements) error {
	dl, rec, dev := r.dl, r.rec, r.devs[0]
	m.Traffic = r.d.Traffic() // after the steps: it counts the last one
	m.Buffers = buffers(r.d.Capabilities(), r.cfg.EP)
	for rk, x := range dl.Ranks {
		m.Recv = append(m.Recv, x.Rows())
		var b int64
		if dl.Local(rk) {
			b = dl.Footprint(rk)
		}
		m.Mem.PerRankBytes = append(m.Mem.PerRankBytes, b)
	}
	if r.ds != nil { // every process's ranks, for rank 0's record
		mine := dl.OwnContribution(m, rec.Stack)
		var err error
		if mine.Pairs, err = dl.Pairs(); err != nil {
			return err
		}
		parts, err := dl.GatherContributions(mine)
		if err != nil {
			return err
		}
		dl.MergeContributions(m, parts, rec)
	}
	if r.tm != nil {
		rec.Telemetry, rec.SMs.Measured = r.tm.Finish()
		if len(r.devs) > 1 {
			rec.Telemetry.GPU += fmt.Sprintf("; that is rank 0's GPU: the clocks, power and GPM of the other %d GPUs are not sampled", len(r.devs)-1)
		}
	}
	m.Phase2SMs = "not measured: the " + dev.Name() + " device has no copy engines"
	if len(r.devs) > 1 {
		m.Phase2SMs = "not measured: the copy probe covers copies within one GPU, and this run's ranks are on " + fmt.Sprint(len(r.devs)) + " GPUs"
	} else if r.d.Capabilities().Rebalance != nil && dev.Name() == "cuda" {
		var err error
		if m.Phase2SMs, err = layer.ProbeCopies(dev, r.cfg.Seed); err != nil {
			m.Phase2SMs = "not measured: the copy probe failed: " + err.Error()
		}
	}
	return nil
}

// describeGEMM records how the expert GEMMs ran: method (ChooseGrouped's),
// the FP8 path, cuBLASLt's algorithms and the attention stand-in.
func (r *devRun) describeGEMM(method string) {
	rec, cfg := r.rec, r.cfg
	rec.GEMM.Method = method
	if cfg.IsFP8() { // the FP8 GEMMs, or bf16 ones on the rows dequant_fp8_rows wrote (fp8dev.go)
		path, why := r.dl.FP8Path()
		rec.GEMM.Method = layer.ExpertPathFP8 + "; " + method
		if path == kernels.FP8GEMMBlock {
			rec.GEMM.Method = layer.ExpertPathFP8Dev + "; " + method
		}
		if path == kernels.FP8GEMMTensor {
			rec.GEMM.Method = layer.ExpertPathFP8Tensor + "; " + method
		}
		rec.GEMM.FP8Path, rec.GEMM.FP8PathReason = string(path), why
	}
	if g, ok := r.devs[0].(*device.CUDA); ok {
		rec.GEMM.Method += "; " + g.GEMMAlgorithms()
	}
	if r.dl.Attn != nil { // attention.go
		rec.GEMM.Method += "; " + r.dl.Attn.Describe(cfg)
	}
}

// mxfp8Unavailable ends a run at --precision mxfp8 on the cuda device as
// unavailable, in its GPUs' and libraries' terms (layer.MXFP8DeviceReason;
// docs/fp8.md "mxfp8 on the host device").
func (r *devRun) mxfp8Unavailable() (*results.Record, error) {
	devs, err := layer.OpenDevices(r.env, r.cfg.GPUs, r.cfg.EP, r.ds)
	if err != nil {
		return r.Fail(results.StatusUnavailable, fmt.Errorf("device %s: %w", r.cfg.Device, err))
	}
	why := layer.MXFP8DeviceReason(devs)
	layer.CloseDevices(devs)
	err = &dispatchers.UnavailableError{Name: r.cfg.Dispatcher, Impl: r.cfg.Impl, Reason: why}
	r.ds.AnnounceFailure(err, r.cfg)
	return dispatcherError(r.rec, r.cfg, err)
}
