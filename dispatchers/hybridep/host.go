package hybridep

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
)

// Host is the design on host ranks (see docs/dispatchers/hybridep.md).
type Host struct {
	cfg   Config
	shape dispatchers.Shape
	ranks []*dispatchers.Rank
	st    []rankState
	// D ranks per domain, M domains, chunks per rank's tokens
	D, M, chunks int
	acc          []float32 // [h] a float32 sum being made (phases run one at a time)
	accP         []float32 // [L·D] its probability gradients (the backward's combine)
	// pass counts the collective passes begun (each step's forward at its
	// allgather, its backward at its combine-bwd); a flag holds the pass
	// that set it. backward says that the running pass is a backward: its
	// dispatch moves output gradients (no probabilities) and its combine
	// input and probability gradients.
	pass     int
	backward bool
	fp8      bool // the last forward dispatched e4m3 rows with their scales (Rank.Scales set)
}

// WithConfig returns the host implementation with cfg (tests use small
// chunks and budgets).
func WithConfig(cfg Config) *Host { return &Host{cfg: cfg} }

// rankState is one rank's buffers: as a source (allgather), forwarder and
// receiver (preprocess, dispatch), expert rank and home (combine).
type rankState struct {
	// allgather
	gmap  []bool    // [N·T, E] the global routing map, this rank's copy
	probs []float32 // [T, E] the rank's own tokens' probabilities, dense

	meta // preprocess

	// dispatch; combine's partial sums reuse recvX (the shared buffer)
	recvX []float32 // [R, h] receive buffer
	recvP []float32 // [R, L·D] their probabilities
	// the inter-domain buffer, [(M−1)·T] slots: tokens in (dispatch),
	// pre-reduced sums back (combine)
	idX, idP []float32
	// fp8 dispatch: the scales of the receive buffer's rows and of the
	// inter-domain slots (HybridEP's use_fp8 moves them with the rows)
	recvS, idS   []float32
	idIn, idBack []int // [(M−1)·chunks] chunk flags
	partDone     []int // [N·chunks] combine: source chunks whose partial sums are made

	moved, movedBack moved // what this rank's phases moved this step: forward, backward
}

// moved counts rows moved in one step (the phases of one rank).
type moved struct {
	deliveries, fanOut, interIn int // dispatch: rows stored into receive buffers (self included), of them from another rank, inter-domain sends
	partials, partialsOff, back int // combine: partial sums read, of them from another rank, pre-reduced sums sent home across domains
	interAlg                    int // HybridEP's rdma_send count of the rank's tokens: the domains that need each, its own included (M > 1)
}

func (h *Host) Name() string { return Name }
func (h *Host) Impl() string { return dispatchers.ImplNative }

// Bind sizes the per-rank state, the inter-domain buffers at their worst
// case (the receive buffers grow to each step's need on the host; Buffers
// gives the GPU's worst case).
func (h *Host) Bind(shape dispatchers.Shape, ranks []*dispatchers.Rank) error {
	if len(ranks) != shape.EP {
		return fmt.Errorf("hybridep: %d ranks, shape says EP = %d", len(ranks), shape.EP)
	}
	if err := h.cfg.check(shape); err != nil {
		return err
	}
	h.shape, h.ranks = shape, ranks
	N, T, E, L := shape.EP, shape.Tokens, shape.Experts, shape.LocalExperts()
	h.D = h.cfg.domain(N)
	h.M, h.chunks = N/h.D, (T+h.cfg.Chunk-1)/h.cfg.Chunk
	LD, o := L*h.D, h.M-1
	h.st = make([]rankState, N)
	for r := range h.st {
		h.st[r] = rankState{
			gmap: make([]bool, N*T*E), probs: make([]float32, T*E),
			meta: h.geom().newMeta(),
			idX:  make([]float32, o*T*shape.Hidden), idP: make([]float32, o*T*LD),
			idIn: make([]int, o*h.chunks), idBack: make([]int, o*h.chunks), partDone: make([]int, N*h.chunks),
		}
	}
	return nil
}

// Forward is HybridEP's, with the permute fused into dispatch and the
// unpermute into combine.
func (h *Host) Forward(experts func(rank int) error) []dispatchers.Step {
	return []dispatchers.Step{{Name: "allgather", Run: h.Allgather}, {Name: "preprocess", Run: h.Preprocess},
		{Name: "dispatch", Run: h.Dispatch}, {Name: dispatchers.ExpertPhases[0], Run: experts}, {Name: "combine", Run: h.Combine}}
}

// tile is where domain m's data sits in an inter-domain buffer of a rank
// of domain n ≠ m.
func tile(m, n int) int {
	if m < n {
		return m
	}
	return m - 1
}

// chunk is the token range [lo, hi) of chunk c of a rank's tokens.
func (h *Host) chunk(c int) (lo, hi int) {
	lo = c * h.cfg.Chunk
	return lo, min(lo+h.cfg.Chunk, h.shape.Tokens)
}

// Allgather is rank r's: its top-k as dense rows (map and probabilities),
// its map rows written into every rank's global map.
func (h *Host) Allgather(r int) error {
	s, rk, sh := &h.st[r], h.ranks[r], h.shape
	T, E, k := sh.Tokens, sh.Experts, sh.TopK
	if r == 0 {
		h.pass++
		h.backward, h.fp8 = false, rk.Scales != nil
	}
	s.moved, s.movedBack = moved{}, moved{}
	rows := s.gmap[r*T*E : (r+1)*T*E] // the rank's own rows, in its own copy first
	if err := denseRows(rk.Idx, rk.Probs, T, E, k, rows, s.probs); err != nil {
		return fmt.Errorf("hybridep: allgather on rank %d: %w", r, err)
	}
	for q := range h.st {
		if q != r {
			copy(h.st[q].gmap[r*T*E:], rows)
		}
	}
	return nil
}

// Preprocess is rank r's scan of the global map (see
// docs/dispatchers/hybridep.md and preprocess).
func (h *Host) Preprocess(r int) error {
	s := &h.st[r]
	h.geom().preprocess(r, s.gmap, &s.meta)
	if h.M > 1 {
		for t := range h.shape.Tokens {
			for m := range h.M {
				if s.toDom[t*h.M+m] {
					s.moved.interAlg++
				}
			}
		}
	}
	return nil
}

// mv is s's counters of the running pass.
func (h *Host) mv(s *rankState) *moved {
	if h.backward {
		return &s.movedBack
	}
	return &s.moved
}

// phase is the name of the running pass's phase: forward's, or its
// backward (the dual: a backward's dispatch is the combine's backward).
func (h *Host) phase(forward string) string {
	if !h.backward {
		return forward
	}
	return dispatchers.BackwardName(map[string]string{"dispatch": "combine", "combine": "dispatch"}[forward])
}

// rows are rank r's token rows a dispatch moves: its input, or in the
// backward its output's gradient.
func (h *Host) rows(r int) []float32 {
	if h.backward {
		return h.ranks[r].DY
	}
	return h.ranks[r].X
}

// Dispatch is rank q = (n, j)'s receive side: each forwarder of its domain
// stores its rows into q in the forwarder's order (running the inter-domain
// chunks they need), then q's permute into expert-major rows.
func (h *Host) Dispatch(q int) error {
	if err := h.fanOut(q); err != nil {
		return err
	}
	return h.permute(q)
}

// fanOut is rank q = (n, j)'s receive side of a dispatch: each forwarder of
// its domain stores its rows (and in the forward its domain's
// probabilities) into q's receive buffer in the forwarder's order, running
// the inter-domain chunks they need.
func (h *Host) fanOut(q int) error {
	s, sh := &h.st[q], h.shape
	T, hd, L, D := sh.Tokens, sh.Hidden, sh.LocalExperts(), h.D
	n, j, LD := q/D, q%D, L*D
	s.recvX = kernels.Reslice(s.recvX, s.recv*hd)
	s.recvP = kernels.Reslice(s.recvP, s.recv*LD)
	sw := h.scaleWidth()
	s.recvS = kernels.Reslice(s.recvS, s.recv*sw)
	placed := 0
	g := h.geom()
	for fl := range D {
		f := n*D + fl
		fs := &h.st[f]
		for b := range h.cfg.SMs {
			g.forwardOrder(n, b, h.cfg.SMs, func(m, t int) {
				if m != n {
					h.sendChunk(m*D+fl, f, t/h.cfg.Chunk, q)
				}
				p := int(fs.s2d[(m*T+t)*D+j])
				if p < 0 {
					return
				}
				x, pr, sc := h.forwarded(f, m, t)
				copy(s.recvX[p*hd:(p+1)*hd], x)
				copy(s.recvS[p*sw:(p+1)*sw], sc)
				if !h.backward {
					copy(s.recvP[p*LD:(p+1)*LD], pr)
				}
				placed++
				h.mv(s).deliveries++
				if f != q {
					h.mv(s).fanOut++
				}
			})
		}
	}
	if placed != s.recv {
		return fmt.Errorf("hybridep: %s on rank %d: the forwarders stored %d rows, its preprocessing counted %d", h.phase("dispatch"), q, placed, s.recv)
	}
	return nil
}

// forwarded is token t of source (m, f's local rank) as forwarder f holds
// it: its own row, its domain's probabilities and (fp8) its scales, or its
// inter-domain slot's.
func (h *Host) forwarded(f, m, t int) (x, p, sc []float32) {
	sh, fs := h.shape, &h.st[f]
	hd, LD, n, sw := sh.Hidden, sh.LocalExperts()*h.D, f/h.D, h.scaleWidth()
	if m == n {
		return h.rows(f)[t*hd : (t+1)*hd], fs.probs[t*sh.Experts+n*LD : t*sh.Experts+(n+1)*LD], h.scales(f)[t*sw : (t+1)*sw]
	}
	slot := tile(m, n)*sh.Tokens + int(fs.recvIdx[m*sh.Tokens+t])
	return fs.idX[slot*hd : (slot+1)*hd], fs.idP[slot*LD : (slot+1)*LD], fs.idS[slot*sw : (slot+1)*sw]
}

// scaleWidth is the scales a dispatched row carries: hidden/128 in the
// forward's fp8 dispatch, else none.
func (h *Host) scaleWidth() int {
	if h.fp8 && !h.backward {
		return dispatchers.ScaleWidth(dispatchers.PrecisionFP8, h.shape.Hidden)
	}
	return 0
}

// scales are rank r's rows' scales in the forward's fp8 dispatch, else nil.
func (h *Host) scales(r int) []float32 {
	if h.scaleWidth() == 0 {
		return nil
	}
	return h.ranks[r].Scales
}

// sendChunk is the inter-domain send of chunk c from source src to
// forwarder f (same local rank, another domain), unless this step's already
// arrived: the chunk's tokens that f's domain needs, rows and (in the
// forward) that domain's probabilities; counted in rank by's traffic.
func (h *Host) sendChunk(src, f, c, by int) {
	sh, fs, ss := h.shape, &h.st[f], &h.st[src]
	hd, LD, M := sh.Hidden, sh.LocalExperts()*h.D, h.M
	n, m := f/h.D, src/h.D
	flag := &fs.idIn[tile(m, n)*h.chunks+c]
	if *flag == h.pass {
		return
	}
	lo, hi := h.chunk(c)
	for t := lo; t < hi; t++ {
		if !ss.toDom[t*M+n] {
			continue
		}
		slot := tile(m, n)*sh.Tokens + int(fs.recvIdx[m*sh.Tokens+t])
		copy(fs.idX[slot*hd:(slot+1)*hd], h.rows(src)[t*hd:(t+1)*hd])
		if sw := h.scaleWidth(); sw > 0 {
			fs.idS = kernels.Reslice(fs.idS, len(fs.idX)/hd*sw)
			copy(fs.idS[slot*sw:(slot+1)*sw], h.scales(src)[t*sw:(t+1)*sw])
		}
		if !h.backward {
			copy(fs.idP[slot*LD:(slot+1)*LD], ss.probs[t*sh.Experts+n*LD:t*sh.Experts+(n+1)*LD])
		}
		h.mv(&h.st[by]).interIn++
	}
	*flag = h.pass
}

// permute is rank q's permute blocks: each received token to its local
// experts' rows, with their probabilities; it sets the segments.
func (h *Host) permute(q int) error {
	s, rk, sh := &h.st[q], h.ranks[q], h.shape
	hd, L := sh.Hidden, sh.LocalExperts()
	j, LD := q%h.D, L*h.D
	rows := 0
	for _, c := range s.perExpert {
		rows += c
	}
	rk.ExpertX = kernels.Reslice(rk.ExpertX, rows*hd)
	rk.ExpertProbs = kernels.Reslice(rk.ExpertProbs, rows)
	copied := 0
	for i := range s.recv {
		for e, p := range s.d2e[i*L : (i+1)*L] {
			if p < 0 {
				continue
			}
			copy(rk.ExpertX[int(p)*hd:(int(p)+1)*hd], s.recvX[i*hd:(i+1)*hd])
			rk.ExpertProbs[p] = s.recvP[i*LD+j*L+e]
			copied++
		}
	}
	if copied != rows {
		return fmt.Errorf("hybridep: dispatch on rank %d: the permute placed %d copies, its preprocessing counted %d", q, copied, rows)
	}
	if sw := h.scaleWidth(); sw > 0 { // each copy's scales with its row
		rk.ExpertScales = kernels.Reslice(rk.ExpertScales, rows*sw)
		for i := range s.recv {
			for _, p := range s.d2e[i*L : (i+1)*L] {
				if p >= 0 {
					copy(rk.ExpertScales[int(p)*sw:(int(p)+1)*sw], s.recvS[i*sw:(i+1)*sw])
				}
			}
		}
	}
	rk.Segments = rk.Segments[:0]
	at := 0
	for e, c := range s.perExpert {
		rk.Segments = append(rk.Segments, dispatchers.Segment{Expert: q*L + e, Start: at, Len: c})
		at += c
	}
	return nil
}

// Combine is home rank r = (n, l)'s: each token's float32 sum of its own
// domain's partial sums in ascending rank order, then the other domains'
// pre-reduced sums in the order n−1, n−2, …, n+1, into Rank.Y.
func (h *Host) Combine(r int) error {
	rk := h.ranks[r]
	rk.Y = kernels.Reslice(rk.Y, h.shape.Tokens*h.shape.Hidden)
	return h.gather(r, rk.Y, nil)
}

// gather is home rank r = (n, l)'s side of a combine: each token's float32
// sum into y, as Combine says. In the backward the rows also carry their
// domain's L·D probability gradients (zero at experts the row's rank does
// not hold), summed the same way into dense [E] per token, from which
// yk [T, k] takes each slot's expert's.
func (h *Host) gather(r int, y, yk []float32) error {
	s, sh := &h.st[r], h.shape
	T, hd, D, M, E, k := sh.Tokens, sh.Hidden, h.D, h.M, sh.Experts, sh.TopK
	n, LD := r/D, sh.LocalExperts()*h.D
	var dense []float32 // [E] a token's probability gradients, by expert
	if yk != nil {
		dense = make([]float32, E)
	}
	for t := range T {
		row, c := y[t*hd:(t+1)*hd], t/h.cfg.Chunk
		clear(row)
		clear(dense)
		var own []float32 // the own domain's experts' probability gradients
		if dense != nil {
			own = dense[n*LD : (n+1)*LD]
		}
		terms := h.domainSum(row, own, r, r, t)
		var err error
		h.geom().otherDomains(n, func(m int) {
			if !s.toDom[t*M+m] || err != nil {
				return
			}
			if err = h.preReduce(m*D+r%D, r, c); err == nil {
				slot := tile(m, n)*T + int(s.send[m*T+t])
				add(row, s.idX[slot*hd:(slot+1)*hd])
				if dense != nil {
					add(dense[m*LD:(m+1)*LD], s.idP[slot*LD:(slot+1)*LD])
				}
				terms++
			}
		})
		if err != nil {
			return err
		}
		if terms == 0 {
			return fmt.Errorf("hybridep: %s on rank %d: token %d has no expert output to sum (its routing map row is empty)", h.phase("combine"), r, t)
		}
		for j, e := range h.ranks[r].Idx[t*k : (t+1)*k] {
			if yk != nil {
				yk[t*k+j] = dense[e]
			}
		}
	}
	return nil
}

// domainSum adds to y the partial sums of home rank r's token t that the
// ranks of reader's domain hold, in ascending rank order, where reader's
// sparse_to_dense row places them (reader: the home in its own domain, the
// forwarder of the home's local rank in another), and in the backward
// their probability gradients to yp (the domain's L·D); it returns how
// many.
func (h *Host) domainSum(y, yp []float32, reader, r, t int) int {
	T, D := h.shape.Tokens, h.D
	rs, n, m, c := &h.st[r], r/D, reader/D, t/h.cfg.Chunk
	terms := 0
	eachDomainTerm(h.st[reader].s2d[(n*T+t)*D:(n*T+t+1)*D], func(j, p int) {
		q := m*D + j
		row, probs := h.partial(q, r, c, p)
		add(y, row)
		if yp != nil {
			add(yp, probs)
		}
		terms++
		h.mv(rs).partials++
		if q != reader {
			h.mv(rs).partialsOff++
		}
	})
	return terms
}

// eachDomainTerm calls fn(j, p) for the ranks j of a domain that hold a
// partial sum of a token, in rank order, at their receive position p (the
// token's sparse_to_dense row s2dRow).
func eachDomainTerm(s2dRow []int32, fn func(j, p int)) {
	for j, p := range s2dRow {
		if p >= 0 {
			fn(j, int(p))
		}
	}
}

// partial is expert rank q's partial sum at receive position p, which lies
// in source src's chunk c, and in the backward its row's L·D probability
// gradients: q's unpermute of that chunk runs first, unless this pass's
// has.
func (h *Host) partial(q, src, c, p int) (row, probs []float32) {
	qs, sh := &h.st[q], h.shape
	hd, L := sh.Hidden, sh.LocalExperts()
	LD, j := L*h.D, q%h.D
	key := src*h.chunks + c
	if qs.partDone[key] != h.pass {
		y, dprobs := h.ranks[q].ExpertY, []float32(nil)
		if h.backward {
			y, dprobs = h.ranks[q].ExpertDX, h.ranks[q].ExpertDProbs
		}
		for i := qs.chunkAt[key]; i < qs.chunkAt[key+1]; i++ {
			// the shared buffer: its row is no longer needed
			partialSum(qs.recvX[i*hd:(i+1)*hd], qs.d2e[i*L:(i+1)*L], func(row int) []float32 { return y[row*hd : (row+1)*hd] })
			if dprobs != nil { // the row's probability gradients, at its local experts' places of the domain's L·D
				pr := qs.recvP[i*LD : (i+1)*LD]
				clear(pr)
				for e, row := range qs.d2e[i*L : (i+1)*L] {
					if row >= 0 {
						pr[j*L+e] = dprobs[row]
					}
				}
			}
		}
		qs.partDone[key] = h.pass
	}
	return qs.recvX[p*hd : (p+1)*hd], qs.recvP[p*LD : (p+1)*LD]
}

// preReduce is forwarder f = (m, l)'s pre-reduction of chunk c of home
// r = (n, l)'s tokens into r's inter-domain buffer, unless this pass's has
// arrived: for each token domain m needs, the float32 sum of its domain's
// partial sums in ascending rank order, rounded to bf16 (in the backward
// with the sum of their probability gradients, fp32).
func (h *Host) preReduce(f, r, c int) error {
	sh, rs := h.shape, &h.st[r]
	T, hd, D, M, LD := sh.Tokens, sh.Hidden, h.D, h.M, sh.LocalExperts()*h.D
	m, n := f/D, r/D
	flag := &rs.idBack[tile(m, n)*h.chunks+c]
	if *flag == h.pass {
		return nil
	}
	h.acc = kernels.Reslice(h.acc, hd)
	var accP []float32
	if h.backward {
		h.accP = kernels.Reslice(h.accP, LD)
		accP = h.accP
	}
	lo, hi := h.chunk(c)
	for t := lo; t < hi; t++ {
		if !rs.toDom[t*M+m] {
			continue
		}
		clear(h.acc)
		clear(accP)
		if h.domainSum(h.acc, accP, f, r, t) == 0 {
			return fmt.Errorf("hybridep: %s on rank %d: domain %d needs token %d by rank %d's map, but rank %d's map places it on none of the domain's ranks (the preprocessing differs between ranks)", h.phase("combine"), r, m, t, r, f)
		}
		kernels.RoundBF16Slice(h.acc)
		slot := tile(m, n)*T + int(rs.send[m*T+t])
		copy(rs.idX[slot*hd:(slot+1)*hd], h.acc)
		copy(rs.idP[slot*LD:(slot+1)*LD], accP)
		h.mv(rs).back++
	}
	*flag = h.pass
	return nil
}

// add adds x to y.
func add(y, x []float32) {
	for i, v := range x {
		y[i] += v
	}
}

// denseRows turns T tokens' top-k (idx, probs [T, k]) into dense rows: the
// routing map rows [T, E] and probabilities [T, E], both cleared first.
func denseRows(idx []int32, probs []float32, T, E, k int, rows []bool, dense []float32) error {
	clear(rows)
	clear(dense)
	for t := range T {
		for j, e := range idx[t*k : (t+1)*k] {
			switch {
			case e < 0 || int(e) >= E:
				return fmt.Errorf("token %d has expert %d (of %d)", t, e, E)
			case rows[t*E+int(e)]:
				return fmt.Errorf("token %d has expert %d twice (a routing map holds it once)", t, e)
			}
			rows[t*E+int(e)] = true
			dense[t*E+int(e)] = probs[t*k+j]
		}
	}
	return nil
}

// partialSum is an expert rank's partial sum of a received token into sum:
// the float32 sum from 0 of its local experts' outputs (rows d2eRow ≥ 0,
// in expert order), rounded to bf16.
func partialSum(sum []float32, d2eRow []int32, y func(row int) []float32) {
	clear(sum)
	for _, row := range d2eRow {
		if row >= 0 {
			add(sum, y(int(row)))
		}
	}
	kernels.RoundBF16Slice(sum)
}

// FP8Unavailable: HybridEP's dispatch has an FP8 path (use_fp8: e4m3 rows
// with their 1×128 fp32 scales, combine bf16), which its BufferConfig
// allows only for hidden a multiple of 512.
func (h *Host) FP8Unavailable(env dispatchers.Env) string {
	return fp8Hidden(env.Hidden)
}

// fp8Hidden is why hidden rules HybridEP's FP8 dispatch out, or "".
func fp8Hidden(hidden int) string {
	if hidden%512 != 0 {
		return fmt.Sprintf("HybridEP's FP8 dispatch needs --hidden a multiple of 512 (BufferConfig.is_valid); --hidden is %d (the next that works: %d)", hidden, (hidden/512+1)*512)
	}
	return ""
}
