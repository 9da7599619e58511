package dispatchers

import (
	"fmt"

	"github.com/moebench/moebench/kernels"
)

// The device contract: phases declared as Dispatcher's are (Phaser, or the
// classic Phased), on buffers of a kernels.Device; the phase before the
// first expert phase sets ExpertX, ExpertProbs and ExpertRows, the last
// phase writes Y (bf16) with Shared added. A phase queues its work on the
// rank's stream and returns (a phase that must wait on the host, as
// DeepEP's notify for its received-token count, is Grouped, so that every
// rank's work is queued before the wait); collective phases order
// themselves after other ranks' work with events.
// The layer synchronizes every stream between steps, so a phase may assume
// that the previous step's work is done. Each rank's buffers, streams and
// events are on its own device (DeviceRank.Dev); work on another rank's
// buffers goes through copies between devices (kernels.CopyOp's devices)
// or a communicator (kernels.Comm). A collective phase may queue work on
// every rank's stream from one rank's call (see Grouper).

// DeviceRank is one EP rank's buffers on the device. Tensors are row-major,
// bf16 unless noted.
type DeviceRank struct {
	ID     int
	Dev    kernels.Device // the rank's device (ranks may share one)
	Stream kernels.Stream // a stream of Dev
	X      kernels.Ptr    // [Tokens, Hidden] input, set by the layer
	Idx    kernels.Ptr    // [Tokens, TopK] int32 global experts, set by the layer
	Probs  kernels.Ptr    // [Tokens, TopK] fp32 routing probabilities, set by the layer
	Shared kernels.Ptr    // [Tokens, Hidden] shared-expert output the last phase adds; 0: none

	// Set by the phase before the experts (Dispatch of the classic phases):
	// the rows this rank's experts compute, grouped by local expert, and how
	// many rows each local expert has (read on the host).
	ExpertX     kernels.Ptr // [N, Hidden]
	ExpertProbs kernels.Ptr // [N] fp32
	ExpertRows  []int       // [LocalExperts]

	ExpertY kernels.Ptr // [N, Hidden] expert outputs, set by the layer before Combine
	Y       kernels.Ptr // [Tokens, Hidden] output, allocated by the layer, written by the last phase

	// FC1 and FC2 are the rank's own experts' weights, [L, 2f, h] and
	// [L, h, f], set by the layer.
	FC1, FC2 kernels.Ptr

	// Work is what the next expert phase computes. Nil: every row of
	// ExpertX, grouped by local expert as ExpertRows says, into ExpertY. A
	// Rebalancer sets it in Dispatch (the static work) and in Rebalance (the
	// dynamic work); in the backward, the phase before each expert backward
	// phase sets it as backward.go says of Segments.
	Work []DeviceWork

	// The backward (backward.go's contract, on device buffers; alltoall's
	// and feplb's device implementations have it). Set by the layer: DY
	// [Tokens, Hidden], the output's gradient, and DFC1, DFC2 [L, 2f, h]
	// and [L, h, f] fp32, the own experts' weight gradients (main_grad,
	// zeroed each step, added to). ExpertDY [N, Hidden] is set by the
	// combine's backward; the layer writes ExpertDX [N, Hidden] and
	// ExpertDProbs [N] fp32 (their rows as ExpertX's); DX [Tokens, Hidden]
	// and DProbs [Tokens, TopK] fp32 are written by the last backward
	// phase. The layer allocates DY, DFC1, DFC2, ExpertDX and ExpertDProbs,
	// the dispatcher ExpertDY, DX and DProbs (as it does ExpertX).
	DY, DFC1, DFC2                   kernels.Ptr
	ExpertDY, ExpertDX, ExpertDProbs kernels.Ptr
	DX, DProbs                       kernels.Ptr
}

// DeviceWork is a block of rows an expert phase computes on a rank: rows of
// X [·, Hidden] with their probabilities Probs [·] fp32 into the same rows of
// Y, each segment with its expert's weights. Rows no segment covers are not
// written.
type DeviceWork struct {
	X, Probs, Y kernels.Ptr // Y 0: the rank's ExpertY
	Segments    []DeviceSegment
	// After, when not nil, is an event the rank's stream waits for before the
	// block (e.g. the arrival of copied rows and weights); Done, when not
	// nil, is recorded on it after the block (e.g. for the rows' owners to
	// take their outputs back).
	After, Done kernels.Event
	// In the backward: the rows' output gradients DY [·, Hidden] and where
	// their input and probability gradients go, DX [·, Hidden] and DProbs
	// [·] fp32; 0: the rank's ExpertDY, ExpertDX, ExpertDProbs.
	DY, DX, DProbs kernels.Ptr
}

// DeviceSegment is rows [Start, Start+Len) of a block, computed by expert
// Expert with weights FC1 [2f, h] and FC2 [h, f]; 0 means the rank's own copy
// (the expert must be local).
type DeviceSegment struct {
	Expert, Start, Len int
	FC1, FC2           kernels.Ptr
	// DFC1, DFC2 are where the backward adds the segment's weight
	// gradients (fp32 [2f, h], [h, f]); 0 means the rank's own DFC1, DFC2
	// (the expert must be local).
	DFC1, DFC2 kernels.Ptr
}

// Rows is N, the rows this rank's experts compute.
func (r *DeviceRank) Rows() int {
	n := 0
	for _, c := range r.ExpertRows {
		n += c
	}
	return n
}

// DeviceDispatcher moves token copies between EP ranks on a device. It is
// also a Phaser or Phased (NewDevice checks).
type DeviceDispatcher interface {
	Name() string
	Impl() string
	// Bind attaches the dispatcher to the ranks of a run, each on its
	// device; called once. It may return an *UnavailableError (e.g. ranks
	// whose devices cannot reach each other's memory).
	Bind(shape Shape, ranks []*DeviceRank) error
	Traffic() Traffic
	Footprint(rank int) int64 // bytes of its own device buffers on a rank
	Close() error             // frees its buffers
}

// ClassicDevice is a device dispatcher with the classic phases.
type ClassicDevice interface {
	DeviceDispatcher
	Phased
}

// Grouper is a device dispatcher that issues some phases as one group from
// the last rank's call (an NCCL group: one thread drives every GPU), queuing
// work on every rank's stream; Grouped says which (by phase name). The
// layer times such a phase from start events recorded on every rank's
// stream before its first call to end events after its last; other phases
// between events around each rank's own call.
type Grouper interface{ Grouped(phase string) bool }

// HostWaiter is a device dispatcher one of whose phases must first wait on
// the host for the device (alltoall's count exchange: the host needs every
// rank's counts to size the copies). HostWait(phase) does that wait for
// every rank; the layer calls it before it records the phase's start
// events, so that each rank's phase is timed from its own first GPU
// operation, and reports the wait's wall time on its own. The phase does
// not wait again.
type HostWaiter interface{ HostWait(phase string) error }

// Graphable is a device dispatcher whose steps may be issued as CUDA
// graphs (--cuda-graph): the layer captures the phases between its host
// waits (WaitsBefore says where they are) and replays a capture while the
// segment's GraphKey repeats — its GPU work depends on nothing else (for
// alltoall after the count exchange: every rank's counts; before it:
// nothing). A replayed segment's phases are not called: the dispatcher's
// host state after HostWait must not depend on them (alltoall's exchange
// runs at every HostWait). NoGraph says why a configuration cannot be, or "".
type Graphable interface {
	HostWaiter
	WaitsBefore(phase string) bool
	GraphKey(phase string) string
	NoGraph() string
}

// Checker is a device dispatcher whose kernels can fail without failing
// their launch (an SM-driven design's cross-rank waits, which time out):
// CheckStep, called once every stream of a step is synchronized, returns
// what went wrong, naming the rank, phase and wait (kernels.CommError).
type Checker interface{ CheckStep() error }

// Transporter is a device dispatcher whose data may move through a
// library (NCCL) rather than copies: Transport names it, or is "".
type Transporter interface{ Transport() string }

// DeviceFactory builds a device dispatcher, or returns an *UnavailableError.
type DeviceFactory func(impl string, env Env) (DeviceDispatcher, error)

var deviceRegistry = map[string]DeviceFactory{}

// RegisterDevice adds a dispatcher's device implementation by name.
func RegisterDevice(name string, f DeviceFactory) {
	if _, dup := deviceRegistry[name]; dup {
		panic("dispatchers: " + name + " registered twice for the device")
	}
	deviceRegistry[name] = f
}

// NewDevice returns the named dispatcher's device implementation. A name
// with no device implementation in this build is unavailable.
func NewDevice(name, impl string, env Env) (DeviceDispatcher, error) {
	if _, ok := registry[name]; !ok {
		return nil, fmt.Errorf("unknown dispatcher %q (known: %v)", name, Names())
	}
	if impl != ImplNative && impl != ImplLibrary {
		return nil, fmt.Errorf("unknown implementation %q (known: native, library)", impl)
	}
	f, ok := deviceRegistry[name]
	if !ok {
		return nil, &UnavailableError{Name: name, Impl: impl, Reason: "no " + env.Device + " device implementation in this build"}
	}
	d, err := f(impl, env)
	if err != nil {
		return nil, err
	}
	return d, declaresPhases(name, d)
}

// NewClassicDevice is NewDevice for a dispatcher that must have the classic
// phases (a two-phase dispatcher's base).
func NewClassicDevice(name, impl string, env Env) (ClassicDevice, error) {
	d, err := NewDevice(name, impl, env)
	return asClassic[ClassicDevice](name, impl, d, err)
}
