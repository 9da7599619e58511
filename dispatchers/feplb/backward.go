package feplb

import (
	"fmt"
	"time"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
)

// The backward on the host device: phase 1's is the base dispatcher's;
// phase 2 runs in reverse around the expert backward (Backward's
// order): the combine's backward sends each helper the output gradients of
// the rows it computed (the dual of the outputs' way back), dynamic-bwd
// runs each rank's backward of the work it computed in the forward's
// dynamic phase — the helpers their chunks, with the tape they kept and
// the weights they were sent —, rebalance-bwd returns the chunks' input
// and probability gradients (the dual of the tokens' way out) and each
// helper's fp32 weight gradients of the owner's expert, which the owner
// adds to its main_grad (only the order of the float32 sums differs from
// one rank computing every row), and experts-bwd runs the static experts'
// backward. The copies are memory copies in their own phases, as the
// forward's; whether the returns hide behind the owner's own expert
// backward is a device matter.

// base returns the base dispatcher's backward, or why it has none.
func (f *FEPLB) base() (classic, error) {
	if !f.ph.hasBackward {
		return classic{}, fmt.Errorf("feplb: base dispatcher %s has no backward", f.Dispatcher.Name())
	}
	return f.ph, nil
}

// UnpermuteBackward is the base's.
func (f *FEPLB) UnpermuteBackward(r int) error {
	b, err := f.base()
	if err != nil {
		return err
	}
	if r == 0 {
		f.back = backStats{}
	}
	return b.UnpermuteBackward(r)
}

// CombineBackward runs the base's, then moves the output gradients of the
// rows moved in the forward between rank r and its helpers and owners:
// as an owner r sends a helper's rows once the helper's gradient buffer
// is laid out (helpers before r), as a helper r takes its rows from owners
// whose gradients are complete (owners before r) — so every moved row
// reaches its helper whatever the order of the ranks. It then gives r's
// dynamic segments their weight gradients' place (zeroed).
func (f *FEPLB) CombineBackward(r int) error {
	b, err := f.base()
	if err != nil {
		return err
	}
	if err := b.CombineBackward(r); err != nil {
		return err
	}
	t0 := time.Now()
	h, rk := f.c.shape.Hidden, f.ranks[r]
	if n := (f.own[r] + f.c.lay.foreign[r]) * h; len(rk.ExpertDY) < n { // r's rows computed for others, after its own
		rk.ExpertDY = append(rk.ExpertDY, make([]float32, n-len(rk.ExpertDY))...)
	} else {
		rk.ExpertDY = rk.ExpertDY[:n]
	}
	send := func(c chunk) {
		from, to := f.ranks[c.owner].ExpertDY, f.ranks[c.helper].ExpertDY
		at := f.own[c.helper] + c.dst
		copy(to[at*h:(at+c.n)*h], from[c.src*h:(c.src+c.n)*h])
		f.back.bytes += int64(c.n) * int64(h) * 2
	}
	for _, c := range f.c.lay.out[r] {
		if c.helper < r {
			send(c)
		}
	}
	for _, c := range f.c.lay.in[r] {
		if c.owner < r {
			send(c)
		}
	}
	f.back.seconds += time.Since(t0).Seconds()
	return f.dynamicGrads(r)
}

// dynamicGrads makes rank r's segments its forward dynamic phase's — its
// share of its own dynamic experts, then the chunks it computes for others
// with the weights it was sent (at fp8, where the forward sent the FP8
// GEMM's e4m3 weights, the bf16 ones now, for the bf16 backward) — each
// chunk with a zeroed buffer for its weight gradients.
func (f *FEPLB) dynamicGrads(r int) error {
	rk, L := f.ranks[r], f.c.shape.LocalExperts()
	in := f.c.lay.in[r]
	for len(f.grads[r]) < len(in) {
		f.grads[r] = append(f.grads[r], dispatchers.ExpertWeights{})
	}
	rk.Segments = rk.Segments[:0]
	f.c.ownDynamic(r, func(e, start, n int) {
		rk.Segments = append(rk.Segments, dispatchers.Segment{Expert: e, Start: start, Len: n})
	})
	for i, c := range in {
		src := f.ranks[c.owner].Experts[c.expert-c.owner*L]
		if w := &f.weights[r][i]; src.Q1 != nil {
			t0 := time.Now()
			w.FC1, w.FC2 = append(w.FC1[:0], src.FC1...), append(w.FC2[:0], src.FC2...)
			f.back.bytes += 2 * int64(len(src.FC1)+len(src.FC2)) // bf16
			f.back.seconds += time.Since(t0).Seconds()
		}
		g := &f.grads[r][i]
		g.FC1, g.FC2 = kernels.Reslice(g.FC1, len(src.FC1)), kernels.Reslice(g.FC2, len(src.FC2))
		clear(g.FC1)
		clear(g.FC2)
		rk.Segments = append(rk.Segments, dispatchers.Segment{Expert: c.expert, Start: f.own[r] + c.dst, Len: c.n, Weights: &f.weights[r][i], Grads: g})
	}
	return nil
}

// RebalanceBackward is owner r's side of phase 2's return: each moved
// chunk's input and probability gradients from its helper into r's rows,
// and the helper's weight gradients of r's expert added to r's main_grad;
// then r's segments become its static experts' again.
func (f *FEPLB) RebalanceBackward(r int) error {
	t0 := time.Now()
	rk, sh := f.ranks[r], f.c.shape
	h, L := sh.Hidden, sh.LocalExperts()
	for _, c := range f.c.lay.out[r] {
		hr, at := f.ranks[c.helper], f.own[c.helper]+c.dst
		copy(rk.ExpertDX[c.src*h:(c.src+c.n)*h], hr.ExpertDX[at*h:(at+c.n)*h])
		copy(rk.ExpertDProbs[c.src:c.src+c.n], hr.ExpertDProbs[at:at+c.n])
		i := chunkIndex(f.c.lay.in[c.helper], c)
		if i < 0 {
			return fmt.Errorf("feplb: rebalance-bwd on rank %d: rank %d does not list the chunk of expert %d it computed", r, c.helper, c.expert)
		}
		g, own := f.grads[c.helper][i], rk.ExpertGrads[c.expert-r*L]
		addTo(own.FC1, g.FC1)
		addTo(own.FC2, g.FC2)
		wg := kernels.ExpertWGradBytes(h, f.env.FFN)
		f.back.bytes += int64(c.n)*(int64(h)*2+4) + wg
		f.back.wgrad += wg
	}
	rk.Segments = append(rk.Segments[:0], f.static[r]...)
	f.back.seconds += time.Since(t0).Seconds()
	return nil
}

// chunkIndex is c's place in a helper's incoming chunks, or −1.
func chunkIndex(in []chunk, c chunk) int {
	for i, x := range in {
		if x == c {
			return i
		}
	}
	return -1
}

// addTo adds x to y (fp32, as main_grad accumulates).
func addTo(y, x []float32) {
	for i, v := range x {
		y[i] += v
	}
}

// DispatchBackward is the base's: the rows r received in phase 1 hold
// every gradient now.
func (f *FEPLB) DispatchBackward(r int) error {
	b, err := f.base()
	if err != nil {
		return err
	}
	return b.DispatchBackward(r)
}

// PermuteBackward is the base's.
func (f *FEPLB) PermuteBackward(r int) error {
	b, err := f.base()
	if err != nil {
		return err
	}
	return b.PermuteBackward(r)
}

// backStats is what the last step's backward moved in phase 2.
type backStats struct {
	bytes, wgrad int64
	seconds      float64
}
