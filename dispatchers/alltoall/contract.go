package alltoall

import "github.com/moebench/moebench/dispatchers"

// Forward is Megatron's phases: permute, dispatch, experts, combine,
// unpermute.
func (a *A2A) Forward(experts func(rank int) error) []dispatchers.Step {
	return dispatchers.Sequence(experts, a.Permute, a.Dispatch, a.Combine, a.Unpermute)
}

// Backward is their duals in the reverse order.
func (a *A2A) Backward(experts func(rank int) error) []dispatchers.Step {
	return dispatchers.SequenceBackward(experts, a.UnpermuteBackward, a.CombineBackward, a.DispatchBackward, a.PermuteBackward)
}

// Capabilities: fp8 and mxfp8 at every shape.
func (a *A2A) Capabilities() dispatchers.Capabilities {
	return dispatchers.Capabilities{FP8: a.FP8Unavailable, MXFP8: a.MXFP8Unavailable}
}

// Close has nothing to free on the host.
func (a *A2A) Close() error { return nil }

// Forward is Megatron's phases, as the host's.
func (a *Device) Forward(experts func(rank int) error) []dispatchers.Step {
	return dispatchers.Sequence(experts, a.Permute, a.Dispatch, a.Combine, a.Unpermute)
}

// Backward is their duals in the reverse order.
func (a *Device) Backward(experts func(rank int) error) []dispatchers.Step {
	return dispatchers.SequenceBackward(experts, a.UnpermuteBackward, a.CombineBackward, a.DispatchBackward, a.PermuteBackward)
}

// Capabilities: the count exchange waits on the host before dispatch, the
// steps between the waits may be graphed, and the library implementation
// moves the data through NCCL.
func (a *Device) Capabilities() dispatchers.Capabilities {
	return dispatchers.Capabilities{
		FP8:       a.FP8Unavailable,
		HostWait:  &dispatchers.HostWait{Before: a.WaitsBefore, Wait: a.HostWait},
		Graph:     &dispatchers.Graph{Key: a.GraphKey, No: a.NoGraph},
		Transport: a.Transport,
	}
}
