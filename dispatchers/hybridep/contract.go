package hybridep

import "github.com/moebench/moebench/dispatchers"

// Capabilities: fp8 as HybridEP moves it (mxfp8: why not), and its
// buffers.
func (h *Host) Capabilities() dispatchers.Capabilities {
	return dispatchers.Capabilities{FP8: h.FP8Unavailable, MXFP8: MXFP8Unavailable, Buffers: h.Buffers}
}

// MXFP8Reason is why HybridEP has no mxfp8 dispatch: its FP8 path
// (use_fp8_dispatch) sizes and moves hidden/128 fp32 scaling factors a
// token (deepseek-ai/DeepEP hybrid-ep, csrc/hybrid_ep/hybrid_ep.cu,
// allocate_buffer_for_dispatch: expert_output_scaling_factor and the
// inter-node group's, hidden_dim/128 floats a token).
const MXFP8Reason = "HybridEP's FP8 dispatch (use_fp8) carries hidden/128 fp32 scaling factors a token (csrc/hybrid_ep/hybrid_ep.cu's " +
	"dispatch buffers): it has no MX layout (one E8M0 scale per 32 elements)"

// MXFP8Unavailable says MXFP8Reason.
func MXFP8Unavailable(dispatchers.Env) string { return MXFP8Reason }

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
