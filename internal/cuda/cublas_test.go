package cuda

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestCuBLASGroupedRowMajorNT: through the fake (column-major semantics),
// GroupedGEMM computes each row-major c_i[m_i,n] = a_i[m_i,k]·w_i[n,k]ᵀ,
// groups of different m in one call.
func TestCuBLASGroupedRowMajorNT(t *testing.T) {
	d := fakeDriver(t)
	buildFake(t, "fakecublas", "MOEBENCH_CUBLAS")
	b, err := OpenCuBLAS()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Init(); err != nil || b.Version != 130000 {
		t.Fatalf("init: %v, version %d", err, b.Version)
	}
	defer b.Close()
	const n, k = 6, 4
	ms := []int{3, 1, 5}
	r := rand.New(rand.NewPCG(2, 2))
	rnd := func(len int) []uint16 {
		x := make([]uint16, len)
		for i := range x {
			x[i] = bf16(float32(r.NormFloat64()))
		}
		return x
	}
	s, _ := d.NewStream(0)
	var a, w [][]uint16
	ptrs := make([]uint64, 3*len(ms))
	for i, m := range ms {
		a, w = append(a, rnd(m*k)), append(w, rnd(n*k))
		da, _ := d.Alloc(int64(2 * m * k))
		dw, _ := d.Alloc(2 * n * k)
		dc, _ := d.Alloc(int64(2 * m * n))
		CopyToDevice(d, da, a[i], s)
		CopyToDevice(d, dw, w[i], s)
		ptrs[i], ptrs[len(ms)+i], ptrs[2*len(ms)+i] = uint64(dw), uint64(da), uint64(dc)
	}
	dp, _ := d.Alloc(int64(8 * len(ptrs)))
	CopyToDevice(d, dp, ptrs, s)
	ws, _ := d.Alloc(1 << 16)
	if err := b.GroupedGEMM(ms, n, k, dp, 0, 0, s); err == nil {
		t.Error("a grouped GEMM with no workspace: accepted by the fake, which demands one")
	}
	if err := b.GroupedGEMM(ms, n, k, dp, ws, 1<<16, s); err != nil {
		t.Fatal(err)
	}
	for g, m := range ms {
		c := make([]uint16, m*n)
		CopyFromDevice(d, c, DevicePtr(ptrs[2*len(ms)+g]), s)
		for i := range m {
			for j := range n {
				var want float32
				for p := range k {
					want += unbf16(a[g][i*k+p]) * unbf16(w[g][j*k+p])
				}
				if got := c[i*n+j]; got != bf16(want) {
					t.Fatalf("group %d: c[%d,%d] = %v, want %v", g, i, j, unbf16(got), want)
				}
			}
		}
	}
	// a cuBLAS without the grouped GEMM is refused with the reason
	buildFake(t, "fakecublaslt", "MOEBENCH_CUBLAS")
	if _, err := OpenCuBLAS(); err == nil || !strings.Contains(err.Error(), "12.5") {
		t.Errorf("a library without cublasGemmGroupedBatchedEx: %v", err)
	}
}
