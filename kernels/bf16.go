package kernels

import "math"

// RoundBF16 rounds f to the nearest bfloat16 value (round to nearest, ties to
// even) and returns it widened back to float32. NaN stays NaN.
func RoundBF16(f float32) float32 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it quiet and NaN
		return math.Float32frombits((b | 0x00400000) &^ 0xffff)
	}
	b += 0x7fff + (b>>16)&1
	return math.Float32frombits(b &^ 0xffff)
}

// RoundBF16Slice rounds every element of s to bf16 in place.
func RoundBF16Slice(s []float32) {
	for i, v := range s {
		s[i] = RoundBF16(v)
	}
}
