package dispatchers

import "fmt"

// The backward contract. A dispatcher's backward is its own dual operation
// (kernels/BACKWARD.md): the combine's backward delivers each output
// gradient where the forward's combine took the output from, the
// dispatch's backward returns each input gradient (and its probability's)
// the way the forward's combine returned the output, with the forward's
// counts, maps and buffers: no backward phase exchanges counts or waits on
// the host. Phases run as the forward's do, each for every rank before the
// next.
//
// The layer sets Rank.DY (and zeroes Rank.ExpertGrads) before the first
// backward phase. The phase before the first expert backward phase leaves
// ExpertDY holding the gradient of every row of ExpertY the ranks' expert
// phases computed, and Segments the rows that expert backward phase
// computes; the layer's expert backward then writes those rows of ExpertDX
// and ExpertDProbs and adds each segment's weight gradients to its Grads
// (or the rank's ExpertGrads). The last phase leaves DX (bf16 values: each
// token's copies summed in float32 and rounded once, or as the design
// rounds) and DProbs.
//
// Backward returns the steps (Design.Backward); a design with Megatron's
// phases builds them with SequenceBackward:
//
//	unpermute-bwd  local: each permuted copy's output gradient is its
//	               token's DY row
//	combine-bwd    collective: those rows to the ranks that computed the
//	               copies, into ExpertDY (the forward's dispatch
//	               direction, and its chunk sort)
//	               — the layer's expert backward ("experts-bwd") —
//	rebalance-bwd  (a rebalancing design's) after "dynamic-bwd": the work
//	               moved in the forward sends its gradients back (input and
//	               probability gradients, and the weight gradients, added
//	               to their owners' ExpertGrads), and Segments become the
//	               first expert phase's again
//	dispatch-bwd   collective: ExpertDX and ExpertDProbs rows back to the
//	               tokens' home ranks (the forward's combine direction)
//	permute-bwd    local: DX[t] = the sum of token t's copies' input
//	               gradients (float32, rounded to bf16 once), DProbs
//
// A device design's backward is the same contract: its steps queue work on
// the ranks' streams over the DeviceRank's gradient buffers, as its forward
// steps do.

// ExpertBackwardPhases are the names of the backward phases that run the
// experts' backward: ExpertPhases' duals, in the order the forward ran
// them.
var ExpertBackwardPhases = []string{BackwardName(ExpertPhases[0]), BackwardName(ExpertPhases[1])}

// BackwardName is the name of the backward of the forward phase named
// phase.
func BackwardName(phase string) string { return phase + "-bwd" }

// SequenceBackward is the backward of a design with Megatron's phases,
// the forward's (Sequence) reversed, each phase its dual: unpermute-bwd,
// combine-bwd, experts-bwd, dispatch-bwd, permute-bwd.
func SequenceBackward(experts, unpermute, combine, dispatch, permute func(rank int) error) []Step {
	return []Step{{BackwardName("unpermute"), unpermute}, {BackwardName("combine"), combine},
		{ExpertBackwardPhases[0], experts}, {BackwardName("dispatch"), dispatch}, {BackwardName("permute"), permute}}
}

// FusedBackward is the backward of a design whose permute and unpermute
// are fused into its dispatch and combine (DeepEP's, HybridEP's): the
// combine's backward, the experts' backward, the dispatch's backward.
func FusedBackward(combine, experts, dispatch func(rank int) error) []Step {
	return []Step{{BackwardName("combine"), combine}, {ExpertBackwardPhases[0], experts}, {BackwardName("dispatch"), dispatch}}
}

// CheckOutputGrads says which of ranks has no output gradient of the
// shape's size, for a combine's backward that reads them all (name: the
// dispatcher; r: the rank running it).
func CheckOutputGrads(name string, r int, sh Shape, ranks []*Rank) error {
	for q, rk := range ranks {
		if len(rk.DY) != sh.Tokens*sh.Hidden {
			return fmt.Errorf("%s: combine-bwd on rank %d: rank %d's output gradient has %d values, want tokens × hidden = %d", name, r, q, len(rk.DY), sh.Tokens*sh.Hidden)
		}
	}
	return nil
}

// CheckExpertGrads says which of ranks lacks the input and probability
// gradients of some of its rows, for a dispatch's backward that reads them
// all.
func CheckExpertGrads(name string, r int, sh Shape, ranks []*Rank) error {
	for q, rk := range ranks {
		if n := len(rk.ExpertProbs); len(rk.ExpertDX) < n*sh.Hidden || len(rk.ExpertDProbs) < n {
			return fmt.Errorf("%s: dispatch-bwd on rank %d: rank %d's expert input gradients hold %d values and %d probabilities, want %d rows", name, r, q, len(rk.ExpertDX), len(rk.ExpertDProbs), n)
		}
	}
	return nil
}
