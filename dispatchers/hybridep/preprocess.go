package hybridep

// The preprocessing (HybridEP's metadata_preprocessing) and the orders of
// the design, shared by the host implementation and the device kernels'
// Go twins, so that both place and sum exactly alike.

// geom is the shape of a run in the design's terms (see Notation).
type geom struct {
	N, T, E, L, D, M int
	chunk, chunks    int
}

func (h *Host) geom() geom {
	sh := h.shape
	return geom{N: sh.EP, T: sh.Tokens, E: sh.Experts, L: sh.LocalExperts(), D: h.D, M: h.M, chunk: h.cfg.Chunk, chunks: h.chunks}
}

// meta is one rank's preprocessing output.
type meta struct {
	s2d       []int32 // [M, T, D] sparse_to_dense of the tokens it forwards
	d2e       []int32 // [T·N, L] dense_to_expert of the tokens it receives (worst case)
	perExpert []int   // [L] copies per local expert
	recv      int     // R, tokens it receives
	chunkAt   []int   // [N·chunks + 1] first receive position of each source chunk
	toDom     []bool  // [T, M] domains that need each of its tokens (its own included)
	// the inter-domain path's slots: send[m·T + t], rank (n, l)'s token
	// t's among the tokens it sends to domain m ≠ n; recvIdx[m·T + t],
	// source (m, l)'s token t's among those it sends to domain n (−1: not
	// sent); sends[m] and recvs[m] count them
	send, recvIdx []int32
	sends, recvs  []int
	cnt           []int // [D + M + 1] scan counters
}

func (g geom) newMeta() meta {
	return meta{s2d: make([]int32, g.M*g.T*g.D), d2e: make([]int32, g.T*g.N*g.L), perExpert: make([]int, g.L),
		chunkAt: make([]int, g.N*g.chunks+1), toDom: make([]bool, g.T*g.M), send: make([]int32, g.M*g.T),
		recvIdx: make([]int32, g.M*g.T), sends: make([]int, g.M), recvs: make([]int, g.M), cnt: make([]int, g.D+g.M+1)}
}

// preprocess is rank r = (n, l)'s scan of the global map gmap [N·T, E]
// into s: sparse_to_dense of the tokens it forwards, its receive count,
// dense_to_expert and chunk layout of the tokens it receives, the domains
// its tokens go to, and the inter-domain slots (compact: a sender's
// tokens for a domain in token order).
func (g geom) preprocess(r int, gmap []bool, s *meta) {
	N, T, E, L, D, M := g.N, g.T, g.E, g.L, g.D, g.M
	n, l, LD := r/D, r%D, L*D
	clear(s.cnt)
	clear(s.perExpert)
	clear(s.sends)
	clear(s.recvs)
	for i := range s.send {
		s.send[i], s.recvIdx[i] = -1, -1
	}
	for g0 := range N * T {
		src, t := g0/T, g0%T
		m, sl := src/D, src%D
		if t%g.chunk == 0 {
			s.chunkAt[src*g.chunks+t/g.chunk] = s.cnt[l]
		}
		row := gmap[g0*E+n*LD : g0*E+(n+1)*LD] // domain n's experts
		for j := range D {
			pos := int32(-1)
			if anySet(row[j*L : (j+1)*L]) {
				pos = int32(s.cnt[j])
				s.cnt[j]++
				if j == l { // a token r receives: its copies' ranks within each expert
					for e, on := range row[l*L : (l+1)*L] {
						s.d2e[int(pos)*L+e] = -1
						if on {
							s.d2e[int(pos)*L+e] = int32(s.perExpert[e])
							s.perExpert[e]++
						}
					}
				}
			}
			if sl == l {
				s.s2d[(m*T+t)*D+j] = pos
			}
		}
		if sl == l && m != n && anySet(row) { // forwarded from another domain
			s.recvIdx[m*T+t] = int32(s.recvs[m])
			s.recvs[m]++
		}
	}
	s.recv = s.cnt[l]
	s.chunkAt[N*g.chunks] = s.recv
	start := make([]int32, L) // rows of the local experts before each
	for e := 1; e < L; e++ {
		start[e] = start[e-1] + int32(s.perExpert[e-1])
	}
	for i, v := range s.d2e[:s.recv*L] {
		if v >= 0 {
			s.d2e[i] = v + start[i%L]
		}
	}
	for t := range T {
		g0 := r*T + t
		for m := range M {
			s.toDom[t*M+m] = anySet(gmap[g0*E+m*LD : g0*E+(m+1)*LD])
			if s.toDom[t*M+m] && m != n {
				s.send[m*T+t] = int32(s.sends[m])
				s.sends[m]++
			}
		}
	}
}

// anySet reports whether any of b is set.
func anySet(b []bool) bool {
	for _, v := range b {
		if v {
			return true
		}
	}
	return false
}

// forwardOrder calls fn(m, t) for the tokens forwarder (n, ·)'s block b of
// blocks stores, in the design's order: chunks b, b + blocks, …; in each,
// source domains n, n − 1, …, n + 1 (mod M); their tokens in order. fn
// says which of them domain n needs.
func (g geom) forwardOrder(n, b, blocks int, fn func(m, t int)) {
	for c := b; c < g.chunks; c += blocks {
		for i := range g.M {
			m := (n - i + g.M) % g.M
			for t := c * g.chunk; t < min((c+1)*g.chunk, g.T); t++ {
				fn(m, t)
			}
		}
	}
}

// otherDomains calls fn(m) for the domains other than n in the order the
// home adds their pre-reduced sums: n − 1, n − 2, …, n + 1 (mod M).
func (g geom) otherDomains(n int, fn func(m int)) {
	for i := 1; i < g.M; i++ {
		fn((n - i + g.M) % g.M)
	}
}

// countMoves is what one step moves with the global map gmap, counted as
// the host implementation's phases count it (Host.Traffic): every rank's
// preprocessing gives its stores and partial sums.
func (g geom) countMoves(gmap []bool) moved {
	var mv moved
	ms := make([]meta, g.N)
	for r := range ms {
		ms[r] = g.newMeta()
		g.preprocess(r, gmap, &ms[r])
	}
	for f, s := range ms {
		n, l := f/g.D, f%g.D
		mv.deliveries += s.recv
		for i := 0; i < len(s.s2d); i += g.D { // stores of the tokens f forwards
			eachDomainTerm(s.s2d[i:i+g.D], func(j, _ int) {
				if j != l {
					mv.fanOut++
				}
			})
		}
		for m := range g.M {
			if m != n {
				mv.interIn += s.recvs[m]
			}
		}
		// partial sums each home (its own domain) and each forwarder (the
		// pre-reduction for another domain's home) reads
		for sn := range g.M {
			for t := range g.T {
				if sn != n && s.recvIdx[sn*g.T+t] < 0 {
					continue
				}
				if sn == n && f != sn*g.D+l {
					continue
				}
				i := (sn*g.T + t) * g.D
				eachDomainTerm(s.s2d[i:i+g.D], func(j, _ int) {
					if j != l {
						mv.partialsOff++
					}
				})
			}
		}
		if g.M > 1 {
			for _, on := range s.toDom {
				if on {
					mv.interAlg++
				}
			}
		}
	}
	mv.partials, mv.back = mv.deliveries, mv.interIn
	return mv
}
