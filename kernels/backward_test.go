package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// gradCases cover every score function and router option the forward has.
// Shapes are small: these run under -race on two cores.
func gradCases(T, h, f, fs int) []gradCase {
	soft := RouterConfig{Experts: 8, TopK: 2, Score: ScoreSoftmax}
	return []gradCase{
		{name: "softmax top-2", rc: soft, T: T, h: h, f: f},
		{name: "softmax top-1", rc: RouterConfig{Experts: 8, TopK: 1, Score: ScoreSoftmax}, T: T, h: h, f: f, fs: fs},
		{name: "softmax top-3 groups 4/2 scale 2.5 shared", rc: RouterConfig{Experts: 8, TopK: 3, Score: ScoreSoftmax,
			Groups: 4, GroupTopK: 2, Scale: 2.5}, T: T, h: h, f: f, fs: fs},
		{name: "sigmoid+bias top-3 scale 2.5 shared", rc: RouterConfig{Experts: 8, TopK: 3, Score: ScoreSigmoid, Scale: 2.5},
			T: T, h: h, f: f, fs: fs},
		{name: "sigmoid top-1 scale 1.5", rc: RouterConfig{Experts: 8, TopK: 1, Score: ScoreSigmoid, Scale: 1.5}, T: T, h: h, f: f},
		{name: "sigmoid+bias top-4 groups 4/2 scale 2.5 shared, 2 ranks", rc: RouterConfig{Experts: 8, TopK: 4,
			Score: ScoreSigmoid, Groups: 4, GroupTopK: 2, Scale: 2.5}, ranks: 2, T: T, h: h, f: f, fs: fs},
		{name: "softmax top-2 logit override (straight-through)", rc: soft, override: true, T: T, h: h, f: f, fs: fs},
		{name: "sigmoid top-2 given probabilities", rc: RouterConfig{Experts: 8, TopK: 2, Score: ScoreSigmoid},
			fixedProbs: true, T: T, h: h, f: f},
		{name: "pre-softmax top-1 scale 1.5", rc: RouterConfig{Experts: 8, TopK: 1, Score: ScoreSoftmax, PreSoftmax: true, Scale: 1.5},
			T: T, h: h, f: f},
		{name: "pre-softmax top-3 groups 4/2 shared, 2 ranks", rc: RouterConfig{Experts: 8, TopK: 3, Score: ScoreSoftmax, PreSoftmax: true,
			Groups: 4, GroupTopK: 2}, ranks: 2, T: T, h: h, f: f, fs: fs},
		{name: "pre-softmax top-2 logit override (straight-through)", rc: RouterConfig{Experts: 8, TopK: 2, Score: ScoreSoftmax, PreSoftmax: true},
			override: true, T: T, h: h, f: f, fs: fs},
	}
}

func TestHostBackwardMatchesReference(t *testing.T) {
	g := rand.New(rand.NewPCG(11, 24))
	worst := map[string]float64{}
	for seed := range uint64(3) {
		// random small shapes; tokens even so that two ranks split them
		T, h, f, fs := 2*(8+g.IntN(24)), 8+g.IntN(40), 4+g.IntN(28), 4+g.IntN(28)
		for _, c := range gradCases(T, h, f, fs) {
			l := newGradLayer(seed, c)
			ref := ReferenceGrads(l.problem())
			got := hostGrads(l, RoundBF16Slice, "")
			errs := gradErrs(got, ref)
			// Stored as bf16: the input and router weight gradients (B6–B8);
			// kept in fp32: the weight gradients (main_grad) and dprob.
			for name, v := range map[string][]float64{"x": got.X, "router weight": slices.Concat(got.Wr...)} {
				if !allBF16(v) {
					t.Errorf("%s: %s gradient not stored as bf16", c.name, name)
				}
			}
			for name, v := range map[string][]float64{"expert fc1": slices.Concat(got.FC1...), "expert fc2": slices.Concat(got.FC2...), "probs": got.Probs} {
				if allBF16(v) {
					t.Errorf("%s: %s gradient rounded to bf16; Megatron keeps it in fp32", c.name, name)
				}
			}
			for name, e := range errs {
				if e > GradTolerance {
					t.Errorf("%s (seed %d, T %d h %d f %d fs %d): %s gradient error %.3g > %g", c.name, seed, T, h, f, fs, name, e, GradTolerance)
				}
				worst[name] = math.Max(worst[name], e)
			}
		}
	}
	t.Logf("largest error per gradient: %s", fmtErrs(worst))
}

func allBF16(v []float64) bool {
	for _, x := range v {
		if float64(RoundBF16(float32(x))) != x {
			return false
		}
	}
	return true
}

// ExpertBackward rounds to bf16 exactly at B2 (dact), B3 (dh1) and B4 (dx),
// and accumulates the weight gradients from those values unrounded: the
// contract a device's kernels must match bit for bit.
func TestExpertBackwardRoundingPoints(t *testing.T) {
	g := rand.New(rand.NewPCG(4, 24))
	const n, h, f = 9, 24, 12
	bf := func(m int, std float64) []float32 { return f32(bfNormal(g, m, std)) }
	x, dy, fc1, fc2 := bf(n*h, 1), bf(n*h, 1), bf(2*f*h, 0.2), bf(h*f, 0.3)
	prob := f32(randSlice(g, n))
	saved := make([]float32, n*3*f)
	ExpertForward(make([]float32, n*h), x, prob, fc1, fc2, saved, n, h, f, RoundBF16Slice)
	gr := ExpertGrads[float32]{DX: poisoned[float32](n * h), DProb: poisoned[float32](n), DFC1: make([]float32, 2*f*h), DFC2: make([]float32, h*f)}
	ExpertBackward(gr, dy, ExpertTape[float32]{X: x, Prob: prob, Saved: saved}, fc1, fc2, make([]float32, n*3*f), n, h, f, RoundBF16Slice)

	dact, dh1, dprob, dx := make([]float32, n*f), make([]float32, n*2*f), make([]float32, n), make([]float32, n*h)
	MatMulNN(dact, dy, fc2, n, f, h)
	RoundBF16Slice(dact) // B2
	SwiGLUProbBackward(dh1, dprob, dact, saved[:n*2*f], prob, n, f)
	RoundBF16Slice(dh1) // B3
	MatMulNN(dx, dh1, fc1, n, h, 2*f)
	RoundBF16Slice(dx) // B4
	dfc1, dfc2 := make([]float32, 2*f*h), make([]float32, h*f)
	MatMulTNAdd(dfc1, dh1, x, 2*f, h, n)
	MatMulTNAdd(dfc2, dy, saved[n*2*f:], h, f, n)
	for name, p := range map[string][2][]float32{"dx": {gr.DX, dx}, "dprob": {gr.DProb, dprob}, "dFC1": {gr.DFC1, dfc1}, "dFC2": {gr.DFC2, dfc2}} {
		if !slices.Equal(p[0], p[1]) {
			t.Errorf("%s differs from the rounding contract's", name)
		}
	}
}

// Without rounding, in float64, the host backward (batched by expert,
// vector-form score backward) equals the reference (token by token,
// explicit Jacobian) to float64 roundoff: the two compute the same math.
func TestHostBackwardFloat64EqualsReference(t *testing.T) {
	for _, c := range gradCases(12, 10, 6, 8) {
		l := newGradLayer(5, c)
		for name, e := range gradErrs(hostGrads[float64](l, nil, ""), ReferenceGrads(l.problem())) {
			if e > 1e-12 {
				t.Errorf("%s: %s gradient differs by %.3g", c.name, name, e)
			}
		}
	}
}

// Each planted bug fails the float32/bf16 comparison on a layer where it
// matters: the comparison has the power to catch it.
func TestGradCheckCatchesMutations(t *testing.T) {
	cases := gradCases(24, 16, 12, 12)
	layer := cases[5] // sigmoid with groups, scale 2.5 and a shared expert
	for _, mut := range []mutation{mutDropProb, mutSwapGateUp, mutNoScale, mutNoRouterDX, mutNoSharedDX} {
		l := newGradLayer(3, layer)
		errs := gradErrs(hostGrads(l, RoundBF16Slice, mut), ReferenceGrads(l.problem()))
		failed := false
		for _, e := range errs {
			failed = failed || e > GradTolerance
		}
		if !failed {
			t.Errorf("%s passed the check: %s", mut, fmtErrs(errs))
			continue
		}
		t.Logf("%s: %s", mut, fmtErrs(errs))
	}
}

func fmtErrs(errs map[string]float64) string {
	names := make([]string, 0, len(errs))
	for n := range errs {
		names = append(names, n)
	}
	sort.Strings(names)
	s := ""
	for _, n := range names {
		s += fmt.Sprintf("%s %.2e; ", n, errs[n])
	}
	return s
}

// MatMulNN and MatMulTNAdd equal MatMulNT (tested against the naive sum)
// on transposed operands.
func TestMatMulNNAndTNAddMatchNT(t *testing.T) {
	g := rand.New(rand.NewPCG(1, 3))
	transpose := func(a []float64, rows, cols int) []float64 {
		out := make([]float64, len(a))
		for i := range rows {
			for j := range cols {
				out[j*rows+i] = a[i*cols+j]
			}
		}
		return out
	}
	for _, sz := range [][3]int{{3, 5, 7}, {70, 65, 64}} { // the second takes the parallel path
		m, n, k := sz[0], sz[1], sz[2]
		a, b, at := randSlice(g, m*k), randSlice(g, k*n), randSlice(g, k*m)
		nn, nt := make([]float64, m*n), make([]float64, m*n)
		for i := range nn {
			nn[i] = math.NaN() // MatMulNN writes, it does not add
		}
		MatMulNN(nn, a, b, m, n, k)
		MatMulNT(nt, a, transpose(b, k, n), m, n, k)
		acc := randSlice(g, m*n)
		tn := append([]float64(nil), acc...)
		MatMulTNAdd(tn, at, b, m, n, k)
		want := make([]float64, m*n)
		MatMulNT(want, transpose(at, k, m), transpose(b, k, n), m, n, k)
		axpy(want, 1, acc)
		if e := relErr(nn, nt); e > 1e-14 {
			t.Errorf("%v: MatMulNN differs from MatMulNT by %.3g", sz, e)
		}
		if e := relErr(tn, want); e > 1e-14 {
			t.Errorf("%v: MatMulTNAdd differs from c + MatMulNT by %.3g", sz, e)
		}
	}
}

func TestGEMMWorkBackwardIsTwiceForward(t *testing.T) {
	w := ExpertGEMMWork(1000, 7168, 2048)
	if fw, bw := w.Forward().FLOPs, w.Backward().FLOPs; fw != 6*1000*7168*2048 || bw != 2*fw {
		t.Errorf("forward %g, backward %g FLOPs: want 6·n·h·f and twice that", fw, bw)
	}
	if w.DGrad().FLOPs != w.WGrad().FLOPs || w.DGrad().FLOPs+w.WGrad().FLOPs != w.Backward().FLOPs {
		t.Errorf("dgrad %g + wgrad %g != backward %g (or unequal halves)", w.DGrad().FLOPs, w.WGrad().FLOPs, w.Backward().FLOPs)
	}
	// Megatron-Core's count for one MoE layer: 3·2·h·(f·k + fs)·3 per token.
	const T, h, f, k, fs = 4096, 7168, 2048, 8, 2048
	fw, bw := LayerGEMMFLOPs(T*k, T, h, f, fs)
	if want := float64(T) * 3 * 2 * h * (f*k + fs) * 3; math.Abs(fw+bw-want) > 1e-9*want {
		t.Errorf("forward + backward %g FLOPs, Megatron's formula gives %g", fw+bw, want)
	}
	// Bytes: the backward reads and writes more than the forward (fp32 main_grad).
	if w.Backward().Bytes <= w.Forward().Bytes {
		t.Errorf("backward bytes %g not above forward %g", w.Backward().Bytes, w.Forward().Bytes)
	}
	// SavedBytes counts an expert tape (rows, ExpertForward's scratch as
	// bf16, fp32 probabilities) and per token the k fp32 logits and the
	// shared expert's scratch.
	const n, ff = 37, 24
	tape := ExpertTape[float32]{X: make([]float32, n*64), Prob: make([]float32, n), Saved: make([]float32, n*3*ff)}
	want := int64(2*(len(tape.X)+len(tape.Saved)) + 4*len(tape.Prob))
	if got := SavedBytes(n, 0, 64, ff, 0, 8); got != want {
		t.Errorf("SavedBytes of %d copies = %d, the tape holds %d bytes", n, got, want)
	}
	if got, want := SavedBytes(0, 10, 64, ff, 16, 8), int64(10*(4*8+2*3*16)); got != want {
		t.Errorf("SavedBytes of 10 tokens = %d, want %d", got, want)
	}
	pre := RouterConfig{Experts: 64, TopK: 8, Score: ScoreSoftmax, PreSoftmax: true}
	if n := pre.SavedScores(); n != 64 {
		t.Errorf("pre-softmax keeps %d logits a token, want all 64 (its backward reaches every one)", n)
	}
	if pre.PreSoftmax = false; pre.SavedScores() != 8 {
		t.Errorf("softmax after top-k keeps %d logits a token, want the 8 chosen", pre.SavedScores())
	}
	if ExpertWGradBytes(h, f) != 2*(3*h*f*2) {
		t.Errorf("weight gradients %d bytes, want twice the bf16 weights", ExpertWGradBytes(h, f))
	}
	rf, rb := RouterGEMMWork(T, h, 256)
	if rb.FLOPs != 2*rf.FLOPs {
		t.Errorf("router backward %g FLOPs, want twice the forward's %g", rb.FLOPs, rf.FLOPs)
	}
}
