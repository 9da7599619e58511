package layer

import (
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/internal/harnesstest"
)

// TestNCCLEPNodeLimit: in a run that spans processes NCCL EP's limit of 8
// ranks is per node — the ranks of this process's node (its ranks times
// the launcher's processes on the node), not the run's, which may be 64.
func TestNCCLEPNodeLimit(t *testing.T) {
	harnesstest.UseHostSimLayer(t)
	harnesstest.UseFakeNCCLEP(t)
	for _, c := range []struct {
		nodeRanks int
		want      string // "": available
	}{{0, ""}, {8, ""}, {12, "12 ranks on this process's node: NCCL EP supports at most 8 per node"}} {
		for _, d := range []string{"hybridep", "deepep-ll"} {
			dd, err := dispatchers.NewDevice(d, dispatchers.ImplLibrary, dispatchers.Env{Device: "cuda", NodeRanks: c.nodeRanks})
			if c.want == "" && err != nil || c.want != "" && (!dispatchers.IsUnavailable(err) || !strings.Contains(err.Error(), c.want)) {
				t.Errorf("%s with %d ranks on the node: %v", d, c.nodeRanks, err)
			}
			if dd != nil {
				dd.Close()
			}
		}
	}
}
