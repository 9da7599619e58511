package harnesstest

import (
	"math"
)

// LargestDiff is the largest difference between two layers' outputs, and
// the largest magnitude of the second's.
func LargestDiff(got, want [][]float32) (diff, ref float64) {
	for r := range want {
		for i, v := range got[r] {
			diff = math.Max(diff, math.Abs(float64(v-want[r][i])))
			ref = math.Max(ref, math.Abs(float64(want[r][i])))
		}
	}
	return diff, ref
}
