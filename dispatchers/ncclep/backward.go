package ncclep

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels/device"
)

// The high-throughput mode's backward: NCCL EP's own, each call the dual
// of the forward's and over the forward's handle (nccl_ep.h: the handle
// "maintains state for … dispatch and combine pairs for forward and
// (optionally) backward passes"; pass_direction NCCL_EP_BWD_PASS):
//
//	combine-bwd   ncclEpDispatch BWD: each rank's output gradients DY
//	              [tokens, hidden] into the slots the forward's dispatch
//	              filled, over the handle's cached routing (no routing
//	              weights in or out, no update, no count read back), into
//	              ExpertDY [max_recv_tokens_per_rank, hidden]
//	dispatch-bwd  ncclEpCombine BWD: the slots' input gradients ExpertDX
//	              and their probability gradients ExpertDProbs
//	              (expert-major: 1D, one a slot) back to the tokens' ranks:
//	              each token's rows summed into DX (bf16), its k
//	              probability gradients into DProbs [tokens, topk], in the
//	              forward's k order (the library scatters them back by the
//	              handle's topk_idx)
//
// The low-latency mode has none (pass_direction is high-throughput only:
// the library refuses BWD there with ncclInvalidUsage).

// backwardDetail is what Library says of the backward.
const backwardDetail = "backward: ncclEpDispatch and ncclEpCombine with pass_direction BWD over the forward's handle " +
	"(the output gradients to the forward's slots; the input gradients and, as the combine's topk_weights, the probability gradients back to the tokens)"

// Backward is the forward's steps' duals in reverse order, in the mode
// that has a backward (the high-throughput one); nil in the other, whose
// Capabilities say why.
func (d *Device) Backward(experts func(rank int) error) []dispatchers.Step {
	if d.m.noBackward != "" {
		return nil
	}
	return dispatchers.FusedBackward(d.combineBackward, experts, d.dispatchBackward)
}

// combineBackward: rank r's gradient buffers (DX, DProbs and ExpertDY, the
// last at the receive buffer's size, as the forward's dispatch output),
// then ncclEpDispatch BWD of its output gradients.
func (d *Device) combineBackward(r int) error {
	s, rk, sh := &d.st[r], d.ranks[r], d.shape
	T, h, k := int64(sh.Tokens), int64(sh.Hidden), int64(sh.TopK)
	if rk.DY == 0 {
		return fmt.Errorf("%s: combine-bwd on rank %d: no output gradient DY (the layer sets it before the backward)", d.m.dispatcher, r)
	}
	if rk.DX == 0 {
		n, err := device.Resize(rk.Dev, 1, device.RowBuffer{P: &rk.DX, PerRow: 2 * T * h}, device.RowBuffer{P: &rk.DProbs, PerRow: 4 * T * k},
			device.RowBuffer{P: &rk.ExpertDY, PerRow: 2 * int64(d.rows) * h})
		if err != nil {
			return err
		}
		s.gradBytes = n
	}
	s.backward = true
	return d.timed(r, dispatchers.BackwardName("combine"), "ncclEpDispatch (BWD)", func() error {
		return d.ep.DispatchHTBackward(r, rk.DY, sh.Tokens, sh.Hidden, rk.ExpertDY, d.rows)
	})
}

// dispatchBackward: ncclEpCombine BWD of rank r's slots' input and
// probability gradients into DX and DProbs.
func (d *Device) dispatchBackward(r int) error {
	rk, sh := d.ranks[r], d.shape
	return d.timed(r, dispatchers.BackwardName("dispatch"), "ncclEpCombine (BWD)", func() error {
		return d.ep.CombineHTBackward(r, rk.ExpertDX, rk.ExpertDProbs, rk.Rows(), sh.Hidden, rk.DX, rk.DProbs, sh.Tokens, sh.TopK)
	})
}

// ranBackward says whether the last step ran the backward on this
// process's ranks.
func (d *Device) ranBackward() bool {
	for r := range d.st {
		if d.st[r].backward {
			return true
		}
	}
	return false
}
