package deepep

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
)

// Host is the design on host ranks (see docs/dispatchers/deepep.md).
type Host struct {
	cfg   Config
	sms   int  // --sms as given (0: the default)
	fixed bool // cfg was given (WithConfig), not DeepEP's default for the EP size
	shape dispatchers.Shape
	ranks []*dispatchers.Rank
	st    []rankState
	q     []queue // one ring per peer, reused channel after channel
	slots []int32 // the permute's order (scratch)
	// backward: the last step ran the backward (its bytes and the combine
	// queue's probability gradients count)
	backward bool
	fp8      bool // the last dispatch moved e4m3 rows with their scales (Rank.Scales set)
}

// WithConfig returns the host implementation with cfg instead of DeepEP's
// recommended configuration (tests use small rings that wrap).
func WithConfig(cfg Config) *Host {
	return &Host{cfg: cfg, sms: cfg.SMs, fixed: true}
}

// rankState is one rank's buffers: as a source (layout), as a receiver
// (notify, dispatch, permute).
type rankState struct {
	// layout
	inRank    []bool // [T, N] token t goes to rank d (is_token_in_rank)
	perRank   []int  // [N] tokens sent to each rank
	perExpert []int  // [E] copies sent to each expert
	// notify, as a source: chanEnd[d][c] is the tokens to rank d in
	// channels ≤ c (channel_prefix_matrix)
	chanEnd [][]int
	// notify, as a receiver: srcEnd[s] is the tokens received from sources
	// ≤ s (rank_prefix_matrix's column); expertRows[l] the copies for local
	// expert l; recv the tokens received — what the host waits for
	srcEnd     []int
	expertRows []int
	recv       int
	// dispatch, as a source: sendHead[t·N+d] is token t's position in the
	// stream of queue (its channel, d), or −1
	sendHead []int
	// dispatch, as a receiver: the receive buffer
	recvX   []float32 // [R, h]
	recvSrc []int32   // [R] token index at its source
	recvIdx []int32   // [R, k] local expert, or −1
	recvW   []float32 // [R, k] probability, or 0
	recvS   []float32 // [R, h/128] fp8: the rows' scales
	// permute: permRow[i·k+j] is the expert-major row of received token i's
	// slot j, or −1; counted the rows of each local expert
	permRow []int32
	counted []int
}

func (h *Host) Name() string { return Name }
func (h *Host) Impl() string { return dispatchers.ImplNative }

// Bind sizes the per-rank state; DeepEP's limits make it unavailable
// outside 2, 4 or 8 ranks.
func (h *Host) Bind(shape dispatchers.Shape, ranks []*dispatchers.Rank) error {
	if len(ranks) != shape.EP {
		return fmt.Errorf("deepep: %d ranks, shape says EP = %d", len(ranks), shape.EP)
	}
	if !h.fixed {
		h.cfg = DefaultConfig(shape.EP, h.sms)
	}
	if err := h.cfg.check(shape.EP); err != nil {
		return &dispatchers.UnavailableError{Name: Name, Impl: dispatchers.ImplNative, Reason: err.Error()}
	}
	h.shape, h.ranks = shape, ranks
	N, C := shape.EP, h.cfg.Channels()
	h.st = make([]rankState, N)
	for r := range h.st {
		s := &h.st[r]
		s.inRank = make([]bool, shape.Tokens*N)
		s.perRank, s.perExpert = make([]int, N), make([]int, shape.Experts)
		s.chanEnd = make([][]int, N)
		for d := range s.chanEnd {
			s.chanEnd[d] = make([]int, C)
		}
		s.srcEnd, s.expertRows = make([]int, N), make([]int, shape.LocalExperts())
		s.sendHead = make([]int, shape.Tokens*N)
	}
	h.q = make([]queue, N)
	return nil
}

// Forward is DeepEP's, with Megatron's permute before the experts.
func (h *Host) Forward(experts func(rank int) error) []dispatchers.Step {
	return []dispatchers.Step{{Name: "layout", Run: h.Layout}, {Name: "notify", Run: h.Notify},
		{Name: "dispatch", Run: h.Dispatch}, {Name: "permute", Run: h.Permute},
		{Name: dispatchers.ExpertPhases[0], Run: experts}, {Name: "combine", Run: h.Combine}}
}

// channel is the token range [lo, hi) of channel c of a rank's tokens.
func (h *Host) channel(c int) (lo, hi int) {
	T, C := h.shape.Tokens, h.cfg.Channels()
	per := (T + C - 1) / C
	lo = min(c*per, T)
	return lo, min(lo+per, T)
}

// Layout is rank r's layout: the ranks each token goes to, deduplicated,
// and the counts per rank and per expert.
func (h *Host) Layout(r int) error {
	s, rk, sh := &h.st[r], h.ranks[r], h.shape
	N, k := sh.EP, sh.TopK
	if r == 0 {
		h.backward = false
	}
	clear(s.inRank)
	clear(s.perRank)
	clear(s.perExpert)
	for t := range sh.Tokens {
		for _, e := range rk.Idx[t*k : (t+1)*k] {
			if e < 0 || int(e) >= sh.Experts {
				return fmt.Errorf("deepep: layout on rank %d: token %d has expert %d (of %d)", r, t, e, sh.Experts)
			}
			s.perExpert[e]++
			d := sh.Owner(e)
			if !s.inRank[t*N+d] {
				s.inRank[t*N+d] = true
				s.perRank[d]++
			}
		}
	}
	return nil
}

// Notify is rank r's notify: the counts every source wrote into r's buffer
// (read here from the sources' layouts) summed into prefixes, the received
// tokens and copies per local expert (the counts the host waits for), and
// r's own channel prefix matrix for sending; then the receive buffer is
// sized.
func (h *Host) Notify(r int) error {
	s, sh := &h.st[r], h.shape
	N, L := sh.EP, sh.LocalExperts()
	total := 0
	clear(s.expertRows)
	for src := range N {
		total += h.st[src].perRank[r]
		s.srcEnd[src] = total
		for l := range L {
			s.expertRows[l] += h.st[src].perExpert[r*L+l]
		}
	}
	s.recv = total
	for d := range N {
		n := 0
		for c := range h.cfg.Channels() {
			lo, hi := h.channel(c)
			for t := lo; t < hi; t++ {
				if s.inRank[t*N+d] {
					n++
				}
			}
			s.chanEnd[d][c] = n
		}
		if n != s.perRank[d] {
			return fmt.Errorf("deepep: notify on rank %d: channels hold %d tokens for rank %d, layout counted %d", r, n, d, s.perRank[d])
		}
	}
	R, hd, k := s.recv, sh.Hidden, sh.TopK
	s.recvX = kernels.Reslice(s.recvX, R*hd)
	s.recvSrc = kernels.Reslice(s.recvSrc, R)
	s.recvIdx = kernels.Reslice(s.recvIdx, R*k)
	s.recvW = kernels.Reslice(s.recvW, R*k)
	if r == 0 {
		h.fp8 = h.ranks[0].Scales != nil
	}
	if h.fp8 {
		s.recvS = kernels.Reslice(s.recvS, R*dispatchers.ScaleWidth(dispatchers.PrecisionFP8, hd))
	}
	return nil
}

// Dispatch is rank r's receive side: every source's rounds into r's queues,
// and r's drains of them into the receive buffer.
func (h *Host) Dispatch(r int) error {
	s := &h.st[r]
	return h.transfer(r, "dispatch", func(src int) []float32 { return h.ranks[src].X }, s.recvX, true)
}

// transfer is rank r's side of a dispatch through the queues: every
// source's rounds of its tokens for r (rows from rows(src)) into r's
// queues, channel by channel, and r's drains into recv, source by source in
// token order. A fresh transfer (the forward's dispatch) records send_head
// and sends each token's source index and top-k with its row; otherwise
// (the backward's, DeepEP's dispatch with the forward's handle) the rows
// travel with their source index alone, which must be the token the
// forward placed there.
func (h *Host) transfer(r int, phase string, rows func(src int) []float32, recv []float32, fresh bool) error {
	s, sh := &h.st[r], h.shape
	N, k, C, hd := sh.EP, sh.TopK, h.cfg.Channels(), sh.Hidden
	meta, sw := 0, 0
	if fresh {
		meta = k
		if h.fp8 { // the forward's dispatch of e4m3 rows: their scales in the same slots
			sw = dispatchers.ScaleWidth(dispatchers.PrecisionFP8, hd)
		}
	}
	for src := range N {
		ss, x, idx, probs, scales := &h.st[src], rows(src), h.ranks[src].Idx, h.ranks[src].Probs, h.ranks[src].Scales
		base := 0 // r's first row from src
		if src > 0 {
			base = s.srcEnd[src-1]
		}
		for c := range C {
			q := h.q[src].reset(h.cfg.Dispatch.Ring, hd, meta).withScales(sw)
			// the sender publishes the channel's offsets, the receiver reads them
			q.start = 0
			if c > 0 {
				q.start = ss.chanEnd[r][c-1]
			}
			q.end = ss.chanEnd[r][c]
			lo, hi := h.channel(c)
			next := lo // the sender's token cursor
			at := base + q.start
			for left := q.end - q.start; next < hi || left > 0; {
				pushed, before := 0, next
				if next < hi && q.free() >= h.cfg.Dispatch.Chunk { // one round of the sender
					for ; next < hi && pushed < h.cfg.Dispatch.Chunk; next++ {
						if !ss.inRank[next*N+r] {
							if fresh {
								ss.sendHead[next*N+r] = -1
							}
							continue
						}
						if fresh {
							ss.sendHead[next*N+r] = q.tail
						}
						q.push(x[next*hd:(next+1)*hd], scales[next*sw:(next+1)*sw], int32(next), func(j int) (int32, float32) {
							e := idx[next*k+j]
							if sh.Owner(e) != r {
								return -1, 0
							}
							return e - int32(r*sh.LocalExperts()), probs[next*k+j]
						})
						pushed++
					}
				}
				n := q.tail - q.head // the receiver's drain
				for i := range n {
					row := recv[(at+i)*hd : (at+i+1)*hd]
					if fresh {
						q.pop(row, s.recvS[(at+i)*sw:(at+i+1)*sw], &s.recvSrc[at+i], s.recvIdx[(at+i)*k:(at+i+1)*k], s.recvW[(at+i)*k:(at+i+1)*k])
						continue
					}
					var tok int32
					q.pop(row, nil, &tok, nil, nil)
					if tok != s.recvSrc[at+i] {
						return fmt.Errorf("deepep: %s on rank %d: channel %d from rank %d delivered token %d at receive row %d, where the forward put token %d", phase, r, c, src, tok, at+i, s.recvSrc[at+i])
					}
				}
				at, left = at+n, left-n
				if pushed == 0 && n == 0 && next == before {
					return &StallError{Rank: r, Phase: phase, Channel: c, Peer: src, Wait: q.describe(left)}
				}
				if left < 0 {
					return fmt.Errorf("deepep: %s on rank %d: channel %d from rank %d delivered %d tokens more than its offsets say", phase, r, c, src, -left)
				}
			}
		}
	}
	return nil
}

// Permute is rank r's local permute (Megatron's flex dispatcher after
// DeepEP): each received token's copies into expert-major rows, each local
// expert's in received order, with their probabilities.
func (h *Host) Permute(r int) error {
	s, rk, sh := &h.st[r], h.ranks[r], h.shape
	L, k, hd := sh.LocalExperts(), sh.TopK, sh.Hidden
	h.slots = s.order(L, k, h.slots)
	rows := len(h.slots)
	rk.ExpertX = kernels.Reslice(rk.ExpertX, rows*hd)
	rk.ExpertProbs = kernels.Reslice(rk.ExpertProbs, rows)
	for at, slot := range h.slots {
		i := int(slot) / k
		copy(rk.ExpertX[at*hd:(at+1)*hd], s.recvX[i*hd:(i+1)*hd])
		rk.ExpertProbs[at] = s.recvW[slot]
	}
	if h.fp8 { // each copy's scales with its row (Megatron's permute after DeepEP's fp8 dispatch)
		S := dispatchers.ScaleWidth(dispatchers.PrecisionFP8, hd)
		rk.ExpertScales = kernels.Reslice(rk.ExpertScales, rows*S)
		for at, slot := range h.slots {
			i := int(slot) / k
			copy(rk.ExpertScales[at*S:(at+1)*S], s.recvS[i*S:(i+1)*S])
		}
	}
	rk.Segments = rk.Segments[:0]
	at := 0
	for l, n := range s.counted {
		if n != s.expertRows[l] {
			return fmt.Errorf("deepep: permute on rank %d: local expert %d has %d rows, notify counted %d", r, l, n, s.expertRows[l])
		}
		rk.Segments = append(rk.Segments, dispatchers.Segment{Expert: r*L + l, Start: at, Len: n})
		at += n
	}
	return nil
}

// order is the permute's order (deepep.cu's deepep_permute): permRow[i·k+j]
// is the expert-major row of received token i's slot j (−1 when its expert
// is on another rank), local expert 0's copies first, each expert's in
// received order; it returns the slots in row order (reusing slots) and
// counts each expert's rows in s.counted.
func (s *rankState) order(L, k int, slots []int32) []int32 {
	s.permRow = kernels.Reslice(s.permRow, s.recv*k)
	s.counted = kernels.Reslice(s.counted, L)
	clear(s.counted)
	for i := range s.permRow {
		s.permRow[i] = -1
	}
	slots = slots[:0]
	for l := range int32(L) {
		for slot, e := range s.recvIdx[:s.recv*k] {
			if e == l {
				s.permRow[slot] = int32(len(slots))
				slots = append(slots, int32(slot))
				s.counted[l]++
			}
		}
	}
	return slots
}

// Combine is rank r's home side: every expert rank's rounds of partial sums
// into r's queues (channel by channel), and r's float32 sum of each
// token's rows in ascending rank order into Rank.Y.
func (h *Host) Combine(r int) error {
	rk, sh := h.ranks[r], h.shape
	rk.Y = kernels.Reslice(rk.Y, sh.Tokens*sh.Hidden)
	return h.reduce(r, "combine", func(d int) []float32 { return h.ranks[d].ExpertY }, nil, rk.Y, nil)
}

// reduce is home rank r's side of a combine through the queues: every
// expert rank d's rounds of partial sums — each token's float32 sum of its
// local copies' rows of rows(d), in ascending expert order, rounded to
// bf16 — into r's queues, channel by channel, and r's float32 sum of each
// token's rows in ascending rank order into y. With probs (the backward's
// combine of the probability gradients, as Megatron's fused dispatch's
// backward passes topk_weights to DeepEP's combine), each row also carries
// its token's k values of probs(d) (0 at slots not on d), which are summed
// into yk the same way.
func (h *Host) reduce(r int, phase string, rows, probs func(d int) []float32, y, yk []float32) error {
	sh := h.shape
	N, hd, k := sh.EP, sh.Hidden, sh.TopK
	meta := 0
	if probs != nil {
		meta = k
	}
	home := &h.st[r]
	senders := make([]combineSender, N)
	for c := range h.cfg.Channels() {
		for d := range N {
			senders[d] = h.combineSender(d, r, c, rows(d))
			if probs != nil {
				senders[d].probs = probs(d)
			}
			h.q[d].reset(h.cfg.Combine.Ring, hd, meta)
		}
		lo, hi := h.channel(c)
		for t := lo; t < hi; t++ {
			row := y[t*hd : (t+1)*hd]
			clear(row)
			var w []float32
			if probs != nil {
				w = yk[t*k : (t+1)*k]
				clear(w)
			}
			for d := range N {
				want := home.sendHead[t*N+d]
				if want < 0 {
					continue
				}
				q := &h.q[d]
				for q.tail <= want { // the row is not there yet: the sender's rounds
					if !senders[d].round(q, h.cfg.Combine.Chunk) {
						return &StallError{Rank: r, Phase: phase, Channel: c, Peer: d, Wait: q.describe(want + 1 - q.tail)}
					}
				}
				if err := q.add(row, w, want, int32(t)); err != nil {
					return fmt.Errorf("deepep: %s on rank %d, channel %d, from rank %d: %w", phase, r, c, d, err)
				}
				q.head = want + 1
			}
		}
		for d := range N {
			if senders[d].next != senders[d].end {
				return fmt.Errorf("deepep: %s on rank %d, channel %d: rank %d has %d tokens left to send that no token of rank %d expects",
					phase, r, c, d, senders[d].end-senders[d].next, r)
			}
		}
	}
	return nil
}

// combineSender is expert rank d's sender of channel c to home rank s: the
// tokens it received from s through c, rows [next, end) of its receive
// buffer, each sent as the bf16 sum of its local copies' rows of rows (and,
// with probs, their k probability gradients).
type combineSender struct {
	h           *Host
	d           int
	next, end   int
	rows, probs []float32
	sum         []float32
}

func (h *Host) combineSender(d, home, c int, rows []float32) combineSender {
	ds := &h.st[d]
	base := 0
	if home > 0 {
		base = ds.srcEnd[home-1]
	}
	hs := &h.st[home]
	lo, hi := 0, hs.chanEnd[d][c]
	if c > 0 {
		lo = hs.chanEnd[d][c-1]
	}
	return combineSender{h: h, d: d, next: base + lo, end: base + hi, rows: rows}
}

// round pushes up to chunk tokens if the ring has room for them; false if
// nothing could be pushed.
func (cs *combineSender) round(q *queue, chunk int) bool {
	n := min(chunk, cs.end-cs.next)
	if n == 0 || q.free() < n {
		return false
	}
	ds, sh := &cs.h.st[cs.d], cs.h.shape
	k, hd := sh.TopK, sh.Hidden
	cs.sum = kernels.Reslice(cs.sum, hd)
	for range n {
		i := cs.next
		clear(cs.sum)
		// the token's local experts in ascending order: its slots sorted by expert
		for l := int32(0); l < int32(sh.LocalExperts()); l++ {
			for j, e := range ds.recvIdx[i*k : (i+1)*k] {
				if e != l {
					continue
				}
				row := int(ds.permRow[i*k+j])
				for c, v := range cs.rows[row*hd : (row+1)*hd] {
					cs.sum[c] += v
				}
			}
		}
		kernels.RoundBF16Slice(cs.sum)
		q.push(cs.sum, nil, ds.recvSrc[i], func(j int) (int32, float32) {
			if e := ds.recvIdx[i*k+j]; e >= 0 {
				return e, cs.probs[ds.permRow[i*k+j]]
			}
			return -1, 0
		})
		cs.next++
	}
	return true
}

// StallError is a queue that can make no progress: on a GPU, a wait that
// would time out. It names the rank whose phase stalled, the channel, the
// peer on the other end of the queue and what it waited for.
type StallError struct {
	Rank, Channel, Peer int
	Phase, Wait         string
}

func (e *StallError) Error() string {
	return fmt.Sprintf("deepep: %s on rank %d stalled: channel %d, queue of rank %d: %s", e.Phase, e.Rank, e.Channel, e.Peer, e.Wait)
}

// FP8Unavailable: DeepEP's normal mode dispatches FP8 as a tuple (x e4m3
// [T, h], x_scales fp32 [T, h/128]), both in each token's queue slot, and
// its combine is bf16; the host design does the same. DeepEP asserts
// hidden % 128 == 0 for it (--precision fp8 needs that already).
func (h *Host) FP8Unavailable(env dispatchers.Env) string {
	if env.Hidden%dispatchers.FP8Block != 0 {
		return fmt.Sprintf("DeepEP's FP8 dispatch needs hidden a multiple of 128 (hidden %d)", env.Hidden)
	}
	return ""
}
