package summary

import (
	"slices"
	"testing"
)

// TestPhaseAndStraggler: a phase's per-iteration value is its slowest
// rank's, its per-rank value each rank's median; a straggler is max−mean
// and max/mean−1.
func TestPhaseAndStraggler(t *testing.T) {
	p := Phase("dispatch", [][]float64{{1, 3, 2}, {2, 2, 5}})
	if !slices.Equal(p.Samples, []float64{2, 3, 5}) || !slices.Equal(p.PerRank, []float64{2, 2}) || p.P50 != 3 || p.RankMin != 2 || p.RankMax != 2 {
		t.Errorf("Phase: samples %v per rank %v p50 %g rank min/max %g/%g", p.Samples, p.PerRank, p.P50, p.RankMin, p.RankMax)
	}
	if s := Straggler([]float64{1, 3}); s.Abs != 1 || s.Rel != 0.5 {
		t.Errorf("Straggler(1, 3) = %g abs, %g rel; want 1, 0.5", s.Abs, s.Rel)
	}
	if s := Straggler([]float64{0, 0}); s.Abs != 0 || s.Rel != 0 {
		t.Errorf("Straggler(0, 0) = %g abs, %g rel; want 0, 0", s.Abs, s.Rel)
	}
}
