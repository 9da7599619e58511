package comm

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// GPU tests: every Device operation of CUDA against Emu (the host
// functions) on the same random inputs (never zeros), outputs poisoned
// before each call. They skip without a GPU and fail under
// MOEBENCH_REQUIRE_GPU=1 (scripts/gpu-check.sh). Their checks (checkX) also
// run on the host simulation (TestKernelsOnHostSim), where the CUDA device
// is the fake driver running the kernels compiled for the CPU.
//
// Tolerances: data movement (permute order, gathers, chunk sorts, copies)
// must be exact; bf16 results of arithmetic may differ from the host by one
// bf16 unit in the last place (the GPU's expf and fp32 accumulation order
// differ from the host's in the last float bits, which can move a value
// across a bf16 rounding boundary); fp32 GEMM results within 1e-5 of the
// row's largest magnitude times √k (a sum of k products in another order);
// router choices must match except on near-ties, probabilities to 1e-5
// relative.

type gpuPair struct {
	t      *testing.T
	c      *device.CUDA
	e      *device.Emu
	cs, es device.Stream
}

func openPair(t *testing.T) *gpuPair {
	t.Helper()
	c, err := device.OpenCUDA(0, t.TempDir())
	if err != nil {
		if os.Getenv("MOEBENCH_REQUIRE_GPU") == "1" {
			t.Fatalf("GPU required: %v", err)
		}
		t.Skipf("no GPU: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	p := &gpuPair{t: t, c: c, e: &device.Emu{}}
	if p.cs, err = c.NewStream(); err != nil {
		t.Fatal(err)
	}
	p.es, _ = p.e.NewStream()
	return p
}

// put uploads v to both devices; out allocates n poisoned 16-bit words on both.
func (p *gpuPair) put(v any) (device.Addr, device.Addr) {
	p.t.Helper()
	h, err := device.HostBytes(v)
	if err != nil {
		p.t.Fatal(err)
	}
	var ptrs [2]device.Addr
	for i, d := range []device.Device{p.c, p.e} {
		s := []device.Stream{p.cs, p.es}[i]
		if ptrs[i], err = d.Alloc(int64(len(h))); err != nil {
			p.t.Fatal(err)
		}
		if err := d.Upload(ptrs[i], v, s); err != nil {
			p.t.Fatal(err)
		}
	}
	return ptrs[0], ptrs[1]
}

func (p *gpuPair) out(words int) (device.Addr, device.Addr) {
	p.t.Helper()
	return p.put(slices.Repeat([]uint16{0x7fc0}, words)) // bf16 NaN; as pairs, fp32 NaN
}

// get downloads n elements of T from both devices.
func get[T uint16 | float32 | int32](p *gpuPair, c, e device.Addr, n int) (gpu, host []T) {
	p.t.Helper()
	gpu, host = make([]T, n), make([]T, n)
	if err := p.c.Download(gpu, c, p.cs); err != nil {
		p.t.Fatal(err)
	}
	if err := p.e.Download(host, e, p.es); err != nil {
		p.t.Fatal(err)
	}
	return gpu, host
}

func (p *gpuPair) ok(err error) {
	p.t.Helper()
	if err != nil {
		p.t.Fatal(err)
	}
}

func randBF16(g *rand.Rand, n int) []uint16 {
	v := make([]float32, n)
	for i := range v {
		for v[i] == 0 {
			v[i] = float32(g.NormFloat64())
		}
	}
	return kernels.BF16Bits(v)
}

func randF32(g *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		for v[i] == 0 {
			v[i] = float32(g.NormFloat64())
		}
	}
	return v
}

func randIdx(g *rand.Rand, n, experts int) []int32 {
	v := make([]int32, n)
	for i := range v {
		v[i] = int32(g.IntN(experts))
	}
	return v
}

// sameULP: every bf16 pair equal or neighbours (and no NaN).
func sameULP(t *testing.T, what string, gpu, host []uint16) {
	t.Helper()
	for i := range host {
		d := int(gpu[i]) - int(host[i])
		if d < -1 || d > 1 || gpu[i]&0x7f80 == 0x7f80 {
			t.Fatalf("%s[%d] = %v, host %v", what, i, kernels.FromBF16Bits(gpu[i : i+1])[0], kernels.FromBF16Bits(host[i : i+1])[0])
		}
	}
}

// nearGEMM compares bf16 GEMM outputs (rows of n) whose sums may run in
// another order or split k (cuBLAS's grouped call on an H200 was 4 ULP off
// on an element near cancellation, 2026-11-27): every element within 1 ULP
// or within 2⁻⁸ of its row's largest magnitude, and ‖gpu − host‖/‖host‖ at
// most 2e-3 (bf16 products land between 1e-3 and 1e-2 against a float64
// reference; against an fp32 one, far under).
func nearGEMM(t *testing.T, what string, gpu, host []uint16, n int) {
	t.Helper()
	g, h := kernels.FromBF16Bits(gpu), kernels.FromBF16Bits(host)
	var num, den float64
	for r := 0; r < len(h)/n; r++ {
		big := 0.0
		for _, v := range h[r*n : (r+1)*n] {
			big = max(big, math.Abs(float64(v)))
		}
		for i := r * n; i < (r+1)*n; i++ {
			d := float64(g[i]) - float64(h[i])
			num, den = num+d*d, den+float64(h[i])*float64(h[i])
			ulp := int(gpu[i]) - int(host[i])
			if math.IsNaN(float64(g[i])) || math.IsInf(float64(g[i]), 0) || (ulp < -1 || ulp > 1) && math.Abs(d) > big/256 {
				t.Fatalf("%s[%d] = %v, host %v (row's largest %v)", what, i, g[i], h[i], big)
			}
		}
	}
	if rel := math.Sqrt(num / den); rel > 2e-3 {
		t.Fatalf("%s: ‖gpu − host‖/‖host‖ = %.2e, above 2e-3", what, rel)
	}
}

func same[T comparable](t *testing.T, what string, gpu, host []T) {
	t.Helper()
	if !slices.Equal(gpu, host) {
		i := 0
		for gpu[i] == host[i] {
			i++
		}
		t.Fatalf("%s differs from the host at %d: %v, host %v", what, i, gpu[i], host[i])
	}
}

func TestGPUCopiesAndEvents(t *testing.T) { checkCopiesAndEvents(openPair(t)) }

func checkCopiesAndEvents(p *gpuPair) {
	t := p.t
	g := rand.New(rand.NewPCG(1, 1))
	const n = 8 << 20 // 16 MB of bf16
	src := randBF16(g, n)
	cs, _ := p.put(src)
	cd, _ := p.out(n)
	e0, _ := p.c.NewEvent()
	e1, _ := p.c.NewEvent()
	p.ok(p.c.Record(e0, p.cs))
	p.ok(p.c.Copy(cd, cs, 2*n, p.cs))
	p.ok(p.c.Record(e1, p.cs))
	back := make([]uint16, n)
	p.ok(p.c.Download(back, cd, p.cs))
	same(t, "device copy", back, src)
	ms, err := p.c.Elapsed(e0, e1)
	if err != nil || !(ms > 0) {
		t.Errorf("elapsed %v ms, %v", ms, err)
	}
	// the SM copy kernel (the benchmark's second memory ceiling), into
	// poisoned memory, with an odd number of 16-byte vectors
	p.ok(p.c.Fill16(cd, 0x7fc0, n, p.cs))
	p.ok(p.c.CopySM(cd, cs, 2*n-16, p.cs))
	p.ok(p.c.Download(back, cd, p.cs))
	same(t, "SM copy", back[:n-8], src[:n-8])
	if back[n-1] != 0x7fc0 {
		t.Errorf("SM copy wrote past its %d bytes", 2*n-16)
	}
	p.ok(p.c.Fill16(cd+2, 0x1234, 3, p.cs))
	p.ok(p.c.Download(back[:5], cd, p.cs))
	if back[0] != src[0] || back[1] != 0x1234 || back[3] != 0x1234 || back[4] != src[4] {
		t.Errorf("Fill16 wrote %x", back[:5])
	}
	// a batch (FEPLB's phase 2): the source's quarters in reverse order,
	// one of them at an odd 2-byte offset
	q := int64(n / 4)
	ops := []device.CopyOp{{Dst: cd, Src: cs + device.Addr(6*q), Bytes: 2 * q}, {Dst: cd + device.Addr(2*q), Src: cs + device.Addr(4*q), Bytes: 2 * q},
		{Dst: cd + device.Addr(4*q), Src: cs + device.Addr(2*q), Bytes: 2 * q}, {Dst: cd + device.Addr(6*q), Src: cs + 2, Bytes: 2*q - 2}}
	p.ok(p.c.CopyBatch(ops, p.cs))
	if p.c.BatchErr != nil {
		t.Errorf("the driver refused the batch copy: %v", p.c.BatchErr)
	}
	p.ok(p.c.Download(back, cd, p.cs))
	want := slices.Concat(src[3*q:], src[2*q:3*q], src[q:2*q], src[1:q], back[n-1:])
	same(t, "batch copy ("+p.c.BatchMethod()+")", back, want)
}

// TestGPUGroupedGEMM: one cublasGemmGroupedBatchedEx call over experts of
// different row counts (one of them at an odd row offset) gives each
// expert's GEMM as the host does, within a bf16 ulp; a second call reuses
// the cached operand array. It skips when the GPU machine has no cuBLAS
// 12.5+ (the layer then compares only the per-expert calls).
func TestGPUGroupedGEMM(t *testing.T) { checkGroupedGEMM(openPair(t)) }

func checkGroupedGEMM(p *gpuPair) {
	t := p.t
	if name, ok := p.c.GroupedGEMMName(); !ok {
		t.Skipf("no grouped GEMM: %s", name)
	}
	g := rand.New(rand.NewPCG(7, 7))
	const n, k = 192, 256
	ms := []int{300, 1, 77, 128}
	rows := 1
	for _, m := range ms {
		rows += m
	}
	a, w := randBF16(g, rows*k), randBF16(g, len(ms)*n*k)
	ca, ea := p.put(a)
	cw, ew := p.put(w)
	cc, ec := p.out(rows * n)
	groups := func(c, a, w device.Addr) []device.Group {
		var gs []device.Group
		at := 1 // odd row offset
		for i, m := range ms {
			gs = append(gs, device.Group{C: c + device.Addr(2*at*n), A: a + device.Addr(2*at*k), W: w + device.Addr(2*i*n*k), M: m})
			at += m
		}
		return gs
	}
	for range 2 {
		p.ok(p.c.GroupedGEMM(groups(cc, ca, cw), n, k, p.cs))
	}
	p.ok(p.e.GroupedGEMM(groups(ec, ea, ew), n, k, p.es))
	gpu, host := get[uint16](p, cc+device.Addr(2*n), ec+device.Addr(2*n), (rows-1)*n)
	name, _ := p.c.GroupedGEMMName()
	nearGEMM(t, name, gpu, host, n)
	// groups that change every call (routing drawn per step): the pointer
	// arrays' slots stay as many as ptrSlotCount, and once they are made
	// no call allocates
	var made int
	for i := range 2 * device.PtrSlotCount {
		if i == device.PtrSlotCount {
			made = len(p.c.Allocs)
		}
		p.ok(p.c.GroupedGEMM([]device.Group{{C: cc + device.Addr(2*n*(i%rows)), A: ca, W: cw, M: 1}}, n, k, p.cs))
	}
	p.ok(p.c.SyncStream(p.cs))
	if len(p.c.PtrSlots) != device.PtrSlotCount || len(p.c.PtrIndex) > device.PtrSlotCount || len(p.c.Allocs) != made {
		t.Errorf("%d slots, %d arrays indexed, allocations %d then %d", len(p.c.PtrSlots), len(p.c.PtrIndex), made, len(p.c.Allocs))
	}
}

func TestGPUGEMM(t *testing.T) { checkGEMM(openPair(t)) }

func checkGEMM(p *gpuPair) {
	t := p.t
	g := rand.New(rand.NewPCG(2, 2))
	for _, tc := range []struct {
		m, n, k, skip int // skip: rows of a to start after (misaligned operands)
		f32           bool
	}{{300, 192, 256, 0, false}, {257, 128, 512, 0, true}, {33, 96, 200, 1, false}, {1, 64, 64, 3, false}} {
		a := randBF16(g, (tc.m+tc.skip)*tc.k)
		w := randBF16(g, tc.n*tc.k)
		ca, ea := p.put(a)
		cw, ew := p.put(w)
		cc, ec := p.out(2 * tc.m * tc.n)
		off := device.Addr(2 * tc.skip * tc.k)
		p.ok(p.c.GEMM(cc, ca+off, cw, tc.m, tc.n, tc.k, tc.f32, p.cs))
		p.ok(p.e.GEMM(ec, ea+off, ew, tc.m, tc.n, tc.k, tc.f32, p.es))
		if !tc.f32 {
			gpu, host := get[uint16](p, cc, ec, tc.m*tc.n)
			sameULP(t, "bf16 GEMM", gpu, host)
			continue
		}
		gpu, host := get[float32](p, cc, ec, tc.m*tc.n)
		for i := range tc.m {
			big := 0.0
			for _, v := range host[i*tc.n : (i+1)*tc.n] {
				big = math.Max(big, math.Abs(float64(v)))
			}
			for j := range tc.n {
				if d := math.Abs(float64(gpu[i*tc.n+j] - host[i*tc.n+j])); !(d <= 1e-5*big*math.Sqrt(float64(tc.k))) {
					t.Fatalf("fp32 GEMM [%d,%d] = %v, host %v", i, j, gpu[i*tc.n+j], host[i*tc.n+j])
				}
			}
		}
	}
}

func TestGPUPermute(t *testing.T) { checkPermute(openPair(t)) }

func checkPermute(p *gpuPair) {
	t := p.t
	g := rand.New(rand.NewPCG(3, 3))
	const T, k, E, h = 1000, 8, 128, 1024
	{ // 104 copies: most of permute_order's 16 warps have empty segments
		idx := randIdx(g, 13*k, 40)
		ci, ei := p.put(idx)
		cr, er := p.out(2 * 13 * k)
		cp, ep := p.out(2 * 13 * k)
		cn, en := p.out(2 * 40)
		p.ok(p.c.PermuteOrder(ci, 13*k, 40, cr, cp, cn, p.cs))
		p.ok(p.e.PermuteOrder(ei, 13*k, 40, er, ep, en, p.es))
		gr, hr := get[int32](p, cr, er, 13*k)
		same(t, "permute order rows (104 copies)", gr, hr)
		gn, hn := get[int32](p, cn, en, 40)
		same(t, "permute order counts (104 copies)", gn, hn)
	}
	idx := randIdx(g, T*k, E)
	ci, ei := p.put(idx)
	cr, er := p.out(2 * T * k)
	cp, ep := p.out(2 * T * k)
	cn, en := p.out(2 * E)
	p.ok(p.c.PermuteOrder(ci, T*k, E, cr, cp, cn, p.cs))
	p.ok(p.e.PermuteOrder(ei, T*k, E, er, ep, en, p.es))
	gr, hr := get[int32](p, cr, er, T*k)
	same(t, "permute order rows", gr, hr)
	gp, hp := get[int32](p, cp, ep, T*k)
	same(t, "permute order pos", gp, hp)
	gn, hn := get[int32](p, cn, en, E)
	same(t, "permute order counts", gn, hn)

	x := randBF16(g, T*h)
	cx, ex := p.put(x)
	cd, ed := p.out(T * k * h)
	p.ok(p.c.GatherRows(cd, cx, cr, k, T*k, h, p.cs))
	p.ok(p.e.GatherRows(ed, ex, er, k, T*k, h, p.es))
	gx, hx := get[uint16](p, cd, ed, T*k*h)
	same(t, "permute rows", gx, hx)

	probs := randF32(g, T*k)
	cpr, epr := p.put(probs)
	cdp, edp := p.out(2 * T * k)
	p.ok(p.c.GatherF32(cdp, cpr, cr, 1, T*k, p.cs))
	p.ok(p.e.GatherF32(edp, epr, er, 1, T*k, p.es))
	gf, hf := get[float32](p, cdp, edp, T*k)
	same(t, "gather f32", gf, hf)
}

func TestGPUSortChunks(t *testing.T) { checkSortChunks(openPair(t)) }

func checkSortChunks(p *gpuPair) {
	// 32 chunks: one per lane of the offset scan; 8·37: several per lane,
	// the last lanes' partly or wholly past the end
	for _, c := range []struct{ ep, L, h int }{{8, 4, 512}, {8, 37, 64}} {
		sortChunksCase(p, c.ep, c.L, c.h)
	}
}

func sortChunksCase(p *gpuPair, ep, L, h int) {
	t := p.t
	g := rand.New(rand.NewPCG(4, uint64(L)))
	counts := make([]int32, ep*L)
	rows := 0
	for i := range counts {
		if g.IntN(5) > 0 { // some chunks empty
			counts[i] = int32(g.IntN(40))
		}
		rows += int(counts[i])
	}
	x := randBF16(g, rows*h)
	pr := randF32(g, rows)
	cx, ex := p.put(x)
	cp, ep2 := p.put(pr)
	cc, ec := p.put(counts)
	cd, ed := p.out(rows * h)
	cdp, edp := p.out(2 * rows)
	p.ok(p.c.SortChunks(cd, cdp, cx, cp, cc, rows, ep, L, h, false, p.cs))
	p.ok(p.e.SortChunks(ed, edp, ex, ep2, ec, rows, ep, L, h, false, p.es))
	gx, hx := get[uint16](p, cd, ed, rows*h)
	same(t, fmt.Sprintf("sort chunks rows (%d×%d chunks)", ep, L), gx, hx)
	gp, hp := get[float32](p, cdp, edp, rows)
	same(t, "sort chunks probs", gp, hp)
	// the inverse restores the input
	cb, _ := p.out(rows * h)
	p.ok(p.c.SortChunks(cb, 0, cd, 0, cc, rows, ep, L, h, true, p.cs))
	back := make([]uint16, rows*h)
	p.ok(p.c.Download(back, cb, p.cs))
	same(t, "inverse chunk sort", back, x)
}

func TestGPUSwiGLUAndUnpermute(t *testing.T) { checkSwiGLUAndUnpermute(openPair(t)) }

func checkSwiGLUAndUnpermute(p *gpuPair) {
	t := p.t
	g := rand.New(rand.NewPCG(5, 5))
	const n, T, k, h = 257, 200, 6, 360 // h: 45 vectors of 8, two passes of a 64-thread block (unpermute)
	for _, f := range []int{512, 36} {  // 16-byte vectors; ffn % 8 ≠ 0, one column per thread
		h1, prob := randBF16(g, n*2*f), randF32(g, n)
		ch, eh := p.put(h1)
		cp, ep := p.put(prob)
		for _, withProb := range []bool{true, false} {
			cpp, epp := cp, ep
			if !withProb {
				cpp, epp = 0, 0
			}
			ca, ea := p.out(n * f)
			p.ok(p.c.SwiGLU(ca, ch, cpp, n, f, p.cs))
			p.ok(p.e.SwiGLU(ea, eh, epp, n, f, p.es))
			gpu, host := get[uint16](p, ca, ea, n*f)
			sameULP(t, fmt.Sprintf("swiglu (ffn %d)", f), gpu, host)
		}
	}
	// unpermute: every token's k distinct rows of src
	pos := make([]int32, T*k)
	for i, r := range g.Perm(T * k) {
		pos[i] = int32(r)
	}
	src, shared := randBF16(g, T*k*h), randBF16(g, T*h)
	cs, es := p.put(src)
	cpos, epos := p.put(pos)
	csh, esh := p.put(shared)
	for _, withShared := range []bool{true, false} {
		c2, e2 := csh, esh
		if !withShared {
			c2, e2 = 0, 0
		}
		co, eo := p.out(T * h)
		p.ok(p.c.UnpermuteSum(co, cs, cpos, c2, T, k, h, p.cs))
		p.ok(p.e.UnpermuteSum(eo, es, epos, e2, T, k, h, p.es))
		gpu, host := get[uint16](p, co, eo, T*h)
		sameULP(t, "unpermute sum", gpu, host)
	}
}

// routerCases are the router configurations TestGPURouter checks (and
// TestKernelsCompile compiles): softmax (also pre-softmax) and sigmoid,
// grouped or not, expert counts that are not a multiple of 32, k from 1 to 32.
var routerCases = map[string]kernels.RouterConfig{
	"softmax":         {Experts: 128, TopK: 8, Score: kernels.ScoreSoftmax, Scale: 1},
	"softmax-512-k10": {Experts: 512, TopK: 10, Score: kernels.ScoreSoftmax, Scale: 1},
	"sigmoid-grouped": {Experts: 256, TopK: 8, Score: kernels.ScoreSigmoid, Groups: 8, GroupTopK: 4, Scale: 2.5},
	"softmax-grouped": {Experts: 160, TopK: 6, Score: kernels.ScoreSoftmax, Groups: 20, GroupTopK: 3, Scale: 1},
	"sigmoid-k1":      {Experts: 40, TopK: 1, Score: kernels.ScoreSigmoid, Scale: 1},
	"softmax-k32":     {Experts: 64, TopK: 32, Score: kernels.ScoreSoftmax, Scale: 1},
	"softmax-ties":    {Experts: 96, TopK: 8, Score: kernels.ScoreSoftmax, Scale: 1},
	"pre-softmax-k1":  {Experts: 40, TopK: 1, Score: kernels.ScoreSoftmax, Scale: 1, PreSoftmax: true},
	"pre-softmax-grouped": {Experts: 160, TopK: 6, Score: kernels.ScoreSoftmax, Groups: 20, GroupTopK: 3, Scale: 2.5,
		PreSoftmax: true},
}

func TestGPURouter(t *testing.T) { checkRouter(openPair(t)) }

// checkedRouterCases is routerCases, or under go test -short three of them
// (softmax, sigmoid grouped, pre-softmax top-1: each score function), as
// each is a kernel compile of its own on the host simulation.
func checkedRouterCases(t testing.TB) map[string]kernels.RouterConfig {
	if !testing.Short() {
		return routerCases
	}
	some := map[string]kernels.RouterConfig{}
	for _, name := range []string{"softmax", "sigmoid-grouped", "pre-softmax-k1"} {
		some[name] = routerCases[name]
	}
	t.Logf("-short: the router cases %v of %d", slices.Sorted(maps.Keys(some)), len(routerCases))
	return some
}

func checkRouter(p *gpuPair) {
	t := p.t
	g := rand.New(rand.NewPCG(6, 6))
	const T = 1000
	for name, rc := range checkedRouterCases(t) {
		E, k := rc.Experts, rc.TopK
		logits := randF32(g, T*E)
		if name == "softmax-ties" { // halves in [-2, 0], half of them ±0: exact ties go to the lower expert, −0 ties +0
			for i, v := range logits {
				logits[i] = float32(math.Round(max(-4, min(0, float64(v)*2))) / 2)
			}
		}
		cl, el := p.put(logits)
		var cb, eb device.Addr
		if rc.Score == kernels.ScoreSigmoid {
			bias := randF32(g, E)
			for i := range bias {
				bias[i] *= 0.01
			}
			cb, eb = p.put(bias)
		}
		ci, ei := p.out(2 * T * k)
		cp, ep := p.out(2 * T * k)
		p.ok(p.c.RouterTopK(rc, cl, cb, T, ci, cp, p.cs))
		p.ok(p.e.RouterTopK(rc, el, eb, T, ei, ep, p.es))
		gi, hi := get[int32](p, ci, ei, T*k)
		gp, hp := get[float32](p, cp, ep, T*k)
		differ := 0
		for tok := range T {
			if !slices.Equal(gi[tok*k:(tok+1)*k], hi[tok*k:(tok+1)*k]) {
				differ++
				continue
			}
			for j := range k {
				w, x := hp[tok*k+j], gp[tok*k+j]
				if !(math.Abs(float64(w-x)) <= 1e-5*math.Abs(float64(w))) {
					t.Fatalf("%s token %d: prob %v, host %v", name, tok, x, w)
				}
			}
		}
		limit := T / 1000 // near-ties between fp32 (GPU) and float64 (host) scores only
		if name == "softmax-ties" {
			limit = 0 // exact ties are ties in both
		}
		if differ > limit {
			t.Errorf("%s: %d of %d tokens chose other experts than the host", name, differ, T)
		}
	}
}

// launchSource is a test kernel: block b writes b·10 + its rank in its
// thread-block cluster (0 without clusters, sm_90 and later only) + a.
const launchSource = `extern "C" __global__ void mark(int *out, int a) {
    unsigned r = 0;
#if MB_CLUSTER && defined(MB_HOST)
    r = mbhost_cluster_ctarank(); // the host simulation's (internal/hostsim)
#elif MB_CLUSTER
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    if (threadIdx.x == 0) out[blockIdx.x] = blockIdx.x * 10 + r + a;
}`

// TestGPULaunches: cooperative and extensible launches (cooperative; a
// 2-block cluster on sm_90 and later) run the kernel with its arguments in
// place and the cluster shape asked for.
func TestGPULaunches(t *testing.T) { checkLaunches(openPair(t)) }

func checkLaunches(p *gpuPair) {
	t := p.t
	c := p.c
	cluster := c.Arch >= "sm_90"
	defs := "-DMB_CLUSTER=0"
	if cluster {
		defs = "-DMB_CLUSTER=1"
	}
	cubin, err := c.JIT.Compiler.Compile("launch_test.cu", launchSource, nil, []string{"--gpu-architecture=" + c.Arch, defs})
	if err != nil {
		t.Fatal(err)
	}
	p.ok(c.MakeCurrent())
	m, err := c.Drv.LoadModule(cubin)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Drv.UnloadModule(m)
	f, err := c.Drv.Function(m, "mark")
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Alloc(4 * 4)
	if err != nil {
		t.Fatal(err)
	}
	grid, block := [3]uint32{4, 1, 1}, [3]uint32{32, 1, 1}
	cases := []struct {
		name   string
		launch func() error
		rank   func(b int) int // cluster rank of block b
	}{
		{"cooperative", func() error { return c.Drv.LaunchCooperative(f, grid, block, 0, p.cs, out, int32(7)) }, func(int) int { return 0 }},
		{"ex cooperative", func() error {
			return c.Drv.LaunchEx(f, grid, block, 0, p.cs, cuda.LaunchOptions{Cooperative: true}, out, int32(7))
		}, func(int) int { return 0 }},
	}
	if cluster {
		cases = append(cases, struct {
			name   string
			launch func() error
			rank   func(b int) int
		}{"ex cluster 2", func() error {
			return c.Drv.LaunchEx(f, grid, block, 0, p.cs, cuda.LaunchOptions{Cluster: [3]uint32{2, 1, 1}}, out, int32(7))
		}, func(b int) int { return b % 2 }})
	}
	got := make([]int32, 4)
	for _, tc := range cases {
		p.ok(c.Fill16(out, 0xffff, 8, p.cs))
		if err := tc.launch(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		p.ok(c.Download(got, out, p.cs))
		for b, v := range got {
			if want := int32(b*10 + tc.rank(b) + 7); v != want {
				t.Errorf("%s: block %d wrote %d, want %d", tc.name, b, v, want)
			}
		}
	}
	if !cluster {
		t.Logf("%s: no thread-block clusters; the cluster launch is not tested", c.Arch)
	}
}

// TestGPUNCCL: a communicator over the one GPU (one rank) moves random
// bytes to itself through NCCL, exactly, in one group with a transfer of no
// bytes, and the GPU's context is still usable afterwards. It skips when
// NCCL is not on the node (moebench doctor says where it looked).
func TestGPUNCCL(t *testing.T) {
	p := openPair(t)
	g := rand.New(rand.NewPCG(7, 8))
	v := randBF16(g, 1<<20+3)
	src, _ := p.put(v)
	dst, _ := p.out(len(v))
	th := device.NewThreads([]device.Device{p.c})
	defer th.Close()
	comm, err := OpenComm(th, []device.Device{p.c}, []device.Stream{p.cs})
	var no *NoCommError
	if errors.As(err, &no) {
		t.Skipf("no NCCL: %v", err)
	}
	p.ok(err)
	defer comm.Close()
	t.Log(comm.Name())
	n := int64(2 * len(v))
	p.ok(th.Each(func(int) error {
		return comm.Exchange(0, []PeerTransfer{{Buf: src, Bytes: n / 2}, {}, {Buf: src + device.Addr(n/2), Bytes: n - n/2}},
			[]PeerTransfer{{Buf: dst, Bytes: n / 2}, {}, {Buf: dst + device.Addr(n/2), Bytes: n - n/2}})
	}))
	got := make([]uint16, len(v))
	p.ok(p.c.Download(got, dst, p.cs))
	same(t, "NCCL self-exchange", got, v)
	extra, err := p.c.Alloc(16) // in the GPU's context again after NCCL
	p.ok(err)
	p.ok(p.c.Free(extra))
}
