package comm

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// TestFP8TensorKernelsOnHostSim runs fp8.cu's per-tensor quantization
// (amax_fp8_tensor, then quant_fp8_tensor) on the host simulation and
// holds it to kernels.QuantFP8Tensor bit for bit (checkFP8TensorKernels);
// TestFP8TensorKernelsOnEmu holds the Emu twins to the same.
func TestFP8TensorKernelsOnHostSim(t *testing.T) { checkFP8TensorKernels(t, hostSimCUDA(t)) }

func TestFP8TensorKernelsOnEmu(t *testing.T) { checkFP8TensorKernels(t, &device.Emu{SMs: 4}) }

// TestGPUFP8Tensor runs the same checks on a GPU (the hardware e4m3
// conversion on sm_89+ with flags 0).
func TestGPUFP8Tensor(t *testing.T) { checkFP8TensorKernels(t, openPair(t).c) }

// checkFP8TensorKernels: tensors of 37 rows of 384 (magnitudes 2^-30…2^12
// from block to block: most of a tensor's values become e4m3 subnormals
// or zeros), a run of 13 rows from the middle (one expert's segment), an
// odd count, a zero tensor (amax clamped to 1e-4) and a tensor of exact
// e4m3 ties (amax 448·2^k: the multiplier is 2^-k, every other value a
// midpoint), a grid of one block and a full grid, flags 0 and FP8Soft:
// codes and multiplier equal QuantFP8Tensor's, outputs poisoned before and
// the bytes after them untouched. Two amax launches onto one word take
// the max of both halves.
func checkFP8TensorKernels(t *testing.T, c device.Device) {
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	s, err := c.NewStream()
	ok(err)
	g := rand.New(rand.NewPCG(34, 11))
	const rows, h, tail = 37, 384, 64
	x := fp8KernelRows(g, rows, h)
	ties := make([]float32, 5*h)
	k := g.IntN(21) - 10
	for i := range ties {
		c := uint8(g.IntN(kernels.E4M3MaxBit))
		mid := (kernels.E4M3ToFloat32(c) + kernels.E4M3ToFloat32(c+1)) / 2
		if g.IntN(2) == 0 {
			mid = -mid
		}
		ties[i] = float32(math.Ldexp(float64(mid), k))
	}
	ties[77] = float32(math.Ldexp(448, k))
	zeros := make([]float32, 3*h)
	px, _ := c.Alloc(int64(2 * len(x)))
	pq, _ := c.Alloc(int64(len(x) + tail))
	ps, _ := c.Alloc(4 + tail)
	pa, _ := c.Alloc(4)
	grids := []func(n int64) int{func(int64) int { return 1 }, func(n int64) int { return kernels.FP8Grid(n/kernels.FP8Block+1, kernels.FP8Block, 1024) }}
	runs := 0
	for _, tc := range []struct {
		what string
		x    []float32
	}{{"37 rows", x}, {"rows 5..17", x[5*h : 18*h]}, {"odd count", x[:3*h+77]}, {"zeros", zeros}, {"ties", ties}} {
		xb := kernels.BF16Bits(tc.x)
		if len(xb)%2 == 1 { // Upload takes whole words: the count after the last value is never read
			xb = append(xb, 0x7FC0)
		}
		ok(c.Upload(px, xb, s))
		n := int64(len(tc.x))
		wantQ, wantS := kernels.QuantFP8Tensor(tc.x)
		for _, grid := range grids {
			for _, flags := range []int32{0, kernels.FP8Soft} {
				ok(c.Fill16(pq, 0xA5A5, (n+tail+1)/2, s))
				ok(c.Fill16(ps, 0xA5A5, (4+tail)/2, s))
				ok(c.Fill16(pa, 0, 2, s))
				half := n / 2 // two launches onto one word
				ok(c.LaunchProgram(device.FP8AmaxTensorProgram(), grid(half), s, px, half, pa))
				ok(c.LaunchProgram(device.FP8AmaxTensorProgram(), grid(n-half), s, px+device.Addr(2*half), n-half, pa))
				ok(c.LaunchProgram(device.FP8QuantTensorProgram(), grid(n), s, px, n, flags, pa, pq, ps))
				gq, gs := make([]uint16, (n+tail+1)/2), make([]float32, (4+tail)/4)
				ok(c.Download(gq, pq, s))
				ok(c.Download(gs, ps, s))
				q, _ := device.HostBytes(gq)
				for i := range n {
					if q[i] != wantQ[i] {
						t.Fatalf("%s, flags %d: code %d: %#02x, want %#02x (value %g)", tc.what, flags, i, q[i], wantQ[i], tc.x[i])
					}
				}
				for i := n; i < n+tail; i++ {
					if q[i] != 0xA5 {
						t.Fatalf("%s: wrote byte %d after the %d codes", tc.what, i, n)
					}
				}
				if math.Float32bits(gs[0]) != math.Float32bits(wantS) {
					t.Fatalf("%s: multiplier %g, want %g", tc.what, gs[0], wantS)
				}
				for i := 1; i < len(gs); i++ {
					if math.Float32bits(gs[i]) != 0xA5A5A5A5 {
						t.Fatalf("%s: wrote multiplier word %d", tc.what, i)
					}
				}
				runs++
			}
		}
	}
	t.Logf("%d runs of amax_fp8_tensor + quant_fp8_tensor, bit for bit", runs)
}

// TestFP8TensorChainOnHostSim: the per-tensor FP8 GEMM as a device runs it
// end to end — bf16 activations quantized per tensor on the device
// (amax_fp8_tensor, quant_fp8_tensor), weights quantized per tensor on the
// host (QuantFP8Tensor), cuBLASLt's per-tensor FP8 GEMM (SCALAR_32F: the
// two multipliers through A_SCALE_POINTER and B_SCALE_POINTER) through
// Grouped with FP8Tensor, bf16 out — on the cuda device over the host
// simulation's fake cuBLASLt and on Emu: both equal the host design
// (QuantFP8Tensor, FP8GEMM) bit for bit and the float64 product of the
// same quantized operands within FP8GEMMBound. Broken on purpose (the
// GEMM given the weights' multiplier for the activations', or the
// activations' multiplier doubled) the bound is exceeded.
func TestFP8TensorChainOnHostSim(t *testing.T) {
	useHostSim(t)
	checkFP8TensorChain(openPair(t), true)
}

func checkFP8TensorChain(p *gpuPair, exact bool) {
	t := p.t
	const m, n, k = 77, 192, 256
	g := rand.New(rand.NewPCG(34, 12))
	draw := func(rows int) []float32 {
		x := make([]float32, rows*k)
		for i := range x { // magnitudes 2^-3…2^3 from row to row
			x[i] = kernels.RoundBF16(float32(g.NormFloat64() * math.Ldexp(1, (i/k)%7-3)))
		}
		return x
	}
	a, w := draw(m), draw(n)
	qa, sa := kernels.QuantFP8Tensor(a)
	qw, sw := kernels.QuantFP8Tensor(w)
	want := kernels.BF16Bits(kernels.FP8GEMM(cuda.FP8Tensor, m, n, k, qa, []float32{sa}, qw, []float32{sw}))
	var xa, dq, ds, dam, dw, dsw, dbad, c [2]device.Addr
	xa[0], xa[1] = p.put(kernels.BF16Bits(a))
	dq[0], dq[1] = p.out((m*k + 1) / 2)
	ds[0], ds[1] = p.out(2)
	dam[0], dam[1] = p.out(2)
	dw[0], dw[1] = p.put(packBytes(qw))
	dsw[0], dsw[1] = p.put([]float32{sw})
	dbad[0], dbad[1] = p.put([]float32{2 * sa})
	ref := func(got []uint16) (worst float64, over int) {
		for i := range m {
			for j := range n {
				var r, abs float64
				for q := range k {
					v := float64(kernels.E4M3ToFloat32(qa[i*k+q])) * float64(sa) * float64(kernels.E4M3ToFloat32(qw[j*k+q])) * float64(sw)
					r += v
					abs += math.Abs(v)
				}
				e := math.Abs(float64(math.Float32frombits(uint32(got[i*n+j])<<16)) - r)
				b := kernels.FP8GEMMBound(cuda.FP8Tensor, k, abs, true, r)
				worst = max(worst, e/b)
				if e > b {
					over++
				}
			}
		}
		return worst, over
	}
	for _, tc := range []struct {
		name   string
		aScale func(d int) device.Addr
		broken bool
	}{
		{"the activations' multiplier", func(d int) device.Addr { return ds[d] }, false},
		{"the weights' multiplier for the activations'", func(d int) device.Addr { return dsw[d] }, true},
		{"the activations' multiplier doubled", func(d int) device.Addr { return dbad[d] }, true},
	} {
		for d, dev := range []device.Device{p.c, p.e} {
			s := []device.Stream{p.cs, p.es}[d]
			if d == 0 {
				c[0], c[1] = p.out(m * n)
			}
			p.ok(dev.Fill16(dam[d], 0, 2, s))
			p.ok(dev.LaunchProgram(device.FP8AmaxTensorProgram(), 8, s, xa[d], int64(m*k), dam[d]))
			p.ok(dev.LaunchProgram(device.FP8QuantTensorProgram(), 8, s, xa[d], int64(m*k), int32(0), dam[d], dq[d], ds[d]))
			gr, err := device.NewGrouped(dev, 0)
			p.ok(err)
			gr.FP8 = cuda.FP8Tensor
			p.ok(gr.Run(dev, []device.Group{{C: c[d], A: dq[d], W: dw[d], M: m, AScale: tc.aScale(d), WScale: dsw[d]}}, n, k, s))
		}
		p.ok(p.c.SyncStream(p.cs))
		gpu, host := get[uint16](p, c[0], c[1], m*n)
		worst, over := ref(gpu)
		t.Logf("%s: %d of %d outputs beyond the bound (worst ×%.3g)", tc.name, over, m*n, worst)
		if tc.broken {
			if over == 0 {
				t.Errorf("%s: the check passed", tc.name)
			}
			continue
		}
		if over > 0 {
			t.Errorf("%d outputs beyond the bound (×%.3g)", over, worst)
		}
		for j := range want {
			if host[j] != want[j] {
				t.Fatalf("Emu c[%d] = %#x, the host design %#x", j, host[j], want[j])
			}
			if exact && gpu[j] != host[j] {
				t.Fatalf("cuda device c[%d] = %#x, Emu %#x", j, gpu[j], host[j])
			}
		}
	}
}
