package cuda

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/moebench/moebench/internal/hostsim"
)

func fakeCuBLASLt(t *testing.T) *CuBLASLt {
	buildFake(t, "fakecublaslt", "MOEBENCH_CUBLASLT")
	return fakeCuBLASLtOpen(t)
}

// fakeCuBLASLtOpen opens and initializes the library MOEBENCH_CUBLASLT names.
func fakeCuBLASLtOpen(t *testing.T) *CuBLASLt {
	b, err := OpenCuBLASLt()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Init(); err != nil {
		t.Fatal(err)
	}
	return b
}

func bf16(f float32) uint16 { // round to nearest even
	u := math.Float32bits(f)
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

func unbf16(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// TestCuBLASLtRowMajorNT: through the fake (column-major semantics), PlanGEMM
// and Run compute the row-major c[m,n] = a[m,k]·w[n,k]ᵀ.
func TestCuBLASLtRowMajorNT(t *testing.T) {
	d := fakeDriver(t)
	b := fakeCuBLASLt(t)
	if b.Version != 130000 {
		t.Errorf("version %d", b.Version)
	}
	const m, n, k = 5, 7, 3
	r := rand.New(rand.NewPCG(1, 1))
	a, w := make([]uint16, m*k), make([]uint16, n*k)
	for i := range a {
		a[i] = bf16(float32(r.NormFloat64()))
	}
	for i := range w {
		w[i] = bf16(float32(r.NormFloat64()))
	}
	s, _ := d.NewStream(0)
	da, _ := d.Alloc(2 * m * k)
	dw, _ := d.Alloc(2 * n * k)
	dc, _ := d.Alloc(4 * m * n)
	CopyToDevice(d, da, a, s)
	CopyToDevice(d, dw, w, s)
	for _, f32 := range []bool{false, true} {
		g, err := b.PlanGEMM(m, n, k, f32, Align{A: AlignOf(da), W: 2, C: AlignOf(dc)}, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if g.WorkspaceSize != 1024 {
			t.Errorf("workspace %d, want the heuristic's 1024", g.WorkspaceSize)
		}
		ws, _ := d.Alloc(g.WorkspaceSize)
		if err := b.Run(g, dc, da, dw, ws, s); err != nil {
			t.Fatal(err)
		}
		b.Free(g)
		c16, c32 := make([]uint16, m*n), make([]float32, m*n)
		if f32 {
			CopyFromDevice(d, c32, dc, s)
		} else {
			CopyFromDevice(d, c16, dc, s)
		}
		for i := range m {
			for j := range n {
				var want float32
				for p := range k {
					want += unbf16(a[i*k+p]) * unbf16(w[j*k+p])
				}
				if got := c32[i*n+j]; f32 && got != want {
					t.Fatalf("fp32 c[%d,%d] = %v, want %v", i, j, got, want)
				}
				if got := c16[i*n+j]; !f32 && got != bf16(want) {
					t.Fatalf("bf16 c[%d,%d] = %v, want %v", i, j, unbf16(got), want)
				}
			}
		}
	}
	if _, err := b.PlanGEMM(0, 1, 1, false, Align{}, 0); err == nil {
		t.Error("m = 0 accepted")
	}
	if _, err := b.PlanGEMM(1, 1, 1, false, Align{A: 3}, 0); err == nil {
		t.Error("an alignment of 3 bytes accepted")
	}
	if AlignOf(0x1000) != 256 || AlignOf(0x1002) != 2 || AlignOf(0x1030) != 16 {
		t.Error("AlignOf")
	}
}

// TestCuBLASLtDescriptorsReal checks the descriptor constants against a real
// libcublasLt when one is installed (a GPU node, or Debian's libcublaslt11):
// descriptor, layout and preference calls need no GPU.
func TestCuBLASLtDescriptorsReal(t *testing.T) {
	b, err := OpenCuBLASLt()
	if err != nil {
		t.Skipf("no libcublasLt: %v", err)
	}
	t.Logf("cuBLASLt %d from %s", b.Version, b.Path)
	g := &GEMM{}
	defer b.Free(g)
	g.M, g.N, g.K = 64, 128, 256
	if err := b.describe(g); err != nil {
		t.Fatal(err)
	}
	pref, err := b.preference(32<<20, Align{A: 16, W: 8, C: 2})
	if err != nil {
		t.Fatal(err)
	}
	b.freePreference(pref)
	// the library does check: TRANSA with an 8-byte value is refused
	if err := b.setAttr(g.desc, descTransA, make([]byte, 8)); err == nil {
		t.Error("a wrongly sized attribute was accepted: this test could not catch a wrong constant")
	}
	if b.Version < FP8TensorVersion {
		return
	}
	// FP8 (11.8+): the scale pointers are void *, 8 bytes; 4 are refused
	for _, a := range []int{descAScalePointer, descBScalePointer} {
		if err := b.setAttr(g.desc, a, make([]byte, 8)); err != nil {
			t.Errorf("scale pointer %d: %v", a, err)
		}
		if err := b.setAttr(g.desc, a, make([]byte, 4)); err == nil {
			t.Errorf("scale pointer %d of 4 bytes accepted", a)
		}
	}
	if b.Version >= 120800 { // the scale modes: int32_t
		if err := b.setAttr(g.desc, descAScaleMode, []byte{scaleBlk128F32, 0, 0, 0}); err != nil {
			t.Errorf("A_SCALE_MODE: %v", err)
		}
	}
}

// TestCuBLASLtFP8Refusals: the fake refuses what cublasLt.h's contract
// does not allow — an FP8 product without its scale pointers (Run instead
// of RunFP8), a scale pointer of 4 bytes, the BLK128x128·BLK128x128 pair
// (not in Hopper's table), a scale mode on bf16 operands, and on the
// library of CUDA 12.0 (the fake .so.12) the scale-mode attributes (12.8+)
// — and the binding refuses FP8 in any form but TN before asking.
func TestCuBLASLtFP8Refusals(t *testing.T) {
	d := fakeDriver(t)
	b := fakeCuBLASLt(t)
	s, _ := d.NewStream(0)
	const m, n, k = 4, 8, 256
	buf, _ := d.Alloc(1 << 16)
	g, err := b.Plan(MatMul{M: m, N: n, K: k, TransB: true, FP8: FP8Block}, Align{}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free(g)
	ws, _ := d.Alloc(g.WorkspaceSize)
	if err := b.Run(g, buf, buf, buf, ws, s); err == nil {
		t.Error("an FP8 GEMM without scale pointers ran")
	}
	if err := b.RunFP8(g, buf, buf, buf+1024, buf, buf+2048, ws, s); err != nil {
		t.Fatalf("RunFP8: %v", err)
	}
	if err := b.setAttr(g.desc, descAScalePointer, make([]byte, 4)); err == nil {
		t.Error("a 4-byte scale pointer was accepted")
	}
	if err := b.setAttr(g.desc, descBScaleMode, []byte{scaleBlk128F32, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	if err := b.RunFP8(g, buf, buf, buf+1024, buf, buf+2048, ws, s); err == nil {
		t.Error("BLK128x128 for both operands ran")
	}
	bf, err := b.Plan(MatMul{M: m, N: n, K: k, TransB: true}, Align{}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free(bf)
	if err := b.setAttr(bf.desc, descAScaleMode, []byte{scaleVec128F32, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	if err := b.Run(bf, buf, buf, buf, ws, s); err == nil {
		t.Error("a scale mode on bf16 operands ran")
	}
	for _, mm := range []MatMul{{M: m, N: n, K: k, FP8: FP8Tensor}, {M: m, N: n, K: k, TransB: true, Add: true, F32Out: true, FP8: FP8Tensor}} {
		if _, err := b.Plan(mm, Align{}, 1<<20); err == nil {
			t.Errorf("%+v planned", mm)
		}
	}
	d.SyncStream(s)

	so, err := hostsim.BuildFake("fakecublaslt", t.TempDir(), "libcublasLt.so.12")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOEBENCH_CUBLASLT", so)
	old := fakeCuBLASLtOpen(t)
	gt, err := old.Plan(MatMul{M: m, N: n, K: k, TransB: true, FP8: FP8Tensor}, Align{}, 1<<20)
	if err != nil {
		t.Fatalf("per-tensor FP8 on cuBLASLt %d: %v", old.Version, err)
	}
	defer old.Free(gt)
	if err := old.setAttr(gt.desc, descAScaleMode, []byte{scaleScalar32F, 0, 0, 0}); err == nil {
		t.Errorf("cuBLASLt %d accepted A_SCALE_MODE (12.8+)", old.Version)
	}
}

// TestCuBLASLtFP8BlockShapes: cuBLAS's documented contract for VEC128 /
// BLK128x128 scales ("Scaling factors layouts",
// https://docs.nvidia.com/cuda/cublas/#scaling-factors-layouts): M and N
// multiples of 4 and 16-byte aligned scales. The fake's heuristic refuses
// m = 130 (cuBLAS's N) with CUBLAS_STATUS_INVALID_VALUE, as cuBLASLt 13.1
// did on an H200, and the error says what was asked; Plan refuses m or n
// not a multiple of 4 before asking; RunFP8 refuses misaligned scales, and
// the fake refuses them when set past the binding's check.
func TestCuBLASLtFP8BlockShapes(t *testing.T) {
	d := fakeDriver(t)
	b := fakeCuBLASLt(t)
	s, _ := d.NewStream(0)
	const n, k = 192, 256
	_, err := b.plan(MatMul{M: 130, N: n, K: k, TransB: true, FP8: FP8Block}, Align{}, 1<<20, 0, 0)
	if err == nil || !strings.Contains(err.Error(), "cuBLAS status 7") || !strings.Contains(err.Error(), "cuBLAS M=192 N=130 K=256, transa=T transb=N, A e4m3 ld 256 scale BLK128x128_32F, B e4m3 ld 256 scale VEC128_32F") {
		t.Errorf("the fake's heuristic on m=130: %v", err)
	}
	for _, mm := range []MatMul{{M: 130, N: n, K: k}, {M: 128, N: 130, K: k}} {
		mm.TransB, mm.FP8 = true, FP8Block
		if _, err := b.Plan(mm, Align{}, 1<<20); err == nil || !strings.Contains(err.Error(), "multiples of 4") {
			t.Errorf("m=%d n=%d: %v", mm.M, mm.N, err)
		}
	}
	if g, err := b.Plan(MatMul{M: 130, N: n, K: k, TransB: true, FP8: FP8Tensor}, Align{}, 1<<20); err != nil { // per-tensor scales: no such rule
		t.Errorf("per-tensor m=130: %v", err)
	} else {
		b.Free(g)
	}
	// the tensor-core conditions (16-byte k and rows of c): Plan refuses, the
	// fake's heuristic offers nothing
	for _, mm := range []MatMul{{M: 128, N: n, K: 264}, {M: 128, N: 196, K: k}, {M: 128, N: 194, K: k, F32Out: true}} {
		mm.TransB, mm.FP8 = true, FP8Tensor
		if _, err := b.Plan(mm, Align{}, 1<<20); err == nil || !strings.Contains(err.Error(), "multiple of 16") {
			t.Errorf("%+v: %v", mm, err)
		}
		if _, err := b.plan(mm, Align{}, 1<<20, 0, 0); err == nil || !strings.Contains(err.Error(), "status 15") {
			t.Errorf("the fake's heuristic on %+v: %v", mm, err)
		}
	}
	if g, err := b.Plan(MatMul{M: 128, N: 196, K: k, TransB: true, F32Out: true, FP8: FP8Tensor}, Align{}, 1<<20); err != nil { // 784-byte rows of fp32
		t.Errorf("fp32 c of 196 columns: %v", err)
	} else {
		b.Free(g)
	}
	g, err := b.Plan(MatMul{M: 132, N: n, K: k, TransB: true, FP8: FP8Block}, Align{}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free(g)
	buf, _ := d.Alloc(1 << 20)
	ws, _ := d.Alloc(g.WorkspaceSize)
	if err := b.RunFP8(g, buf, buf, buf+4, buf, buf+2048, ws, s); err == nil || !strings.Contains(err.Error(), "16-byte aligned") {
		t.Errorf("misaligned activation scales: %v", err)
	}
	if err := b.RunFP8(g, buf, buf+8, buf+1024, buf, buf+2048, ws, s); err == nil || !strings.Contains(err.Error(), "16-byte aligned") {
		t.Errorf("misaligned activations: %v", err)
	}
	ptr := func(p DevicePtr) []byte {
		v := make([]byte, 8)
		for i := range v {
			v[i] = byte(uint64(p) >> (8 * i))
		}
		return v
	}
	for _, sc := range [][2]DevicePtr{{buf + 2048, buf + 4}, {buf + 2056, buf + 1024}} { // w's, a's
		if err := b.setAttr(g.desc, descAScalePointer, ptr(sc[0])); err != nil {
			t.Fatal(err)
		}
		if err := b.setAttr(g.desc, descBScalePointer, ptr(sc[1])); err != nil {
			t.Fatal(err)
		}
		if err := b.Run(g, buf, buf, buf, ws, s); err == nil || !strings.Contains(err.Error(), "status 7") {
			t.Errorf("scales at %#x (w) %#x (a) past the binding: %v", uint64(sc[0]-buf), uint64(sc[1]-buf), err)
		}
	}
	if err := b.RunFP8(g, buf, buf, buf+1024, buf, buf+2048, ws, s); err != nil {
		t.Errorf("aligned scales: %v", err)
	}
	// PlanScaled sets the scale pointers before the heuristic: Run (which
	// sets none) finds them there
	gs, err := b.PlanScaled(MatMul{M: 132, N: n, K: k, TransB: true, FP8: FP8Block}, Align{}, 1<<20, buf+1024, buf+2048)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free(gs)
	if err := b.Run(gs, buf, buf, buf, ws, s); err != nil {
		t.Errorf("a PlanScaled plan without its scales: %v", err)
	}
	d.SyncStream(s)
}

// TestCuBLASLtBackwardShapes: through the fake, Plan and Run compute the
// backward's row-major products — the dgrad c[m,n] = a[m,k]·b[k,n], the
// wgrad c[m,n] += a[k,m]ᵀ·b[k,n] into fp32 (beta = 1: the sum lands on
// what c held), and the fp32 router's products with fp32 operands — each
// against a plain loop; a combination cuBLASLt does not support (fp32
// operands into bf16, accumulation into bf16) is refused before the
// library is asked.
func TestCuBLASLtBackwardShapes(t *testing.T) {
	d := fakeDriver(t)
	b := fakeCuBLASLt(t)
	const m, n, k = 6, 5, 7
	r := rand.New(rand.NewPCG(2, 2))
	s, _ := d.NewStream(0)
	for _, mm := range []MatMul{
		{M: m, N: n, K: k}, // dgrad: a · b
		{M: m, N: n, K: k, TransA: true, F32Out: true, Add: true},   // wgrad: c += aᵀ · b
		{M: m, N: n, K: k, F32In: true, F32Out: true},               // router dx: fp32
		{M: m, N: n, K: k, TransA: true, F32In: true, F32Out: true}, // router dW: fp32
		{M: m, N: n, K: k, TransA: true, TransB: true},              // both transposed
	} {
		// operands as float32 values exactly representable in bf16
		av, bv, cv := make([]float32, m*k), make([]float32, k*n), make([]float32, m*n)
		for _, v := range [][]float32{av, bv, cv} {
			for i := range v {
				v[i] = unbf16(bf16(float32(r.NormFloat64())))
			}
		}
		up := func(v []float32) DevicePtr {
			p, _ := d.Alloc(int64(4 * len(v)))
			if mm.F32In {
				CopyToDevice(d, p, v, s)
				return p
			}
			h := make([]uint16, len(v))
			for i, x := range v {
				h[i] = bf16(x)
			}
			CopyToDevice(d, p, h, s)
			return p
		}
		da, db := up(av), up(bv)
		dc, _ := d.Alloc(4 * m * n)
		CopyToDevice(d, dc, cv, s) // what an accumulating product adds to
		g, err := b.Plan(mm, Align{}, 1<<20)
		if err != nil {
			t.Fatalf("%+v: %v", mm, err)
		}
		ws, _ := d.Alloc(g.WorkspaceSize)
		if err := b.Run(g, dc, da, db, ws, s); err != nil {
			t.Fatalf("%+v: %v", mm, err)
		}
		b.Free(g)
		got := make([]float32, m*n)
		if mm.F32Out {
			CopyFromDevice(d, got, dc, s)
		} else {
			h := make([]uint16, m*n)
			CopyFromDevice(d, h, dc, s)
			for i, x := range h {
				got[i] = unbf16(x)
			}
		}
		for i := range m {
			for j := range n {
				var want float32
				for p := range k {
					ai, bi := i*k+p, p*n+j // a [m,k], b [k,n]
					if mm.TransA {
						ai = p*m + i // a stored [k,m]
					}
					if mm.TransB {
						bi = j*k + p // b stored [n,k]
					}
					want += av[ai] * bv[bi]
				}
				if mm.Add {
					want += cv[i*n+j]
				}
				if !mm.F32Out {
					want = unbf16(bf16(want))
				}
				if got[i*n+j] != want {
					t.Fatalf("%+v: c[%d,%d] = %v, want %v", mm, i, j, got[i*n+j], want)
				}
			}
		}
	}
	for _, mm := range []MatMul{{M: 1, N: 1, K: 1, F32In: true}, {M: 1, N: 1, K: 1, Add: true}} {
		if _, err := b.Plan(mm, Align{}, 1<<20); err == nil {
			t.Errorf("%+v accepted", mm)
		}
	}
}
