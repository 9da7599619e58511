package layer

import (
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/internal/testutil"
	"github.com/moebench/moebench/kernels"
)

// TestQuantizeReusesBuffers: the host fp8 step's quantize phase gives each
// rank the e4m3 values and scales of QuantFP8Rows bit for bit, step after
// step, and after its first step allocates nothing.
func TestQuantizeReusesBuffers(t *testing.T) {
	l, err := NewLayer(harnesstest.FP8Config("alltoall"))
	if err != nil {
		t.Fatal(err)
	}
	for step := range 2 {
		for r, rk := range l.Ranks {
			if err := l.quantize(r); err != nil {
				t.Fatal(err)
			}
			q, s, err := kernels.QuantFP8Rows(l.X[r], l.Cfg.Hidden, false)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]float32, len(q))
			for i, c := range q {
				want[i] = kernels.E4M3ToFloat32(c)
			}
			if !testutil.SameBits(rk.X, want) || !testutil.SameBits(rk.Scales, s) {
				t.Fatalf("step %d, rank %d: Rank.X or Rank.Scales differ from QuantFP8Rows'", step, r)
			}
		}
	}
	if n := testing.AllocsPerRun(10, func() {
		if err := l.quantize(0); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("quantize allocates %v times a step", n)
	}
}
