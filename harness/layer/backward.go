package layer

import (
	"fmt"
	"runtime"
	"slices"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels"
)

// The layer's backward on host ranks (kernels/BACKWARD.md): the
// dispatcher's backward phases (each its forward phase's dual) around the
// experts' backward, then the router's and the shared expert's, in
// autograd's order, with Megatron's rounding points (B1–B8 in
// kernels/backward.go).

// rankGrads are one rank's gradients besides those the dispatcher
// contract carries (dispatchers.Rank's).
type rankGrads struct {
	DLogits  []float32   // [T, E] the router logits' gradient (fp32)
	DxRouter []float32   // [T, h] the router's part of the input gradient (B6)
	DxShared []float32   // [T, h] the shared expert's part (B4)
	Dx       []float32   // [T, h] the input gradient (B8)
	scratch  [][]float32 // the expert backward's dact and dh1, one per worker
}

// replicaGrads are the fp32 main_grad of the weights every rank holds a
// replica of, the router's and the shared expert's, summed over every
// rank's tokens as the data-parallel all-reduce of the ranks' main_grads
// would sum them (each rank adds its own part as it finishes: the ranks
// run one after another on the host, so the sum is made in rank order).
type replicaGrads struct {
	Router []float32 // [E, h]: Σ over ranks of bf16(the rank's dlogitsᵀ·x) (B7)
	Shared dispatchers.ExpertWeights
	DWr    []float32 // [E, h] one rank's router weight gradient before it is added
}

// newBackward gives the layer what its backward needs: the upstream
// gradient, the ranks' gradient buffers and the weight gradients.
func (l *Layer) newBackward() {
	c := l.Cfg
	T, h, f, E := c.Tokens, c.Hidden, c.FFN, c.Experts
	fs := f * c.SharedExperts
	l.Replica = replicaGrads{Router: make([]float32, E*h), DWr: make([]float32, E*h)}
	if fs > 0 {
		l.Replica.Shared = dispatchers.ExpertWeights{FC1: make([]float32, 2*fs*h), FC2: make([]float32, h*fs)}
	}
	for r, rk := range l.Ranks {
		l.DOut = append(l.DOut, normal(c.Seed, "dout", r, T*h, 1))
		g := rankGrads{DLogits: make([]float32, T*E), DxRouter: make([]float32, T*h), Dx: make([]float32, T*h)}
		if fs > 0 {
			g.DxShared = make([]float32, T*h)
		}
		l.Grads = append(l.Grads, g)
		rk.ExpertGrads = make([]dispatchers.ExpertWeights, l.Shape.LocalExperts())
		for i := range rk.ExpertGrads { // else taken when the expert backward first adds to them (takeGrads)
			if l.Hold == setup.HostExpertsHeld {
				rk.ExpertGrads[i] = dispatchers.ExpertWeights{FC1: make([]float32, 2*f*h), FC2: make([]float32, h*f)}
			}
		}
	}
}

// RouterGrad says whether the router has a gradient: not when a trace
// gives the probabilities.
func (l *Layer) RouterGrad() bool { return l.Trace == nil || l.Trace.Probs == nil }

// BackwardSteps are the backward's phases with d, in autograd's order (the
// forward's reversed): the dispatcher's backward around the experts', the
// router's, then the shared expert's (first in the forward), the last
// phase followed by the input gradient's sum (B8).
func (l *Layer) BackwardSteps(d dispatchers.Dispatcher) ([]dispatchers.Step, error) {
	if d.Capabilities().NoBackward != "" {
		return nil, fmt.Errorf("dispatcher %s (%s) has no backward in this build; run it with --forward-only", d.Name(), d.Impl())
	}
	experts := l.expertsBackward
	if l.Hold != setup.HostExpertsHeld { // a rank's weight gradients are complete after its one expert backward phase
		if d.Capabilities().Rebalance != nil {
			return nil, fmt.Errorf("dispatcher %s moves experts' weight gradients between ranks: the layer must hold them all (--host-experts held), not %s", d.Name(), l.Hold)
		}
		experts = func(r int) error {
			if err := l.expertsBackward(r); err != nil {
				return err
			}
			l.releaseGrads(r)
			return nil
		}
	}
	s := d.Backward(experts)
	if n := expertPhases(s); n != 1 && l.Hold != setup.HostExpertsHeld {
		return nil, fmt.Errorf("dispatcher %s has %d expert backward phases: a layer that releases each rank's weight gradients after its expert backward needs one", d.Name(), n)
	}
	var router, shared func(int) error
	if l.RouterGrad() {
		router = l.routerBackward
	}
	if l.SharedFC1 != nil {
		shared = l.sharedBackward
	}
	return layerBackward(s, router, shared, l.inputGrad), nil
}

// layerBackward appends to a dispatcher's backward steps s the router's
// and the shared expert's (each when not nil), the last step followed by
// the input gradient's sum.
func layerBackward(s []dispatchers.Step, router, shared, inputGrad func(r int) error) []dispatchers.Step {
	if router != nil {
		s = append(s, dispatchers.Step{Name: dispatchers.BackwardName("router"), Run: router})
	}
	if shared != nil {
		s = append(s, dispatchers.Step{Name: dispatchers.BackwardName("shared"), Run: shared})
	}
	last := s[len(s)-1]
	s[len(s)-1].Run = func(r int) error {
		if err := last.Run(r); err != nil {
			return err
		}
		return inputGrad(r)
	}
	return s
}

// Backward runs the backward of the forward pass Step last ran, through d,
// calling timed around every phase of every rank. The upstream gradient is
// DOut; the weight gradients start from zero (a step's main_grad).
func (l *Layer) Backward(d dispatchers.Dispatcher, timed Timer) error {
	if l.Grads == nil {
		return fmt.Errorf("the layer is forward-only: it kept nothing for a backward")
	}
	steps, err := l.BackwardSteps(d)
	if err != nil {
		return err
	}
	for r, rk := range l.Ranks {
		rk.DY = l.DOut[r]
		for _, g := range rk.ExpertGrads {
			clear(g.FC1)
			clear(g.FC2)
		}
	}
	for _, b := range [][]float32{l.Replica.Router, l.Replica.Shared.FC1, l.Replica.Shared.FC2} {
		clear(b)
	}
	return runPhases(steps, len(l.Ranks), timed)
}

// expertPhases counts the expert backward phases among steps.
func expertPhases(steps []dispatchers.Step) int {
	n := 0
	for _, s := range steps {
		if slices.Contains(dispatchers.ExpertBackwardPhases, s.Name) {
			n++
		}
	}
	return n
}

// expertsBackward runs each of rank r's segments' expert backward on its
// rows, from the tape its forward kept (block by block, as the forward
// computed them): ExpertDY's rows in, ExpertDX's and ExpertDProbs' rows
// out, the weight gradients added to the segment's Grads (or the rank's
// own experts', taken when the layer does not hold them all), a drawn
// layer's a group of experts at a time (withDrawn).
func (l *Layer) expertsBackward(r int) error {
	rk, run, g, c := l.Ranks[r], &l.run[r], &l.Grads[r], l.Cfg
	h, f, L := c.Hidden, c.FFN, l.Shape.LocalExperts()
	rows := len(rk.ExpertProbs)
	if len(rk.ExpertDY) < rows*h {
		return fmt.Errorf("the combine's backward left %d output-gradient values for %d rows; want rows × hidden = %d", len(rk.ExpertDY), rows, rows*h)
	}
	// keep the rows an earlier expert backward phase computed
	if n := rows * h; len(rk.ExpertDX) < n {
		rk.ExpertDX = append(rk.ExpertDX, make([]float32, n-len(rk.ExpertDX))...)
	}
	if len(rk.ExpertDProbs) < rows {
		rk.ExpertDProbs = append(rk.ExpertDProbs, make([]float32, rows-len(rk.ExpertDProbs))...)
	}
	type job struct {
		sg dispatchers.Segment
		gr *dispatchers.ExpertWeights
	}
	var jobs []job
	distinct := map[*dispatchers.ExpertWeights]bool{} // the weight gradients each segment adds to
	for _, sg := range rk.Segments {
		if !taped(run.segs, sg) {
			return fmt.Errorf("segment of expert %d, rows [%d, %d): the forward computed no such segment, so it kept no tape for it", sg.Expert, sg.Start, sg.Start+sg.Len)
		}
		switch {
		case sg.Weights != nil && sg.Grads == nil:
			return fmt.Errorf("segment of expert %d has weights of its own but nowhere to put their gradients", sg.Expert)
		case sg.Weights == nil && sg.Expert/L != r:
			return fmt.Errorf("segment of expert %d has no weights and the expert is not local", sg.Expert)
		}
		gr := sg.Grads
		if gr == nil {
			if gr = &rk.ExpertGrads[sg.Expert-r*L]; gr.FC1 == nil {
				l.takeGrads(gr)
			}
		}
		jobs = append(jobs, job{sg, gr})
		distinct[gr] = true
	}
	// each segment the forward's blocks (their tapes), in order, so that
	// the weight gradients accumulate row by row as over the whole segment;
	// segments run side by side when each adds to its own weight gradients
	// (each worker its own scratch), else one after another
	side := len(distinct) == len(jobs) && disjoint(rk.Segments)
	run1 := func(segs []dispatchers.Segment, weights func(dispatchers.Segment) *dispatchers.ExpertWeights) {
		group := jobs[:len(segs)] // segs are the next segments of jobs
		jobs = jobs[len(segs):]
		workers := 1
		if side {
			workers = min(len(group), runtime.GOMAXPROCS(0))
		}
		for len(g.scratch) < workers {
			g.scratch = append(g.scratch, nil)
		}
		ParallelFor(len(group), max(workers, 1), func(wk, i int) {
			j := group[i]
			w := weights(j.sg)
			for lo := j.sg.Start; lo < j.sg.Start+j.sg.Len; lo += setup.ExpertBlock {
				hi := min(lo+setup.ExpertBlock, j.sg.Start+j.sg.Len)
				g.scratch[wk] = kernels.Reslice(g.scratch[wk], (hi-lo)*3*f)
				tape := kernels.ExpertTape[float32]{X: rk.ExpertX[lo*h : hi*h], Prob: rk.ExpertProbs[lo:hi], Saved: run.saved[lo*3*f : hi*3*f]}
				grads := kernels.ExpertGrads[float32]{DX: rk.ExpertDX[lo*h : hi*h], DProb: rk.ExpertDProbs[lo:hi], DFC1: j.gr.FC1, DFC2: j.gr.FC2}
				kernels.ExpertBackward(grads, rk.ExpertDY[lo*h:hi*h], tape, w.FC1, w.FC2, g.scratch[wk], hi-lo, h, f, kernels.RoundBF16Slice)
			}
		})
	}
	if l.Hold == setup.HostExpertsDrawn {
		l.withDrawn(rk.Segments, run1)
		return nil
	}
	run1(rk.Segments, func(sg dispatchers.Segment) *dispatchers.ExpertWeights {
		if sg.Weights != nil {
			return sg.Weights
		}
		return &rk.Experts[sg.Expert-r*L]
	})
	return nil
}

// taped reports whether the forward computed segment sg (and so kept its
// tape).
func taped(segs []dispatchers.Segment, sg dispatchers.Segment) bool {
	for _, s := range segs {
		if s.Expert == sg.Expert && s.Start == sg.Start && s.Len == sg.Len {
			return true
		}
	}
	return false
}

// routerBackward is rank r's score-function backward (fp32) and router
// GEMM backward: the logits' gradient from DProbs, then the input's (B6)
// and the router weight's (B7), added to the router's main_grad.
func (l *Layer) routerBackward(r int) error {
	rk, g, c := l.Ranks[r], &l.Grads[r], l.Cfg
	if len(rk.DProbs) != c.Tokens*c.TopK {
		return fmt.Errorf("the dispatcher's backward left %d probability gradients, want tokens × topk = %d", len(rk.DProbs), c.Tokens*c.TopK)
	}
	kernels.ScoreBackward(l.Router, g.DLogits, l.run[r].logits, rk.DProbs, rk.Idx, c.Tokens)
	kernels.RouterBackward(g.DxRouter, l.Replica.DWr, g.DLogits, l.X[r], l.Wr, c.Tokens, c.Hidden, c.Experts, kernels.RoundBF16Slice)
	for i, v := range l.Replica.DWr {
		l.Replica.Router[i] += v
	}
	return nil
}

// sharedBackward is rank r's shared expert's backward: its output gradient
// is DOut itself; its weight gradients add to the shared main_grad.
func (l *Layer) sharedBackward(r int) error {
	g, c := &l.Grads[r], l.Cfg
	fs := c.FFN * c.SharedExperts
	if len(g.scratch) == 0 {
		g.scratch = append(g.scratch, nil)
	}
	g.scratch[0] = kernels.Reslice(g.scratch[0], c.Tokens*3*fs)
	tape := kernels.ExpertTape[float32]{X: l.X[r], Saved: l.run[r].sharedSaved}
	grads := kernels.ExpertGrads[float32]{DX: g.DxShared, DFC1: l.Replica.Shared.FC1, DFC2: l.Replica.Shared.FC2}
	kernels.ExpertBackward(grads, l.DOut[r], tape, l.SharedFC1, l.SharedFC2, g.scratch[0], c.Tokens, c.Hidden, fs, kernels.RoundBF16Slice)
	return nil
}

// inputGrad is rank r's input gradient: the dispatcher's part, then the
// router's, then the shared expert's, each sum stored as bf16 (B8).
func (l *Layer) inputGrad(r int) error {
	rk, g, c := l.Ranks[r], &l.Grads[r], l.Cfg
	if len(rk.DX) != c.Tokens*c.Hidden {
		return fmt.Errorf("the dispatcher's backward left %d input-gradient values, want tokens × hidden = %d", len(rk.DX), c.Tokens*c.Hidden)
	}
	var router []float32
	if l.RouterGrad() {
		router = g.DxRouter
	}
	kernels.InputGrad(g.Dx, rk.DX, router, g.DxShared, kernels.RoundBF16Slice)
	return nil
}

// backwardFootprint is the bytes of rank r's host buffers for the backward
// (float32 storage): the tape, the gradients and the weight gradients.
func (l *Layer) backwardFootprint(r int) int64 {
	if l.Grads == nil {
		return 0
	}
	rk, run, g := l.Ranks[r], &l.run[r], &l.Grads[r]
	n := cap(run.saved) + cap(run.sharedSaved) + len(l.DOut[r]) + cap(rk.ExpertDY) + cap(rk.ExpertDX) + cap(rk.ExpertDProbs) +
		cap(rk.DX) + cap(rk.DProbs) + cap(g.DLogits) + cap(g.DxRouter) + cap(g.DxShared) + cap(g.Dx)
	for _, b := range g.scratch {
		n += cap(b)
	}
	// the replicas' main_grad, as a GPU rank holds its own (as the
	// footprint counts the router and shared weights)
	n += len(l.Replica.Router) + len(l.Replica.Shared.FC1) + len(l.Replica.Shared.FC2)
	for _, w := range rk.ExpertGrads {
		n += cap(w.FC1) + cap(w.FC2)
	}
	return 4 * int64(n)
}
