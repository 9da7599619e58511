// Package alltoall is Megatron-Core's alltoall token dispatcher: a local
// expert-major permute, an all-gather of per-expert counts (the one host sync),
// a variable-split all-to-all of the token copies and their probabilities, and
// a sort of the received chunks by local expert; combine is the exact inverse.
//
// The design notes: docs/dispatchers/alltoall.md.
package alltoall

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
)

func init() { dispatchers.Register("alltoall", New) }

// New returns the native alltoall dispatcher on host ranks (NewDevice is its
// device implementation).
func New(impl string, env dispatchers.Env) (dispatchers.Dispatcher, error) {
	if impl != dispatchers.ImplNative {
		return nil, &dispatchers.UnavailableError{Name: "alltoall", Impl: impl,
			Reason: "the library implementation (NCCL send/recv between GPUs) needs the cuda device"}
	}
	if env.Device != "host" {
		return nil, &dispatchers.UnavailableError{Name: "alltoall", Impl: impl,
			Reason: fmt.Sprintf("device %q is not supported by this build (host only)", env.Device)}
	}
	return &A2A{precision: env.Precision}, nil
}

// A2A is the alltoall dispatcher over host ranks.
type A2A struct {
	shape    dispatchers.Shape
	ranks    []*dispatchers.Rank
	st       []state
	backward bool // the last step ran the backward
	fp8      bool // the last dispatch moved e4m3 rows with their scales (Rank.Scales set)
	// precision is the run's (Env.Precision): at fp8 a row's scales are
	// h/128 fp32 multipliers, at mxfp8 h/32 E8M0 scales (held as their
	// exact float32 powers of two)
	precision string
}

// state is one rank's private buffers.
type state struct {
	slots   []int32   // permuted row → flat slot t·k+j
	counts  []int     // [Experts] copies this rank sends to each global expert
	sendOff []int     // [EP+1] first permuted row destined to each rank
	permX   []float32 // [T·k, h] permuted copies
	permP   []float32 // [T·k] their probabilities
	permS   []float32 // [T·k, h/128] fp8 ([T·k, h/32] mxfp8): their scales
	permY   []float32 // [T·k, h] expert outputs returned, permuted order

	// receive side, filled by Dispatch
	recvX []float32 // [N, h] received, ordered [source][local expert]
	recvP []float32
	recvS []float32 // fp8: the rows' scales
	// chunk (local expert l, source s) lies at recvOff[s][l] in recvX and at
	// expOff[l][s] in ExpertX; chunkN[s][l] rows.
	recvOff, chunkN [][]int
	recvY           []float32
}

func (a *A2A) Name() string { return "alltoall" }
func (a *A2A) Impl() string { return dispatchers.ImplNative }

// Bind sizes the per-rank buffers.
func (a *A2A) Bind(shape dispatchers.Shape, ranks []*dispatchers.Rank) error {
	if len(ranks) != shape.EP {
		return fmt.Errorf("alltoall: %d ranks, shape says EP = %d", len(ranks), shape.EP)
	}
	a.shape, a.ranks = shape, ranks
	a.st = make([]state, shape.EP)
	n := shape.Tokens * shape.TopK
	for r := range a.st {
		s := &a.st[r]
		s.permX = make([]float32, n*shape.Hidden)
		s.permP = make([]float32, n)
		s.permY = make([]float32, n*shape.Hidden)
		s.chunkN, s.recvOff = make([][]int, shape.EP), make([][]int, shape.EP)
		for src := range shape.EP {
			s.chunkN[src], s.recvOff[src] = make([]int, shape.LocalExperts()), make([]int, shape.LocalExperts())
		}
	}
	return nil
}

// Permute sorts rank r's copies expert-major, which is also destination-rank
// major because each rank owns a contiguous range of experts.
func (a *A2A) Permute(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	if r == 0 {
		a.backward, a.fp8 = false, rk.Scales != nil
	}
	s.slots, s.counts = kernels.PermuteOrder(rk.Idx, sh.Tokens, sh.TopK, sh.Experts, s.slots, s.counts)
	kernels.GatherRows(s.permX, rk.X, s.slots, sh.TopK, sh.Hidden)
	kernels.GatherRows(s.permP, rk.Probs, s.slots, 1, 1)
	if a.fp8 { // the scales travel with their rows
		S := dispatchers.ScaleWidth(a.precision, sh.Hidden)
		s.permS = kernels.Reslice(s.permS, len(s.slots)*S)
		kernels.GatherRows(s.permS, rk.Scales, s.slots, sh.TopK, S)
	}
	s.sendOff = kernels.Reslice(s.sendOff, sh.EP+1)
	L := sh.LocalExperts()
	for d := range sh.EP {
		n := 0
		for _, c := range s.counts[d*L : (d+1)*L] {
			n += c
		}
		s.sendOff[d+1] = s.sendOff[d] + n
	}
	return nil
}

// Dispatch is rank r's receive side: the count all-gather (host-visible
// counts), the variable-split exchange into a [source][local expert] buffer,
// and the chunk sort into [local expert][source] order.
func (a *A2A) Dispatch(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	L, h := sh.LocalExperts(), sh.Hidden
	// count exchange: what every source sends to each of r's local experts
	total := 0
	for src := range sh.EP {
		copy(s.chunkN[src], a.st[src].counts[r*L:(r+1)*L])
		for l, c := range s.chunkN[src] {
			s.recvOff[src][l] = total
			total += c
		}
	}
	s.recvX = kernels.Reslice(s.recvX, total*h)
	s.recvP = kernels.Reslice(s.recvP, total)
	rk.ExpertX = kernels.Reslice(rk.ExpertX, total*h)
	rk.ExpertProbs = kernels.Reslice(rk.ExpertProbs, total)
	a.deliver(r, h, s.recvX, rk.ExpertX, func(ss *state) []float32 { return ss.permX })
	a.deliver(r, 1, s.recvP, rk.ExpertProbs, func(ss *state) []float32 { return ss.permP })
	if a.fp8 {
		S := dispatchers.ScaleWidth(a.precision, h)
		s.recvS = kernels.Reslice(s.recvS, total*S)
		rk.ExpertScales = kernels.Reslice(rk.ExpertScales, total*S)
		a.deliver(r, S, s.recvS, rk.ExpertScales, func(ss *state) []float32 { return ss.permS })
	}
	rk.Segments = rk.Segments[:0]
	at := 0
	for l := range L {
		n := 0
		for src := range sh.EP {
			n += s.chunkN[src][l]
		}
		rk.Segments = append(rk.Segments, dispatchers.Segment{Expert: r*L + l, Start: at, Len: n})
		at += n
	}
	return nil
}

// deliver is rank r's receive side of an all-to-all in the dispatch
// direction, rows of width values: each source's rows for r (rows
// [sendOff[r], sendOff[r+1]) of from(source)) into recv, [source][local
// expert], then the chunk sort into dst, [local expert][source].
func (a *A2A) deliver(r, width int, recv, dst []float32, from func(ss *state) []float32) {
	s, sh := &a.st[r], a.shape
	for src := range sh.EP {
		ss := &a.st[src]
		lo, hi := ss.sendOff[r], ss.sendOff[r+1]
		copy(recv[s.recvOff[src][0]*width:], from(ss)[lo*width:hi*width])
	}
	a.sortChunks(r, width, recv, dst, true)
}

// sortChunks moves rank r's rows of width values between its receive
// order, [source][local expert] (recv), and expert-major order, [local
// expert][source] (rows): into rows when toExperts, else back into recv.
func (a *A2A) sortChunks(r, width int, recv, rows []float32, toExperts bool) {
	s, sh := &a.st[r], a.shape
	at := 0
	for l := range sh.LocalExperts() {
		for src := range sh.EP {
			n, off := s.chunkN[src][l], s.recvOff[src][l]
			x, y := rows[at*width:(at+n)*width], recv[off*width:(off+n)*width]
			if toExperts {
				copy(x, y)
			} else {
				copy(y, x)
			}
			at += n
		}
	}
}

// Combine is rank r's send side on the way back: unsort its expert outputs
// into [source][local expert] order and return each source's chunk into that
// source's permuted output buffer.
func (a *A2A) Combine(r int) error {
	s, rk := &a.st[r], a.ranks[r]
	n, h := a.received(r), a.shape.Hidden
	if len(rk.ExpertY) < n*h {
		return fmt.Errorf("alltoall: rank %d: expert output has %d values, want %d", r, len(rk.ExpertY), n*h)
	}
	s.recvY = kernels.Reslice(s.recvY, n*h)
	a.giveBack(r, h, rk.ExpertY, s.recvY, func(ss *state) []float32 { return ss.permY })
	return nil
}

// received is the rows rank r received in the last dispatch.
func (a *A2A) received(r int) int {
	s, sh := &a.st[r], a.shape
	return s.recvOff[sh.EP-1][sh.LocalExperts()-1] + s.chunkN[sh.EP-1][sh.LocalExperts()-1]
}

// giveBack is rank r's send side of an all-to-all in the combine
// direction, rows of width values: its expert-major rows src unsorted into
// recv, [source][local expert], then each source's chunk into that
// source's permuted rows (rows [sendOff[r], sendOff[r+1]) of to(source)).
func (a *A2A) giveBack(r, width int, src, recv []float32, to func(ss *state) []float32) {
	s, sh := &a.st[r], a.shape
	a.sortChunks(r, width, recv, src, false)
	for from := range sh.EP {
		ss := &a.st[from]
		lo, hi := ss.sendOff[r], ss.sendOff[r+1]
		at := s.recvOff[from][0]
		copy(to(ss)[lo*width:hi*width], recv[at*width:(at+hi-lo)*width])
	}
}

// Unpermute sums each token's k returned outputs into Rank.Y.
func (a *A2A) Unpermute(r int) error {
	s, rk, sh := &a.st[r], a.ranks[r], a.shape
	rk.Y = kernels.Reslice(rk.Y, sh.Tokens*sh.Hidden)
	clear(rk.Y)
	kernels.ScatterAddRows(rk.Y, s.permY, s.slots, sh.TopK, sh.Hidden)
	return nil
}

// Traffic counts every token copy once per direction: dispatch moves the
// bf16 row and its fp32 probability, combine the bf16 output row.
func (a *A2A) Traffic() dispatchers.Traffic {
	sendOff := make([][]int, len(a.st))
	for r := range a.st {
		sendOff[r] = a.st[r].sendOff
	}
	tr := traffic(a.shape, sendOff, a.moved())
	if a.backward {
		backwardTraffic(&tr, a.shape.Hidden)
	}
	return tr
}

// traffic is the bytes of a step whose rank src sends rows
// [sendOff[src][d], sendOff[src][d+1]) of its permuted copies to rank d.
// precision is the dispatch's: bf16, fp8 or mxfp8.
func traffic(sh dispatchers.Shape, sendOff [][]int, precision string) dispatchers.Traffic {
	var off, all int64
	for src, so := range sendOff {
		for d := range sh.EP {
			n := int64(so[d+1] - so[d])
			all += n
			if d != src {
				off += n
			}
		}
	}
	row, in := int64(sh.Hidden)*2, dispatchers.RowBytes(precision, sh.Hidden)
	alg := "DeepEP's convention (rows received × hidden × 2 B, a rank's rows to itself included); alltoall's rows are copies"
	if precision != dispatchers.PrecisionBF16 {
		alg = "DeepEP's convention (rows received × its row: hidden × 2 B bf16, or at " + precision + " " + dispatchers.RowFormula(precision) +
			", as test_intranode's fp8 factor; a rank's rows to itself included); alltoall's rows are copies; combine bf16"
	}
	return dispatchers.Traffic{
		DispatchOffRank: off * (in + 4), DispatchLogical: all * (in + 4),
		CombineOffRank: off * row, CombineLogical: all * row,
		Formula: "dispatch = copies × (" + dispatchers.RowFormula(precision) + " + 4 B fp32 prob); combine = copies × hidden×2 B; " +
			"a copy is one (token, expert) pair, so a token routed to two experts of one rank is sent twice; off-rank excludes copies to the token's own rank",
		DispatchAlgorithm: all * in, CombineAlgorithm: all * row,
		AlgorithmFormula: alg,
	}
}

// Footprint counts the rank's private buffers (float32 and int32 elements).
func (a *A2A) Footprint(r int) int64 {
	s := &a.st[r]
	n := cap(s.permX) + cap(s.permP) + cap(s.permY) + cap(s.recvX) + cap(s.recvP) + cap(s.recvY) + cap(s.slots) + cap(s.permS) + cap(s.recvS)
	return 4 * int64(n)
}

// moved is the precision of the last dispatch's rows.
func (a *A2A) moved() string {
	if !a.fp8 {
		return dispatchers.PrecisionBF16
	}
	return a.precision
}

// MXFP8Unavailable: at mxfp8 the host alltoall moves the e4m3 rows and
// their E8M0 scales (h/32 a row) through the same exchange, as at fp8
// (Megatron's alltoall dispatcher under TransformerEngine's MXFP8 recipe
// sends the quantized tensor's data and scales); it can at every shape.
func (a *A2A) MXFP8Unavailable(dispatchers.Env) string { return "" }

// FP8Unavailable: the host alltoall moves the e4m3 rows and their 1×128
// scales through the same variable-split exchange (Megatron's alltoall
// dispatcher with an FP8 payload); it can at every shape.
func (a *A2A) FP8Unavailable(dispatchers.Env) string { return "" }
