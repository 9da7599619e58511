// Package hybridep will hold the HybridEP design: the routing map is all-gathered
// instead of a notify step, and TMA/bulk copies write straight into peers'
// buffers with a small SM budget (--sms), NVLink-domain aware.
//
// Not implemented in this build: it registers a factory that reports the dispatcher unavailable, with
// the reason, so runs and sweeps record "unavailable" rather than a timing.
// Its SM budget is registered (Megatron's default 16), so --sms varies it in
// sweeps. The contract it will implement, as deepep does: Phases (allgather,
// preprocess, dispatch — which leaves the expert-major rows, permute fused —,
// experts, combine, which leaves each token's k-way sum), Traffic with its
// algorithm bytes, and Buffers for its worst-case receive buffers.
package hybridep

import "github.com/moebench/moebench/dispatchers"

func init() {
	dispatchers.Register("hybridep", dispatchers.Pending("hybridep", "TMA/bulk copies into peer buffers"))
	dispatchers.RegisterSMBudget("hybridep", dispatchers.SMBudget{Default: 16, About: "Megatron's default HybridEP budget"})
}
