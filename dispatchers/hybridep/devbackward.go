package hybridep

import "github.com/moebench/moebench/dispatchers"

// The backward on device ranks: the host backward's duals (backward.go)
// as the forward's kernels in their backward forms (hybridep.cu's *_bwd
// entry points), over the forward's routing map and preprocessing (no
// all-gather, no preprocessing, no host wait: the forward's metadata and
// counts stay in each rank's buffers).
//
//	combine-bwd   per GPU, with several domains he_pack_bwd and the
//	              inter-domain exchange of the output gradients (rows
//	              alone), then he_dispatch_bwd: DY's rows through the
//	              forward's fan-out into the receive rows, and each rank's
//	              permute of them into ExpertDY at the forward's rows
//	dispatch-bwd  per GPU, he_combine_bwd (with several domains stage 1,
//	              the exchange of the pre-reduced rows and their
//	              probability gradients, stage 2): ExpertDX summed with the
//	              forward combine's rounding points and order into DX,
//	              ExpertDProbs carried home (fp32) into DProbs

// Backward is the forward's steps' duals in reverse order; allgather and
// preprocess have none.
func (d *Device) Backward(experts func(rank int) error) []dispatchers.Step {
	return dispatchers.FusedBackward(d.last(d.combineBackward), experts, d.last(d.dispatchBackward))
}

// combineBackward sizes part p's ranks' gradient buffers (DX and DProbs
// once, ExpertDY to the forward's rows) and dispatches the output
// gradients.
func (d *Device) combineBackward(p *part) error {
	for r := p.first; r < p.first+p.count; r++ {
		if err := d.ranks[r].HoldGrads(d.shape, &d.st[r].gradsFixed, &d.st[r].grads); err != nil {
			return err
		}
	}
	if p == &d.parts[0] { // one part's thread writes it (allgather resets it on the same)
		d.backward = true
	}
	return d.dispatchOf(p, true)
}

// dispatchBackward combines the input and probability gradients home.
func (d *Device) dispatchBackward(p *part) error { return d.combineOf(p, true) }
