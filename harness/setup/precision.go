package setup

import (
	"github.com/moebench/moebench/dispatchers"
)

// Precisions are Config.Precision's values.
const (
	PrecisionBF16  = dispatchers.PrecisionBF16
	PrecisionFP8   = dispatchers.PrecisionFP8   // Hopper's blockwise recipe: e4m3 activations with one fp32 scale per 1×128 block, e4m3 weights in 128×128 blocks
	PrecisionMXFP8 = dispatchers.PrecisionMXFP8 // Blackwell's: e4m3 with one e8m0 scale per 32 elements
)

// Precisions lists the values of --precision, the default first.
var Precisions = []string{PrecisionBF16, PrecisionFP8, PrecisionMXFP8}

// ResolvedPrecision is c.Precision, bf16 where unset.
func (c Config) ResolvedPrecision() string {
	if c.Precision == "" {
		return PrecisionBF16
	}
	return c.Precision
}

// IsFP8 says whether the layer runs at fp8.
func (c Config) IsFP8() bool { return c.ResolvedPrecision() == PrecisionFP8 }

// IsMXFP8 says whether the layer runs at mxfp8 (the host device only:
// docs/fp8.md "mxfp8 on the host device").
func (c Config) IsMXFP8() bool { return c.ResolvedPrecision() == PrecisionMXFP8 }

// IsQuantized says whether the layer quantizes its dispatch and expert
// operands (fp8 or mxfp8).
func (c Config) IsQuantized() bool { return c.IsFP8() || c.IsMXFP8() }
