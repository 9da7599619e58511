package hybridep

import "github.com/moebench/moebench/dispatchers"

// Capabilities: fp8 as HybridEP moves it, and its buffers.
func (h *Host) Capabilities() dispatchers.Capabilities {
	return dispatchers.Capabilities{FP8: h.FP8Unavailable, Buffers: h.Buffers}
}

// Close has nothing to free on the host.
func (h *Host) Close() error { return nil }

// Capabilities: besides the host's, every step but the experts is one
// launch per device (Grouped), the SM-driven kernels' waits can time out
// (Check), the inter-domain path may be NCCL's (Transport), and the
// preprocessing and permute launches have budgets of their own.
func (d *Device) Capabilities() dispatchers.Capabilities {
	return dispatchers.Capabilities{FP8: d.FP8Unavailable, Buffers: d.Buffers, Grouped: d.Grouped, Check: d.CheckStep,
		Transport: d.Transport, LaunchBudgets: d.LaunchBudgets}
}
