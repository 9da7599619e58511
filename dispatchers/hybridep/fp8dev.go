package hybridep

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
)

// FP8Unavailable: HybridEP's FP8 dispatch (use_fp8) is not wired on the
// cuda device in this build: hybridep.cu's pack, dispatch, permute and
// combine share one MB_HE_HIDDEN row width, and the packed fp8 row the device
// layer dispatches (Shape.DispatchHidden) needs the dispatch's own width,
// a kernel change left for later (docs/fp8.md). Below hidden % 512 it is
// unavailable as on the host.
func (d *Device) FP8Unavailable(env dispatchers.Env) string {
	if env.Hidden%512 != 0 {
		return fmt.Sprintf("HybridEP's FP8 dispatch needs hidden a multiple of 512 (BufferConfig.is_valid); hidden is %d", env.Hidden)
	}
	return "hybridep's FP8 dispatch is not wired on the cuda device in this build: hybridep.cu's pack, dispatch, permute and combine " +
		"share one MB_HE_HIDDEN row width, and the packed fp8 rows (hidden e4m3 bytes + hidden/128 fp32 scales) need a dispatch width of " +
		"their own (docs/fp8.md); the host device runs it (--device host)"
}
