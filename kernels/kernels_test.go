package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestRoundBF16(t *testing.T) {
	cases := []struct{ in, want float32 }{
		{1, 1},
		{1 + 1.0/512, 1},                      // exactly half an ulp above 1: tie → even (1)
		{1 + 3.0/512, 1 + 4.0/512},            // tie between 1+2/512 (odd) and 1+4/512 (even)
		{1 + 1.0/256 + 1.0/4096, 1 + 1.0/128}, // above the tie: rounds up
		{-2.5, -2.5},
	}
	for _, c := range cases {
		if got := RoundBF16(c.in); got != c.want {
			t.Errorf("RoundBF16(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if !math.IsNaN(float64(RoundBF16(float32(math.NaN())))) {
		t.Error("NaN did not stay NaN")
	}
	g := rand.New(rand.NewPCG(7, 8))
	for range 10000 {
		x := float32(g.NormFloat64() * math.Pow(10, float64(g.IntN(20)-10)))
		r := RoundBF16(x)
		if math.Float32bits(r)&0xffff != 0 || math.Abs(float64(r-x)) > math.Abs(float64(x))/256 {
			t.Fatalf("RoundBF16(%v) = %v: not a bf16 value within half an ulp", x, r)
		}
	}
}

func randSlice(g *rand.Rand, n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = g.NormFloat64()
	}
	return s
}

func TestMatMulNTMatchesNaive(t *testing.T) {
	g := rand.New(rand.NewPCG(1, 2))
	for _, sz := range [][3]int{{3, 5, 7}, {70, 65, 64}} {
		t.Run(fmt.Sprintf("%dx%dx%d", sz[0], sz[1], sz[2]), func(t *testing.T) { // the second takes the parallel path
			m, n, k := sz[0], sz[1], sz[2]
			a, b := randSlice(g, m*k), randSlice(g, n*k)
			c := make([]float64, m*n)
			MatMulNT(c, a, b, m, n, k)
			for i := range m {
				for j := range n {
					want := 0.0
					for p := range k {
						want += a[i*k+p] * b[j*k+p]
					}
					if math.Abs(c[i*n+j]-want) > 1e-12 {
						t.Fatalf("%v: c[%d,%d] = %v, want %v", sz, i, j, c[i*n+j], want)
					}
				}
			}
		})
	}
}

func TestRouterSoftmax(t *testing.T) {
	c := RouterConfig{Experts: 6, TopK: 2, Score: ScoreSoftmax}
	logits := []float64{0.1, 2, -1, 1.5, 0.3, 1.9}
	idx := c.Select(c.SelectionScores(logits))
	if !slices.Equal(idx, []int32{1, 5}) {
		t.Fatalf("selected %v, want [1 5]", idx)
	}
	p := c.Probs(logits, idx)
	e := math.Exp(1.9 - 2)
	if math.Abs(p[0]-1/(1+e)) > 1e-15 || math.Abs(p[1]-e/(1+e)) > 1e-15 {
		t.Errorf("probs %v, want softmax over the two selected logits", p)
	}
}

// TestRouterPreSoftmax: with pre-softmax the chosen experts are the top-k
// of the softmax over all experts and keep their values of it (×scale), not
// renormalised; with k = 1 the probability is below 1.
func TestRouterPreSoftmax(t *testing.T) {
	logits := []float64{0.1, 2, -1, 1.5, 0.3, 1.9}
	sum := 0.0
	for _, l := range logits {
		sum += math.Exp(l)
	}
	for _, k := range []int{1, 2} {
		t.Run(fmt.Sprintf("top%d", k), func(t *testing.T) {
			t.Parallel()
			c := RouterConfig{Experts: 6, TopK: k, Score: ScoreSoftmax, Scale: 2, PreSoftmax: true}
			idx := c.Select(c.SelectionScores(logits))
			if want := []int32{1, 5}[:k]; !slices.Equal(idx, want) {
				t.Fatalf("k %d: selected %v, want %v", k, idx, want)
			}
			for i, p := range c.Probs(logits, idx) {
				if want := 2 * math.Exp(logits[idx[i]]) / sum; math.Abs(p-want) > 1e-15 {
					t.Errorf("k %d: prob of expert %d %v, want %v (softmax over all experts × scale)", k, idx[i], p, want)
				}
			}
		})
	}
	// group scores sum softmax values, not logits: group 0 {3, -5} has the
	// smaller logit sum (-2 < 2) but the larger softmax sum (e³ > 2e)
	c := RouterConfig{Experts: 4, TopK: 2, Score: ScoreSoftmax, Groups: 2, GroupTopK: 1, PreSoftmax: true}
	if idx := c.Select(c.SelectionScores([]float64{3, -5, 1, 1})); !slices.Equal(idx, []int32{0, 1}) {
		t.Errorf("grouped pre-softmax selected %v, want group 0's [0 1]", idx)
	}
}

func TestRouterSigmoidBiasScale(t *testing.T) {
	// the bias moves expert 2 into the top-2 but its prob uses the unbiased score
	c := RouterConfig{Experts: 4, TopK: 2, Score: ScoreSigmoid, Bias: []float32{0, 0, 0.5, 0}, Scale: 2.5}
	logits := []float64{1, 0.5, 0, 0.8}
	idx := c.Select(c.SelectionScores(logits))
	if !slices.Equal(idx, []int32{2, 0}) { // biased scores: 0.5+0.5 > sigmoid(1)
		t.Fatalf("selected %v, want [2 0]", idx)
	}
	p := c.Probs(logits, idx)
	s0, s2 := sigmoid(1), sigmoid(0)
	if math.Abs(p[1]-2.5*s0/(s0+s2)) > 1e-15 || math.Abs(p[0]+p[1]-2.5) > 1e-12 {
		t.Errorf("probs %v: want unbiased sigmoids renormalised and scaled to sum 2.5", p)
	}
}

func TestRouterGroupLimited(t *testing.T) {
	// 4 groups of 2, topk 2 from 1 group: a group's score is the sum of its
	// top topk/topk-groups = 2 scores, so group 1 (5.7) beats group 0 (-2)
	// although group 0 holds the best single expert.
	c := RouterConfig{Experts: 8, TopK: 2, Score: ScoreSoftmax, Groups: 4, GroupTopK: 1}
	logits := []float64{3, -5, 2.9, 2.8, 0, 0, 0, 0}
	idx := c.Select(c.SelectionScores(logits))
	if !slices.Equal(idx, []int32{2, 3}) {
		t.Fatalf("selected %v, want group 1's experts [2 3]", idx)
	}
	// topk 4 from 2 groups, group scores = top-2 sums: g0 -2, g1 5.7, g2 1.9, g3 -7
	c = RouterConfig{Experts: 8, TopK: 4, Score: ScoreSoftmax, Groups: 4, GroupTopK: 2}
	logits = []float64{3, -5, 2.9, 2.8, 1, 0.9, 2, -9}
	idx = c.Select(c.SelectionScores(logits))
	if !slices.Equal(idx, []int32{2, 3, 4, 5}) {
		t.Fatalf("selected %v, want [2 3 4 5] (groups 1 and 2)", idx)
	}
	if err := c.Feasible([]int32{0, 2, 4, 6}); err == nil {
		t.Error("a choice spanning 4 groups was accepted with topk-groups 2")
	}
	g := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		if err := c.Feasible(c.Select(c.SelectionScores(randSlice(g, 8)))); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPermuteUnpermuteInverse(t *testing.T) {
	g := rand.New(rand.NewPCG(5, 6))
	const T, k, E, h = 50, 3, 7, 4
	idx := make([]int32, T*k)
	for tok := range T {
		for j, e := range g.Perm(E)[:k] {
			idx[tok*k+j] = int32(e)
		}
	}
	slots, counts := PermuteOrder(idx, T, k, E, nil, nil)
	// expert-major, token order kept within an expert
	at := 0
	for e, n := range counts {
		for i := at; i < at+n; i++ {
			if idx[slots[i]] != int32(e) || (i > at && slots[i] <= slots[i-1]) {
				t.Fatalf("row %d: slot %d (expert %d) out of expert-major stable order", i, slots[i], idx[slots[i]])
			}
		}
		at += n
	}
	x := make([]float64, T*h)
	for i := range x {
		x[i] = g.NormFloat64()
	}
	perm := make([]float64, T*k*h)
	GatherRows(perm, x, slots, k, h)
	back := make([]float64, T*h)
	ScatterAddRows(back, perm, slots, k, h)
	for i := range x {
		if math.Abs(back[i]-k*x[i]) > 1e-12 {
			t.Fatalf("unpermute(permute(x))[%d] = %v, want k·x = %v", i, back[i], k*x[i])
		}
	}
}

func TestSwiGLUProb(t *testing.T) {
	h1 := []float64{1, -2, 3, 0.5} // n=1, f=2: gate [1 -2], up [3 0.5]
	act := make([]float64, 2)
	SwiGLUProb(act, h1, []float64{0.25}, 1, 2)
	silu := func(x float64) float64 { return x / (1 + math.Exp(-x)) }
	want := []float64{silu(1) * 3 * 0.25, silu(-2) * 0.5 * 0.25}
	for i := range want {
		if math.Abs(act[i]-want[i]) > 1e-15 {
			t.Errorf("act[%d] = %v, want %v", i, act[i], want[i])
		}
	}
}
