package layer

import (
	"math/rand/v2"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/internal/testutil"
	"github.com/moebench/moebench/kernels"
)

// TestFP8TensorExpertForward: the host's per-tensor path
// (expertForwardFP8Tensor) on a segment of 5 rows, and on one whose
// products split into parallel chunks, gives what the allocating functions
// give (QuantFP8Tensor on the rows and on the bf16 activation, FP8GEMM per
// tensor, bf16 out) bit for bit, and the layer's host footprint counts the
// expert's per-tensor e4m3 weights.
func TestFP8TensorExpertForward(t *testing.T) {
	l, err := NewLayer(harnesstest.FP8Config("alltoall"))
	if err != nil {
		t.Fatal(err)
	}
	h, f := l.Cfg.Hidden, l.Cfg.FFN
	g := rand.New(rand.NewPCG(34, 5))
	rk := l.Ranks[0]
	ew := &rk.Experts[0]
	before := l.fp8Footprint(0)
	for _, n := range []int{5, max(8, kernels.SplitWork/(2*f*h)+1)} {
		x := make([]float32, n*h)
		for i := range x {
			x[i] = kernels.RoundBF16(float32(g.NormFloat64()) * float32(1+i%7))
		}
		rk.ExpertX, rk.ExpertProbs, rk.ExpertY = x, make([]float32, n), make([]float32, n*h)
		for i := range rk.ExpertProbs {
			rk.ExpertProbs[i] = g.Float32()
		}
		gemm := func(m, nn, k int, a []float32, w []float32) []float32 {
			qa, sa := kernels.QuantFP8Tensor(a)
			qw, sw := kernels.QuantFP8Tensor(w)
			out := kernels.FP8GEMM(cuda.FP8Tensor, m, nn, k, qa, []float32{sa}, qw, []float32{sw})
			kernels.RoundBF16Slice(out)
			return out
		}
		h1 := gemm(n, 2*f, h, x, ew.FC1)
		act := make([]float32, n*f)
		kernels.SwiGLUProb(act, h1, rk.ExpertProbs, n, f)
		kernels.RoundBF16Slice(act)
		want := gemm(n, h, f, act, ew.FC2)
		scratch := make([]float32, n*3*f)
		l.expertForwardFP8Tensor(0, 0, 0, n, ew, scratch)
		if !testutil.SameBits(rk.ExpertY, want) || !testutil.SameBits(scratch[:n*2*f], h1) || !testutil.SameBits(scratch[n*2*f:], act) {
			t.Fatalf("%d rows: expertForwardFP8Tensor differs from the allocating functions", n)
		}
	}
	if got := l.fp8Footprint(0) - before; got != int64(3*f*h+8) {
		t.Errorf("the footprint grew by %d bytes with expert 0's per-tensor weights, want %d", got, 3*f*h+8)
	}
}
