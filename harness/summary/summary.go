// Package summary turns a run's measured samples into the statistics its
// record holds: a phase's percentiles over iterations (each iteration's
// slowest rank) and across ranks, the straggler of a per-rank vector, a
// dispatcher's traffic with its GB/s, and the dispatch as a design's own
// test times it. It knows nothing of layers or devices: its inputs are
// samples in milliseconds ([rank][iteration]) and dispatcher counts, its
// outputs are results types. The run loop (package harness) and the
// benchmarks share it.
package summary

import (
	"fmt"

	"github.com/montanaflynn/stats"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/results"
)

// Phase summarises per-rank, per-iteration samples: the per-iteration
// value is the slowest rank's.
func Phase(name string, perRank [][]float64) results.Phase {
	p := results.Phase{Name: name}
	if len(perRank) == 0 || len(perRank[0]) == 0 {
		return p
	}
	iters := len(perRank[0])
	p.Samples = make([]float64, iters)
	for _, rs := range perRank {
		for i, v := range rs {
			p.Samples[i] = max(p.Samples[i], v)
		}
		med, _ := stats.Median(rs)
		p.PerRank = append(p.PerRank, med)
	}
	p.Stat = Stat(p.Samples)
	p.RankMin, _ = stats.Min(p.PerRank)
	p.RankMax, _ = stats.Max(p.PerRank)
	return p
}

// Stat gives p50/p90/p99 (nearest-rank percentiles of montanaflynn/stats),
// the mean and the sample standard deviation (0 for one sample).
func Stat(x []float64) results.Stat {
	var s results.Stat
	s.P50, _ = stats.Median(x)
	s.P90, _ = stats.Percentile(x, 90)
	s.P99, _ = stats.Percentile(x, 99)
	s.Mean, _ = stats.Mean(x)
	if len(x) > 1 {
		s.Stdev, _ = stats.StandardDeviationSample(x)
	}
	return s
}

// Floats converts counts.
func Floats(v []int) []float64 {
	f := make([]float64, len(v))
	for i, x := range v {
		f[i] = float64(x)
	}
	return f
}

// Straggler returns max−mean and max/mean−1 of v.
func Straggler(v []float64) results.Straggler {
	s := results.Straggler{PerRank: v}
	mean, _ := stats.Mean(v)
	hi, _ := stats.Max(v)
	s.Abs = hi - mean
	if mean > 0 {
		s.Rel = hi/mean - 1
	}
	return s
}

// Traffic is a dispatcher's traffic as the record holds it.
func Traffic(tr dispatchers.Traffic) *results.Traffic {
	return &results.Traffic{DispatchOffRank: tr.DispatchOffRank, DispatchLogical: tr.DispatchLogical,
		CombineOffRank: tr.CombineOffRank, CombineLogical: tr.CombineLogical, Formula: tr.Formula,
		DispatchAlgorithm: tr.DispatchAlgorithm, CombineAlgorithm: tr.CombineAlgorithm, AlgorithmFormula: tr.AlgorithmFormula,
		DispatchInterDomain: tr.DispatchInterDomain, CombineInterDomain: tr.CombineInterDomain, InterDomainAlgorithm: tr.InterDomainAlgorithm,
		CombineBackwardOffRank: tr.CombineBackwardOffRank, CombineBackwardLogical: tr.CombineBackwardLogical,
		DispatchBackwardOffRank: tr.DispatchBackwardOffRank, DispatchBackwardLogical: tr.DispatchBackwardLogical, BackwardFormula: tr.BackwardFormula}
}

// Bandwidth fills t's GB/s from the phase p50s of timing: in moebench's
// per-copy convention (copies bytes), and in the design's own from its
// algorithm bytes, per SM of budget when the dispatcher is SM-driven
// (budget > 0).
func Bandwidth(t *results.Traffic, timing *results.Timing, ep, budget int, copies int64) {
	p50 := map[string]float64{}
	for _, p := range timing.Phases {
		p50[p.Name] = p.P50
	}
	t.CopyBytes, t.CopyFormula = copies, results.CopyFormula
	t.DispatchCopyGBps, t.CombineCopyGBps = results.GBps(copies, ep, p50["dispatch"]), results.GBps(copies, ep, p50["combine"])
	if t.DispatchAlgorithm == 0 && t.CombineAlgorithm == 0 {
		return
	}
	rate := func(bytes int64, phase string) (gbps, perSM float64) {
		gbps = results.GBps(bytes, ep, p50[phase])
		if budget > 0 {
			perSM = gbps / float64(budget)
		}
		return gbps, perSM
	}
	t.DispatchGBps, t.DispatchGBpsPerSM = rate(t.DispatchAlgorithm, "dispatch")
	t.CombineGBps, t.CombineGBpsPerSM = rate(t.CombineAlgorithm, "combine")
	t.BandwidthFormula = "algorithm bytes / EP / the phase's p50 (each iteration's slowest rank): a rank's share over the dispatch (or combine) phase alone"
	if budget > 0 {
		t.BandwidthFormula += fmt.Sprintf("; per SM: divided by the budget, %d blocks", budget)
	}
}

// NodeBandwidth fills t's inter- and intra-node bytes and the GB/s a
// rank's share of each gives over the dispatch (combine) phase's p50.
func NodeBandwidth(t *results.Traffic, timing *results.Timing, ep int, inter, intra int64) {
	t.InterNodeBytes, t.IntraNodeBytes, t.NodeFormula = inter, intra, results.NodeFormula
	for _, p := range timing.Phases {
		switch p.Name {
		case "dispatch":
			t.DispatchInterNodeGBps, t.DispatchIntraNodeGBps = results.GBps(inter, ep, p.P50), results.GBps(intra, ep, p.P50)
		case "combine":
			t.CombineInterNodeGBps, t.CombineIntraNodeGBps = results.GBps(inter, ep, p.P50), results.GBps(intra, ep, p.P50)
		}
	}
}
