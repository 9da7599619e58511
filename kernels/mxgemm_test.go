package kernels

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestMXGEMMPathFor(t *testing.T) {
	for _, c := range []struct {
		v, sm int
		ok    bool
		why   string
	}{
		{130000, 90, false, "sm_90 has no MX tensor-core path"}, {130000, 89, false, "sm_89 has no MX"},
		{120900, 80, false, "sm_80 has no MX"}, {120700, 100, false, "no VEC32_UE8M0"},
		{120800, 100, true, "VEC32_UE8M0"}, {130000, 120, true, "sm_120"},
	} {
		ok, why := MXGEMMPathFor(c.v, c.sm)
		if ok != c.ok || !strings.Contains(why, c.why) {
			t.Errorf("MXGEMMPathFor(%d, sm_%d) = %v (%s), want %v (%q)", c.v, c.sm, ok, why, c.ok, c.why)
		}
	}
}

// TestMXScaleByte: every E8M0 byte but NaN survives value and back.
func TestMXScaleByte(t *testing.T) {
	for b := range 255 {
		if got := MXScaleByte(MXScaleValue(uint8(b))); got != uint8(b) {
			t.Fatalf("byte %d: back as %d", b, got)
		}
	}
}

// mxOperands draws m×k activations and n×k weights, blocks of varied
// magnitude, and quantizes both by TE's MXFP8 rule.
func mxOperands(m, n, k int) (a, aS, w, wS []uint8) {
	x, y := make([]float32, m*k), make([]float32, n*k)
	for i := range x {
		x[i] = float32(math.Sin(float64(i)*0.731)) * float32(math.Ldexp(1, i/32%9-4))
	}
	for i := range y {
		y[i] = float32(math.Cos(float64(i)*1.37)) * float32(math.Ldexp(1, -(i/32%5)-3))
	}
	a, aS, w, wS = make([]uint8, len(x)), make([]uint8, len(x)/32), make([]uint8, len(y)), make([]uint8, len(y)/32)
	if err := QuantMXFP8RowsInto(a, aS, x); err != nil {
		panic(err)
	}
	if err := QuantMXFP8RowsInto(w, wS, y); err != nil {
		panic(err)
	}
	return
}

// mxBeyond counts the outputs of MXGEMM on (a, aS') beyond MXGEMMBound of
// the float64 product of the right operands (a, aS), and the worst
// error/bound.
func mxBeyond(m, n, k int, a, aS, aSGEMM, w, wS []uint8, bf16 bool) (int, float64) {
	c := MXGEMM(m, n, k, a, aSGEMM, w, wS)
	ad, wd := DequantMXFP8(a, aS), DequantMXFP8(w, wS)
	beyond, worst := 0, 0.0
	for i := range m {
		for j := range n {
			var ref, abs float64
			for q := range k {
				p := ad[i*k+q] * wd[j*k+q]
				ref, abs = ref+p, abs+math.Abs(p)
			}
			got := float64(c[i*n+j])
			if bf16 {
				got = float64(RoundBF16(c[i*n+j]))
			}
			r := math.Abs(got-ref) / MXGEMMBound(k, abs, bf16, ref)
			worst = max(worst, r)
			if r > 1 {
				beyond++
			}
		}
	}
	return beyond, worst
}

// TestMXGEMM: the emulated MX GEMM holds the derived bound against the
// float64 product of the same quantized operands (fp32 and bf16 out), and
// a scale exponent off by one, the next block's scale or no dequantization
// break it.
func TestMXGEMM(t *testing.T) {
	const m, n, k = 24, 40, 384
	a, aS, w, wS := mxOperands(m, n, k)
	x := make([]float32, m*k)
	for i := range x {
		x[i] = float32(math.Sin(float64(i)*0.731)) * float32(math.Ldexp(1, i/32%9-4))
	}
	q0, s0, _ := QuantMXFP8(x, true)
	if !slices.Equal(q0, a) || !slices.Equal(s0, aS) {
		t.Fatal("QuantMXFP8RowsInto differs from QuantMXFP8(roundUp)")
	}
	for _, bf16 := range []bool{false, true} {
		beyond, worst := mxBeyond(m, n, k, a, aS, aS, w, wS, bf16)
		t.Logf("bf16 out %v: worst error/bound %.3g", bf16, worst)
		if beyond > 0 {
			t.Errorf("bf16 out %v: %d of %d outputs beyond MXGEMMBound (worst %.3g)", bf16, beyond, m*n, worst)
		}
		if worst == 0 {
			t.Errorf("bf16 out %v: every output exact: the test cannot tell a bound from none", bf16)
		}
	}
	// tiny operands: outputs below 2^-126, in bf16's (and fp32's)
	// subnormal range, where half a bf16 ULP is 2^-134, not 2^-8·|c|
	tinyA, tinyW := slices.Clone(aS), slices.Clone(wS)
	for i := range tinyA {
		tinyA[i] -= 100 // aS is 115…123
	}
	for i := range tinyW {
		tinyW[i] -= 40 // wS 112…116
	}
	if c := MXGEMM(m, n, k, a, tinyA, w, tinyW); slices.Max(c) >= 0x1p-126 || slices.Max(c) == 0 {
		t.Fatalf("the tiny operands' largest output is %g, want (0, 2^-126)", slices.Max(c))
	}
	for _, bf16 := range []bool{false, true} {
		if beyond, worst := mxBeyond(m, n, k, a, tinyA, tinyA, w, tinyW, bf16); beyond > 0 {
			t.Errorf("tiny operands, bf16 out %v: %d of %d outputs beyond MXGEMMBound (worst %.3g)", bf16, beyond, m*n, worst)
		}
	}
	off := slices.Clone(aS)
	off[5]++ // one block's exponent off by one
	next := append(slices.Clone(aS[1:]), aS[0])
	none := slices.Repeat([]uint8{127}, len(aS))
	for _, f := range []struct {
		name string
		s    []uint8
	}{{"exponent+1", off}, {"next block", next}, {"no dequantization", none}} {
		beyond, worst := mxBeyond(m, n, k, a, aS, f.s, w, wS, true)
		t.Logf("%s: %d of %d beyond, worst %.3g", f.name, beyond, m*n, worst)
		if beyond == 0 {
			t.Errorf("%s: no output beyond the bound", f.name)
		}
	}
}
