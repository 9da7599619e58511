package feplb

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
)

// The backward on device ranks (the host's, backward.go, with phase 2's
// copies on the copy streams): phase 1's backward is the base device
// dispatcher's; in combine-bwd each helper's copy stream pulls the output
// gradients of the chunks it computed from their owners (once the owner's
// base combine-bwd has written them) into the rows that held the chunks'
// outputs; dynamic-bwd computes each rank's forward dynamic work backward —
// a helper its chunks with the tape and weights it kept, their weight
// gradients into fp32 buffers of its own (zeroed on its copy stream
// first), then its own dynamic share; in rebalance-bwd each owner's copy
// stream pulls its chunks' input and probability gradients into its rows
// and the helpers' weight gradients of its experts into buffers of its
// own, while its stream goes on with its static experts' backward
// (experts-bwd); dispatch-bwd waits for those copies, adds the weight
// gradients to the owner's main_grad (fp32) and runs the base's.

// devBack is one rank's backward phase-2 state.
type devBack struct {
	// dyReady: the rank's base combine-bwd done (its ExpertDY written);
	// dyStart, dyIn: the helper's pulls of its chunks' output gradients;
	// computed: its chunks' backward done; retStart, returned: the
	// owner's pulls of input, probability and weight gradients
	dyReady, dyStart, dyIn, computed, retStart, returned kernels.Event

	dx, dp kernels.Ptr   // the chunks' input and probability gradients (helper): [rows, h] bf16, [rows] fp32
	g1, g2 kernels.Ptr   // their weight gradients (helper): [slots, 2f, h], [slots, h, f] fp32
	w1, w2 kernels.Ptr   // the helpers' weight gradients returned (owner): [chunks, 2f, h], [chunks, h, f] fp32
	rows   kernels.Sized // dx, dp
	slots  kernels.Sized // g1, g2
	back   kernels.Sized // w1, w2
	segs   []dispatchers.DeviceSegment
	work   []dispatchers.DeviceWork
}

// baseBackward is the base device dispatcher's backward, or why it has
// none.
func (f *Device) baseBackward() (dispatchers.PhasedBackward, error) {
	b, ok := f.ClassicDevice.(dispatchers.PhasedBackward)
	if !ok {
		return nil, fmt.Errorf("feplb: base dispatcher %s has no backward on the device", f.ClassicDevice.Name())
	}
	return b, nil
}

// UnpermuteBackward is the base's.
func (f *Device) UnpermuteBackward(r int) error {
	b, err := f.baseBackward()
	if err != nil {
		return err
	}
	if r == 0 {
		f.backward, f.back = true, backStats{}
	}
	return b.UnpermuteBackward(r)
}

// CombineBackward runs the base's, then queues on rank r's copy stream the
// pulls of the output gradients of the chunks r computes for others, and
// sets r's work to its forward dynamic work with those gradients.
func (f *Device) CombineBackward(r int) error {
	b, err := f.baseBackward()
	if err != nil {
		return err
	}
	if err := b.CombineBackward(r); err != nil {
		return err
	}
	rk, s, bk := f.ranks[r], &f.rs[r], &f.bk[r]
	if err := rk.Dev.Record(bk.dyReady, rk.Stream); err != nil {
		return err
	}
	sh, ff := f.c.shape, int64(f.env.FFN)
	h := int64(sh.Hidden)
	in := f.c.lay.in[r]
	own := dispatchers.DeviceWork{X: rk.ExpertX, Probs: rk.ExpertProbs, Segments: s.segs[1]}
	bk.work = append(bk.work[:0], own)
	rk.Work = bk.work
	if len(in) > 0 {
		if err := bk.rows.Ensure(rk.Dev, s.ce, f.c.lay.foreign[r], kernels.Buf{P: &bk.dx, PerRow: 2 * h}, kernels.Buf{P: &bk.dp, PerRow: 4}); err != nil {
			return err
		}
		if err := bk.slots.Ensure(rk.Dev, s.ce, len(in), kernels.Buf{P: &bk.g1, PerRow: 8 * ff * h}, kernels.Buf{P: &bk.g2, PerRow: 4 * h * ff}); err != nil {
			return err
		}
	}
	// a helper's pulls wait for its owners' dyReady, recorded by their own
	// calls: every helper's are queued in the last rank's call, once all
	// are recorded
	if r == len(f.ranks)-1 {
		for q := range f.ranks {
			if err := f.pullGradients(q); err != nil {
				return err
			}
		}
	}
	return nil
}

// pullGradients queues helper q's pulls of its chunks' output gradients
// (into the rows that held their outputs) on its copy stream, zeroes its
// weight-gradient buffers there, and sets q's backward dynamic work: the
// chunks once the pulls have landed, then its own share.
func (f *Device) pullGradients(q int) error {
	rk, s, bk := f.ranks[q], &f.rs[q], &f.bk[q]
	in := f.c.lay.in[q]
	if len(in) == 0 {
		return nil
	}
	sh, ff := f.c.shape, int64(f.env.FFN)
	h := int64(sh.Hidden)
	for i, c := range in {
		if i == 0 || c.owner != in[i-1].owner {
			if err := rk.Dev.Wait(s.ce, f.bk[c.owner].dyReady); err != nil {
				return err
			}
		}
	}
	if err := rk.Dev.Record(bk.dyStart, s.ce); err != nil {
		return err
	}
	f.ops = f.ops[:0]
	bk.segs = bk.segs[:0]
	for i, c := range in {
		o := f.ranks[c.owner]
		f.ops = append(f.ops, kernels.CopyOp{Dst: s.fy + kernels.Ptr(2*int64(c.dst)*h), Src: o.ExpertDY + kernels.Ptr(2*int64(c.src)*h), Bytes: 2 * int64(c.n) * h, SrcDev: o.Dev})
		fg := s.segs[2][i]
		fg.DFC1, fg.DFC2 = bk.g1+kernels.Ptr(int64(i)*8*ff*h), bk.g2+kernels.Ptr(int64(i)*4*h*ff)
		bk.segs = append(bk.segs, fg)
		f.back.bytes += int64(c.n) * h * 2
	}
	if err := rk.Dev.CopyBatch(f.ops, s.ce); err != nil {
		return fmt.Errorf("feplb: rank %d's output gradients in: %w", q, err)
	}
	if err := rk.Dev.Fill16(bk.g1, 0, int64(len(in))*4*ff*h, s.ce); err != nil {
		return err
	}
	if err := rk.Dev.Fill16(bk.g2, 0, int64(len(in))*2*h*ff, s.ce); err != nil {
		return err
	}
	if err := rk.Dev.Record(bk.dyIn, s.ce); err != nil {
		return err
	}
	own := bk.work[0] // CombineBackward's
	chunks := dispatchers.DeviceWork{X: s.fx, Probs: s.fp, DY: s.fy, DX: bk.dx, DProbs: bk.dp, Segments: bk.segs, After: bk.dyIn, Done: bk.computed}
	bk.work = append(bk.work[:0], chunks, own)
	rk.Work = bk.work
	return nil
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
	if err := bk.back.Ensure(rk.Dev, s.ce, len(out), kernels.Buf{P: &bk.w1, PerRow: 8 * ff * h}, kernels.Buf{P: &bk.w2, PerRow: 4 * h * ff}); err != nil {
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
	f.ops = f.ops[:0]
	wg := kernels.ExpertWGradBytes(sh.Hidden, f.env.FFN)
	for i, c := range out {
		hb := &f.bk[c.helper]
		j := chunkIndex(f.c.lay.in[c.helper], c)
		if j < 0 {
			return fmt.Errorf("feplb: rebalance-bwd on rank %d: rank %d does not list the chunk of expert %d it computed", r, c.helper, c.expert)
		}
		from := f.ranks[c.helper].Dev
		f.ops = append(f.ops,
			kernels.CopyOp{Dst: rk.ExpertDX + kernels.Ptr(2*int64(c.src)*h), Src: hb.dx + kernels.Ptr(2*int64(c.dst)*h), Bytes: 2 * int64(c.n) * h, SrcDev: from},
			kernels.CopyOp{Dst: rk.ExpertDProbs + kernels.Ptr(4*int64(c.src)), Src: hb.dp + kernels.Ptr(4*int64(c.dst)), Bytes: 4 * int64(c.n), SrcDev: from},
			kernels.CopyOp{Dst: bk.w1 + kernels.Ptr(int64(i)*8*ff*h), Src: hb.g1 + kernels.Ptr(int64(j)*8*ff*h), Bytes: 8 * ff * h, SrcDev: from},
			kernels.CopyOp{Dst: bk.w2 + kernels.Ptr(int64(i)*4*h*ff), Src: hb.g2 + kernels.Ptr(int64(j)*4*h*ff), Bytes: 4 * h * ff, SrcDev: from})
		f.back.bytes += int64(c.n)*(2*h+4) + wg
		f.back.wgrad += wg
	}
	if err := rk.Dev.CopyBatch(f.ops, s.ce); err != nil {
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
			if err := rk.Dev.AddF32(rk.DFC1+kernels.Ptr(le*8*ff*h), bk.w1+kernels.Ptr(int64(i)*8*ff*h), int(2*ff*h), false, rk.Stream); err != nil {
				return err
			}
			if err := rk.Dev.AddF32(rk.DFC2+kernels.Ptr(le*4*h*ff), bk.w2+kernels.Ptr(int64(i)*4*h*ff), int(h*ff), false, rk.Stream); err != nil {
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

// backCopySeconds is the last step's backward phase-2 copy time: per rank,
// its pulls of output gradients and its returns, the slowest rank's sum.
func (f *Device) backCopySeconds() (float64, error) {
	most := 0.0
	for r := range f.bk {
		bk, dev, t := &f.bk[r], f.ranks[r].Dev, 0.0
		span := func(a, b kernels.Event) error {
			ms, err := dev.Elapsed(a, b)
			t += ms / 1e3
			return err
		}
		if len(f.c.lay.in[r]) > 0 {
			if err := span(bk.dyStart, bk.dyIn); err != nil {
				return 0, err
			}
		}
		if len(f.c.lay.out[r]) > 0 {
			if err := span(bk.retStart, bk.returned); err != nil {
				return 0, err
			}
		}
		most = max(most, t)
	}
	return most, nil
}
