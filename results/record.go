// Package results defines moebench's result record — one versioned JSON
// object per run, one line per record in a JSONL file — and appends and reads
// such files safely.
//
// The record, reports and compare: docs/results.md.
package results

import (
	"fmt"
	"strings"
)

// Schema names this record version. Readers refuse any other.
const Schema = "moebench.record/v1"

// Status of a run.
const (
	StatusOK          = "ok"          // ran, passed its check (or was not checked): timings are valid
	StatusFailed      = "failed"      // ran but failed (correctness or runtime error): no timings
	StatusUnavailable = "unavailable" // could not run here (environment limitation): no timings
)

// Record is one run's result.
type Record struct {
	Schema string `json:"schema"`
	Time   string `json:"time"` // RFC 3339, UTC
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"` // why failed or unavailable
	// Interrupted: a signal (SIGINT, SIGTERM) stopped the run early, and
	// where; an ok record holds the timed steps run before it (Timing.Stopped
	// says how many), a failed one says in Reason that nothing was timed
	Interrupted string `json:"interrupted,omitempty"`

	Config Config `json:"config"`
	Stack  Stack  `json:"stack"`
	Ranks  Ranks  `json:"ranks"`

	Timing      *Timing      `json:"timing,omitempty"` // only when Status is ok
	Tokens      *Tokens      `json:"tokens,omitempty"`
	GEMM        *GEMM        `json:"gemm,omitempty"`
	Traffic     *Traffic     `json:"traffic,omitempty"`
	Memory      *Memory      `json:"memory,omitempty"`
	SMs         SMs          `json:"sms"`
	Correctness *Correctness `json:"correctness,omitempty"`
	Rebalance   *Rebalance   `json:"rebalance,omitempty"` // dispatchers with a rebalance phase (feplb)
	Library     *Library     `json:"library,omitempty"`   // a library implementation's (--impl library) what ran
	Telemetry   *Telemetry   `json:"telemetry,omitempty"` // cuda runs where NVML answered
	Overlap     *Overlap     `json:"overlap,omitempty"`   // --overlap, --delay-wgrad (overlap.go)

	// Mapped, set by the reader (never written), says that the record was
	// written under an older name of its dispatcher and read under
	// today's (names.go); empty for every other record.
	Mapped string `json:"-"`
}

// Library is what a library implementation ran.
type Library struct {
	Design  string `json:"design"` // e.g. "DeepEP low-latency design via NCCL EP (…)"
	Name    string `json:"name"`
	Version string `json:"version"`
	Path    string `json:"path"`
	Detail  string `json:"detail"` // mode, layout, options, what it runs over
}

// Telemetry is what NVML reported during a cuda run's timed loop.
type Telemetry struct {
	Method         string   `json:"method"`
	GPU            string   `json:"gpu"`                   // which GPU the clocks, power and GPM are of, and how it was found
	MemoryUsedMax  []int64  `json:"memory_used_max_bytes"` // per GPU, the most in use (all processes)
	SMClockMHz     float64  `json:"sm_clock_mhz_mean"`
	MemClockMHz    float64  `json:"mem_clock_mhz_mean"`
	PowerW         float64  `json:"power_w_mean"`
	GPM            bool     `json:"gpm"` // the two metrics below were measured
	SMUtilPct      float64  `json:"sm_util_pct"`
	SMOccupancyPct float64  `json:"sm_occupancy_pct"`
	Unread         []string `json:"unread,omitempty"` // what could not be read, and why
}

// Rebalance is what a rebalancing dispatcher (FEPLB's phase 2) did: the
// tokens and plan are the last timed iteration's; times are medians over
// the timed iterations.
type Rebalance struct {
	Policy         string    `json:"policy"`
	Note           string    `json:"note"`
	TokensBefore   []int     `json:"tokens_before_per_rank"`
	TokensAfter    []int     `json:"tokens_after_per_rank"`
	TokenBefore    Straggler `json:"token_straggler_before"`
	TokenAfter     Straggler `json:"token_straggler_after"`
	ModelledBefore float64   `json:"gemm_straggler_modelled_before_s"`
	ModelledAfter  float64   `json:"gemm_straggler_modelled_after_s"`
	// measured GEMM straggler in ms, from each rank's median expert time
	// (its expert phases summed): after, in the timed steps (the record's
	// gemm.straggler); before, in as many steps with phase 2 paused, run
	// (with their own warm-up) before the timed ones
	GEMMBefore      Straggler `json:"gemm_straggler_before"`
	GEMMAfter       Straggler `json:"gemm_straggler_after"`
	Moves           int       `json:"moves"`
	CopyBytes       int64     `json:"copy_bytes"`
	CopyMS          float64   `json:"copy_ms_p50"` // incoming copies of the slowest helper plus outputs back to the slowest owner
	CopyMethod      string    `json:"copy_method"`
	SchedulerMS     float64   `json:"scheduler_ms_p50"`      // the scheduler's own time
	SchedulerWaitMS float64   `json:"scheduler_wait_ms_p50"` // how long phase 2 waited for it (its exposed part)
	// ExposedMS is how long the copies held work up, median over the timed
	// steps (dispatchers.RebalanceStats.Exposed); ExposedNote says how it
	// was measured, or why not (then ExposedMS is 0)
	ExposedMS   float64 `json:"exposed_ms_p50"`
	ExposedNote string  `json:"exposed_note"`
	// HiddenShare is older records' share of the incoming copies' time
	// that overlapped the static experts (not a stall: replaced by ExposedMS)
	HiddenShare string `json:"hidden_share,omitempty"`
	PhaseTwoSMs string `json:"phase2_sm_utilisation"`
	// The backward's phase 2 (training steps): the output gradients out to
	// the helpers, their input and probability gradients back, and the
	// helpers' fp32 weight gradients of each moved (expert, helper) back to
	// the owner (WGradBytes, part of BackwardCopyBytes); copy time as
	// CopyMS's. Whether the returns hide behind the owner's own expert
	// backward is a device matter: not measured on the host.
	BackwardCopyBytes int64          `json:"backward_copy_bytes,omitempty"`
	WGradBytes        int64          `json:"wgrad_return_bytes,omitempty"`
	BackwardCopyMS    float64        `json:"backward_copy_ms_p50,omitempty"`
	Warnings          []string       `json:"warnings,omitempty"` // why the rebalance is a no-op, or that it moved nothing
	PerStep           RebalanceSteps `json:"per_step"`
}

// RebalanceSteps are the timed steps' rebalance measurements, one entry per
// step.
type RebalanceSteps struct {
	CopyMS          []float64 `json:"copy_ms"`
	SchedulerMS     []float64 `json:"scheduler_ms"`
	SchedulerWaitMS []float64 `json:"scheduler_wait_ms"`
	ExposedMS       []float64 `json:"exposed_ms"`             // -1 where not measured
	Hidden          []float64 `json:"hidden_share,omitempty"` // older records
	// max − mean of the ranks' expert time in each step, ms: the timed
	// steps, and the paused ones (the same routing, nothing moved)
	GEMMAfterMS  []float64 `json:"gemm_straggler_after_ms"`
	GEMMBeforeMS []float64 `json:"gemm_straggler_before_ms"`
}

// Config is the run's configuration as recorded: the workload (layer shape,
// routing, seed) and the settings (dispatcher, implementation, SMs, EP).
type Config struct {
	Preset        string  `json:"preset"`
	Tokens        int     `json:"tokens"` // per rank
	Hidden        int     `json:"hidden"`
	FFN           int     `json:"ffn"`
	Experts       int     `json:"experts"`
	TopK          int     `json:"topk"`
	SharedExperts int     `json:"shared_experts"`
	Score         string  `json:"score"`
	Groups        int     `json:"groups"`
	GroupTopK     int     `json:"topk_groups"`
	TopKScale     float64 `json:"topk_scale"`
	PreSoftmax    bool    `json:"pre_softmax,omitempty"` // softmax over all experts before the top-k
	Dispatcher    string  `json:"dispatcher"`
	Impl          string  `json:"impl"`
	SMs           int     `json:"sms"`
	EP            int     `json:"ep"`
	GPUs          int     `json:"gpus,omitempty"`           // cuda: GPUs asked for; 0 = every GPU, at most one per rank (where ranks ran: Ranks)
	Domain        int     `json:"domain,omitempty"`         // ranks per NVLink domain; 0 = all
	FeplbBase     string  `json:"feplb_base,omitempty"`     // feplb: phase-1 dispatcher
	FeplbDynamic  int     `json:"feplb_dynamic,omitempty"`  // feplb: dynamic experts per rank
	FeplbPolicy   string  `json:"feplb_policy,omitempty"`   // feplb: the scheduler's policy (feplb, feplb-split); older records: feplb-split's forerunner
	PreprocessSMs int     `json:"preprocess_sms,omitempty"` // hybridep: --preprocess-sms as given (0: the default; what ran: SMs.Preprocess)
	PermuteSMs    int     `json:"permute_sms,omitempty"`    // hybridep: --permute-sms as given (0: the default; what ran: SMs.Permute)
	// CommTimeoutS is --comm-timeout, for native SM-driven dispatchers:
	// the bound of each of their kernels' cross-rank waits. (Records from
	// before ncclep_timeout_s gave it for --impl library too, where it was
	// NCCL EP's timeout_ns.)
	CommTimeoutS float64 `json:"comm_timeout_s,omitempty"`
	// NCCLEPTimeoutS is --ncclep-timeout, for NCCL EP's modes (--impl
	// library of hybridep and deepep-ll): the group's timeout_ns
	// (NCCL_EP_TIMEOUT_MS, recorded with the environment, overrides it).
	NCCLEPTimeoutS float64 `json:"ncclep_timeout_s,omitempty"`
	// WatchdogTimeoutS is the cuda device's bound on one call on a GPU's
	// thread after the first step (--watchdog-timeout, or derived from
	// the two timeouts when 0).
	WatchdogTimeoutS float64 `json:"watchdog_timeout_s,omitempty"`
	CUDAGraph        bool    `json:"cuda_graph,omitempty"` // --cuda-graph: steps issued as CUDA graphs (whether they were: Timing.CUDAGraph)
	Routing          string  `json:"routing"`
	// RoutingPerStep: each iteration had its own routing, drawn from the
	// seed and the step; false: one routing replayed every iteration
	// (--routing-fixed), or the router's own (natural routing, the same
	// every step). Always written; records from before routing was drawn
	// per step lack it, and replayed theirs.
	RoutingPerStep bool    `json:"routing_per_step"`
	Seed           uint64  `json:"seed"`
	Warmup         int     `json:"warmup"`
	Iters          int     `json:"iters"`
	MaxSeconds     float64 `json:"max_seconds,omitempty"` // time budget of the iterations (Timing.Stopped says if it cut them)
	Check          bool    `json:"check"`
	// CheckTokens is which tokens the check compares: CheckSample or
	// CheckAll (--check); absent when not checked, and in older records
	// (CheckName says what those did)
	CheckTokens string `json:"check_tokens,omitempty"`
	Device      string `json:"device"`
	// Pass is what each iteration timed: PassForward or PassTraining;
	// records without it (older ones) timed the forward only. PassNote says
	// why a run that was not asked to be forward-only was (the device has
	// no backward in this build).
	Pass     string `json:"pass,omitempty"`
	PassNote string `json:"pass_note,omitempty"`
	// HostExperts is how the host device held the experts' weights and
	// weight gradients when not all of them for the whole run (older
	// records: held): "grads-by-rank" (each rank's weight gradients
	// released once checked) or "drawn" (weights drawn from the seed when
	// used: the host times include drawing them)
	HostExperts string `json:"host_experts,omitempty"`
	// Precision is the dispatch and expert-GEMM precision (--precision):
	// "fp8" or "mxfp8"; absent: bf16 (every record before the flag)
	Precision string `json:"precision,omitempty"`
	// Overlap is --overlap (comma-separated: shared, a2a), DelayWgrad
	// --delay-wgrad; absent: none (every record before the flags)
	Overlap    string `json:"overlap,omitempty"`
	DelayWgrad bool   `json:"delay_wgrad,omitempty"`
	// AttentionMS is --attention-ms, the attention stand-in's time a pass
	// (the record's GEMM method says what ran); absent: none
	AttentionMS float64 `json:"attention_ms,omitempty"`
}

// PrecisionName is c's precision, "bf16" where the record has none.
func (c Config) PrecisionName() string {
	if c.Precision == "" {
		return "bf16"
	}
	return c.Precision
}

// Passes an iteration can time.
const (
	PassForward  = "fwd"     // the forward pass alone (--forward-only; every record before the backward)
	PassTraining = "fwd+bwd" // a training step: the forward, then the backward
)

// Which tokens a check compares (Config.CheckTokens).
const (
	CheckSample = "sample" // a seeded sample of tokens per rank where every token's reference is beyond the check's budget (correctness.sample says which)
	CheckAll    = "all"    // every token
	CheckOff    = "off"    // no check
)

// CheckName is c's check: CheckOff, CheckAll or CheckSample; for records
// without check_tokens (older) what their device did then: the host
// compared every token, the cuda device a sample.
func (c Config) CheckName() string {
	switch {
	case !c.Check:
		return CheckOff
	case c.CheckTokens != "":
		return c.CheckTokens
	case c.Device == "host":
		return CheckAll
	}
	return CheckSample
}

// PassName is c's pass, PassForward for records that predate the field.
func (c Config) PassName() string {
	if c.Pass == "" {
		return PassForward
	}
	return c.Pass
}

// Stack is what the numbers were measured on: the machine, its software and
// the moebench build. Identity (see stack.go) decides which records may be
// compared.
type Stack struct {
	Device   string `json:"device"`         // host | cuda
	Note     string `json:"note,omitempty"` // e.g. why auto chose host
	Hostname string `json:"hostname,omitempty"`

	CPU         string `json:"cpu"`          // model name
	CPUs        int    `json:"cpus"`         // logical CPUs
	GOMAXPROCS  int    `json:"gomaxprocs"`   // Go threads running at once
	MemoryBytes int64  `json:"memory_bytes"` // host memory
	OS          string `json:"os"`           // GOOS/GOARCH and kernel release
	GoVersion   string `json:"go_version"`   // toolchain that built moebench

	GPU *GPUStack `json:"gpu,omitempty"` // cuda device only

	Version    string            `json:"moebench_version"`
	Commit     string            `json:"commit,omitempty"`   // VCS revision of the build, "+dirty" if modified
	KernelHash string            `json:"kernel_source_hash"` // sha256 of the kernel sources in the binary
	Env        map[string]string `json:"env,omitempty"`      // environment variables that can change results
}

// GPUStack is the GPU side of the fingerprint, filled on the cuda device.
type GPUStack struct {
	Model       string   `json:"model"`
	Count       int      `json:"count"`
	SMs         int      `json:"sms"`
	CopyEngines int      `json:"copy_engines"`
	MemoryBytes int64    `json:"memory_bytes"`
	Driver      string   `json:"driver"`      // kernel driver version
	CUDADriver  int      `json:"cuda_driver"` // driver API version, e.g. 13000
	NVRTC       string   `json:"nvrtc,omitempty"`
	CuBLASLt    string   `json:"cublaslt,omitempty"`
	NCCL        string   `json:"nccl,omitempty"`
	NCCLEP      string   `json:"nccl_ep,omitempty"`
	SMClockMHz  int      `json:"sm_clock_mhz"`
	MemClockMHz int      `json:"mem_clock_mhz"`
	PowerLimitW float64  `json:"power_limit_w"`
	Topology    string   `json:"topology"`         // peer access between every pair of GPUs, and each GPU's active NVLinks (NVML)
	Unread      []string `json:"unread,omitempty"` // fields that could not be read, and why
}

// Ranks says how EP ranks map to devices.
type Ranks struct {
	EP       int    `json:"ep"`
	Devices  []int  `json:"devices"`  // device of each rank (-1 = host); in a run over processes, its GPU on its node
	Emulated bool   `json:"emulated"` // more ranks than devices: ranks packed
	Note     string `json:"note,omitempty"`
	// A run over several processes (nodes): how it was launched, and each
	// process's ranks, node and GPUs (the rank → node/GPU map).
	Launch    string    `json:"launch,omitempty"`
	Processes []Process `json:"processes,omitempty"`
}

// Process is one process of a run over several: its ranks, its node, the
// GPU of each rank on the node, and what of its stack differs from rank
// 0's (StackDiff's relevant lines; the record's stack is rank 0's).
type Process struct {
	Process      int      `json:"process"`
	Host         string   `json:"host"`
	Ranks        []int    `json:"ranks"`
	GPUs         []int    `json:"gpus"`
	StackDiffers []string `json:"stack_differs,omitempty"`
}

// Stat summarises samples of one quantity, in the record's unit.
type Stat struct {
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Mean  float64 `json:"mean"`
	Stdev float64 `json:"stdev"`
}

// Phase is one pipeline phase's timing.
type Phase struct {
	Name string `json:"name"`
	Stat        // over iterations of the slowest rank's time
	// RankMin and RankMax are the fastest and slowest rank's median.
	RankMin float64   `json:"rank_min"`
	RankMax float64   `json:"rank_max"`
	PerRank []float64 `json:"per_rank_p50"`
	Samples []float64 `json:"samples"` // per iteration, slowest rank
	// HostCall: a library implementation's phase, the wall time of its
	// library calls on the host, their internal synchronizations included
	// (the slowest rank's per iteration); the phase's own times above are
	// CUDA events around the calls on the rank's stream
	HostCall *Stat `json:"host_call_ms,omitempty"`
}

// DesignPhase is a sum of phases timed as a design's own test times one
// operation: per iteration, the sum of each part's slowest rank (as a
// pass is summed); GBps and GBpsPerSM are the algorithm bytes' rate over
// its p50 (a rank's share, and per SM held).
type DesignPhase struct {
	Phase
	Parts     []string `json:"parts"`
	About     string   `json:"about"`
	GBps      float64  `json:"algo_gbps,omitempty"`
	GBpsPerSM float64  `json:"algo_gbps_per_sm,omitempty"`
}

// The values of Timing.StepIs.
const (
	StepLockstep    = "lockstep"
	StepSlowestRank = "slowest_rank"
)

// Timing holds per-phase and step times.
type Timing struct {
	Unit   string `json:"unit"`  // ms
	Clock  string `json:"clock"` // what measured them
	Warmup int    `json:"warmup"`
	Iters  int    `json:"iters"` // timed iterations run
	// Stopped says why fewer iterations ran than the config asked for
	// (--max-seconds); empty when all ran
	Stopped string  `json:"stopped,omitempty"`
	Phases  []Phase `json:"phases"`
	Step    Phase   `json:"step"`
	Model   string  `json:"model"` // how the step is composed from phases
	// StepIs says which of the two steps below Step is (compare and the
	// report's speedup use Step): StepLockstep on the host device, where
	// the ranks run a phase one after another; StepSlowestRank on a device,
	// where each rank's step is measured with its waits. Empty in older
	// records.
	StepIs string `json:"step_is,omitempty"`
	// SlowestRank is, per iteration, the slowest rank's own step (on the
	// host the sum of its own phase times: a rank that waits for no one);
	// Lockstep the sum of each phase's slowest rank (a barrier between
	// phases: the bound when the slowest rank differs from phase to phase).
	// Absent in older records.
	SlowestRank *Phase `json:"step_slowest_rank,omitempty"`
	Lockstep    *Phase `json:"step_lockstep,omitempty"`
	// Forward and Backward are a training step's two passes, each made of
	// its phases as the host's Step is of all of them (their sum is the
	// lockstep step); absent when the iterations timed the forward only.
	Forward  *Phase `json:"forward,omitempty"`
	Backward *Phase `json:"backward,omitempty"`
	// DispatchAsDesigned is the dispatch as the design's own test times it
	// (deepep: notify + dispatch; hybridep: allgather + preprocess +
	// dispatch), each part also a phase above; absent for the others.
	DispatchAsDesigned *DesignPhase `json:"dispatch_as_designed,omitempty"`
	// device runs: the host's wall time to issue one step, from its first
	// call to its last call's return, before waiting for the streams, less
	// HostWait. Close to the step time, the GPU may have waited for the
	// host: the times then include launch gaps.
	HostIssue *Stat `json:"host_issue_ms,omitempty"`
	// device runs of a dispatcher that waits on the host before a phase
	// (alltoall's count exchange): that wait's wall time per step, which no
	// phase's time holds (each is timed from its own first GPU operation)
	HostWait *Stat `json:"host_wait_ms,omitempty"`
	// device runs: whether the timed steps were issued as CUDA graphs
	// (--cuda-graph) and how: launches, captures, refused captures
	CUDAGraph string `json:"cuda_graph,omitempty"`
}

// Straggler is max−mean (absolute) and max/mean−1 (relative) over ranks.
type Straggler struct {
	Abs     float64   `json:"abs"`
	Rel     float64   `json:"rel"`
	PerRank []float64 `json:"per_rank"`
}

// Tokens counts the token copies each rank's experts compute (after any
// rebalance).
type Tokens struct {
	Received  []int     `json:"received_per_rank"` // the last timed step's
	Straggler Straggler `json:"straggler"`         // of Received
	// every timed step's copies per rank and their straggler (max − mean):
	// with routing drawn per step they differ from step to step
	ReceivedPerStep  [][]int   `json:"received_per_step,omitempty"`
	StragglerPerStep []float64 `json:"straggler_per_step,omitempty"`
}

// GEMM is the expert computation's work and its straggler.
type GEMM struct {
	FLOPsPerIter float64   `json:"flops_per_iter"` // all ranks, routed + shared
	Formula      string    `json:"formula"`
	TFLOPS       float64   `json:"tflops"`           // FLOPs of the slowest rank / its median experts time
	Straggler    Straggler `json:"straggler_ms"`     // over per-rank median experts time
	Method       string    `json:"method,omitempty"` // how the expert GEMMs ran, and why (device runs)
	// At fp8 (--precision fp8): which expert GEMM path ran — "bf16-dequant"
	// (bf16 GEMMs on dequantized rows and weights), "cublaslt-fp8-block"
	// or "cublaslt-fp8-tensor" (kernels.FP8GEMMPath) — and why that one
	// (what the device's cuBLASLt and GPU offer). Absent at bf16.
	FP8Path       string `json:"fp8_path,omitempty"`
	FP8PathReason string `json:"fp8_path_reason,omitempty"`
	// The backward's expert GEMMs (training steps): dgrad and wgrad of fc1
	// and fc2, twice the forward's FLOPs (BackwardFormula); the rate as
	// TFLOPS's, over the expert backward phases; their straggler over the
	// ranks' median expert-backward times, ms.
	BackwardFLOPsPerIter float64    `json:"backward_flops_per_iter,omitempty"`
	BackwardFormula      string     `json:"backward_formula,omitempty"`
	BackwardTFLOPS       float64    `json:"backward_tflops,omitempty"`
	BackwardStraggler    *Straggler `json:"backward_straggler_ms,omitempty"`
}

// Traffic is bytes moved per step.
type Traffic struct {
	DispatchOffRank int64  `json:"dispatch_off_rank_bytes"`
	DispatchLogical int64  `json:"dispatch_logical_bytes"`
	CombineOffRank  int64  `json:"combine_off_rank_bytes"`
	CombineLogical  int64  `json:"combine_logical_bytes"`
	Formula         string `json:"formula"`
	// The design's own bandwidth convention ("algorithm bandwidth", DeepEP's
	// test_intranode: tokens received × hidden × 2 B, a rank's tokens to
	// itself included), all ranks; absent when the design states none.
	DispatchAlgorithm int64  `json:"dispatch_algorithm_bytes,omitempty"`
	CombineAlgorithm  int64  `json:"combine_algorithm_bytes,omitempty"`
	AlgorithmFormula  string `json:"algorithm_formula,omitempty"`
	// The part of the off-rank bytes that crosses NVLink domains (a
	// domain-aware design's inter-domain path), and the inter-domain bytes
	// of each direction in the design's own convention; absent for designs
	// that do not tell domains apart and runs in one domain.
	DispatchInterDomain  int64 `json:"dispatch_inter_domain_bytes,omitempty"`
	CombineInterDomain   int64 `json:"combine_inter_domain_bytes,omitempty"`
	InterDomainAlgorithm int64 `json:"inter_domain_algorithm_bytes,omitempty"`
	// The backward's bytes (training steps): the combine's backward sends
	// output gradients the dispatch's way, the dispatch's backward input and
	// probability gradients the combine's way; BackwardFormula counts them.
	CombineBackwardOffRank  int64  `json:"combine_backward_off_rank_bytes,omitempty"`
	CombineBackwardLogical  int64  `json:"combine_backward_logical_bytes,omitempty"`
	DispatchBackwardOffRank int64  `json:"dispatch_backward_off_rank_bytes,omitempty"`
	DispatchBackwardLogical int64  `json:"dispatch_backward_logical_bytes,omitempty"`
	BackwardFormula         string `json:"backward_formula,omitempty"`
	// Bandwidth in GB/s (1e9 B/s) by BandwidthFormula: a rank's share of
	// the algorithm bytes over the phase's p50; per SM of the budget for
	// SM-driven dispatchers.
	DispatchGBps      float64 `json:"dispatch_gbps,omitempty"`
	CombineGBps       float64 `json:"combine_gbps,omitempty"`
	DispatchGBpsPerSM float64 `json:"dispatch_gbps_per_sm,omitempty"`
	CombineGBpsPerSM  float64 `json:"combine_gbps_per_sm,omitempty"`
	BandwidthFormula  string  `json:"bandwidth_formula,omitempty"`
	// moebench's per-copy convention, the same for every dispatcher of a
	// workload: CopyBytes (CopyFormula) over all ranks, and the GB/s a
	// rank's share of them gives over the dispatch (combine) phase's p50.
	CopyBytes        int64   `json:"copy_payload_bytes,omitempty"`
	CopyFormula      string  `json:"copy_payload_formula,omitempty"`
	DispatchCopyGBps float64 `json:"dispatch_copy_gbps,omitempty"`
	CombineCopyGBps  float64 `json:"combine_copy_gbps,omitempty"`
	// A run over several processes: the last step's off-rank bytes by
	// where they go, by the rank → node map of ranks.processes (NodeFormula):
	// to a rank of another node (inter-node) or to another rank of the same
	// node (intra-node), each way; and the GB/s a rank's share of each
	// gives over the dispatch (combine) phase's p50.
	InterNodeBytes        int64   `json:"inter_node_bytes,omitempty"`
	IntraNodeBytes        int64   `json:"intra_node_bytes,omitempty"`
	NodeFormula           string  `json:"node_formula,omitempty"`
	DispatchInterNodeGBps float64 `json:"dispatch_inter_node_gbps,omitempty"`
	DispatchIntraNodeGBps float64 `json:"dispatch_intra_node_gbps,omitempty"`
	CombineInterNodeGBps  float64 `json:"combine_inter_node_gbps,omitempty"`
	CombineIntraNodeGBps  float64 `json:"combine_intra_node_gbps,omitempty"`
}

// NodeFormula says how Traffic's inter- and intra-node bytes count.
const NodeFormula = "(token, rank) pairs × hidden×2 B (bf16), each way: a token goes to a rank once however many of its experts the rank holds; " +
	"inter-node: the rank is on another node than the token's (ranks.processes[].host), intra-node: another rank of the same node"

// Memory is the peak memory of each rank.
type Memory struct {
	PerRankBytes []int64 `json:"per_rank_bytes"`
	Method       string  `json:"method"`
	// Buffers are the dispatcher's buffers (e.g. receive and queue memory)
	// as a GPU holds them, where the dispatcher describes them.
	Buffers []Buffer `json:"dispatcher_buffers,omitempty"`
	// SavedPerRankBytes is what a training step's forward keeps for its
	// backward on each rank, in the storage a GPU keeps it in (SavedFormula);
	// the host's own copy of it is part of PerRankBytes.
	SavedPerRankBytes []int64 `json:"saved_for_backward_per_rank_bytes,omitempty"`
	SavedFormula      string  `json:"saved_formula,omitempty"`
}

// Buffer is one of the dispatcher's buffers on every rank.
type Buffer struct {
	Name         string  `json:"name"`
	About        string  `json:"about"`
	PerRankBytes []int64 `json:"per_rank_bytes"`
}

// SMs is the SM budget.
type SMs struct {
	Configured int `json:"configured"` // --sms; 0 = dispatcher default
	// Note: a library implementation's use of SMs (what --sms set, its
	// default, the environment's overrides)
	Note string `json:"note,omitempty"`
	// Budget is the blocks an SM-driven dispatcher ran its transfers with
	// (its default when Configured is 0); absent for the others.
	Budget int `json:"budget,omitempty"`
	// Held is the SMs each rank's transfer kernels held on a device: one
	// block per SM (checked by occupancy), so the budget; HeldNote says
	// how the ranks share each GPU's SMs, or why none are held (the host
	// device). Absent for the other dispatchers and in older records.
	Held     int    `json:"held,omitempty"`
	HeldNote string `json:"held_note,omitempty"`
	// Preprocess and Permute are the blocks per rank of hybridep's
	// preprocessing and permute launches, budgets of their own (its
	// defaults where PreprocessSMs and PermuteSMs are 0); absent for the
	// other dispatchers, on the host device and in older records.
	Preprocess int    `json:"preprocess,omitempty"`
	Permute    int    `json:"permute,omitempty"`
	Measured   string `json:"measured"` // or why it was not
}

// Correctness is the outcome of the check against the float64 reference.
type Correctness struct {
	Checked      bool    `json:"checked"`
	Passed       bool    `json:"passed"`
	MaxRelErr    float64 `json:"max_rel_err"`
	Tolerance    float64 `json:"tolerance"`
	Metric       string  `json:"metric"`
	RoundTrip    string  `json:"round_trip"` // "exact" or what differed
	RoutingDiffs int     `json:"routing_diffs"`
	Sample       string  `json:"sample,omitempty"` // which tokens were compared, when not all
	Detail       string  `json:"detail,omitempty"`
	// Grads is the gradient check of a training step (absent for
	// forward-only runs and older records).
	Grads *GradCheck `json:"grads,omitempty"`
}

// GradCheck is a training step's gradients against the float64 reference.
type GradCheck struct {
	MaxRelErr float64 `json:"max_rel_err"` // the largest of PerTensor
	Tolerance float64 `json:"tolerance"`
	Metric    string  `json:"metric"`
	// PerTensor is each gradient's error by Metric: input, router weight,
	// expert fc1, expert fc2, shared fc1, shared fc2.
	PerTensor map[string]float64 `json:"per_tensor"`
	// RoundTrip is the dispatcher's backward alone, with experts that
	// multiply each row by its probability: "exact" when every gradient
	// came back bit for bit, else the first difference; "not run…"
	// (RoundTripNotRun) where it was not run (the cuda device, whose
	// gradient check covers the dispatcher's backward).
	RoundTrip string `json:"round_trip"`
	Note      string `json:"note"` // how the upstream gradient was drawn, and where the weight gradients' sums come from
}

// RoundTripNotRun starts a GradCheck's RoundTrip that was not run: no
// failure.
const RoundTripNotRun = "not run"

// StatusLine is "STATUS: REASON" for a failed or unavailable record, its
// reason without the "DISPATCHER (IMPL): STATUS: " prefix an error of the
// record's own dispatcher starts with (the line already says both).
func StatusLine(status, dispatcher, impl, reason string) string {
	return status + ": " + strings.TrimPrefix(reason, fmt.Sprintf("%s (%s): %s: ", dispatcher, impl, status))
}
