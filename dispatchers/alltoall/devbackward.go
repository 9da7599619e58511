package alltoall

import (
	"github.com/moebench/moebench/kernels/comm"
	"github.com/moebench/moebench/kernels/device"
)

// The backward on device ranks: the host backward's phases (backward.go)
// with the forward's device kernels and copies, over the forward's counts,
// offsets and maps (no count exchange, no host wait). The permuted send
// buffers carry the copies' gradients, the receive buffers the
// exchanges'; a rank's pull from another rank's buffer waits for the event
// that rank recorded after writing it (the forward's dispatch needed none:
// the count exchange had waited for every stream). At EP 1 the native
// implementation, like its forward, moves nothing: the permuted order is
// the experts'.

// UnpermuteBackward gives each of rank r's permuted copies its token's
// output gradient (a gather of DY by the forward's rows map).
func (a *Device) UnpermuteBackward(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	n := sh.Tokens * sh.TopK
	if rk.DX == 0 { // the first backward: the dispatcher's outputs
		held, err := device.Resize(rk.Dev, 1, device.RowBuffer{P: &rk.DX, PerRow: int64(2 * sh.Tokens * sh.Hidden)}, device.RowBuffer{P: &rk.DProbs, PerRow: int64(4 * n)})
		if s.bwdFixed = held; err != nil {
			return err
		}
	}
	s.backward = true
	if err := rk.Dev.GatherRows(s.permY, rk.DY, s.rows, sh.TopK, n, sh.Hidden, rk.Stream); err != nil {
		return err
	}
	if sh.EP == 1 && !a.library {
		rk.ExpertDY = s.permY
		return nil
	}
	return rk.Dev.Record(s.unpermuted, rk.Stream)
}

// CombineBackward is rank r's receive side of the combine reversed: each
// source's copies' output gradients for r's experts, then the chunk sort,
// into ExpertDY (the rows of ExpertX). The library implementation's rank
// r sends, as one NCCL group, its copies' gradients to the ranks that
// computed them and receives the gradients of the rows it computed (the
// forward dispatch's exchange, rows only).
func (a *Device) CombineBackward(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	if sh.EP == 1 && !a.library {
		return nil
	}
	h := int64(sh.Hidden)
	if err := s.bwd.Ensure(rk.Dev, rk.Stream, s.received, device.RowBuffer{P: &rk.ExpertDY, PerRow: 2 * h}); err != nil {
		return err
	}
	if a.library {
		s.sends, s.recvs = s.sends[:0], s.recvs[:0]
		for d := range sh.EP {
			lo, rows := int64(s.sendOff[d]), int64(s.sendOff[d+1]-s.sendOff[d])
			s.sends = append(s.sends, comm.PeerTransfer{Peer: d, Buf: s.permY + device.Addr(2*lo*h), Bytes: 2 * rows * h})
		}
		for src := range sh.EP { // rows src sent r in the forward, from r's counts (src may be another process's rank)
			rows := s.fromRows(src)
			s.recvs = append(s.recvs, comm.PeerTransfer{Peer: src, Buf: s.recvY + device.Addr(2*int64(s.recvOff[src][0])*h), Bytes: 2 * rows * h})
		}
		if err := a.comm.Exchange(r, s.sends, s.recvs); err != nil {
			return err
		}
	} else {
		for src := range sh.EP {
			ss := &a.st[src]
			lo, rows := int64(ss.sendOff[r]), int64(ss.sendOff[r+1]-ss.sendOff[r])
			op := device.CopyOp{Dst: s.recvY + device.Addr(2*int64(s.recvOff[src][0])*h), Src: ss.permY + device.Addr(2*lo*h), Bytes: 2 * rows * h, SrcDev: a.ranks[src].Dev}
			if err := rk.Dev.Wait(rk.Stream, ss.unpermuted); err != nil {
				return err
			}
			if err := rk.Dev.CopyPeer(op, rk.Stream); err != nil {
				return err
			}
		}
	}
	return rk.Dev.SortChunks(rk.ExpertDY, 0, s.recvY, 0, s.recvCounts, s.received, sh.EP, sh.LocalExperts(), sh.Hidden, false, rk.Stream)
}

// DispatchBackward is rank r's send side of the dispatch reversed: the
// inverse chunk sort of its rows' input and probability gradients, then
// each source's rows pushed into that source's permuted buffers (bf16
// rows, fp32 probability gradients). The library implementation's rank r
// sends them as one NCCL group and receives its own copies' gradients
// (the forward combine's exchange, with the probabilities' gradients).
func (a *Device) DispatchBackward(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	if sh.EP == 1 && !a.library {
		return nil
	}
	h := int64(sh.Hidden)
	if err := rk.Dev.SortChunks(s.recvX, s.recvP, rk.ExpertDX, rk.ExpertDProbs, s.recvCounts, s.received, sh.EP, sh.LocalExperts(), sh.Hidden, true, rk.Stream); err != nil {
		return err
	}
	if a.library {
		s.sends, s.recvs = s.sends[:0], s.recvs[:0]
		for src := range sh.EP {
			rows, at := s.fromRows(src), int64(s.recvOff[src][0])
			s.sends = append(s.sends, comm.PeerTransfer{Peer: src, Buf: s.recvX + device.Addr(2*at*h), Bytes: 2 * rows * h},
				comm.PeerTransfer{Peer: src, Buf: s.recvP + device.Addr(4*at), Bytes: 4 * rows})
		}
		for d := range sh.EP {
			lo, rows := int64(s.sendOff[d]), int64(s.sendOff[d+1]-s.sendOff[d])
			s.recvs = append(s.recvs, comm.PeerTransfer{Peer: d, Buf: s.permX + device.Addr(2*lo*h), Bytes: 2 * rows * h},
				comm.PeerTransfer{Peer: d, Buf: s.permP + device.Addr(4*lo), Bytes: 4 * rows})
		}
		return a.comm.Exchange(r, s.sends, s.recvs)
	}
	for src := range sh.EP {
		ss, to := &a.st[src], a.ranks[src].Dev
		lo, rows := int64(ss.sendOff[r]), int64(ss.sendOff[r+1]-ss.sendOff[r])
		at := int64(s.recvOff[src][0])
		ops := [2]device.CopyOp{
			{Dst: ss.permX + device.Addr(2*lo*h), Src: s.recvX + device.Addr(2*at*h), Bytes: 2 * rows * h, DstDev: to},
			{Dst: ss.permP + device.Addr(4*lo), Src: s.recvP + device.Addr(4*at), Bytes: 4 * rows, DstDev: to},
		}
		for _, op := range ops {
			if err := rk.Dev.CopyPeer(op, rk.Stream); err != nil {
				return err
			}
		}
	}
	return rk.Dev.Record(s.returned, rk.Stream)
}

// PermuteBackward waits for every rank's returns (the native
// implementation's copies) and sums each token's k copies' input gradients
// into DX (fp32, rounded to bf16 once: B5, the unpermute's kernel), and
// places each copy's probability gradient at its slot of DProbs.
func (a *Device) PermuteBackward(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	dx, dp := s.permX, s.permP
	switch {
	case sh.EP == 1 && !a.library:
		dx, dp = rk.ExpertDX, rk.ExpertDProbs
	case !a.library:
		for d := range a.st {
			if err := rk.Dev.Wait(rk.Stream, a.st[d].returned); err != nil {
				return err
			}
		}
	}
	if err := rk.Dev.UnpermuteSum(rk.DX, dx, s.pos, 0, sh.Tokens, sh.TopK, sh.Hidden, rk.Stream); err != nil {
		return err
	}
	return rk.Dev.GatherF32(rk.DProbs, dp, s.pos, 1, sh.Tokens*sh.TopK, rk.Stream)
}
