package harness

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/internal/launch"
	"github.com/moebench/moebench/results"
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
		cfg := DefaultConfig()
		cfg.Dispatcher, cfg.Impl, cfg.EP, cfg.Domain = c.dispatcher, c.impl, c.ep, c.domain
		_, err := newDist(cfg, rv)
		if !dispatchers.IsUnavailable(err) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "across processes run alltoall --impl library") {
			t.Errorf("%s/%s: %v", c.dispatcher, c.impl, err)
		}
	}
	for _, d := range []string{"alltoall", "hybridep", "deepep-ll"} { // NCCL's send/recv; NCCL EP's two modes
		cfg := DefaultConfig()
		cfg.Dispatcher, cfg.Impl, cfg.EP = d, "library", 4
		if _, err := newDist(cfg, rv); err != nil {
			t.Errorf("%s library: %v", d, err)
		}
	}
	for _, c := range [][2]int{{4, 2}, {4, 1}, {8, 2}, {8, 4}} { // hybridep native: one domain a process, or several
		cfg := DefaultConfig()
		cfg.Dispatcher, cfg.Impl, cfg.EP, cfg.Domain = "hybridep", "native", c[0], c[1]
		if _, err := newDist(cfg, rv); err != nil {
			t.Errorf("hybridep native, --ep %d --domain %d: %v", c[0], c[1], err)
		}
	}
}

// TestMergeChecks: the run's verdict over the processes' checks, as the
// gather carries them (JSON): every process's outputs must pass; each
// gradient's error is the run's max|g − ref| over its max|ref| (as one
// process checking every rank computes it, not the largest process's
// ratio), an infinite difference (a NaN gradient) included; a gradient
// over the tolerance fails the run naming the processes whose own
// differences are over it; a process that checked no gradients while
// this one did fails the run.
func TestMergeChecks(t *testing.T) {
	check := func(passed bool, out float64, detail string) *results.Correctness {
		return &results.Correctness{Checked: true, Passed: passed, MaxRelErr: out, Tolerance: 0.02, Sample: "all 64 tokens", Detail: detail,
			Grads: &results.GradCheck{Tolerance: 0.02, RoundTrip: deviceRoundTrip, PerTensor: map[string]float64{"input": 1}}} // its own ratios: not the run's
	}
	carried := func(p int, c *results.Correctness, acc map[string][2]float64) part { // through JSON, as gatherParts sends it
		b, err := json.Marshal(part{Process: p, Correct: finiteErrs(c), GradAcc: acc})
		if err != nil {
			t.Fatal(err)
		}
		var back part
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		return back
	}
	mine := check(true, 0.005, "")
	// process 0's input: diff 0.01 of a reference up to 2; process 1's 0.003
	// of 0.1 — 3% of its own, 0.5% of the run's: the run's error is
	// max diff / max ref = 0.01/2
	a0 := map[string][2]float64{"input": {0.01, 2}, "router weight": {0.001, 1}}
	a1 := map[string][2]float64{"input": {0.003, 0.1}, "router weight": {0.001, 1}}
	got := mergeChecks(mine, []part{carried(0, mine, a0), carried(1, check(true, 0.006, ""), a1)})
	if !got.Passed || got.MaxRelErr != 0.006 || got.Grads.PerTensor["input"] != 0.005 || got.Grads.PerTensor["router weight"] != 0.001 ||
		got.Grads.MaxRelErr != 0.005 || got.Detail != "" || !strings.HasSuffix(got.Sample, "(each of the 2 processes checks its own ranks)") {
		t.Errorf("merged %+v, gradients %+v", got, got.Grads)
	}
	if mine.Grads.PerTensor["input"] != 1 || !mine.Passed { // its own check is left as it was
		t.Errorf("this process's check changed: %+v", mine.Grads)
	}
	a1["input"] = [2]float64{-1, 0.1} // a NaN gradient on process 1: an infinite difference, as agreeCheck sends it
	got = mergeChecks(mine, []part{carried(0, mine, a0), carried(1, check(true, 0.006, ""), a1)})
	if got.Passed || !math.IsInf(got.Grads.PerTensor["input"], 1) || !math.IsInf(got.Grads.MaxRelErr, 1) ||
		got.Detail != "gradient error over the tolerance 0.02: input +Inf (input in process(es) 1)" {
		t.Errorf("a NaN gradient: %+v, gradients %+v", got, got.Grads)
	}
	a1["input"] = [2]float64{0.05, 0.1} // over the tolerance against the run's reference too (0.05/2)
	got = mergeChecks(mine, []part{carried(0, mine, a0), carried(1, check(false, 0.5, "max relative error 0.5 (tolerance 0.02)"), a1)})
	if got.Passed || got.MaxRelErr != 0.5 || got.Grads.PerTensor["input"] != 0.025 ||
		got.Detail != "process 1: max relative error 0.5 (tolerance 0.02); gradient error over the tolerance 0.02: input 0.025 (input in process(es) 1)" {
		t.Errorf("process 1 over: %+v, gradients %+v", got, got.Grads)
	}
	if got := mergeChecks(mine, []part{carried(0, mine, a0), carried(1, check(true, 0.005, ""), nil)}); got.Passed || !strings.Contains(got.Detail, "process 1: no gradient check") {
		t.Errorf("a process without gradients: %+v", got)
	}
}

// TestHostBytesShare: a process's estimate of its share of a training step
// over several processes counts the gradient check's gathers (every rank's
// routing, the all-reduce's rounds), and its own ranks' output reference
// only; a run of one process counts no gathers.
func TestHostBytesShare(t *testing.T) {
	c := DefaultConfig()
	c.Device, c.Dispatcher, c.Impl, c.EP = "cuda", "alltoall", "library", 8
	env := Env{Rendezvous: &launch.Rendezvous{L: launch.Launch{Rank: 1, World: 4}}}
	parts := func(c Config) map[string]float64 {
		m := map[string]float64{}
		for _, p := range memParts(c, c.hostExperts()) {
			m[p.name] = p.bytes
		}
		return m
	}
	one, share := parts(c), parts(env.share(c))
	const gathers = "gradient check's gathers over NCCL"
	if _, ok := one[gathers]; ok {
		t.Errorf("one process counts %s", gathers)
	}
	if got, want := share[gathers], float64(24*c.EP*c.Tokens*c.TopK+2*sumChunk); got != want {
		t.Errorf("%s: %.0f bytes, want %.0f", gathers, got, want)
	}
	// the output reference's per-token buffers: a quarter of the ranks'
	T, h, k := float64(c.Tokens), float64(c.Hidden), float64(c.TopK)
	if d, want := one["float64 reference"]-share["float64 reference"], 0.75*float64(c.EP)*T*(k*(24+8*h)+8*h); math.Abs(d-want) > 1 {
		t.Errorf("float64 reference: a share of four is %.0f bytes less than one process's, want %.0f", d, want)
	}
	if env.HostBytes(c) <= HostBytes(c) || share["float64 gradient reference"] != one["float64 gradient reference"] {
		t.Errorf("HostBytes: one process %d, a share of four %d; gradient reference %.0f and %.0f", HostBytes(c), env.HostBytes(c),
			one["float64 gradient reference"], share["float64 gradient reference"])
	}
}
