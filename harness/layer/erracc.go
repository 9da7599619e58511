package layer

import (
	"math"
)

// MaxErrAccumulator accumulates GradErrMetric's max|g − ref| and max|ref|; a NaN
// makes the error infinite.
type MaxErrAccumulator struct{ Diff, Ref float64 }

// Add adds got's differences from ref; nil got is zeros (the weight
// gradients of an expert no segment added to, where the layer does not
// hold them all).
func (a *MaxErrAccumulator) Add(got []float32, ref []float64) {
	if got != nil && len(got) != len(ref) {
		a.Diff = math.Inf(1)
		return
	}
	for i, r := range ref {
		var v float64
		if got != nil {
			v = float64(got[i])
		}
		d := math.Abs(v - r)
		if math.IsNaN(d) {
			d = math.Inf(1)
		}
		a.Diff, a.Ref = math.Max(a.Diff, d), math.Max(a.Ref, math.Abs(r))
	}
}

// Merge adds b's maxima to a's.
func (a *MaxErrAccumulator) Merge(b MaxErrAccumulator) {
	a.Diff, a.Ref = math.Max(a.Diff, b.Diff), math.Max(a.Ref, b.Ref)
}

// Err is the tensor's error: max|g − ref| / max|ref|, or max|g| when the
// reference is all zeros (a gradient that must vanish).
func (a MaxErrAccumulator) Err() float64 {
	if a.Ref == 0 {
		return a.Diff
	}
	return a.Diff / a.Ref
}
