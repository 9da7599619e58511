package harness

import (
	"fmt"
	"strings"

	"github.com/moebench/moebench/harness/setup"
)

// The host memory of a run: what it holds at its peak, estimated before it
// starts (HostBytes), so that a layer that does not fit is refused with the
// reason instead of dying half-way, and so that the command can bound Go's
// heap to it (debug.SetMemoryLimit): without a bound, Go lets garbage grow
// to the live heap's size again before it collects.

// checkHostMemory refuses a run that would not fit in the memory the
// system reports as available (MemAvailable), naming its largest parts.
func checkHostMemory(cfg setup.Config) error {
	mode := cfg.ResolvedHostExperts()
	need := float64(setup.HostBytesForExpertMode(cfg, mode))
	avail, ok := setup.MemAvailable()
	if !ok || setup.FitsMemory(need, avail) {
		return nil
	}
	var parts []string
	for _, p := range setup.MemParts(cfg, mode) {
		if p.Bytes >= 0.05*need {
			parts = append(parts, fmt.Sprintf("%s %.1f GiB", p.Name, p.Bytes/(1<<30)))
		}
	}
	hint := "a smaller --tokens, --experts or --ep"
	if cfg.Device == "host" {
		if mode != setup.HostExpertsDrawn && !setup.DispatcherMovesWeights(cfg) {
			hint += ", --host-experts drawn (the expert weights drawn from the seed when used)"
		}
		if !cfg.ForwardOnly {
			hint += ", --forward-only (no weight gradients, nothing kept for a backward)"
		}
		hint += ", or --device cuda (whose host side holds no expert weights)"
	}
	return fmt.Errorf("%s device: this layer needs about %.1f GiB of host memory (%s), %.1f GiB is available; use %s",
		cfg.Device, need/(1<<30), strings.Join(parts, ", "), avail/(1<<30), hint)
}
