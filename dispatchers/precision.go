package dispatchers

// FP8 dispatch (--precision fp8; issue 34, docs/fp8.md): the layer
// quantizes each rank's rows before the dispatch (e4m3 values in Rank.X,
// one fp32 dequantization multiplier per 1×128 block in Rank.Scales), a
// dispatcher that moves FP8 delivers both (ExpertX and ExpertScales), and
// the expert side dequantizes. The combine stays bf16.

import (
	"fmt"
	"strings"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// Precisions of a run (Env.Precision).
const (
	PrecisionBF16  = "bf16"
	PrecisionFP8   = "fp8"   // e4m3 rows with one fp32 scale per 1×128 block (Hopper's blockwise recipe)
	PrecisionMXFP8 = "mxfp8" // e4m3 with one e8m0 scale per 32 elements (OCP MX; Blackwell)
)

// FP8Block is the elements of a row that share one scale in fp8 dispatch.
const FP8Block = 128

// MXBlock is the elements of a row that share one E8M0 scale in mxfp8
// dispatch (OCP MX: 32).
const MXBlock = kernels.MXBlock

// checkPrecision is New's gate: a design of capabilities c runs at env's
// precision (c.FP8 for fp8, c.MXFP8 for mxfp8), or the *UnavailableError
// that says why not.
func checkPrecision(name, impl string, c Capabilities, env Env) error {
	switch env.Precision {
	case "", PrecisionBF16:
		return nil
	case PrecisionMXFP8:
		switch {
		case env.Device != "host":
			return &UnavailableError{Name: name, Impl: impl, Reason: MXFP8HostOnly}
		case c.MXFP8 == nil:
			return &UnavailableError{Name: name, Impl: impl, Reason: fmt.Sprintf("--precision mxfp8: %s has no MXFP8 dispatch path (e4m3 rows with one E8M0 scale per 32 elements) in this build", name)}
		}
		if why := c.MXFP8(env); why != "" {
			return &UnavailableError{Name: name, Impl: impl, Reason: flagged(PrecisionMXFP8, why)}
		}
		return nil
	case PrecisionFP8:
		ok := c.FP8 != nil
		switch {
		case !ok && impl == ImplLibrary:
			return &UnavailableError{Name: name, Impl: impl, Reason: fmt.Sprintf("%s's library implementation has no FP8 dispatch path in this build; "+
				"moebench does not quantize around a library", name)}
		case !ok && env.Device != "host":
			return &UnavailableError{Name: name, Impl: impl, Reason: fmt.Sprintf("%s's %s implementation on the cuda device has no FP8 dispatch path in this build "+
				"(the quantization kernels exist, kernels/cuda/fp8.cu; the host device runs fp8: --device host)", name, impl)}
		case !ok:
			return &UnavailableError{Name: name, Impl: impl, Reason: fmt.Sprintf("%s has no FP8 dispatch path in this build", name)}
		}
		if why := c.FP8(env); why != "" {
			return &UnavailableError{Name: name, Impl: impl, Reason: flagged(PrecisionFP8, why)}
		}
		return nil
	}
	return fmt.Errorf("unknown precision %q (known: bf16, fp8, mxfp8)", env.Precision)
}

// flagged is a design's reason for refusing precision p, naming the flag
// and its value first (as every refusal does).
func flagged(p, why string) string {
	if strings.HasPrefix(why, "--precision") {
		return why
	}
	return "--precision " + p + ": " + why
}

// MXFP8HostOnly is why mxfp8 is unavailable on the cuda device before
// its GPUs are known (a run names its GPUs' own reason first:
// harness.mxfp8Unavailable, kernels.MXGEMMPathFor).
const MXFP8HostOnly = "--precision mxfp8 runs on the host device only: an MXFP8 GEMM needs an MX tensor-core path, sm_100 (Blackwell) " +
	"or later with cuBLASLt 12.8+ (the VEC32_UE8M0 scale mode); Hopper (sm_90) and earlier have none, and moebench's cuda layer moves " +
	"fp8's 1×128 packed rows only (--device host runs mxfp8, emulated)"

// IsFP8 says whether env's rows move as fp8.
func (e Env) IsFP8() bool { return e.Precision == PrecisionFP8 }

// PrecisionOf is the precision of a design that moves bf16 or fp8 rows
// (fp8 set).
func PrecisionOf(fp8 bool) string {
	if fp8 {
		return PrecisionFP8
	}
	return PrecisionBF16
}

// ScaleBlock is the elements of a row that share one scale at precision
// p: 128 (fp8), 32 (mxfp8); 0 at bf16.
func ScaleBlock(p string) int {
	switch p {
	case PrecisionFP8:
		return FP8Block
	case PrecisionMXFP8:
		return MXBlock
	}
	return 0
}

// scaleBytes is the bytes of one scale at p: fp32 (fp8), E8M0 (mxfp8).
func scaleBytes(p string) int64 {
	if p == PrecisionMXFP8 {
		return 1
	}
	return 4
}

// RowBytes is the bytes of one token row's payload in dispatch at
// precision p: hidden×2 (bf16); hidden e4m3 bytes and hidden/128 fp32
// scales (fp8); hidden e4m3 bytes and hidden/32 E8M0 scales (mxfp8).
func RowBytes(p string, hidden int) int64 {
	if b := ScaleBlock(p); b > 0 {
		return int64(hidden) + int64(hidden/b)*scaleBytes(p)
	}
	return 2 * int64(hidden)
}

// RowFormula says what RowBytes counts at p.
func RowFormula(p string) string {
	switch p {
	case PrecisionFP8:
		return "hidden×1 B e4m3 + hidden/128 × 4 B fp32 scales"
	case PrecisionMXFP8:
		return "hidden×1 B e4m3 + hidden/32 × 1 B E8M0 scales"
	}
	return "hidden×2 B bf16"
}

// ScaleWidth is the scales of one row at p (fp8 or mxfp8). The host
// designs hold each scale as its float32 multiplier (an E8M0 scale as its
// exact power of two) and count its bytes as RowBytes does.
func ScaleWidth(p string, hidden int) int {
	if ScaleBlock(p) == 0 { // bf16: no scales
		return 0
	}
	return hidden / ScaleBlock(p)
}

// FP8Weights are experts' weights as the FP8 GEMM reads them (the layer's
// cublaslt-fp8-block path, docs/fp8.md): e4m3 codes Q1 (fc1, [2f, h]) and
// Q2 (fc2, [h, f]), one byte each, and their 128×128 dequantization
// multipliers S1, S2 (fp32) in cuBLASLt's BLK128x128_32F order,
// FP8WeightScales floats an expert. On a DeviceRank: its L local experts',
// one after another ([L, ·] each); on a DeviceSegment: one expert's.
type FP8Weights struct {
	Q1, Q2, S1, S2 device.Addr
}

// FP8WeightScales is the multipliers (fp32) of one expert's fc1 [2f, h]
// and fc2 [h, f] in BLK128x128_32F's order: ⌈n/128⌉ rows of ld(k) =
// ⌈k/128⌉ rounded up to 4 (the count cuBLASLt's samples allocate;
// internal/cuda.FP8ScaleLayout).
func FP8WeightScales(h, f int) (n1, n2 int) {
	_, n1, _ = cuda.FP8ScaleLayout(0, 2*f, h)
	_, n2, _ = cuda.FP8ScaleLayout(0, h, f)
	return n1, n2
}

// FP8WeightBytes is one expert's weights as the FP8 GEMM reads them: 3·f·h
// e4m3 codes and 4·(n1 + n2) bytes of multipliers (FP8WeightScales) —
// what feplb's phase 2 moves at fp8 (docs/dispatchers/feplb.md), about
// half of bf16's 6·f·h.
func FP8WeightBytes(h, f int) int64 {
	n1, n2 := FP8WeightScales(h, f)
	return 3*int64(f)*int64(h) + 4*int64(n1+n2)
}
