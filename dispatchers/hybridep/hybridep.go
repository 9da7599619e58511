// Package hybridep is HybridEP's design (deepseek-ai/DeepEP's hybrid-ep
// branch, csrc/hybrid_ep, whose kernels NVIDIA's NCCL EP re-hosts as its HT
// mode; moebench's own code): no notify and no host wait — every rank
// all-gathers the global routing map and computes from it, identically on
// every rank, where each token lands on each rank; dispatch writes a token
// once into each destination rank's worst-case preallocated receive buffer
// and the destination places it at each of its experts' rows (permute
// fused); combine is the reverse, each expert rank summing a token's local
// outputs and its home rank gathering and summing those (unpermute fused).
// Within an NVLink domain data moves by direct stores into peers' buffers;
// across domains a token goes first to the rank of the same local index in
// the destination domain, which fans it out (HybridEP's hierarchy). --sms
// (default 16, Megatron's moe_hybridep_num_sms) is the blocks of dispatch
// and combine; --domain is the ranks per NVLink domain (HybridEP's
// NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN; 0: all ranks).
//
// # Notation
//
// N ranks (EP), D ranks per domain, M = N/D domains, L experts per rank,
// E = N·L, T tokens per rank, h hidden, k top-k, C tokens per chunk (64,
// HybridEP's NUM_OF_TOKENS_PER_CHUNK), B blocks (--sms). Rank r is (domain
// r/D, local rank r mod D). Global token g = s·T + t is token t of source
// rank s, so global order is (source domain, source local rank, token).
// Rank q needs g when any of q's experts [q·L, (q+1)·L) is among g's top-k;
// a domain needs g when any of its ranks does. Domain m's "tile" on a rank
// of domain n ≠ m is m if m < n, else m − 1 (the M − 1 other domains).
//
// # Phases
//
//	allgather   each rank turns its top-k into dense rows, a bool routing
//	            map [T, E] and fp32 probabilities [T, E] (HybridEP's
//	            conversion of topk_idx and topk_weights), and writes its map
//	            rows into every rank's copy of the global map [N·T, E] (peer
//	            writes; on the cuda device in a run over several processes,
//	            peer writes to its own process's ranks and NCCL send/recv to
//	            the others', each domain inside one process); the
//	            probabilities stay home and travel with tokens
//	preprocess  each rank, from the global map alone (below): where every
//	            token it forwards lands in each rank of its domain, where
//	            each token it receives goes among its expert-major rows, and
//	            which domains need its own tokens
//	dispatch    the fan-out into receive buffers, the inter-domain path, and
//	            the permute into expert-major rows (below)
//	experts     the layer's, with the probability applied after SwiGLU
//	combine     partial sums per expert rank, pre-reduced per remote domain,
//	            summed at home into Rank.Y (below)
//
// # Preprocessing (rank r = (n, l); HybridEP's metadata_preprocessing)
//
// Receive position: pos_q(g) = #{g' < g : q needs g'}; rank q receives
// R_q = #{g : q needs g} tokens, in global order (the receive order of
// alltoall and of DeepEP: by source rank, then token).
//
//   - sparse_to_dense s2d[m, t, j], for the tokens r forwards (those of
//     source (m, l) for every domain m, its own among them) and each rank j
//     of its domain: pos_(n,j)(g) for g = (m·D + l)·T + t, or −1.
//   - dense_to_expert d2e[i, e], for each token i r receives and local
//     expert e: −1 unless e is among the token's experts, else its row in
//     the expert-major output: Σ_{e' < e} rows_e' + #{i' < i : e ∈ i'},
//     rows_e being the copies of local expert e. So local expert 0's rows
//     come first, each expert's in receive order: alltoall's rows in
//     alltoall's order (expert, source rank, token).
//   - dense_chunk_layout: the first receive position of each source chunk
//     (s, c), tokens [c·C, (c+1)·C) of s; a chunk's tokens are contiguous.
//   - attn_to_rdma: for each of r's tokens, the domains that need it.
//   - the inter-domain slots: send[m, t], r's token t's rank among r's
//     tokens that domain m ≠ n needs (token order); recv[m, t], the same
//     for source (m, l)'s token t and domain n, as that source computes it.
//
// # Dispatch (the order a GPU runs; rank f = (n, l) forwards)
//
//   - Inter-domain path (HybridEP's RDMA warp; NCCL send/recv between the
//     same local ranks of two domains on GPUs): chunk by chunk, each of f's
//     tokens that a domain m ≠ n needs goes once to rank (m, l)'s
//     inter-domain buffer, slot (tile of n)·T + send[m, t]: the bf16 row
//     and the destination domain's L·D probabilities (fp32); then the
//     chunk's flag.
//   - Fan-out (the S2G warps, stores into peers' buffers): block b of B
//     takes chunks c = b, b+B, …; for chunk c, source domains in the order
//     n, n−1, …, n+1 (mod M) — source (m, l)'s chunk c, from f's own rows
//     for m = n, else from f's inter-domain buffer once its chunk flag is
//     set — and for each token t of it and each rank j of the domain with
//     p = s2d[m, t, j] ≥ 0: the row into rank (n, j)'s receive buffer row p
//     and the domain's L·D probabilities into its probability buffer row p
//     (one load, up to D stores: a token crosses to each rank once).
//   - Permute (each rank q's permute blocks, as q's chunks are flagged):
//     each received token i into rows d2e[i, e] ≥ 0 of the expert-major
//     output, with probability probs[i, j·L + e] (j: q's local rank).
//
// Every position is computed beforehand, so neither the blocks' order nor
// chunk size changes any result; only the combine's order of additions
// does.
//
// # Combine and its rounding points
//
//  1. Unpermute (each expert rank q, per source chunk): for each received
//     token i, part_q[i] = bf16(Σ y[d2e[i, e]] over its local experts e in
//     ascending order, a float32 sum from 0) into q's receive buffer row i
//     (dispatch and combine share the buffer, HybridEP's default).
//  2. Inter-domain (rank (m, l) for home (n, l), m ≠ n, per chunk of the
//     home's tokens): pre_m[t] = bf16(Σ part_(m,j)[s2d[n, t, j]] over j
//     ascending with s2d ≥ 0, a float32 sum from 0), sent to the home's
//     inter-domain buffer, slot (tile of m)·T + send[m, t].
//  3. Home (n, l), token t: Y[t] = the float32 sum from 0 of part_(n,j) at
//     s2d[n, t, j] ≥ 0 for j = 0 … D−1, then pre_m for the domains m = n−1,
//     n−2, …, n+1 (mod M) that need t. The layer stores Y as bf16.
//
// Against alltoall (a float32 sum from 0 of the k outputs in ascending
// expert order): with one domain and no token with two experts on one rank
// every partial is one output (exact in bf16) and ascending ranks are
// ascending experts, so Y is alltoall's bit for bit. At top-2 the layer's
// bf16 output is alltoall's bit for bit whatever the placement (two terms
// add in either order alike; a rounded sum of both is the rounded final
// sum). Otherwise partial sums are rounded to bf16 once more, and with
// several domains the order of the float32 additions differs: within the
// layer's tolerance (2e-2), a few bf16 roundings at most.
//
// # Memory (worst case, preallocated as HybridEP does)
//
// A rank may receive every token: its receive buffers hold T·N rows of
// 2h B and T·N × L·D fp32 probabilities, its inter-domain buffer (M > 1)
// T·(M−1) rows and their probabilities; dispatch and combine share them.
// Buffers gives these with the global map and the preprocessing's maps.
//
// # On the host device
//
// The ranks run a phase one after another, so dispatch is modelled from
// the receiver's side: rank q's dispatch runs every forwarder's stores into
// q in the forwarder's order above, and the first store that needs an
// inter-domain chunk runs that chunk's send (once per step: flags hold the
// step that set them, as HybridEP's flags hold increasing expected values).
// Rank r's combine likewise runs, the first time one is needed, an expert
// rank's unpermute of a chunk and a remote forwarder's pre-reduction of a
// chunk. The FIFOs, mbarriers and device-side barriers of the kernels are
// not modelled here; the records' buffers are what a GPU holds.
//
// # The cuda device
//
// Device (device.go) runs kernels/cuda/hybridep.cu: per GPU one
// co-resident launch covering its ranks for each of allgather,
// preprocess, dispatch and combine (issued from the last rank's call),
// with the placement and summation order above; the host reads the
// preprocessing's counts (the blocking mode); across domains a pack
// kernel and NCCL send/recv (kernels.Comm) carry the inter-domain path,
// its slots compact as above. Dispatch and combine move rows through
// shared-memory FIFOs guarded by mbarriers (bulk copies on sm_90 with
// NVRTC ≥ 12), every cross-rank wait bounded by --comm-timeout and
// reported after the step (CheckStep). The backward (devbackward.go) runs
// the dispatch and combine kernels in their backward forms over the
// forward's map, preprocessing and counts, with the host backward's
// placement, orders and roundings (backward.go): the output gradients
// dispatched without probabilities, the input gradients combined with the
// probability gradients carried home beside them. The kernels' Go twins
// (twins.go) run on Emu through this file's preprocessing, orders and
// sums. A
// --domain whose ranks' GPUs lack peer access is unavailable, naming the
// pair; a domain smaller than the peer-connected group is valid and sends
// through the inter-domain path what NVLink could carry (HybridEP's
// upstream warns that a mismatch costs performance, and sometimes
// correctness).
package hybridep

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
)

// Name is the dispatcher's registered name.
const Name = "hybridep"

// DefaultSMs is Megatron's default HybridEP budget (moe_hybridep_num_sms;
// HybridEP's own Configurer picks 24 in one domain, 8 across several).
const DefaultSMs = 16

// DefaultChunk is HybridEP's NUM_OF_TOKENS_PER_CHUNK_*_API default.
const DefaultChunk = 64

// MaxDomain is HybridEP's MAX_NUM_OF_RANKS_PER_NODE (an NVL72 domain).
const MaxDomain = 72

func init() {
	dispatchers.Register(Name, New)
	dispatchers.RegisterDevice(Name, NewDevice)
	dispatchers.RegisterSMBudget(Name, dispatchers.SMBudget{Default: DefaultSMs, About: "Megatron's default HybridEP budget (moe_hybridep_num_sms)"})
}

// Config is the design's settings.
type Config struct {
	SMs    int // blocks of dispatch and combine
	Domain int // ranks per NVLink domain; 0: all ranks
	Chunk  int // tokens per chunk
	// PreprocessSMs and PermuteSMs are the blocks of the preprocessing's
	// and the permute's own launches (the cuda device's; HybridEP's
	// num_sms_preprocessing_api and num_blocks_permute); 0: the defaults,
	// DefaultPreprocessSMs and the GPU's SMs ÷ its ranks, each fitted to
	// the GPU's SMs ÷ its ranks
	PreprocessSMs, PermuteSMs int
}

// DefaultPreprocessSMs is HybridEP's preprocessing budget (its
// Configurer's 108 blocks), fitted to a rank's share of its GPU.
const DefaultPreprocessSMs = 108

// check says what is wrong with c for shape: a plain error for a domain
// that does not divide EP (a usage error the harness catches first), an
// *UnavailableError for the design's limits.
func (c Config) check(sh dispatchers.Shape) error {
	switch {
	case c.Domain < 0 || (c.Domain > 0 && sh.EP%c.Domain != 0):
		return fmt.Errorf("hybridep: --domain %d must divide EP %d (0 = all ranks in one domain)", c.Domain, sh.EP)
	case c.SMs < 1 || c.SMs > dispatchers.MaxSMBudget:
		return fmt.Errorf("hybridep: SM budget %d: must be in [1, %d]", c.SMs, dispatchers.MaxSMBudget)
	case c.PreprocessSMs < 0 || c.PreprocessSMs > dispatchers.MaxSMBudget:
		return fmt.Errorf("hybridep: preprocessing budget %d: must be in [0, %d] (0: the default)", c.PreprocessSMs, dispatchers.MaxSMBudget)
	case c.PermuteSMs < 0 || c.PermuteSMs > dispatchers.MaxSMBudget:
		return fmt.Errorf("hybridep: permute budget %d: must be in [0, %d] (0: the default)", c.PermuteSMs, dispatchers.MaxSMBudget)
	case c.Chunk < 1:
		return fmt.Errorf("hybridep: chunk of %d tokens: must be ≥ 1", c.Chunk)
	}
	var reason string
	switch d := c.domain(sh.EP); {
	case d > MaxDomain:
		reason = fmt.Sprintf("an NVLink domain of %d ranks: HybridEP's domains hold at most %d (NVL72); give --domain", d, MaxDomain)
	case sh.Hidden%8 != 0:
		reason = fmt.Sprintf("hidden %d: rows move as bulk copies of 16-byte multiples, so hidden must be a multiple of 8 (HybridEP's own check asks 16)", sh.Hidden)
	}
	if reason != "" {
		return &dispatchers.UnavailableError{Name: Name, Impl: dispatchers.ImplNative, Reason: reason}
	}
	return nil
}

// domain is D, the ranks per domain, for ep ranks.
func (c Config) domain(ep int) int {
	if c.Domain == 0 {
		return ep
	}
	return c.Domain
}

// New returns the host implementation (the design in Go, labelled host).
func New(impl string, env dispatchers.Env) (dispatchers.Dispatcher, error) {
	if impl != dispatchers.ImplNative {
		return nil, &dispatchers.UnavailableError{Name: Name, Impl: impl,
			Reason: "no library implementation registered in this build (dispatchers/ncclep registers NCCL EP's high-throughput mode, HybridEP's kernels)"}
	}
	if env.Device != "host" {
		return nil, &dispatchers.UnavailableError{Name: Name, Impl: impl,
			Reason: fmt.Sprintf("device %q is not supported by the host implementation", env.Device)}
	}
	// env.CommTimeout is for the GPU kernels' waits: the host model has
	// none (every wait is a chunk it runs on demand).
	sms := env.SMs
	if sms == 0 {
		sms = DefaultSMs
	}
	return WithConfig(Config{SMs: sms, Domain: env.Domain, Chunk: DefaultChunk}), nil
}
