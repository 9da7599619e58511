package comm

import (
	"math"
	"math/rand/v2"
	"testing"

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
