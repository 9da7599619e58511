package summary

import (
	"slices"
	"strings"

	"github.com/moebench/moebench/results"
)

// Dispatch as the designs' own tests time it, besides each phase alone.

// designDispatch is, per dispatcher, the phases its design's test times
// as its dispatch, and why.
var designDispatch = map[string]struct {
	parts []string
	about string
}{
	"deepep": {[]string{"notify", "dispatch"}, "as DeepEP's test_intranode.py times buffer.dispatch: the notify, then the dispatch kernel " +
		"(DeepEP's tuning loop reuses a handle, so its notify is the cached one; moebench's routing is new every step, so its notify exchanges the counts and the host waits for them: at least the cached notify's time)"},
	"hybridep": {[]string{"allgather", "preprocess", "dispatch"}, "as HybridEP's test_hybrid_ep.py times the Torch API's dispatch: the routing map's all-gather, " +
		"the metadata preprocessing and the dispatch kernel"},
}

// AsDesigned sums the phases of name's design dispatch out of samples
// ([phase][rank][iter], ms), with the algorithm bytes' rate over its p50
// for ep ranks and budget SMs; nil when the dispatcher has none or ran
// other phases (a library implementation).
func AsDesigned(name string, phases []string, samples map[string][][]float64, algo int64, ep, budget int) *results.DesignPhase {
	dd, ok := designDispatch[name]
	if !ok {
		return nil
	}
	for _, ph := range dd.parts {
		if !slices.Contains(phases, ph) || len(samples[ph]) == 0 {
			return nil
		}
	}
	first := samples[dd.parts[0]]
	perRank, lockstep := make([][]float64, len(first)), make([]float64, len(first[0]))
	for r := range perRank {
		perRank[r] = make([]float64, len(first[r]))
	}
	for _, ph := range dd.parts {
		for i, v := range Phase(ph, samples[ph]).Samples {
			if i < len(lockstep) {
				lockstep[i] += v
			}
		}
		for r, rs := range samples[ph] {
			for i, v := range rs {
				if r < len(perRank) && i < len(perRank[r]) {
					perRank[r][i] += v
				}
			}
		}
	}
	p := Phase(strings.Join(dd.parts, "+"), perRank)
	p.Stat, p.Samples = Stat(lockstep), lockstep
	d := &results.DesignPhase{Phase: p, Parts: dd.parts, About: dd.about}
	if algo > 0 {
		d.GBps = results.GBps(algo, ep, p.P50)
		if budget > 0 {
			d.GBpsPerSM = d.GBps / float64(budget)
		}
	}
	return d
}
