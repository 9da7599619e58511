package layer

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels"
)

// Layer is one MoE layer's weights and inputs spread over EP host ranks.
// All values are bf16 numbers held in float32.
type Layer struct {
	Cfg    setup.Config
	Shape  dispatchers.Shape
	Router kernels.RouterConfig

	Wr   []float32 // [E, h] router weight
	Bias []float32 // [E] selection bias (sigmoid routers), else nil
	// FC1 and FC2 are each expert's weights, [2f, h] and [h, f]; nil in a
	// device layer's host twin and a drawn layer (hostexperts.go), which
	// draw them when needed (ExpertWeights).
	FC1, FC2  [][]float32
	SharedFC1 []float32 // [2·fs, h], fs = FFN × SharedExperts
	SharedFC2 []float32 // [h, fs]

	X          [][]float32 // per rank input [T, h]
	Override   [][]float32 // per rank router-logit override [T, E] of the current step, nil when routing is natural or a trace
	Trace      *setup.Trace
	RoutedStep int // the step whose routing Override and Trace give (SetRouting)
	// micro is the layer's micro-batch in a step of micros (--overlap a2a:
	// 2; 0 means 1): each draws its own routing (microBatchOf).
	micro, micros int

	Ranks []*dispatchers.Rank
	run   []rankRun
	// scratch of the expert phase's extra workers (see experts), shared by
	// the ranks: they run one after another
	scratch [][]float32

	// DOut is each rank's upstream gradient [T, h] (bf16, N(0,1) drawn from
	// the seed); nil in a forward-only layer, which keeps no tape.
	DOut    [][]float32
	Grads   []rankGrads // per rank; nil in a forward-only layer
	Replica replicaGrads

	// Hold is how the layer holds its experts (Config.HostExperts,
	// resolved; see hostexperts.go): a drawn layer draws their weights into
	// drawn, and a layer that does not hold every weight gradient keeps
	// released ones in gradFree for the next rank, after handing each
	// rank's complete ones to gradsDone when it is set (the check)
	Hold      string
	Drawn     []dispatchers.ExpertWeights
	gradFree  []dispatchers.ExpertWeights
	GradsDone func(r int)
	// xe is each rank's expert input as the reference takes it at fp8
	// (expertInput), made once
	xe     [][]float32
	xeOnce sync.Once
	// fp8w: at fp8 on the host device, each expert's weights as e4m3 codes
	// with their 128×128 multipliers (fp8gemm.go), made once (not kept by
	// a drawn layer)
	FP8Weights map[int]*fp8Weights
	fp8wMu     sync.Mutex
	// MXWeights: at mxfp8 (host device), each expert's weights as e4m3
	// codes with their E8M0 scales per 32 along K (mxfp8.go), made once
	// (not kept by a drawn layer); fp8wMu guards it too
	MXWeights map[int]*mxWeights
	// fp8DevLt: at fp8 on the cuda device, the layer's expert GEMMs are
	// cuBLASLt's block-scaled FP8 GEMM (fp8dev.go), and so is the reference
	fp8DevLt bool
	// fp8tw, fp8DevTensor: the per-tensor FP8 GEMM path (fp8tensor.go):
	// each expert's weights as e4m3 codes with one multiplier each (not
	// kept by a drawn layer); on the cuda device, whether it runs it
	fp8tw        map[int]*fp8TensorWeights
	fp8DevTensor bool
	// fp8Unweighted: the cuda layer's last per-tensor step quantized fc2's
	// input without the routing weights (its work had none: the combine
	// applies them, NCCL EP's low-latency mode); the ranks' threads set it
	fp8Unweighted atomic.Bool
}

type rankRun struct {
	logits  []float32 // [T, E]
	scratch []float32 // expert MLP intermediates (forward-only layers)
	shared  []float32 // [T, h] shared expert output
	// the tape (layers with a backward): each expert segment's fc1 output
	// and activation, ExpertForward's scratch, kept at rows·3f from the
	// segment's first row (saved), the segments the forward computed
	// (segs), and the shared expert's (sharedSaved [T, 3fs])
	saved, sharedSaved []float32
	segs               []dispatchers.Segment
	// fp8 (precision.go): the e4m3 values of the rank's input (Rank.X
	// during the step), their codes and scales (Rank.Scales), and which
	// rows of ExpertX this step dequantized
	xq, qs []float32
	q8     []uint8
	dq     []bool
	// at fp8 on the host device: each dequantized row's e4m3 codes (xc,
	// [rows, h]) and the multipliers its dequantization applied (xs,
	// [rows, h/128]): what the FP8 GEMM reads (fp8gemm.go)
	xc []uint8
	xs []float32
	// at mxfp8 (mxfp8.go): the quantize phase's E8M0 scales (mxs, [T,
	// h/32]) and each dequantized row's E8M0 scales (xm, [rows, h/32])
	mxs, xm []uint8
}

// NewLayer draws the layer's weights and inputs from cfg.Seed: inputs N(0,1),
// weights N(0, 1/fan_in), all rounded to bf16; the sigmoid router's selection
// bias is N(0, 0.01²) so that its path is exercised. A trace routing is read
// and validated here.
func NewLayer(cfg setup.Config) (*Layer, error) { return MakeLayer(cfg, true) }

// ExpertWeights returns expert e's fc1 [2f, h] and fc2 [h, f], drawn from the
// seed when the layer does not hold them (each expert has its own stream of
// draws, so any expert can be drawn alone).
func (l *Layer) ExpertWeights(e int) (fc1, fc2 []float32) {
	if l.FC1 != nil {
		return l.FC1[e], l.FC2[e]
	}
	h, f := l.Cfg.Hidden, l.Cfg.FFN
	fc1, fc2 = make([]float32, 2*f*h), make([]float32, h*f)
	l.drawExpert(e, fc1, fc2)
	l.quantExpert(fc1, fc2)
	return fc1, fc2
}

// MakeLayer is NewLayer; without experts it leaves FC1, FC2 and the ranks'
// expert weights nil (a device layer's host twin).
func MakeLayer(cfg setup.Config, experts bool) (*Layer, error) {
	l := &Layer{Cfg: cfg, Hold: setup.HostExpertsHeld,
		Shape: dispatchers.Shape{Tokens: cfg.Tokens, Hidden: cfg.Hidden, Experts: cfg.Experts, TopK: cfg.TopK, EP: cfg.EP}}
	if experts {
		l.Hold = cfg.ResolvedHostExperts()
	}
	if cfg.Routing.Kind == setup.RoutingTrace {
		tr, err := setup.ReadTrace(cfg.Routing.File, cfg.Experts, cfg.TopK)
		if err != nil {
			return nil, &setup.ConfigError{Flag: "routing", Value: cfg.Routing.String(), Allowed: err.Error()}
		}
		// --overlap a2a: a step takes micro-batch 0's EP·tokens lines, then
		// micro-batch 1's (traceToken); with fewer than 2·EP·tokens lines the
		// wrap (Trace.Token) would hand one micro-batch lines the other
		// routes in the same step.
		if least := 2 * cfg.EP * cfg.Tokens; cfg.Overlaps(setup.OverlapA2A) && tr.Lines() < least {
			return nil, &setup.ConfigError{Flag: "routing", Value: cfg.Routing.String(), Allowed: fmt.Sprintf("the trace has %d lines; --overlap a2a routes 2 micro-batches of EP·tokens a step from it, so it needs at least 2·%d·%d = %d lines (a shorter trace wraps within a step)", tr.Lines(), cfg.EP, cfg.Tokens, least)}
		}
		l.Trace = tr
	}
	h, f, E := cfg.Hidden, cfg.FFN, cfg.Experts
	l.Wr = normal(cfg.Seed, "router", 0, E*h, 1/math.Sqrt(float64(h)))
	if cfg.Score == kernels.ScoreSigmoid {
		l.Bias = normal(cfg.Seed, "bias", 0, E, 0.01)
	}
	l.Router = cfg.RouterConfig(l.Bias)
	if experts && l.Hold != setup.HostExpertsDrawn { // each expert its own stream of draws: drawn in parallel, the same values
		fc1, fc2 := make([][]float32, E), make([][]float32, E)
		ParallelFor(E, runtime.GOMAXPROCS(0), func(_, e int) { fc1[e], fc2[e] = l.ExpertWeights(e); cfg.ProgressLine().Add(1) })
		l.FC1, l.FC2 = fc1, fc2
	}
	if fs := f * cfg.SharedExperts; fs > 0 {
		l.SharedFC1 = normal(cfg.Seed, "shared-fc1", 0, 2*fs*h, 1/math.Sqrt(float64(h)))
		l.SharedFC2 = normal(cfg.Seed, "shared-fc2", 0, h*fs, 1/math.Sqrt(float64(fs)))
	}
	l.X, l.Override = make([][]float32, cfg.EP), make([][]float32, cfg.EP)
	ParallelFor(cfg.EP, runtime.GOMAXPROCS(0), func(_, r int) { // each rank its own streams
		l.X[r] = normal(cfg.Seed, "x", r, cfg.Tokens*h, 1)
		l.Override[r] = cfg.Routing.Logits(cfg.Seed, r, cfg.Tokens, E)
	})
	for r := range cfg.EP {
		var local []dispatchers.ExpertWeights
		for e := r * l.Shape.LocalExperts(); l.FC1 != nil && e < (r+1)*l.Shape.LocalExperts(); e++ {
			local = append(local, dispatchers.ExpertWeights{FC1: l.FC1[e], FC2: l.FC2[e]})
		}
		l.Ranks = append(l.Ranks, &dispatchers.Rank{ID: r, X: l.X[r], Experts: local,
			Idx: make([]int32, cfg.Tokens*cfg.TopK), Probs: make([]float32, cfg.Tokens*cfg.TopK)})
		l.run = append(l.run, rankRun{logits: make([]float32, cfg.Tokens*E)})
	}
	if l.FP8Lt() && l.FC1 != nil { // the FP8 GEMM's weights beside the bf16 ones (feplb's phase 2 moves these)
		L := l.Shape.LocalExperts()
		ParallelFor(E, runtime.GOMAXPROCS(0), func(_, e int) {
			w, x := l.fp8Weights(e), &l.Ranks[e/L].Experts[e%L]
			x.Q1, x.Q2, x.S1, x.S2 = w.q1, w.q2, w.lt1, w.lt2
		})
	}
	if !cfg.ForwardOnly && experts { // a host twin or a dispatch benchmark runs no backward
		l.newBackward()
	}
	return l, nil
}

// SetRouting makes the routing the one of step (0, the first, is what
// NewLayer draws and the check uses): a random routing's logit overrides
// are drawn again from the seed, the rank and the step, and a trace's
// tokens continue where the step before ended. With Cfg.RoutingFixed, and
// for natural routing, every step has step 0's routing.
func (l *Layer) SetRouting(step int) {
	if !l.Cfg.PerStepRouting() || step == l.RoutedStep {
		return
	}
	l.RoutedStep = step
	var wg sync.WaitGroup
	for r, o := range l.Override {
		if o != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l.Cfg.Routing.FillLogits(o, l.Cfg.Seed, r, l.Cfg.Experts, step, l.micro)
			}()
		}
	}
	wg.Wait()
}

// TraceToken is the trace's routing of rank r's token t this step (of
// micro-batch micro: a step's micro-batches take consecutive tokens).
func (l *Layer) TraceToken(r, t int) ([]int32, []float32) {
	return l.Trace.Token(((l.RoutedStep*max(l.micros, 1)+l.micro)*l.Cfg.EP+r)*l.Cfg.Tokens + t)
}

// normal draws n bf16-rounded N(0, std²) values for one purpose and index.
func normal(seed uint64, purpose string, i, n int, std float64) []float32 {
	return normalInto(make([]float32, n), seed, purpose, i, std)
}

// normalInto is normal's n = len(out) values, drawn into out.
func normalInto(out []float32, seed uint64, purpose string, i int, std float64) []float32 {
	g := setup.RNG(seed, purpose, i)
	for j := range out {
		out[j] = kernels.RoundBF16(float32(g.NormFloat64() * std))
	}
	return out
}

// Timer runs fn, phase phase's work on rank, and may time it.
type Timer func(phase string, rank int, fn func() error) error

// Step runs one forward pass of the layer through d, calling timed around
// every phase of every rank (rank by rank within a phase).
func (l *Layer) Step(d dispatchers.Dispatcher, timed Timer) error {
	for r := range l.run {
		l.run[r].segs, l.run[r].dq = l.run[r].segs[:0], l.run[r].dq[:0]
	}
	return runPhases(l.Steps(d), len(l.Ranks), timed)
}

// Iteration is one training step of the layer: the forward (Step) and,
// unless the layer is forward-only, the backward (Backward).
func (l *Layer) Iteration(d dispatchers.Dispatcher, timed Timer) error {
	if err := l.Step(d, timed); err != nil || l.Grads == nil {
		return err
	}
	return l.Backward(d, timed)
}

// runPhases runs each phase for every rank, rank by rank, before the next.
func runPhases(phases []dispatchers.Step, ranks int, timed Timer) error {
	for _, ph := range phases {
		for r := range ranks {
			if err := timed(ph.Name, r, func() error { return ph.Run(r) }); err != nil {
				return fmt.Errorf("%s on rank %d: %w", ph.Name, r, err)
			}
		}
	}
	return nil
}

// Phases are the names of an iteration's phases with d, in order: the
// forward's, then the backward's unless the layer is forward-only.
func (l *Layer) Phases(d dispatchers.Dispatcher) ([]string, error) {
	var names []string
	for _, ph := range l.Steps(d) {
		names = append(names, ph.Name)
	}
	if l.Grads == nil {
		return names, nil
	}
	bwd, err := l.BackwardSteps(d)
	for _, ph := range bwd {
		names = append(names, ph.Name)
	}
	return names, err
}

// Steps are the phases of a step with d, in order: the shared expert first
// (as Megatron-Core without shared-expert overlap; left out when the layer has
// none), the router, then the dispatcher's phases around the experts, its
// last phase (which leaves the k-way sums in Rank.Y) followed by the bf16
// store and the shared expert's add.
func (l *Layer) Steps(d dispatchers.Dispatcher) []dispatchers.Step {
	var s []dispatchers.Step
	if l.SharedFC1 != nil {
		s = append(s, dispatchers.Step{Name: "shared", Run: l.sharedExpert})
	}
	s = append(s, dispatchers.Step{Name: "router", Run: l.route})
	if l.Cfg.IsQuantized() {
		s = append(s, dispatchers.Step{Name: "quantize", Run: l.quantize})
	}
	ph := d.Forward(l.experts)
	last := ph[len(ph)-1]
	ph[len(ph)-1].Run = func(r int) error { return l.Finish(last, r) }
	return append(s, ph...)
}

// route computes the router logits (fp32 GEMM, as Megatron's fp32 router),
// replaces them when the routing mode says so, and picks experts and probs.
func (l *Layer) route(r int) error {
	rk, run, c := l.Ranks[r], &l.run[r], l.Cfg
	kernels.MatMulNT(run.logits, l.X[r], l.Wr, c.Tokens, c.Experts, c.Hidden) // the bf16 input (Rank.X holds e4m3 values at fp8)
	if l.Override[r] != nil {
		copy(run.logits, l.Override[r])
	}
	if l.Trace == nil {
		kernels.Route(l.Router, run.logits, c.Tokens, rk.Idx, rk.Probs)
		return nil
	}
	row := make([]float64, c.Experts)
	for t := range c.Tokens {
		idx, probs := l.TraceToken(r, t)
		copy(rk.Idx[t*c.TopK:], idx)
		if probs != nil {
			copy(rk.Probs[t*c.TopK:], probs)
			continue
		}
		for e := range row {
			row[e] = float64(run.logits[t*c.Experts+e])
		}
		for j, p := range l.Router.Probs(row, idx) {
			rk.Probs[t*c.TopK+j] = float32(p)
		}
	}
	return nil
}

// experts runs each segment's expert on its rows: fc1 → SwiGLU × prob → fc2
// (a drawn layer's a group of experts at a time, drawing their weights
// first: withDrawn).
func (l *Layer) experts(r int) error {
	rk, run, c := l.Ranks[r], &l.run[r], l.Cfg
	h, f, L := c.Hidden, c.FFN, l.Shape.LocalExperts()
	rows := len(rk.ExpertProbs)
	if len(rk.ExpertX) != rows*h {
		return fmt.Errorf("dispatch left %d rows with %d values; want rows × hidden = %d", rows, len(rk.ExpertX), rows*h)
	}
	if n := rows * h; len(rk.ExpertY) < n { // keep the rows an earlier expert phase computed
		rk.ExpertY = append(rk.ExpertY, make([]float32, n-len(rk.ExpertY))...)
	} else {
		rk.ExpertY = rk.ExpertY[:n]
	}
	for _, sg := range rk.Segments {
		if sg.Weights == nil && sg.Expert/L != r {
			return fmt.Errorf("segment of expert %d has no weights and the expert is not local", sg.Expert)
		}
		if sg.Start < 0 || sg.Len < 0 || sg.Start+sg.Len > rows {
			return fmt.Errorf("segment of expert %d covers rows [%d, %d) of %d", sg.Expert, sg.Start, sg.Start+sg.Len, rows)
		}
		if l.Grads != nil {
			run.segs = append(run.segs, dispatchers.Segment{Expert: sg.Expert, Start: sg.Start, Len: sg.Len})
		}
		if l.Cfg.IsQuantized() {
			if err := l.dequantRows(r, sg.Start, sg.Start+sg.Len); err != nil {
				return err
			}
		}
	}
	if n := rows * 3 * f; l.Grads != nil && len(run.saved) < n { // keep what an earlier expert phase of the step saved
		run.saved = append(run.saved, make([]float32, n-len(run.saved))...)
	}
	side := disjoint(rk.Segments)
	if l.Hold == setup.HostExpertsDrawn {
		l.withDrawn(rk.Segments, func(segs []dispatchers.Segment, weights func(dispatchers.Segment) *dispatchers.ExpertWeights) {
			l.expertBlocks(r, segs, weights, side)
		})
		return nil
	}
	l.expertBlocks(r, rk.Segments, func(sg dispatchers.Segment) *dispatchers.ExpertWeights {
		if sg.Weights != nil {
			return sg.Weights
		}
		return &rk.Experts[sg.Expert-r*L]
	}, side)
	return nil
}

// expertBlocks computes rank r's segments segs with the weights weights
// gives. A block whose GEMMs split their rows across the cores
// (kernels.SplitWork) runs alone, so that the cores share its weights'
// loads; the smaller ones, which would each run on one core, run in
// parallel on up to GOMAXPROCS goroutines (each its own scratch) when side
// by side is set (no two of the rank's segments share a row, so the
// results are the same as one after another); else one after another.
func (l *Layer) expertBlocks(r int, segs []dispatchers.Segment, weights func(dispatchers.Segment) *dispatchers.ExpertWeights, side bool) {
	rk, run, c := l.Ranks[r], &l.run[r], l.Cfg
	h, f := c.Hidden, c.FFN
	type block struct {
		w          *dispatchers.ExpertWeights
		start, len int         // rows
		w8         *fp8Weights // at fp8 on the host device the expert's e4m3 weights (the FP8 GEMM's), else nil
		mx         *mxWeights  // at mxfp8 the expert's MX weights (mxfp8.go), else nil
		tensor     int         // on the per-tensor FP8 path the expert (fp8tensor.go), else -1
	}
	var blocks []block
	for _, sg := range segs {
		w := weights(sg)
		var w8 *fp8Weights
		var mx *mxWeights
		switch {
		case l.FP8Tensor(): // one tensor a segment: not split (fp8tensor.go)
			blocks = append(blocks, block{w, sg.Start, sg.Len, nil, nil, sg.Expert})
			continue
		case l.FP8Lt():
			if w.Q1 != nil { // the segment's own (the rank's, or a moved expert's: feplb's helpers)
				w8 = &fp8Weights{q1: w.Q1, q2: w.Q2, lt1: w.S1, lt2: w.S2}
			} else {
				w8 = l.fp8Weights(sg.Expert)
			}
		case l.Cfg.IsMXFP8():
			mx = l.segmentMXWeights(sg, w)
		}
		for lo := 0; lo < sg.Len; lo += setup.ExpertBlock {
			blocks = append(blocks, block{w, sg.Start + lo, min(setup.ExpertBlock, sg.Len-lo), w8, mx, -1})
		}
	}
	most, mostSmall := 0, 0
	var small []block
	for _, b := range blocks {
		most = max(most, b.len)
		if b.len*2*f*h < kernels.SplitWork {
			small, mostSmall = append(small, b), max(mostSmall, b.len)
		}
	}
	run.scratch = kernels.Reslice(run.scratch, most*3*f)
	forward := func(b block, scratch []float32) {
		if l.Grads != nil { // a training step keeps each block's fc1 output and activation: its place in the tape
			scratch = run.saved[b.start*3*f : (b.start+b.len)*3*f]
		}
		if e := b.tensor; e >= 0 { // the per-tensor FP8 GEMMs, emulated (fp8tensor.go)
			l.expertForwardFP8Tensor(r, e, b.start, b.len, b.w, scratch)
			return
		}
		if b.mx != nil { // mxfp8: the MX GEMMs, emulated (mxfp8.go)
			l.expertForwardMX(r, b.mx, b.start, b.len, scratch)
			return
		}
		if b.w8 != nil { // fp8 on the host device: cuBLASLt's FP8 GEMMs, emulated (fp8gemm.go)
			l.expertForwardFP8(r, b.w8, b.start, b.len, scratch)
			return
		}
		kernels.ExpertForward(rk.ExpertY[b.start*h:], rk.ExpertX[b.start*h:(b.start+b.len)*h], rk.ExpertProbs[b.start:b.start+b.len],
			b.w.FC1, b.w.FC2, scratch, b.len, h, f, kernels.RoundBF16Slice)
	}
	workers := min(len(small), runtime.GOMAXPROCS(0))
	if workers <= 1 || !side {
		for _, b := range blocks {
			forward(b, run.scratch)
		}
		return
	}
	for _, b := range blocks {
		if b.len*2*f*h >= kernels.SplitWork {
			forward(b, run.scratch)
		}
	}
	scratch := [][]float32{run.scratch} // the other workers' are shared by the ranks (they run one after another)
	for w := 1; w < workers; w++ {
		if len(l.scratch) < w {
			l.scratch = append(l.scratch, nil)
		}
		l.scratch[w-1] = kernels.Reslice(l.scratch[w-1], mostSmall*3*f)
		scratch = append(scratch, l.scratch[w-1])
	}
	ParallelFor(len(small), workers, func(w, i int) { forward(small[i], scratch[w]) })
}

// disjoint says whether no two segments share a row.
func disjoint(segs []dispatchers.Segment) bool {
	s := slices.Clone(segs)
	slices.SortFunc(s, func(a, b dispatchers.Segment) int { return a.Start - b.Start })
	for i := 1; i < len(s); i++ {
		if s[i].Start < s[i-1].Start+s[i-1].Len {
			return false
		}
	}
	return true
}

// sharedExpert computes the shared expert's output on the rank's tokens.
func (l *Layer) sharedExpert(r int) error {
	run, c := &l.run[r], l.Cfg
	fs := c.FFN * c.SharedExperts
	run.shared = kernels.Reslice(run.shared, c.Tokens*c.Hidden)
	scratch := &run.scratch
	if l.Grads != nil {
		scratch = &run.sharedSaved
	}
	*scratch = kernels.Reslice(*scratch, c.Tokens*3*fs)
	kernels.ExpertForward(run.shared, l.X[r], nil, l.SharedFC1, l.SharedFC2, *scratch, c.Tokens, c.Hidden, fs, kernels.RoundBF16Slice)
	return nil
}

// Finish runs the dispatcher's last phase (which leaves the sum of the k
// outputs per token in Rank.Y), stores the sum as bf16 and adds the shared
// expert's output.
func (l *Layer) Finish(last dispatchers.Step, r int) error {
	if err := last.Run(r); err != nil {
		return err
	}
	rk := l.Ranks[r]
	if len(rk.Y) != l.Cfg.Tokens*l.Cfg.Hidden {
		return fmt.Errorf("%s produced %d values, want tokens × hidden = %d", last.Name, len(rk.Y), l.Cfg.Tokens*l.Cfg.Hidden)
	}
	kernels.RoundBF16Slice(rk.Y)
	if l.SharedFC1 != nil {
		for i, v := range l.run[r].shared {
			rk.Y[i] = kernels.RoundBF16(rk.Y[i] + v)
		}
	}
	return nil
}

// Footprint is the bytes of rank r's host buffers: its share of the weights,
// its activations and the dispatcher's buffers.
func (l *Layer) Footprint(d dispatchers.Dispatcher, r int) int64 {
	rk, run := l.Ranks[r], &l.run[r]
	n := cap(rk.X) + cap(rk.Idx) + cap(rk.Probs) + cap(rk.ExpertX) + cap(rk.ExpertProbs) + cap(rk.ExpertY) + cap(rk.Y) +
		cap(run.logits) + cap(run.scratch) + cap(run.shared) + len(l.Wr) + len(l.Bias) + len(l.SharedFC1) + len(l.SharedFC2) +
		cap(rk.Scales) + cap(rk.ExpertScales) + cap(run.dq)/4 + cap(run.q8)/4
	if l.Cfg.IsQuantized() { // Rank.X holds the e4m3 values (run.xq); the bf16 input is kept too
		n += cap(l.X[r])
	}
	for _, w := range rk.Experts { // none in a drawn layer
		n += len(w.FC1) + len(w.FC2)
	}
	return 4*int64(n) + l.backwardFootprint(r) + d.Footprint(r) + l.fp8Footprint(r) + l.mxFootprint(r)
}
