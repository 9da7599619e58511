package kernels

import (
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
		s, inv := FP8Scales(tc.amax, tc.ue8m0)
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
