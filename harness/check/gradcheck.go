package check

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/roundtrip"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/results"
)

// The gradient check: after the checked forward step, its backward with
// every gradient buffer poisoned, each gradient compared with the float64
// reference (kernels.ReferenceGradsEach, on the same bf16 inputs, weights,
// routing and upstream gradient) by kernels.GradErrMetric against
// kernels.GradTolerance, expert by expert so that the reference never
// holds every expert's gradients at once.

// gradNote says what the check compared.
const gradNote = "upstream gradient: N(0,1) per rank drawn from the seed, as bf16; the weight gradients are fp32 main_grad: the experts' their owners', " +
	"the router's and the shared expert's summed over every rank's tokens (each rank's router part rounded to bf16 first, B7), as a data-parallel all-reduce sums them"

// sampleGradNote says how a sampled check bounds the gradient check.
const sampleGradNote = "on the check's sample of tokens: the check's upstream gradient is zero outside the sampled tokens, so every gradient, " +
	"the weight gradients' sums included, is the sampled tokens' and its reference takes those tokens alone; every other token's input " +
	"and probability gradients must be zero"

// checkGrads runs the backward of the step Check ran and compares its
// gradients with the reference; it fills c.Grads. A layer that releases
// each rank's expert weight gradients after its expert backward has them
// compared there: the reference runs alongside the backward (gradCompare).
// With a sample of tokens (nil: all), the backward's upstream gradient is
// the drawn one on the sampled tokens and zero elsewhere (sampleGradNote),
// the drawn one again afterwards.
func checkGrads(c *results.Correctness, l *layer.Layer, d dispatchers.Dispatcher, sample [][]int) error {
	poisonGrads(l)
	prog := l.Cfg.ProgressLine()
	timer := countedPhases(l)
	if sample != nil {
		drawn := l.DOut
		defer func() { l.DOut = drawn }()
		l.DOut = maskRows(drawn, sample, l.Cfg.Hidden)
	}
	cmp := NewGradCompare(l)
	cmp.sample = sample
	if l.Hold != setup.HostExpertsHeld { // count the reference's experts
		prog.Work(StageAlongside, float64(l.Cfg.Experts))
		timer = func(_ string, _ int, fn func() error) error { return fn() }
		cmp.Start()
		l.GradsDone = cmp.RankDone
		defer func() { l.GradsDone = nil }()
	} else if steps, err := l.BackwardSteps(d); err == nil {
		prog.Work(StageBackward, StepsWork(l.Cfg, steps, len(l.Ranks)))
	}
	if err := l.Backward(d, timer); err != nil {
		cmp.abort()
		return err
	}
	if !cmp.started {
		prog.Work(StageGradRef, float64(l.Cfg.Experts))
	}
	g := &results.GradCheck{Tolerance: kernels.GradTolerance, Metric: kernels.GradErrMetric, Note: gradNote}
	if sample != nil {
		g.Note += "; " + sampleGradNote
	}
	g.PerTensor = cmp.Finish()
	for _, e := range g.PerTensor {
		g.MaxRelErr = math.Max(g.MaxRelErr, e)
	}
	c.Grads = g
	return nil
}

// poisonGrads fills with NaN every gradient buffer a backward writes
// rather than adds to, sized for the step the forward just ran (the
// dispatchers reuse a buffer's storage, so their outputs start as NaN).
func poisonGrads(l *layer.Layer) {
	c := l.Cfg
	for r, rk := range l.Ranks {
		rows := len(rk.ExpertProbs)
		for _, b := range []*[]float32{&rk.ExpertDY, &rk.ExpertDX} {
			*b = kernels.Reslice(*b, rows*c.Hidden)
		}
		rk.ExpertDProbs = kernels.Reslice(rk.ExpertDProbs, rows)
		rk.DX, rk.DProbs = kernels.Reslice(rk.DX, c.Tokens*c.Hidden), kernels.Reslice(rk.DProbs, c.Tokens*c.TopK)
		g := &l.Grads[r]
		for _, b := range [][]float32{rk.ExpertDY, rk.ExpertDX, rk.ExpertDProbs, rk.DX, rk.DProbs, g.DxShared, g.Dx} {
			roundtrip.Poison(b)
		}
		if l.RouterGrad() { // else the router's gradients stay zero
			for _, b := range [][]float32{g.DLogits, g.DxRouter, l.Replica.DWr} {
				roundtrip.Poison(b)
			}
		}
	}
}

// maskRows is rows ([rank][tokens·width]) with every row outside sample
// (per rank, increasing) zero.
func maskRows(rows [][]float32, sample [][]int, width int) [][]float32 {
	out := make([][]float32, len(rows))
	for r, v := range rows {
		out[r] = make([]float32, len(v))
		for _, t := range sample[r] {
			copy(out[r][t*width:(t+1)*width], v[t*width:(t+1)*width])
		}
	}
	return out
}

// pick is the rows of v ([tokens·width]) in sample (nil: all of them).
func pick[T any](v []T, sample []int, width int) []T {
	if sample == nil {
		return v
	}
	out := make([]T, 0, len(sample)*width)
	for _, t := range sample {
		out = append(out, v[t*width:(t+1)*width]...)
	}
	return out
}

// spread is pick's inverse: ref's rows (those of sample, in its order) at
// their tokens' places among tokens rows of width, zeros elsewhere; ref
// itself when sample is nil.
func spread(ref []float64, sample []int, tokens, width int) []float64 {
	if sample == nil {
		return ref
	}
	out := make([]float64, tokens*width)
	for i, t := range sample {
		copy(out[t*width:(t+1)*width], ref[i*width:(i+1)*width])
	}
	return out
}

// gradProblem is the layer's last step as ReferenceGradsEach takes it, on
// the tokens of sample (nil: all; per rank, the same number each); each
// expert's weights are widened into buffers of w, which done(e) gives back
// once the reference is through with expert e.
func gradProblem(l *layer.Layer, w *widened, sample [][]int) kernels.GradProblem {
	c := l.Cfg
	tokens := c.EP * c.Tokens
	if sample != nil {
		tokens = 0
		for _, s := range sample {
			tokens += len(s)
		}
	}
	rows := func(r int) []int {
		if sample == nil {
			return nil
		}
		return sample[r]
	}
	p := kernels.GradProblem{Router: l.Router, Tokens: tokens, Hidden: c.Hidden, FFN: c.FFN,
		SharedFFN: c.FFN * c.SharedExperts, Wr: widen(l.Wr),
		Expert: func(e int) ([]float64, []float64) {
			fc1, fc2 := l.ExpertWeights(e)
			b := w.get(e)
			b.fc1, b.fc2 = widenInto(b.fc1, fc1), widenInto(b.fc2, fc2)
			return b.fc1, b.fc2
		}}
	var probs []float32
	h, k := c.Hidden, c.TopK
	var origin [][2]int // each token's rank and token (the per-tensor path's fc1 output)
	for r, rk := range l.Ranks {
		s := rows(r)
		n := l.Cfg.Tokens // the rank's tokens, or the sample's
		if s != nil {
			n = len(s)
		}
		for i := range n {
			t := i
			if s != nil {
				t = s[i]
			}
			origin = append(origin, [2]int{r, t})
		}
		p.X, p.DOut = append(p.X, widen(pick(l.X[r], s, h))...), append(p.DOut, widen(pick(l.DOut[r], s, h))...)
		if l.Cfg.IsQuantized() {
			p.XE = append(p.XE, widen(pick(l.ExpertInput(r), s, h))...)
		}
		p.Idx, probs = append(p.Idx, pick(rk.Idx, s, k)...), append(probs, pick(rk.Probs, s, k)...)
		if l.Override[r] != nil {
			p.Override = append(p.Override, widen(pick(l.Override[r], s, c.Experts))...)
		}
	}
	if l.FP8Tensor() {
		p.FC1Out = fp8TensorFC1(l, origin)
	}
	if !l.RouterGrad() { // the trace's probabilities
		p.Probs = widen(probs)
	}
	if l.SharedFC1 != nil {
		p.SharedFC1, p.SharedFC2 = widen(l.SharedFC1), widen(l.SharedFC2)
	}
	return p
}

// widened lends float64 buffers for experts' weights, each held by one
// expert at a time (the reference computes a few at once).
type widened struct {
	pool sync.Pool
	held []*expertBuf // [E] the buffers lent to each expert, until given back
}

type expertBuf struct{ fc1, fc2 []float64 }

func (w *widened) get(e int) *expertBuf {
	b, _ := w.pool.Get().(*expertBuf)
	if b == nil {
		b = &expertBuf{}
	}
	w.held[e] = b
	return b
}

// done gives expert e's buffers back, if it had any.
func (w *widened) done(e int) {
	if b := w.held[e]; b != nil {
		w.held[e] = nil
		w.pool.Put(b)
	}
}

// gradCompare compares the layer's last step's gradients with the
// reference (kernels.ReferenceGradsEach), the experts' weight gradients
// expert by expert as the reference computes them: each waits until its
// rank's are ready — at once when the layer holds them all; when it
// releases each rank's after its expert backward, that rank's backward
// hands them over (rankDone) and waits until all are compared. The
// reference takes experts in increasing order and ranks own increasing
// experts, so it never waits on a rank after the one the layer waits on.
type gradCompare struct {
	l                *layer.Layer
	ready, compared  []chan struct{} // per rank
	published        []bool
	left             []atomic.Int32 // per rank: experts not yet compared
	stop             chan struct{}
	started, stopped bool
	done             chan struct{} // closed when the reference returned ref
	ref              kernels.Grads

	mu       sync.Mutex
	fc1, fc2 layer.MaxErrAccumulator

	// expertGrads, when set, gives expert e's weight gradients (a device
	// run's, downloaded one expert at a time); else its rank's ExpertGrads
	expertGrads func(e int) dispatchers.ExpertWeights
	// local, when set, says which ranks are this process's (a run over
	// several processes): only their input and probability gradients and
	// their experts' weight gradients are compared
	local func(r int) bool
	// sample, when set, is the tokens whose upstream gradient is not zero
	// (checkGrads): the reference takes them alone
	sample [][]int
}

// mine: rank r's gradients are compared here.
func (c *gradCompare) Mine(r int) bool { return c.local == nil || c.local(r) }

func NewGradCompare(l *layer.Layer) *gradCompare {
	ep, L := l.Cfg.EP, l.Shape.LocalExperts()
	c := &gradCompare{l: l, ready: make([]chan struct{}, ep), compared: make([]chan struct{}, ep), published: make([]bool, ep),
		left: make([]atomic.Int32, ep), stop: make(chan struct{}), done: make(chan struct{})}
	for r := range ep {
		c.ready[r], c.compared[r] = make(chan struct{}), make(chan struct{})
		c.left[r].Store(int32(L))
	}
	return c
}

// Start runs the reference on its own goroutine.
func (c *gradCompare) Start() {
	c.started = true
	l := c.l
	w := &widened{held: make([]*expertBuf, l.Cfg.Experts)}
	p := gradProblem(l, w, c.sample)
	go func() {
		defer close(c.done)
		c.ref = kernels.ReferenceGradsEach(p, setup.RefWorkers(l.Cfg), func(e int, fc1, fc2 []float64) {
			defer l.Cfg.ProgressLine().Add(1)
			defer w.done(e)
			c.expert(e, fc1, fc2)
		})
	}()
}

// expert compares expert e's weight gradients with the reference's, once
// its rank's are ready (not after an abort).
func (c *gradCompare) expert(e int, fc1, fc2 []float64) {
	L := c.l.Shape.LocalExperts()
	r := e / L
	select {
	case <-c.ready[r]:
	case <-c.stop:
		return
	}
	if !c.Mine(r) { // another process compares it
		return
	}
	var g dispatchers.ExpertWeights
	if c.expertGrads != nil {
		g = c.expertGrads(e)
	} else {
		g = c.l.Ranks[r].ExpertGrads[e%L]
	}
	var a1, a2 layer.MaxErrAccumulator
	a1.Add(g.FC1, fc1)
	a2.Add(g.FC2, fc2)
	c.mu.Lock()
	c.fc1.Merge(a1)
	c.fc2.Merge(a2)
	c.mu.Unlock()
	if c.left[r].Add(-1) == 0 {
		close(c.compared[r])
	}
}

// publish makes rank r's weight gradients ready to compare.
func (c *gradCompare) publish(r int) {
	if !c.published[r] {
		c.published[r] = true
		close(c.ready[r])
	}
}

// RankDone is the layer's gradsDone: rank r's weight gradients are
// complete; it returns once they are compared, so that they may be
// released.
func (c *gradCompare) RankDone(r int) {
	c.publish(r)
	<-c.compared[r]
}

// abort stops comparing (the backward failed) and waits for the reference.
func (c *gradCompare) abort() {
	close(c.stop)
	if c.started {
		<-c.done
	}
}

// Finish compares what is left once the backward ran — every expert's
// weight gradients when the layer holds them all — and returns each
// gradient's error by name.
func (c *gradCompare) Finish() map[string]float64 {
	errs := map[string]float64{}
	for n, a := range c.finishAcc() {
		errs[n] = a.Err()
	}
	return errs
}

// finishAcc is finish's comparison, each gradient's maxima (of a run over
// several processes, this process's part: mergeChecks makes the run's).
func (c *gradCompare) finishAcc() map[string]layer.MaxErrAccumulator {
	l := c.l
	for r := range c.ready {
		c.publish(r)
	}
	if !c.started {
		c.Start()
	}
	<-c.done
	cf, T, h, E := l.Cfg, l.Cfg.Tokens, l.Cfg.Hidden, l.Cfg.Experts
	ref := c.ref
	var x, wr, probs, sfc1, sfc2 layer.MaxErrAccumulator
	at := 0 // rank r's first row in the reference
	for r, rk := range l.Ranks {
		var s []int
		n := T
		if c.sample != nil {
			s, n = c.sample[r], len(c.sample[r])
		}
		if c.Mine(r) {
			x.Add(l.Grads[r].Dx, spread(ref.X[at*h:(at+n)*h], s, T, h))
			probs.Add(rk.DProbs, spread(ref.Probs[at*cf.TopK:(at+n)*cf.TopK], s, T, cf.TopK))
		}
		at += n
	}
	wr.Add(l.Replica.Router, ref.Wr[0][:E*h]) // every rank's tokens (in a run over several processes, every process's: downloadGrads)
	accs := map[string]layer.MaxErrAccumulator{"input": x, "router weight": wr, "probs": probs, "expert fc1": c.fc1, "expert fc2": c.fc2}
	if l.SharedFC1 != nil {
		sfc1.Add(l.Replica.Shared.FC1, ref.SharedFC1)
		sfc2.Add(l.Replica.Shared.FC2, ref.SharedFC2)
		accs["shared fc1"], accs["shared fc2"] = sfc1, sfc2
	}
	return accs
}

// gradDetail names the gradients over the tolerance, worst first.
func gradDetail(g *results.GradCheck) string {
	var bad []string
	for n, e := range g.PerTensor {
		if !(e <= g.Tolerance) {
			bad = append(bad, n)
		}
	}
	sort.Slice(bad, func(i, j int) bool { return g.PerTensor[bad[i]] > g.PerTensor[bad[j]] })
	var parts []string
	for _, n := range bad {
		parts = append(parts, fmt.Sprintf("%s %.3g", n, g.PerTensor[n]))
	}
	s := ""
	if len(parts) > 0 {
		s = fmt.Sprintf("gradient error over the tolerance %g: %s", g.Tolerance, strings.Join(parts, ", "))
	}
	if g.RoundTrip != "exact" && g.RoundTrip != layer.DeviceGradRoundTrip {
		if s != "" {
			s += "; "
		}
		s += "backward round trip " + g.RoundTrip
	}
	return s
}
