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
// # Phases
//
//	layout    local: for each token t, the ranks d holding any of its experts
//	          (inRank[t][d]: a token with several experts on d goes to d
//	          once), the tokens sent to each rank and the copies to each expert
//	notify    every rank's counts land in each peer's buffer; the receiver
//	          sums them into prefix matrices and knows how many tokens it will
//	          receive and how many copies each local expert gets: the counts
//	          the host waits for (DeepEP's one CPU sync) to size the outputs
//	dispatch  through the queues (below) into the receive buffer: each
//	          received token's row, its index at its source, and its k expert
//	          indices (local index, or −1 for experts on other ranks) and
//	          probabilities (0 for those)
//	permute   local (Megatron's flex dispatcher after DeepEP): the received
//	          tokens' copies into expert-major rows for the grouped GEMM
//	experts   the layer's, with the probability applied after SwiGLU
//	combine   through the queues back to the home rank, which sums
//
// # Channels, queues and the received order (the GPU kernels must match it)
//
// With C = SMs/2 channels, channel c of a source holds its tokens
// [c·⌈T/C⌉, min((c+1)·⌈T/C⌉, T)). Queue (c, s) lives in receiver r's buffer:
// a ring of Ring slots, each a bf16 row plus what travels with it, with a
// tail the sender s advances and a head the receiver advances (token
// counts since the step began; slot = count mod Ring). The sender walks its
// channel's tokens in order, skipping those not for r, and pushes up to
// Chunk tokens per round once the ring has Chunk free slots, then publishes
// the tail; the receiver copies [head, tail) out and publishes the head.
// send_head[t][r] records the tail position at which token t entered queue
// (its channel, r), −1 if it did not.
//
// Rank r's receive buffer holds its tokens sorted by (source rank, token
// index): source s's tokens start at the sum of the counts of the sources
// before s (rank_prefix_matrix), channel c's at the count of s's earlier
// channels (channel_prefix_matrix), and each queue delivers in token order.
// Its k indices keep the token's top-k slot order. The permute then gives
// expert-major rows: local expert 0's copies first, each expert's in
// received order — which is alltoall's order (expert, source, token), so the
// expert GEMMs see the same rows as alltoall's.
//
// Combine uses the same channels: expert rank d sends, in queue (c, d) of
// the home rank s, the tokens it received from s through channel c, in the
// order it received them, so the row of token t lands at stream position
// send_head[t][d]. For each received token, d first sums its local
// experts' outputs in ascending expert order in float32 and rounds the
// partial sum to bf16 (DeepEP's combine carries bf16; Megatron's separate
// local unpermute is fused into the send). The home rank reads, for token t
// and each rank d holding it in ascending rank order, the row at
// send_head[t][d] mod Ring, checks that it is token t's, and adds it to a
// float32 sum starting at 0; it advances each head past the token. The sum
// is the layer output (stored as bf16, then the shared expert is added).
//
// # Rounding, against alltoall
//
// Expert rows and outputs equal alltoall's bit for bit. Alltoall adds a
// token's k outputs in ascending expert order in float32; deepep adds the
// same outputs in the same order but rounds each rank's partial sum to bf16
// first. Where no token has two experts on one rank (top-1, or one expert
// per rank) the outputs are equal bit for bit; otherwise each partial sum of
// several outputs is rounded once more, within the layer tolerance.
//
// # On the host device
//
// The ranks are objects in one process and run a phase one after another,
// so each phase is modelled from its receiver's side: rank r's dispatch
// runs the rounds of every sender into r's queues (interleaved with r's
// drains), and r's combine the rounds of every expert rank into r's. One
// ring's storage per peer is reused channel after channel (the queues of a
// channel are used together in combine); the memory the record gives is
// what the design holds on a GPU. A queue that could make no progress is
// an error naming the rank, phase, channel and queue.
//
// # On the cuda device
//
// Device (device.go) runs the design with kernels/cuda/deepep.cu's kernels:
// the same channels, queue protocol, received order and rounding points, so
// that its outputs are the host design's bit for bit (tested on the host
// simulation); its backward (devbackward.go) runs the same kernels over the
// forward's handle and gives the host backward's gradients bit for bit. Its twins (twin.go), kernels.Emu's form of the kernels, run
// this package's host code on the device buffers.
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
// flight a lane (kernels/inflight.json).
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
