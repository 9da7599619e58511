package alltoall

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
)

// The backward (Megatron's alltoall dispatcher under autograd): each phase
// is the dual of a forward phase, over the forward's counts, offsets and
// slots (no count exchange, no host sync). It reuses the forward's
// buffers, free once the forward is done: the permuted send buffers carry
// the copies' gradients, the receive buffers the exchanges'.

// UnpermuteBackward gives each of rank r's permuted copies its token's
// output gradient, in the forward's send order.
func (a *A2A) UnpermuteBackward(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	if len(rk.DY) != sh.Tokens*sh.Hidden {
		return fmt.Errorf("alltoall: rank %d: output gradient has %d values, want tokens × hidden = %d", r, len(rk.DY), sh.Tokens*sh.Hidden)
	}
	kernels.UnpermuteBackward(s.permY, rk.DY, s.slots, sh.TopK, sh.Hidden)
	return nil
}

// CombineBackward is rank r's receive side of the combine reversed: every
// source's copies' output gradients through the all-to-all in the dispatch
// direction, then the chunk sort, into ExpertDY (the rows of ExpertX).
func (a *A2A) CombineBackward(r int) error {
	s, rk := &a.st[r], a.ranks[r]
	n, h := a.received(r), a.shape.Hidden
	s.recvY = kernels.Reslice(s.recvY, n*h)
	rk.ExpertDY = kernels.Reslice(rk.ExpertDY, n*h)
	a.deliver(r, h, s.recvY, rk.ExpertDY, func(ss *state) []float32 { return ss.permY })
	a.backward = true
	return nil
}

// DispatchBackward is rank r's send side of the dispatch reversed: the
// inverse chunk sort of its rows' input and probability gradients, then the
// two all-to-alls in the combine direction (bf16 rows, fp32 probability
// gradients, as the forward's carried the rows and probabilities) into the
// sources' permuted buffers.
func (a *A2A) DispatchBackward(r int) error {
	s, rk := &a.st[r], a.ranks[r]
	n, h := a.received(r), a.shape.Hidden
	if len(rk.ExpertDX) < n*h || len(rk.ExpertDProbs) < n {
		return fmt.Errorf("alltoall: rank %d: expert input gradients hold %d values and %d probabilities, want %d rows", r, len(rk.ExpertDX), len(rk.ExpertDProbs), n)
	}
	s.recvX, s.recvP = kernels.Reslice(s.recvX, n*h), kernels.Reslice(s.recvP, n)
	a.giveBack(r, h, rk.ExpertDX, s.recvX, func(ss *state) []float32 { return ss.permX })
	a.giveBack(r, 1, rk.ExpertDProbs, s.recvP, func(ss *state) []float32 { return ss.permP })
	return nil
}

// PermuteBackward sums each token's k copies' input gradients into DX
// (float32, rounded to bf16 once, B5) and places each copy's probability
// gradient at its slot of DProbs.
func (a *A2A) PermuteBackward(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	rk.DX = kernels.Reslice(rk.DX, sh.Tokens*sh.Hidden)
	rk.DProbs = kernels.Reslice(rk.DProbs, sh.Tokens*sh.TopK)
	kernels.PermuteBackward(rk.DX, s.permX, s.slots, sh.TopK, sh.Hidden, kernels.RoundBF16Slice)
	kernels.PermuteBackward(rk.DProbs, s.permP, s.slots, 1, 1, nil)
	return nil
}

// backwardTraffic adds the backward's bytes to tr (the forward's, from the
// same rows): the combine's backward moves each copy's bf16 output gradient
// the dispatch's way, the dispatch's backward its bf16 input gradient and
// fp32 probability gradient the combine's way.
func backwardTraffic(tr *dispatchers.Traffic, h int) {
	row := int64(h) * 2
	copies, off := tr.CombineLogical/row, tr.CombineOffRank/row
	cb, db := kernels.GradRowBytes(h)
	tr.CombineBackwardOffRank, tr.CombineBackwardLogical = off*cb, copies*cb
	tr.DispatchBackwardOffRank, tr.DispatchBackwardLogical = off*db, copies*db
	tr.BackwardFormula = "combine-bwd = copies × hidden×2 B bf16 output gradient; dispatch-bwd = copies × (hidden×2 B bf16 input gradient + 4 B fp32 probability gradient); the forward's copies, off-rank excluding a rank's own"
}
