// Package dispatchers defines the contract between the MoE layer and a token
// dispatcher (the piece moebench measures), and the registry that maps a
// dispatcher name and implementation to a constructor or to the reason it is
// unavailable.
//
// A dispatcher declares the phases of a step, each called once per EP rank;
// every rank finishes a phase before any rank starts the next. Its phases
// surround one or more expert phases, which the layer runs: "experts"
// computes each rank's segments (rows of Rank.ExpertX into the same rows of
// Rank.ExpertY). A design with its own phases implements Phaser; the
// classic designs implement the four methods of Phased, which Sequence
// orders:
//
//	Permute   local: order the rank's token copies for sending
//	Dispatch  collective: deliver each copy to the rank owning its expert,
//	          grouped by expert (fills Rank.ExpertX, ExpertProbs, Segments)
//	          — the layer then runs each segment's expert ("experts") and
//	          fills those rows of Rank.ExpertY —
//	Rebalance optional (Rebalancer): move work between ranks; it sets the
//	          segments of a second expert phase ("dynamic")
//	Combine   collective: return each expert output to its token's home rank
//	Unpermute local: Rank.Y[t] = sum of token t's k expert outputs
//
// Whatever the phases, the one before the first expert phase leaves
// ExpertX, ExpertProbs and Segments set, and the last phase leaves Rank.Y
// holding each token's sum of its k expert outputs (float32 sums; the layer
// then stores it as bf16 and adds the shared expert). DeepEP, for example,
// declares layout, notify, dispatch, permute, experts and combine, its
// combine summing the k outputs on the way home.
//
// The backward (backward.go) declares its phases the same way, in the
// reverse order, each the dual of a forward phase.
//
// Collective phases may read or write other ranks' state; that is how the
// ranks, which are independent objects, exchange data. An expert phase
// writes only the rows its segments cover and leaves the other rows of
// ExpertY as they are.
//
// The layer and its phases: docs/concepts.md; the design: docs/design.md.
package dispatchers

import (
	"errors"
	"fmt"
	"sort"
	"strings"
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

// Buffered is a dispatcher that describes its buffers (e.g. receive and
// queue memory), sized for the last step.
type Buffered interface{ Buffers(rank int) []Buffer }

// Dispatcher moves token copies between EP ranks. It is also a Phaser or
// Phased (New checks): see the package comment for the phase contract.
type Dispatcher interface {
	Name() string
	Impl() string
	// Bind attaches the dispatcher to the ranks of a run; called once.
	Bind(shape Shape, ranks []*Rank) error
	// Traffic is what the last step moved.
	Traffic() Traffic
	// Footprint is the bytes of the dispatcher's own buffers on a rank.
	Footprint(rank int) int64
}

// Classic is a host dispatcher with the classic phases (what a two-phase
// dispatcher such as feplb runs its phase 1 with and wraps).
type Classic interface {
	Dispatcher
	Phased
}

// Rebalancer is a dispatcher that moves work between ranks after dispatch
// (FEPLB's phase 2). Its Dispatch leaves in Segments only the work that
// needs no rebalancing (FEPLB's static experts), which the layer starts at
// once; Rebalance, called for every rank after that, moves work and sets the
// segments of the second expert phase.
type Rebalancer interface {
	Rebalance(rank int) error
	// RebalanceStats describes what the last step's rebalance did.
	RebalanceStats() RebalanceStats
	// Pause(true) makes the following steps move nothing, so that each
	// rank computes what phase 1 delivered to it (the harness measures the
	// GEMM straggler before rebalancing with it); Pause(false) resumes.
	Pause(paused bool)
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
	// PrecisionFP8: see precision.go)
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

// LaunchBudgets is a device dispatcher with launches of their own SM
// budgets beside its --sms (hybridep's preprocessing and permute): their
// blocks per rank as it runs them, once bound.
type LaunchBudgets interface {
	LaunchBudgets() (preprocess, permute int)
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
	if err := declaresPhases(name, d); err != nil {
		return d, err
	}
	return d, checkPrecision(name, impl, d, env)
}

// NewClassic is New for a dispatcher that must have the classic phases (a
// two-phase dispatcher's base); one that declares its own is unavailable.
func NewClassic(name, impl string, env Env) (Classic, error) {
	d, err := New(name, impl, env)
	return asClassic[Classic](name, impl, d, err)
}

// asClassic is d as the classic interface C, or why it is not one.
func asClassic[C any](name, impl string, d any, err error) (C, error) {
	var zero C
	if err != nil {
		return zero, err
	}
	c, ok := d.(C)
	if !ok {
		return zero, notClassic(name, impl, d)
	}
	return c, nil
}

// declaresPhases checks that d is a Phaser or Phased.
func declaresPhases(name string, d any) error {
	_, own := d.(Phaser)
	_, classic := d.(Phased)
	if !own && !classic {
		return fmt.Errorf("dispatcher %q declares no phases (neither Phases nor Permute/Dispatch/Combine/Unpermute)", name)
	}
	return nil
}

// notClassic says why a dispatcher with its own phases cannot be a base.
func notClassic(name, impl string, d any) error {
	var phases []string
	for _, s := range Steps(d, nil) {
		phases = append(phases, s.Name)
	}
	return &UnavailableError{Name: name, Impl: impl, Reason: fmt.Sprintf(
		"it cannot be the base of a two-phase dispatcher: its phases are its own (%s), not permute, dispatch, combine and unpermute", strings.Join(phases, ", "))}
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

// Phaser is a dispatcher, host or device, that declares its own phases: the
// steps of one forward pass in order, with experts (the layer's expert
// computation of the ranks' current segments) in their place, named as
// ExpertPhases says.
type Phaser interface {
	Phases(experts func(rank int) error) []Step
}

// Steps are d's phases with experts in their place: its own (Phaser), else
// the classic Sequence. d must be one or the other (New checks).
func Steps(d any, experts func(rank int) error) []Step {
	if p, ok := d.(Phaser); ok {
		return p.Phases(experts)
	}
	if p, ok := d.(Phased); ok {
		return Sequence(p, experts)
	}
	panic(fmt.Sprintf("dispatchers: %T declares no phases", d))
}

// Phased is what Sequence needs of a dispatcher, host or device: the
// classic phases.
type Phased interface {
	Permute(rank int) error
	Dispatch(rank int) error
	Combine(rank int) error
	Unpermute(rank int) error
}

// Sequence is the order of d's phases with experts (the layer's expert
// computation of the rank's current segments) in its place: permute,
// dispatch, experts, then for Rebalancers rebalance and experts again
// ("dynamic"), combine, unpermute. Each phase runs for every rank before the
// next.
func Sequence(d Phased, experts func(rank int) error) []Step {
	s := []Step{{"permute", d.Permute}, {"dispatch", d.Dispatch}, {ExpertPhases[0], experts}}
	if rb, ok := d.(Rebalancer); ok {
		s = append(s, Step{"rebalance", rb.Rebalance}, Step{ExpertPhases[1], experts})
	}
	return append(s, Step{"combine", d.Combine}, Step{"unpermute", d.Unpermute})
}

// ExpertPhases are the names of the phases that run experts; a rank's
// expert-GEMM time is the sum of them.
var ExpertPhases = []string{"experts", "dynamic"}
