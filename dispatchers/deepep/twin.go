package deepep

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// twin is the kernels' Go form for device.Emu (device.Program.Twin): each
// kernel's twin loads what the kernel reads from device memory — through
// the descriptor tables the kernels get, for the collectives — into a
// Host that mirrors the ranks, runs the host design's phase, and stores
// what the kernel writes. So Emu runs the device pipeline (buffers,
// offsets, descriptors, stream order) with the host design's own code.
type twin struct {
	d  *Device
	h  *Host
	rk []*dispatchers.Rank
	mu sync.Mutex // the mirror is one: devices' threads run their ranks' twins in turn
}

// locked is f run under tw.mu.
func (tw *twin) locked(f func([]device.TwinPart) error) func([]device.TwinPart) error {
	return func(parts []device.TwinPart) error {
		tw.mu.Lock()
		defer tw.mu.Unlock()
		return f(parts)
	}
}

// host is the mirror, bound on first use.
func (tw *twin) host() (*Host, error) {
	if tw.h == nil {
		tw.h, tw.rk = WithConfig(tw.d.cfg), make([]*dispatchers.Rank, tw.d.shape.EP)
		for r := range tw.rk {
			tw.rk[r] = &dispatchers.Rank{ID: r}
		}
		if err := tw.h.Bind(tw.d.shape, tw.rk); err != nil {
			return nil, err
		}
	}
	return tw.h, nil
}

// mem is a typed view of n elements of device memory at p, read (or
// written when write) by part t.
func mem[T int32 | uint16 | float32 | uint8](t device.TwinPart, p device.Addr, n int, write bool) ([]T, error) {
	var zero T
	bytes := int64(n) * int64(unsafe.Sizeof(zero))
	if n == 0 {
		return nil, nil
	}
	var b []byte
	var err error
	if write {
		b, err = t.Write(p, bytes)
	} else {
		b, err = t.Read(p, bytes)
	}
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n), nil
}

// begin is a collective's twin's start: the mirror, and each rank's part
// and descriptor (ranksOf).
func (tw *twin) begin(parts []device.TwinPart) (*Host, []device.TwinPart, [][]device.Addr, error) {
	h, err := tw.host()
	if err != nil {
		return nil, nil, nil, err
	}
	part, desc, err := tw.ranksOf(parts)
	return h, part, desc, err
}

// ranksOf maps every rank to the part that covers it (a collective's
// parts: argument 1 is the part's first rank) and reads the descriptor
// table each part got (its last argument).
func (tw *twin) ranksOf(parts []device.TwinPart) (part []device.TwinPart, desc [][]device.Addr, err error) {
	N := tw.d.shape.EP
	part, desc = make([]device.TwinPart, N), make([][]device.Addr, N)
	for _, t := range parts {
		first := int(t.Args[1].(int32))
		tab, err := t.Ptrs(t.Args[len(t.Args)-1].(device.Addr), slots*N)
		if err != nil {
			return nil, nil, err
		}
		for r := first; r < first+tw.d.groupOf(first).n; r++ {
			part[r], desc[r] = t, tab[r*slots:(r+1)*slots]
		}
	}
	for r := range part {
		if part[r].Dev == nil {
			return nil, nil, fmt.Errorf("no part covers rank %d", r)
		}
	}
	return part, desc, nil
}

// loadLayout reads rank r's layout results into the mirror.
func (tw *twin) loadLayout(t device.TwinPart, fixed device.Addr, r int) error {
	s, lay, sh := &tw.h.st[r], tw.d.lay, tw.d.shape
	in, err := mem[uint8](t, fixed, sh.Tokens*sh.EP, false)
	if err != nil {
		return err
	}
	for i, v := range in {
		s.inRank[i] = v != 0
	}
	for _, a := range []struct {
		off int64
		to  []int
	}{{lay.perRank, s.perRank}, {lay.perExpert, s.perExpert}} {
		v, err := mem[int32](t, fixed+device.Addr(a.off), len(a.to), false)
		if err != nil {
			return err
		}
		for i, x := range v {
			a.to[i] = int(x)
		}
	}
	return nil
}

// loadPrefixes reads rank r's notify results (channel and received
// prefixes) into the mirror, and sizes its receive buffer.
func (tw *twin) loadPrefixes(t device.TwinPart, fixed device.Addr, r int) error {
	s, lay, sh := &tw.h.st[r], tw.d.lay, tw.d.shape
	N, C := sh.EP, tw.d.cfg.Channels()
	ce, err := mem[int32](t, fixed+device.Addr(lay.chanEnd), N*C, false)
	if err != nil {
		return err
	}
	se, err := mem[int32](t, fixed+device.Addr(lay.srcEnd), N, false)
	if err != nil {
		return err
	}
	for d := range N {
		for c := range C {
			s.chanEnd[d][c] = int(ce[d*C+c])
		}
		s.srcEnd[d] = int(se[d])
	}
	s.recv = s.srcEnd[N-1]
	s.recvX, s.recvSrc = kernels.Reslice(s.recvX, s.recv*sh.Hidden), kernels.Reslice(s.recvSrc, s.recv)
	s.recvIdx, s.recvW = kernels.Reslice(s.recvIdx, s.recv*sh.TopK), kernels.Reslice(s.recvW, s.recv*sh.TopK)
	return nil
}

// store copies ints into device memory at p (as int32).
func store[T int | int32](t device.TwinPart, p device.Addr, v []T) error {
	out, err := mem[int32](t, p, len(v), true)
	for i, x := range v {
		out[i] = int32(x)
	}
	return err
}

// bf16 reads n bf16 values at p as float32.
func bf16(t device.TwinPart, p device.Addr, n int) ([]float32, error) {
	b, err := mem[uint16](t, p, n, false)
	return kernels.FromBF16Bits(b), err
}

// layout: deepep_layout(idx, fixed).
func (tw *twin) layout(parts []device.TwinPart) error {
	t, sh := parts[0], tw.d.shape
	h, err := tw.host()
	if err != nil {
		return err
	}
	idxPtr, fixed := t.Args[0].(device.Addr), t.Args[1].(device.Addr)
	r := -1
	for i := range tw.d.st {
		if tw.d.st[i].fixed == fixed {
			r = i
		}
	}
	if r < 0 {
		return fmt.Errorf("deepep_layout: %#x is no rank's layout buffer", uint64(fixed))
	}
	idx, err := mem[int32](t, idxPtr, sh.Tokens*sh.TopK, false)
	if err != nil {
		return err
	}
	tw.rk[r].Idx = idx
	if err := h.Layout(r); err != nil {
		return err
	}
	s, lay := &h.st[r], tw.d.lay
	in, err := mem[uint8](t, fixed, len(s.inRank), true)
	if err != nil {
		return err
	}
	for i, v := range s.inRank {
		in[i] = 0
		if v {
			in[i] = 1
		}
	}
	if err := store(t, fixed+device.Addr(lay.perRank), s.perRank); err != nil {
		return err
	}
	return store(t, fixed+device.Addr(lay.perExpert), s.perExpert)
}

// notify: deepep_notify(comm, first, epoch, cached, desc): the mirror's
// Notify on every rank's layout, its prefixes stored and the counters set;
// cached (the backward's), nothing: the counts are the forward's, and the
// queues' metadata the kernels clear is theirs alone.
func (tw *twin) notify(parts []device.TwinPart) error {
	if parts[0].Args[3].(int32) != 0 {
		return nil
	}
	h, part, desc, err := tw.begin(parts)
	if err != nil {
		return err
	}
	for r := range part {
		if err := tw.loadLayout(part[r], desc[r][slotFixed], r); err != nil {
			return err
		}
	}
	lay, sh := tw.d.lay, tw.d.shape
	L := sh.LocalExperts()
	for r := range part {
		if err := h.Notify(r); err != nil {
			return err
		}
		s, t, fixed := &h.st[r], part[r], desc[r][slotFixed]
		var ends []int
		for _, e := range s.chanEnd {
			ends = append(ends, e...)
		}
		if err := store(t, fixed+device.Addr(lay.chanEnd), ends); err != nil {
			return err
		}
		if err := store(t, fixed+device.Addr(lay.srcEnd), s.srcEnd); err != nil {
			return err
		}
	}
	for r := range part { // after every rank's stores: the host may read them at once
		tw.d.sig.SetCounter(tw.d.counter(r, 0), int32(h.st[r].recv))
		for l := range L {
			tw.d.sig.SetCounter(tw.d.counter(r, 1+l), int32(h.st[r].expertRows[l]))
		}
	}
	return nil
}

// dispatch: deepep_dispatch(comm, first, bwd, desc): the mirror's Dispatch
// on every rank's inputs and notify results; the receive buffers, send_head
// and the received channel offsets stored. bwd: the mirror's transfer of
// the output gradients over the forward's handle, the receive rows stored.
func (tw *twin) dispatch(parts []device.TwinPart) error {
	h, part, desc, err := tw.begin(parts)
	if err != nil {
		return err
	}
	sh, lay := tw.d.shape, tw.d.lay
	T, k, hd, N, C := sh.Tokens, sh.TopK, sh.Hidden, sh.EP, tw.d.cfg.Channels()
	bwd := parts[0].Args[2].(int32) != 0
	for r := range part {
		t, ds, rk := part[r], desc[r], tw.rk[r]
		if err := tw.loadLayout(t, ds[slotFixed], r); err != nil {
			return err
		}
		if err := tw.loadPrefixes(t, ds[slotFixed], r); err != nil {
			return err
		}
		if bwd {
			if err := tw.loadSendHead(t, ds[slotFixed], r); err != nil {
				return err
			}
			if rk.DY, err = bf16(t, ds[slotDY], T*hd); err != nil {
				return err
			}
			continue
		}
		if tw.d.fp8() { // the packed fp8 rows move as bytes (rawRows); the mirror routes zero bf16 rows
			rk.X = kernels.Reslice(rk.X, T*hd)
			clear(rk.X)
		} else if rk.X, err = bf16(t, ds[slotX], T*hd); err != nil {
			return err
		}
		if rk.Idx, err = mem[int32](t, ds[slotIdx], T*k, false); err != nil {
			return err
		}
		if rk.Probs, err = mem[float32](t, ds[slotProbs], T*k, false); err != nil {
			return err
		}
	}
	if bwd {
		return tw.dispatchGrads(h, part, desc)
	}
	for r := range part {
		if err := h.Dispatch(r); err != nil {
			return err
		}
	}
	for r := range part {
		s, t, ds := &h.st[r], part[r], desc[r]
		if tw.d.fp8() {
			if err := tw.rawRows(part, desc, r); err != nil {
				return err
			}
		} else {
			x, err := mem[uint16](t, ds[slotRecvX], s.recv*hd, true)
			if err != nil {
				return err
			}
			copy(x, kernels.BF16Bits(s.recvX[:s.recv*hd]))
		}
		if err := store(t, ds[slotRecvSrc], s.recvSrc[:s.recv]); err != nil {
			return err
		}
		if err := store(t, ds[slotRecvIdx], s.recvIdx[:s.recv*k]); err != nil {
			return err
		}
		w, err := mem[float32](t, ds[slotRecvW], s.recv*k, true)
		if err != nil {
			return err
		}
		copy(w, s.recvW[:s.recv*k])
		if err := store(t, ds[slotFixed]+device.Addr(lay.sendHead), s.sendHead); err != nil {
			return err
		}
		chans := make([]int, 0, 2*N*C) // (source, channel): start, end among the source's tokens to r
		for src := range N {
			for c := range C {
				end := h.st[src].chanEnd[r][c]
				start := 0
				if c > 0 {
					start = h.st[src].chanEnd[r][c-1]
				}
				chans = append(chans, start, end)
			}
		}
		if err := store(t, ds[slotFixed]+device.Addr(lay.recvChan), chans); err != nil {
			return err
		}
	}
	return nil
}

// rawRows is the fp8 dispatch's rows on rank r: each received row (the
// mirror's received order: source ranks in turn, recvSrc the source's
// token) the source's packed row, its e4m3 bytes and scales as they are,
// DispatchWidth bf16-sized elements at that stride in the receive buffer.
func (tw *twin) rawRows(part []device.TwinPart, desc [][]device.Addr, r int) error {
	sh, s := tw.d.shape, &tw.h.st[r]
	pitch := 2 * sh.DispatchWidth()
	out, err := mem[uint8](part[r], desc[r][slotRecvX], s.recv*pitch, true)
	if err != nil {
		return err
	}
	src := 0
	for i := range s.recv {
		for src < sh.EP-1 && i >= s.srcEnd[src] {
			src++
		}
		in, err := mem[uint8](part[src], desc[src][slotX]+device.Addr(int64(s.recvSrc[i])*int64(pitch)), pitch, false)
		if err != nil {
			return err
		}
		copy(out[i*pitch:(i+1)*pitch], in)
	}
	return nil
}

// dispatchGrads is the backward dispatch's twin after the loads: each
// rank's receive rows from its sources' output gradients.
func (tw *twin) dispatchGrads(h *Host, part []device.TwinPart, desc [][]device.Addr) error {
	hd := tw.d.shape.Hidden
	for r := range part {
		if err := h.transfer(r, "combine-bwd", func(src int) []float32 { return tw.rk[src].DY }, h.st[r].recvX, false); err != nil {
			return err
		}
	}
	for r := range part {
		s := &h.st[r]
		x, err := mem[uint16](part[r], desc[r][slotRecvX], s.recv*hd, true)
		if err != nil {
			return err
		}
		copy(x, kernels.BF16Bits(s.recvX[:s.recv*hd]))
	}
	return nil
}

// loadSendHead reads rank r's send_head into the mirror.
func (tw *twin) loadSendHead(t device.TwinPart, fixed device.Addr, r int) error {
	sh := tw.d.shape
	v, err := mem[int32](t, fixed+device.Addr(tw.d.lay.sendHead), sh.Tokens*sh.EP, false)
	for i, x := range v {
		tw.h.st[r].sendHead[i] = int(x)
	}
	return err
}

// permute: deepep_permute(recvIdx, slots, order, permRow).
func (tw *twin) permute(parts []device.TwinPart) error {
	t, sh := parts[0], tw.d.shape
	h, err := tw.host()
	if err != nil {
		return err
	}
	recvIdx, n := t.Args[0].(device.Addr), int(t.Args[1].(int32))
	r := -1
	for i := range tw.d.st {
		if tw.d.st[i].recvIdx == recvIdx {
			r = i
		}
	}
	if r < 0 || n%sh.TopK != 0 {
		return fmt.Errorf("deepep_permute: %#x is no rank's receive buffer, or %d slots not whole tokens", uint64(recvIdx), n)
	}
	s := &h.st[r]
	idx, err := mem[int32](t, recvIdx, n, false)
	if err != nil {
		return err
	}
	s.recv, s.recvIdx = n/sh.TopK, append(s.recvIdx[:0], idx...)
	h.slots = s.order(sh.LocalExperts(), sh.TopK, h.slots)
	if err := store(t, t.Args[2].(device.Addr), h.slots); err != nil {
		return err
	}
	return store(t, t.Args[3].(device.Addr), s.permRow)
}

// combine: deepep_combine(comm, first, epoch, desc): the mirror's
// Combine on every rank's expert outputs and maps; Y stored as bf16, with
// the shared expert's output added as the layer does.
func (tw *twin) combine(parts []device.TwinPart) error { return tw.combineOf(parts, false) }

// combineBwd: deepep_combine_bwd(comm, first, epoch, desc): the mirror's
// reduce of the expert rows' input and probability gradients into DX
// (bf16) and DProbs.
func (tw *twin) combineBwd(parts []device.TwinPart) error { return tw.combineOf(parts, true) }

// combineOf is the twin of the combine kernel's forward or backward form.
func (tw *twin) combineOf(parts []device.TwinPart, bwd bool) error {
	h, part, desc, err := tw.begin(parts)
	if err != nil {
		return err
	}
	sh := tw.d.shape
	T, k, hd := sh.Tokens, sh.TopK, sh.Hidden
	for r := range part {
		t, ds, s, rk := part[r], desc[r], &h.st[r], tw.rk[r]
		if err := tw.loadPrefixes(t, ds[slotFixed], r); err != nil {
			return err
		}
		for _, a := range []struct {
			p  device.Addr
			to []int32
		}{{ds[slotRecvSrc], s.recvSrc[:s.recv]}, {ds[slotRecvIdx], s.recvIdx[:s.recv*k]}} {
			v, err := mem[int32](t, a.p, len(a.to), false)
			if err != nil {
				return err
			}
			copy(a.to, v)
		}
		pr, err := mem[int32](t, ds[slotPermRow], s.recv*k, false)
		if err != nil {
			return err
		}
		s.permRow = append(s.permRow[:0], pr...)
		rows := int32(-1)
		for _, p := range pr {
			rows = max(rows, p)
		}
		if bwd {
			if rk.ExpertDX, err = bf16(t, ds[slotExpertDX], int(rows+1)*hd); err != nil {
				return err
			}
			if rk.ExpertDProbs, err = mem[float32](t, ds[slotExpertDP], int(rows+1), false); err != nil {
				return err
			}
		} else if rk.ExpertY, err = bf16(t, ds[slotExpertY], int(rows+1)*hd); err != nil {
			return err
		}
		if err := tw.loadSendHead(t, ds[slotFixed], r); err != nil {
			return err
		}
	}
	if bwd {
		return tw.combineGrads(h, part, desc)
	}
	for r := range part {
		if err := h.Combine(r); err != nil {
			return err
		}
	}
	for r := range part {
		t, ds, y := part[r], desc[r], tw.rk[r].Y
		kernels.RoundBF16Slice(y)
		if ds[slotShared] != 0 {
			shared, err := bf16(t, ds[slotShared], T*hd)
			if err != nil {
				return err
			}
			for i, v := range shared {
				y[i] = kernels.RoundBF16(y[i] + v)
			}
		}
		out, err := mem[uint16](t, ds[slotY], T*hd, true)
		if err != nil {
			return err
		}
		copy(out, kernels.BF16Bits(y))
	}
	return nil
}

// combineGrads is the backward combine's twin after the loads.
func (tw *twin) combineGrads(h *Host, part []device.TwinPart, desc [][]device.Addr) error {
	sh := tw.d.shape
	T, k, hd := sh.Tokens, sh.TopK, sh.Hidden
	for r := range part {
		rk := tw.rk[r]
		rk.DX, rk.DProbs = kernels.Reslice(rk.DX, T*hd), kernels.Reslice(rk.DProbs, T*k)
		if err := h.reduce(r, "dispatch-bwd", func(d int) []float32 { return tw.rk[d].ExpertDX },
			func(d int) []float32 { return tw.rk[d].ExpertDProbs }, rk.DX, rk.DProbs); err != nil {
			return err
		}
	}
	for r := range part { // DX rounded to bf16 once, as it is stored
		t, ds, rk := part[r], desc[r], tw.rk[r]
		dx, err := mem[uint16](t, ds[slotDX], T*hd, true)
		if err != nil {
			return err
		}
		copy(dx, kernels.BF16Bits(rk.DX))
		dp, err := mem[float32](t, ds[slotDProbs], T*k, true)
		if err != nil {
			return err
		}
		copy(dp, rk.DProbs)
	}
	return nil
}
