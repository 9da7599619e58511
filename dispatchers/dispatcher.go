// Package dispatchers defines the contract between the MoE layer and a token
// dispatcher (the piece moebench measures), and the registry that maps a
// dispatcher name and implementation to a constructor or to the reason it is
// unavailable.
//
// The contract is one interface, Design, whose type parameter is the rank it
// binds to: Rank on the host device (Dispatcher), DeviceRank on a cuda
// device (DeviceDispatcher). Host and device share every method; only Bind's
// ranks differ (host slices against device buffers, streams and threads), so
// the parameter is the one thing left per device kind. The harness runs what
// Forward and Backward return: steps, each called once per EP rank, every
// rank finishing a step before any rank starts the next. The steps surround
// one or more expert steps the layer runs ("experts", "dynamic": each rank's
// segments, rows of ExpertX into the same rows of ExpertY). The step before
// the first expert step leaves ExpertX, ExpertProbs and Segments set, the
// last leaves Rank.Y holding each token's sum of its k expert outputs
// (float32 sums; the layer stores it as bf16 and adds the shared expert).
// DeepEP, for example, returns layout, notify, dispatch, permute, experts
// and combine, its combine summing the k outputs on the way home; a design
// with Megatron's phases builds them with Sequence (permute, dispatch,
// experts, combine, unpermute). Backward returns the duals in the reverse
// order (backward.go), or nil when the design has none.
//
// Everything else a harness may use is in Capabilities, a struct the design
// fills: a reason where it lacks something (no backward, no fp8 path), and
// funcs where it must be called (rebalance stats, host waits, the check
// after a step, library timings). A nil func means the design does not do
// it, which is what an optional interface said before, but the harness reads
// one struct instead of probing the dispatcher with type assertions, and a
// wrapper (a test's broken dispatcher) overrides one field, not an interface
// it must remember to forward. Funcs, not values, where the answer depends
// on Bind (transport, launch budgets). What is decided before a dispatcher
// exists (its SM budget, a library's timeout) stays in the registry.
//
// Collective steps may read or write other ranks' state; that is how the
// ranks, which are independent objects, exchange data. An expert step
// writes only the rows its segments cover and leaves the other rows of
// ExpertY as they are.
//
// The layer and its phases: docs/concepts.md; the design: docs/design.md.
package dispatchers

import (
	"errors"
	"fmt"
	"sort"
	"time"
)

// Shape is what a dispatcher needs to know of the layer.
type Shape struct {
	Tokens  int // tokens per rank
	Hidden  int
	Experts int // routed experts, all ranks together
	TopK    int
	EP      int // expert-parallel ranks; rank r owns experts [r·L, (r+1)·L)
	// DispatchHidden is the bf16-sized elements of a row the dispatch
	// moves on the cuda device where it differs from Hidden (0: Hidden):
	// at fp8 a packed row, kernels.FP8RowPitch(Hidden)/2 (its e4m3 values
	// and its fp32 multipliers); the combine's rows are Hidden bf16.
	DispatchHidden int
}

// DispatchWidth is the bf16-sized elements of a dispatched row.
func (s Shape) DispatchWidth() int {
	if s.DispatchHidden > 0 {
		return s.DispatchHidden
	}
	return s.Hidden
}

// LocalExperts is L, the number of experts each rank owns.
func (s Shape) LocalExperts() int { return s.Experts / s.EP }

// Owner is the rank that owns global expert e.
func (s Shape) Owner(e int32) int { return int(e) / s.LocalExperts() }

// Rank is one EP rank's data during a step. Row-major float32 tensors hold
// bf16 values.
type Rank struct {
	ID    int
	X     []float32 // [Tokens, Hidden] input, set by the layer
	Idx   []int32   // [Tokens, TopK] global expert of each copy, set by the layer
	Probs []float32 // [Tokens, TopK] routing probability of each copy, set by the layer

	// Experts are the weights of the rank's own experts, set by the layer.
	Experts []ExpertWeights // [LocalExperts]

	ExpertX     []float32 // [N, Hidden] copies delivered to this rank, grouped by expert
	ExpertProbs []float32 // [N] their probabilities
	Segments    []Segment // which expert computes which rows of ExpertX
	ExpertY     []float32 // [N, Hidden] expert outputs, same rows as ExpertX; set by the layer

	Y []float32 // [Tokens, Hidden] sum of each token's k expert outputs (float32 sums)

	// FP8 dispatch (precision.go): Scales [Tokens, Hidden/128] is the
	// dequantization multiplier of each 1×128 block of X, whose values are
	// then e4m3 values (set by the layer); ExpertScales [N, Hidden/128]
	// are the delivered rows' (set by the dispatch, with ExpertX). Both
	// nil in a bf16 step.
	Scales, ExpertScales []float32

	// The backward (see backward.go). Set by the layer: DY, the gradient of
	// Y (bf16 values), and ExpertGrads, the fp32 weight gradients of the
	// rank's own experts (main_grad: zeroed each step, added to).
	DY          []float32       // [Tokens, Hidden]
	ExpertGrads []ExpertWeights // [LocalExperts] fc1 [2f, h], fc2 [h, f], fp32
	// ExpertDY is the gradient of ExpertY's rows, set by the combine's
	// backward; the layer's expert backward writes the gradients of
	// ExpertX's rows (bf16 values) and of ExpertProbs (fp32) into the same
	// rows of ExpertDX and ExpertDProbs.
	ExpertDY, ExpertDX []float32 // [N, Hidden]
	ExpertDProbs       []float32 // [N]
	// DX and DProbs are the gradients of X (through the dispatcher: each
	// token's copies summed, stored as bf16) and of Probs (fp32), set by the
	// last backward phase.
	DX     []float32 // [Tokens, Hidden]
	DProbs []float32 // [Tokens, TopK]
}

// ExpertWeights are one expert's weights: fc1 [2f, h] (gate rows, then up),
// fc2 [h, f].
type ExpertWeights struct {
	FC1, FC2 []float32
	// Q1, Q2 and S1, S2 are the same weights as the FP8 GEMM reads them,
	// set by the layer at --precision fp8 where it runs the FP8 GEMM (nil
	// otherwise): e4m3 codes [2f, h] and [h, f] and their 128×128
	// multipliers in BLK128x128_32F's order (FP8WeightScales floats).
	Q1, Q2 []uint8
	S1, S2 []float32
}

// Segment is a run of rows of Rank.ExpertX that one expert computes. Rows
// no segment covers are not computed on this rank (another rank computes
// them and the dispatcher returns the outputs).
type Segment struct {
	Expert     int // global expert
	Start, Len int // rows [Start, Start+Len)
	// Weights to use; nil means the rank's own copy (the expert must be local).
	Weights *ExpertWeights
	// Grads, in the backward, is where the segment's weight gradients are
	// added (fp32); nil means the rank's own ExpertGrads (the expert must be
	// local). A segment with Weights must have Grads.
	Grads *ExpertWeights
}

// Traffic is the bytes one step moves, with the formula that counts them.
// OffRank counts payload that crosses ranks; Logical includes copies a rank
// sends to itself.
type Traffic struct {
	DispatchOffRank, DispatchLogical int64
	CombineOffRank, CombineLogical   int64
	Formula                          string
	// DispatchAlgorithm and CombineAlgorithm are the bytes of the design's
	// own bandwidth convention ("algorithm bandwidth", DeepEP's: tokens
	// received × hidden × 2 B, a rank's tokens to itself included), all
	// ranks together; AlgorithmFormula says how they are counted. Zero
	// when the design states none.
	DispatchAlgorithm, CombineAlgorithm int64
	AlgorithmFormula                    string
	// DispatchInterDomain and CombineInterDomain are the part of the
	// off-rank bytes that crosses NVLink domains (a domain-aware design's
	// inter-domain path); zero for designs that do not tell domains apart
	// and for runs in one domain.
	DispatchInterDomain, CombineInterDomain int64
	// InterDomainAlgorithm is the inter-domain bytes of each direction in
	// the design's own convention (HybridEP's rdma_send_bytes), all ranks
	// together; zero when the design states none.
	InterDomainAlgorithm int64
	// The backward's bytes, when the last step ran one: the combine's
	// backward sends the output gradients the way the dispatch sent the
	// tokens, the dispatch's backward the input and probability gradients
	// the way the combine sent the outputs. BackwardFormula says how they
	// are counted.
	CombineBackwardOffRank, CombineBackwardLogical   int64
	DispatchBackwardOffRank, DispatchBackwardLogical int64
	BackwardFormula                                  string
}

// Buffer is one of a dispatcher's buffers on a rank, in the bytes a GPU
// holds it in (bf16 rows), and what it holds.
type Buffer struct {
	Name, About string
	Bytes       int64
}

// Design is the dispatcher contract (see the package comment), over the
// ranks R it binds to: Rank on the host device, DeviceRank on a cuda one.
type Design[R Rank | DeviceRank] interface {
	Name() string
	Impl() string
	// Bind attaches the dispatcher to the ranks of a run; called once. On
	// a device it may return an *UnavailableError (e.g. ranks whose
	// devices cannot reach each other's memory).
	Bind(shape Shape, ranks []*R) error
	// Forward is the steps of one forward pass in order, with experts
	// (the layer's expert computation of the ranks' current segments) in
	// the expert steps, named as ExpertPhases says.
	Forward(experts func(rank int) error) []Step
	// Backward is the backward's steps (backward.go), with experts (the
	// layer's expert backward) in the expert steps, named as
	// ExpertBackwardPhases says; nil when Capabilities().NoBackward says
	// why there is none.
	Backward(experts func(rank int) error) []Step
	// Traffic is what the last step moved.
	Traffic() Traffic
	// Footprint is the bytes of the dispatcher's own buffers on a rank.
	Footprint(rank int) int64
	// Capabilities is what else the design declares and does.
	Capabilities() Capabilities
	// Close frees its buffers (nothing to free on the host).
	Close() error
}

// Dispatcher is a design on the host device.
type Dispatcher = Design[Rank]

// DeviceDispatcher is a design on a cuda device (or device.Emu).
type DeviceDispatcher = Design[DeviceRank]

// Capabilities is what a design declares besides its steps: a reason
// where it lacks something, a func where the harness must call it (nil:
// the design does not do that). Device-only fields are nil on the host.
type Capabilities struct {
	// NoBackward says why Backward returns no steps; "" when it does.
	NoBackward string
	// FP8 says why the dispatcher cannot move fp8 rows for env ("" when
	// it can: e4m3 rows and their scales, as its design does); nil: it
	// has no fp8 path (New says so at --precision fp8).
	FP8 func(env Env) string
	// MXFP8 says why the dispatcher cannot move mxfp8 rows for env on the
	// host device ("" when it can: e4m3 rows and their E8M0 scales per 32
	// elements); nil: no MX path (New says so at --precision mxfp8). The
	// cuda device refuses mxfp8 before asking (MXFP8HostOnly).
	MXFP8 func(env Env) string
	// Rebalance is a design that moves work between ranks after the
	// dispatch (FEPLB's phase 2); nil for the others.
	Rebalance *Rebalance
	// Buffers describes the dispatcher's buffers on a rank (receive and
	// queue memory), sized for the last step.
	Buffers func(rank int) []Buffer

	// Grouped says which steps the design issues once per device, from
	// the call of the device's last rank, for all of its ranks (one
	// co-resident launch per GPU). The layer times such a step from start
	// events recorded on the device's ranks' streams before its first
	// rank's call to end events after its last rank's; other steps
	// between events around each rank's own call.
	Grouped func(phase string) bool
	// HostWait is a device design one of whose steps must first wait on
	// the host for the device (see HostWait).
	HostWait *HostWait
	// Graph is a device design whose steps may be issued as CUDA graphs
	// (--cuda-graph; see Graph). It has a HostWait.
	Graph *Graph
	// Check, called once every stream of a step is synchronized, returns
	// what went wrong in kernels that can fail without failing their
	// launch (an SM-driven design's cross-rank waits, which time out),
	// naming the rank, phase and wait (comm.CommError).
	Check func() error
	// Transport names the library the data moves through (NCCL) rather
	// than copies, once bound; "" when none.
	Transport func() string
	// LaunchBudgets are the blocks per rank, once bound, of launches
	// with SM budgets of their own beside --sms (hybridep's preprocessing
	// and permute).
	LaunchBudgets func() (preprocess, permute int)
	// Library is a library implementation's account of what ran.
	Library *Library
}

// Rebalance is how the harness drives a rebalancing design. Its dispatch
// leaves in Segments only the work that needs no rebalancing (FEPLB's
// static experts), which the layer starts at once; its "rebalance" step
// moves work and sets the segments of the second expert step ("dynamic").
type Rebalance struct {
	// Stats describes what the last step's rebalance did.
	Stats func() RebalanceStats
	// Pause(true) makes the following steps move nothing, so that each
	// rank computes what phase 1 delivered to it (the harness measures the
	// GEMM straggler before rebalancing with it); Pause(false) resumes.
	Pause func(paused bool)
}

// RebalanceStats is one step's rebalance.
type RebalanceStats struct {
	Policy         string
	TokensBefore   []int   // rows each rank's experts would compute after dispatch alone
	TokensAfter    []int   // rows each rank computes after the rebalance
	Moves          int     // (expert, helper) pairs
	CopyBytes      int64   // tokens and weights moved one way, plus outputs back
	CopySeconds    float64 // measured copy time: host, all copies' wall time; device, the slowest helper's incoming copies plus the slowest owner's copies back
	PlanSeconds    float64 // measured wall time of the scheduler
	PlanWait       float64 // seconds the rebalance waited for the scheduler (its exposed part)
	ModelledBefore float64 // modelled GEMM straggler before, seconds (max − mean)
	ModelledAfter  float64 // and after
	// Exposed is how long the copies held work up, in seconds: the
	// slowest rank's wait for its incoming copies once its static experts
	// were done (0 when they had landed) plus its wait, as an owner, for
	// its outputs to come back once its own work was done; NaN when not
	// measured. ExposedNote says how it was measured, or why not.
	Exposed     float64
	ExposedNote string
	// NoOp says why this configuration can move no work at all (then every
	// step is the base dispatcher's alone); empty when it can.
	NoOp       string
	CopyMethod string // what ran the copies
	Note       string
	// The backward's phase 2, when the step ran one: the bytes moved (the
	// output gradients out, the input and probability gradients back, the
	// weight gradients back), of them the weight gradients', and the
	// measured copy time (as CopySeconds).
	BackwardCopyBytes, WGradBytes int64
	BackwardCopySeconds           float64
}

// Env describes where a dispatcher would run, and its options.
type Env struct {
	Device string // "host" or "cuda"
	// Base is the dispatcher a two-phase dispatcher (feplb) runs phase 1 with.
	Base string
	// Domain is the ranks per NVLink domain; 0 means all ranks.
	Domain int
	// Dynamic is the dynamic experts per rank of feplb.
	Dynamic int
	// Policy is feplb's scheduler policy (balance.FEPLBPolicies); "" is
	// the paper's, feplb.
	Policy string
	// Hidden and FFN give the expert size, for dispatchers that model costs.
	Hidden, FFN int
	// SMs is the SM budget (thread blocks) of an SM-driven dispatcher's
	// transfer kernels; 0 means its default (see SMBudget).
	SMs int
	// PreprocessSMs and PermuteSMs are the blocks of hybridep's
	// preprocessing and permute launches, their own budgets (HybridEP's
	// num_sms_preprocessing_api and num_blocks_permute); 0: its defaults.
	PreprocessSMs, PermuteSMs int
	// CommTimeout bounds every cross-rank wait of moebench's own kernels
	// (device flags, queue heads and tails, counters the host polls);
	// 0 means DefaultCommTimeout.
	CommTimeout time.Duration
	// Precision is the dispatch precision (PrecisionBF16, "" too, or
	// PrecisionFP8, PrecisionMXFP8: see precision.go)
	Precision string
	// LibraryTimeout is a library implementation's own bound on its
	// waits for other ranks (NCCL EP's timeout_ns: --ncclep-timeout);
	// 0 means DefaultCommTimeout.
	LibraryTimeout time.Duration
	// NodeRanks, in a run that spans processes, is the EP ranks on this
	// process's node (its ranks times the processes the launcher puts on
	// the node); 0 in a run of one process, whose ranks are all on its node.
	NodeRanks int
}

// DefaultCommTimeout is how long a cross-rank wait may take before the
// dispatcher reports which rank, phase and wait timed out.
const DefaultCommTimeout = 5 * time.Second

// Factory builds a dispatcher for env, or returns an *UnavailableError.
type Factory func(impl string, env Env) (Dispatcher, error)

// UnavailableError says that a dispatcher or implementation cannot run in an
// environment, and why. It is an environment limitation, not a failure.
type UnavailableError struct {
	Name, Impl, Reason string
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("%s (%s): unavailable: %s", e.Name, e.Impl, e.Reason)
}

// IsUnavailable reports whether err says a dispatcher is unavailable.
func IsUnavailable(err error) bool {
	var u *UnavailableError
	return errors.As(err, &u)
}

// Implementations of a dispatcher design.
const (
	ImplNative  = "native"  // moebench's own kernels
	ImplLibrary = "library" // a real library found on the node
)

var registry = map[string]Factory{}

// Register adds a dispatcher by name; called from the dispatcher packages'
// init functions.
func Register(name string, f Factory) {
	if _, dup := registry[name]; dup {
		panic("dispatchers: " + name + " registered twice")
	}
	registry[name] = f
}

// Names lists the registered dispatchers, sorted.
func Names() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// New returns the named dispatcher for env. An unknown name or impl is an
// ordinary error; a known one that cannot run here is an *UnavailableError.
func New(name, impl string, env Env) (Dispatcher, error) {
	f, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("unknown dispatcher %q (known: %v)", name, Names())
	}
	if impl != ImplNative && impl != ImplLibrary {
		return nil, fmt.Errorf("unknown implementation %q (known: native, library)", impl)
	}
	if impl == ImplLibrary {
		if d, ok, err := libraryOnHost(name, env); ok {
			return d, err
		}
	}
	d, err := f(impl, env)
	if err != nil {
		return nil, err
	}
	return d, checkPrecision(name, impl, d.Capabilities(), env)
}

// Pending is the factory of a dispatcher whose design is registered but not
// yet built: it always reports the dispatcher unavailable. needs says what the
// design requires that the host device does not model.
func Pending(name, needs string) Factory {
	return func(impl string, env Env) (Dispatcher, error) {
		reason := "not implemented in this build yet"
		if env.Device == "host" {
			reason = "needs the cuda device (" + needs + "); the host device does not model it"
		}
		return nil, &UnavailableError{Name: name, Impl: impl, Reason: reason}
	}
}

// Step is one phase of a step: its name and what it does for one rank.
type Step struct {
	Name string
	Run  func(rank int) error
}

// Sequence is the forward of a design with Megatron's phases, with experts
// in its place: permute, dispatch, experts, combine, unpermute.
func Sequence(experts, permute, dispatch, combine, unpermute func(rank int) error) []Step {
	return []Step{{"permute", permute}, {"dispatch", dispatch}, {ExpertPhases[0], experts}, {"combine", combine}, {"unpermute", unpermute}}
}

// ExpertPhases are the names of the phases that run experts; a rank's
// expert-GEMM time is the sum of them.
var ExpertPhases = []string{"experts", "dynamic"}

// Runs are steps' runs by name, for a design that wraps another's steps
// (feplb its base's).
func Runs(steps []Step) map[string]func(rank int) error {
	m := make(map[string]func(rank int) error, len(steps))
	for _, s := range steps {
		m[s.Name] = s.Run
	}
	return m
}
