package deepep

import "github.com/moebench/moebench/dispatchers"

// FP8Unavailable: at fp8 the caller (the device layer's quantize phase,
// before the dispatch, as DeepEP's callers do) casts each rank's input into
// packed rows — its hidden e4m3 bytes then its hidden/128 fp32 scales,
// Shape.DispatchHidden bf16-sized elements — and the forward dispatch
// moves them (deepep.cu's MB_DE_DHIDDEN: the ring slots, the receive rows
// and the permute's gather at that width; DeepEP's (x, x_scales) in one
// slot); the combine and the backward stay bf16. --precision fp8 already
// requires hidden % 128 == 0, all this needs.
func (d *Device) FP8Unavailable(dispatchers.Env) string { return "" }
