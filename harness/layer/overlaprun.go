package layer

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/harness/summary"
	"github.com/moebench/moebench/results"
)

// MeasureOverlap times cfg's overlap on the device layer dl after its own
// timed steps (runDevice): each iteration runs the step with its phases
// one after another, then the same step overlapped, both on the
// iteration's routing, and reads their events (overlap.times). The first
// timed pair's outputs and gradients are compared bit for bit. A design
// that cannot overlap is recorded with the reason, not failed.
func MeasureOverlap(dl *DeviceLayer, cfg setup.Config, denv dispatchers.Env, rec *results.Record) error {
	o := &results.Overlap{Forms: strings.Join(cfg.Overlap, ","), DelayWgrad: cfg.DelayWgrad, MicroBatches: 1}
	rec.Overlap = o
	a2a := cfg.Overlaps(setup.OverlapA2A)
	if a2a {
		o.MicroBatches = 2
	}
	cannot := func(why string) error {
		o.Note = "not measured: " + dl.Dispatcher.Name() + " cannot overlap here: " + why
		return nil
	}
	if why := overlapRefused(dl, cfg, a2a); why != "" {
		return cannot(why)
	}
	var l1 *Layer
	var d1 dispatchers.DeviceDispatcher
	if a2a {
		var err error
		if l1, err = MicroBatch(cfg, 1); err != nil {
			return err
		}
		if d1, err = dispatchers.NewDevice(cfg.Dispatcher, cfg.Impl, denv); err != nil {
			return cannot("a second instance for micro-batch 1: " + err.Error())
		}
		defer d1.Close()
	}
	ov, err := NewOverlap(dl, cfg.Overlaps(setup.OverlapShared), a2a, cfg.DelayWgrad, l1, d1)
	if err != nil {
		if dispatchers.IsUnavailable(err) {
			return cannot(err.Error())
		}
		return err
	}
	defer func() { dl.ov = nil }()
	ov.Plant = OverlapPlant
	if dl.Graph != nil { // --cuda-graph: runDevice's NewCUDAGraphs refused the designs that cannot be captured
		if ov.Graph, err = NewOverlapCUDAGraphs(ov); err != nil {
			return err
		}
		defer ov.Graph.Free()
	}
	cfg.ProgressLine().Set("overlap: the sequential and the overlapped step, in turn")
	s := &ovSamples{ov: ov, o: o, warmup: cfg.Warmup}
	if _, err := setup.Iterate(cfg.Warmup, cfg.Iters, time.Time{}, s.iteration); err != nil {
		return err
	}
	if rec.Memory != nil { // the overlapped step holds these too
		for r := range rec.Memory.PerRankBytes {
			rec.Memory.PerRankBytes[r] += ov.bytes(r)
		}
		rec.Memory.Method += "; " + overlapMemNote
	}
	stat := func(v []float64) *results.Stat { s := summary.Stat(v); return &s }
	o.Step, o.Sequential, o.Comm, o.Exposed, o.SequentialExposed = stat(s.over), stat(s.seq), stat(s.comm), stat(s.exposed), stat(s.seqExposed)
	if o.Step.P50 > 0 {
		o.Ratio = o.Sequential.P50 / o.Step.P50
	}
	o.GEMMSMs, o.GEMMSMsNote = gemmSMs(dl, cfg, rec)
	o.Note = overlapNote(dl, ov)
	if ov.Graph != nil {
		o.Note += "; " + ov.Graph.Describe(cfg.Warmup+cfg.Iters)
	}
	return nil
}

// overlapRefused is why dl cannot overlap cfg's forms here, or "".
func overlapRefused(dl *DeviceLayer, cfg setup.Config, a2a bool) string {
	switch {
	case dl.Distributed != nil:
		return "a run over several processes (the second micro-batch's layer is built in one process only)"
	case (a2a || cfg.DelayWgrad) && !dl.Train:
		why := "its device implementation has no backward in this build"
		if nb := dl.Dispatcher.Capabilities().NoBackward; nb != "" {
			why = nb
		}
		return "a2a and --delay-wgrad overlap a training step's backward, and " + why
	}
	return ""
}

// ovSamples are the overlap's timed iterations: per iteration the slowest
// rank's sequential and overlapped step, communication and exposed time.
type ovSamples struct {
	ov                                   *Overlap
	o                                    *results.Overlap
	warmup                               int
	seq, over, comm, exposed, seqExposed []float64
}

// routing sets every micro-batch's routing to step's.
func (s *ovSamples) routing(step int) error {
	for _, l := range s.ov.Mb {
		if l != nil {
			if err := l.SetRouting(step); err != nil {
				return err
			}
		}
	}
	return nil
}

// iteration i (negative: warm-up) runs the sequential step, then the
// overlapped one; the first timed one compares their outputs and
// gradients bit for bit (and, with graphs, the plain launches' too).
func (s *ovSamples) iteration(i int) error {
	ov := s.ov
	slowest := func(v []float64) float64 { return slices.Max(v) }
	if err := s.routing(s.warmup + i + 1); err != nil {
		return err
	}
	if err := ov.Step(false); err != nil {
		return fmt.Errorf("overlap: the sequential step: %w", err)
	}
	var want ovSnapshot
	var err error
	if i == 0 {
		if want, err = ov.Snapshot(); err != nil {
			return err
		}
	}
	st, err := ov.Times(false)
	if err != nil {
		return err
	}
	if i >= 0 {
		s.seq, s.seqExposed = append(s.seq, slowest(st.step)), append(s.seqExposed, slowest(st.exposed))
	}
	if i == 0 && ov.Graph != nil { // the eager overlapped step too: the graphs' reference
		if err := s.eagerEquals(want); err != nil {
			return err
		}
	}
	var before ovGraphs
	if ov.Graph != nil {
		before = *ov.Graph
	}
	if i == 0 { // what the step writes holds no earlier step's values
		if err := ov.poison(); err != nil {
			return err
		}
	}
	if err := ov.Step(true); err != nil {
		return fmt.Errorf("overlap: the overlapped step: %w", err)
	}
	if i == 0 && ov.Graph != nil {
		ov.Graph.compared = ov.Graph.compare(before)
	}
	if i == 0 {
		if err := s.overlappedEquals(want); err != nil {
			return err
		}
	}
	if st, err = ov.Times(true); err != nil {
		return err
	}
	if i >= 0 {
		s.over, s.comm, s.exposed = append(s.over, slowest(st.step)), append(s.comm, slowest(st.comm)), append(s.exposed, slowest(st.exposed))
	}
	return nil
}

// eagerEquals runs the overlapped step as plain launches and compares its
// outputs and gradients with the sequential step's (want).
func (s *ovSamples) eagerEquals(want ovSnapshot) error {
	ov := s.ov
	if err := ov.poison(); err != nil {
		return err
	}
	ov.eager = true
	err := ov.Step(true)
	ov.eager = false
	if err != nil {
		return fmt.Errorf("overlap: the overlapped step, as plain launches: %w", err)
	}
	got, err := ov.Snapshot()
	if err != nil {
		return err
	}
	if d := want.Diff(got); d != "" {
		return fmt.Errorf("overlap: the overlapped step's output or gradients (plain launches) differ from the sequential step's: %s", d)
	}
	return nil
}

// overlappedEquals compares the overlapped step's outputs and gradients
// with the sequential step's (want), and records that they are equal.
func (s *ovSamples) overlappedEquals(want ovSnapshot) error {
	got, err := s.ov.Snapshot()
	if err != nil {
		return err
	}
	if d := want.Diff(got); d != "" {
		how := ""
		if s.ov.Graph != nil {
			how = " (replayed from CUDA graphs; the same step as plain launches equals it)"
		}
		return fmt.Errorf("overlap: the overlapped step's output or gradients%s differ from the sequential step's: %s", how, d)
	}
	s.o.Equal = true
	return nil
}

// overlapPlant, when set (tests), is the overlap's plant (overlap.plant).
var OverlapPlant string

// overlapMemNote says what --overlap adds to the record's device bytes.
const overlapMemNote = "with --overlap, also what the overlapped step holds besides: with a2a the second micro-batch's layer and dispatcher buffers (its inputs, activations, saved tape and gradients; the weight gradients are shared, counted once), with --delay-wgrad the deferred wgrad's dh1 arenas"

// gemmSMs is how many SMs of a rank's GPU the GEMMs had beside the
// dispatcher's kernels, and how it was counted.
func gemmSMs(dl *DeviceLayer, cfg setup.Config, rec *results.Record) (int, string) {
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
func overlapNote(dl *DeviceLayer, ov *Overlap) string {
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
