package deepep

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
)

// layout is where the design's arrays lie in a rank's two device buffers,
// in bytes: the queue buffer, which peers write through its address
// (DeepEP's NVL buffer), and the layout buffer, which only the rank's own
// kernels use. The kernels get the offsets as -D constants (MB_Q_*, MB_F_*);
// the twins and Traffic read the same arrays at the same offsets.
type layout struct {
	// queue buffer: cnt [N] (tokens from each source) at 0, ecnt [N][L]
	// (copies from each source for each local expert), barrier flags [N],
	// the combine's start word, dispatch metadata [start, end, head,
	// tail][C][N], combine metadata [head, tail][C][N], then the rings:
	// dispatch's or combine's (with room for the backward's k probability
	// gradients a row), over the same bytes
	ecnt, flags, start, dmeta, cmeta, rings, queues int64
	dispatchRings, combineRings                     int64
	// layout buffer: is_token_in_rank [T][N] bytes at 0, tokens per rank
	// [N], copies per expert [E] (adjacent: zeroed together), channel
	// prefix [N][C] (tokens to each rank in channels ≤ c), received prefix
	// [N] (tokens from sources ≤ s), received channel offsets [N][C][2]
	// (start, end among the source's tokens), send_head [T][N]
	perRank, perExpert, chanEnd, srcEnd, recvChan, sendHead, fixed int64
}

func align(n, a int64) int64 { return (n + a - 1) / a * a }

// newLayout lays the buffers out for shape and cfg.
func newLayout(sh dispatchers.Shape, cfg Config) layout {
	N, L, C := int64(sh.EP), int64(sh.LocalExperts()), int64(cfg.Channels())
	T, k, row := int64(sh.Tokens), int64(sh.TopK), 2*int64(sh.Hidden)
	var l layout
	l.ecnt = 4 * N
	l.flags = l.ecnt + 4*N*L
	l.start = l.flags + 4*N
	l.dmeta = align(l.start+4, 16)
	l.cmeta = l.dmeta + 4*4*C*N
	l.rings = align(l.cmeta+2*4*C*N, 16)
	l.dispatchRings = C * N * int64(cfg.Dispatch.Ring) * (row + 4 + 8*k)
	l.combineRings = C * N * int64(cfg.Combine.Ring) * (row + 4 + 4*k) // the backward's probability gradients
	l.queues = l.rings + max(l.dispatchRings, l.combineRings)
	l.perRank = align(T*N, 16)
	l.perExpert = l.perRank + 4*N
	l.chanEnd = l.perExpert + 4*N*L
	l.srcEnd = l.chanEnd + 4*N*C
	l.recvChan = l.srcEnd + 4*N
	l.sendHead = l.recvChan + 4*N*C*2
	l.fixed = l.sendHead + 4*T*N
	return l
}

// defines are deepep.cu's constants for shape, cfg and l; bug breaks the
// protocol on purpose (tests only; 0 in runs).
func defines(sh dispatchers.Shape, cfg Config, l layout, bug int) map[string]string {
	d := map[string]string{}
	for k, v := range map[string]any{
		"MB_HIDDEN": sh.Hidden, "MB_TOPK": sh.TopK, "MB_RANKS": sh.EP, "MB_LOCAL": sh.LocalExperts(), "MB_TOKENS": sh.Tokens,
		"MB_CHANNELS": cfg.Channels(), "MB_DRING": cfg.Dispatch.Ring, "MB_DCHUNK": cfg.Dispatch.Chunk,
		"MB_CRING": cfg.Combine.Ring, "MB_CCHUNK": cfg.Combine.Chunk, "MB_WARPS": cfg.Warps, "MB_MINB": cfg.MinBlocks, "MB_DE_BUG": bug,
		"MB_Q_ECNT": l.ecnt, "MB_Q_FLAGS": l.flags, "MB_Q_GO": l.start, "MB_Q_DMETA": l.dmeta, "MB_Q_CMETA": l.cmeta, "MB_Q_RINGS": l.rings,
		"MB_F_PER_RANK": l.perRank, "MB_F_PER_EXPERT": l.perExpert, "MB_F_CHAN_END": l.chanEnd, "MB_F_SRC_END": l.srcEnd,
		"MB_F_RECV_CHAN": l.recvChan, "MB_F_SEND_HEAD": l.sendHead,
	} {
		d[k] = fmt.Sprint(v)
	}
	if w := sh.DispatchWidth(); w != sh.Hidden { // --precision fp8: the forward dispatch's packed rows (bf16: not given, the bf16 build unchanged)
		d["MB_DE_DHIDDEN"] = fmt.Sprint(w)
	}
	return d
}
