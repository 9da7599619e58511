package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// e4m3Oracle rounds f to e4m3 by brute force, independently of
// E4M3FromFloat32: the nearest finite code in float64 (ties to the even
// code), ±448 beyond it, 0x7F for NaN.
func e4m3Oracle(f float32) uint8 {
	if f != f {
		return E4M3NaN
	}
	x := float64(f)
	sign := uint8(0)
	if math.Signbit(x) {
		sign, x = 0x80, -x
	}
	if x >= E4M3Max {
		return sign | E4M3MaxBit
	}
	best, bestD := uint8(0), math.Inf(1)
	for c := uint8(0); c <= E4M3MaxBit; c++ {
		d := math.Abs(float64(E4M3ToFloat32(c)) - x)
		if d < bestD || d == bestD && c&1 == 0 {
			best, bestD = c, d
		}
	}
	return sign | best
}

// TestE4M3Codes: every code decodes to its value (0x08 the smallest normal
// 2^-6, 0x01 the smallest subnormal 2^-9, 0x7E 448, 0x7F and 0xFF NaN, the
// finite ones increasing) and encodes back to itself.
func TestE4M3Codes(t *testing.T) {
	for _, kv := range []struct {
		c uint8
		v float32
	}{{0x00, 0}, {0x01, 1.0 / 512}, {0x07, 7.0 / 512}, {0x08, 1.0 / 64}, {0x38, 1}, {0x39, 1.125}, {0x7E, 448}, {0x7D, 416}, {0xBE, -1.75}, {0xFE, -448}} {
		if got := E4M3ToFloat32(kv.c); got != kv.v {
			t.Errorf("decode %#02x = %v, want %v", kv.c, got, kv.v)
		}
	}
	prev := float32(-1)
	for c := 0; c < 256; c++ {
		v := E4M3ToFloat32(uint8(c))
		if c&0x7F == 0x7F {
			if v == v {
				t.Errorf("%#02x decodes to %v, want NaN", c, v)
			}
			if E4M3FromFloat32(v) != E4M3NaN {
				t.Errorf("NaN encodes to %#02x", E4M3FromFloat32(v))
			}
			continue
		}
		if got := E4M3FromFloat32(v); got != uint8(c) {
			t.Errorf("%#02x → %v → %#02x", c, v, got)
		}
		if c < 0x7F {
			if v <= prev && c > 0 {
				t.Errorf("%#02x = %v not above %#02x = %v", c, v, c-1, prev)
			}
			prev = v
		}
		if c >= 0x80 && v != -E4M3ToFloat32(uint8(c&0x7F)) || c == 0x80 && !math.Signbit(float64(v)) {
			t.Errorf("%#02x = %v is not the negative of %#02x", c, v, c&0x7F)
		}
	}
}

// TestE4M3Rounding compares E4M3FromFloat32 with the brute-force oracle on
// every midpoint between neighbouring codes (exact ties) and the float32s
// on either side of it, the saturation's edges, subnormals of both
// formats, infinities, and a million random float32s across the binades.
func TestE4M3Rounding(t *testing.T) {
	var vals []float32
	for c := uint8(0); c < E4M3MaxBit; c++ {
		lo, hi := E4M3ToFloat32(c), E4M3ToFloat32(c+1)
		mid := (lo + hi) / 2 // exact: 4 significant bits
		vals = append(vals, lo, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1000))
	}
	for _, v := range []float32{448, math.Nextafter32(448, 0), math.Nextafter32(448, 1000), 464, math.Nextafter32(464, 0),
		math.Nextafter32(464, 1000), 480, 500, 512, 1e30, math.MaxFloat32, float32(math.Inf(1)),
		1.0 / 1024, math.Nextafter32(1.0/1024, 0), math.Nextafter32(1.0/1024, 1), 3.0 / 1024, 1.0 / 2048, 1e-40, 1e-45, 0} {
		vals = append(vals, v)
	}
	g := rand.New(rand.NewPCG(34, 1))
	for range 1 << 20 {
		e := g.IntN(40) - 24 // 2^-24 … 2^15
		vals = append(vals, float32(math.Ldexp(1+g.Float64(), e)))
	}
	up, down := 0, 0 // exact ties rounded up and down (to the even code)
	for _, v := range vals {
		for _, x := range []float32{v, -v} {
			if got, want := E4M3FromFloat32(x), e4m3Oracle(x); got != want {
				t.Fatalf("e4m3(%g = %#08x) = %#02x, want %#02x", x, math.Float32bits(x), got, want)
			}
		}
		c := E4M3FromFloat32(v)
		switch {
		case c < E4M3MaxBit && float64(v) == (float64(E4M3ToFloat32(c))+float64(E4M3ToFloat32(c+1)))/2:
			down++
		case c > 0 && c <= E4M3MaxBit && float64(v) == (float64(E4M3ToFloat32(c))+float64(E4M3ToFloat32(c-1)))/2:
			up++
		}
	}
	if up < 50 || down < 50 {
		t.Errorf("exact ties checked: %d rounded up, %d down", up, down)
	}
	if c := E4M3FromFloat32(float32(math.NaN())); c != E4M3NaN {
		t.Errorf("NaN → %#02x", c)
	}
	if c := E4M3FromFloat32(float32(-math.NaN())); c != E4M3NaN {
		t.Errorf("−NaN → %#02x", c)
	}
	if c := E4M3FromFloat32(float32(math.Copysign(0, -1))); c != 0x80 {
		t.Errorf("−0 → %#02x", c)
	}
}

// TestFP8Scales: the scales of known blocks, DeepEP's way (amax clamped to
// 1e-4; scale = 448/amax, inv = amax·fl(1/448)) and UE8M0's (powers of
// two, rounded up).
func TestFP8Scales(t *testing.T) {
	inv448 := float32(1.0 / 448)
	for _, tc := range []struct {
		amax       float32
		ue8m0      bool
		scale, inv float32
	}{
		{448, false, 1, 448 * inv448}, {1, false, 448, inv448}, {0, false, 448 / FP8Margin, FP8Margin * inv448},
		{1e-6, false, 448 / FP8Margin, FP8Margin * inv448},
		{448, true, 1, 1}, {449, true, 0.5, 2}, {3 * 448, true, 0.25, 4}, {1, true, 256, 1.0 / 256}, {0, true, 4096 * 1024, 1.0 / (4096 * 1024)},
	} {
		s, inv := fp8Scales(tc.amax, tc.ue8m0)
		if s != tc.scale || inv != tc.inv {
			t.Errorf("amax %g ue8m0 %v: scale %g inv %g, want %g %g", tc.amax, tc.ue8m0, s, inv, tc.scale, tc.inv)
		}
	}
	for _, tc := range []struct {
		amax float32
		x    int
	}{{1, -8}, {1.99, -8}, {2, -7}, {448, 0}, {0, -127}, {float32(math.Ldexp(1, -119)), -127}, {float32(math.Ldexp(1, -118)), -126}, {float32(math.Ldexp(1, 127)), 119}} {
		if got := int(MXScale(tc.amax)) - 127; got != tc.x {
			t.Errorf("MX scale of amax %g: X = %d, want %d", tc.amax, got, tc.x)
		}
	}
}

// fp8Rows draws rows of bf16 values (never zero) whose 128-blocks span
// many binades: each block has its own magnitude 2^-30 … 2^12, values
// within it spread over 2^-12 … 1 of it; blocks of amax below 1e-4 (the
// clamp) and near-ties come with them. Block b of the first row is all
// zeros if zeros is set.
func fp8Rows(g *rand.Rand, rows, h int, zeros bool) []float32 {
	x := make([]float32, rows*h)
	for b := 0; b < len(x)/FP8Block; b++ {
		mag := math.Ldexp(1, g.IntN(43)-30)
		for i := range FP8Block {
			v := float32(0)
			for v == 0 {
				v = RoundBF16(float32(mag * math.Ldexp(1+g.Float64(), -g.IntN(13)) * float64(1-2*g.IntN(2))))
			}
			x[b*FP8Block+i] = v
		}
	}
	if zeros {
		clear(x[:FP8Block])
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
		q, sc, err := QuantFP8Rows(x, h, ue8m0)
		if err != nil {
			t.Fatal(err)
		}
		d := DequantFP8Rows(q, sc)
		worst := 0.0
		for i, v := range x {
			e := math.Abs(float64(v) - float64(d[i]))
			bound := FP8ElemBound(float64(v), float64(sc[i/FP8Block]))
			if e > bound {
				t.Fatalf("ue8m0 %v: element %d = %g dequantized to %g: error %g above the bound %g", ue8m0, i, v, d[i], e, bound)
			}
			worst = max(worst, e/bound)
		}
		t.Logf("ue8m0 %v: worst error/bound %.3f", ue8m0, worst)
		// the mutations: each must break the bound somewhere
		for name, deq := range map[string]func(i int) float64{
			"scale ×2":        func(i int) float64 { return float64(E4M3ToFloat32(q[i])) * 2 * float64(sc[i/FP8Block]) },
			"shifted block":   func(i int) float64 { return float64(E4M3ToFloat32(q[i])) * float64(sc[min(len(sc)-1, (i+1)/FP8Block)]) },
			"no dequantizing": func(i int) float64 { return float64(E4M3ToFloat32(q[i])) },
		} {
			broken := 0
			for i, v := range x {
				if math.Abs(float64(v)-deq(i)) > FP8ElemBound(float64(v), float64(sc[i/FP8Block])) {
					broken++
				}
			}
			if broken == 0 {
				t.Errorf("ue8m0 %v: %s stays within the bound", ue8m0, name)
			}
		}
	}
	if _, _, err := QuantFP8Rows(x, 100, false); err == nil {
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
	qa, sa, _ := QuantFP8Rows(a, k, false)
	qw, sw, err := QuantFP8Weight(w, n, k, false)
	if err != nil {
		t.Fatal(err)
	}
	dw := DequantFP8Weight(qw, sw, n, k)
	bk := k / FP8Block
	deqA := map[string]func(i int) float64{
		"right":           func(i int) float64 { return float64(E4M3ToFloat32(qa[i]) * sa[i/FP8Block]) },
		"scale ×2":        func(i int) float64 { return float64(E4M3ToFloat32(qa[i]) * 2 * sa[i/FP8Block]) },
		"shifted block":   func(i int) float64 { return float64(E4M3ToFloat32(qa[i]) * sa[min(len(sa)-1, (i+1)/FP8Block)]) },
		"no dequantizing": func(i int) float64 { return float64(E4M3ToFloat32(qa[i])) },
	}
	for name, deq := range deqA {
		over, worst := 0, 0.0
		for r := range m {
			for c := range n {
				av, wv, ea, ew := make([]float64, k), make([]float64, k), make([]float64, k), make([]float64, k)
				exact, got := 0.0, 0.0
				for j := range k {
					av[j], wv[j] = float64(a[r*k+j]), float64(w[c*k+j])
					ea[j] = FP8ElemBound(av[j], float64(sa[r*bk+j/FP8Block]))
					ew[j] = FP8ElemBound(wv[j], float64(sw[c/FP8Block*bk+j/FP8Block]))
					exact += av[j] * wv[j]
					got += deq(r*k+j) * float64(dw[c*k+j])
				}
				b := DotBound(av, wv, ea, ew)
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
		if got := MXScaleRoundUp(tc.amax); got != tc.b {
			t.Errorf("TE's MX scale of amax %g: %d, want %d", tc.amax, got, tc.b)
		}
	}
	if mxRecip(0) != 1 || mxRecip(127) != 1 || mxRecip(119) != 256 {
		t.Errorf("mxRecip: %g %g %g", mxRecip(0), mxRecip(127), mxRecip(119))
	}
	for _, roundUp := range []bool{false, true} {
		t.Run(fmt.Sprint("roundUp=", roundUp), func(t *testing.T) { checkMXFP8(t, roundUp) })
	}
}

func checkMXFP8(t *testing.T, roundUp bool) {
	g := rand.New(rand.NewPCG(34, 4))
	x := fp8Rows(g, 8, 512, true)
	for i := range MXBlock { // a block of amax 1.99: X = −8, 1.99·2^8 = 509.4 saturates to 448
		x[FP8Block+i] = RoundBF16(0.5 + float32(i)/64)
	}
	x[FP8Block] = 1.99
	q, sc, err := QuantMXFP8(x, roundUp)
	if err != nil {
		t.Fatal(err)
	}
	if sat := q[FP8Block] == E4M3MaxBit; sat == roundUp {
		t.Errorf("1.99 in a block of scale 2^%d: %#02x (448 is %#02x)", int(sc[FP8Block/MXBlock])-127, q[FP8Block], E4M3MaxBit)
	}
	d := DequantMXFP8(q, sc)
	for i, v := range x {
		want := MXScale(blockAmax(x[i/MXBlock*MXBlock : (i/MXBlock+1)*MXBlock]))
		if roundUp {
			want = MXScaleRoundUp(blockAmax(x[i/MXBlock*MXBlock : (i/MXBlock+1)*MXBlock]))
		}
		if sc[i/MXBlock] != want {
			t.Fatalf("block %d: scale %d, want %d", i/MXBlock, sc[i/MXBlock], want)
		}
		if e := math.Abs(float64(v) - d[i]); e > MXElemBound(float64(v), sc[i/MXBlock]) {
			t.Fatalf("element %d = %g → %g: error %g above %g", i, v, d[i], e, MXElemBound(float64(v), sc[i/MXBlock]))
		}
	}
	for name, deq := range map[string]func(i int) float64{
		"scale ×2":        func(i int) float64 { return 2 * d[i] },
		"no dequantizing": func(i int) float64 { return float64(E4M3ToFloat32(q[i])) },
	} {
		broken := 0
		for i, v := range x {
			if math.Abs(float64(v)-deq(i)) > MXElemBound(float64(v), sc[i/MXBlock]) {
				broken++
			}
		}
		if broken == 0 {
			t.Errorf("%s stays within the bound", name)
		}
	}
	if _, _, err := QuantMXFP8(x[:33], roundUp); err == nil {
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
	q, sc, err := QuantFP8Weight(w, n, k, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(sc) != 2*3 {
		t.Fatalf("%d scales, want 6", len(sc))
	}
	var amax float32 // the last block: rows 128…199, columns 256…299
	for r := 128; r < n; r++ {
		amax = max(amax, blockAmax(w[r*k+256:r*k+k]))
	}
	if _, inv := fp8Scales(amax, false); sc[5] != inv {
		t.Errorf("last block's multiplier %g, want %g (amax %g)", sc[5], inv, amax)
	}
	d := DequantFP8Weight(q, sc, n, k)
	for i, v := range w {
		if e := math.Abs(float64(v) - float64(d[i])); e > FP8ElemBound(float64(v), float64(sc[i/k/FP8Block*3+i%k/FP8Block])) {
			t.Fatalf("element %d = %g → %g", i, v, d[i])
		}
	}
	if _, _, err := QuantFP8Weight(w, n, k+1, false); err == nil {
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
		q, sc := make([]uint8, rows*h), make([]float32, rows*h/FP8Block)
		for i := range q {
			q[i] = 0xff
		}
		for i := range sc {
			sc[i] = float32(math.NaN())
		}
		for _, x := range [][]float32{a, b} {
			if err := QuantFP8RowsInto(q, sc, x, h, ue8m0); err != nil {
				t.Fatal(err)
			}
			wq, ws, err := QuantFP8Rows(x, h, ue8m0)
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
	for _, c := range []struct{ q, s int }{{rows*h - 1, rows * h / FP8Block}, {rows * h, rows*h/FP8Block + 1}} {
		if err := QuantFP8RowsInto(make([]uint8, c.q), make([]float32, c.s), a, h, false); err == nil {
			t.Errorf("buffers of %d codes and %d scales accepted for %d values", c.q, c.s, len(a))
		}
	}
	if err := QuantFP8RowsInto(make([]uint8, len(a)), make([]float32, len(a)/FP8Block), a, 100, false); err == nil {
		t.Error("hidden 100 accepted")
	}
}
