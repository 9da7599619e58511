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
// A design with its own phases implements BackwardPhaser; the classic
// designs implement PhasedBackward, which SequenceBackward orders:
//
//	UnpermuteBackward  local: each permuted copy's output gradient is its
//	                   token's DY row
//	CombineBackward    collective: those rows to the ranks that computed
//	                   the copies, into ExpertDY (the forward's dispatch
//	                   direction, and its chunk sort)
//	                   — the layer's expert backward ("experts-bwd") —
//	RebalanceBackward  (a Rebalancer's) after "dynamic-bwd": the work moved
//	                   in the forward sends its gradients back, and Segments
//	                   become the first expert phase's again
//	DispatchBackward   collective: ExpertDX and ExpertDProbs rows back to
//	                   the tokens' home ranks (the forward's combine
//	                   direction)
//	PermuteBackward    local: DX[t] = the sum of token t's copies' input
//	                   gradients (float32, rounded to bf16 once), DProbs
//
// The same interfaces describe a device dispatcher's backward (a
// DeviceDispatcher that implements them): its phases queue work on the
// ranks' streams over the DeviceRank's gradient buffers, as its forward
// phases do.

// BackwardPhaser is a dispatcher, host or device, that declares its own
// backward phases, with experts (the layer's expert backward over the
// ranks' current segments) in their place, named as ExpertBackwardPhases
// says.
type BackwardPhaser interface {
	BackwardPhases(experts func(rank int) error) []Step
}

// PhasedBackward is the classic phases' backward (see above).
type PhasedBackward interface {
	UnpermuteBackward(rank int) error
	CombineBackward(rank int) error
	DispatchBackward(rank int) error
	PermuteBackward(rank int) error
}

// RebalancerBackward is a Rebalancer's backward of its Rebalance: it
// returns what the work moved in the forward computed in the backward
// (input and probability gradients, and the weight gradients, added to
// their owners' ExpertGrads) and sets Segments to the first expert
// phase's.
type RebalancerBackward interface {
	RebalanceBackward(rank int) error
}

// ExpertBackwardPhases are the names of the backward phases that run the
// experts' backward: ExpertPhases' duals, in the order the forward ran
// them.
var ExpertBackwardPhases = []string{BackwardName(ExpertPhases[0]), BackwardName(ExpertPhases[1])}

// BackwardName is the name of the backward of the forward phase named
// phase.
func BackwardName(phase string) string { return phase + "-bwd" }

// HasBackward reports whether d, host or device, declares a backward.
func HasBackward(d any) bool {
	if _, ok := d.(BackwardPhaser); ok {
		return true
	}
	_, ok := d.(PhasedBackward)
	return ok
}

// ForwardOnly is a device dispatcher without a backward in this build
// (no HasBackward) that says why: the record of a run that asked for
// training steps gives its reason.
type ForwardOnly interface{ NoBackward() string }

// BackwardSteps are d's backward phases with experts in their place: its
// own (BackwardPhaser), else SequenceBackward. d must have a backward
// (HasBackward).
func BackwardSteps(d any, experts func(rank int) error) ([]Step, error) {
	if p, ok := d.(BackwardPhaser); ok {
		return p.BackwardPhases(experts), nil
	}
	if p, ok := d.(PhasedBackward); ok {
		return SequenceBackward(p, experts)
	}
	return nil, fmt.Errorf("dispatchers: %T declares no backward", d)
}

// SequenceBackward is the classic phases' backward order, the forward's
// (Sequence) reversed: unpermute-bwd, combine-bwd, for Rebalancers
// dynamic-bwd and rebalance-bwd, then experts-bwd, dispatch-bwd,
// permute-bwd. A Rebalancer must be a RebalancerBackward.
func SequenceBackward(d PhasedBackward, experts func(rank int) error) ([]Step, error) {
	s := []Step{{BackwardName("unpermute"), d.UnpermuteBackward}, {BackwardName("combine"), d.CombineBackward}}
	if _, ok := d.(Rebalancer); ok {
		rb, ok := d.(RebalancerBackward)
		if !ok {
			return nil, fmt.Errorf("dispatchers: %T rebalances but has no RebalanceBackward", d)
		}
		s = append(s, Step{ExpertBackwardPhases[1], experts}, Step{BackwardName("rebalance"), rb.RebalanceBackward})
	}
	return append(s, Step{ExpertBackwardPhases[0], experts}, Step{BackwardName("dispatch"), d.DispatchBackward},
		Step{BackwardName("permute"), d.PermuteBackward}), nil
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
