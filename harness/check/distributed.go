package check

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/results"
)

// agreeCheck gives every process the run's verdict: each process's check
// of its own ranks' outputs, the worst error and every failure's detail;
// with a training step's gradients, each gradient's error over every
// process's maxima, as one process's check computes it, and its verdict.
func agreeCheck(dl *layer.DeviceLayer, c *results.Correctness) (*results.Correctness, error) {
	p := layer.ProcessContribution{Process: dl.Distributed.Rendezvous.L.Rank, Correct: layer.EncodeInfiniteErrs(c)}
	if dl.GradAcc != nil {
		p.GradAcc = map[string][2]float64{}
		for n, a := range dl.GradAcc {
			d := a.Diff
			if math.IsInf(d, 0) || math.IsNaN(d) {
				d = -1
			}
			p.GradAcc[n] = [2]float64{d, a.Ref}
		}
	}
	parts, err := dl.GatherContributions(p)
	if err != nil {
		return nil, err
	}
	return mergeChecks(c, parts), nil
}

// mergeChecks is the run's verdict from every process's part (their
// checks as finiteErrs sent them, and their gradient maxima), with mine's
// settings. A gradient's error is max|g − ref| over every process's over
// max|ref| over every process's (what one process checking every rank
// computes); over the tolerance, the detail names the processes whose own
// differences are.
func mergeChecks(mine *results.Correctness, parts []layer.ProcessContribution) *results.Correctness {
	out := *mine
	out.MaxRelErr, out.RoutingDiffs, out.Passed = 0, 0, true
	var details []string
	for _, p := range parts {
		pc := layer.DecodeInfiniteErrs(p.Correct)
		out.MaxRelErr = max(out.MaxRelErr, pc.MaxRelErr)
		out.RoutingDiffs += pc.RoutingDiffs
		out.Passed = out.Passed && pc.Passed
		if pc.Detail != "" {
			details = append(details, fmt.Sprintf("process %d: %s", p.Process, pc.Detail))
		}
	}
	if mine.Grads != nil {
		acc := map[string]layer.MaxErrAccumulator{}
		for _, p := range parts {
			if p.GradAcc == nil { // it did not check its gradients while this one did
				out.Passed = false
				details = append(details, fmt.Sprintf("process %d: no gradient check", p.Process))
			}
			for n, v := range p.GradAcc {
				acc[n] = layer.MergeProcessMaxima(acc[n], v)
			}
		}
		g := *mine.Grads
		g.MaxRelErr, g.PerTensor = 0, map[string]float64{}
		for n, a := range acc {
			g.PerTensor[n] = a.Err()
			g.MaxRelErr = max(g.MaxRelErr, a.Err())
		}
		out.Grads = &g
		if why := gradDetail(&g); why != "" {
			out.Passed = false
			var in []string // the processes whose own differences are over the tolerance, by gradient
			for _, n := range slices.Sorted(maps.Keys(acc)) {
				if g.PerTensor[n] <= g.Tolerance {
					continue
				}
				var ps []string
				for _, p := range parts {
					v, ok := p.GradAcc[n]
					own := layer.MergeProcessMaxima(layer.MaxErrAccumulator{}, v) // its own differences, against the run's reference
					own.Ref = acc[n].Ref
					if ok && !(own.Err() <= g.Tolerance) {
						ps = append(ps, fmt.Sprint(p.Process))
					}
				}
				in = append(in, fmt.Sprintf("%s in process(es) %s", n, strings.Join(ps, ", ")))
			}
			if in != nil {
				why += " (" + strings.Join(in, "; ") + ")"
			}
			details = append(details, why)
		}
	}
	out.Detail = strings.Join(details, "; ")
	out.Sample += fmt.Sprintf(" (each of the %d processes checks its own ranks)", len(parts))
	return &out
}

// localSample is sample (nil: every token) with other processes' ranks
// left out: a process checks its own ranks.
func localSample(dl *layer.DeviceLayer, sample [][]int) [][]int {
	if dl.Distributed == nil {
		return sample
	}
	if sample == nil {
		sample = allTokens(dl.Layer.Cfg.EP, dl.Layer.Cfg.Tokens)
	}
	out := slices.Clone(sample)
	for r := range out {
		if !dl.Local(r) {
			out[r] = nil
		}
	}
	return out
}
