package hybridep

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
)

// The backward, as Megatron's flex dispatcher runs it over HybridEP: the
// combine's backward is dispatch_with_permute of the output gradients with
// the forward's handle — the routing map all-gathered in the forward and
// its preprocessing are reused, each token's gradient row goes to the same
// receive row of each rank the forward's token went to, over the same
// fan-out and inter-domain path (no probabilities), and is placed at each
// of its local experts' rows; the dispatch's backward is
// combine_with_unpermute of the copies' input gradients, with the forward
// combine's rounding points and order (each expert rank's float32 sum of a
// token's copies rounded to bf16, each remote domain's pre-reduced sum
// rounded to bf16, the home's float32 sum), its rows carrying the domain's
// L·D probability gradients as the forward's dispatch carried the
// probabilities; the home's input gradient is rounded to bf16 once.

// Backward is the forward's steps' duals in reverse order; allgather and
// preprocess have none (their maps are the forward's).
func (h *Host) Backward(experts func(rank int) error) []dispatchers.Step {
	return dispatchers.FusedBackward(h.CombineBackward, experts, h.DispatchBackward)
}

// CombineBackward is rank q's receive side of the output gradients'
// dispatch, into its receive buffer, then each received row copied to its
// copies' rows of ExpertDY (the permute fused, as in the forward).
func (h *Host) CombineBackward(q int) error {
	s, rk, sh := &h.st[q], h.ranks[q], h.shape
	hd, L := sh.Hidden, sh.LocalExperts()
	if q == 0 {
		h.pass++
		h.backward = true
	}
	if err := dispatchers.CheckOutputGrads(Name, q, sh, h.ranks); err != nil {
		return err
	}
	if err := h.fanOut(q); err != nil {
		return err
	}
	rk.ExpertDY = kernels.Reslice(rk.ExpertDY, len(rk.ExpertProbs)*hd)
	for i := range s.recv {
		for _, p := range s.d2e[i*L : (i+1)*L] {
			if p >= 0 {
				copy(rk.ExpertDY[int(p)*hd:(int(p)+1)*hd], s.recvX[i*hd:(i+1)*hd])
			}
		}
	}
	return nil
}

// DispatchBackward is home rank r's side of the input and probability
// gradients' combine, into DX (rounded to bf16 once) and DProbs.
func (h *Host) DispatchBackward(r int) error {
	rk, sh := h.ranks[r], h.shape
	if !h.backward {
		return fmt.Errorf("hybridep: dispatch-bwd on rank %d before the step's combine-bwd", r)
	}
	if err := dispatchers.CheckExpertGrads(Name, r, sh, h.ranks); err != nil {
		return err
	}
	rk.DX = kernels.Reslice(rk.DX, sh.Tokens*sh.Hidden)
	rk.DProbs = kernels.Reslice(rk.DProbs, sh.Tokens*sh.TopK)
	err := h.gather(r, rk.DX, rk.DProbs)
	kernels.RoundBF16Slice(rk.DX)
	return err
}
