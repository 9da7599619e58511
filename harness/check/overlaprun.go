package check

import (
	"fmt"
	"strings"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// HostOverlap is the record of --overlap on the host device, which runs
// every call when it is made, one after another: overlap changes only the
// order of the phases, never the step's time, so nothing is timed. With
// a2a the second micro-batch's training step runs too (its own inputs,
// the same weights) and is checked as the first was; its layer's bytes are
// added to mem's (the record's memory, micro-batch 0's so far).
func HostOverlap(cfg setup.Config, fresh func() (dispatchers.Dispatcher, error), mem *results.Memory) (*results.Overlap, error) {
	o := &results.Overlap{Forms: strings.Join(cfg.Overlap, ","), DelayWgrad: cfg.DelayWgrad, MicroBatches: 1}
	o.GEMMSMsNote = "not measured: the host device has no SMs"
	o.Note = "not measured: the host device runs the phases one after another, so overlap would change only their order, not the step's time " +
		"(the timings above are micro-batch 0's, its phases in sequence); the overlapped schedule, its events and its equality with the sequential step are proven on the simulated cuda device"
	if !cfg.Overlaps(setup.OverlapA2A) {
		return o, nil
	}
	o.MicroBatches = 2
	if !cfg.Check {
		o.Note += "; micro-batch 1 not run: --check off"
		return o, nil
	}
	l1, err := layer.NewMicroBatchLayer(cfg, 1, true)
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
