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
// The contract the GPU kernels (kernels/cuda/hybridep.cu) must match bit for
// bit — the notation, the preprocessing (sparse_to_dense, dense_to_expert,
// the chunk layout, the inter-domain slots), the dispatch's placement, the
// combine's summation order and rounding points, the worst-case memory —
// is stated in full in docs/dispatchers/hybridep.md, with what is faithful
// to HybridEP and what differs.
//
// On the host device dispatch is modelled from the receiver's side and
// combine from the home's, each once per step. Device (device.go) runs
// hybridep.cu: per GPU one co-resident launch covering its ranks for each
// phase, the inter-domain path over NCCL (comm.Comm), every cross-rank
// wait bounded by --comm-timeout; its backward (devbackward.go) runs the
// kernels' backward forms with the host backward's (backward.go) placement,
// orders and roundings; the twins (twins.go) run on Emu.
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
