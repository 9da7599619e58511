package harness

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/summary"
	"github.com/moebench/moebench/results"
)

// measureOverlap times cfg's overlap on the device layer dl after its own
// timed steps (runDevice): each iteration runs the step with its phases
// one after another, then the same step overlapped, both on the
// iteration's routing, and reads their events (overlap.times). The first
// timed pair's outputs and gradients are compared bit for bit. A design
// that cannot overlap is recorded with the reason, not failed.
func measureOverlap(dl *deviceLayer, cfg Config, denv dispatchers.Env, rec *results.Record) error {
	o := &results.Overlap{Forms: strings.Join(cfg.Overlap, ","), DelayWgrad: cfg.DelayWgrad, MicroBatches: 1}
	rec.Overlap = o
	a2a := cfg.overlaps(OverlapA2A)
	if a2a {
		o.MicroBatches = 2
	}
	cannot := func(why string) error {
		o.Note = "not measured: " + dl.d.Name() + " cannot overlap here: " + why
		return nil
	}
	switch {
	case dl.dist != nil:
		return cannot("a run over several processes (the second micro-batch's layer is built in one process only)")
	case (a2a || cfg.DelayWgrad) && !dl.train:
		why := "its device implementation has no backward in this build"
		if nb := dl.d.Capabilities().NoBackward; nb != "" {
			why = nb
		}
		return cannot("a2a and --delay-wgrad overlap a training step's backward, and " + why)
	}
	var l1 *Layer
	var d1 dispatchers.DeviceDispatcher
	if a2a {
		var err error
		if l1, err = microBatch(cfg, 1); err != nil {
			return err
		}
		if d1, err = dispatchers.NewDevice(cfg.Dispatcher, cfg.Impl, denv); err != nil {
			return cannot("a second instance for micro-batch 1: " + err.Error())
		}
		defer d1.Close()
	}
	ov, err := newOverlap(dl, cfg.overlaps(OverlapShared), a2a, cfg.DelayWgrad, l1, d1)
	if err != nil {
		if dispatchers.IsUnavailable(err) {
			return cannot(err.Error())
		}
		return err
	}
	defer func() { dl.ov = nil }()
	ov.plant = overlapPlant
	if dl.graph != nil { // --cuda-graph: runDevice's newGraphs refused the designs that cannot be captured
		if ov.graph, err = newOvGraphs(ov); err != nil {
			return err
		}
		defer ov.graph.free()
	}
	cfg.progressLine().set("overlap: the sequential and the overlapped step, in turn")
	var seq, over, comm, exposed, seqExposed []float64
	slowest := func(v []float64) float64 { return slices.Max(v) }
	routing := func(step int) error {
		for _, l := range ov.mb {
			if l != nil {
				if err := l.setRouting(step); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if _, err := iterate(cfg.Warmup, cfg.Iters, time.Time{}, func(i int) error {
		if err := routing(cfg.Warmup + i + 1); err != nil {
			return err
		}
		if err := ov.step(false); err != nil {
			return fmt.Errorf("overlap: the sequential step: %w", err)
		}
		var want ovSnapshot
		if i == 0 {
			if want, err = ov.snapshot(); err != nil {
				return err
			}
		}
		st, err := ov.times(false)
		if err != nil {
			return err
		}
		if i >= 0 {
			seq, seqExposed = append(seq, slowest(st.step)), append(seqExposed, slowest(st.exposed))
		}
		if i == 0 && ov.graph != nil { // the eager overlapped step too: the graphs' reference
			if err := ov.poison(); err != nil {
				return err
			}
			ov.eager = true
			err := ov.step(true)
			ov.eager = false
			if err != nil {
				return fmt.Errorf("overlap: the overlapped step, as plain launches: %w", err)
			}
			got, err := ov.snapshot()
			if err != nil {
				return err
			}
			if d := want.diff(got); d != "" {
				return fmt.Errorf("overlap: the overlapped step's output or gradients (plain launches) differ from the sequential step's: %s", d)
			}
		}
		var before ovGraphs
		if ov.graph != nil {
			before = *ov.graph
		}
		if i == 0 { // what the step writes holds no earlier step's values
			if err := ov.poison(); err != nil {
				return err
			}
		}
		if err := ov.step(true); err != nil {
			return fmt.Errorf("overlap: the overlapped step: %w", err)
		}
		if i == 0 && ov.graph != nil {
			ov.graph.compared = ov.graph.compare(before)
		}
		if i == 0 {
			got, err := ov.snapshot()
			if err != nil {
				return err
			}
			if d := want.diff(got); d != "" {
				how := ""
				if ov.graph != nil {
					how = " (replayed from CUDA graphs; the same step as plain launches equals it)"
				}
				return fmt.Errorf("overlap: the overlapped step's output or gradients%s differ from the sequential step's: %s", how, d)
			}
			o.Equal = true
		}
		if st, err = ov.times(true); err != nil {
			return err
		}
		if i >= 0 {
			over, comm, exposed = append(over, slowest(st.step)), append(comm, slowest(st.comm)), append(exposed, slowest(st.exposed))
		}
		return nil
	}); err != nil {
		return err
	}
	if rec.Memory != nil { // the overlapped step holds these too
		for r := range rec.Memory.PerRankBytes {
			rec.Memory.PerRankBytes[r] += ov.bytes(r)
		}
		rec.Memory.Method += "; " + overlapMemNote
	}
	stat := func(v []float64) *results.Stat { s := summary.Stat(v); return &s }
	o.Step, o.Sequential, o.Comm, o.Exposed, o.SequentialExposed = stat(over), stat(seq), stat(comm), stat(exposed), stat(seqExposed)
	if o.Step.P50 > 0 {
		o.Ratio = o.Sequential.P50 / o.Step.P50
	}
	o.GEMMSMs, o.GEMMSMsNote = gemmSMs(dl, cfg, rec)
	o.Note = overlapNote(dl, ov)
	if ov.graph != nil {
		o.Note += "; " + ov.graph.describe(cfg.Warmup+cfg.Iters)
	}
	return nil
}

// overlapPlant, when set (tests), is the overlap's plant (overlap.plant).
var overlapPlant string

// overlapMemNote says what --overlap adds to the record's device bytes.
const overlapMemNote = "with --overlap, also what the overlapped step holds besides: with a2a the second micro-batch's layer and dispatcher buffers (its inputs, activations, saved tape and gradients; the weight gradients are shared, counted once), with --delay-wgrad the deferred wgrad's dh1 arenas"

// gemmSMs is how many SMs of a rank's GPU the GEMMs had beside the
// dispatcher's kernels, and how it was counted.
func gemmSMs(dl *deviceLayer, cfg Config, rec *results.Record) (int, string) {
	sms := dl.devs[0].SMCount()
	per := len(dl.of[0]) // ranks sharing the GPU
	switch _, smDriven := dispatchers.SMBudgetOf(cfg.Dispatcher, cfg.Impl); {
	case cfg.Dispatcher == "feplb":
		return sms, "feplb's phase 2 moves with copy engines (no SMs); its phase 1 is its base dispatcher's, whose SMs are not subtracted"
	case smDriven && rec.SMs.Held > 0:
		return max(0, sms-per*rec.SMs.Held), fmt.Sprintf("the GPU's %d SMs less %d held by the dispatcher's transfer kernels of each of its %d ranks while they run", sms, rec.SMs.Held, per)
	case smDriven:
		return sms, "the SMs the dispatcher's kernels hold were not measured on this device (no occupancy): the GPU's count"
	case dispatchers.IsLibrary(cfg.Dispatcher, cfg.Impl):
		return sms, "the library's kernels (NCCL's channels) run on a stream of their own and take SMs the library chooses, not subtracted"
	}
	return sms, "the dispatcher's copies and kernels take no SM budget: the GPU's count"
}

// overlapNote says what the overlap measurement on dl's device means.
func overlapNote(dl *deviceLayer, ov *overlap) string {
	var parts []string
	if ov.a2a {
		parts = append(parts, "the overlapped step is F0, then F1 merged with B0 slot by slot (the combined 1F1B schedule), then B1, each micro-batch on its own stream, events between the slots; the sequential step is F0, B0, F1, B1")
	}
	if ov.shared {
		parts = append(parts, "the shared expert runs on a side stream from the step's start, the forward's last phase waits for it; the sequential step runs it in line")
	}
	if ov.delay {
		parts = append(parts, "each expert backward's wgrad runs on a stream of its own after its dgrad, the backward's last phase waits for it; the sequential step runs it in line")
	}
	n := strings.Join(parts, "; ")
	if dl.devs[0].Name() != "cuda" {
		n += "; on the " + dl.devs[0].Name() + " device each call runs when it is queued, so the times mean nothing: the schedule, the events and the equality are what this proves"
	}
	return n
}

// hostOverlap is the record of --overlap on the host device, which runs
// every call when it is made, one after another: overlap changes only the
// order of the phases, never the step's time, so nothing is timed. With
// a2a the second micro-batch's training step runs too (its own inputs,
// the same weights) and is checked as the first was; its layer's bytes are
// added to mem's (the record's memory, micro-batch 0's so far).
func hostOverlap(cfg Config, fresh func() (dispatchers.Dispatcher, error), mem *results.Memory) (*results.Overlap, error) {
	o := &results.Overlap{Forms: strings.Join(cfg.Overlap, ","), DelayWgrad: cfg.DelayWgrad, MicroBatches: 1}
	o.GEMMSMsNote = "not measured: the host device has no SMs"
	o.Note = "not measured: the host device runs the phases one after another, so overlap would change only their order, not the step's time " +
		"(the timings above are micro-batch 0's, its phases in sequence); the overlapped schedule, its events and its equality with the sequential step are proven on the simulated cuda device"
	if !cfg.overlaps(OverlapA2A) {
		return o, nil
	}
	o.MicroBatches = 2
	if !cfg.Check {
		o.Note += "; micro-batch 1 not run: --check off"
		return o, nil
	}
	l1, err := microBatchOf(cfg, 1, true)
	if err != nil {
		return nil, err
	}
	d1, err := fresh()
	if err != nil {
		return nil, err
	}
	if err := d1.Bind(l1.Shape, l1.Ranks); err != nil {
		return nil, fmt.Errorf("overlap: micro-batch 1: %w", err)
	}
	c, err := Check(l1, d1, fresh)
	if err != nil {
		return nil, fmt.Errorf("overlap: micro-batch 1: %w", err)
	}
	if !c.Passed {
		return nil, fmt.Errorf("overlap: micro-batch 1's correctness check failed: %s", c.Detail)
	}
	if mem != nil { // held beside micro-batch 0's layer, counted in already
		for r := range mem.PerRankBytes {
			mem.PerRankBytes[r] += l1.Footprint(d1, r)
		}
		mem.Method += "; with --overlap a2a, also the second micro-batch's layer (its own weights, inputs, activations, gradients and dispatcher buffers)"
	}
	// Equal stays false: nothing was compared (the host has one order)
	o.Note += fmt.Sprintf("; micro-batch 1's training step (its own inputs, the same weights) ran and passed the check: max relative error %.2g", c.MaxRelErr)
	return o, nil
}
