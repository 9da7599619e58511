package deepep

import "github.com/moebench/moebench/dispatchers"

// Capabilities: fp8 as DeepEP moves it (mxfp8: why not), and its buffers.
func (h *Host) Capabilities() dispatchers.Capabilities {
	return dispatchers.Capabilities{FP8: h.FP8Unavailable, MXFP8: MXFP8Unavailable, Buffers: h.Buffers}
}

// MXFP8Reason is why DeepEP has no mxfp8 dispatch: its FP8 dispatch takes
// 1×128 blocks (x_scales fp32 [T, hidden/128]; round_scale/UE8M0 makes
// them powers of two, still one per 128 elements), never MX's 1×32 E8M0
// blocks; moebench does not invent a layout DeepEP does not have.
const MXFP8Reason = "DeepEP's FP8 dispatch carries e4m3 rows with one fp32 scale per 1×128 block (x_scales [tokens, hidden/128]; " +
	"its UE8M0 option rounds those to powers of two, still per 128 elements): it has no MX layout (one E8M0 scale per 32 elements)"

// MXFP8Unavailable says MXFP8Reason (the normal mode; the low-latency
// mode, deepep-ll, quantizes 1×128 too).
func MXFP8Unavailable(dispatchers.Env) string { return MXFP8Reason }

// Close has nothing to free on the host.
func (h *Host) Close() error { return nil }

// Capabilities: besides the host's, notify, dispatch and combine are one
// launch per device (Grouped), and the SM-driven kernels' waits can time
// out (Check).
func (d *Device) Capabilities() dispatchers.Capabilities {
	return dispatchers.Capabilities{FP8: d.FP8Unavailable, Buffers: d.Buffers, Grouped: d.Grouped, Check: d.CheckStep}
}
