package comm

import (
	"fmt"

	"github.com/moebench/moebench/kernels/device"
)

// The proof of the SM-driven machinery (kernels/cuda/commtest.cu): ring
// channels between ranks in the receiver's memory, a host-polled counter
// and a flag barrier. Its tests run it on the host simulation across fake
// GPUs and break its protocol on purpose; scripts/gpu-check.sh runs it on a
// GPU. It has no Go twin: Emu refuses it ("has no twin"), since a twin
// would only test itself.

// CommTestBlock is comm_test's block size (MB_CT_THREADS).
const CommTestBlock = 128

// Comm test bugs (its bug argument).
const (
	CommTestNoBug      = 0
	CommTestNoTail     = 1 // the senders never publish their tail
	CommTestNoBarrier  = 2 // the last rank never reaches the barrier
	commTestRingHeader = 32
)

// CommTestProgram is comm_test with channels channels per rank and rings of
// slots ints.
func CommTestProgram(channels, slots int) *device.Program {
	return &device.Program{File: "commtest.cu", Kernel: "comm_test", Block: CommTestBlock,
		Defs: map[string]string{"MB_CT_CHANNELS": fmt.Sprint(channels), "MB_CT_SLOTS": fmt.Sprint(slots)}}
}

// CommTestNames names comm_test's phases and waits (Signals.Names).
var CommTestNames = PhaseNames(map[int]string{1: "send", 2: "recv", 3: "barrier"}, map[int]string{1: "head", 2: "tail"}, "flag")

// PhaseNames is a Signals.Names from a kernel's tables of phases and waits:
// a wait at 16 + r is the barrier flag of rank r (named flag, "of rank r"),
// and a number in neither table is printed as it is.
func PhaseNames(phases, waits map[int]string, flag string) func(phase, wait int) (string, string) {
	return func(phase, wait int) (string, string) {
		p, w := phases[phase], waits[wait]
		if wait >= 16 {
			w = fmt.Sprintf("%s of rank %d", flag, wait-16)
		}
		if p == "" {
			p = fmt.Sprint(phase)
		}
		if w == "" {
			w = fmt.Sprint(wait)
		}
		return p, w
	}
}
