package kernels

import (
	"encoding/binary"
	"fmt"

	"github.com/moebench/moebench/internal/cuda"
)

// The proof of the SM-driven machinery (kernels/cuda/commtest.cu): ring
// channels between ranks in the receiver's memory, a host-polled counter
// and a flag barrier, with a Go twin for Emu. Its tests run it on the host
// simulation across fake GPUs and on Emu, and break its protocol on
// purpose; scripts/gpu-check.sh runs it on a GPU.

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
func CommTestProgram(channels, slots int) *Program {
	return &Program{File: "commtest.cu", Kernel: "comm_test", Block: CommTestBlock,
		Defs: map[string]string{"MB_CT_CHANNELS": fmt.Sprint(channels), "MB_CT_SLOTS": fmt.Sprint(slots)},
		Twin: func(parts []TwinPart) error { return commTestTwin(parts, channels) }}
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

// commTestTwin: each rank's channels' items land in the next rank's
// output and counters; with a bug, the ranks record what the kernel's
// waits would (the receivers' tails; every rank but the last at the last
// rank's flag).
func commTestTwin(parts []TwinPart, channels int) error {
	for _, t := range parts {
		if len(t.Args) != 10 {
			return fmt.Errorf("comm_test: %d arguments", len(t.Args))
		}
		comm, _ := t.Args[0].(cuda.Bytes)
		first, ranks, items, bug, epoch := t.Args[1].(int32), int(t.Args[2].(int32)), int(t.Args[3].(int32)), t.Args[4].(int32), t.Args[5].(int32)
		src, err := t.Ptrs(t.Args[7].(Ptr), ranks)
		if err != nil {
			return err
		}
		dst, err := t.Ptrs(t.Args[8].(Ptr), ranks)
		if err != nil {
			return err
		}
		sig := Ptr(binary.LittleEndian.Uint64(comm))
		for l := range t.Grid / (2 * channels) {
			rank := int(first) + l
			to := (rank + 1) % ranks
			switch {
			case bug == CommTestNoTail:
				if err := TwinGiveUp(t, comm, to, true, 2, 2, 0, 1); err != nil {
					return err
				}
				continue
			case bug == CommTestNoBarrier && rank != ranks-1:
				if err := TwinGiveUp(t, comm, rank, true, 3, 16+ranks-1, int64(epoch-1), int64(epoch)); err != nil {
					return err
				}
			}
			n := int64(4 * channels * items)
			in, err := t.Read(src[rank], n)
			if err != nil {
				return err
			}
			out, err := t.Write(dst[to], n)
			if err != nil {
				return err
			}
			copy(out, in)
			counters, err := t.Signal(sig+Ptr(sigHeader+errorRecord*ranks+4*to*channels), int64(4*channels))
			if err != nil {
				return err
			}
			for ch := range channels {
				binary.LittleEndian.PutUint32(counters[4*ch:], uint32(items))
			}
		}
	}
	return nil
}
