package kernels

import (
	"math"
)

// BF16Bits returns the bf16 bit patterns of v (rounded to nearest even).
func BF16Bits(v []float32) []uint16 {
	out := make([]uint16, len(v))
	for i, x := range v {
		out[i] = uint16(math.Float32bits(RoundBF16(x)) >> 16)
	}
	return out
}

// FromBF16Bits widens bf16 bit patterns to float32.
func FromBF16Bits(b []uint16) []float32 {
	out := make([]float32, len(b))
	for i, x := range b {
		out[i] = math.Float32frombits(uint32(x) << 16)
	}
	return out
}
