package setup

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/moebench/moebench/balance"
	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/dispatchers/ncclep"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/results"
)

// Shape is one MoE layer's published shape.
type Shape struct {
	Tokens        int // tokens per rank (micro-batch)
	Hidden        int
	FFN           int // per-expert intermediate size
	Experts       int
	TopK          int
	SharedExperts int    // shared expert ffn = FFN × SharedExperts
	Score         string // softmax | sigmoid
	Groups        int    // group-limited routing; 0 = off
	GroupTopK     int
	TopKScale     float64 // moe_router_topk_scaling_factor
}

// Preset is a named layer shape.
type Preset struct {
	Name  string
	About string
	Shape
}

// DefaultTokens is the micro-batch per rank of the real-model presets.
const DefaultTokens = 4096

// Presets are the built-in layers, with the shapes of the published configs
// (see docs/references.md, the layer and the presets).
var Presets = []Preset{
	{"tiny", "small layer for tests and the default run", Shape{128, 512, 64, 16, 4, 1, kernels.ScoreSoftmax, 0, 0, 1}},
	{"deepseek-v3", "DeepSeek-V3 MoE layer", Shape{DefaultTokens, 7168, 2048, 256, 8, 1, kernels.ScoreSigmoid, 8, 4, 2.5}},
	{"qwen3-30b-a3b", "Qwen3-30B-A3B", Shape{DefaultTokens, 2048, 768, 128, 8, 0, kernels.ScoreSoftmax, 0, 0, 1}},
	{"qwen3-235b-a22b", "Qwen3-235B-A22B", Shape{DefaultTokens, 4096, 1536, 128, 8, 0, kernels.ScoreSoftmax, 0, 0, 1}},
	{"qwen3-next-80b", "Qwen3-Next-80B-A3B (shared expert's sigmoid gate not modelled)", Shape{DefaultTokens, 2048, 512, 512, 10, 1, kernels.ScoreSoftmax, 0, 0, 1}},
	{"mixtral-8x7b", "Mixtral-8x7B", Shape{DefaultTokens, 4096, 14336, 8, 2, 0, kernels.ScoreSoftmax, 0, 0, 1}},
	{"gpt-oss-120b", "gpt-oss-120b (SwiGLU in place of its clamped GLU; no router bias)", Shape{DefaultTokens, 2880, 2880, 128, 4, 0, kernels.ScoreSoftmax, 0, 0, 1}},
	{"glm-4.5", "GLM-4.5 (355B-A32B)", Shape{DefaultTokens, 5120, 1536, 160, 8, 1, kernels.ScoreSigmoid, 0, 0, 2.5}},
	{"glm-5", "GLM-5 (744B-A40B; the FEPLB paper ran a 128-expert variant: --experts 128)", Shape{DefaultTokens, 6144, 2048, 256, 8, 1, kernels.ScoreSigmoid, 0, 0, 2.5}},
}

// LookupPreset returns the preset called name.
func LookupPreset(name string) (Preset, bool) {
	for _, p := range Presets {
		if p.Name == name {
			return p, true
		}
	}
	return Preset{}, false
}

// PresetNames lists the presets' names.
func PresetNames() []string {
	var n []string
	for _, p := range Presets {
		n = append(n, p.Name)
	}
	return n
}

// Config is everything one run needs.
type Config struct {
	Preset string
	Shape
	// PreSoftmax: softmax routers take the softmax over all experts before
	// the top-k (Megatron's moe_router_pre_softmax); needed for top-1
	PreSoftmax bool
	Dispatcher string
	Impl       string
	SMs        int // SM budget of SM-driven dispatchers; 0 = dispatcher default
	// PreprocessSMs and PermuteSMs: hybridep's preprocessing and permute
	// launches' own budgets (blocks per rank); 0 = its defaults
	PreprocessSMs, PermuteSMs int
	EP                        int
	GPUs                      int // cuda: GPUs the ranks are spread over; 0 = every GPU, at most one per rank
	Domain                    int // ranks per NVLink domain; 0 = all ranks
	// CommTimeout bounds each wait of moebench's own code for another
	// rank: a native SM-driven dispatcher's waits on the GPU, and in a run
	// over several processes a process's wait for the others
	CommTimeout time.Duration
	// NCCLEPTimeout is NCCL EP's timeout_ns, the library's bound on its
	// kernels' waits (--impl library of hybridep and deepep-ll)
	NCCLEPTimeout time.Duration
	// WatchdogTimeout bounds one call on a GPU's thread once the first
	// step has run (hang.go); 0: derived from the two above (WatchdogLimit)
	WatchdogTimeout time.Duration
	FeplbBase       string // feplb: phase-1 dispatcher
	FeplbDyn        int    // feplb: dynamic experts per rank; 0: fitted to the layer (FeplbDynamic)
	FeplbPolicy     string // feplb: the scheduler's policy (balance.FEPLBPolicies)
	Routing         Routing
	// RoutingFixed replays the first step's routing every iteration;
	// otherwise each iteration draws its own (seeded by the step), as
	// Megatron's force-balancing draws fresh logits every forward. Routing
	// from the router itself (natural) is the same every step either way:
	// the input is.
	RoutingFixed bool
	Seed         uint64
	Warmup       int
	Iters        int
	MaxSeconds   float64 // time budget of the warm-up and timed iterations; 0 = none
	Check        bool
	// CheckAll: the check compares every token (--check all); else a
	// seeded sample of them where every token's reference exceeds the
	// budget (sampledTokens)
	CheckAll bool
	Device   string // host | cuda | auto (resolved before a run)
	// ForwardOnly times the forward pass alone: no backward, no tape, no
	// gradient check (otherwise every iteration is a training step, forward
	// and backward)
	ForwardOnly bool
	// CUDAGraph issues each step as CUDA graphs (cuda device; see graph.go)
	CUDAGraph bool
	// HostExperts is how the host device holds the experts' weights and
	// fp32 weight gradients (HostExpertsModes; "" is HostExpertsAuto)
	HostExperts string
	// Precision is the dispatch and expert-GEMM precision (Precisions;
	// see precision.go): bf16, fp8 (Hopper's blockwise recipe) or mxfp8
	Precision string
	// Overlap is the MoE communication overlap forms (OverlapForms: shared,
	// a2a; none by default) and DelayWgrad defers the expert GEMMs' weight
	// gradients (overlap.go, docs/overlap.md)
	Overlap    []string
	DelayWgrad bool
	// AttentionMS is the attention stand-in's time a pass (attention.go);
	// 0: none
	AttentionMS float64
	// prog, when set, counts the work of the stages that report it: the
	// experts' weights drawn, the check's phases and references (Run)
	prog *Progress
	// intr, when set, is the run's Interrupt: the check's reference stops
	// at its next expert once it fires (Run)
	intr *Interrupt
	// processes is how many processes a cuda run spans (0 or 1: this one
	// alone), for the host memory estimate of this process's share (set
	// by runDevice and Env.HostBytes)
	processes int
}

// AttachRunState makes c carry the run's progress line p and its interrupt in to
// the layers (nil: none).
func (c *Config) AttachRunState(p *Progress, in *Interrupt) { c.prog, c.intr = p, in }

// ProgressLine is the progress line c carries (nil: none; a nil line
// ignores every call).
func (c Config) ProgressLine() *Progress { return c.prog }

// Interrupt is the interrupt c carries (nil: none).
func (c Config) Interrupt() *Interrupt { return c.intr }

// How the host device holds the experts' weights and their fp32 weight
// gradients (Config.HostExperts; see hostexperts.go). Every mode computes
// the same numbers.
const (
	HostExpertsAuto   = "auto"          // the first of the others that fits in the available memory
	HostExpertsHeld   = "held"          // every expert's weights and weight gradients, for the whole run
	HostExpertsByRank = "grads-by-rank" // every expert's weights; a rank's weight gradients from its expert backward until the rank's are complete (checked then), then released
	HostExpertsDrawn  = "drawn"         // weights drawn from the seed when an expert's rows are computed, a few experts at a time; weight gradients by rank
)

// HostExpertsModes are Config.HostExperts' values, auto first.
var HostExpertsModes = []string{HostExpertsAuto, HostExpertsHeld, HostExpertsByRank, HostExpertsDrawn}

// DefaultConfig is what `moebench` with no flags runs.
func DefaultConfig() Config {
	p, _ := LookupPreset("tiny")
	return Config{Preset: p.Name, Shape: p.Shape, Dispatcher: "alltoall", Impl: "native",
		EP: 8, CommTimeout: dispatchers.DefaultCommTimeout, NCCLEPTimeout: dispatchers.DefaultCommTimeout, FeplbBase: "alltoall", FeplbDyn: 0, FeplbPolicy: "feplb",
		Routing: Routing{Kind: RoutingBalanced}, Seed: 1, Warmup: 3, Iters: 20,
		Check: true, Device: "auto", Precision: PrecisionBF16}
}

// Bounds of the iteration settings: iterations are kept per rank in the
// record, and a budget above MaxSeconds (a week) is no budget.
const (
	MaxIters   = 1_000_000
	MaxSeconds = 7 * 24 * 3600
)

// ConfigError is a bad setting: the flag (or field) it came from, the value,
// and what is allowed.
type ConfigError struct {
	Flag    string
	Value   any
	Allowed string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("--%s=%v: %s", e.Flag, e.Value, e.Allowed)
}

// Validate checks c and returns a *ConfigError for the first bad setting,
// in this order: sizes, router, dispatcher, timeouts, device and
// precision, the dispatcher's SM budget, routing.
func (c Config) Validate() error {
	for _, check := range []func() error{c.validateSizes, c.validateRouter, c.validateDispatcher, c.validateTimeouts, c.validateDevice, c.validateBudget, c.validateOverlap, c.Routing.validate} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validateSizes checks the layer's sizes and the iteration counts.
func (c Config) validateSizes() error {
	const maxDim = 1 << 20
	for _, p := range []struct {
		flag   string
		v, min int
		max    int
		about  string
	}{{"tokens", c.Tokens, 1, maxDim, ""}, {"hidden", c.Hidden, 1, maxDim, ""}, {"ffn", c.FFN, 1, maxDim, ""},
		{"experts", c.Experts, 1, maxDim, ""}, {"ep", c.EP, 1, maxDim, ""},
		{"iters", c.Iters, 1, MaxIters, " (use --max-seconds to bound a run by time)"},
		{"warmup", c.Warmup, 0, MaxIters, ""}, {"shared-experts", c.SharedExperts, 0, 1024, ""}} {
		if p.v < p.min || p.v > p.max {
			return &ConfigError{p.flag, p.v, fmt.Sprintf("must be in [%d, %d]%s", p.min, p.max, p.about)}
		}
	}
	if c.TopK < 1 || c.TopK > c.Experts {
		return &ConfigError{"topk", c.TopK, fmt.Sprintf("must be in [1, --experts=%d]", c.Experts)}
	}
	switch {
	case c.Experts%c.EP != 0:
		return &ConfigError{"ep", c.EP, fmt.Sprintf("must divide --experts (%d); allowed: %s", c.Experts, divisors(c.Experts))}
	}
	return nil
}

// validateRouter checks the router's settings.
func (c Config) validateRouter() error {
	switch {
	case c.Score != kernels.ScoreSoftmax && c.Score != kernels.ScoreSigmoid:
		return &ConfigError{"score", c.Score, "allowed: softmax, sigmoid"}
	case c.PreSoftmax && c.Score != kernels.ScoreSoftmax:
		return &ConfigError{"pre-softmax", c.PreSoftmax, "applies to --score softmax only (a sigmoid router's probabilities are its chosen experts' sigmoids)"}
	case c.Score == kernels.ScoreSoftmax && c.TopK == 1 && !c.PreSoftmax:
		return &ConfigError{"topk", c.TopK, "with --score softmax, top-1 takes the softmax over the chosen logit alone, which is 1 for every token " +
			"(Megatron-Core refuses it: the router would get no gradient); add --pre-softmax to take the softmax over all experts before the top-k"}
	case c.Groups < 0:
		return &ConfigError{"groups", c.Groups, "must be ≥ 0 (0 = no group-limited routing)"}
	case c.Groups > 1 && c.Experts%c.Groups != 0:
		return &ConfigError{"groups", c.Groups, fmt.Sprintf("must divide --experts (%d); allowed: %s", c.Experts, divisors(c.Experts))}
	case c.Groups > 1 && (c.GroupTopK < 1 || c.GroupTopK > c.Groups):
		return &ConfigError{"topk-groups", c.GroupTopK, fmt.Sprintf("must be in [1, --groups=%d]", c.Groups)}
	case c.Groups > 1 && c.TopK%c.GroupTopK != 0:
		return &ConfigError{"topk-groups", c.GroupTopK, fmt.Sprintf("must divide --topk (%d)", c.TopK)}
	case c.Groups > 1 && c.TopK/c.GroupTopK > c.Experts/c.Groups:
		return &ConfigError{"topk-groups", c.GroupTopK, fmt.Sprintf("too small: each chosen group would need %d of its %d experts", c.TopK/c.GroupTopK, c.Experts/c.Groups)}
	case c.Groups <= 1 && c.GroupTopK != 0:
		return &ConfigError{"topk-groups", c.GroupTopK, "needs --groups > 1"}
	case !(c.TopKScale > 0) || c.TopKScale > 1e6:
		return &ConfigError{"topk-scale", c.TopKScale, "must be in (0, 1e6]"}
	}
	return nil
}

// validateDispatcher checks the dispatcher's options, the GPUs and the SM
// budgets.
func (c Config) validateDispatcher() error {
	switch {
	case c.Domain < 0 || (c.Domain > 0 && c.EP%c.Domain != 0):
		return &ConfigError{"domain", c.Domain, fmt.Sprintf("must divide --ep (%d); 0 = all ranks in one domain", c.EP)}
	case c.FeplbDyn < 0 || c.FeplbDyn > c.Experts:
		return &ConfigError{"feplb-dynamic", c.FeplbDyn, fmt.Sprintf("must be in [0, --experts=%d] (0: fitted to the layer)", c.Experts)}
	case c.FeplbBase == "feplb" || !slices.Contains(dispatchers.Names(), c.FeplbBase):
		others := slices.DeleteFunc(dispatchers.Names(), func(n string) bool { return n == "feplb" })
		return &ConfigError{"feplb-base", c.FeplbBase, "the dispatcher of feplb's phase 1; allowed: " + strings.Join(others, ", ")}
	case !slices.Contains(balance.FEPLBPolicies, c.FeplbPolicy):
		return &ConfigError{"feplb-policy", c.FeplbPolicy, "allowed: " + strings.Join(balance.FEPLBPolicies, ", ")}
	case c.GPUs < 0 || c.GPUs > c.EP:
		return &ConfigError{"gpus", c.GPUs, fmt.Sprintf("must be in [0, --ep=%d] (0 = every GPU, at most one per rank)", c.EP)}
	case c.CUDAGraph && c.Device == "host":
		return &ConfigError{"cuda-graph", c.CUDAGraph, "applies to the cuda device; the host device issues no graphs"}
	case c.GPUs > 0 && c.Device == "host":
		return &ConfigError{"gpus", c.GPUs, "applies to the cuda device; the host device has no GPUs"}
	case c.SMs < 0 || c.SMs > dispatchers.MaxSMBudget:
		return &ConfigError{"sms", c.SMs, fmt.Sprintf("must be in [0, %d] (0 = the dispatcher's default)", dispatchers.MaxSMBudget)}
	case c.PreprocessSMs < 0 || c.PreprocessSMs > dispatchers.MaxSMBudget:
		return &ConfigError{"preprocess-sms", c.PreprocessSMs, fmt.Sprintf("must be in [0, %d] (0 = the default)", dispatchers.MaxSMBudget)}
	case c.PermuteSMs < 0 || c.PermuteSMs > dispatchers.MaxSMBudget:
		return &ConfigError{"permute-sms", c.PermuteSMs, fmt.Sprintf("must be in [0, %d] (0 = the default)", dispatchers.MaxSMBudget)}
	}
	return nil
}

// validateTimeouts checks the communication timeouts, the watchdog and
// --max-seconds.
func (c Config) validateTimeouts() error {
	switch {
	case c.CommTimeout < time.Millisecond || c.CommTimeout > time.Hour:
		return &ConfigError{"comm-timeout", c.CommTimeout, fmt.Sprintf("must be in [1ms, 1h] (0 = the default, %s)", dispatchers.DefaultCommTimeout)}
	case c.NCCLEPTimeout < time.Millisecond || c.NCCLEPTimeout > time.Hour:
		return &ConfigError{"ncclep-timeout", c.NCCLEPTimeout, fmt.Sprintf("must be in [1ms, 1h] (0 = the default, %s)", dispatchers.DefaultCommTimeout)}
	case c.WatchdogTimeout != 0 && (c.WatchdogTimeout < time.Second || c.WatchdogTimeout > MaxWatchdog):
		return &ConfigError{"watchdog-timeout", c.WatchdogTimeout, fmt.Sprintf("must be 0 (%s) or in [1s, %s]", watchdogDerived, fmtHours(MaxWatchdog))}
	case c.WatchdogTimeout != 0 && c.WatchdogTimeout <= max(c.CommTimeout, c.ncclepWait()):
		return &ConfigError{"watchdog-timeout", c.WatchdogTimeout, fmt.Sprintf("must be above --comm-timeout (%v) and NCCL EP's timeout (%s), so that a wait's own timeout ends first and names the rank and the wait",
			c.CommTimeout, c.ncclepWaitName())}
	case !(c.MaxSeconds >= 0 && c.MaxSeconds <= MaxSeconds):
		return &ConfigError{"max-seconds", c.MaxSeconds, fmt.Sprintf("must be in [0, %d] (0 = no limit)", MaxSeconds)}
	}
	return nil
}

// validateDevice checks the device, what it allows, the implementation,
// the precision and --host-experts.
func (c Config) validateDevice() error {
	switch {
	case c.Device != "host" && c.Device != "cuda" && c.Device != "auto":
		return &ConfigError{"device", c.Device, "allowed: host, cuda, auto"}
	case c.Device == "cuda" && c.TopK > 32:
		return &ConfigError{"topk", c.TopK, "must be ≤ 32 on the cuda device (the router kernel keeps one choice per warp lane)"}
	case c.Device == "cuda" && c.Hidden%8 != 0:
		return &ConfigError{"hidden", c.Hidden, "must be a multiple of 8 on the cuda device (rows move as 16-byte vectors)"}
	case c.Impl != "native" && c.Impl != "library":
		return &ConfigError{"impl", c.Impl, "allowed: native, library"}
	case !slices.Contains(Precisions, c.ResolvedPrecision()):
		return &ConfigError{"precision", c.Precision, "allowed: " + strings.Join(Precisions, ", ")}
	case c.ResolvedPrecision() != PrecisionBF16 && c.Hidden%dispatchers.ScaleBlock(c.ResolvedPrecision()) != 0:
		b := dispatchers.ScaleBlock(c.ResolvedPrecision())
		return &ConfigError{"precision", c.Precision, fmt.Sprintf("needs --hidden a multiple of %d (it quantizes rows in blocks of %d; --hidden is %d)", b, b, c.Hidden)}
	case c.ResolvedPrecision() == PrecisionMXFP8 && c.FFN%32 != 0:
		return &ConfigError{"ffn", c.FFN, "must be a multiple of 32 at --precision mxfp8 (fc2's input is quantized in 1×32 MX blocks along ffn)"}
	case c.HostExperts != "" && !slices.Contains(HostExpertsModes, c.HostExperts):
		return &ConfigError{"host-experts", c.HostExperts, "allowed: " + strings.Join(HostExpertsModes, ", ")}
	case c.HostExperts != "" && c.HostExperts != HostExpertsAuto && c.Device == "cuda":
		return &ConfigError{"host-experts", c.HostExperts, "applies to the host device; the cuda device's host side holds no expert weights"}
	case c.HostExperts != "" && c.HostExperts != HostExpertsAuto && c.HostExperts != HostExpertsHeld && DispatcherMovesWeights(c):
		return &ConfigError{"host-experts", c.HostExperts, c.Dispatcher + " moves whole experts' weights and weight gradients between ranks, so the layer holds them all: allowed: auto, held"}
	}
	return nil
}

// validateBudget checks --sms against the dispatcher's SM budget.
func (c Config) validateBudget() error {
	if b, ok := dispatchers.SMBudgetOf(c.Dispatcher, c.Impl); ok {
		if err := b.Check(c.SMs); err != nil {
			return &ConfigError{"sms", c.SMs, c.Dispatcher + ": " + err.Error()}
		}
	}
	return nil
}

// Record is c as the result record holds it.
func (c Config) Record() results.Config {
	r := results.Config{Preset: c.Preset, Tokens: c.Tokens, Hidden: c.Hidden, FFN: c.FFN, Experts: c.Experts,
		TopK: c.TopK, SharedExperts: c.SharedExperts, Score: c.Score, Groups: c.Groups, GroupTopK: c.GroupTopK,
		TopKScale: c.TopKScale, PreSoftmax: c.PreSoftmax, Dispatcher: c.Dispatcher, Impl: c.Impl, SMs: c.SMs, EP: c.EP, GPUs: c.GPUs, Domain: c.Domain,
		Routing: c.Routing.String(), RoutingPerStep: c.PerStepRouting(), Seed: c.Seed, Warmup: c.Warmup, Iters: c.Iters, MaxSeconds: c.MaxSeconds, Check: c.Check, Device: c.Device,
		CUDAGraph: c.CUDAGraph, Pass: results.PassTraining}
	r.Overlap, r.DelayWgrad, r.AttentionMS = strings.Join(c.Overlap, ","), c.DelayWgrad, c.AttentionMS
	if p := c.ResolvedPrecision(); p != PrecisionBF16 { // absent: bf16, as every older record
		r.Precision = p
	}
	if m := c.ResolvedHostExperts(); c.Device == "host" && m != HostExpertsHeld {
		r.HostExperts = m
	}
	if c.ForwardOnly {
		r.Pass = results.PassForward
	}
	if c.Check {
		r.CheckTokens = results.CheckSample
		if c.CheckAll {
			r.CheckTokens = results.CheckAll
		}
	}
	if c.Dispatcher == "feplb" {
		r.FeplbBase, r.FeplbDynamic, r.FeplbPolicy = c.FeplbBase, c.FeplbDynamic(), c.FeplbPolicy
	}
	if c.Dispatcher == "hybridep" {
		r.PreprocessSMs, r.PermuteSMs = c.PreprocessSMs, c.PermuteSMs
	}
	switch _, smDriven := dispatchers.SMBudgetOf(c.Dispatcher, c.Impl); {
	case dispatchers.IsLibrary(c.Dispatcher, c.Impl):
		r.NCCLEPTimeoutS = c.NCCLEPTimeout.Seconds()
	case smDriven:
		r.CommTimeoutS = c.CommTimeout.Seconds()
	}
	if c.Device == "cuda" {
		r.WatchdogTimeoutS = c.WatchdogLimit().Seconds()
	}
	return r
}

// MaxWatchdog bounds --watchdog-timeout.
const MaxWatchdog = 24 * time.Hour

// watchdogDerived says what --watchdog-timeout 0 means (WatchdogLimit).
const watchdogDerived = "6 × the longer of --comm-timeout and NCCL EP's timeout (--ncclep-timeout, or NCCL_EP_TIMEOUT_MS where set), at least 30s"

// WatchdogLimit is the longest one call on a GPU's thread may take once
// the first step has run: WatchdogTimeout, or where it is 0 six times the
// longer of the cross-rank timeouts (a phase may wait several times), at
// least stepWait.
func (c Config) WatchdogLimit() time.Duration {
	if c.WatchdogTimeout > 0 {
		return c.WatchdogTimeout
	}
	longest := max(c.CommTimeout, c.ncclepWait())
	if longest <= 0 {
		longest = dispatchers.DefaultCommTimeout
	}
	return max(stepWait, 6*longest)
}

// ncclepWait is how long NCCL EP's kernels wait for other ranks:
// NCCL_EP_TIMEOUT_MS where set, which NCCL EP takes over the group's
// timeout_ns, else --ncclep-timeout.
func (c Config) ncclepWait() time.Duration {
	if t := ncclep.TimeoutFromEnv(); t > 0 {
		return t
	}
	return c.NCCLEPTimeout
}

// ncclepWaitName says where ncclepWait came from.
func (c Config) ncclepWaitName() string {
	if t := ncclep.TimeoutFromEnv(); t > 0 {
		return fmt.Sprintf("NCCL_EP_TIMEOUT_MS: %v", t)
	}
	return fmt.Sprintf("--ncclep-timeout %v", c.NCCLEPTimeout)
}

// fmtHours spells a whole number of hours as "24h".
func fmtHours(d time.Duration) string { return fmt.Sprintf("%dh", int(d.Hours())) }

// perStepRouting says whether each step draws its own routing.
// FeplbDynamic is feplb's dynamic experts per rank: FeplbDyn, or where it
// is 0 (the default) one fitted to the layer (balance.DefaultDynamic).
func (c Config) FeplbDynamic() int {
	if c.FeplbDyn > 0 {
		return c.FeplbDyn
	}
	return balance.DefaultDynamic(c.Experts / max(c.EP, 1))
}

func (c Config) PerStepRouting() bool { return !c.RoutingFixed && c.Routing.Kind != RoutingNatural }

// RouterConfig is the kernels' view of the router settings; bias is the
// per-expert selection bias (sigmoid only).
func (c Config) RouterConfig(bias []float32) kernels.RouterConfig {
	rc := kernels.RouterConfig{Experts: c.Experts, TopK: c.TopK, Score: c.Score, Scale: c.TopKScale, PreSoftmax: c.PreSoftmax}
	if c.Groups > 1 {
		rc.Groups, rc.GroupTopK = c.Groups, c.GroupTopK
	}
	if c.Score == kernels.ScoreSigmoid {
		rc.Bias = bias
	}
	return rc
}

func divisors(n int) string {
	var d []string
	for i := 1; i <= n && len(d) < 12; i++ {
		if n%i == 0 {
			d = append(d, fmt.Sprint(i))
		}
	}
	if len(d) == 12 {
		d = append(d, "…")
	}
	return strings.Join(d, ", ")
}
