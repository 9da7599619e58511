package harness

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/moebench/moebench/results"
)

// TestHybridEPLayer: hybridep at EP 2, 4 and 8, in one domain and in
// smaller ones (the inter-domain path), with balanced, skewed and trace
// routing passes the float64 check and the exact round trip, records its
// own phases, receives what alltoall's ranks receive, moves the tokens
// DeepEP's convention counts (a token once to each rank), and counts
// inter-domain bytes only across domains.
func TestHybridEPLayer(t *testing.T) {
	trace := writeTrace(t, "1 7 12 3\n2 3 6 8\n15 14 13 0\n4 5 6 7\n")
	for _, lay := range []struct{ ep, domain int }{{2, 0}, {2, 1}, {4, 0}, {4, 2}, {8, 0}, {8, 2}} {
		t.Run(fmt.Sprintf("ep%d-domain%d", lay.ep, lay.domain), func(t *testing.T) {
			t.Parallel()
			for name, routing := range map[string]Routing{"balanced": {Kind: RoutingBalanced},
				"skewed": {Kind: RoutingSkewed, Alpha: 1.5}, "trace": {Kind: RoutingTrace, File: trace}} {
				t.Run(name, func(t *testing.T) {
					c := small()
					c.EP, c.Domain, c.Routing, c.Dispatcher, c.SMs = lay.ep, lay.domain, routing, "hybridep", 3
					c.Warmup, c.Iters = 0, 1 // a training step each, its gradients checked
					at := fmt.Sprintf("EP %d domain %d %s", lay.ep, lay.domain, name)
					rec, err := Run(c, Env{Version: "test"})
					if err != nil || rec.Status != results.StatusOK {
						t.Fatalf("%s: %v, %+v", at, err, rec)
					}
					if cc := rec.Correctness; !cc.Passed || cc.RoundTrip != "exact" || cc.Grads == nil || cc.Grads.RoundTrip != "exact" {
						t.Errorf("%s: correctness %+v", at, cc)
					}
					var phases []string
					for _, p := range rec.Timing.Phases {
						phases = append(phases, p.Name)
					}
					if want := []string{"shared", "router", "allgather", "preprocess", "dispatch", "experts", "combine",
						"combine-bwd", "experts-bwd", "dispatch-bwd", "router-bwd", "shared-bwd"}; !slices.Equal(phases, want) {
						t.Errorf("%s: phases %v, want %v", at, phases, want)
					}
					tr := rec.Traffic
					if split := lay.domain > 0 && lay.domain < lay.ep; (tr.DispatchInterDomain > 0) != split || (tr.CombineInterDomain > 0) != split ||
						(tr.InterDomainAlgorithm > 0) != split || tr.DispatchInterDomain > tr.DispatchOffRank {
						t.Errorf("%s: inter-domain bytes %+v", at, tr)
					}
					c.Dispatcher, c.SMs = "deepep", 4
					dp, err := Run(c, Env{Version: "test"})
					if err != nil {
						t.Fatal(err)
					}
					if tr.DispatchAlgorithm != dp.Traffic.DispatchAlgorithm || tr.CombineAlgorithm != dp.Traffic.CombineAlgorithm ||
						!slices.Equal(rec.Tokens.Received, dp.Tokens.Received) {
						t.Errorf("%s: hybridep traffic %+v, tokens %v; deepep %+v, %v", at, tr, rec.Tokens.Received, dp.Traffic, dp.Tokens.Received)
					}
				})
			}
		})
	}
}

// TestHybridEPEqualsAlltoall: the layer's output with hybridep equals
// alltoall's bit for bit in one domain with one expert per rank, and at
// top-2 in any domains; otherwise within the check's tolerance.
func TestHybridEPEqualsAlltoall(t *testing.T) {
	for _, cs := range []struct {
		ep, experts, topk, domain int
		exact                     bool
	}{{8, 8, 3, 0, true}, {8, 16, 2, 2, true}, {8, 16, 2, 1, true}, {8, 16, 4, 2, false}, {2, 16, 4, 0, false}} {
		c := small()
		c.EP, c.Experts, c.TopK, c.Domain = cs.ep, cs.experts, cs.topk, cs.domain
		c.Routing = Routing{Kind: RoutingSkewed, Alpha: 1}
		h, a := layerOutput(t, c, "hybridep"), layerOutput(t, c, "alltoall")
		if cs.exact {
			if !reflect.DeepEqual(h, a) {
				t.Errorf("%+v: hybridep's output differs from alltoall's", cs)
			}
			continue
		}
		if diff, ref := largestDiff(h, a); diff == 0 || diff/ref > Tolerance {
			t.Errorf("%+v: largest difference %g of %g; want some, within %g", cs, diff, ref, Tolerance)
		}
	}
}

// largestDiff is the largest difference between two layers' outputs, and
// the largest magnitude of the second's.
func largestDiff(got, want [][]float32) (diff, ref float64) {
	for r := range want {
		for i, v := range got[r] {
			diff = math.Max(diff, math.Abs(float64(v-want[r][i])))
			ref = math.Max(ref, math.Abs(float64(want[r][i])))
		}
	}
	return diff, ref
}

// TestHybridEPHostBytes: the host memory estimate counts each rank's copy
// of the global routing map (EP² · tokens · experts bytes in all) and its
// worst-case dense_to_expert map.
func TestHybridEPHostBytes(t *testing.T) {
	c := small()
	c.EP, c.Tokens, c.Experts = 64, 4096, 256
	a := hostBytes(c, HostExpertsHeld) // one mode for both (auto's depends on the estimate)
	c.Dispatcher = "hybridep"
	if got, want := float64(hostBytes(c, HostExpertsHeld)-a), 1.1*float64(64*64*4096*256+64*4*4096*256); math.Abs(got-want) > 2 { // HostBytes adds 10% for Go

		t.Errorf("hybridep's extra host bytes %g, want %g", got, want)
	}
}
