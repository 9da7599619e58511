package feplb

import (
	"fmt"
	"math"
	"time"

	"github.com/moebench/moebench/balance"
	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
)

// New returns FEPLB on the host device over its base dispatcher, or why it
// is unavailable. The ranks are emulated in one process and the copies are
// memory copies in their own phase, so nothing overlaps: this proves that
// the plan executes and the output is unchanged. The plan's cost model has
// fixed rates (see HostModel).
func New(impl string, env dispatchers.Env) (dispatchers.Dispatcher, error) {
	base, err := options(impl, env)
	if err != nil {
		return nil, err
	}
	if env.Device != "host" {
		return nil, &dispatchers.UnavailableError{Name: "feplb", Impl: impl, Reason: "the host implementation runs on the host device only"}
	}
	b, err := dispatchers.New(base, impl, env)
	if err != nil {
		return nil, baseUnavailable(impl, err)
	}
	ph, err := classicOf(base, impl, b.Forward(nil), b.Backward(nil))
	if err != nil {
		return nil, baseUnavailable(impl, err)
	}
	return &FEPLB{Dispatcher: b, ph: ph, env: env}, nil
}

// FEPLB wraps the base dispatcher on the host; Permute's bookkeeping aside,
// Permute and Unpermute are the base's.
type FEPLB struct {
	dispatchers.Dispatcher         // the base
	ph                     classic // its phases
	env                    dispatchers.Env
	c                      *core
	ranks                  []*dispatchers.Rank
	own                    []int // rows each rank's phase 1 delivered
	weights                [][]dispatchers.ExpertWeights
	copied                 float64 // seconds of copies this step
	issued                 int64   // bytes of the forward phase-2 copies this step, as they would move (Issued)
	issuedRows             int
	rows                   []int // scratch: a rank's rows per local expert
	// the backward: each rank's static segments (the first expert phase's),
	// the weight gradients of the chunks it computes for others, and what
	// the step's backward moved
	static [][]dispatchers.Segment
	grads  [][]dispatchers.ExpertWeights
	back   backStats
}

func (f *FEPLB) Name() string { return "feplb" }

// Bind binds the base dispatcher and sets up the scheduler.
func (f *FEPLB) Bind(shape dispatchers.Shape, ranks []*dispatchers.Rank) error {
	m := HostModel(f.env.Hidden, f.env.FFN)
	if fp8Held(ranks) { // phase 2 moves what the FP8 GEMM on the helper reads
		m.ExpertBytes = dispatchers.FP8WeightBytes(f.env.Hidden, f.env.FFN)
	}
	c, err := newCore(f.env, shape, m)
	if err != nil {
		return err
	}
	f.c, f.ranks = c, ranks
	f.own = make([]int, shape.EP)
	f.weights = make([][]dispatchers.ExpertWeights, shape.EP)
	f.static, f.grads = make([][]dispatchers.Segment, shape.EP), make([][]dispatchers.ExpertWeights, shape.EP)
	return f.Dispatcher.Bind(shape, ranks)
}

// HostModel is the plan's cost model on the host device, and before any
// measurement on an emulated one (device.Emu): fixed, stated rates of about
// one CPU core (10 GFLOP/s GEMMs, 10 GB/s copies), so that a configuration
// always gets the same plan.
func HostModel(hidden, ffn int) balance.Model {
	const rate, bw = 10e9, 10e9
	return balance.Model{Hidden: hidden, FFN: ffn, GEMMRate: rate, HBM: bw, CE: bw, NVLink: bw, Network: bw,
		RateSource: "host model: 10 GFLOP/s GEMMs, 10 GB/s copies"}
}

// Permute starts a step on its first rank.
func (f *FEPLB) Permute(r int) error {
	if r == 0 {
		f.c.begin()
		f.copied, f.back, f.issued, f.issuedRows = 0, backStats{}, 0, 0
	}
	return f.ph.Permute(r)
}

// Dispatch runs phase 1; after the last rank it leaves every rank's static
// experts in its segments (the layer computes them next) while the scheduler
// plans.
func (f *FEPLB) Dispatch(r int) error {
	if err := f.ph.Dispatch(r); err != nil {
		return err
	}
	rk, L := f.ranks[r], f.c.shape.LocalExperts()
	rows := kernels.Reslice(f.rows, L)
	f.rows = rows
	clear(rows)
	at := 0
	for i, sg := range rk.Segments {
		if sg.Expert != r*L+i || sg.Start != at || sg.Weights != nil || i >= L {
			return fmt.Errorf("feplb: base dispatcher %s: segment %d of rank %d is expert %d at row %d; want one run per local expert in order", f.Dispatcher.Name(), i, r, sg.Expert, sg.Start)
		}
		rows[i], at = sg.Len, at+sg.Len
	}
	f.own[r] = len(rk.ExpertProbs)
	if !f.c.dispatchedRank(r, rows) {
		return nil
	}
	for q, rk := range f.ranks {
		static := rk.Segments[:0]
		for _, sg := range rk.Segments {
			if !f.c.dynamic[sg.Expert] {
				static = append(static, sg)
			}
		}
		rk.Segments = static
		f.static[q] = append(f.static[q][:0], static...)
	}
	return nil
}

// Rebalance is rank r's phase 2: its segments become its own share of its
// dynamic experts and the chunks it computes for others, whose rows,
// probabilities and expert weights it receives after its own rows.
func (f *FEPLB) Rebalance(r int) error {
	if err := f.c.plan(); err != nil {
		return err
	}
	t0 := time.Now()
	rk, h, L := f.ranks[r], f.c.shape.Hidden, f.c.shape.LocalExperts()
	rk.Segments = rk.Segments[:0]
	f.c.ownDynamic(r, func(e, start, n int) {
		rk.Segments = append(rk.Segments, dispatchers.Segment{Expert: e, Start: start, Len: n})
	})
	in := f.c.lay.in[r]
	for len(f.weights[r]) < len(in) {
		f.weights[r] = append(f.weights[r], dispatchers.ExpertWeights{})
	}
	rk.ExpertX, rk.ExpertProbs = rk.ExpertX[:f.own[r]*h], rk.ExpertProbs[:f.own[r]]
	S := 0
	if rk.ExpertScales != nil { // fp8, mxfp8: the e4m3 rows move with their scales (the owner has not dequantized them: its static experts' rows only)
		S = dispatchers.ScaleWidth(f.env.Precision, h)
		rk.ExpertScales = rk.ExpertScales[:f.own[r]*S]
	}
	xb, sb := int64(2), int64(0) // bytes a row element and a scale move as: bf16; e4m3 and the precision's scale
	if S > 0 {
		xb, sb = 1, (dispatchers.RowBytes(f.env.Precision, h)-int64(h))/int64(S)
	}
	for i, c := range in {
		own := f.ranks[c.owner]
		rk.ExpertX = append(rk.ExpertX, own.ExpertX[c.src*h:(c.src+c.n)*h]...)
		f.issued += xb * int64(c.n*h)
		if S > 0 {
			rk.ExpertScales = append(rk.ExpertScales, own.ExpertScales[c.src*S:(c.src+c.n)*S]...)
			f.issued += sb * int64(c.n*S)
		}
		rk.ExpertProbs = append(rk.ExpertProbs, own.ExpertProbs[c.src:c.src+c.n]...)
		f.issued, f.issuedRows = f.issued+4*int64(c.n), f.issuedRows+c.n
		w, src := &f.weights[r][i], own.Experts[c.expert-c.owner*L]
		if src.Q1 != nil { // fp8, the FP8 GEMM's weights: e4m3 codes and 128×128 multipliers (the bf16 ones move in combine-bwd)
			w.Q1, w.Q2 = append(w.Q1[:0], src.Q1...), append(w.Q2[:0], src.Q2...)
			w.S1, w.S2 = append(w.S1[:0], src.S1...), append(w.S2[:0], src.S2...)
			if FP8Fault == "scale-offset" { // tests: the home copy's multipliers read one float off (each block the next block's)
				copy(w.S1, src.S1[1:])
				copy(w.S2, src.S2[1:])
			}
			if FP8Fault == "unmoved" { // tests: the e4m3 weights not moved (the helper's slots hold nothing)
				clear(w.Q1)
				clear(w.Q2)
			}
			w.FC1, w.FC2 = w.FC1[:0], w.FC2[:0]
		} else {
			w.FC1, w.FC2 = append(w.FC1[:0], src.FC1...), append(w.FC2[:0], src.FC2...)
			if FP8Fault == "unmoved" { // tests: the weights not moved (mxfp8's helpers quantize what they hold)
				clear(w.FC1)
				clear(w.FC2)
			}
		}
		// the weights as they move: e4m3 codes, fp32 multipliers, bf16
		f.issued += int64(len(w.Q1)+len(w.Q2)) + 4*int64(len(w.S1)+len(w.S2)) + 2*int64(len(w.FC1)+len(w.FC2))
		rk.Segments = append(rk.Segments, dispatchers.Segment{Expert: c.expert, Start: f.own[r] + c.dst, Len: c.n, Weights: w})
	}
	f.copied += time.Since(t0).Seconds()
	return nil
}

// Combine returns the helpers' outputs of rank r's moved chunks into its
// expert output, then runs the base combine.
func (f *FEPLB) Combine(r int) error {
	t0 := time.Now()
	rk, h := f.ranks[r], f.c.shape.Hidden
	for _, c := range f.c.lay.out[r] {
		at := f.own[c.helper] + c.dst
		f.issued += 2 * int64(copy(rk.ExpertY[c.src*h:(c.src+c.n)*h], f.ranks[c.helper].ExpertY[at*h:(at+c.n)*h])) // bf16
	}
	f.copied += time.Since(t0).Seconds()
	return f.ph.Combine(r)
}

// RebalanceStats is the last step's rebalance.
func (f *FEPLB) RebalanceStats() dispatchers.RebalanceStats {
	s := f.c.stats
	s.CopySeconds, s.CopyMethod = f.copied, "host memory copies (no copy engines)"
	s.BackwardCopyBytes, s.WGradBytes, s.BackwardCopySeconds = f.back.bytes, f.back.wgrad, f.back.seconds
	s.Exposed, s.ExposedNote = math.NaN(), "not measured: the host device runs the copies in their own phase, after the static experts"
	return s
}

// Issued is the last step's forward phase 2 as it was copied, not as
// planned: the bytes of what was copied, each element at the size it moves
// as (rows bf16, or e4m3 with their scales; fp32 probabilities; the
// weights: bf16, or e4m3 codes and fp32 multipliers; bf16 outputs back),
// and the rows moved. As the device's (Device.Issued), with no padding.
func (f *FEPLB) Issued() (bytes int64, rows int) { return f.issued, f.issuedRows }

// FP8Unavailable: FEPLB moves what its base dispatcher delivered, e4m3
// rows with their scales at fp8 (the base's own FP8 path was checked when
// it was made); combine bf16.
func (f *FEPLB) FP8Unavailable(dispatchers.Env) string { return "" }

// MXFP8Unavailable: at mxfp8 as at fp8, FEPLB moves what its base
// delivered, e4m3 rows with their E8M0 scales (h/32 a row); the base's own
// MXFP8 path was checked when it was made (over alltoall: yes; a base
// without one makes feplb unavailable with the base's reason).
func (f *FEPLB) MXFP8Unavailable(dispatchers.Env) string { return "" }

// Pause makes the following steps move nothing (or resumes moving).
func (f *FEPLB) Pause(paused bool) { f.c.paused = paused }

// Footprint adds the helper's weight copies to the base's buffers.
func (f *FEPLB) Footprint(r int) int64 {
	n := int64(0)
	for _, w := range append(f.weights[r], f.grads[r]...) {
		n += 4*int64(cap(w.FC1)+cap(w.FC2)) + int64(cap(w.Q1)+cap(w.Q2)) + 4*int64(cap(w.S1)+cap(w.S2))
	}
	return n + f.Dispatcher.Footprint(r)
}

// Forward is the base's steps with phase 2 after the static experts:
// permute, dispatch, experts, rebalance, dynamic, combine, unpermute.
func (f *FEPLB) Forward(experts func(rank int) error) []dispatchers.Step {
	return forward(experts, f.Permute, f.Dispatch, f.Rebalance, f.Combine, f.ph.Unpermute)
}

// Backward is their duals in the reverse order (backward.go).
func (f *FEPLB) Backward(experts func(rank int) error) []dispatchers.Step {
	return backward(experts, f.UnpermuteBackward, f.CombineBackward, f.RebalanceBackward, f.DispatchBackward, f.PermuteBackward)
}

// Capabilities: fp8 as its base moves it, and the rebalance.
func (f *FEPLB) Capabilities() dispatchers.Capabilities {
	return dispatchers.Capabilities{FP8: f.FP8Unavailable, MXFP8: f.MXFP8Unavailable, Rebalance: &dispatchers.Rebalance{Stats: f.RebalanceStats, Pause: f.Pause}}
}

// fp8Held says whether the ranks' experts carry the FP8 GEMM's weights
// (ExpertWeights.Q1: the layer runs the FP8 GEMM at fp8), which phase 2
// then moves instead of the bf16 ones.
func fp8Held(ranks []*dispatchers.Rank) bool {
	for _, rk := range ranks {
		if len(rk.Experts) > 0 && rk.Experts[0].Q1 != nil {
			return true
		}
	}
	return false
}
