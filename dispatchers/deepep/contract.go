package deepep

import "github.com/moebench/moebench/dispatchers"

// Capabilities: fp8 as DeepEP moves it, and its buffers.
func (h *Host) Capabilities() dispatchers.Capabilities {
	return dispatchers.Capabilities{FP8: h.FP8Unavailable, Buffers: h.Buffers}
}

// Close has nothing to free on the host.
func (h *Host) Close() error { return nil }

// Capabilities: besides the host's, notify, dispatch and combine are one
// launch per device (Grouped), and the SM-driven kernels' waits can time
// out (Check).
func (d *Device) Capabilities() dispatchers.Capabilities {
	return dispatchers.Capabilities{FP8: d.FP8Unavailable, Buffers: d.Buffers, Grouped: d.Grouped, Check: d.CheckStep}
}
