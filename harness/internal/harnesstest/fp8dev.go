package harnesstest

import (
	"github.com/moebench/moebench/harness/setup"
)

// FP8DeviceCases are the dispatchers whose cuda device implementation
// moves FP8 rows, in layers that exercise them: hidden 512 (4 blocks a
// row, packed rows of 528 bytes) and 384 (3 blocks, 396 bytes padded to
// 400), a shared expert, EP 1 (no exchange) and sigmoid routing; hybridep
// (hidden 512, its fp8 constraint) with one domain and with two; deepep
// at hidden 512 and at 384 (skewed, a shared expert).
func FP8DeviceCases() map[string]setup.Config {
	base := FP8Config("alltoall")
	base.Device = "cuda"
	odd := base
	odd.Hidden = 384
	sig := base
	sig.Score, sig.Groups, sig.GroupTopK, sig.TopKScale, sig.SharedExperts = "sigmoid", 4, 2, 2.5, 1
	sig.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.2}
	one := base
	one.EP = 1
	fe := base // skewed, so that phase 2 moves packed rows to helpers
	fe.Dispatcher, fe.FeplbBase, fe.Domain, fe.Routing = "feplb", "alltoall", 2, setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}
	he := base // hybridep: pack, dispatch and permute move the packed rows
	he.Dispatcher, he.SMs = "hybridep", 16
	he2 := he // two domains: the inter-domain path (pack, exchange) moves them too
	he2.Domain = 2
	de := base // deepep: its dispatch's rings, receive rows and permute move the packed rows
	de.Dispatcher, de.SMs = "deepep", 2
	de384 := de // packed rows of 396 bytes padded to 400, skewed, a shared expert
	de384.Hidden, de384.SharedExperts, de384.Routing = 384, 1, setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.2}
	return map[string]setup.Config{"alltoall": base, "alltoall-h384": odd, "alltoall-sigmoid-shared": sig, "alltoall-ep1": one, "feplb": fe,
		"hybridep": he, "hybridep-domain2": he2, "deepep": de, "deepep-h384-shared": de384}
}
