package bench

import (
	_ "github.com/moebench/moebench/dispatchers/all"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
)

// The layers the benchmarks' tests run beyond package harness's
// (harness/internal/harnesstest holds those and the devices).

// sigmoidCase is a cuda layer with sigmoid group-limited routing, skewed,
// and a shared expert.
func sigmoidCase() setup.Config {
	c := harnesstest.Small()
	c.Device = "cuda"
	c.Score, c.Groups, c.GroupTopK, c.TopKScale, c.SharedExperts = "sigmoid", 4, 2, 2.5, 1
	c.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.2}
	return c
}

func init() { harnesstest.RegisterBroken() }
