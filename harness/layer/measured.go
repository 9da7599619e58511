package layer

import (
	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/harness/summary"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/results"
)

// Measurements is what a run measured, for its record.
type Measurements struct {
	Phases  []string
	Samples map[string][][]float64 // [phase][rank][iter], ms
	Step    [][]float64            // [rank][iter] each rank's step, ms; nil: the sum of its phases
	Recv    []int                  // rows each rank's experts computed, the last step
	// each timed step's recv (a rebalancing dispatcher's come from its stats)
	RecvSteps [][]int
	Traffic   dispatchers.Traffic
	// a run over several processes: the last step's off-rank bytes to
	// other nodes and within the node (distributed.go's nodeBytes)
	Nodes                bool
	InterNode, IntraNode int64
	Mem                  *results.Memory
	Clock                string // what measured the times
	Model                string // how phases make a step
	// a rebalancing dispatcher's timed steps (nil for other dispatchers); the samples
	// of as many steps, run before them (after their own warm-up) with its
	// phase 2 paused, for the GEMM straggler before rebalancing; and what
	// the SMs did during its copies
	Rebalance []dispatchers.RebalanceStats
	Paused    map[string][][]float64
	Phase2SMs string
	// phases[:forward] are the forward's, the rest the backward's; 0: all
	// are the forward's (the iterations timed the forward only)
	Forward  int
	Issue    []float64              // device runs: each timed step's host issue time, ms
	HostWait []float64              // device runs: each timed step's host wait before phases (alltoall's counts), ms
	HostCall map[string][][]float64 // a library implementation's: [phase][rank][iter] its calls' wall time, ms
	Buffers  []results.Buffer
	Stopped  string // why fewer iterations ran than asked for (--max-seconds)
}

// NewSamples gives each phase an empty [rank][iter] sample.
func (m *Measurements) NewSamples(ranks int) map[string][][]float64 {
	s := map[string][][]float64{}
	for _, ph := range m.Phases {
		s[ph] = make([][]float64, ranks)
	}
	return s
}

// SumPhases is the phases' sum as a phase named name: each rank's own sum
// per iteration, and the lockstep sum (of each phase's slowest rank) as
// its samples.
func (m *Measurements) SumPhases(name string, phases []string, cfg setup.Config) results.Phase {
	perRank := make([][]float64, cfg.EP)
	lockstep := make([]float64, cfg.Iters)
	for _, ph := range phases {
		for i, v := range summary.Phase(ph, m.Samples[ph]).Samples {
			lockstep[i] += v
		}
		for r, rs := range m.Samples[ph] {
			perRank[r] = kernels.Reslice(perRank[r], cfg.Iters)
			for i, v := range rs {
				perRank[r][i] += v
			}
		}
	}
	p := summary.Phase(name, perRank)
	p.Samples, p.Stat = lockstep, summary.Stat(lockstep)
	return p
}
