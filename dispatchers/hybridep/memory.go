package hybridep

import "github.com/moebench/moebench/dispatchers"

// Traffic counts the rows the last step's phases moved. A dispatch row is
// a token's bf16 row with its domain's L·D fp32 probabilities; a combine
// row a bf16 partial or pre-reduced sum. In the backward the combine's
// backward moves the dispatch's rows without probabilities, the
// dispatch's backward the combine's with the domain's L·D probability
// gradients.
func (h *Host) Traffic() dispatchers.Traffic {
	sum := func(of func(s *rankState) moved) moved {
		var mv moved
		for r := range h.st {
			m := of(&h.st[r])
			mv.deliveries += m.deliveries
			mv.fanOut += m.fanOut
			mv.interIn += m.interIn
			mv.partials += m.partials
			mv.partialsOff += m.partialsOff
			mv.back += m.back
			mv.interAlg += m.interAlg
		}
		return mv
	}
	mv, bw := sum(func(s *rankState) moved { return s.moved }), sum(func(s *rankState) moved { return s.movedBack })
	tr := mv.traffic(h.shape, h.D, h.fp8)
	if bw.deliveries > 0 {
		bw.backwardTraffic(&tr, h.shape, h.D)
	}
	return tr
}

// traffic is the bytes of the rows mv counts (see Host.Traffic).
func (mv moved) traffic(sh dispatchers.Shape, D int, fp8 bool) dispatchers.Traffic {
	row, in := 2*int64(sh.Hidden), dispatchers.RowBytes(dispatchers.PrecisionOf(fp8), sh.Hidden)
	disp := in + 4*int64(sh.LocalExperts()*D)
	alg := "HybridEP's convention (test_hybrid_ep: nvl_recv_bytes = tokens received × hidden × 2 B, a rank's tokens to itself included; combine the same); " +
		"inter-domain: rdma_send_bytes = tokens × the domains that need them (the token's own domain included) × hidden × 2 B"
	if fp8 {
		alg += "; at fp8 the dispatch's (and the inter-domain) times the fp8 factor (1 + 4/128)/2: hidden × 1 B e4m3 + hidden/128 × 4 B scales a token; combine bf16"
	}
	return dispatchers.Traffic{
		DispatchLogical: int64(mv.deliveries) * disp, DispatchOffRank: int64(mv.fanOut+mv.interIn) * disp,
		DispatchInterDomain: int64(mv.interIn) * disp,
		CombineLogical:      int64(mv.partials) * row, CombineOffRank: int64(mv.partialsOff+mv.back) * row,
		CombineInterDomain: int64(mv.back) * row,
		Formula: "a token goes once to each rank that holds any of its k experts; dispatch = tokens received × (" + dispatchers.RowFormula(dispatchers.PrecisionOf(fp8)) + " + L·D × 4 B fp32 probabilities of the domain's experts), " +
			"off-rank = the stores into another rank's buffer plus the inter-domain sends (to the same local rank of the destination domain, one per token and domain); " +
			"combine = partial sums × hidden×2 B, off-rank = those read from another rank plus the pre-reduced sums sent home across domains; " +
			"inter-domain = the sends between domains; not counted: the allgather of the routing map (N·T·E bool bytes to every rank)",
		DispatchAlgorithm: int64(mv.deliveries) * in, CombineAlgorithm: int64(mv.deliveries) * row,
		AlgorithmFormula:     alg,
		InterDomainAlgorithm: int64(mv.interAlg) * in,
	}
}

// backwardTraffic adds to tr the bytes of the backward's rows bw counts.
func (bw moved) backwardTraffic(tr *dispatchers.Traffic, sh dispatchers.Shape, D int) {
	row := 2 * int64(sh.Hidden)
	disp := row + 4*int64(sh.LocalExperts()*D)
	tr.CombineBackwardLogical, tr.CombineBackwardOffRank = int64(bw.deliveries)*row, int64(bw.fanOut+bw.interIn)*row
	tr.DispatchBackwardLogical, tr.DispatchBackwardOffRank = int64(bw.partials)*disp, int64(bw.partialsOff+bw.back)*disp
	tr.BackwardFormula = "combine-bwd (dispatch_with_permute of the output gradients) = tokens received × hidden×2 B bf16, off-rank as the forward's dispatch; " +
		"dispatch-bwd (combine_with_unpermute) = partial sums × (hidden×2 B bf16 + L·D × 4 B fp32 probability gradients of the domain's experts), off-rank as the forward's combine"
}

// Buffers are rank r's buffers as a GPU holds them: the preallocated ones
// at HybridEP's worst case (a rank may receive every token of every rank),
// the permuted rows at the last step's size.
func (h *Host) Buffers(r int) []dispatchers.Buffer {
	sh, s := h.shape, &h.st[r]
	N, T, E, L := int64(sh.EP), int64(sh.Tokens), int64(sh.Experts), int64(sh.LocalExperts())
	D, M, C := int64(h.D), int64(h.M), int64(h.chunks)
	row, LD := dispatchers.RowBytes(dispatchers.PrecisionOf(h.fp8), sh.Hidden), L*D // fp8 (use_fp8): e4m3 rows with their scales
	rows := int64(0)
	for _, n := range s.perExpert {
		rows += int64(n)
	}
	b := []dispatchers.Buffer{
		{Name: "receive", Bytes: T * N * row, About: "worst case, every rank's every token (tokens per rank × ranks, HybridEP's preallocation): the rows dispatch stores, then combine's partial sums (one shared buffer)"},
		{Name: "receive-probs", Bytes: T * N * LD * 4, About: "worst case: each received token's fp32 probabilities for the L·D experts of the domain"},
	}
	if M > 1 {
		b = append(b, dispatchers.Buffer{Name: "inter-domain", Bytes: T * (M - 1) * (row + LD*4),
			About: "tokens per rank × the other domains: rows and probabilities from each (dispatch), pre-reduced sums back (combine)"})
	}
	return append(b,
		dispatchers.Buffer{Name: "routing-map", Bytes: N*T*E + T*E*4, About: "the all-gathered global routing map (bool [N·T, E]) and the rank's dense fp32 probabilities [T, E]"},
		dispatchers.Buffer{Name: "metadata", Bytes: 4*(M*T*D+T*N*L+N*C+1) + T*M + 4*2*M*T + 4*(2*(M-1)*C+N*C),
			About: "sparse_to_dense (int32 [M·T, D]), dense_to_expert (int32, worst case [T·N, L]), the chunk layout, attn_to_rdma (bool [T, M]), the inter-domain slots (int32 [2, M, T]) and one uint32 flag per chunk"},
		dispatchers.Buffer{Name: "permute", Bytes: rows * (row + 4), About: "the expert-major rows and probabilities the grouped GEMM reads (sized by the preprocessing's count)"},
	)
}

// Footprint is the bytes of rank r's host storage (float32 rows, bool
// maps, int32 and int indices).
func (h *Host) Footprint(r int) int64 {
	s := &h.st[r]
	n := 4 * int64(cap(s.probs)+cap(s.s2d)+cap(s.d2e)+cap(s.recvX)+cap(s.recvP)+cap(s.idX)+cap(s.idP)+cap(s.send)+cap(s.recvIdx)+cap(s.recvS)+cap(s.idS))
	n += int64(cap(s.gmap) + cap(s.toDom))
	return n + 8*int64(cap(s.perExpert)+cap(s.chunkAt)+cap(s.cnt)+cap(s.idIn)+cap(s.idBack)+cap(s.partDone)+cap(s.sends)+cap(s.recvs))
}
