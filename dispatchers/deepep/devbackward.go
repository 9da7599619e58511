package deepep

import "github.com/moebench/moebench/dispatchers"

// The backward on device ranks: the host backward's duals (backward.go)
// with the forward's kernels over the forward's handle (send_head, the
// channel and rank prefixes, the received order and the permute's maps
// stay in the layout and receive buffers; no count exchange, no host
// wait).
//
//	combine-bwd   one launch per GPU of deepep_notify in its cached form
//	              (DeepEP's cached notify: barriers and the queues'
//	              metadata cleared, counts and counters left as the
//	              forward's), then of deepep_dispatch with the output
//	              gradients DY as its rows, into the receive rows (which the
//	              forward's permute has consumed); then per rank the
//	              permute's gather of those rows into ExpertDY
//	dispatch-bwd  one launch per GPU of deepep_combine carrying the copies'
//	              input gradients ExpertDX (each rank's float32 sum of a
//	              token's copies, rounded to bf16) and each token's k
//	              probability gradients (ExpertDProbs, 0 at slots off the
//	              rank), summed at home in rank order into DX (bf16) and
//	              DProbs

// Backward is the forward's steps' duals in reverse order.
func (d *Device) Backward(experts func(rank int) error) []dispatchers.Step {
	return dispatchers.FusedBackward(d.CombineBackward, experts, d.DispatchBackward)
}

// CombineBackward, in the call of each device's last rank: its ranks'
// gradient buffers sized, the cached notify and the dispatch of the output
// gradients, then each rank's gather into ExpertDY.
func (d *Device) CombineBackward(r int) error {
	g := d.lastOf(r)
	if g == nil {
		return nil
	}
	for q := g.first; q < g.first+g.n; q++ {
		if err := d.ranks[q].HoldGrads(d.shape, &d.st[q].gradsFixed, &d.st[q].grads); err != nil {
			return err
		}
	}
	if err := d.describe(g); err != nil {
		return err
	}
	if g.first == 0 { // one device's thread writes it (Layout resets it on rank 0's)
		d.backward = true
	}
	epoch := g.epoch
	g.epoch += 3
	comm := d.sig.Comm(g.dev, d.timeout)
	if err := d.collective(g, d.col.notify, g.n, comm, int32(g.first), epoch, int32(1), g.desc); err != nil {
		return err
	}
	if err := d.collective(g, d.col.dispatch, g.n*d.cfg.SMs, comm, int32(g.first), int32(1), g.desc); err != nil {
		return err
	}
	for q := g.first; q < g.first+g.n; q++ {
		s, rk := &d.st[q], d.ranks[q]
		if s.tokens == 0 || rk.Rows() == 0 {
			continue
		}
		if err := rk.Dev.GatherRows(rk.ExpertDY, s.recvX, s.order, d.shape.TopK, rk.Rows(), d.shape.Hidden, rk.Stream); err != nil {
			return err
		}
	}
	return nil
}

// DispatchBackward, in the call of each device's last rank: the device's
// descriptors (the layer's ExpertDX and ExpertDProbs) and its combine
// kernels in their backward form, which write DX and DProbs.
func (d *Device) DispatchBackward(r int) error { return d.combine(r, d.col.combineBwd) }
