package harness

import (
	"math"
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
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
	parts := []part{
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
// designs, feplb), asked to span processes, is unavailable saying what does
// not cross them, why, and what runs instead; the library implementations
// (alltoall's NCCL, hybridep's and deepep's NCCL EP) are placed.
func TestNotAcrossProcesses(t *testing.T) {
	rv := &launch.Rendezvous{L: launch.Launch{Rank: 0, World: 2, Via: "test"}}
	for _, c := range []struct{ dispatcher, impl, want string }{
		{"hybridep", "native", "inter-domain path, though NCCL send/recv, sizes each transfer from the other domains' counts"},
		{"deepep", "native", "internode mode (NVSHMEM) is not modelled"},
		{"alltoall", "native", "peer memory"},
		{"feplb", "native", "FEPLB's phase 2 copies experts' weights"},
	} {
		cfg := DefaultConfig()
		cfg.Dispatcher, cfg.Impl, cfg.EP, cfg.Domain = c.dispatcher, c.impl, 4, 2
		_, err := newDist(cfg, rv)
		if !dispatchers.IsUnavailable(err) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "across processes run alltoall --impl library") {
			t.Errorf("%s/%s: %v", c.dispatcher, c.impl, err)
		}
	}
	for _, d := range []string{"alltoall", "hybridep", "deepep"} { // NCCL's send/recv; NCCL EP's two modes
		cfg := DefaultConfig()
		cfg.Dispatcher, cfg.Impl, cfg.EP = d, "library", 4
		if _, err := newDist(cfg, rv); err != nil {
			t.Errorf("%s library: %v", d, err)
		}
	}
}
