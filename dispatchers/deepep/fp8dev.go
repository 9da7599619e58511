package deepep

import "github.com/moebench/moebench/dispatchers"

// FP8Unavailable: DeepEP's FP8 dispatch (its (x e4m3, x_scales) tuple) is
// not wired on the cuda device in this build: deepep.cu's dispatch and
// combine size their rows and ring slots with one MB_HIDDEN, and the
// packed fp8 row the device layer dispatches (Shape.DispatchHidden) needs
// the dispatch's own width, a kernel change left for later (docs/fp8.md).
func (d *Device) FP8Unavailable(dispatchers.Env) string {
	return "deepep's FP8 dispatch is not wired on the cuda device in this build: deepep.cu sizes the dispatch's and the combine's rows " +
		"with one MB_HIDDEN, and the packed fp8 rows (hidden e4m3 bytes + hidden/128 fp32 scales) need a dispatch width of their own " +
		"(docs/fp8.md); the host device runs it (--device host)"
}
