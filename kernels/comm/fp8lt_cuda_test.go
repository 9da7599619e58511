package comm

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moebench/moebench/internal/testutil"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// TestFP8LtKernelsOnHostSim runs fp8.cu's FP8 GEMM operand kernels
// (fp8_rows_lt, quant_fp8_lt) on the host simulation and holds them to the
// host functions bit for bit (checkFP8LtKernels).
func TestFP8LtKernelsOnHostSim(t *testing.T) {
	c := hostSimCUDA(t)
	checkFP8LtKernels(t, c)
}

// TestGPUFP8Lt runs the same checks on a GPU (the hardware e4m3
// conversion on sm_89+ with flags 0).
func TestGPUFP8Lt(t *testing.T) { checkFP8LtKernels(t, openPair(t).c) }

// checkFP8LtKernels: fp8_rows_lt on quant_fp8_rows's packed rows (all of
// them, and a run of rows from the middle, as one expert's segment) gives
// QuantFP8Rows' codes and FP8ActScalesLt's order of its multipliers;
// quant_fp8_lt on bf16 rows of k = 384 (3 blocks), 176 (a partial last
// block) and 32 (one partial block), 37 rows and 1, gives QuantFP8RowsK's
// codes and FP8ActScalesLt's multipliers; both with a grid of one block
// and a full one, flags 0 and FP8Soft; outputs poisoned before, and the
// bytes after them untouched.
func checkFP8LtKernels(t *testing.T, c device.Device) {
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	s, err := c.NewStream()
	ok(err)
	const rows, h = 37, 384
	x := fp8KernelRows(rand.New(rand.NewPCG(34, 7)), rows, h)
	xb := kernels.BF16Bits(x)
	if !testutil.SameBits(kernels.FromBF16Bits(xb), x) {
		t.Fatal("the inputs are not bf16 values")
	}
	const tail = 64 // bytes after each output that no kernel may write
	S, pitch := h/kernels.FP8Block, kernels.FP8RowPitch(h)
	px, _ := c.Alloc(int64(2 * len(x)))
	pp, _ := c.Alloc(int64(rows * pitch))
	pq, _ := c.Alloc(int64(len(x) + tail))
	ps, _ := c.Alloc(int64(4*rows*S + tail))
	ok(c.Upload(px, xb, s))
	grids := []func(blocks int64) int{func(int64) int { return 1 }, func(b int64) int { return kernels.FP8Grid(b, kernels.FP8Block, 1024) }}
	check := func(what string, m, k int, wantQ []uint8, wantS []float32) {
		t.Helper()
		kb := (k + kernels.FP8Block - 1) / kernels.FP8Block
		gq, gs := make([]uint16, (m*k+tail)/2), make([]float32, (4*m*kb+tail)/4)
		ok(c.Download(gq, pq, s))
		ok(c.Download(gs, ps, s))
		q, _ := device.HostBytes(gq)
		for i := range m * k {
			if q[i] != wantQ[i] {
				t.Fatalf("%s: code %d (row %d): %#02x, want %#02x", what, i, i/k, q[i], wantQ[i])
			}
		}
		for i := m * k; i < m*k+tail; i++ {
			if q[i] != 0xA5 {
				t.Fatalf("%s: wrote byte %d after the %d codes", what, i, m*k)
			}
		}
		if !testutil.SameBits(gs[:m*kb], wantS) {
			t.Fatalf("%s: multipliers %v, want %v", what, gs[:min(8, m*kb)], wantS[:min(8, m*kb)])
		}
		for i := m * kb; i < len(gs); i++ {
			if math.Float32bits(gs[i]) != 0xA5A5A5A5 {
				t.Fatalf("%s: wrote multiplier %d after the %d", what, i, m*kb)
			}
		}
	}
	poison := func() {
		ok(c.Fill16(pq, 0xA5A5, int64((len(x)+tail)/2), s))
		ok(c.Fill16(ps, 0xA5A5, int64((4*rows*S+tail)/2), s))
	}
	n := int64(rows * S)
	ok(c.LaunchProgram(device.FP8QuantRowsProgram(), kernels.FP8Grid(n, kernels.FP8Block, 1024), s, px, n, int32(0), int32(S), int64(pitch), pp))
	q8, s8, err := kernels.QuantFP8Rows(x, h, false)
	ok(err)
	runs := 0
	for _, grid := range grids {
		for _, seg := range [][2]int{{0, rows}, {5, 13}} { // rows [lo, hi)
			lo, hi := seg[0], seg[1]
			m := hi - lo
			poison()
			ok(c.LaunchProgram(device.FP8RowsLtProgram(), grid(int64(m*S)), s, pp+device.Addr(lo*pitch), int32(m), int32(S), int64(pitch), pq, ps))
			check("fp8_rows_lt", m, h, q8[lo*h:hi*h], kernels.FP8ActScalesLt(s8[lo*S:hi*S], m, h))
			runs++
		}
		for _, k := range []int{384, 176, 32} {
			for _, m := range []int{rows, 1} {
				for _, flags := range []int32{0, kernels.FP8Soft} {
					xs := x[:m*k]
					kb := (k + kernels.FP8Block - 1) / kernels.FP8Block
					poison()
					ok(c.LaunchProgram(device.FP8QuantLtProgram(), grid(int64(m*kb)), s, px, int32(m), int32(k), flags, pq, ps))
					wq, ws := kernels.QuantFP8RowsK(xs, m, k)
					check("quant_fp8_lt", m, k, wq, kernels.FP8ActScalesLt(ws, m, k))
					runs++
				}
			}
		}
	}
	t.Logf("%d runs of fp8_rows_lt and quant_fp8_lt, bit for bit", runs)
}
