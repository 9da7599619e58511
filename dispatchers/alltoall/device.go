package alltoall

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
)

func init() { dispatchers.RegisterDevice("alltoall", NewDevice) }

// NewDevice returns the native alltoall dispatcher on a kernels.Device: the
// same algorithm as A2A with device kernels, the variable-split exchange done
// with copies: within a GPU when ranks share one (emulated EP), else peer
// copies between the ranks' GPUs.
func NewDevice(impl string, env dispatchers.Env) (dispatchers.DeviceDispatcher, error) {
	if impl != dispatchers.ImplNative {
		return nil, &dispatchers.UnavailableError{Name: "alltoall", Impl: impl,
			Reason: "no library implementation in this build (NCCL all-to-all between GPUs is not built yet)"}
	}
	return &Device{}, nil
}

// Device is the alltoall dispatcher over device ranks.
type Device struct {
	shape dispatchers.Shape
	ranks []*dispatchers.DeviceRank
	st    []devState
	fresh bool // host counts are this step's
}

// devState is one rank's buffers. Row counts are known on the host after the
// count exchange, as in Megatron (its one host sync).
type devState struct {
	rows, pos, counts kernels.Ptr // [n] permuted row → slot, [n] slot → row, [Experts] int32
	permX, permY      kernels.Ptr // [n, h] copies to send, outputs returned (permuted order)
	permP             kernels.Ptr // [n] fp32
	hostCounts        []int32     // [Experts]
	sendOff           []int       // [EP+1] first permuted row for each destination rank

	// receive side: chunk (source s, local expert l) has chunkN[s][l] rows at
	// recvOff[s][l] of the [source][local] receive buffer
	chunkN, recvOff [][]int
	recvCounts      kernels.Ptr // [EP·L] int32 chunkN on the device, for the chunk sort
	recvX, recvP    kernels.Ptr // [cap, h], [cap]
	recvY           kernels.Ptr // [cap, h]
	received        int
	recv            kernels.Sized // recvX, recvP, recvY, ExpertX, ExpertProbs

	permuted, combined kernels.Event
	fixed              int64 // bytes of the buffers Bind allocated
}

func (a *Device) Name() string { return "alltoall" }
func (a *Device) Impl() string { return dispatchers.ImplNative }

// Bind allocates each rank's fixed-size buffers and events on its device.
func (a *Device) Bind(shape dispatchers.Shape, ranks []*dispatchers.DeviceRank) error {
	if len(ranks) != shape.EP {
		return fmt.Errorf("alltoall: %d ranks, shape says EP = %d", len(ranks), shape.EP)
	}
	a.shape, a.ranks = shape, ranks
	a.st = make([]devState, shape.EP)
	n, h, L := int64(shape.Tokens*shape.TopK), int64(shape.Hidden), shape.LocalExperts()
	for r := range a.st {
		s, dev := &a.st[r], ranks[r].Dev
		var err error
		if s.fixed, err = kernels.Resize(dev, 1, kernels.Buf{P: &s.rows, PerRow: 4 * n}, kernels.Buf{P: &s.pos, PerRow: 4 * n},
			kernels.Buf{P: &s.counts, PerRow: 4 * int64(shape.Experts)}, kernels.Buf{P: &s.permX, PerRow: 2 * n * h},
			kernels.Buf{P: &s.permY, PerRow: 2 * n * h}, kernels.Buf{P: &s.permP, PerRow: 4 * n},
			kernels.Buf{P: &s.recvCounts, PerRow: 4 * int64(shape.Experts)}); err != nil {
			return err
		}
		s.hostCounts = make([]int32, shape.Experts)
		s.sendOff = make([]int, shape.EP+1)
		s.chunkN, s.recvOff = make([][]int, shape.EP), make([][]int, shape.EP)
		for src := range shape.EP {
			s.chunkN[src], s.recvOff[src] = make([]int, L), make([]int, L)
		}
		if s.permuted, err = dev.NewEvent(); err != nil {
			return err
		}
		if s.combined, err = dev.NewEvent(); err != nil {
			return err
		}
		ranks[r].ExpertRows = make([]int, L)
	}
	return nil
}

// Permute orders rank r's copies expert-major (also destination-rank major)
// and gathers their rows and probabilities.
func (a *Device) Permute(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	n := sh.Tokens * sh.TopK
	a.fresh = false
	if err := rk.Dev.PermuteOrder(rk.Idx, n, sh.Experts, s.rows, s.pos, s.counts, rk.Stream); err != nil {
		return err
	}
	if err := rk.Dev.GatherRows(s.permX, rk.X, s.rows, sh.TopK, n, sh.Hidden, rk.Stream); err != nil {
		return err
	}
	if err := rk.Dev.GatherF32(s.permP, rk.Probs, s.rows, 1, n, rk.Stream); err != nil {
		return err
	}
	return rk.Dev.Record(s.permuted, rk.Stream)
}

// exchangeCounts is the count all-gather: every rank's per-expert counts
// reach the host (waiting for every rank's permute).
func (a *Device) exchangeCounts() error {
	sh := a.shape
	L := sh.LocalExperts()
	for src := range a.st {
		s := &a.st[src]
		if err := a.ranks[src].Dev.Download(s.hostCounts, s.counts, a.ranks[src].Stream); err != nil {
			return err
		}
		for d := range sh.EP {
			n := 0
			for _, c := range s.hostCounts[d*L : (d+1)*L] {
				n += int(c)
			}
			s.sendOff[d+1] = s.sendOff[d] + n
		}
		if s.sendOff[sh.EP] != sh.Tokens*sh.TopK {
			return fmt.Errorf("alltoall: rank %d's counts sum to %d, want tokens × topk = %d", src, s.sendOff[sh.EP], sh.Tokens*sh.TopK)
		}
	}
	a.fresh = true
	return nil
}

// Dispatch is rank r's receive side: pull each source's rows for r's experts
// into a [source][local expert] buffer, then sort the chunks into [local
// expert][source] order (ExpertX).
func (a *Device) Dispatch(r int) error {
	if !a.fresh {
		if err := a.exchangeCounts(); err != nil {
			return err
		}
	}
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	L, h := sh.LocalExperts(), int64(sh.Hidden)
	total := 0
	clear(rk.ExpertRows)
	for src := range sh.EP {
		for l := range L {
			c := int(a.st[src].hostCounts[r*L+l])
			s.chunkN[src][l], s.recvOff[src][l] = c, total
			rk.ExpertRows[l] += c
			total += c
		}
	}
	s.received = total
	if err := a.grow(r, total); err != nil {
		return err
	}
	for src := range sh.EP {
		ss, from := &a.st[src], a.ranks[src].Dev
		if err := rk.Dev.Wait(rk.Stream, ss.permuted); err != nil {
			return err
		}
		lo, rows := int64(ss.sendOff[r]), int64(ss.sendOff[r+1]-ss.sendOff[r])
		at := int64(s.recvOff[src][0])
		// the rows, their probabilities and the source's counts for r's
		// experts (a device copy: an upload from host memory would wait for
		// the stream)
		for _, op := range []kernels.CopyOp{
			{Dst: s.recvX + kernels.Ptr(2*at*h), Src: ss.permX + kernels.Ptr(2*lo*h), Bytes: 2 * rows * h, SrcDev: from},
			{Dst: s.recvP + kernels.Ptr(4*at), Src: ss.permP + kernels.Ptr(4*lo), Bytes: 4 * rows, SrcDev: from},
			{Dst: s.recvCounts + kernels.Ptr(4*src*L), Src: ss.counts + kernels.Ptr(4*r*L), Bytes: int64(4 * L), SrcDev: from},
		} {
			if err := rk.Dev.CopyPeer(op, rk.Stream); err != nil {
				return err
			}
		}
	}
	return rk.Dev.SortChunks(rk.ExpertX, rk.ExpertProbs, s.recvX, s.recvP, s.recvCounts, total, sh.EP, L, sh.Hidden, false, rk.Stream)
}

// grow makes rank r's receive and expert-input buffers hold rows rows.
func (a *Device) grow(r, rows int) error {
	s, rk, h := &a.st[r], a.ranks[r], int64(a.shape.Hidden)
	return s.recv.Ensure(rk.Dev, rk.Stream, rows, kernels.Buf{P: &s.recvX, PerRow: 2 * h}, kernels.Buf{P: &s.recvP, PerRow: 4},
		kernels.Buf{P: &s.recvY, PerRow: 2 * h}, kernels.Buf{P: &rk.ExpertX, PerRow: 2 * h}, kernels.Buf{P: &rk.ExpertProbs, PerRow: 4})
}

// Combine is rank r's send side on the way back: unsort its expert outputs
// into [source][local expert] order and push each source's rows into that
// source's permuted output buffer.
func (a *Device) Combine(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	h := int64(sh.Hidden)
	if err := rk.Dev.SortChunks(s.recvY, 0, rk.ExpertY, 0, s.recvCounts, s.received, sh.EP, sh.LocalExperts(), sh.Hidden, true, rk.Stream); err != nil {
		return err
	}
	for src := range sh.EP {
		ss := &a.st[src]
		lo, rows := int64(ss.sendOff[r]), int64(ss.sendOff[r+1]-ss.sendOff[r])
		from := int64(s.recvOff[src][0])
		op := kernels.CopyOp{Dst: ss.permY + kernels.Ptr(2*lo*h), Src: s.recvY + kernels.Ptr(2*from*h), Bytes: 2 * rows * h, DstDev: a.ranks[src].Dev}
		if err := rk.Dev.CopyPeer(op, rk.Stream); err != nil {
			return err
		}
	}
	return rk.Dev.Record(s.combined, rk.Stream)
}

// Unpermute waits for every rank's combine and sums each token's k outputs
// (plus the shared expert's) into Y.
func (a *Device) Unpermute(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	for d := range a.st {
		if err := rk.Dev.Wait(rk.Stream, a.st[d].combined); err != nil {
			return err
		}
	}
	return rk.Dev.UnpermuteSum(rk.Y, s.permY, s.pos, rk.Shared, sh.Tokens, sh.TopK, sh.Hidden, rk.Stream)
}

// Traffic counts as A2A.Traffic does.
func (a *Device) Traffic() dispatchers.Traffic {
	sendOff := make([][]int, len(a.st))
	for r := range a.st {
		sendOff[r] = a.st[r].sendOff
	}
	return traffic(a.shape, sendOff)
}

// Footprint is the bytes of rank r's dispatcher buffers, ExpertX and
// ExpertProbs included.
func (a *Device) Footprint(r int) int64 { return a.st[r].fixed + a.st[r].recv.Bytes }

// Close frees every buffer the dispatcher allocated.
func (a *Device) Close() error {
	var first error
	for r := range a.st {
		s, rk := &a.st[r], a.ranks[r]
		if err := kernels.Free(rk.Dev, &s.rows, &s.pos, &s.counts, &s.permX, &s.permY, &s.permP, &s.recvCounts,
			&s.recvX, &s.recvP, &s.recvY, &rk.ExpertX, &rk.ExpertProbs); first == nil {
			first = err
		}
		s.fixed, s.recv = 0, kernels.Sized{}
	}
	return first
}
