package deepep

import (
	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
)

// The backward, as Megatron's flex dispatcher runs it over DeepEP (its
// fused dispatch's and combine's autograd functions): the combine's
// backward is DeepEP's dispatch of the output gradients with the forward's
// handle — each token's gradient row goes once to each rank holding any of
// its experts, through the same channels and queues, to the receive row
// the forward gave it — and the expansion to the token's copies there (the
// backward of the local sum the forward's combine fused into its send);
// the dispatch's backward is DeepEP's combine of the copies' input
// gradients (each expert rank's float32 sum of a token's copies rounded to
// bf16: the permute's backward fused into the send) and of their
// probability gradients (topk_weights, k fp32 values a token, 0 off the
// rank), summed at home in float32 in ascending rank order; the input
// gradient is then rounded to bf16 once. Layout and notify have no
// backward: their counts and the handle are the forward's.

// Backward is the forward's steps' duals in reverse order.
func (h *Host) Backward(experts func(rank int) error) []dispatchers.Step {
	return dispatchers.FusedBackward(h.CombineBackward, experts, h.DispatchBackward)
}

// CombineBackward is rank r's receive side of the output gradients' dispatch
// (into its receive buffer, whose token rows the forward's permute has
// consumed), then each received row copied to its copies' rows of
// ExpertDY.
func (h *Host) CombineBackward(r int) error {
	s, rk, sh := &h.st[r], h.ranks[r], h.shape
	k, hd := sh.TopK, sh.Hidden
	if err := dispatchers.CheckOutputGrads(Name, r, sh, h.ranks); err != nil {
		return err
	}
	if err := h.transfer(r, "combine-bwd", func(src int) []float32 { return h.ranks[src].DY }, s.recvX, false); err != nil {
		return err
	}
	rk.ExpertDY = kernels.Reslice(rk.ExpertDY, len(rk.ExpertProbs)*hd)
	for i := range s.recv {
		for _, p := range s.permRow[i*k : (i+1)*k] {
			if p >= 0 {
				copy(rk.ExpertDY[int(p)*hd:(int(p)+1)*hd], s.recvX[i*hd:(i+1)*hd])
			}
		}
	}
	h.backward = true
	return nil
}

// DispatchBackward is home rank r's side of the input and probability
// gradients' combine, into DX (rounded to bf16 once) and DProbs.
func (h *Host) DispatchBackward(r int) error {
	rk, sh := h.ranks[r], h.shape
	if err := dispatchers.CheckExpertGrads(Name, r, sh, h.ranks); err != nil {
		return err
	}
	rk.DX = kernels.Reslice(rk.DX, sh.Tokens*sh.Hidden)
	rk.DProbs = kernels.Reslice(rk.DProbs, sh.Tokens*sh.TopK)
	err := h.reduce(r, "dispatch-bwd", func(d int) []float32 { return h.ranks[d].ExpertDX },
		func(d int) []float32 { return h.ranks[d].ExpertDProbs }, rk.DX, rk.DProbs)
	kernels.RoundBF16Slice(rk.DX)
	return err
}
