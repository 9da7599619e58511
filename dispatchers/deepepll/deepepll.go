// Package deepepll registers deepep-ll, DeepEP's low-latency design
// (deepseek-ai/DeepEP's low_latency_dispatch and low_latency_combine): each
// token copy written straight into a per-expert receive slot on its expert's
// rank, no notify and no host wait for counts, every SM of the GPU spread
// over the experts. It is a name of its own because it is a different
// algorithm from DeepEP's normal mode (deepep): a results table must not
// put the two under one name.
//
// --impl library is NCCL EP's low-latency mode, a re-hosting of this design
// (dispatchers/ncclep registers it). --impl native, moebench's own kernels
// of the design, is not built yet: it is registered so that asking for it
// says so, with the reason, as every unavailable implementation does.
package deepepll

import "github.com/moebench/moebench/dispatchers"

// Name is the dispatcher's registered name.
const Name = "deepep-ll"

// NativeReason is why --impl native is unavailable.
const NativeReason = "moebench's own kernels of DeepEP's low-latency design are not built yet " +
	"(per-expert receive slots written by each sender, sized for every rank's tokens, with no notify and no NVLink-domain " +
	"optimisation, the design DeepEP runs over RDMA); deepep-ll --impl library runs it through NCCL EP's low-latency mode"

func init() {
	dispatchers.Register(Name, func(impl string, env dispatchers.Env) (dispatchers.Dispatcher, error) {
		return nil, native(impl)
	})
	dispatchers.RegisterDevice(Name, func(impl string, env dispatchers.Env) (dispatchers.DeviceDispatcher, error) {
		return nil, native(impl)
	})
}

// native is why impl (native: the library is registered in its place by
// dispatchers/ncclep) is unavailable.
func native(impl string) error {
	reason := NativeReason
	if impl != dispatchers.ImplNative {
		reason = "no library implementation registered in this build (dispatchers/ncclep registers NCCL EP's low-latency mode)"
	}
	return &dispatchers.UnavailableError{Name: Name, Impl: impl, Reason: reason}
}
