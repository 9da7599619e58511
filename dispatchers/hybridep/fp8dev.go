package hybridep

import "github.com/moebench/moebench/dispatchers"

// FP8Unavailable: at fp8 (HybridEP's use_fp8) the forward's pack,
// dispatch, inter-domain path and permute move packed rows (each row's
// e4m3 values and its 1×128 fp32 multipliers, Shape.DispatchHidden wide:
// hybridep.cu's MB_HE_DHIDDEN), in the buffers the bf16 rows use; the
// combine and the backward stay bf16. Below hidden % 512 it is unavailable
// as on the host.
func (d *Device) FP8Unavailable(env dispatchers.Env) string {
	return fp8Hidden(env.Hidden)
}
