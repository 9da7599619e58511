// Package deepep is DeepEP's normal-mode intranode design (deepseek-ai/DeepEP,
// csrc/kernels/intranode.cu and layout.cu; moebench's own code): a layout
// that sends a token once to each rank holding any of its experts, a notify
// that exchanges the counts and gives the host the received-token count it
// waits for, an SM-driven dispatch through per-(channel, source) ring
// queues in the receiver's memory, Megatron's local permute into expert-major
// order, and a combine through the same kind of queues that sums each
// token's k outputs on the way home. The SM budget (--sms, default 20) is the
// blocks of dispatch and combine: half send and half receive, one pair per
// channel.
//
// The contract the GPU kernels (kernels/cuda/deepep.cu) must match bit for
// bit: the phases, the channels and queue protocol, the received order
// (by source rank, then token: alltoall's rows in alltoall's order after the
// permute) and the rounding points (each rank's partial sum of a token's
// outputs rounded to bf16, then summed at home in ascending rank order).
// docs/dispatchers/deepep.md states them in full, with what is faithful to
// DeepEP and what differs.
//
// On the host device the ranks run a phase one after another, each phase
// modelled from its receiver's side; a queue that could make no progress is
// an error naming the rank, phase, channel and queue. Device (device.go)
// runs the design with deepep.cu's kernels, its backward (devbackward.go)
// the same kernels over the forward's handle; the twins (twin.go) run this
// package's host code on Emu's device buffers.
package deepep

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
)

// Name is the dispatcher's registered name.
const Name = "deepep"

// DefaultSMs is DeepEP's default SM budget (Buffer.num_sms; Megatron's
// --moe-deepep-num-sms default).
const DefaultSMs = 20

func init() {
	dispatchers.Register(Name, New)
	dispatchers.RegisterDevice(Name, NewDevice)
	dispatchers.RegisterSMBudget(Name, dispatchers.SMBudget{Default: DefaultSMs, Even: true,
		About: "DeepEP pairs a sending and a receiving block per channel"})
}

// Queue sizes one direction's queues (DeepEP's NVL chunk settings).
type Queue struct {
	Chunk int // tokens a sender pushes before it publishes the tail
	Ring  int // slots of each (channel, peer) ring
}

// Config is the design's settings on EP ranks.
type Config struct {
	SMs               int // blocks of dispatch and combine; channels = SMs/2
	Dispatch, Combine Queue
	// The device's dispatch and combine blocks (not the host's): Warps
	// per block, a multiple of the ranks (each peer is served by
	// Warps/EP of them), and MinBlocks, the blocks one SM must hold
	// (the kernels' register bound), so that ranks packed on one GPU
	// (emulated EP) can be resident together.
	Warps, MinBlocks int
}

// Channels is C, the channels of a step.
func (c Config) Channels() int { return c.SMs / 2 }

// DefaultWarps is the warps of a device dispatch or combine block: 512
// threads (DeepEP's are 768), each block holding one SM as DeepEP's do (the
// launch asks for more than half an SM's shared memory), so that --sms
// counts SMs held; 16 warps keep 64 registers a thread for 8 loads in
// flight a lane (kernels/comm/inflight.json).
const DefaultWarps = 16

// DefaultConfig is DeepEP's recommended intranode configuration for ep
// ranks (buffer.py's get_dispatch_config and get_combine_config) with an SM
// budget of sms (0: DefaultSMs).
func DefaultConfig(ep, sms int) Config {
	if sms == 0 {
		sms = DefaultSMs
	}
	c := Config{SMs: sms, Dispatch: Queue{Chunk: 6, Ring: 256}, Combine: Queue{Chunk: 4, Ring: 256}, Warps: DefaultWarps, MinBlocks: 2}
	switch ep {
	case 2:
		c.Dispatch.Chunk, c.Combine.Chunk = 24, 10
	case 4:
		c.Combine.Chunk = 9
	}
	return c
}

// check says what is wrong with c for ep ranks: DeepEP's intranode limits.
func (c Config) check(ep int) error {
	switch {
	case ep != 2 && ep != 4 && ep != 8:
		return fmt.Errorf("DeepEP's intranode mode runs 2, 4 or 8 ranks (the GPUs of one NVLink node), not EP %d; larger EP is its internode mode (NVSHMEM), which moebench does not model", ep)
	case c.SMs < 2 || c.SMs%2 != 0 || c.SMs > dispatchers.MaxSMBudget:
		return fmt.Errorf("SM budget %d: must be even, in [2, %d]", c.SMs, dispatchers.MaxSMBudget)
	}
	for _, q := range []struct {
		name string
		Queue
	}{{"dispatch", c.Dispatch}, {"combine", c.Combine}} {
		if q.Chunk < 1 || q.Chunk >= q.Ring {
			return fmt.Errorf("%s queue: chunk %d and ring %d: want 1 ≤ chunk < ring (as DeepEP's Config asserts)", q.name, q.Chunk, q.Ring)
		}
	}
	return nil
}

// NoLibrary is why --impl library is unavailable.
const NoLibrary = "no library of DeepEP's normal mode is reachable from Go: DeepEP is a PyTorch extension, " +
	"and no C API carries its normal-mode kernels; NCCL EP's low-latency mode, which carries DeepEP's low-latency design " +
	"(a different algorithm), is deepep-ll --impl library"

// New returns the host implementation (the design in Go, labelled host).
func New(impl string, env dispatchers.Env) (dispatchers.Dispatcher, error) {
	if impl != dispatchers.ImplNative {
		return nil, &dispatchers.UnavailableError{Name: Name, Impl: impl,
			Reason: NoLibrary}
	}
	if env.Device != "host" {
		return nil, &dispatchers.UnavailableError{Name: Name, Impl: impl,
			Reason: fmt.Sprintf("device %q is not supported by the host implementation", env.Device)}
	}
	// env.CommTimeout is for the GPU kernels' waits: the host model has none
	// (a queue that cannot progress is reported at once).
	return &Host{sms: env.SMs}, nil
}
