package harness

import (
	"fmt"
	"testing"

	"github.com/moebench/moebench/results"
)

// TestHybridEPDeviceOnEmu: hybridep's cuda implementation on Emu (its
// kernels' Go twins) passes the float64 check, in one domain and across
// domains (one Emu per rank: NCCL's emulation needs one device per rank).
func TestHybridEPDeviceOnEmu(t *testing.T) {
	for _, lay := range []struct{ ep, domain, devs int }{{2, 0, 1}, {4, 0, 2}, {4, 2, 4}, {8, 0, 3}, {8, 4, 8}, {8, 2, 8}} {
		c := small()
		c.Device, c.EP, c.Domain, c.Dispatcher, c.SMs = "cuda", lay.ep, lay.domain, "hybridep", 2
		at := fmt.Sprintf("EP %d domain %d on %d devices", lay.ep, lay.domain, lay.devs)
		rec, err := Run(c, Env{Version: "test", OpenDevices: emus(lay.devs)})
		if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
			t.Fatalf("%s: %v; %+v", at, err, rec)
		}
	}
}

// TestHybridEPOnHostSim: hybridep's CUDA kernels (compiled for the CPU) on
// the fake driver's two GPUs pass the check: one domain with ranks on both
// GPUs and packed two to a GPU, and two domains of one rank (the
// inter-domain path through the fake NCCL).
func TestHybridEPOnHostSim(t *testing.T) {
	useHostSimLayer(t)
	for _, lay := range []struct{ ep, domain int }{{2, 0}, {4, 0}, {2, 1}} {
		c := small()
		c.Device, c.EP, c.Domain, c.Dispatcher, c.SMs = "cuda", lay.ep, lay.domain, "hybridep", 1
		c.Warmup, c.Iters = 1, 1
		at := fmt.Sprintf("EP %d domain %d", lay.ep, lay.domain)
		rec, err := Run(c, Env{Version: "test"})
		if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
			t.Fatalf("%s: %v; %+v", at, err, rec.Correctness)
		}
		t.Logf("%s: max rel err %.2e", at, rec.Correctness.MaxRelErr)
	}
}
