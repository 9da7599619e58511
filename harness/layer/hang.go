package layer

// No hang inside a process: every call on the devices' threads (a step's
// phase, NCCL's communicator setup, a library's group creation) has a
// limit, past which the run stops naming the GPUs whose thread has not
// returned and what they were doing — a rank blocked in a collective for
// one that failed before joining it would otherwise wait for ever.

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels/device"
)

// firstStepWait bounds a call before the first step has run: the setup
// (NCCL's communicator, a library's buffers) and the first step, in which
// every GPU's kernels are compiled (NVRTC, or the tests' C++ compiler).
const firstStepWait = 10 * time.Minute

// SetHangWatchdog gives th's calls their limits (firstStepWait until a step
// has run, then cfg.WatchdogLimit) and the message that names a hung
// call's GPUs and ranks; in a run over several processes the others are
// told first (ds's note).
func SetHangWatchdog(th *device.Threads, cfg setup.Config, ds *Distributed) {
	on := RankToDevice(cfg.EP, len(th.Devices()))
	name := func(dev int) string {
		first, last := -1, -1
		for r, d := range on {
			if d == dev {
				last = r
				if first < 0 {
					first = r
				}
			}
		}
		if ds != nil {
			first, last = ds.first+dev, ds.first+dev
		}
		if first == last {
			return fmt.Sprintf("GPU %d's thread (rank %d)", dev, first)
		}
		return fmt.Sprintf("GPU %d's thread (ranks %d–%d)", dev, first, last)
	}
	th.Limit(cfg.WatchdogLimit(), name, func(msg string) {
		ds.AnnounceFailure(errors.New(msg), cfg)
		fmt.Fprintf(os.Stderr, "moebench: %s\n", msg)
		os.Exit(1)
	})
	th.Doing("the setup (NCCL's communicator, the dispatcher's buffers)", firstStepWait)
}

// doing tells the threads' watchdog what the next calls do: before the
// first step has run, with the first step's limit.
func (dl *DeviceLayer) doing(s string) {
	if dl.warm {
		dl.th.Doing(s, 0)
		return
	}
	dl.th.Doing(s+" (the first steps, which compile the kernels)", firstStepWait)
}
