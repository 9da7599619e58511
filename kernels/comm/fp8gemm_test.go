package comm

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// fp8Operands are a [m,k] and w [n,k] with magnitudes spread over 2^±8
// from block to block (and row to row), quantized both ways: 1×128 /
// 128×128 blocks (QuantFP8Rows, QuantFP8Weight) and per tensor.
type fp8Operands struct {
	m, n, k      int
	qa, qw       []uint8   // block codes
	sa, sw       []float32 // QuantFP8Rows' and QuantFP8Weight's multipliers
	ta, tw       []uint8   // per-tensor codes
	tsa, tsw     float32   // per-tensor multipliers
	deqA, deqW   []float64 // block-dequantized, exact (e4m3·inv in float64)
	tdeqA, tdeqW []float64 // per-tensor dequantized
}

func newFP8Operands(t *testing.T, m, n, k int) *fp8Operands { return newFP8OperandsSeed(t, m, n, k, 3) }

func newFP8OperandsSeed(t *testing.T, m, n, k int, seed uint64) *fp8Operands {
	r := rand.New(rand.NewPCG(34, seed))
	draw := func(rows int) []float32 {
		x := make([]float32, rows*k)
		for i := range x {
			if i%64 == 0 {
				r.Float64() // a new magnitude every 64 values: blocks differ inside
			}
			x[i] = float32(r.NormFloat64() * math.Ldexp(1, (i/64*7+i/k*3)%17-8))
		}
		return x
	}
	a, w := draw(m), draw(n)
	o := &fp8Operands{m: m, n: n, k: k}
	var err error
	if o.qa, o.sa, err = kernels.QuantFP8Rows(a, k, false); err != nil {
		t.Fatal(err)
	}
	if o.qw, o.sw, err = kernels.QuantFP8Weight(w, n, k, false); err != nil {
		t.Fatal(err)
	}
	tensor := func(x []float32) ([]uint8, float32) {
		s, inv := kernels.FP8Scales(kernels.BlockAmax(x), false)
		q := make([]uint8, len(x))
		for i, v := range x {
			q[i] = kernels.E4M3FromFloat32(v * s)
		}
		return q, inv
	}
	o.ta, o.tsa = tensor(a)
	o.tw, o.tsw = tensor(w)
	kb := k / kernels.FP8Block
	o.deqA, o.deqW = make([]float64, m*k), make([]float64, n*k)
	o.tdeqA, o.tdeqW = make([]float64, m*k), make([]float64, n*k)
	for i := range o.deqA {
		o.deqA[i] = float64(kernels.E4M3ToFloat32(o.qa[i])) * float64(o.sa[i/kernels.FP8Block])
		o.tdeqA[i] = float64(kernels.E4M3ToFloat32(o.ta[i])) * float64(o.tsa)
	}
	for i := range o.deqW {
		r, c := i/k, i%k
		o.deqW[i] = float64(kernels.E4M3ToFloat32(o.qw[i])) * float64(o.sw[r/kernels.FP8Block*kb+c/kernels.FP8Block])
		o.tdeqW[i] = float64(kernels.E4M3ToFloat32(o.tw[i])) * float64(o.tsw)
	}
	return o
}

// check holds c (fp32 values, or bf16 ones widened) to the float64
// reference on the same dequantized operands within FP8GEMMBound; it
// returns the worst error/bound and how many outputs exceed their bound.
func (o *fp8Operands) check(mode cuda.FP8Scale, c []float32, bf16Out bool) (worst float64, over int) {
	da, dw := o.deqA, o.deqW
	if mode == cuda.FP8Tensor {
		da, dw = o.tdeqA, o.tdeqW
	}
	for i := range o.m {
		for j := range o.n {
			var ref, abs float64
			for q := range o.k {
				p := da[i*o.k+q] * dw[j*o.k+q]
				ref += p
				abs += math.Abs(p)
			}
			e := math.Abs(float64(c[i*o.n+j]) - ref)
			b := kernels.FP8GEMMBound(mode, o.k, abs, bf16Out, ref)
			worst = max(worst, e/b)
			if e > b {
				over++
			}
		}
	}
	return worst, over
}

// fp8Lt runs one FP8 GEMM through a cuBLASLt (the fake) and returns c as
// fp32 values (a bf16 c widened).
func fp8Lt(t *testing.T, d *cuda.Driver, lt *cuda.CuBLASLt, mode cuda.FP8Scale, m, n, k int, qa []uint8, sa []float32, qw []uint8, sw []float32, bf16Out bool) []float32 {
	t.Helper()
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	g, err := lt.Plan(cuda.MatMul{M: m, N: n, K: k, TransB: true, F32Out: !bf16Out, FP8: mode}, cuda.Align{}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer lt.Free(g)
	alloc := func(n int) cuda.DevicePtr {
		p, err := d.Alloc(int64(max(n, 1)))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	da, dsa, dw, dsw, dc, ws := alloc(len(qa)), alloc(4*len(sa)), alloc(len(qw)), alloc(4*len(sw)), alloc(4*m*n), alloc(int(g.WorkspaceSize))
	for _, e := range []error{cuda.CopyToDevice(d, da, qa, s), cuda.CopyToDevice(d, dsa, sa, s), cuda.CopyToDevice(d, dw, qw, s), cuda.CopyToDevice(d, dsw, sw, s),
		lt.RunFP8(g, dc, da, dsa, dw, dsw, ws, s)} {
		if e != nil {
			t.Fatal(e)
		}
	}
	c := make([]float32, m*n)
	if bf16Out {
		h := make([]uint16, m*n)
		if err := cuda.CopyFromDevice(d, h, dc, s); err != nil {
			t.Fatal(err)
		}
		d.SyncStream(s)
		for i, v := range h {
			c[i] = math.Float32frombits(uint32(v) << 16)
		}
		return c
	}
	if err := cuda.CopyFromDevice(d, c, dc, s); err != nil {
		t.Fatal(err)
	}
	d.SyncStream(s)
	return c
}

func roundBF16(c []float32) []float32 {
	out := make([]float32, len(c))
	for i, v := range c {
		u := math.Float32bits(v)
		u += 0x7fff + (u>>16)&1
		out[i] = math.Float32frombits(u >> 16 << 16)
	}
	return out
}

// TestFP8GEMMOnFakeCuBLASLt: cuBLASLt's FP8 GEMM, per tensor and with
// 1×128 / 128×128 block scales, through the binding and the fake library
// (cublasLt.h's attributes, scale layouts and TN form): equal bit for bit
// to the Go emulation (FP8GEMM, the host device's), and within the derived
// bound (FP8GEMMBound) of the float64 product of the same dequantized
// operands, with fp32 and bf16 outputs. Broken on purpose — one activation
// multiplier doubled, the activation multipliers in the wrong block order
// (row-major, as QuantFP8Rows keeps them, not VEC128's k-block-major),
// the weights' in the wrong order (no padding to 4), no dequantization
// (multipliers 1) — the bound is exceeded. The library of CUDA 12 (the fake
// .so.12, cuBLASLt 12.0) has no block scaling: PlanGEMM refuses it, and
// FP8GEMMPathFor picks per-tensor there.
func TestFP8GEMMOnFakeCuBLASLt(t *testing.T) {
	if _, err := hostsim.New(); err != nil { // a C compiler for the fakes
		t.Skip(err)
	}
	dir := t.TempDir()
	build := func(name, file, env string) string {
		so, err := hostsim.BuildFake(name, dir, file)
		if err != nil {
			t.Fatal(err)
		}
		if env != "" {
			t.Setenv(env, so)
		}
		return so
	}
	build("fakecuda", "libcuda.so.1", "MOEBENCH_LIBCUDA")
	lt12 := build("fakecublaslt", "libcublasLt.so.12", "")
	build("fakecublaslt", "libcublasLt.so.13", "MOEBENCH_CUBLASLT")
	d, err := cuda.OpenDriver()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.PrimaryContext(0); err != nil {
		t.Fatal(err)
	}
	lt, err := cuda.OpenCuBLASLt()
	if err != nil {
		t.Fatal(err)
	}
	if err := lt.Init(); err != nil {
		t.Fatal(err)
	}
	if p, _ := kernels.FP8GEMMPathFor(lt.Version, 90); p != kernels.FP8GEMMBlock {
		t.Fatalf("cuBLASLt %d on sm_90: %s, want block scaling", lt.Version, p)
	}

	const m, n, k = 40, 200, 384 // n: a partial 128-row weight block; k: 3 blocks, padded to 4
	o := newFP8Operands(t, m, n, k)
	ltA, ltW := kernels.FP8ActScalesLt(o.sa, m, k), kernels.FP8WeightScalesLt(o.sw, n, k)
	if na, nw, _ := cuda.FP8ScaleLayout(m, n, k); na != len(ltA) || nw != len(ltW) {
		t.Fatalf("scale counts %d %d, layout %d %d", len(ltA), len(ltW), na, nw)
	}
	for _, mode := range []cuda.FP8Scale{cuda.FP8Tensor, cuda.FP8Block} {
		qa, sa, qw, sw := o.ta, []float32{o.tsa}, o.tw, []float32{o.tsw}
		if mode == cuda.FP8Block {
			qa, sa, qw, sw = o.qa, ltA, o.qw, ltW
		}
		emu := kernels.FP8GEMM(mode, m, n, k, qa, sa, qw, sw)
		for _, bf := range []bool{false, true} {
			got := fp8Lt(t, d, lt, mode, m, n, k, qa, sa, qw, sw, bf)
			want := emu
			if bf {
				want = roundBF16(emu)
			}
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%v bf16=%v: c[%d] = %v from cuBLASLt (the fake), %v from FP8GEMM", mode, bf, i, got[i], want[i])
				}
			}
			worst, over := o.check(mode, got, bf)
			t.Logf("%v bf16 out %v: worst error/bound %.3g", mode, bf, worst)
			if over > 0 {
				t.Errorf("%v bf16=%v: %d of %d outputs beyond the derived bound (worst ×%.3g)", mode, bf, over, m*n, worst)
			}
		}
	}

	// broken on purpose, through the fake: the check must fail
	scaled := append([]float32(nil), ltA...)
	scaled[1*m+7] *= 2 // row 7's second block
	ones := func(n int) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = 1
		}
		return s
	}
	unpadded := append(append([]float32(nil), o.sw...), make([]float32, len(ltW)-len(o.sw))...)
	for _, f := range []struct {
		name   string
		sa, sw []float32
	}{
		{"an activation multiplier doubled", scaled, ltW},
		{"activation multipliers row-major (wrong block)", append([]float32(nil), o.sa...), ltW},
		{"weight multipliers unpadded (wrong block)", ltA, unpadded},
		{"no dequantization", ones(len(ltA)), ones(len(ltW))},
	} {
		got := fp8Lt(t, d, lt, cuda.FP8Block, m, n, k, o.qa, f.sa, o.qw, f.sw, true)
		worst, over := o.check(cuda.FP8Block, got, true)
		t.Logf("%s: %d of %d outputs beyond the bound (worst ×%.3g)", f.name, over, m*n, worst)
		if over == 0 {
			t.Errorf("%s: the check passed", f.name)
		}
	}

	// CUDA 12.0's library: no block scaling, per-tensor FP8 runs
	t.Setenv("MOEBENCH_CUBLASLT", lt12)
	old, err := cuda.OpenCuBLASLt()
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Init(); err != nil {
		t.Fatal(err)
	}
	if p, _ := kernels.FP8GEMMPathFor(old.Version, 90); p != kernels.FP8GEMMTensor {
		t.Errorf("cuBLASLt %d on sm_90: %s, want per-tensor", old.Version, p)
	}
	if _, err := old.Plan(cuda.MatMul{M: m, N: n, K: k, TransB: true, FP8: cuda.FP8Block}, cuda.Align{}, 1<<20); err == nil {
		t.Error("cuBLASLt 12.0 planned a block-scaled FP8 GEMM")
	}
	got := fp8Lt(t, d, old, cuda.FP8Tensor, m, n, k, o.ta, []float32{o.tsa}, o.tw, []float32{o.tsw}, false)
	if worst, over := o.check(cuda.FP8Tensor, got, false); over > 0 {
		t.Errorf("per-tensor on cuBLASLt 12.0: %d beyond the bound (×%.3g)", over, worst)
	}
}

// TestFP8GroupedOnHostSim: the per-expert FP8 path (Grouped with FP8, one
// cuBLASLt FP8 call per expert, on one stream and spread over side
// streams) on the cuda device over the host simulation's fake cuBLASLt
// equals Emu's (FP8GEMM) bit for bit and passes the derived bound; the
// batched grouped call refuses FP8 with the reason. The experts' rows (130,
// 0, 1, 77) are not multiples of 4, which block-scaled cuBLASLt refuses
// (CUBLAS_STATUS_INVALID_VALUE, as on an H200): CUDA.MatMul runs them
// padded.
func TestFP8GroupedOnHostSim(t *testing.T) {
	useHostSim(t)
	checkFP8Grouped(openPair(t), true)
}

// TestFP8PaddedOnHostSim: block-scaled FP8 GEMMs whose m is not a
// multiple of 4 (CUDA.MatMul runs them padded), m growing a few rows at a
// time on one stream, k of three 128-blocks (three rows of multipliers to
// re-stride): each equals FP8GEMM bit for bit, and the padding's scratch
// grows geometrically, a few allocations for the whole run rather than its
// three buffers at every larger m (seen failing so: 30 allocations for 10
// calls, with the scratch grown to the exact size).
func TestFP8PaddedOnHostSim(t *testing.T) {
	useHostSim(t)
	p := openPair(t)
	const n, k = 64, 384
	allocs := 0
	run := func(m int) {
		t.Helper()
		o := newFP8OperandsSeed(t, m, n, k, uint64(m))
		a, _ := p.put(packBytes(append(o.qa, 0, 0)))
		sa, _ := p.put(append(kernels.FP8ActScalesLt(o.sa, m, k), 0))
		w, _ := p.put(packBytes(o.qw))
		sw, _ := p.put(kernels.FP8WeightScalesLt(o.sw, n, k))
		c, _ := p.out(m * n)
		g, err := device.NewGrouped(p.c, 0)
		p.ok(err)
		g.FP8 = cuda.FP8Block
		before := len(p.c.Allocs)
		p.ok(g.Run(p.c, []device.Group{{C: c, A: a, W: w, M: m, AScale: sa, WScale: sw}}, n, k, p.cs))
		allocs += len(p.c.Allocs) - before
		got := make([]uint16, m*n)
		p.ok(p.c.Download(got, c, p.cs))
		want := kernels.BF16Bits(kernels.FP8GEMM(cuda.FP8Block, m, n, k, o.qa, kernels.FP8ActScalesLt(o.sa, m, k), o.qw, kernels.FP8WeightScalesLt(o.sw, n, k)))
		for j := range want {
			if got[j] != want[j] {
				t.Fatalf("m %d: c[%d] = %#x, FP8GEMM %#x", m, j, got[j], want[j])
			}
		}
	}
	run(1) // the first padded call allocates the scratch (and cuBLASLt's workspace)
	allocs = 0
	const first, last = 5, 41 // padded to 8 … 44
	calls := 0
	for m := first; m <= last; m += 4 {
		run(m)
		calls++
	}
	// each of the three buffers at least doubles when it grows: from 4
	// padded rows to 44, 4 times
	if limit := 3 * bits.Len(uint(last+3)/4); allocs > limit {
		t.Errorf("%d padded calls of m from %d to %d allocated %d times, want at most %d (geometric growth)", calls, first, last, allocs, limit)
	}
	t.Logf("%d padded calls, %d allocations", calls, allocs)
}

// TestGPUFP8Grouped is TestFP8GroupedOnHostSim on a GPU whose cuBLASLt has
// block scaling (sm_90, 12.9+); the GPU's result is held to the float64
// reference within the bound with Hopper's accumulator (u = 2^-14 inside a
// 128-long block), not to Emu's bits.
func TestGPUFP8Grouped(t *testing.T) {
	p := openPair(t)
	if path, why := p.c.FP8GEMMPath(); path != kernels.FP8GEMMBlock {
		t.Skipf("no block-scaled FP8 GEMM: %s", why)
	}
	checkFP8Grouped(p, false)
}

// packBytes packs b (even length) into 16-bit words, little-endian, for
// uploading (HostBytes takes no []uint8).
func packBytes(b []uint8) []uint16 {
	w := make([]uint16, (len(b)+1)/2)
	for i, v := range b {
		w[i/2] |= uint16(v) << (8 * (i % 2))
	}
	return w
}

func checkFP8Grouped(p *gpuPair, exact bool) {
	t := p.t
	const n, k = 192, 256 // n: one and a half 128-row weight blocks
	ms := []int{130, 0, 1, 77}
	type expert struct {
		o            *fp8Operands
		a, sa, w, sw [2]device.Addr // cuda, emu
		c1, c2       [2]device.Addr // outputs: one stream, side streams
	}
	var ex []expert
	for i, m := range ms {
		o := newFP8OperandsSeed(t, m, n, k, uint64(10+i))
		var e expert
		e.o = o
		put := func(dst *[2]device.Addr, v any) { dst[0], dst[1] = p.put(v) }
		put(&e.a, packBytes(append(o.qa, 0, 0)))
		put(&e.sa, append(kernels.FP8ActScalesLt(o.sa, m, k), 0))
		put(&e.w, packBytes(o.qw))
		put(&e.sw, kernels.FP8WeightScalesLt(o.sw, n, k))
		e.c1[0], e.c1[1] = p.out(max(m*n, 1))
		e.c2[0], e.c2[1] = p.out(max(m*n, 1))
		ex = append(ex, e)
	}
	groups := func(d int, side bool) []device.Group {
		var gs []device.Group
		for _, e := range ex {
			c := e.c1[d]
			if side {
				c = e.c2[d]
			}
			gs = append(gs, device.Group{C: c, A: e.a[d], W: e.w[d], M: e.o.m, AScale: e.sa[d], WScale: e.sw[d]})
		}
		return gs
	}
	for d, dev := range []device.Device{p.c, p.e} {
		s := []device.Stream{p.cs, p.es}[d]
		one, err := device.NewGrouped(dev, 0)
		p.ok(err)
		side, err := device.NewGrouped(dev, 2)
		p.ok(err)
		one.FP8, side.FP8 = cuda.FP8Block, cuda.FP8Block
		p.ok(one.Run(dev, groups(d, false), n, k, s))
		p.ok(side.Run(dev, groups(d, true), n, k, s))
		if err := (&device.Grouped{Batched: "one cublasGemmGroupedBatchedEx call", FP8: cuda.FP8Block}).Run(dev, groups(d, false), n, k, s); err == nil {
			t.Error("the batched grouped call ran FP8 groups")
		}
	}
	p.ok(p.c.SyncStream(p.cs))
	for i, e := range ex {
		m := e.o.m
		if m == 0 {
			continue
		}
		want := kernels.BF16Bits(kernels.FP8GEMM(cuda.FP8Block, m, n, k, e.o.qa, kernels.FP8ActScalesLt(e.o.sa, m, k), e.o.qw, kernels.FP8WeightScalesLt(e.o.sw, n, k)))
		for _, c := range [][2]device.Addr{e.c1, e.c2} {
			gpu, host := get[uint16](p, c[0], c[1], m*n)
			for j := range want {
				if host[j] != want[j] {
					t.Fatalf("expert %d: Emu c[%d] = %#x, FP8GEMM %#x", i, j, host[j], want[j])
				}
				if exact && gpu[j] != host[j] {
					t.Fatalf("expert %d: cuda device c[%d] = %#x, Emu %#x", i, j, gpu[j], host[j])
				}
			}
			got := make([]float32, m*n)
			for j, v := range gpu {
				got[j] = math.Float32frombits(uint32(v) << 16)
			}
			var worst float64
			var over int
			if exact {
				worst, over = e.o.check(cuda.FP8Block, got, true)
			} else {
				worst, over = e.o.checkAcc(got, math.Ldexp(1, -14))
			}
			t.Logf("expert %d (%d rows): worst error/bound %.3g", i, m, worst)
			if over > 0 {
				t.Errorf("expert %d: %d outputs beyond the bound (×%.3g)", i, over, worst)
			}
		}
	}
}

// checkAcc is check for block scaling with an accumulator of unit
// roundoff uAcc inside each 128-long block (a GPU's tensor cores), fp32
// outside it, and a bf16 output.
func (o *fp8Operands) checkAcc(c []float32, uAcc float64) (worst float64, over int) {
	kb := (o.k + kernels.FP8Block - 1) / kernels.FP8Block
	for i := range o.m {
		for j := range o.n {
			var ref, abs float64
			for q := range o.k {
				p := o.deqA[i*o.k+q] * o.deqW[j*o.k+q]
				ref += p
				abs += math.Abs(p)
			}
			g := func(n int, u float64) float64 { return float64(n) * u / (1 - float64(n)*u) }
			b := (g(127, uAcc)+g(2+kb, math.Ldexp(1, -24)))*abs*(1+g(127, uAcc)) + math.Ldexp(1, -8)*math.Abs(ref)
			e := math.Abs(float64(c[i*o.n+j]) - ref)
			worst = max(worst, e/b)
			if e > b {
				over++
			}
		}
	}
	return worst, over
}
