package harness

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/roundtrip"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// TestDeepEPLayer: deepep at EP 2, 4 and 8 with balanced, skewed and trace
// routing passes the float64 check and the exact round trip, records its
// own phases, and moves fewer bytes than alltoall (a token goes once to
// each rank).
func TestDeepEPLayer(t *testing.T) {
	trace := harnesstest.WriteTrace(t, "1 7 12 3\n2 3 6 8\n15 14 13 0\n4 5 6 7\n")
	for _, ep := range []int{2, 4, 8} {
		t.Run(fmt.Sprintf("ep%d", ep), func(t *testing.T) {
			t.Parallel()
			for name, routing := range map[string]setup.Routing{"balanced": {Kind: setup.RoutingBalanced},
				"skewed": {Kind: setup.RoutingSkewed, Alpha: 1.5}, "trace": {Kind: setup.RoutingTrace, File: trace}} {
				t.Run(name, func(t *testing.T) {
					c := harnesstest.Small()
					c.EP, c.Routing, c.Dispatcher, c.SMs = ep, routing, "deepep", 6
					c.Warmup, c.Iters = 0, 1 // a training step each, its gradients checked
					rec, err := Run(c, setup.Env{Version: "test"})
					if err != nil || rec.Status != results.StatusOK {
						t.Fatalf("EP %d %s: %v, %+v", ep, name, err, rec)
					}
					if cc := rec.Correctness; !cc.Passed || cc.RoundTrip != "exact" || cc.Grads == nil || cc.Grads.RoundTrip != "exact" {
						t.Errorf("EP %d %s: correctness %+v", ep, name, cc)
					}
					var phases []string
					for _, p := range rec.Timing.Phases {
						phases = append(phases, p.Name)
					}
					if want := []string{"shared", "router", "layout", "notify", "dispatch", "permute", "experts", "combine",
						"combine-bwd", "experts-bwd", "dispatch-bwd", "router-bwd", "shared-bwd"}; !slices.Equal(phases, want) {
						t.Errorf("EP %d %s: phases %v, want %v", ep, name, phases, want)
					}
					c.Dispatcher = "alltoall"
					a2a, err := Run(c, setup.Env{Version: "test"})
					if err != nil {
						t.Fatal(err)
					}
					if tr := rec.Traffic; tr.DispatchAlgorithm == 0 || tr.DispatchAlgorithm >= a2a.Traffic.DispatchAlgorithm ||
						!slices.Equal(rec.Tokens.Received, a2a.Tokens.Received) {
						t.Errorf("EP %d %s: deepep traffic %+v, tokens %v; alltoall %+v, %v", ep, name, tr, rec.Tokens.Received, a2a.Traffic, a2a.Tokens.Received)
					}
				})
			}
		})
	}
}

// TestRoundTripExactWithPartialSums: the round trip stays exact for a
// combine that rounds each rank's partial sum to bf16 (deepep), also at
// top-k that is not a power of two, where probabilities of 1/k would make
// those partial sums inexact.
func TestRoundTripExactWithPartialSums(t *testing.T) {
	for _, k := range []int{3, 6} {
		c := harnesstest.Small()
		c.EP, c.TopK, c.Dispatcher = 2, k, "deepep"
		rec, err := Run(c, setup.Env{Version: "test"})
		if err != nil || rec.Correctness.RoundTrip != "exact" {
			t.Errorf("top-%d: %v, round trip %q", k, err, rec.Correctness.RoundTrip)
		}
	}
	for k := 1; k <= 40; k++ {
		p, keep := roundtrip.Probs(k)
		sum := 0.0
		for _, v := range p {
			if f, e := math.Frexp(float64(v)); f != 0.5 || e > 1 {
				t.Fatalf("top-%d: probability %v is not a power of two ≤ 1", k, v)
			}
			sum += float64(v)
		}
		if sum != 1 || keep < 1 || keep > 8 {
			t.Errorf("top-%d: probabilities sum to %v, %d bits kept", k, sum, keep)
		}
	}
}
