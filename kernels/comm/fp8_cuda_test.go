package comm

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/moebench/moebench/internal/testutil"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// fp8Vec16 are fp8.cu's kernels, which move their rows as 16-byte global
// loads and stores (the SASS audit holds them to it).
var fp8Vec16 = map[string]bool{"quant_fp8_1x128": true, "quant_mxfp8": true, "dequant_fp8_1x128": true,
	"quant_fp8_rows": true, "dequant_fp8_rows": true, "fp8_rows_lt": true}

// fp8KernelRows are fp8Rows with blocks of exact ties added: blocks whose
// amax is 448·2^k (the quantization multiplier is then 2^-k, exact) made of
// midpoints between neighbouring e4m3 values times 2^k, so that the
// kernels' e4m3 rounding meets ties to even.
func fp8KernelRows(g *rand.Rand, rows, h int) []float32 {
	x := fp8Rows(g, rows, h, true)
	for b := 1; b < len(x)/kernels.FP8Block; b += 3 {
		k := g.IntN(21) - 10
		blk := x[b*kernels.FP8Block : (b+1)*kernels.FP8Block]
		for i := range blk {
			c := uint8(g.IntN(kernels.E4M3MaxBit))
			mid := (float64(kernels.E4M3ToFloat32(c)) + float64(kernels.E4M3ToFloat32(c+1))) / 2
			blk[i] = float32(math.Ldexp(mid, k) * float64(1-2*g.IntN(2)))
		}
		blk[g.IntN(kernels.FP8Block)] = float32(math.Ldexp(kernels.E4M3Max, k))
	}
	return x
}

// TestFP8KernelsOnHostSim runs fp8.cu's kernels on the host simulation on
// rows spanning many binades (with a zero block, blocks of amax below the
// 1e-4 clamp and blocks of exact ties) and holds them to the host
// functions bit for bit: the e4m3 codes, the fp32 and E8M0 scales and the
// dequantized bf16, with both scale kinds, both conversion flags, a grid
// of one block (every warp loops) and a full one, and block counts that
// leave warps partly idle.
func TestFP8KernelsOnHostSim(t *testing.T) {
	c := hostSimCUDA(t)
	checkFP8Kernels(t, c)
}

// TestGPUFP8 runs the checks on a GPU: on sm_89 and later with flags 0
// the e4m3 conversion is PTX's cvt.rn.satfinite.e4m3x2.f32, held here to
// the host reference bit for bit (every finite bf16 value included).
func TestGPUFP8(t *testing.T) { checkFP8Kernels(t, openPair(t).c) }

func checkFP8Kernels(t *testing.T, c device.Device) {
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	// 111 blocks of 128 (4 a warp), 444 of 32 (16 a warp)
	checkFP8KernelsOn(t, c, s, fp8KernelRows(rand.New(rand.NewPCG(34, 5)), 37, 384), 384)
	// every finite bf16 value, in bit order (510 blocks of 128): with UE8M0
	// scales each is scaled exactly, and ties to even meet every exponent
	var all []float32
	for b := range 1 << 16 {
		if b>>7&0xff != 0xff {
			all = append(all, math.Float32frombits(uint32(b)<<16))
		}
	}
	checkFP8KernelsOn(t, c, s, all, kernels.FP8Block)
}

func checkFP8KernelsOn(t *testing.T, c device.Device, s device.Stream, x []float32, h int) {
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	rows := len(x) / h
	xb := kernels.BF16Bits(x)
	if !testutil.SameBits(kernels.FromBF16Bits(xb), x) {
		t.Fatal("the inputs are not bf16 values")
	}
	n := int64(rows * h / kernels.FP8Block)
	nmx := int64(rows * h / kernels.MXBlock)
	px, _ := c.Alloc(int64(2 * len(x)))
	pq, _ := c.Alloc(int64(len(x)))
	ps, _ := c.Alloc(4 * n)
	pe, _ := c.Alloc(nmx)
	py, _ := c.Alloc(int64(2 * len(x)))
	ok(c.Upload(px, xb, s))
	poison := func() {
		ok(c.Fill16(pq, 0xA5A5, int64(len(x)/2), s))
		ok(c.Fill16(ps, 0xFFFF, 2*n, s))
		ok(c.Fill16(pe, 0xA5A5, nmx/2, s))
		ok(c.Fill16(py, 0x7FC1, int64(len(x)), s))
	}
	checked := 0
	for _, grid := range []func(n int64, size int) int{func(int64, int) int { return 1 }, func(n int64, size int) int { return kernels.FP8Grid(n, size, 1024) }} {
		for _, flags := range []int32{0, kernels.FP8UE8M0 | kernels.FP8MXRoundUp, kernels.FP8Soft | kernels.FP8MXRoundUp, kernels.FP8UE8M0 | kernels.FP8Soft} {
			poison()
			ok(c.LaunchProgram(device.FP8QuantProgram(), grid(n, kernels.FP8Block), s, px, n, flags, pq, ps))
			ok(c.LaunchProgram(device.FP8DequantProgram(), grid(n, kernels.FP8Block), s, pq, ps, n, py))
			gotQ, gotS, gotY := make([]uint16, len(x)/2), make([]float32, n), make([]uint16, len(x))
			ok(c.Download(gotQ, pq, s))
			ok(c.Download(gotS, ps, s))
			ok(c.Download(gotY, py, s))
			wantQ, wantS, err := kernels.QuantFP8Rows(x, h, flags&kernels.FP8UE8M0 != 0)
			ok(err)
			q, _ := device.HostBytes(gotQ)
			for i := range q {
				if q[i] != wantQ[i] {
					t.Fatalf("flags %d grid %d: quant_fp8_1x128 element %d (%g, block amax %g): %#02x, want %#02x", flags, grid(n, kernels.FP8Block), i, x[i],
						kernels.BlockAmax(x[i/kernels.FP8Block*kernels.FP8Block:(i/kernels.FP8Block+1)*kernels.FP8Block]), q[i], wantQ[i])
				}
			}
			if !testutil.SameBits(gotS, wantS) {
				t.Fatalf("flags %d: scales %v, want %v", flags, gotS[:8], wantS[:8])
			}
			wantY := kernels.BF16Bits(kernels.DequantFP8Rows(wantQ, wantS))
			for i := range gotY {
				if gotY[i] != wantY[i] {
					t.Fatalf("flags %d: dequant_fp8_1x128 element %d: %#04x, want %#04x", flags, i, gotY[i], wantY[i])
				}
			}
			checkFP8PackedRows(t, c, s, px, py, x, h, flags, grid(n, kernels.FP8Block), wantQ, wantS, wantY)
			poison()
			ok(c.LaunchProgram(device.MXFP8QuantProgram(), grid(nmx, kernels.MXBlock), s, px, nmx, flags, pq, pe))
			gotE := make([]uint16, nmx/2)
			ok(c.Download(gotQ, pq, s))
			ok(c.Download(gotE, pe, s))
			wantQ, wantE, err := kernels.QuantMXFP8(x, flags&kernels.FP8MXRoundUp != 0)
			ok(err)
			q, _ = device.HostBytes(gotQ)
			e, _ := device.HostBytes(gotE)
			for i := range q {
				if q[i] != wantQ[i] {
					t.Fatalf("flags %d: quant_mxfp8 element %d (%g): %#02x, want %#02x", flags, i, x[i], q[i], wantQ[i])
				}
			}
			for i := range e {
				if e[i] != wantE[i] {
					t.Fatalf("flags %d: quant_mxfp8 scale %d: %d, want %d", flags, i, e[i], wantE[i])
				}
			}
			checked++
		}
	}
	t.Logf("%d runs of the three kernels: %d values each, bit for bit", checked, len(x))
}

// checkFP8PackedRows runs quant_fp8_rows on the bf16 rows at px and
// dequant_fp8_rows on its packed rows, and holds every row's e4m3 codes,
// multipliers and dequantized values to the contiguous kernels' wanted
// ones bit for bit (the pad bytes after each row's multipliers untouched).
func checkFP8PackedRows(t *testing.T, c device.Device, s device.Stream, px, py device.Addr, x []float32, h int, flags int32, grid int, wantQ []uint8, wantS []float32, wantY []uint16) {
	t.Helper()
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	rows, S, pitch := len(x)/h, h/kernels.FP8Block, kernels.FP8RowPitch(h)
	n := int64(rows * S)
	pp, err := c.Alloc(int64(rows * pitch))
	ok(err)
	defer c.Free(pp)
	ok(c.Fill16(pp, 0xA5A5, int64(rows*pitch/2), s))
	ok(c.Fill16(py, 0x7FC1, int64(len(x)), s))
	ok(c.LaunchProgram(device.FP8QuantRowsProgram(), grid, s, px, n, flags, int32(S), int64(pitch), pp))
	ok(c.LaunchProgram(device.FP8DequantRowsProgram(), grid, s, pp, n, int32(S), int64(pitch), py))
	got, gotY := make([]uint16, rows*pitch/2), make([]uint16, len(x))
	ok(c.Download(got, pp, s))
	ok(c.Download(gotY, py, s))
	b, _ := device.HostBytes(got)
	for r := range rows {
		row := b[r*pitch : (r+1)*pitch]
		for i := range h {
			if row[i] != wantQ[r*h+i] {
				t.Fatalf("flags %d: quant_fp8_rows row %d element %d: %#02x, want %#02x", flags, r, i, row[i], wantQ[r*h+i])
			}
		}
		for j := range S {
			if g := math.Float32frombits(binary.LittleEndian.Uint32(row[h+4*j:])); math.Float32bits(g) != math.Float32bits(wantS[r*S+j]) {
				t.Fatalf("flags %d: quant_fp8_rows row %d scale %d: %g, want %g", flags, r, j, g, wantS[r*S+j])
			}
		}
		for i := h + 4*S; i < pitch; i++ {
			if row[i] != 0xA5 {
				t.Fatalf("quant_fp8_rows row %d wrote pad byte %d", r, i)
			}
		}
	}
	for i := range gotY {
		if gotY[i] != wantY[i] {
			t.Fatalf("flags %d: dequant_fp8_rows element %d: %#04x, want %#04x", flags, i, gotY[i], wantY[i])
		}
	}
}

// TestFP8SASS compiles fp8.cu once for each of sm_80 and sm_90 and reads
// the cubin's machine code twice over: every kernel (fp8_rows_lt and
// quant_fp8_lt among them) is held to the SASS audit's rules (sass_test.go:
// no local memory, registers for its block, 16-byte rows where fp8Vec16
// says) without TestKernelsCompile's every preset; and the e4m3 conversion
// is read: sm_90 converts with the hardware instruction (F2FP ... E4M3),
// sm_80 has none (the software conversion).
func TestFP8SASS(t *testing.T) {
	tool := cuobjdump(t)
	if tool == "" {
		t.Skip("no cuobjdump")
	}
	j := &device.JIT{Compiler: nvrtc(t)}
	for _, arch := range []string{"sm_80", "sm_90"} {
		cubin, err := j.Compile("fp8.cu", arch, nil)
		if err != nil {
			t.Fatal(err)
		}
		ks, err := readSASS(tool, cubin, true)
		if err != nil {
			t.Fatal(err)
		}
		lines, problems := auditKernels(ks, nil, true)
		for _, l := range lines {
			t.Logf("%s: %s", arch, l)
		}
		for _, p := range problems {
			t.Errorf("%s: %s", arch, p)
		}
		for _, name := range []string{"quant_fp8_1x128", "quant_mxfp8", "quant_fp8_lt", "quant_fp8_tensor"} {
			k := ks[name]
			if k == nil {
				t.Fatalf("%s: no %s in the cubin", arch, name)
			}
			n := k.has("F2FP", "E4M3")
			if (arch == "sm_90") != (n > 0) {
				t.Errorf("%s %s: %d e4m3 conversions (F2FP...E4M3); it has %s", arch, name, n, k.list("F2FP", "F2F", "I2F"))
			}
			t.Logf("%s %s: %s", arch, name, strings.Join(strings.Fields(k.list("F2FP")), " "))
		}
	}
}
