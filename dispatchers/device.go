package dispatchers

import (
	"fmt"

	"github.com/moebench/moebench/kernels/comm"
	"github.com/moebench/moebench/kernels/device"
)

// The device contract: Design's steps (DeviceDispatcher), on buffers of a
// device.Device; the phase before the
// first expert phase sets ExpertX, ExpertProbs and ExpertRows, the last
// phase writes Y (bf16) with Shared added. A phase queues its work on the
// rank's stream and returns; collective phases order themselves after
// other ranks' work with events.
//
// Threads: every rank's phases are called from its device's OS thread
// (DeviceRank.Threads), a device's ranks in rank order, all devices at
// once, and every device finishes a phase before any starts the next (the
// layer's barrier between phases): a phase may use what any rank's earlier
// phases set or recorded (buffers, events, host state), but not what
// another device's calls of the same phase do. A phase that must wait on
// the host for the device (alltoall's count exchange) is declared in Capabilities.HostWait;
// a wait inside a phase (DeepEP's notify waiting for its counts) waits for
// the device's own ranks only. Collective libraries (NCCL, NCCL EP) are
// called by every rank from its own thread in the same phase.
//
// The layer synchronizes every stream between steps, so a phase may assume
// that the previous step's work is done. Each rank's buffers, streams and
// events are on its own device (DeviceRank.Dev); work on another rank's
// buffers goes through copies between devices (device.CopyOp's devices)
// or a communicator (comm.Comm). A phase may queue work for all of its
// device's ranks from one rank's call (see Capabilities.Grouped).

// DeviceRank is one EP rank's buffers on the device. Tensors are row-major,
// bf16 unless noted.
type DeviceRank struct {
	ID      int
	Dev     device.Device   // the rank's device (ranks may share one)
	Stream  device.Stream   // a stream of Dev
	Threads *device.Threads // every device's issuing thread (Dev's among them): what collective setup in Bind runs on
	// Comm, in a run that spans processes, is the run's communicator over
	// every rank (set by the layer on every rank; nil in a run of one
	// process). There a rank of another process has no Dev: a dispatcher
	// allocates and issues nothing for it.
	Comm   comm.Comm
	X      device.Addr // [Tokens, Hidden] input, set by the layer
	Idx    device.Addr // [Tokens, TopK] int32 global experts, set by the layer
	Probs  device.Addr // [Tokens, TopK] fp32 routing probabilities, set by the layer
	Shared device.Addr // [Tokens, Hidden] shared-expert output the last phase adds; 0: none

	// Set by the phase before the experts (Dispatch of the classic phases):
	// the rows this rank's experts compute, grouped by local expert, and how
	// many rows each local expert has (read on the host).
	ExpertX     device.Addr // [N, Hidden]
	ExpertProbs device.Addr // [N] fp32
	ExpertRows  []int       // [LocalExperts]

	ExpertY device.Addr // [N, Hidden] expert outputs, set by the layer before Combine
	Y       device.Addr // [Tokens, Hidden] output, allocated by the layer, written by the last phase

	// FC1 and FC2 are the rank's own experts' weights, [L, 2f, h] and
	// [L, h, f], set by the layer.
	FC1, FC2 device.Addr
	// FP8 are the same experts' weights as the layer's FP8 GEMM reads them
	// (set by the layer at --precision fp8 where its expert GEMMs are
	// cuBLASLt's block-scaled FP8 GEMM; zero otherwise).
	FP8 FP8Weights

	// Work is what the next expert phase computes. Nil: every row of
	// ExpertX, grouped by local expert as ExpertRows says, into ExpertY. A
	// rebalancing design sets it in Dispatch (the static work) and in
	// Rebalance (the dynamic work); in the backward, the phase before each
	// expert backward phase sets it as backward.go says of Segments.
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
	DY, DFC1, DFC2                   device.Addr
	ExpertDY, ExpertDX, ExpertDProbs device.Addr
	DX, DProbs                       device.Addr
}

// DeviceWork is a block of rows an expert phase computes on a rank: rows of
// X [·, Hidden] with their probabilities Probs [·] fp32 into the same rows of
// Y, each segment with its expert's weights. Rows no segment covers are not
// written.
type DeviceWork struct {
	X, Probs, Y device.Addr // Probs 0: none (a combine applies them); Y 0: the rank's ExpertY
	Segments    []DeviceSegment
	// After, when not nil, is an event the rank's stream waits for before the
	// block (e.g. the arrival of copied rows and weights); Done, when not
	// nil, is recorded on it after the block (e.g. for the rows' owners to
	// take their outputs back).
	After, Done device.Event
	// In the backward: the rows' output gradients DY [·, Hidden] and where
	// their input and probability gradients go, DX [·, Hidden] and DProbs
	// [·] fp32; 0: the rank's ExpertDY, ExpertDX, ExpertDProbs.
	DY, DX, DProbs device.Addr
}

// DeviceSegment is rows [Start, Start+Len) of a block, computed by expert
// Expert with weights FC1 [2f, h] and FC2 [h, f]; 0 means the rank's own copy
// (the expert must be local).
type DeviceSegment struct {
	Expert, Start, Len int
	FC1, FC2           device.Addr
	// FP8, on the FP8 GEMM path, is where the expert's e4m3 weights and
	// their multipliers are when they are not the rank's own (one expert's:
	// Q1 [2f, h], Q2 [h, f], S1, S2 as FP8WeightScales says); zero means
	// the rank's own copy (the expert must be local).
	FP8 FP8Weights
	// DFC1, DFC2 are where the backward adds the segment's weight
	// gradients (fp32 [2f, h], [h, f]); 0 means the rank's own DFC1, DFC2
	// (the expert must be local).
	DFC1, DFC2 device.Addr
}

// Rows is N, the rows this rank's experts compute.
func (r *DeviceRank) Rows() int {
	n := 0
	for _, c := range r.ExpertRows {
		n += c
	}
	return n
}

// HoldGrads holds rank r's backward buffers where the design moves the
// gradients itself: its input and probability gradients (DX [T, h] bf16,
// DProbs [T, k] fp32) once, their bytes in *fixed, and its expert rows'
// output gradients (ExpertDY [r.Rows(), h] bf16) in rows, grown to the
// step's rows.
func (r *DeviceRank) HoldGrads(sh Shape, fixed *int64, rows *device.RowCapacity) error {
	T, k, h := int64(sh.Tokens), int64(sh.TopK), int64(sh.Hidden)
	if r.DX == 0 {
		held, err := device.Resize(r.Dev, 1, device.RowBuffer{P: &r.DX, PerRow: 2 * T * h}, device.RowBuffer{P: &r.DProbs, PerRow: 4 * T * k})
		if *fixed = held; err != nil {
			return err
		}
	}
	return rows.Ensure(r.Dev, r.Stream, r.Rows(), device.RowBuffer{P: &r.ExpertDY, PerRow: 2 * h})
}

// HostWait is a device design one of whose steps must first wait on the
// host for the device (alltoall's count exchange: the host needs every
// rank's counts to size the copies). Wait(phase, rank) does rank's wait,
// on its device's thread; the layer calls it for every rank, and waits for
// all of them, before it records the step's start events, so that each
// rank's step is timed from its own first GPU operation and may use what
// every rank's wait brought to the host; it reports the waits' wall time
// on its own. The step does not wait again. Before says before which steps
// it waits.
type HostWait struct {
	Before func(phase string) bool
	Wait   func(phase string, rank int) error
}

// Graph is how a device design's steps may be issued as CUDA graphs
// (--cuda-graph): the layer captures the steps between its host waits
// (HostWait.Before says where they are) and replays a capture while the
// segment's Key repeats — its GPU work depends on nothing else (for
// alltoall after the count exchange: every rank's counts; before it:
// nothing). A replayed segment's steps are not called: the dispatcher's
// host state after HostWait.Wait must not depend on them (alltoall's
// exchange runs at every wait). No says why a configuration cannot be, or
// "".
type Graph struct {
	Key func(phase string) string
	No  func() string
}

// Library is a library implementation's account: what ran (Info, after
// Bind) and how long each rank's library calls took on the host in the
// last step's phase (HostCallMS: their wall time, the library's internal
// synchronizations included; ok false for a phase without one).
type Library struct {
	Info       func() LibraryInfo
	HostCallMS func(phase string, rank int) (ms float64, ok bool)
}

// LibraryInfo is what a library implementation ran.
type LibraryInfo struct {
	Design        string // the design it carries, as the record labels it
	Name, Version string
	Path          string // the file loaded
	Detail        string // its mode, layout, options and what it runs over
	SMs           string // how it spends SMs: --sms's meaning, and the environment's overrides
}

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

// LibraryFactory builds a design's library implementation (a real library
// on the node that implements it, as NCCL EP does HybridEP's and DeepEP's
// low-latency designs) for env, or returns an *UnavailableError saying
// why it cannot run there (on the host device it never can).
type LibraryFactory func(env Env) (DeviceDispatcher, error)

var libraryRegistry = map[string]LibraryFactory{}

// RegisterLibrary makes f the library implementation (--impl library) of
// the registered dispatcher name, in place of what its own package
// provides for it.
func RegisterLibrary(name string, f LibraryFactory) {
	if _, dup := libraryRegistry[name]; dup {
		panic("dispatchers: a library implementation of " + name + " registered twice")
	}
	libraryRegistry[name] = f
}

// IsLibrary reports whether impl of the dispatcher name is a registered
// library implementation (RegisterLibrary: NCCL EP's modes), whose waits
// Env.LibraryTimeout bounds.
func IsLibrary(name, impl string) bool {
	_, ok := libraryRegistry[name]
	return ok && impl == ImplLibrary
}

// libraryOnHost is a library implementation's answer on the host device:
// unavailable, with its factory's reason.
func libraryOnHost(name string, env Env) (Dispatcher, bool, error) {
	f, ok := libraryRegistry[name]
	if !ok {
		return nil, false, nil
	}
	_, err := f(env)
	if err == nil {
		err = &UnavailableError{Name: name, Impl: ImplLibrary, Reason: "runs on the cuda device only"}
	}
	return nil, true, err
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
	if lib, ok := libraryRegistry[name]; ok && impl == ImplLibrary {
		d, err := lib(env)
		if err != nil {
			return nil, err
		}
		return d, checkPrecision(name, impl, d.Capabilities(), env)
	}
	f, ok := deviceRegistry[name]
	if !ok {
		return nil, &UnavailableError{Name: name, Impl: impl, Reason: "no " + env.Device + " device implementation in this build"}
	}
	d, err := f(impl, env)
	if err != nil {
		return nil, err
	}
	return d, checkPrecision(name, impl, d.Capabilities(), env)
}
