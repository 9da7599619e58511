package harnesstest

import (
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
)

// DeepEPDevice is a small deepep layer on the cuda device at EP ep with
// routing (balanced, skewed or trace) and a shared expert.
func DeepEPDevice(t *testing.T, ep int, routing string) setup.Config {
	c := Small()
	c.Device, c.Dispatcher, c.EP, c.SMs, c.SharedExperts = "cuda", "deepep", ep, 2, 1
	c.Tokens, c.Hidden, c.FFN = 24, 32, 16
	switch routing {
	case "skewed":
		c.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}
	case "trace":
		c.Routing = setup.Routing{Kind: setup.RoutingTrace, File: WriteTrace(t, "1 7 12 3\n2 3 6 8\n15 14 13 0\n4 5 6 7\n")}
	default:
		c.Routing = setup.Routing{Kind: setup.RoutingBalanced}
	}
	return c
}

// CheckFails is a device dispatcher whose kernels report err after every
// step (as deepep's CheckStep does when a wait gave up).
type CheckFails struct {
	dispatchers.DeviceDispatcher
	Err error
}

func (c CheckFails) Capabilities() dispatchers.Capabilities {
	caps := c.DeviceDispatcher.Capabilities()
	caps.Check = func() error { return c.Err }
	return caps
}
