package feplb

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// The backward on device ranks (the host's, backward.go, with phase 2's
// copies on the copy streams): phase 1's backward is the base device
// dispatcher's; in combine-bwd each owner's copy stream pushes the output
// gradients of its moved chunks (once its base combine-bwd has written
// them) into the helpers' rows that held the chunks' outputs — the dual
// of the forward combine's pull — and each helper zeroes its fp32
// weight-gradient buffers; dynamic-bwd computes each rank's forward
// dynamic work backward — a helper its chunks, each owner's once that
// owner's pushes have landed, with the tape and weights it kept, their
// weight gradients into its own buffers, then its own dynamic share; in
// rebalance-bwd each owner's copy stream pulls its chunks' input and
// probability gradients into its rows and the helpers' weight gradients
// of its experts into buffers of its own, while its stream goes on with
// its static experts' backward (experts-bwd); dispatch-bwd waits for those
// copies, adds the weight gradients to the owner's main_grad (fp32) and
// runs the base's. Every rank's calls touch its own streams and state
// only; what another rank recorded is waited for a phase later (the
// layer's barrier between phases).

// devBack is one rank's backward phase-2 state.
type devBack struct {
	// dyReady: the owner's base combine-bwd done (its ExpertDY written);
	// dyStart, dyIn: its pushes of its moved chunks' output gradients;
	// computed: a helper's chunks' backward done; retStart, returned: the
	// owner's pulls of input, probability and weight gradients
	dyReady, dyStart, dyIn, computed, retStart, returned device.Event

	dx, dp device.Addr        // the chunks' input and probability gradients (helper): [rows, h] bf16, [rows] fp32
	g1, g2 device.Addr        // their weight gradients (helper): [slots, 2f, h], [slots, h, f] fp32
	w1, w2 device.Addr        // the helpers' weight gradients returned (owner): [chunks, 2f, h], [chunks, h, f] fp32
	rows   device.RowCapacity // dx, dp
	slots  device.RowCapacity // g1, g2
	back   device.RowCapacity // w1, w2
	ran    bool               // a backward ran on the rank
	segs   []dispatchers.DeviceSegment
	work   []dispatchers.DeviceWork
	ops    []device.CopyOp
}

// baseBackward is the base device dispatcher's backward, or why it has
// none.
func (f *Device) baseBackward() (classic, error) {
	if !f.ph.hasBackward {
		return classic{}, fmt.Errorf("feplb: base dispatcher %s has no backward on the device", f.DeviceDispatcher.Name())
	}
	return f.ph, nil
}

// UnpermuteBackward is the base's.
func (f *Device) UnpermuteBackward(r int) error {
	b, err := f.baseBackward()
	if err != nil {
		return err
	}
	f.bk[r].ran = true
	return b.UnpermuteBackward(r)
}

// CombineBackward runs the base's; then, as an owner, rank r's copy stream
// pushes its moved chunks' output gradients to their helpers, and, as a
// helper, r zeroes its chunks' weight gradients and sets its work to its
// forward dynamic work with those gradients: each owner's chunks after
// that owner's pushes (dyIn, recorded in this phase, waited for in the
// next), then its own share.
func (f *Device) CombineBackward(r int) error {
	b, err := f.baseBackward()
	if err != nil {
		return err
	}
	if err := b.CombineBackward(r); err != nil {
		return err
	}
	if err := f.pushGradients(r); err != nil {
		return err
	}
	rk, s, bk := f.ranks[r], &f.rs[r], &f.bk[r]
	sh, ff := f.c.shape, int64(f.env.FFN)
	h := int64(sh.Hidden)
	in := f.c.lay.in[r]
	own := dispatchers.DeviceWork{X: rk.ExpertX, Probs: rk.ExpertProbs, Segments: s.segs[1]}
	bk.work, bk.segs = bk.work[:0], bk.segs[:0]
	if len(in) > 0 {
		if err := bk.rows.Ensure(rk.Dev, rk.Stream, f.c.lay.foreign[r], device.RowBuffer{P: &bk.dx, PerRow: 2 * h}, device.RowBuffer{P: &bk.dp, PerRow: 4}); err != nil {
			return err
		}
		if err := bk.slots.Ensure(rk.Dev, rk.Stream, len(in), device.RowBuffer{P: &bk.g1, PerRow: 8 * ff * h}, device.RowBuffer{P: &bk.g2, PerRow: 4 * h * ff}); err != nil {
			return err
		}
		if err := rk.Dev.Fill16(bk.g1, 0, int64(len(in))*4*ff*h, rk.Stream); err != nil {
			return err
		}
		if err := rk.Dev.Fill16(bk.g2, 0, int64(len(in))*2*h*ff, rk.Stream); err != nil {
			return err
		}
		for i := range in {
			fg := s.segs[2][i]
			fg.DFC1, fg.DFC2 = bk.g1+device.Addr(int64(i)*8*ff*h), bk.g2+device.Addr(int64(i)*4*h*ff)
			bk.segs = append(bk.segs, fg)
		}
		for i, first := range in { // a block per run of one owner's chunks
			if i > 0 && first.owner == in[i-1].owner {
				continue
			}
			j := i + 1
			for j < len(in) && in[j].owner == first.owner {
				j++
			}
			bk.work = append(bk.work, dispatchers.DeviceWork{X: s.fx, Probs: s.fp, DY: s.fy, DX: bk.dx, DProbs: bk.dp, Segments: bk.segs[i:j],
				After: f.bk[first.owner].dyIn})
		}
		bk.work[len(bk.work)-1].Done = bk.computed
	}
	bk.work = append(bk.work, own)
	rk.Work = bk.work
	return nil
}

// pushGradients queues owner r's pushes of its moved chunks' output
// gradients (the rows of its ExpertDY its base combine-bwd wrote) into
// their helpers' rows that held the chunks' outputs, on r's copy stream.
func (f *Device) pushGradients(r int) error {
	out := f.c.lay.out[r]
	if len(out) == 0 {
		return nil
	}
	rk, s, bk := f.ranks[r], &f.rs[r], &f.bk[r]
	h := int64(f.c.shape.Hidden)
	if err := rk.Dev.Record(bk.dyReady, rk.Stream); err != nil {
		return err
	}
	if err := rk.Dev.Wait(s.ce, bk.dyReady); err != nil {
		return err
	}
	if err := rk.Dev.Record(bk.dyStart, s.ce); err != nil {
		return err
	}
	bk.ops = bk.ops[:0]
	ff, L := int64(f.env.FFN), f.c.shape.LocalExperts()
	for _, c := range out {
		to := f.ranks[c.helper].Dev
		bk.ops = append(bk.ops, device.CopyOp{Dst: f.rs[c.helper].fy + device.Addr(2*int64(c.dst)*h), Src: rk.ExpertDY + device.Addr(2*int64(c.src)*h),
			Bytes: 2 * int64(c.n) * h, DstDev: to})
		if f.fp8w { // the forward moved the FP8 GEMM's e4m3 weights: the bf16 backward needs the bf16 ones
			j := chunkIndex(f.c.lay.in[c.helper], c)
			if j < 0 {
				return fmt.Errorf("feplb: combine-bwd on rank %d: rank %d does not list the chunk of expert %d", r, c.helper, c.expert)
			}
			le, hs := int64(c.expert-r*L), &f.rs[c.helper]
			if hs.w1 == 0 {
				return fmt.Errorf("feplb: combine-bwd on rank %d: rank %d has no bf16 weight slots (bound without a backward: DeviceRank.DFC1 unset)", r, c.helper)
			}
			bk.ops = append(bk.ops,
				device.CopyOp{Dst: hs.w1 + device.Addr(int64(j)*4*ff*h), Src: rk.FC1 + device.Addr(le*4*ff*h), Bytes: 4 * ff * h, DstDev: to},
				device.CopyOp{Dst: hs.w2 + device.Addr(int64(j)*2*h*ff), Src: rk.FC2 + device.Addr(le*2*h*ff), Bytes: 2 * h * ff, DstDev: to})
		}
	}
	if err := rk.Dev.CopyBatch(bk.ops, s.ce); err != nil {
		return fmt.Errorf("feplb: rank %d's output gradients out: %w", r, err)
	}
	return rk.Dev.Record(bk.dyIn, s.ce)
}

// RebalanceBackward is owner r's side of phase 2's return: its copy stream
// pulls each moved chunk's input and probability gradients into r's rows
// and the helper's weight gradients of r's expert into r's buffers, once
// the helper has computed them; r's work becomes its static experts'.
func (f *Device) RebalanceBackward(r int) error {
	rk, s, bk := f.ranks[r], &f.rs[r], &f.bk[r]
	bk.work = append(bk.work[:0], dispatchers.DeviceWork{X: rk.ExpertX, Probs: rk.ExpertProbs, Segments: s.segs[0]})
	rk.Work = bk.work
	out := f.c.lay.out[r]
	if len(out) == 0 {
		return nil
	}
	sh, ff := f.c.shape, int64(f.env.FFN)
	h := int64(sh.Hidden)
	if err := bk.back.Ensure(rk.Dev, s.ce, len(out), device.RowBuffer{P: &bk.w1, PerRow: 8 * ff * h}, device.RowBuffer{P: &bk.w2, PerRow: 4 * h * ff}); err != nil {
		return err
	}
	for i, c := range out {
		if i == 0 || c.helper != out[i-1].helper {
			if err := rk.Dev.Wait(s.ce, f.bk[c.helper].computed); err != nil {
				return err
			}
		}
	}
	if err := rk.Dev.Record(bk.retStart, s.ce); err != nil {
		return err
	}
	bk.ops = bk.ops[:0]
	for i, c := range out {
		hb := &f.bk[c.helper]
		j := chunkIndex(f.c.lay.in[c.helper], c)
		if j < 0 {
			return fmt.Errorf("feplb: rebalance-bwd on rank %d: rank %d does not list the chunk of expert %d it computed", r, c.helper, c.expert)
		}
		from := f.ranks[c.helper].Dev
		bk.ops = append(bk.ops,
			device.CopyOp{Dst: rk.ExpertDX + device.Addr(2*int64(c.src)*h), Src: hb.dx + device.Addr(2*int64(c.dst)*h), Bytes: 2 * int64(c.n) * h, SrcDev: from},
			device.CopyOp{Dst: rk.ExpertDProbs + device.Addr(4*int64(c.src)), Src: hb.dp + device.Addr(4*int64(c.dst)), Bytes: 4 * int64(c.n), SrcDev: from},
			device.CopyOp{Dst: bk.w1 + device.Addr(int64(i)*8*ff*h), Src: hb.g1 + device.Addr(int64(j)*8*ff*h), Bytes: 8 * ff * h, SrcDev: from},
			device.CopyOp{Dst: bk.w2 + device.Addr(int64(i)*4*h*ff), Src: hb.g2 + device.Addr(int64(j)*4*h*ff), Bytes: 4 * h * ff, SrcDev: from})
	}
	if err := rk.Dev.CopyBatch(bk.ops, s.ce); err != nil {
		return fmt.Errorf("feplb: rank %d's gradients back: %w", r, err)
	}
	return rk.Dev.Record(bk.returned, s.ce)
}

// DispatchBackward waits for rank r's returns, adds the helpers' weight
// gradients to r's main_grad (fp32 adds), then runs the base's.
func (f *Device) DispatchBackward(r int) error {
	b, err := f.baseBackward()
	if err != nil {
		return err
	}
	rk, bk := f.ranks[r], &f.bk[r]
	if out := f.c.lay.out[r]; len(out) > 0 {
		if err := rk.Dev.Wait(rk.Stream, bk.returned); err != nil {
			return err
		}
		h, ff, L := int64(f.c.shape.Hidden), int64(f.env.FFN), f.c.shape.LocalExperts()
		for i, c := range out {
			le := int64(c.expert - r*L)
			if err := rk.Dev.AddF32(rk.DFC1+device.Addr(le*8*ff*h), bk.w1+device.Addr(int64(i)*8*ff*h), int(2*ff*h), false, rk.Stream); err != nil {
				return err
			}
			if err := rk.Dev.AddF32(rk.DFC2+device.Addr(le*4*h*ff), bk.w2+device.Addr(int64(i)*4*h*ff), int(h*ff), false, rk.Stream); err != nil {
				return err
			}
		}
	}
	return b.DispatchBackward(r)
}

// PermuteBackward is the base's.
func (f *Device) PermuteBackward(r int) error {
	b, err := f.baseBackward()
	if err != nil {
		return err
	}
	return b.PermuteBackward(r)
}

// backBytes is what the last step's backward moved in phase 2, from its
// layout: each moved chunk's output gradients out (at fp8 where the
// forward moved e4m3 weights, its expert's bf16 weights with them), its
// input and probability gradients and its expert's weight gradients
// (wgrad of them) back.
func (f *Device) backBytes() (bytes, wgrad int64) {
	h, wg := int64(f.c.shape.Hidden), kernels.ExpertWGradBytes(f.c.shape.Hidden, f.env.FFN)
	bf := int64(0)
	if f.fp8w {
		bf = 6 * h * int64(f.env.FFN)
	}
	for _, out := range f.c.lay.out {
		for _, c := range out {
			bytes += int64(c.n)*(4*h+4) + wg + bf
			wgrad += wg
		}
	}
	return bytes, wgrad
}

// backCopySeconds is the last step's backward phase-2 copy time: per rank,
// its pushes of output gradients and its returns, the slowest rank's sum.
func (f *Device) backCopySeconds() (float64, error) {
	most := 0.0
	for r := range f.bk {
		bk, dev, t := &f.bk[r], f.ranks[r].Dev, 0.0
		span := func(a, b device.Event) error {
			ms, err := dev.Elapsed(a, b)
			t += ms / 1e3
			return err
		}
		if len(f.c.lay.out[r]) > 0 {
			if err := span(bk.dyStart, bk.dyIn); err != nil {
				return 0, err
			}
			if err := span(bk.retStart, bk.returned); err != nil {
				return 0, err
			}
		}
		most = max(most, t)
	}
	return most, nil
}
