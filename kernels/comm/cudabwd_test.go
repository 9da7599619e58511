package comm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// GPU tests of the backward's device operations (devbackward.go), each
// against Emu (the host functions) on the same random inputs, outputs
// poisoned first; they also run on the host simulation
// (TestKernelsOnHostSim). Tolerances, with those of cuda_test.go:
// bf16 results within one unit in the last place (expf and the fp32
// accumulation order); the fp32 sums that a warp computes as a butterfly
// (dprob, the score function's sums) within 2⁻¹⁶ ≈ 1.5e-5 of the sum of
// their terms' magnitudes, a bound a few times the worst fp32 rounding of
// such sums and far under what a wrong term gives; the input gradient's
// adds and main_grad's adds exactly (each is one fp32 add of two values,
// rounded as the host rounds).

func TestGPUBackward(t *testing.T) { checkBackward(openPair(t)) }

func checkBackward(p *gpuPair) {
	checkMatMuls(p)
	checkSwiGLUBackward(p)
	checkScoreBackward(p)
	checkGradAdds(p)
}

// checkMatMuls: the dgrad product (bf16 a · b), the wgrad product added to
// an fp32 main_grad that already holds values, and the fp32 router's two,
// at a misaligned row offset too.
func checkMatMuls(p *gpuPair) {
	t := p.t
	g := rand.New(rand.NewPCG(9, 9))
	for _, tc := range []struct {
		name string
		mm   cuda.MatMul
		skip int // rows of a to start after
	}{
		{"dgrad", cuda.MatMul{M: 70, N: 96, K: 128}, 0},
		{"dgrad misaligned", cuda.MatMul{M: 33, N: 40, K: 24}, 1},
		{"wgrad += ", cuda.MatMul{M: 96, N: 64, K: 77, TransA: true, F32Out: true, Add: true}, 0},
		{"router dx fp32", cuda.MatMul{M: 50, N: 64, K: 40, F32In: true, F32Out: true}, 0},
		{"router dW fp32", cuda.MatMul{M: 40, N: 64, K: 50, TransA: true, F32In: true, F32Out: true}, 0},
	} {
		mm := tc.mm
		operand := func(n int) (device.Addr, device.Addr) {
			if mm.F32In {
				return p.put(randF32(g, n))
			}
			return p.put(randBF16(g, n))
		}
		ca, ea := operand((mm.M + tc.skip) * mm.K)
		cb, eb := operand(mm.K * mm.N)
		var cc, ec device.Addr
		if mm.F32Out {
			cc, ec = p.put(randF32(g, mm.M*mm.N)) // main_grad's values: the product adds to them
		} else {
			cc, ec = p.out(mm.M * mm.N)
		}
		w := 2
		if mm.F32In {
			w = 4
		}
		off := device.Addr(w * tc.skip * mm.K)
		p.ok(p.c.MatMul(device.MatMul{C: cc, A: ca + off, B: cb, MatMul: mm}, p.cs))
		p.ok(p.e.MatMul(device.MatMul{C: ec, A: ea + off, B: eb, MatMul: mm}, p.es))
		if !mm.F32Out {
			gpu, host := get[uint16](p, cc, ec, mm.M*mm.N)
			sameULP(t, tc.name, gpu, host)
			continue
		}
		gpu, host := get[float32](p, cc, ec, mm.M*mm.N)
		big := 0.0
		for _, v := range host {
			big = math.Max(big, math.Abs(float64(v)))
		}
		for i := range host {
			if d := math.Abs(float64(gpu[i] - host[i])); !(d <= 1e-5*big*math.Sqrt(float64(mm.K))) {
				t.Fatalf("%s [%d] = %v, host %v", tc.name, i, gpu[i], host[i])
			}
		}
	}
}

// checkSwiGLUBackward: dh1 and dprob of rows of 16-byte vectors and of
// single columns (ffn % 8 ≠ 0), with and without probabilities.
func checkSwiGLUBackward(p *gpuPair) {
	t := p.t
	g := rand.New(rand.NewPCG(10, 10))
	const n = 97
	for _, f := range []int{256, 36} {
		h1, dact, prob := randBF16(g, n*2*f), randBF16(g, n*f), randF32(g, n)
		ch, eh := p.put(h1)
		cd, ed := p.put(dact)
		cp, ep := p.put(prob)
		for _, withProb := range []bool{true, false} {
			cpp, epp := cp, ep
			if !withProb {
				cpp, epp = 0, 0
			}
			co, eo := p.out(n * 2 * f)
			cdp, edp := p.out(2 * n)
			p.ok(p.c.SwiGLUBackward(co, cdp, cd, ch, cpp, n, f, p.cs))
			p.ok(p.e.SwiGLUBackward(eo, edp, ed, eh, epp, n, f, p.es))
			gpu, host := get[uint16](p, co, eo, n*2*f)
			sameULP(t, fmt.Sprintf("swiglu backward dh1 (ffn %d, prob %v)", f, withProb), gpu, host)
			gdp, hdp := get[float32](p, cdp, edp, n)
			if !withProb {
				if math.Float32bits(gdp[0]) != 0x7fc07fc0 {
					t.Errorf("dprob written without probabilities: %v", gdp[0])
				}
				continue
			}
			hv, dv := kernels.FromBF16Bits(h1), kernels.FromBF16Bits(dact)
			for i := range n {
				mag := 0.0 // Σ |silu(g)·u·dact| of the row
				for j := range f {
					x := float64(hv[i*2*f+j])
					mag += math.Abs(x / (1 + math.Exp(-x)) * float64(hv[i*2*f+f+j]) * float64(dv[i*f+j]))
				}
				if d := math.Abs(float64(gdp[i] - hdp[i])); !(d <= 0x1p-16*mag) {
					t.Fatalf("dprob[%d] (ffn %d) = %v, host %v (terms' magnitude %.3g)", i, f, gdp[i], hdp[i], mag)
				}
			}
		}
	}
}

// checkScoreBackward: every router configuration of the forward's tests,
// on the host's choice of experts (Route) for random logits.
func checkScoreBackward(p *gpuPair) {
	t := p.t
	g := rand.New(rand.NewPCG(11, 11))
	const T = 300
	for name, rc := range checkedRouterCases(t) {
		E, k := rc.Experts, rc.TopK
		logits, dprobs := randF32(g, T*E), randF32(g, T*k)
		idx, probs := make([]int32, T*k), make([]float32, T*k)
		if rc.Score == kernels.ScoreSigmoid {
			rc.Bias = make([]float32, E)
			for i := range rc.Bias {
				rc.Bias[i] = float32(0.01 * g.NormFloat64())
			}
		}
		kernels.Route(rc, logits, T, idx, probs)
		cl, el := p.put(logits)
		cd, ed := p.put(dprobs)
		ci, ei := p.put(idx)
		co, eo := p.out(2 * T * E)
		p.ok(p.c.ScoreBackward(rc, co, cl, cd, ci, T, p.cs))
		p.ok(p.e.ScoreBackward(rc, eo, el, ed, ei, T, p.es))
		gpu, host := get[float32](p, co, eo, T*E)
		scale := rc.Scale
		for tok := range T {
			mag := 0.0 // the row's gradient terms: |g| summed, times its largest |dz| scale
			for j := range k {
				mag += math.Abs(scale * float64(dprobs[tok*k+j]))
			}
			for e := range E {
				i := tok*E + e
				if d := math.Abs(float64(gpu[i] - host[i])); !(d <= 0x1p-16*mag) {
					t.Fatalf("%s token %d expert %d: dlogit %v, host %v", name, tok, e, gpu[i], host[i])
				}
			}
		}
	}
}

// checkGradAdds: the input gradient's three parts in each combination, and
// main_grad's adds with and without rounding, over lengths with a tail
// past the last whole vector; both exact.
func checkGradAdds(p *gpuPair) {
	t := p.t
	g := rand.New(rand.NewPCG(12, 12))
	const n = 8*37 + 5
	dperm, drouter, dshared := randBF16(g, n), randF32(g, n), randBF16(g, n)
	cp, ep := p.put(dperm)
	cr, er := p.put(drouter)
	cs, es := p.put(dshared)
	for _, parts := range [][2]bool{{true, true}, {true, false}, {false, true}, {false, false}} {
		r1, r2, s1, s2 := cr, er, cs, es
		if !parts[0] {
			r1, r2 = 0, 0
		}
		if !parts[1] {
			s1, s2 = 0, 0
		}
		co, eo := p.out(n)
		p.ok(p.c.InputGrad(co, cp, r1, s1, n, p.cs))
		p.ok(p.e.InputGrad(eo, ep, r2, s2, n, p.es))
		gpu, host := get[uint16](p, co, eo, n)
		same(t, fmt.Sprintf("input gradient (router %v, shared %v)", parts[0], parts[1]), gpu, host)
	}
	dst := randF32(g, n)
	for _, round := range []bool{false, true} {
		cd, ed := p.put(dst)
		p.ok(p.c.AddF32(cd, cr, n, round, p.cs))
		p.ok(p.e.AddF32(ed, er, n, round, p.es))
		gpu, host := get[float32](p, cd, ed, n)
		same(t, fmt.Sprintf("main_grad add (round %v)", round), gpu, host)
	}
}
