package deepep

import "github.com/moebench/moebench/dispatchers"

// Bytes of what travels with a token's row (hidden × 2 B bf16): in dispatch
// its index at the source and its k expert indices and probabilities (int32
// and fp32); in combine its index at the source.
func dispatchMeta(k int) int64 { return 4 + 8*int64(k) }

const combineMeta = 4

// Traffic counts the last step's received tokens: a token goes once to each
// rank holding any of its experts (the deduplication that makes DeepEP move
// fewer bytes than alltoall at top-k > 1), and comes back once from it.
func (h *Host) Traffic() dispatchers.Traffic {
	per := make([][]int, len(h.st))
	for src := range h.st {
		per[src] = h.st[src].perRank
	}
	return traffic(h.shape, per, h.backward, h.fp8)
}

// traffic counts the bytes of a step in which rank src sent perRank[src][d]
// tokens to rank d, and when it ran the backward the backward's.
func traffic(sh dispatchers.Shape, perRank [][]int, backward, fp8 bool) dispatchers.Traffic {
	var all, off int64
	for src := range perRank {
		for d, n := range perRank[src] {
			all += int64(n)
			if d != src {
				off += int64(n)
			}
		}
	}
	row, in := 2*int64(sh.Hidden), dispatchers.RowBytes(dispatchers.PrecisionOf(fp8), sh.Hidden)
	alg := "DeepEP's convention (test_intranode): tokens received × hidden × 2 B, a rank's tokens to itself included"
	if fp8 {
		alg = "DeepEP's convention (test_intranode): tokens received × hidden × 2 B, a rank's tokens to itself included; at fp8 the dispatch's times " +
			"its fp8 factor (1 + 4/128)/2: tokens received × (hidden × 1 B e4m3 + hidden/128 × 4 B scales); combine bf16"
	}
	tr := dispatchers.Traffic{
		DispatchOffRank: off * (in + dispatchMeta(sh.TopK)), DispatchLogical: all * (in + dispatchMeta(sh.TopK)),
		CombineOffRank: off * (row + combineMeta), CombineLogical: all * (row + combineMeta),
		Formula: "a token goes once to each rank holding any of its k experts (deduplicated); dispatch = tokens × (" + dispatchers.RowFormula(dispatchers.PrecisionOf(fp8)) +
			" + 4 B source index + k × (4 B expert + 4 B prob)); combine = tokens × (hidden×2 B bf16 partial sum + 4 B source index); off-rank excludes a rank's tokens to itself",
		DispatchAlgorithm: all * in, CombineAlgorithm: all * row,
		AlgorithmFormula: alg,
	}
	if backward { // the same tokens the other way
		tr.CombineBackwardOffRank, tr.CombineBackwardLogical = off*(row+combineMeta), all*(row+combineMeta)
		tr.DispatchBackwardOffRank, tr.DispatchBackwardLogical = off*(row+backwardCombineMeta(sh.TopK)), all*(row+backwardCombineMeta(sh.TopK))
		tr.BackwardFormula = "as the forward's tokens: combine-bwd (DeepEP's dispatch with the forward's handle) = tokens × (hidden×2 B bf16 output gradient + 4 B source index); " +
			"dispatch-bwd (DeepEP's combine) = tokens × (hidden×2 B bf16 partial sum of input gradients + 4 B source index + k × 4 B fp32 probability gradient)"
	}
	return tr
}

// backwardCombineMeta is what travels with a row in the backward's combine:
// its source index and its k probability gradients (topk_weights).
func backwardCombineMeta(k int) int64 { return combineMeta + 4*int64(k) }

// Buffers are rank r's buffers as a GPU holds them (bf16 rows, int32 and
// fp32 metadata), sized for the last step.
func (h *Host) Buffers(r int) []dispatchers.Buffer {
	sh, s := h.shape, &h.st[r]
	N, C, row := int64(sh.EP), int64(h.cfg.Channels()), 2*int64(sh.Hidden)
	counts := 4 * (N*N + N*int64(sh.LocalExperts()))
	disp := C * N * (4*4 + int64(h.cfg.Dispatch.Ring)*(dispatchers.RowBytes(dispatchers.PrecisionOf(h.fp8), sh.Hidden)+dispatchMeta(sh.TopK)))
	meta := int64(combineMeta)
	if h.backward { // the training step's combine of input gradients carries the probability gradients
		meta = backwardCombineMeta(sh.TopK)
	}
	comb := C * N * (2*4 + int64(h.cfg.Combine.Ring)*(row+meta))
	rows := int64(0)
	for _, n := range s.expertRows {
		rows += int64(n)
	}
	T := int64(sh.Tokens)
	return []dispatchers.Buffer{
		{Name: "queues", Bytes: counts + max(disp, comb), About: "one peer-reachable buffer serves dispatch and combine, as DeepEP's: the count matrices, and per (channel, source) ring the offsets, head and tail " +
			"and Ring slots of a row with its metadata (dispatch and combine sizes, the larger)"},
		{Name: "receive", Bytes: int64(s.recv) * (row + dispatchMeta(sh.TopK)), About: "the received tokens: rows, source indices, k expert indices and probabilities (sized by notify's count)"},
		{Name: "permute", Bytes: rows * (row + 4), About: "the expert-major rows and probabilities the grouped GEMM reads"},
		{Name: "layout", Bytes: T*N*(1+4) + 2*4*N*C, About: "is_token_in_rank, send_head and the channel prefix matrices"},
	}
}

// Footprint is the bytes of rank r's host storage (float32 rows, int32 and
// int indices) and its share of the rings.
func (h *Host) Footprint(r int) int64 {
	s := &h.st[r]
	n := 4 * int64(cap(s.recvX)+cap(s.recvSrc)+cap(s.recvIdx)+cap(s.recvW)+cap(s.permRow))
	n += 8*int64(cap(s.perRank)+cap(s.perExpert)+cap(s.srcEnd)+cap(s.expertRows)+cap(s.sendHead)+len(s.chanEnd)*h.cfg.Channels()) + int64(cap(s.inRank))
	var q int64
	for i := range h.q {
		q += 4 * int64(cap(h.q[i].x)+cap(h.q[i].src)+cap(h.q[i].idx)+cap(h.q[i].w))
	}
	return n + q/int64(len(h.st))
}
