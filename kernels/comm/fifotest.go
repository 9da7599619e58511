package comm

import (
	"fmt"

	"github.com/moebench/moebench/kernels/device"
)

// The proof of moebench.cuh's shared-memory FIFO (kernels/cuda/fifotest.cu):
// rows moved from global memory through a ring of slots guarded by
// mbarriers — bulk copies on the bulk path, 16-byte accesses otherwise —
// with its protocol broken on purpose by the tests (fifotest_test.go):
// on the host simulation the bulk-copy stand-in (internal/hostsim/mbhost.h)
// and the kernels' timed waits turn each bug into a failure.

// FIFO test bugs (fifo_test's bug argument).
const (
	FIFONoBug       = 0
	FIFONoArrive    = 1 // the producer never arrives for item 3
	FIFOShortExpect = 2 // it expects 16 bytes fewer than it copies (bulk path)
	FIFOLongExpect  = 3 // 16 more
	FIFONoEmptyWait = 4 // it refills slots without waiting for their release
	FIFONoFullWait  = 5 // the consumers read slots without waiting for them
)

// FIFOBytes is the dynamic shared memory of a FIFO of stages slots of slot
// bytes (moebench.cuh's mb_fifo_at): 16 bytes of barriers per stage, then
// the slots.
func FIFOBytes(stages, slot int) int { return 16*stages + stages*slot }

// FIFOTestProgram is fifo_test for rows of hidden bf16 through stages
// slots, with warps warps per block (one producer); bulk = false selects
// the 16-byte path (MB_NO_BULK) where the bulk path would be compiled.
func FIFOTestProgram(hidden, stages, warps int, bulk bool) *device.Program {
	noBulk := "0"
	if !bulk {
		noBulk = "1"
	}
	return &device.Program{File: "fifotest.cu", Kernel: "fifo_test", Block: 32 * warps, Shared: FIFOBytes(stages, 2*hidden),
		Defs: map[string]string{"MB_FT_HIDDEN": fmt.Sprint(hidden), "MB_FT_STAGES": fmt.Sprint(stages),
			"MB_FT_WARPS": fmt.Sprint(warps), "MB_NO_BULK": noBulk}}
}

// FIFOTestNames names fifo_test's phases and waits (Signals.Names).
func FIFOTestNames(phase, wait int) (string, string) {
	return map[int]string{1: "put", 2: "get"}[phase], map[int]string{1: "empty", 2: "full"}[wait]
}
