package harness

import (
	"fmt"
	"slices"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// TestHybridEPLayer: hybridep at EP 2, 4 and 8, in one domain and in
// smaller ones (the inter-domain path), with balanced, skewed and trace
// routing passes the float64 check and the exact round trip, records its
// own phases, receives what alltoall's ranks receive, moves the tokens
// DeepEP's convention counts (a token once to each rank), and counts
// inter-domain bytes only across domains.
func TestHybridEPLayer(t *testing.T) {
	trace := harnesstest.WriteTrace(t, "1 7 12 3\n2 3 6 8\n15 14 13 0\n4 5 6 7\n")
	for _, lay := range []struct{ ep, domain int }{{2, 0}, {2, 1}, {4, 0}, {4, 2}, {8, 0}, {8, 2}} {
		t.Run(fmt.Sprintf("ep%d-domain%d", lay.ep, lay.domain), func(t *testing.T) {
			t.Parallel()
			for name, routing := range map[string]setup.Routing{"balanced": {Kind: setup.RoutingBalanced},
				"skewed": {Kind: setup.RoutingSkewed, Alpha: 1.5}, "trace": {Kind: setup.RoutingTrace, File: trace}} {
				t.Run(name, func(t *testing.T) {
					c := harnesstest.Small()
					c.EP, c.Domain, c.Routing, c.Dispatcher, c.SMs = lay.ep, lay.domain, routing, "hybridep", 3
					c.Warmup, c.Iters = 0, 1 // a training step each, its gradients checked
					at := fmt.Sprintf("EP %d domain %d %s", lay.ep, lay.domain, name)
					rec, err := Run(c, setup.Env{Version: "test"})
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
					dp, err := Run(c, setup.Env{Version: "test"})
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
