package harnesstest

import (
	"github.com/moebench/moebench/harness/setup"
)

// FP8Config is a small host layer at fp8 with four 1×128 blocks a row
// (hybridep's FP8 needs hidden a multiple of 512).
func FP8Config(dispatcher string) setup.Config {
	c := Small()
	c.Hidden, c.Precision, c.Dispatcher, c.CheckAll = 512, setup.PrecisionFP8, dispatcher, true
	return c
}

// FP8Movers are the dispatchers whose host path moves FP8 rows, each with
// the NVLink domain size it runs with (hybridep's inter-domain path too).
var FP8Movers = []struct {
	Name   string
	Domain int
}{{"alltoall", 0}, {"deepep", 0}, {"hybridep", 0}, {"hybridep", 2}, {"feplb", 2}}
