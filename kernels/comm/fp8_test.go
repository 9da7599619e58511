package comm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moebench/moebench/kernels"
)

// fp8Rows draws rows of bf16 values (never zero) whose 128-blocks span
// many binades: each block has its own magnitude 2^-30 … 2^12, values
// within it spread over 2^-12 … 1 of it; blocks of amax below 1e-4 (the
// clamp) and near-ties come with them. Block b of the first row is all
// zeros if zeros is set.
func fp8Rows(g *rand.Rand, rows, h int, zeros bool) []float32 {
	x := make([]float32, rows*h)
	for b := 0; b < len(x)/kernels.FP8Block; b++ {
		mag := math.Ldexp(1, g.IntN(43)-30)
		for i := range kernels.FP8Block {
			v := float32(0)
			for v == 0 {
				v = kernels.RoundBF16(float32(mag * math.Ldexp(1+g.Float64(), -g.IntN(13)) * float64(1-2*g.IntN(2))))
			}
			x[b*kernels.FP8Block+i] = v
		}
	}
	if zeros {
		clear(x[:kernels.FP8Block])
	}
	return x
}

// TestFP8RowsBound: every element of 1×128-block quantized rows lies
// within FP8ElemBound of its value, with both scale kinds, and the bound
// is not vacuous: a scale twice too large, the scale of the next block
// (the block boundary shifted by one element) or no dequantization at all
// breaks it.
func TestFP8RowsBound(t *testing.T) {
	g := rand.New(rand.NewPCG(34, 2))
	const rows, h = 64, 512
	x := fp8Rows(g, rows, h, true)
	for _, ue8m0 := range []bool{false, true} {
		q, sc, err := kernels.QuantFP8Rows(x, h, ue8m0)
		if err != nil {
			t.Fatal(err)
		}
		d := kernels.DequantFP8Rows(q, sc)
		worst := 0.0
		for i, v := range x {
			e := math.Abs(float64(v) - float64(d[i]))
			bound := kernels.FP8ElemBound(float64(v), float64(sc[i/kernels.FP8Block]))
			if e > bound {
				t.Fatalf("ue8m0 %v: element %d = %g dequantized to %g: error %g above the bound %g", ue8m0, i, v, d[i], e, bound)
			}
			worst = max(worst, e/bound)
		}
		t.Logf("ue8m0 %v: worst error/bound %.3f", ue8m0, worst)
		// the mutations: each must break the bound somewhere
		for name, deq := range map[string]func(i int) float64{
			"scale ×2": func(i int) float64 { return float64(kernels.E4M3ToFloat32(q[i])) * 2 * float64(sc[i/kernels.FP8Block]) },
			"shifted block": func(i int) float64 {
				return float64(kernels.E4M3ToFloat32(q[i])) * float64(sc[min(len(sc)-1, (i+1)/kernels.FP8Block)])
			},
			"no dequantizing": func(i int) float64 { return float64(kernels.E4M3ToFloat32(q[i])) },
		} {
			broken := 0
			for i, v := range x {
				if math.Abs(float64(v)-deq(i)) > kernels.FP8ElemBound(float64(v), float64(sc[i/kernels.FP8Block])) {
					broken++
				}
			}
			if broken == 0 {
				t.Errorf("ue8m0 %v: %s stays within the bound", ue8m0, name)
			}
		}
	}
	if _, _, err := kernels.QuantFP8Rows(x, 100, false); err == nil {
		t.Error("hidden 100 accepted")
	}
}

// TestFP8DotBound: K-long dot products of 1×128-quantized activations and
// 128×128-quantized weights stay within DotBound of the unquantized
// ones, and a scale ×2, a shifted block or a missing dequantization of
// the activations exceeds it.
func TestFP8DotBound(t *testing.T) {
	g := rand.New(rand.NewPCG(34, 3))
	const m, n, k = 16, 256, 512
	a := fp8Rows(g, m, k, false)
	w := fp8Rows(g, n, k, false)
	qa, sa, _ := kernels.QuantFP8Rows(a, k, false)
	qw, sw, err := kernels.QuantFP8Weight(w, n, k, false)
	if err != nil {
		t.Fatal(err)
	}
	dw := kernels.DequantFP8Weight(qw, sw, n, k)
	bk := k / kernels.FP8Block
	deqA := map[string]func(i int) float64{
		"right":    func(i int) float64 { return float64(kernels.E4M3ToFloat32(qa[i]) * sa[i/kernels.FP8Block]) },
		"scale ×2": func(i int) float64 { return float64(kernels.E4M3ToFloat32(qa[i]) * 2 * sa[i/kernels.FP8Block]) },
		"shifted block": func(i int) float64 {
			return float64(kernels.E4M3ToFloat32(qa[i]) * sa[min(len(sa)-1, (i+1)/kernels.FP8Block)])
		},
		"no dequantizing": func(i int) float64 { return float64(kernels.E4M3ToFloat32(qa[i])) },
	}
	for name, deq := range deqA {
		over, worst := 0, 0.0
		for r := range m {
			for c := range n {
				av, wv, ea, ew := make([]float64, k), make([]float64, k), make([]float64, k), make([]float64, k)
				exact, got := 0.0, 0.0
				for j := range k {
					av[j], wv[j] = float64(a[r*k+j]), float64(w[c*k+j])
					ea[j] = kernels.FP8ElemBound(av[j], float64(sa[r*bk+j/kernels.FP8Block]))
					ew[j] = kernels.FP8ElemBound(wv[j], float64(sw[c/kernels.FP8Block*bk+j/kernels.FP8Block]))
					exact += av[j] * wv[j]
					got += deq(r*k+j) * float64(dw[c*k+j])
				}
				b := kernels.DotBound(av, wv, ea, ew)
				if e := math.Abs(exact - got); e > b {
					over++
				} else {
					worst = max(worst, e/b)
				}
			}
		}
		switch {
		case name == "right" && over > 0:
			t.Errorf("%d of %d dot products exceed their bound", over, m*n)
		case name == "right":
			t.Logf("worst error/bound %.3f", worst)
		case over == 0:
			t.Errorf("%s: no dot product exceeds the bound", name)
		default:
			t.Logf("%s: %d of %d dot products exceed the bound", name, over, m*n)
		}
	}
}

// TestMXFP8 quantizes MX blocks (32 values, E8M0 scale): every element
// within MXElemBound, the scales as §6.3 computes them (or
// TransformerEngine's, rounded up), the block's largest saturating where
// x/2^X passes 448 under the spec's rule and not under TE's, and a scale
// ×2 or no dequantization breaking the bound.
func TestMXFP8(t *testing.T) {
	for _, tc := range []struct {
		amax float32
		b    uint8
	}{{1, 127 - 8}, {0, 0}, {float32(math.Ldexp(1, -140)), 0}, {float32(math.Ldexp(1, -118)), 1}, {4 * 448 * 1.01, 127 + 3}} {
		if got := kernels.MXScaleRoundUp(tc.amax); got != tc.b {
			t.Errorf("TE's MX scale of amax %g: %d, want %d", tc.amax, got, tc.b)
		}
	}
	if kernels.MXRecip(0) != 1 || kernels.MXRecip(127) != 1 || kernels.MXRecip(119) != 256 {
		t.Errorf("mxRecip: %g %g %g", kernels.MXRecip(0), kernels.MXRecip(127), kernels.MXRecip(119))
	}
	for _, roundUp := range []bool{false, true} {
		t.Run(fmt.Sprint("roundUp=", roundUp), func(t *testing.T) { checkMXFP8(t, roundUp) })
	}
}

func checkMXFP8(t *testing.T, roundUp bool) {
	g := rand.New(rand.NewPCG(34, 4))
	x := fp8Rows(g, 8, 512, true)
	for i := range kernels.MXBlock { // a block of amax 1.99: X = −8, 1.99·2^8 = 509.4 saturates to 448
		x[kernels.FP8Block+i] = kernels.RoundBF16(0.5 + float32(i)/64)
	}
	x[kernels.FP8Block] = 1.99
	q, sc, err := kernels.QuantMXFP8(x, roundUp)
	if err != nil {
		t.Fatal(err)
	}
	if sat := q[kernels.FP8Block] == kernels.E4M3MaxBit; sat == roundUp {
		t.Errorf("1.99 in a block of scale 2^%d: %#02x (448 is %#02x)", int(sc[kernels.FP8Block/kernels.MXBlock])-127, q[kernels.FP8Block], kernels.E4M3MaxBit)
	}
	d := kernels.DequantMXFP8(q, sc)
	for i, v := range x {
		want := kernels.MXScale(kernels.BlockAmax(x[i/kernels.MXBlock*kernels.MXBlock : (i/kernels.MXBlock+1)*kernels.MXBlock]))
		if roundUp {
			want = kernels.MXScaleRoundUp(kernels.BlockAmax(x[i/kernels.MXBlock*kernels.MXBlock : (i/kernels.MXBlock+1)*kernels.MXBlock]))
		}
		if sc[i/kernels.MXBlock] != want {
			t.Fatalf("block %d: scale %d, want %d", i/kernels.MXBlock, sc[i/kernels.MXBlock], want)
		}
		if e := math.Abs(float64(v) - d[i]); e > kernels.MXElemBound(float64(v), sc[i/kernels.MXBlock]) {
			t.Fatalf("element %d = %g → %g: error %g above %g", i, v, d[i], e, kernels.MXElemBound(float64(v), sc[i/kernels.MXBlock]))
		}
	}
	for name, deq := range map[string]func(i int) float64{
		"scale ×2":        func(i int) float64 { return 2 * d[i] },
		"no dequantizing": func(i int) float64 { return float64(kernels.E4M3ToFloat32(q[i])) },
	} {
		broken := 0
		for i, v := range x {
			if math.Abs(float64(v)-deq(i)) > kernels.MXElemBound(float64(v), sc[i/kernels.MXBlock]) {
				broken++
			}
		}
		if broken == 0 {
			t.Errorf("%s stays within the bound", name)
		}
	}
	if _, _, err := kernels.QuantMXFP8(x[:33], roundUp); err == nil {
		t.Error("33 values accepted")
	}
}

// TestFP8WeightEdges: a weight whose sides are not multiples of 128 gets
// ⌈n/128⌉×⌈k/128⌉ blocks, the partial ones scaled by their own amax (the
// zero padding changes nothing), every element within FP8ElemBound.
func TestFP8WeightEdges(t *testing.T) {
	g := rand.New(rand.NewPCG(34, 6))
	const n, k = 200, 300
	w := fp8Rows(g, 1, 256*256, false)[:n*k]
	q, sc, err := kernels.QuantFP8Weight(w, n, k, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(sc) != 2*3 {
		t.Fatalf("%d scales, want 6", len(sc))
	}
	var amax float32 // the last block: rows 128…199, columns 256…299
	for r := 128; r < n; r++ {
		amax = max(amax, kernels.BlockAmax(w[r*k+256:r*k+k]))
	}
	if _, inv := kernels.FP8Scales(amax, false); sc[5] != inv {
		t.Errorf("last block's multiplier %g, want %g (amax %g)", sc[5], inv, amax)
	}
	d := kernels.DequantFP8Weight(q, sc, n, k)
	for i, v := range w {
		if e := math.Abs(float64(v) - float64(d[i])); e > kernels.FP8ElemBound(float64(v), float64(sc[i/k/kernels.FP8Block*3+i%k/kernels.FP8Block])) {
			t.Fatalf("element %d = %g → %g", i, v, d[i])
		}
	}
	if _, _, err := kernels.QuantFP8Weight(w, n, k+1, false); err == nil {
		t.Error("a weight of the wrong size accepted")
	}
}

// TestQuantFP8RowsInto: quantizing into buffers that hold another
// input's results and garbage gives QuantFP8Rows' codes and scales bit for
// bit (every byte and multiplier rewritten, zeros included), and buffers
// of the wrong sizes are refused.
func TestQuantFP8RowsInto(t *testing.T) {
	g := rand.New(rand.NewPCG(34, 9))
	const rows, h = 16, 512
	a, b := fp8Rows(g, rows, h, true), make([]float32, rows*h)
	copy(b[:h], a[h:2*h]) // b: one row of values, the rest zeros (codes 0)
	for _, ue8m0 := range []bool{false, true} {
		q, sc := make([]uint8, rows*h), make([]float32, rows*h/kernels.FP8Block)
		for i := range q {
			q[i] = 0xff
		}
		for i := range sc {
			sc[i] = float32(math.NaN())
		}
		for _, x := range [][]float32{a, b} {
			if err := kernels.QuantFP8RowsInto(q, sc, x, h, ue8m0); err != nil {
				t.Fatal(err)
			}
			wq, ws, err := kernels.QuantFP8Rows(x, h, ue8m0)
			if err != nil {
				t.Fatal(err)
			}
			for i := range wq {
				if q[i] != wq[i] {
					t.Fatalf("ue8m0 %v: code %d is %#02x, QuantFP8Rows gives %#02x", ue8m0, i, q[i], wq[i])
				}
			}
			for i := range ws {
				if math.Float32bits(sc[i]) != math.Float32bits(ws[i]) {
					t.Fatalf("ue8m0 %v: scale %d is %g, QuantFP8Rows gives %g", ue8m0, i, sc[i], ws[i])
				}
			}
		}
	}
	for _, c := range []struct{ q, s int }{{rows*h - 1, rows * h / kernels.FP8Block}, {rows * h, rows*h/kernels.FP8Block + 1}} {
		if err := kernels.QuantFP8RowsInto(make([]uint8, c.q), make([]float32, c.s), a, h, false); err == nil {
			t.Errorf("buffers of %d codes and %d scales accepted for %d values", c.q, c.s, len(a))
		}
	}
	if err := kernels.QuantFP8RowsInto(make([]uint8, len(a)), make([]float32, len(a)/kernels.FP8Block), a, 100, false); err == nil {
		t.Error("hidden 100 accepted")
	}
}
