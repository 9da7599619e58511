package harnesstest

import (
	"testing"

	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels/device"
)

// HybridEPLayouts are the EP sizes, domains (0: one) and devices of the
// device tests on Emu: ranks packed on fewer devices in one domain, one
// Emu per rank across domains (the emulated NCCL needs a device per rank).
var HybridEPLayouts = []struct{ Ep, Domain, Devs int }{{2, 0, 1}, {2, 1, 2}, {4, 0, 2}, {4, 2, 4}, {8, 0, 3}, {8, 4, 8}, {8, 2, 8}}

// HybridEPConfig is the small layer with hybridep on the cuda device,
// routing of kind (balanced, skewed or a trace).
func HybridEPConfig(t *testing.T, ep, domain int, kind string) setup.Config {
	c := Small()
	c.Device, c.EP, c.Domain, c.Dispatcher, c.SMs = "cuda", ep, domain, "hybridep", 2
	switch kind {
	case "skewed":
		c.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}
	case "trace":
		c.Routing = setup.Routing{Kind: setup.RoutingTrace, File: WriteTrace(t, "1 7 12 3\n2 3 6 8\n15 14 13 0\n4 5 6 7\n")}
	}
	return c
}

// TheseDevices opens devs as a run's devices.
func TheseDevices(devs []device.Device) func(n, most int) ([]device.Device, error) {
	return func(int, int) ([]device.Device, error) { return devs, nil }
}
