package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
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
			errs := gradErrs(hostGrads(l, RoundBF16Slice, ""), ref)
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

func TestMatMulNNAndTNAddMatchNaive(t *testing.T) {
	g := rand.New(rand.NewPCG(1, 3))
	for _, sz := range [][3]int{{3, 5, 7}, {70, 65, 64}} { // the second takes the parallel path
		m, n, k := sz[0], sz[1], sz[2]
		a, b := randSlice(g, m*k), randSlice(g, k*n)
		c := make([]float64, m*n)
		MatMulNN(c, a, b, m, n, k)
		at := randSlice(g, k*m) // a[k,m] for the transposed product
		acc := randSlice(g, m*n)
		want0 := append([]float64(nil), acc...)
		MatMulTNAdd(acc, at, b, m, n, k)
		for i := range m {
			for j := range n {
				nn, tn := 0.0, want0[i*n+j]
				for p := range k {
					nn += a[i*k+p] * b[p*n+j]
					tn += at[p*m+i] * b[p*n+j]
				}
				if math.Abs(c[i*n+j]-nn) > 1e-12 || math.Abs(acc[i*n+j]-tn) > 1e-12 {
					t.Fatalf("%v: [%d,%d] NN %v want %v, TNAdd %v want %v", sz, i, j, c[i*n+j], nn, acc[i*n+j], tn)
				}
			}
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
	if ExpertWGradBytes(h, f) != 2*(3*h*f*2) {
		t.Errorf("weight gradients %d bytes, want twice the bf16 weights", ExpertWGradBytes(h, f))
	}
	rf, rb := RouterGEMMWork(T, h, 256)
	if rb.FLOPs != 2*rf.FLOPs {
		t.Errorf("router backward %g FLOPs, want twice the forward's %g", rb.FLOPs, rf.FLOPs)
	}
}
