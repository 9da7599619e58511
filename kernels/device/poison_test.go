package device

import (
	"math"
	"testing"
	"unsafe"
)

// TestEmuAllocPoisoned: Emu's Alloc and AllocMapped hand out memory filled
// with Poison16, not zeros, as a GPU's cuMemAlloc holds what a freed buffer
// held: code that reads memory it never wrote fails on the CPU too. bf16 and
// fp32 read it as NaN, an int32 as a large positive count.
func TestEmuAllocPoisoned(t *testing.T) {
	e := &Emu{}
	s, err := e.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{2, 1000, 1 << 16} {
		p, err := e.Alloc(int64(4 * n))
		if err != nil {
			t.Fatal(err)
		}
		w := make([]uint16, 2*n)
		if err := e.Download(w, p, s); err != nil {
			t.Fatal(err)
		}
		for i, v := range w {
			if v != Poison16 {
				t.Fatalf("Alloc(%d): word %d is %#04x, want the poison %#04x", 4*n, i, v, Poison16)
			}
		}
		f := make([]float32, n)
		if err := e.Download(f, p, s); err != nil {
			t.Fatal(err)
		}
		if !math.IsNaN(float64(f[n-1])) || !math.IsNaN(float64(bf16(w[0]))) {
			t.Fatalf("Alloc(%d): poison reads as fp32 %v, bf16 %v: want NaN", 4*n, f[n-1], bf16(w[0]))
		}
		c := make([]int32, n)
		if err := e.Download(c, p, s); err != nil {
			t.Fatal(err)
		}
		if c[0] < 1<<30 {
			t.Fatalf("Alloc(%d): poison reads as int32 %d: want a large positive count", 4*n, c[0])
		}
		if err := e.Free(p); err != nil {
			t.Fatal(err)
		}
		m, err := e.AllocMapped(int64(2 * n))
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range unsafe.Slice((*uint16)(m.Host), n) {
			if v != Poison16 {
				t.Fatalf("AllocMapped(%d): word %d is %#04x, want the poison %#04x", 2*n, i, v, Poison16)
			}
		}
		if err := e.Free(m.Dev); err != nil {
			t.Fatal(err)
		}
	}
}

func bf16(w uint16) float32 { return math.Float32frombits(uint32(w) << 16) }
