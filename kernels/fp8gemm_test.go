package kernels

import (
	"math"
	"slices"
	"testing"
)

func TestFP8GEMMPathFor(t *testing.T) {
	for _, c := range []struct {
		v, sm int
		want  FP8GEMMPath
	}{
		{130000, 90, FP8GEMMBlock}, {120900, 90, FP8GEMMBlock}, {120800, 90, FP8GEMMTensor},
		{130000, 100, FP8GEMMTensor}, {120900, 89, FP8GEMMTensor}, {111100, 89, FP8GEMMTensor},
		{110702, 90, FP8GEMMDequant}, {110800, 90, FP8GEMMDequant}, {130000, 80, FP8GEMMDequant},
	} {
		if got, why := FP8GEMMPathFor(c.v, c.sm); got != c.want {
			t.Errorf("FP8GEMMPathFor(%d, sm_%d) = %s (%s), want %s", c.v, c.sm, got, why, c.want)
		}
	}
}

// TestQuantFP8RowsK: at k a multiple of 128 QuantFP8RowsK is QuantFP8Rows
// (codes and multipliers); at other k its last block of a row holds the
// k mod 128 values, quantized with their own amax.
func TestQuantFP8RowsK(t *testing.T) {
	x := make([]float32, 3*384)
	for i := range x {
		x[i] = float32(math.Sin(float64(i)*0.37)) * float32(1+i%7)
	}
	q, s := QuantFP8RowsK(x, 3, 384)
	q0, s0, err := QuantFP8Rows(x, 384, false)
	if err != nil || !slices.Equal(q, q0) || !slices.Equal(s, s0) {
		t.Fatalf("k 384: differs from QuantFP8Rows (%v)", err)
	}
	const m, k = 4, 200 // blocks of 128 and 72
	q, s = QuantFP8RowsK(x[:m*k], m, k)
	if len(s) != m*2 {
		t.Fatalf("%d multipliers, want %d", len(s), m*2)
	}
	for i := range m {
		for b, lo := range []int{0, 128} {
			hi := min(k, lo+128)
			blk := x[i*k+lo : i*k+hi]
			wq, ws, _ := QuantFP8Rows(append(slices.Clone(blk), make([]float32, 128-len(blk))...), 128, false)
			if s[i*2+b] != ws[0] || !slices.Equal(q[i*k+lo:i*k+hi], wq[:len(blk)]) {
				t.Fatalf("row %d block %d: differs from the block quantized alone", i, b)
			}
		}
	}
}
