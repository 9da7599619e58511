package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/moebench/moebench/internal/cuda"
)

// GPU tests: every CUDA kernel against its host function on random inputs,
// outputs poisoned before each launch. They skip without a GPU, and fail
// under MOEBENCH_REQUIRE_GPU=1 (scripts/gpu-check.sh).
//
// Tolerances: data movement (permute, gather, chunk sort) must be exact;
// arithmetic kernels may differ from the host by one bf16 unit in the last
// place (the GPU's expf and the host's math.Exp differ in the last float
// bits, which can move a value across a bf16 rounding boundary); router
// choices must match except on near-ties, probabilities to 1e-5 relative.

type gpu struct {
	d   *cuda.Driver
	jit *JIT
	s   cuda.Stream
	t   *testing.T
}

func openGPU(t *testing.T) *gpu {
	t.Helper()
	need := os.Getenv("MOEBENCH_REQUIRE_GPU") == "1"
	skip := func(why string, err error) *gpu {
		if need {
			t.Fatalf("GPU required: %s: %v", why, err)
		}
		t.Skipf("no GPU: %s: %v", why, err)
		return nil
	}
	d, err := cuda.OpenDriver()
	if err != nil {
		return skip("driver", err)
	}
	if n, err := d.DeviceCount(); err != nil || n == 0 {
		return skip("device count", err)
	}
	if _, err := d.PrimaryContext(0); err != nil {
		return skip("context", err)
	}
	n, err := cuda.OpenNVRTC()
	if err != nil {
		return skip("NVRTC", err)
	}
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	return &gpu{d: d, jit: &JIT{NVRTC: n}, s: s, t: t}
}

// arch is the device's sm_XY.
func (g *gpu) arch() string {
	maj, _ := g.d.Attribute(0, cuda.AttrComputeCapabilityMajor)
	min, _ := g.d.Attribute(0, cuda.AttrComputeCapabilityMinor)
	return fmt.Sprintf("sm_%d%d", maj, min)
}

func (g *gpu) kernel(file, name string, defs map[string]string) cuda.Function {
	cubin, err := g.jit.Compile(file, g.arch(), defs)
	if err != nil {
		g.t.Fatal(err)
	}
	m, err := g.d.LoadModule(cubin)
	if err != nil {
		g.t.Fatal(err)
	}
	f, err := g.d.Function(m, name)
	if err != nil {
		g.t.Fatal(err)
	}
	return f
}

func upload[T any](g *gpu, v []T) cuda.DevicePtr {
	var z T
	p, err := g.d.Alloc(int64(len(v)) * int64(sizeOf(z)))
	if err != nil {
		g.t.Fatal(err)
	}
	if err := cuda.CopyToDevice(g.d, p, v, g.s); err != nil {
		g.t.Fatal(err)
	}
	return p
}

func sizeOf(v any) int {
	switch v.(type) {
	case uint16:
		return 2
	case float32, int32:
		return 4
	}
	panic("sizeOf")
}

// poisoned allocates n elements of 16-bit words filled with a bf16 NaN.
func (g *gpu) poisoned(n int) cuda.DevicePtr {
	p, err := g.d.Alloc(int64(2 * n))
	if err != nil {
		g.t.Fatal(err)
	}
	if err := g.d.Fill16(p, 0x7fc0, int64(n), g.s); err != nil {
		g.t.Fatal(err)
	}
	return p
}

func download[T any](g *gpu, p cuda.DevicePtr, n int) []T {
	out := make([]T, n)
	if err := cuda.CopyFromDevice(g.d, out, p, g.s); err != nil {
		g.t.Fatal(err)
	}
	if err := g.d.SyncStream(g.s); err != nil {
		g.t.Fatal(err)
	}
	return out
}

func (g *gpu) launch(f cuda.Function, grid, block uint32, args ...any) {
	if err := g.d.Launch(f, [3]uint32{grid, 1, 1}, [3]uint32{block, 1, 1}, 0, g.s, args...); err != nil {
		g.t.Fatal(err)
	}
	if err := g.d.SyncStream(g.s); err != nil {
		g.t.Fatal(err)
	}
}

func bits(v []float32) []uint16 {
	out := make([]uint16, len(v))
	for i, x := range v {
		out[i] = uint16(math.Float32bits(RoundBF16(x)) >> 16)
	}
	return out
}

func widenBits(b []uint16) []float32 {
	out := make([]float32, len(b))
	for i, x := range b {
		out[i] = math.Float32frombits(uint32(x) << 16)
	}
	return out
}

func randBF16(g *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		for v[i] == 0 {
			v[i] = RoundBF16(float32(g.NormFloat64()))
		}
	}
	return v
}

// withinULP: equal, or neighbouring bf16 values.
func withinULP(a, b uint16) bool {
	d := int(a) - int(b)
	return d >= -1 && d <= 1
}

func TestGPUPermuteAndGather(t *testing.T) {
	g := openGPU(t)
	r := rand.New(rand.NewPCG(1, 2))
	const T, k, E, h = 300, 4, 16, 1024
	x := randBF16(r, T*h)
	probs := randBF16(r, T*k)
	idx := make([]int32, T*k)
	for i := range idx {
		idx[i] = int32(r.IntN(E))
	}
	slots, _ := PermuteOrder(idx, T, k, E, nil, nil)
	want := make([]float32, T*k*h)
	GatherRows(want, x, slots, k, h)
	f := g.kernel("permute.cu", "permute_rows", map[string]string{"MB_HIDDEN": "1024"})
	dst := g.poisoned(T * k * h)
	g.launch(f, T*k, 128, upload(g, bits(x)), upload(g, slots), int32(k), int32(T*k), dst)
	if got := download[uint16](g, dst, T*k*h); !slices.Equal(got, bits(want)) {
		t.Error("permute_rows differs from GatherRows")
	}
	wantP := make([]float32, T*k)
	GatherRows(wantP, probs, slots, 1, 1)
	fg := g.kernel("permute.cu", "gather_f32", map[string]string{"MB_HIDDEN": "1024"})
	dp := g.poisoned(2 * T * k)
	g.launch(fg, 16, 256, upload(g, probs), upload(g, slots), int32(1), int32(T*k), dp)
	if got := download[float32](g, dp, T*k); !slices.Equal(got, wantP) {
		t.Error("gather_f32 differs from GatherRows")
	}
}

func TestGPUSwiGLUAndUnpermute(t *testing.T) {
	g := openGPU(t)
	r := rand.New(rand.NewPCG(3, 4))
	const n, f, T, k, h = 257, 512, 200, 4, 256
	h1 := randBF16(r, n*2*f)
	prob := randBF16(r, n)
	want := make([]float32, n*f)
	SwiGLUProb(want, h1, prob, n, f)
	RoundBF16Slice(want)
	fs := g.kernel("swiglu.cu", "swiglu_prob", map[string]string{"MB_FFN": "512"})
	act := g.poisoned(n * f)
	g.launch(fs, 64, 256, upload(g, bits(h1)), upload(g, prob), int32(n), act)
	got := download[uint16](g, act, n*f)
	for i, w := range bits(want) {
		if !withinULP(got[i], w) {
			t.Fatalf("swiglu_prob[%d] = %v, host %v", i, widenBits(got[i : i+1])[0], want[i])
		}
	}
	// unpermute: rows of src are the permuted copies; pos maps slots to rows
	idx := make([]int32, T*k)
	for tok := range T {
		for j, e := range r.Perm(32)[:k] {
			idx[tok*k+j] = int32(e)
		}
	}
	slots, _ := PermuteOrder(idx, T, k, 32, nil, nil)
	pos := make([]int32, T*k)
	for row, s := range slots {
		pos[s] = int32(row)
	}
	src := randBF16(r, T*k*h)
	shared := randBF16(r, T*h)
	wantY := make([]float32, T*h)
	ScatterAddRows(wantY, src, slots, k, h)
	RoundBF16Slice(wantY)
	for i := range wantY {
		wantY[i] = RoundBF16(wantY[i] + shared[i])
	}
	fu := g.kernel("unpermute.cu", "unpermute_sum", map[string]string{"MB_HIDDEN": "256", "MB_TOPK": "4"})
	out := g.poisoned(T * h)
	g.launch(fu, T, 128, upload(g, bits(src)), upload(g, pos), upload(g, bits(shared)), int32(T), out)
	gotY := download[uint16](g, out, T*h)
	for i, w := range bits(wantY) {
		if !withinULP(gotY[i], w) {
			t.Fatalf("unpermute_sum[%d] = %v, host %v", i, widenBits(gotY[i : i+1])[0], wantY[i])
		}
	}
}

func TestGPUSortChunks(t *testing.T) {
	g := openGPU(t)
	r := rand.New(rand.NewPCG(5, 6))
	const ep, L, h = 8, 4, 512
	counts := make([]int32, ep*L)
	total := 0
	for i := range counts {
		if r.IntN(5) > 0 { // some chunks empty
			counts[i] = int32(r.IntN(40))
		}
		total += int(counts[i])
	}
	src := randBF16(r, total*h)
	probs := randBF16(r, total)
	// host: [source][local] → [local][source]
	var want, wantP []float32
	off := make([]int, ep*L)
	for c, a := 1, 0; c <= ep*L; c++ {
		off[c-1] = a
		a += int(counts[c-1])
	}
	for l := range L {
		for s := range ep {
			c := s*L + l
			want = append(want, src[off[c]*h:(off[c]+int(counts[c]))*h]...)
			wantP = append(wantP, probs[off[c]:off[c]+int(counts[c])]...)
		}
	}
	defs := map[string]string{"MB_HIDDEN": "512", "MB_EP": "8", "MB_LOCAL": "4"}
	f := g.kernel("sortchunks.cu", "sort_chunks", defs)
	dst, dp := g.poisoned(total*h), g.poisoned(2*total)
	g.launch(f, 64, 128, upload(g, bits(src)), upload(g, probs), upload(g, counts), int32(total), dst, dp)
	if got := download[uint16](g, dst, total*h); !slices.Equal(got, bits(want)) {
		t.Error("sort_chunks rows differ from the host chunk sort")
	}
	if got := download[float32](g, dp, total); !slices.Equal(got, wantP) {
		t.Error("sort_chunks probabilities differ from the host chunk sort")
	}
}

func TestGPURouter(t *testing.T) {
	g := openGPU(t)
	r := rand.New(rand.NewPCG(7, 8))
	const T = 1000
	cases := []struct {
		name string
		c    RouterConfig
		defs map[string]string
	}{
		{"softmax", RouterConfig{Experts: 128, TopK: 8, Score: ScoreSoftmax, Scale: 1},
			map[string]string{"MB_EXPERTS": "128", "MB_TOPK": "8", "MB_SIGMOID": "0", "MB_GROUPS": "0", "MB_GROUP_TOPK": "0", "MB_SCALE": "1.0f"}},
		{"sigmoid-grouped", RouterConfig{Experts: 256, TopK: 8, Score: ScoreSigmoid, Groups: 8, GroupTopK: 4, Scale: 2.5},
			map[string]string{"MB_EXPERTS": "256", "MB_TOPK": "8", "MB_SIGMOID": "1", "MB_GROUPS": "8", "MB_GROUP_TOPK": "4", "MB_SCALE": "2.5f"}},
	}
	for _, tc := range cases {
		E, k := tc.c.Experts, tc.c.TopK
		logits := make([]float32, T*E)
		for i := range logits {
			logits[i] = float32(r.NormFloat64())
		}
		bias := make([]float32, E)
		for i := range bias {
			bias[i] = float32(0.01 * r.NormFloat64())
		}
		if tc.c.Score == ScoreSigmoid {
			tc.c.Bias = bias
		}
		wantIdx, wantP := make([]int32, T*k), make([]float32, T*k)
		Route(tc.c, logits, T, wantIdx, wantP)
		f := g.kernel("router.cu", "router_topk", tc.defs)
		di, dp := g.poisoned(2*T*k), g.poisoned(2*T*k)
		g.launch(f, (T+3)/4, 128, upload(g, logits), upload(g, bias), int32(T), di, dp)
		gotIdx, gotP := download[int32](g, di, T*k), download[float32](g, dp, T*k)
		differ := 0
		for tok := range T {
			if !slices.Equal(gotIdx[tok*k:(tok+1)*k], wantIdx[tok*k:(tok+1)*k]) {
				differ++
				continue
			}
			for j := range k {
				w, x := wantP[tok*k+j], gotP[tok*k+j]
				if math.Abs(float64(w-x)) > 1e-5*math.Abs(float64(w)) {
					t.Fatalf("%s token %d: prob %v, host %v", tc.name, tok, x, w)
				}
			}
		}
		if differ > T/1000 { // near-ties between fp32 (GPU) and float64 (host) scores only
			t.Errorf("%s: %d of %d tokens chose other experts than the host", tc.name, differ, T)
		}
	}
}
