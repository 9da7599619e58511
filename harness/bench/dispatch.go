package bench

import (
	"errors"
	"fmt"
	"time"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/roundtrip"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/harness/summary"
	"github.com/moebench/moebench/kernels/comm"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// DispatchSchema names the JSON of 'moebench bench dispatch'.
const DispatchSchema = "moebench.bench-dispatch/v1"

// DispatchBench is dispatch and combine alone, as DeepEP's test_intranode
// measures them, for each dispatcher and SM budget: the round trip's ranks
// (the layer's routing; experts that multiply each row by its probability)
// timed phase by phase, each point checked by the exact round trip.
type DispatchBench struct {
	Schema  string          `json:"schema"`
	Time    string          `json:"time"`
	Config  results.Config  `json:"config"` // the workload (dispatcher and SMs: each point's)
	Stack   results.Stack   `json:"stack"`
	Clock   string          `json:"clock"`
	Bytes   string          `json:"bytes_note"`
	Check   string          `json:"check_note"`
	Points  []DispatchPoint `json:"points"`
	Routing string          `json:"routing"`
	Ranks   string          `json:"ranks,omitempty"` // cuda: where the ranks are
}

// DispatchPoint is one dispatcher at one budget.
type DispatchPoint struct {
	Dispatcher string `json:"dispatcher"`
	Impl       string `json:"impl"`
	Precision  string `json:"precision,omitempty"` // the dispatch's (--precision); absent: bf16
	SMs        int    `json:"sms"`                 // as asked; 0 for dispatchers that are not SM-driven
	Budget     int    `json:"budget,omitempty"`    // the blocks it ran with
	// Held: the SMs each rank held on a device (one block per SM), and how
	// the ranks share a GPU's SMs (see results.SMs)
	Held      int    `json:"sms_held,omitempty"`
	HeldNote  string `json:"sms_held_note,omitempty"`
	Status    string `json:"status"`
	Reason    string `json:"reason,omitempty"`
	RoundTrip string `json:"round_trip,omitempty"` // "exact" in every timed iteration, or the first difference
	// SMUse is GPM's SM utilisation over the point's timed iterations
	// (cuda), or why it was not measured
	SMUse string `json:"sm_use,omitempty"`
	// p50 of each phase (the slowest rank per iteration), ms
	Phases  []results.Phase  `json:"phases,omitempty"`
	Traffic *results.Traffic `json:"traffic,omitempty"` // bytes and GB/s (per SM)
	// BufferBytes: the dispatcher's own buffers, every rank's, after the
	// timed iterations (its Footprint; at fp8 those its rows need)
	BufferBytes int64 `json:"buffer_bytes,omitempty"`

	// DispatchAsDesigned: the dispatch as the design's test times it
	// (its parts are phases above); Traffic's dispatch GB/s are its rate
	DispatchAsDesigned *results.DesignPhase `json:"dispatch_as_designed,omitempty"`

	// Predicted: the ceiling the machine code of the kernels the cuda
	// device runs predicts (SM-driven native dispatchers), on any device
	Predicted *Prediction `json:"predicted_ceiling,omitempty"`
}

// Prediction is a dispatcher's ceiling in GB/s per SM predicted from the
// machine code (kernels/comm/inflight.json, Little's law: bytes in flight per
// SM ÷ load latency): not a measurement.
type Prediction struct {
	DispatchGBpsPerSM float64 `json:"dispatch_gbps_per_sm"`
	CombineGBpsPerSM  float64 `json:"combine_gbps_per_sm"`
	Kernels           string  `json:"kernels"` // the kernels and their path
	Source            string  `json:"source"`  // the cubins the table was read from
}

// predicted returns the prediction for a dispatcher and implementation
// at a precision, or nil: only moebench's own kernels of deepep and
// hybridep are in the table. At fp8 the dispatch kernel's row is its fp8
// build's (packed rows; the combine stays bf16); a precision the table
// has no build for gets none.
func predicted(t *comm.InflightTable, dispatcher, impl, precision string) *Prediction {
	d, c, path, ok := comm.DispatcherKernels(dispatcher)
	if !ok || impl != "native" || t == nil {
		return nil
	}
	dpath := path
	switch precision {
	case setup.PrecisionBF16:
	case setup.PrecisionFP8:
		dpath = path + " fp8"
	default:
		return nil
	}
	kd, ok1 := t.Kernel(d, dpath)
	kc, ok2 := t.Kernel(c, path)
	if !ok1 || !ok2 {
		return nil
	}
	return &Prediction{DispatchGBpsPerSM: kd.CeilingGBpsPerSM, CombineGBpsPerSM: kc.CeilingGBpsPerSM,
		Kernels: fmt.Sprintf("%s (%s path), %s (%s path)", d, dpath, c, path), Source: t.Source}
}

// Dispatch runs the dispatch benchmark of cfg's workload for each
// dispatcher in names at each budget in sms (a dispatcher that is not
// SM-driven runs once), on the host device or the cuda device (env's
// devices, cfg.GPUs of them; see devicePoint). A point that is
// unavailable or fails is recorded as such and the others go on; the
// error is the first such point's.
func Dispatch(cfg setup.Config, names []string, sms []int, env setup.Env) (*DispatchBench, error) {
	return DispatchAt(cfg, names, sms, []string{cfg.ResolvedPrecision()}, env)
}

// DispatchAt is Dispatch with each point run at each precision
// in precisions, side by side (bf16 and fp8 rows of one dispatcher and
// budget next to each other). At fp8 the round trip's ranks send their
// rows quantized (roundtrip.Trip.ToFP8).
func DispatchAt(cfg setup.Config, names []string, sms []int, precisions []string, env setup.Env) (*DispatchBench, error) {
	for _, p := range precisions {
		c := cfg
		c.Precision = p
		if err := c.Validate(); err != nil {
			return nil, err
		}
	}
	if cfg.Device != "host" {
		return benchDispatchDevice(cfg, names, sms, precisions, env)
	}
	if avail, ok := setup.MemAvailable(); ok && benchBytes(cfg) > 0.8*avail {
		return nil, fmt.Errorf("bench dispatch: about %.1f GiB of host memory needed, %.1f GiB available; use a smaller --tokens, --hidden or --ep",
			benchBytes(cfg)/(1<<30), avail/(1<<30))
	}
	l, b, err := benchSetup(cfg, env)
	if err != nil {
		return nil, err
	}
	b.Clock = "host wall clock (Go time.Now), each phase's slowest rank per iteration: host times are not GPU performance"
	b.Check = "every iteration: dispatch then combine, with experts that multiply each row by its probability (powers of two summing to 1), gives each rank's input back exactly"
	return b, b.points(cfg, names, sms, precisions, func(c setup.Config, p DispatchPoint) (DispatchPoint, error) { return benchPoint(c, l, p) })
}

// benchDispatchDevice is Dispatch on the cuda device.
func benchDispatchDevice(cfg setup.Config, names []string, sms []int, precisions []string, env setup.Env) (*DispatchBench, error) {
	devs, err := layer.OpenDevices(env, cfg.GPUs, cfg.EP, nil)
	if err != nil {
		return nil, fmt.Errorf("bench dispatch: device %s: %w", cfg.Device, err)
	}
	defer layer.CloseDevices(devs)
	l, b, err := benchSetup(cfg, env)
	if err != nil {
		return nil, err
	}
	b.Clock = "CUDA events on each rank's stream (" + devs[0].Name() + "), as the layer times its phases; each phase's slowest rank per iteration"
	b.Check = "every iteration, outputs poisoned first: dispatch then combine, with experts that copy their rows (at fp8: dequantize the packed rows), gives each rank k × its (dequantized) input exactly (inputs coarsened so that every partial sum is exact in bf16)"
	b.Ranks = layer.RankPlacementNote(cfg.EP, devs)
	return b, b.points(cfg, names, sms, precisions, func(c setup.Config, p DispatchPoint) (DispatchPoint, error) { return devicePoint(c, l, devs, p) })
}

// benchSetup makes the benchmark's layer (its routing drawn on the host)
// and the result without points.
func benchSetup(cfg setup.Config, env setup.Env) (*layer.Layer, *DispatchBench, error) {
	l, err := layer.NewRoutedLayer(cfg)
	if err != nil {
		return nil, nil, err
	}
	rec := harness.NewRecord(cfg, env)
	b := &DispatchBench{Schema: DispatchSchema, Time: rec.Time, Config: rec.Config, Stack: rec.Stack,
		Bytes: "each design's own convention (DeepEP's test_intranode and HybridEP's test_hybrid_ep: tokens received × hidden × 2 B, a rank's tokens to itself included; alltoall's rows are copies; " +
			"an fp8 dispatch times their fp8 factor (1 + 4/128)/2: hidden × 1 B e4m3 + hidden/128 × 4 B scales a token, an mxfp8 one hidden × 1 B e4m3 + hidden/32 × 1 B E8M0 scales, the same bytes; combine bf16); GB/s = a rank's share / the phase's p50 (a design's dispatch: as its test times it, the parts summed)",
		Routing: cfg.Routing.String()}
	b.Config.Dispatcher, b.Config.SMs = "", 0
	return l, b, nil
}

// points runs point for each dispatcher in names at each budget in sms
// (once for a dispatcher that is not SM-driven) and each precision in
// precisions (none: cfg's), each as configured and validated, and returns
// the first point's error.
func (b *DispatchBench) points(cfg setup.Config, names []string, sms []int, precisions []string, point func(setup.Config, DispatchPoint) (DispatchPoint, error)) error {
	var first error
	table, err := comm.Inflight() // the embedded table, read once (no table: no predictions)
	if err != nil {
		table = nil
	}
	for _, name := range names {
		budgets := sms
		if _, smDriven := dispatchers.SMBudgetOf(name, cfg.Impl); !smDriven {
			budgets = []int{0}
		}
		precs := precisions
		if len(precs) == 0 {
			precs = []string{cfg.ResolvedPrecision()}
		}
		for _, n := range budgets {
			for _, prec := range precs {
				c := cfg
				c.Dispatcher, c.SMs, c.Precision = name, n, prec
				b.Points = append(b.Points, b.point(c, predicted(table, name, cfg.Impl, c.ResolvedPrecision()), point, &first))
			}
		}
	}
	return first
}

// point is one point of points: c's dispatcher at its budget and
// precision; the first error goes to first.
func (b *DispatchBench) point(c setup.Config, pred *Prediction, point func(setup.Config, DispatchPoint) (DispatchPoint, error), first *error) DispatchPoint {
	p := DispatchPoint{Dispatcher: c.Dispatcher, Impl: c.Impl, SMs: c.SMs, Status: results.StatusFailed, Predicted: pred}
	if c.ResolvedPrecision() != setup.PrecisionBF16 {
		p.Precision = c.ResolvedPrecision()
	}
	var err error
	if bg, ok := dispatchers.SMBudgetOf(c.Dispatcher, c.Impl); ok {
		if err = bg.Check(c.SMs); err != nil {
			err = &setup.ConfigError{Flag: "sms", Value: c.SMs, Allowed: c.Dispatcher + ": " + err.Error()}
		}
		p.Budget = bg.Resolve(c.SMs) // a device point fits it to its GPUs (fitSMs)
		if c.Device == "host" {
			p.HeldNote = layer.HostHeldNote
		}
	}
	if err == nil {
		p, err = point(c, p)
	}
	if err != nil && *first == nil {
		*first = err
	}
	return p
}

// asDesigned sets p's dispatch as its design's test times it, from the
// steps' samples, and makes the traffic's dispatch GB/s (and per SM) its
// rate, as the designs' tests report theirs.
func (p *DispatchPoint) asDesigned(c setup.Config, steps []dispatchers.Step, samples map[string][][]float64) {
	var names []string
	for _, st := range steps {
		names = append(names, st.Name)
	}
	algo := int64(0)
	if p.Traffic != nil {
		algo = p.Traffic.DispatchAlgorithm
	}
	if p.DispatchAsDesigned = summary.AsDesigned(c.Dispatcher, names, samples, algo, c.EP, p.Budget); p.DispatchAsDesigned != nil && algo > 0 {
		p.Traffic.DispatchGBps, p.Traffic.DispatchGBpsPerSM = p.DispatchAsDesigned.GBps, p.DispatchAsDesigned.GBpsPerSM
	}
}

// benchBytes estimates the host memory of the benchmark: every rank's
// inputs and the copies the dispatchers keep (up to top-k rows per token in
// four buffers).
func benchBytes(cfg setup.Config) float64 {
	return float64(cfg.EP) * float64(cfg.Tokens) * float64(cfg.Hidden) * 4 * float64(3+4*cfg.TopK)
}

// benchPoint times one dispatcher at one budget (p) on l's routing.
func benchPoint(c setup.Config, l *layer.Layer, p DispatchPoint) (DispatchPoint, error) {
	fail := func(err error) (DispatchPoint, error) {
		if dispatchers.IsUnavailable(err) {
			p.Status = results.StatusUnavailable
		}
		p.Reason = err.Error()
		return p, err
	}
	d, err := dispatchers.New(c.Dispatcher, c.Impl, c.DispatcherEnv())
	if err != nil {
		return fail(err)
	}
	rt := roundtrip.New(l.Shape, l.X, l.Ranks)
	if err := rt.At(c.ResolvedPrecision()); err != nil { // quantized rows at fp8 and mxfp8, never bf16 rows under their label
		return fail(err)
	}
	if err := d.Bind(l.Shape, rt.Ranks); err != nil {
		return fail(err)
	}
	steps := d.Forward(rt.Identity)
	samples := map[string][][]float64{}
	for _, st := range steps {
		samples[st.Name] = make([][]float64, c.EP)
	}
	p.RoundTrip = "exact"
	for i := -c.Warmup; i < c.Iters; i++ {
		for _, rk := range rt.Ranks {
			roundtrip.Poison(rk.Y)
		}
		for _, st := range steps {
			for r := range rt.Ranks {
				t0 := time.Now()
				if err := st.Run(r); err != nil {
					return fail(fmt.Errorf("%s on rank %d: %w", st.Name, r, err))
				}
				if i >= 0 {
					samples[st.Name][r] = append(samples[st.Name][r], float64(time.Since(t0).Nanoseconds())/1e6)
				}
			}
		}
		if v := rt.Verdict(); v != "exact" {
			p.RoundTrip = v
			return fail(errors.New("round trip: " + v))
		}
	}
	t := &results.Timing{}
	for _, st := range steps {
		ph := summary.Phase(st.Name, samples[st.Name])
		ph.Samples = nil
		t.Phases = append(t.Phases, ph)
	}
	p.Traffic = summary.Traffic(d.Traffic())
	for r := range c.EP {
		p.BufferBytes += d.Footprint(r)
	}
	summary.Bandwidth(p.Traffic, t, c.EP, p.Budget, results.CopyPayload(c.Record()))
	p.asDesigned(c, steps, samples)
	p.Phases, p.Status = t.Phases, results.StatusOK
	return p, nil
}

// devicePoint times one dispatcher at one budget (p) on devs with l's
// routing (layer.TimeRoundTrip) and makes the point of it.
func devicePoint(c setup.Config, l *layer.Layer, devs []device.Device, p DispatchPoint) (DispatchPoint, error) {
	t, err := layer.TimeRoundTrip(c, l, devs)
	if t.HeldNote != "" { // the budget that fits the GPUs, each block holding an SM
		c.SMs, p.Budget, p.Held, p.HeldNote = t.Budget, t.Budget, t.Budget, t.HeldNote
	}
	p.SMUse, p.RoundTrip = t.SMUse, t.Mismatch
	if err != nil {
		if dispatchers.IsUnavailable(err) {
			p.Status = results.StatusUnavailable
		}
		p.Reason = err.Error()
		return p, err
	}
	tm := &results.Timing{}
	for _, st := range t.Steps {
		ph := summary.Phase(st.Name, t.Samples[st.Name])
		ph.Samples = nil
		tm.Phases = append(tm.Phases, ph)
	}
	p.Traffic, p.BufferBytes = summary.Traffic(t.Traffic), t.BufferBytes
	summary.Bandwidth(p.Traffic, tm, c.EP, p.Budget, results.CopyPayload(c.Record()))
	p.asDesigned(c, t.Steps, t.Samples)
	p.Phases, p.Status, p.RoundTrip = tm.Phases, results.StatusOK, "exact"
	return p, nil
}
