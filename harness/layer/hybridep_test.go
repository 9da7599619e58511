package layer

import (
	"math"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
)

// TestHybridEPHostBytes: the host memory estimate counts each rank's copy
// of the global routing map (EP² · tokens · experts bytes in all) and its
// worst-case dense_to_expert map.
func TestHybridEPHostBytes(t *testing.T) {
	c := harnesstest.Small()
	c.EP, c.Tokens, c.Experts = 64, 4096, 256
	a := setup.HostBytesForExpertMode(c, setup.HostExpertsHeld) // one mode for both (auto's depends on the estimate)
	c.Dispatcher = "hybridep"
	if got, want := float64(setup.HostBytesForExpertMode(c, setup.HostExpertsHeld)-a), 1.1*float64(64*64*4096*256+64*4*4096*256); math.Abs(got-want) > 2 { // HostBytes adds 10% for Go

		t.Errorf("hybridep's extra host bytes %g, want %g", got, want)
	}
}
