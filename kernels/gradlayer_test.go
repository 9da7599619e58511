package kernels

import (
	"math"
	"math/rand/v2"
	"slices"
)

// A small random layer for the backward tests, and the layer's backward
// composed from the host functions (one group of ranks, no dispatcher: the
// permute sorts all tokens' copies by expert).

// gradCase is one layer configuration.
type gradCase struct {
	name        string
	rc          RouterConfig
	ranks       int // router weight gradients per rank; 0 = 1
	T, h, f, fs int // tokens (all ranks), hidden, expert ffn, shared ffn (0: none)
	override    bool
	fixedProbs  bool // probabilities given (a trace's): no router gradient
}

// gradLayer holds a case's random bf16 values, widened to float64.
type gradLayer struct {
	gradCase
	x, wr, override, fixed, sfc1, sfc2, dout []float64
	fc1, fc2                                 [][]float64
	idx                                      []int32
}

// bfNormal draws n bf16-rounded N(0, std²) values.
func bfNormal(g *rand.Rand, n int, std float64) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = float64(RoundBF16(float32(g.NormFloat64() * std)))
	}
	return s
}

func newGradLayer(seed uint64, c gradCase) *gradLayer {
	g := rand.New(rand.NewPCG(seed, 24))
	E, k, h, f := c.rc.Experts, c.rc.TopK, c.h, c.f
	if c.ranks == 0 {
		c.ranks = 1
	}
	if c.rc.Score == ScoreSigmoid && c.rc.Bias == nil {
		c.rc.Bias = make([]float32, E)
		for e := range E {
			c.rc.Bias[e] = float32(g.NormFloat64() * 0.1)
		}
	}
	l := &gradLayer{gradCase: c}
	l.x = bfNormal(g, c.T*h, 1)
	l.wr = bfNormal(g, E*h, 1/math.Sqrt(float64(h)))
	for range E {
		l.fc1 = append(l.fc1, bfNormal(g, 2*f*h, 1/math.Sqrt(float64(h))))
		l.fc2 = append(l.fc2, bfNormal(g, h*f, 1/math.Sqrt(float64(f))))
	}
	if c.fs > 0 {
		l.sfc1 = bfNormal(g, 2*c.fs*h, 1/math.Sqrt(float64(h)))
		l.sfc2 = bfNormal(g, h*c.fs, 1/math.Sqrt(float64(c.fs)))
	}
	l.dout = bfNormal(g, c.T*h, 1)
	// The host device's routing: fp32 logits, Route.
	logits := make([]float32, c.T*E)
	if c.override {
		l.override = bfNormal(g, c.T*E, 1)
		for i, v := range l.override {
			logits[i] = float32(v)
		}
	} else {
		MatMulNT(logits, f32(l.x), f32(l.wr), c.T, E, h)
	}
	l.idx = make([]int32, c.T*k)
	Route(c.rc, logits, c.T, l.idx, make([]float32, c.T*k))
	if c.fixedProbs {
		l.fixed = make([]float64, c.T*k)
		for i := range l.fixed {
			l.fixed[i] = float64(float32(0.1 + g.Float64()))
		}
	}
	return l
}

// problem is the layer as ReferenceGrads takes it.
func (l *gradLayer) problem() GradProblem {
	return GradProblem{Router: l.rc, Tokens: l.T, RankTokens: l.T / l.ranks, Hidden: l.h, FFN: l.f, SharedFFN: l.fs,
		X: l.x, Wr: l.wr, Override: l.override, Idx: l.idx, Probs: l.fixed,
		Expert:    func(e int) ([]float64, []float64) { return l.fc1[e], l.fc2[e] },
		SharedFC1: l.sfc1, SharedFC2: l.sfc2, DOut: l.dout}
}

func f32(s []float64) []float32 { return conv[float32](s) }

func conv[F, G Float32Or64](s []G) []F {
	if s == nil {
		return nil
	}
	out := make([]F, len(s))
	for i, v := range s {
		out[i] = F(v)
	}
	return out
}

// mutation names a deliberate bug hostGrads can plant, to show that the
// comparison with the reference catches it ("" plants none).
type mutation string

const (
	mutDropProb   mutation = "the expert backward without the probability (tape.Prob nil)"
	mutSwapGateUp mutation = "gate and up halves of the saved fc1 output swapped"
	mutNoScale    mutation = "score backward without the top-k scaling factor"
	mutNoRouterDX mutation = "input gradient without the router's part"
	mutNoSharedDX mutation = "input gradient without the shared expert's part"
)

// hostGrads runs the layer forward and backward with the host functions in
// F, rounding with round (nil: none), and returns the gradients widened to
// float64 in Grads' layout.
func hostGrads[F Float32Or64](l *gradLayer, round func([]F), mut mutation) Grads {
	c := l.rc
	T, h, f, fs, E, k := l.T, l.h, l.f, l.fs, c.Experts, c.TopK
	x, wr, dout := conv[F](l.x), conv[F](l.wr), conv[F](l.dout)

	// Forward, keeping what the backward needs.
	logits := make([]F, T*E)
	if l.override != nil {
		copy(logits, conv[F](l.override))
	} else {
		MatMulNT(logits, x, wr, T, E, h)
	}
	probs := conv[F](l.fixed)
	if probs == nil {
		probs = make([]F, T*k)
		for t := range T {
			row := conv[float64](logits[t*E : (t+1)*E])
			copy(probs[t*k:], conv[F](c.Probs(row, l.idx[t*k:(t+1)*k])))
		}
	}
	slots, counts := PermuteOrder(l.idx, T, k, E, nil, nil)
	xp, pp, yp := make([]F, T*k*h), make([]F, T*k), make([]F, T*k*h)
	GatherRows(xp, x, slots, k, h)
	GatherRows(pp, probs, slots, 1, 1)
	tapes := make([]ExpertTape[F], E)
	at := 0
	for e, n := range counts {
		tapes[e] = ExpertTape[F]{X: xp[at*h : (at+n)*h], Prob: pp[at : at+n], Saved: make([]F, n*3*f)}
		ExpertForward(yp[at*h:], tapes[e].X, tapes[e].Prob, conv[F](l.fc1[e]), conv[F](l.fc2[e]), tapes[e].Saved, n, h, f, round)
		at += n
	}
	var shared ExpertTape[F]
	if fs > 0 {
		shared = ExpertTape[F]{X: x, Saved: make([]F, T*3*fs)}
		ExpertForward(make([]F, T*h), x, nil, conv[F](l.sfc1), conv[F](l.sfc2), shared.Saved, T, h, fs, round)
	}

	// Backward.
	out := Grads{Probs: make([]float64, T*k), Logits: make([]float64, T*E)}
	// Every buffer a step writes (rather than adds to) starts poisoned.
	dyp, dxp, dpp := poisoned[F](T*k*h), poisoned[F](T*k*h), poisoned[F](T*k)
	UnpermuteBackward(dyp, dout, slots, k, h)
	at = 0
	for e, n := range counts {
		fc1, fc2 := conv[F](l.fc1[e]), conv[F](l.fc2[e])
		gr := ExpertGrads[F]{DX: dxp[at*h:], DProb: dpp[at : at+n], DFC1: make([]F, 2*f*h), DFC2: make([]F, h*f)}
		tape := tapes[e]
		switch mut {
		case mutDropProb:
			tape.Prob = nil
		case mutSwapGateUp:
			for i := range n {
				r := tape.Saved[i*2*f : (i+1)*2*f]
				for j := range f {
					r[j], r[f+j] = r[f+j], r[j]
				}
			}
		}
		ExpertBackward(gr, dyp[at*h:], tape, fc1, fc2, make([]F, n*3*f), n, h, f, round)
		out.FC1, out.FC2 = append(out.FC1, conv[float64](gr.DFC1)), append(out.FC2, conv[float64](gr.DFC2))
		at += n
	}
	dprobs := make([]F, T*k)
	ScatterAddRows(dprobs, dpp, slots, 1, 1)
	out.Probs = conv[float64](dprobs)

	dxr := []F(nil)
	Tr := T / l.ranks
	for r := range l.ranks {
		dwr := make([]F, E*h) // stays zero without router gradient
		if l.fixed == nil {
			dwr = poisoned[F](E * h)
			rc := c
			if mut == mutNoScale {
				rc.Scale = 1
			}
			dlogits := poisoned[F](Tr * E)
			ScoreBackward(rc, dlogits, logits[r*Tr*E:], dprobs[r*Tr*k:], l.idx[r*Tr*k:], Tr)
			dxr = append(dxr, poisoned[F](Tr*h)...)
			RouterBackward(dxr[r*Tr*h:], dwr, dlogits, x[r*Tr*h:], wr, Tr, h, E, round)
			copy(out.Logits[r*Tr*E:], conv[float64](dlogits))
		}
		out.Wr = append(out.Wr, conv[float64](dwr))
	}
	dperm := poisoned[F](T * h)
	PermuteBackward(dperm, dxp, slots, k, h, round)
	var dxs []F
	if fs > 0 {
		gr := ExpertGrads[F]{DX: poisoned[F](T * h), DFC1: make([]F, 2*fs*h), DFC2: make([]F, h*fs)}
		ExpertBackward(gr, dout, shared, conv[F](l.sfc1), conv[F](l.sfc2), make([]F, T*3*fs), T, h, fs, round)
		dxs, out.SharedFC1, out.SharedFC2 = gr.DX, conv[float64](gr.DFC1), conv[float64](gr.DFC2)
	}
	switch mut {
	case mutNoRouterDX:
		dxr = nil
	case mutNoSharedDX:
		dxs = nil
	}
	dx := poisoned[F](T * h)
	InputGrad(dx, dperm, dxr, dxs, round)
	out.X = conv[float64](dx)
	return out
}

func poisoned[F Float32Or64](n int) []F {
	s := make([]F, n)
	for i := range s {
		s[i] = F(math.NaN())
	}
	return s
}

// gradErrs compares got with the reference tensor by tensor: max|got −
// ref| / max|ref| (the forward check's metric), by name. A reference tensor
// that is all zeros is compared absolutely (max|got|).
func gradErrs(got, ref Grads) map[string]float64 {
	flat := func(s [][]float64) []float64 { return slices.Concat(s...) }
	pairs := map[string][2][]float64{
		"x": {got.X, ref.X}, "router weight": {flat(got.Wr), flat(ref.Wr)},
		"expert fc1": {flat(got.FC1), flat(ref.FC1)}, "expert fc2": {flat(got.FC2), flat(ref.FC2)},
		"probs": {got.Probs, ref.Probs}, "logits": {got.Logits, ref.Logits},
	}
	if ref.SharedFC1 != nil {
		pairs["shared fc1"] = [2][]float64{got.SharedFC1, ref.SharedFC1}
		pairs["shared fc2"] = [2][]float64{got.SharedFC2, ref.SharedFC2}
	}
	errs := map[string]float64{}
	for name, p := range pairs {
		errs[name] = relErr(p[0], p[1])
	}
	return errs
}

// relErr is max|a − b| / max|b|, or max|a| when b is all zeros; +Inf when
// the lengths differ or a holds a NaN.
func relErr(a, b []float64) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d, m float64
	for i := range a {
		if math.IsNaN(a[i]) {
			return math.Inf(1)
		}
		d, m = math.Max(d, math.Abs(a[i]-b[i])), math.Max(m, math.Abs(b[i]))
	}
	if m == 0 {
		return d
	}
	return d / m
}
