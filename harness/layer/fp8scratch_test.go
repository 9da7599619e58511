package layer

import (
	"math/rand/v2"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/internal/testutil"
	"github.com/moebench/moebench/kernels"
)

// TestFP8ExpertForwardReusesScratch: the host FP8 GEMM path
// (expertForwardFP8 on 5 rows, below kernels.SplitWork, and fp8GEMMRows on
// a product split into parallel chunks) gives what the allocating
// functions give (FP8ActScalesLt, FP8GEMM, QuantFP8RowsK) bit for bit, call
// after call, and expertForwardFP8 allocates nothing once its scratch is
// large enough (not asserted under the race detector, whose sync.Pool
// drops some of what is put back).
func TestFP8ExpertForwardReusesScratch(t *testing.T) {
	l, err := NewLayer(harnesstest.FP8Config("alltoall"))
	if err != nil {
		t.Fatal(err)
	}
	h, f := l.Cfg.Hidden, l.Cfg.FFN
	g := rand.New(rand.NewPCG(34, 4))
	const n = 5
	x := make([]float32, n*h)
	for i := range x {
		x[i] = float32(g.NormFloat64())
	}
	xc, xs := kernels.QuantFP8RowsK(x, n, h)
	run, rk := &l.run[0], l.Ranks[0]
	run.xc, run.xs = xc, xs
	rk.ExpertProbs, rk.ExpertY = make([]float32, n), make([]float32, n*h)
	for i := range rk.ExpertProbs {
		rk.ExpertProbs[i] = g.Float32()
	}
	// the allocating path, as expertForwardFP8 computed it before its scratch
	w := l.fp8Weights(0)
	gemm := func(m, nn, k int, a []uint8, s []float32, wq []uint8, ws []float32) []float32 {
		out := kernels.FP8GEMM(cuda.FP8Block, m, nn, k, a, kernels.FP8ActScalesLt(s, m, k), wq, ws)
		kernels.RoundBF16Slice(out)
		return out
	}
	h1 := gemm(n, 2*f, h, xc, xs, w.q1, w.lt1)
	act := make([]float32, n*f)
	kernels.SwiGLUProb(act, h1, rk.ExpertProbs, n, f)
	kernels.RoundBF16Slice(act)
	q, s := kernels.QuantFP8RowsK(act, n, f)
	want := gemm(n, h, f, q, s, w.q2, w.lt2)
	scratch := make([]float32, n*3*f)
	for call := range 3 {
		clear(rk.ExpertY)
		l.expertForwardFP8(0, w, 0, n, scratch)
		if !testutil.SameBits(rk.ExpertY, want) || !testutil.SameBits(scratch[:n*2*f], h1) || !testutil.SameBits(scratch[n*2*f:], act) {
			t.Fatalf("call %d: expertForwardFP8 differs from the allocating functions", call)
		}
	}
	if allocs := testing.AllocsPerRun(10, func() { l.expertForwardFP8(0, w, 0, n, scratch) }); allocs != 0 && !harnesstest.RaceDetector {
		t.Errorf("expertForwardFP8 allocates %v times a call", allocs)
	}
	// a product split into chunks (m·n·k ≥ SplitWork), each chunk's scratch its own
	m := max(8, kernels.SplitWork/(2*f*h)+1)
	big := make([]float32, m*h)
	for i := range big {
		big[i] = float32(g.NormFloat64())
	}
	bq, bs := kernels.QuantFP8RowsK(big, m, h)
	c := make([]float32, m*2*f)
	for range 2 {
		fp8GEMMRows(c, m, 2*f, h, bq, bs, w.q1, w.lt1)
		if !testutil.SameBits(c, gemm(m, 2*f, h, bq, bs, w.q1, w.lt1)) {
			t.Fatalf("fp8GEMMRows over %d rows differs from FP8GEMM", m)
		}
	}
}
