// Package testutil holds helpers that more than one package's tests use.
package testutil

import "math"

// SameBits reports whether a and b hold the same float32 values bit for
// bit: -0 differs from +0, and a NaN equals only the same NaN.
func SameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}
