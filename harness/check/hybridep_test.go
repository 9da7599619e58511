package check

import (
	"reflect"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
)

// TestHybridEPEqualsAlltoall: the layer's output with hybridep equals
// alltoall's bit for bit in one domain with one expert per rank, and at
// top-2 in any domains; otherwise within the check's tolerance.
func TestHybridEPEqualsAlltoall(t *testing.T) {
	for _, cs := range []struct {
		ep, experts, topk, domain int
		exact                     bool
	}{{8, 8, 3, 0, true}, {8, 16, 2, 2, true}, {8, 16, 2, 1, true}, {8, 16, 4, 2, false}, {2, 16, 4, 0, false}} {
		c := harnesstest.Small()
		c.EP, c.Experts, c.TopK, c.Domain = cs.ep, cs.experts, cs.topk, cs.domain
		c.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1}
		h, a := layerOutput(t, c, "hybridep"), layerOutput(t, c, "alltoall")
		if cs.exact {
			if !reflect.DeepEqual(h, a) {
				t.Errorf("%+v: hybridep's output differs from alltoall's", cs)
			}
			continue
		}
		if diff, ref := harnesstest.LargestDiff(h, a); diff == 0 || diff/ref > Tolerance {
			t.Errorf("%+v: largest difference %g of %g; want some, within %g", cs, diff, ref, Tolerance)
		}
	}
}
