package alltoall

import (
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels/comm"
	"github.com/moebench/moebench/kernels/device"
)

func init() { dispatchers.RegisterDevice("alltoall", NewDevice) }

// NewDevice returns the alltoall dispatcher on device.Device values: the same
// algorithm as A2A with device kernels. The variable-split exchange is done
// natively with copies (within a GPU when ranks share one, emulated EP; peer
// copies between GPUs), or by the library implementation with NCCL's grouped
// send/recv, Megatron's transport, which needs one GPU per rank: each rank
// issues its sends and receives from its GPU's thread, its counts too
// (all-gathered over NCCL before the host sync), so that it also runs over
// ranks of several processes (DeviceRank.Comm).
func NewDevice(impl string, env dispatchers.Env) (dispatchers.DeviceDispatcher, error) {
	return &Device{library: impl == dispatchers.ImplLibrary, fp8: env.IsFP8()}, nil
}

// FP8Unavailable: at fp8 both implementations move packed rows (each
// row's e4m3 values and its 1×128 fp32 multipliers, Shape.DispatchHidden
// wide) through the same permute and chunk sort — the native one with its
// copies, the library one through its NCCL group's sends and receives (as
// bytes); the combine's rows stay bf16.
func (a *Device) FP8Unavailable(dispatchers.Env) string { return "" }

// Device is the alltoall dispatcher over device ranks.
type Device struct {
	shape   dispatchers.Shape
	ranks   []*dispatchers.DeviceRank
	st      []devState
	library bool
	fp8     bool      // --precision fp8: the dispatched rows are packed e4m3 rows with their scales
	comm    comm.Comm // the library implementation's
	ownComm bool      // opened by Bind (else the layer's, spanning processes)
}

// devState is one rank's buffers. Row counts are known on the host after the
// count exchange, as in Megatron (its one host sync).
type devState struct {
	rows, pos, counts device.Addr // [n] permuted row → slot, [n] slot → row, [Experts] int32
	permX, permY      device.Addr // [n, h] copies to send, outputs returned (permuted order)
	permP             device.Addr // [n] fp32
	// counts as the host reads them: page-locked memory the permute's
	// asynchronous copy fills (hostCounts views it)
	mapped     device.MappedHost
	hostCounts []int32 // [Experts]
	sendOff    []int   // [EP+1] first permuted row for each destination rank
	fresh      bool    // hostCounts and sendOff are this step's (HostWait)
	// the library implementation's side of the exchange being queued
	sends, recvs []comm.PeerTransfer
	// the library implementation's count all-gather: every rank's
	// per-expert counts [EP, Experts] int32 on the device and on the host
	allCounts device.Addr
	peer      []int32

	// receive side: chunk (source s, local expert l) has chunkN[s][l] rows at
	// recvOff[s][l] of the [source][local] receive buffer
	chunkN, recvOff [][]int
	recvCounts      device.Addr // [EP·L] int32 chunkN on the device, for the chunk sort
	recvX, recvP    device.Addr // [cap, h], [cap]
	recvY           device.Addr // [cap, h]
	received        int
	recv            device.RowCapacity // recvX, recvP, recvY, ExpertX, ExpertProbs

	combined device.Event
	fixed    int64 // bytes of the buffers Bind allocated

	// the backward's (devbackward.go): unpermuted and returned are
	// recorded after the rank's copies' output gradients are gathered and
	// after its input gradients are pushed back; bwd sizes ExpertDY;
	// bwdFixed is the bytes of DX and DProbs; backward: a backward ran
	// (its bytes count in Traffic)
	unpermuted, returned device.Event
	bwd                  device.RowCapacity
	bwdFixed             int64
	backward             bool
}

func (a *Device) Name() string { return "alltoall" }
func (a *Device) Impl() string {
	if a.library {
		return dispatchers.ImplLibrary
	}
	return dispatchers.ImplNative
}

// Bind allocates each rank's fixed-size buffers and events on its device;
// the library implementation first opens its communicator, and is
// unavailable without one.
func (a *Device) Bind(shape dispatchers.Shape, ranks []*dispatchers.DeviceRank) error {
	if len(ranks) != shape.EP {
		return fmt.Errorf("alltoall: %d ranks, shape says EP = %d", len(ranks), shape.EP)
	}
	a.shape, a.ranks = shape, ranks
	if a.library {
		if err := a.openComm(); err != nil {
			return err
		}
	}
	a.st = make([]devState, shape.EP)
	n, h, L := int64(shape.Tokens*shape.TopK), int64(shape.Hidden), shape.LocalExperts()
	// permX's rows: packed e4m3 rows and their scales at fp8, narrower than
	// the bf16 input gradients the backward moves through it
	w := max(int64(shape.DispatchWidth()), h)
	for r := range a.st {
		s, dev := &a.st[r], ranks[r].Dev
		if dev == nil { // another process's rank
			continue
		}
		var err error
		if s.fixed, err = device.Resize(dev, 1, device.RowBuffer{P: &s.rows, PerRow: 4 * n}, device.RowBuffer{P: &s.pos, PerRow: 4 * n},
			device.RowBuffer{P: &s.counts, PerRow: 4 * int64(shape.Experts)}, device.RowBuffer{P: &s.permX, PerRow: 2 * n * w},
			device.RowBuffer{P: &s.permY, PerRow: 2 * n * h}, device.RowBuffer{P: &s.permP, PerRow: 4 * n},
			device.RowBuffer{P: &s.recvCounts, PerRow: 4 * int64(shape.Experts)}); err != nil {
			return err
		}
		if a.library {
			held, err := device.Resize(dev, 1, device.RowBuffer{P: &s.allCounts, PerRow: 4 * int64(shape.EP*shape.Experts)})
			if s.fixed += held; err != nil {
				return err
			}
			s.peer = make([]int32, shape.EP*shape.Experts)
		}
		if s.mapped, err = dev.AllocMapped(4 * int64(shape.Experts)); err != nil {
			return err
		}
		s.hostCounts = unsafe.Slice((*int32)(s.mapped.Host), shape.Experts)
		s.sendOff = make([]int, shape.EP+1)
		s.chunkN, s.recvOff = make([][]int, shape.EP), make([][]int, shape.EP)
		for src := range shape.EP {
			s.chunkN[src], s.recvOff[src] = make([]int, L), make([]int, L)
		}
		for _, e := range []*device.Event{&s.combined, &s.unpermuted, &s.returned} {
			if *e, err = dev.NewEvent(); err != nil {
				return err
			}
		}
		ranks[r].ExpertRows = make([]int, L)
	}
	return nil
}

// openComm takes the layer's communicator over the ranks of every process
// (DeviceRank.Comm), or opens one over this process's ranks; without one
// the library implementation is unavailable.
func (a *Device) openComm() error {
	for _, rk := range a.ranks {
		if rk.Comm != nil {
			a.comm = rk.Comm
			return nil
		}
	}
	devs, streams := make([]device.Device, len(a.ranks)), make([]device.Stream, len(a.ranks))
	for r, rk := range a.ranks {
		devs[r], streams[r] = rk.Dev, rk.Stream
	}
	var err error
	var no *comm.NoCommError
	if a.comm, err = comm.OpenComm(a.ranks[0].Threads, devs, streams); errors.As(err, &no) {
		return &dispatchers.UnavailableError{Name: "alltoall", Impl: dispatchers.ImplLibrary, Reason: "NCCL: " + no.Reason}
	}
	a.ownComm = err == nil
	return err
}

// Permute orders rank r's copies expert-major (also destination-rank major)
// and gathers their rows and probabilities, and queues the copy of its
// per-expert counts to page-locked host memory (Megatron's non-blocking
// copy of tokens per expert, which its one host sync waits for).
func (a *Device) Permute(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	n := sh.Tokens * sh.TopK
	s.fresh = false
	if err := rk.Dev.PermuteOrder(rk.Idx, n, sh.Experts, s.rows, s.pos, s.counts, rk.Stream); err != nil {
		return err
	}
	if err := rk.Dev.GatherRows(s.permX, rk.X, s.rows, sh.TopK, n, sh.DispatchWidth(), rk.Stream); err != nil {
		return err
	}
	if err := rk.Dev.GatherF32(s.permP, rk.Probs, s.rows, 1, n, rk.Stream); err != nil {
		return err
	}
	return rk.Dev.DownloadAsync(s.mapped, s.counts, 4*int64(sh.Experts), rk.Stream)
}

// HostWait is rank r's part of the count exchange before dispatch: its
// wait for the counts its permute copied to the host (every rank's copies
// were queued first, each rank waits on its GPU's thread, so they
// overlap).
func (a *Device) HostWait(phase string, r int) error {
	if phase != "dispatch" {
		return nil
	}
	return a.exchangeCounts(r) // every step's: Permute may have been replayed from a graph, not called
}

// WaitsBefore: the count exchange, before dispatch.
func (a *Device) WaitsBefore(phase string) bool { return phase == "dispatch" }

// GraphKey: from dispatch on, the step's GPU work is set by every rank's
// counts (the host sizes every copy and chunk with them); before, by
// nothing that changes between steps.
func (a *Device) GraphKey(phase string) string {
	if phase != "dispatch" {
		return ""
	}
	b := make([]byte, 0, 4*len(a.st)*a.shape.Experts)
	for _, s := range a.st {
		b = append(b, unsafe.Slice((*byte)(s.mapped.Host), 4*a.shape.Experts)...)
	}
	return string(b)
}

// NoGraph: the library implementation's NCCL group is not captured in this
// build.
func (a *Device) NoGraph() string {
	if a.library {
		return "alltoall's library implementation (NCCL) is not captured into graphs in this build"
	}
	return ""
}

// exchangeCounts is rank src's part of the count all-gather: its
// per-expert counts reach the host (waiting for its permute and its copy),
// where every rank's dispatch reads them.
func (a *Device) exchangeCounts(src int) error {
	sh := a.shape
	L := sh.LocalExperts()
	s, rk := &a.st[src], a.ranks[src]
	if a.library { // Megatron's count exchange over NCCL: every rank's counts to every rank
		E := int64(sh.Experts)
		s.sends, s.recvs = s.sends[:0], s.recvs[:0]
		for d := range sh.EP {
			s.sends = append(s.sends, comm.PeerTransfer{Peer: d, Buf: s.counts, Bytes: 4 * E})
			s.recvs = append(s.recvs, comm.PeerTransfer{Peer: d, Buf: s.allCounts + device.Addr(4*E*int64(d)), Bytes: 4 * E})
		}
		if err := a.comm.Exchange(src, s.sends, s.recvs); err != nil {
			return err
		}
		if err := rk.Dev.Download(s.peer, s.allCounts, rk.Stream); err != nil { // waits for the stream
			return err
		}
		copy(s.hostCounts, s.peer[src*sh.Experts:(src+1)*sh.Experts])
	} else if err := rk.Dev.SyncStream(rk.Stream); err != nil {
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
	s.fresh = true
	return nil
}

// Dispatch is rank r's receive side: pull each source's rows for r's experts
// into a [source][local expert] buffer, then sort the chunks into [local
// expert][source] order (ExpertX). At EP 1 the native implementation, as
// Megatron's dispatcher, moves nothing: the permuted rows are ExpertX, and
// the expert outputs go straight to the unpermute. The library
// implementation issues rank r's sends (its rows for every rank) and
// receives as one NCCL group on its stream, then sorts its chunks. Every
// rank's counts reached the host in HostWait.
func (a *Device) Dispatch(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	if !s.fresh {
		return fmt.Errorf("alltoall: rank %d's dispatch before its counts reached the host (HostWait)", r)
	}
	L, h := sh.LocalExperts(), int64(sh.DispatchWidth()) // the dispatched rows' width
	total := 0
	clear(rk.ExpertRows)
	for src := range sh.EP {
		for l := range L {
			c := int(a.countsOf(r, src)[r*L+l])
			s.chunkN[src][l], s.recvOff[src][l] = c, total
			rk.ExpertRows[l] += c
			total += c
		}
	}
	s.received = total
	if sh.EP == 1 && !a.library { // as Megatron at EP 1: no all-to-all and no chunk sort, the permuted rows are the experts'
		rk.ExpertX, rk.ExpertProbs = s.permX, s.permP
		return nil
	}
	if err := a.grow(r, total); err != nil {
		return err
	}
	if a.library {
		if err := a.exchangeRows(r); err != nil {
			return err
		}
		return a.sortChunks(r)
	}
	for src := range sh.EP {
		ss, from := &a.st[src], a.ranks[src].Dev
		lo, rows := int64(ss.sendOff[r]), int64(ss.sendOff[r+1]-ss.sendOff[r])
		at := int64(s.recvOff[src][0])
		// the rows, their probabilities and the source's counts for r's
		// experts (a device copy: an upload from host memory would wait for
		// the stream); no wait for the source's permute: the count exchange
		// waited for every rank's stream on the host (and a CUDA graph
		// capture of the dispatch may not wait for an event recorded before
		// it)
		ops := [3]device.CopyOp{
			{Dst: s.recvX + device.Addr(2*at*h), Src: ss.permX + device.Addr(2*lo*h), Bytes: 2 * rows * h, SrcDev: from},
			{Dst: s.recvP + device.Addr(4*at), Src: ss.permP + device.Addr(4*lo), Bytes: 4 * rows, SrcDev: from},
			{Dst: s.recvCounts + device.Addr(4*src*L), Src: ss.counts + device.Addr(4*r*L), Bytes: int64(4 * L), SrcDev: from},
		}
		for _, op := range ops {
			if err := rk.Dev.CopyPeer(op, rk.Stream); err != nil {
				return err
			}
		}
	}
	return a.sortChunks(r)
}

// countsOf is rank src's per-expert counts as rank r's host has them:
// every rank's own in the native implementation (one process), the
// all-gathered ones in the library's.
func (a *Device) countsOf(r, src int) []int32 {
	if a.library {
		E := a.shape.Experts
		return a.st[r].peer[src*E : (src+1)*E]
	}
	return a.st[src].hostCounts
}

// fromRows is how many rows rank src sends rank r (set by r's Dispatch).
func (s *devState) fromRows(src int) int64 {
	n := 0
	for _, c := range s.chunkN[src] {
		n += c
	}
	return int64(n)
}

// exchangeRows is rank r's side of the dispatch's NCCL group: to each rank
// d, its rows for d's experts, their probabilities and its counts for d's
// experts; from each rank, the same for r, into r's [source][local expert]
// receive buffers.
func (a *Device) exchangeRows(r int) error {
	s, sh := &a.st[r], a.shape
	L, h := sh.LocalExperts(), int64(sh.DispatchWidth())
	s.sends, s.recvs = s.sends[:0], s.recvs[:0]
	for d := range sh.EP {
		lo, rows := int64(s.sendOff[d]), int64(s.sendOff[d+1]-s.sendOff[d])
		s.sends = append(s.sends, comm.PeerTransfer{Peer: d, Buf: s.permX + device.Addr(2*lo*h), Bytes: 2 * rows * h},
			comm.PeerTransfer{Peer: d, Buf: s.permP + device.Addr(4*lo), Bytes: 4 * rows},
			comm.PeerTransfer{Peer: d, Buf: s.counts + device.Addr(4*d*L), Bytes: int64(4 * L)})
	}
	for src := range sh.EP {
		rows, at := s.fromRows(src), int64(s.recvOff[src][0])
		s.recvs = append(s.recvs, comm.PeerTransfer{Peer: src, Buf: s.recvX + device.Addr(2*at*h), Bytes: 2 * rows * h},
			comm.PeerTransfer{Peer: src, Buf: s.recvP + device.Addr(4*at), Bytes: 4 * rows},
			comm.PeerTransfer{Peer: src, Buf: s.recvCounts + device.Addr(4*src*L), Bytes: int64(4 * L)})
	}
	return a.comm.Exchange(r, s.sends, s.recvs)
}

// sortChunks orders rank r's received chunks by local expert (ExpertX).
func (a *Device) sortChunks(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	return rk.Dev.SortChunks(rk.ExpertX, rk.ExpertProbs, s.recvX, s.recvP, s.recvCounts, s.received, sh.EP, sh.LocalExperts(), sh.DispatchWidth(), false, rk.Stream)
}

// grow makes rank r's receive and expert-input buffers hold rows rows.
func (a *Device) grow(r, rows int) error {
	s, rk, h, w := &a.st[r], a.ranks[r], int64(a.shape.Hidden), int64(a.shape.DispatchWidth())
	// recvX holds the dispatched rows (w wide), and in the backward bf16 rows
	return s.recv.Ensure(rk.Dev, rk.Stream, rows, device.RowBuffer{P: &s.recvX, PerRow: 2 * max(w, h)}, device.RowBuffer{P: &s.recvP, PerRow: 4},
		device.RowBuffer{P: &s.recvY, PerRow: 2 * h}, device.RowBuffer{P: &rk.ExpertX, PerRow: 2 * w}, device.RowBuffer{P: &rk.ExpertProbs, PerRow: 4})
}

// Combine is rank r's send side on the way back: unsort its expert outputs
// into [source][local expert] order and push each source's rows into that
// source's permuted output buffer (the library implementation: rank r's
// NCCL group sends them and receives its own rows' outputs).
func (a *Device) Combine(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	h := int64(sh.Hidden)
	if sh.EP == 1 && !a.library { // the expert outputs are in permuted order already (see Dispatch)
		return nil
	}
	if err := rk.Dev.SortChunks(s.recvY, 0, rk.ExpertY, 0, s.recvCounts, s.received, sh.EP, sh.LocalExperts(), sh.Hidden, true, rk.Stream); err != nil {
		return err
	}
	if a.library {
		s.sends, s.recvs = s.sends[:0], s.recvs[:0]
		for src := range sh.EP {
			rows, from := s.fromRows(src), int64(s.recvOff[src][0])
			s.sends = append(s.sends, comm.PeerTransfer{Peer: src, Buf: s.recvY + device.Addr(2*from*h), Bytes: 2 * rows * h})
		}
		for d := range sh.EP {
			lo, rows := int64(s.sendOff[d]), int64(s.sendOff[d+1]-s.sendOff[d])
			s.recvs = append(s.recvs, comm.PeerTransfer{Peer: d, Buf: s.permY + device.Addr(2*lo*h), Bytes: 2 * rows * h})
		}
		return a.comm.Exchange(r, s.sends, s.recvs)
	}
	for src := range sh.EP {
		ss := &a.st[src]
		lo, rows := int64(ss.sendOff[r]), int64(ss.sendOff[r+1]-ss.sendOff[r])
		from := int64(s.recvOff[src][0])
		op := device.CopyOp{Dst: ss.permY + device.Addr(2*lo*h), Src: s.recvY + device.Addr(2*from*h), Bytes: 2 * rows * h, DstDev: a.ranks[src].Dev}
		if err := rk.Dev.CopyPeer(op, rk.Stream); err != nil {
			return err
		}
	}
	return rk.Dev.Record(s.combined, rk.Stream)
}

// Unpermute waits for every rank's combine (the native implementation's
// copies) and sums each token's k outputs (plus the shared expert's) into Y.
func (a *Device) Unpermute(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	if sh.EP == 1 && !a.library {
		return rk.Dev.UnpermuteSum(rk.Y, rk.ExpertY, s.pos, rk.Shared, sh.Tokens, sh.TopK, sh.Hidden, rk.Stream)
	}
	for d := range a.st {
		if a.library { // the library's receives are on this rank's stream
			break
		}
		if err := rk.Dev.Wait(rk.Stream, a.st[d].combined); err != nil {
			return err
		}
	}
	return rk.Dev.UnpermuteSum(rk.Y, s.permY, s.pos, rk.Shared, sh.Tokens, sh.TopK, sh.Hidden, rk.Stream)
}

// Traffic counts as A2A.Traffic does, and says what moved the bytes.
func (a *Device) Traffic() dispatchers.Traffic {
	sendOff := make([][]int, len(a.st))
	for r := range a.st {
		sendOff[r] = a.st[r].sendOff
	}
	if a.library { // every rank's, from the counts this process's first rank gathered
		L := a.shape.LocalExperts()
		first := slices.IndexFunc(a.ranks, func(rk *dispatchers.DeviceRank) bool { return rk.Dev != nil })
		for src := range sendOff {
			so, counts := make([]int, a.shape.EP+1), a.countsOf(first, src)
			for d := range a.shape.EP {
				so[d+1] = so[d]
				for _, c := range counts[d*L : (d+1)*L] {
					so[d+1] += int(c)
				}
			}
			sendOff[src] = so
		}
	}
	t := traffic(a.shape, sendOff, dispatchers.PrecisionOf(a.fp8))
	if len(a.st) > 0 && a.st[0].backward {
		backwardTraffic(&t, a.shape.Hidden)
	}
	if a.comm != nil {
		t.Formula += "; moved by " + a.Transport()
	}
	return t
}

// Transport names the library that moves the data between ranks ("" for
// the native implementation's copies).
func (a *Device) Transport() string {
	if a.comm == nil {
		return ""
	}
	return a.comm.Name()
}

// Footprint is the bytes of rank r's dispatcher buffers, ExpertX and
// ExpertProbs included (not the library's own buffers).
func (a *Device) Footprint(r int) int64 {
	return a.st[r].fixed + a.st[r].recv.Bytes + a.st[r].bwd.Bytes + a.st[r].bwdFixed
}

// Close frees every buffer the dispatcher allocated.
func (a *Device) Close() error {
	var first error
	for r := range a.st {
		s, rk := &a.st[r], a.ranks[r]
		if rk.Dev == nil {
			continue
		}
		if rk.ExpertX == s.permX { // EP 1: shared, see Dispatch
			rk.ExpertX, rk.ExpertProbs = 0, 0
		}
		if rk.ExpertDY == s.permY { // EP 1: shared, see UnpermuteBackward
			rk.ExpertDY = 0
		}
		if err := device.Free(rk.Dev, &s.rows, &s.pos, &s.counts, &s.permX, &s.permY, &s.permP, &s.recvCounts, &s.allCounts,
			&s.recvX, &s.recvP, &s.recvY, &rk.ExpertX, &rk.ExpertProbs, &rk.ExpertDY, &rk.DX, &rk.DProbs); first == nil {
			first = err
		}
		s.fixed, s.recv, s.bwd, s.bwdFixed = 0, device.RowCapacity{}, device.RowCapacity{}, 0
		if s.mapped.Host != nil {
			if err := rk.Dev.FreeMapped(s.mapped); first == nil {
				first = err
			}
			s.mapped, s.hostCounts = device.MappedHost{}, nil
		}
	}
	if a.comm != nil && a.ownComm {
		if err := a.comm.Close(); first == nil {
			first = err
		}
	}
	a.comm = nil
	return first
}
