package layer

import (
	"math"
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/launch"
)

// TestNodeBytes: a token goes to a rank once however many of its experts
// the rank holds; its pairs to a rank of another node are inter-node, to
// another rank of its node intra-node, to its own rank neither.
func TestNodeBytes(t *testing.T) {
	// EP 4, 2 experts per rank, top-2: rank 0's two tokens
	idx := []int32{
		0, 1, // token 0: rank 0 twice (its own)
		2, 7, // token 1: ranks 1 and 3
	}
	if got := tokenRankPairs(idx, 2, 2, 4); got[0] != 1 || got[1] != 1 || got[2] != 0 || got[3] != 1 {
		t.Fatalf("pairs %v", got)
	}
	// ranks 0–1 on node a, 2–3 on node b
	parts := []ProcessContribution{
		{First: 0, Host: "a", Pairs: [][]int64{{1, 1, 0, 1}, {2, 5, 3, 0}}},
		{First: 2, Host: "b", Pairs: [][]int64{{4, 0, 7, 1}, {0, 0, 2, 9}}},
	}
	// rank 0: →1 intra 1, →3 inter 1; rank 1: →0 intra 2, →2 inter 3;
	// rank 2: →0 inter 4, →3 intra 1; rank 3: →2 intra 2
	inter, intra := nodeBytes(parts, 8)
	if inter != (1+3+4)*16 || intra != (1+2+1+2)*16 {
		t.Errorf("inter %d, intra %d bytes", inter, intra)
	}
	parts[1].Host = "a"
	if inter, intra := nodeBytes(parts, 8); inter != 0 || intra != (1+1+2+3+4+1+2)*16 {
		t.Errorf("one node: inter %d, intra %d bytes", inter, intra)
	}
}

// TestSlowestOf: every process picks the same grouped-GEMM way, by each
// way's slowest process; a way one process left out is never chosen, and
// processes that compared different ways cannot agree.
func TestSlowestOf(t *testing.T) {
	got, err := slowestOf([][]float64{{1, 5, 2}, {3, 1, -1}}, 3)
	if err != nil || got[0] != 3 || got[1] != 5 || !math.IsInf(got[2], 1) {
		t.Errorf("%v, %v", got, err)
	}
	if _, err := slowestOf([][]float64{{1, 2}, {1}}, 2); err == nil || !strings.Contains(err.Error(), "process 1 compared 1 ways") {
		t.Errorf("%v", err)
	}
}

// TestNotAcrossProcesses: a native implementation (moebench's peer-memory
// designs, feplb; hybridep's with an NVLink domain over several processes),
// asked to span processes, is unavailable saying what does not cross them,
// why, and what runs instead; the library implementations (alltoall's NCCL,
// hybridep's and deepep-ll's NCCL EP) and hybridep's native one with every
// domain inside a process are placed.
func TestNotAcrossProcesses(t *testing.T) {
	rv := &launch.Rendezvous{L: launch.Launch{Rank: 0, World: 2, Via: "test"}}
	for _, c := range []struct {
		dispatcher, impl string
		ep, domain       int
		want             string
	}{
		{"hybridep", "native", 4, 4, "--domain 4 puts a domain over several of the 2 processes, which drive 2 ranks each (--ep 4); its inter-domain path goes over NCCL: a --domain that divides 2 runs"},
		{"hybridep", "native", 8, 0, "--domain 0 (one domain of all 8 ranks) puts a domain over several of the 2 processes, which drive 4 ranks each (--ep 8)"},
		{"hybridep", "native", 12, 4, "--domain 4 puts a domain over several of the 2 processes, which drive 6 ranks each (--ep 12); its inter-domain path goes over NCCL: a --domain that divides 6 runs"},
		{"hybridep", "native", 5, 1, "--ep 5 does not split into 2 processes' equal blocks"},
		{"deepep", "native", 4, 2, "internode mode (NVSHMEM) is not modelled"},
		{"alltoall", "native", 4, 2, "peer memory"},
		{"feplb", "native", 4, 2, "FEPLB's phase 2 copies experts' weights"},
	} {
		cfg := setup.DefaultConfig()
		cfg.Dispatcher, cfg.Impl, cfg.EP, cfg.Domain = c.dispatcher, c.impl, c.ep, c.domain
		_, err := NewDistributed(cfg, rv)
		if !dispatchers.IsUnavailable(err) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "across processes run alltoall --impl library") {
			t.Errorf("%s/%s: %v", c.dispatcher, c.impl, err)
		}
	}
	for _, d := range []string{"alltoall", "hybridep", "deepep-ll"} { // NCCL's send/recv; NCCL EP's two modes
		cfg := setup.DefaultConfig()
		cfg.Dispatcher, cfg.Impl, cfg.EP = d, "library", 4
		if _, err := NewDistributed(cfg, rv); err != nil {
			t.Errorf("%s library: %v", d, err)
		}
	}
	for _, c := range [][2]int{{4, 2}, {4, 1}, {8, 2}, {8, 4}} { // hybridep native: one domain a process, or several
		cfg := setup.DefaultConfig()
		cfg.Dispatcher, cfg.Impl, cfg.EP, cfg.Domain = "hybridep", "native", c[0], c[1]
		if _, err := NewDistributed(cfg, rv); err != nil {
			t.Errorf("hybridep native, --ep %d --domain %d: %v", c[0], c[1], err)
		}
	}
}
