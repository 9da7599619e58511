package deepep

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/moebench/moebench/dispatchers"
	dt "github.com/moebench/moebench/dispatchers/dispatchtest"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// The fp8 dispatch on devices (deepep.cu with MB_DE_DHIDDEN): each rank's
// input is packed rows (a row's hidden e4m3 bytes, its hidden/128 fp32
// scales, padding to 16 bytes: kernels.FP8RowPitch), quantized by the
// caller before the dispatch as DeepEP's callers do; the device design
// moves them, and the permuted rows the experts get must be the host
// design's fp8 dispatch (its e4m3 values with their scales, in each
// token's queue slot) byte for byte; the combine stays bf16 and its
// output bit for bit the host's.

// fp8Ranks are tagged ranks (random bf16 rows, never all zero) quantized
// in 1×128 blocks with DeepEP's rule: X holds the e4m3 values, Scales the
// multipliers (the host design's fp8 input), with mild probabilities.
func fp8Ranks(t *testing.T, sh dispatchers.Shape, seed uint64) []*dispatchers.Rank {
	t.Helper()
	ranks := dt.Tagged(sh, seed)
	g := rand.New(rand.NewPCG(seed, 2))
	for _, rk := range ranks {
		for i := range rk.X { // blocks of different magnitudes: different scales
			rk.X[i] = kernels.RoundBF16(rk.X[i] * float32(math.Ldexp(1, (i/dispatchers.FP8Block)%9-4)))
		}
		q, s, err := kernels.QuantFP8Rows(rk.X, sh.Hidden, false)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range q {
			rk.X[i] = kernels.E4M3ToFloat32(c)
		}
		rk.Scales = s
		for i := range rk.Probs {
			rk.Probs[i] = dt.Mild(i%sh.TopK) + float32(g.IntN(8))/64
		}
	}
	return ranks
}

// packRows are n rows of e4m3 values x and their scales as packed rows of
// pitch bytes (pad bytes 0xA5), as little-endian 16-bit words.
func packRows(x, scales []float32, h, pitch int) []uint16 {
	n, S := len(x)/h, h/dispatchers.FP8Block
	b := make([]byte, n*pitch)
	for i := range n {
		row := b[i*pitch : (i+1)*pitch]
		for j := range h {
			row[j] = kernels.E4M3FromFloat32(x[i*h+j])
		}
		for j := range S {
			binary.LittleEndian.PutUint32(row[h+4*j:], math.Float32bits(scales[i*S+j]))
		}
		for j := h + 4*S; j < pitch; j++ {
			row[j] = 0xA5
		}
	}
	w := make([]uint16, len(b)/2)
	for i := range w {
		w[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return w
}

// fp8Case is one run of the fp8 forward: the shape (DispatchHidden set),
// the ranks' devices, and the queues.
type fp8Case struct {
	name string
	sh   dispatchers.Shape
	ndev int
	cfg  Config
}

// fp8Cases: hidden 256 (two scales, packed rows of 272 bytes: 8 bytes of
// padding) and 384 (400 bytes), ranks on one device and on two, rings
// smaller than a channel's tokens.
func fp8Cases() []fp8Case {
	cfg := func(sms, warps int) Config {
		return Config{SMs: sms, Dispatch: Queue{Chunk: 2, Ring: 5}, Combine: Queue{Chunk: 3, Ring: warps + 2}, Warps: warps, MinBlocks: 4}
	}
	sh := func(T, h, E, k, ep int) dispatchers.Shape {
		return dispatchers.Shape{Tokens: T, Hidden: h, DispatchHidden: kernels.FP8RowPitch(h) / 2, Experts: E, TopK: k, EP: ep}
	}
	return []fp8Case{
		{"ep2-h256-one-device", sh(37, 256, 16, 6, 2), 1, cfg(4, 4)},
		{"ep4-h384-two-devices", sh(29, 384, 16, 5, 4), 2, cfg(2, 4)},
	}
}

// runFP8 runs c's forward once on devs with d: the ranks' packed rows
// uploaded, the experts computing bf16(dequant(x)·p + 1) on the host from
// the rows they got; it returns each rank's permuted packed rows and
// probabilities, its output, or the error.
func runFP8(t *testing.T, d *Device, c fp8Case, devs []device.Device, ranks []*dispatchers.Rank) (rows [][]uint16, probs, y [][]float32, err error) {
	t.Helper()
	sh := c.sh
	T, k, hd, dw := sh.Tokens, sh.TopK, sh.Hidden, sh.DispatchWidth()
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	drs := make([]*dispatchers.DeviceRank, sh.EP)
	for r, rk := range ranks {
		dev := devs[r*len(devs)/sh.EP]
		dr := &dispatchers.DeviceRank{ID: r, Dev: dev}
		var err error
		dr.Stream, err = dev.NewStream()
		ok(err)
		_, err = device.Resize(dev, 1, device.RowBuffer{P: &dr.X, PerRow: int64(2 * T * dw)}, device.RowBuffer{P: &dr.Idx, PerRow: int64(4 * T * k)},
			device.RowBuffer{P: &dr.Probs, PerRow: int64(4 * T * k)}, device.RowBuffer{P: &dr.Y, PerRow: int64(2 * T * hd)})
		ok(err)
		ok(dev.Upload(dr.X, packRows(rk.X, rk.Scales, hd, 2*dw), dr.Stream))
		ok(dev.Upload(dr.Idx, rk.Idx, dr.Stream))
		ok(dev.Upload(dr.Probs, rk.Probs, dr.Stream))
		ok(dev.Fill16(dr.Y, 0x7fc0, int64(T*hd), dr.Stream)) // NaN: every value must be written
		drs[r] = dr
		t.Cleanup(func() { device.Free(dev, &dr.X, &dr.Idx, &dr.Probs, &dr.Y, &dr.ExpertY) })
	}
	th := dt.Threads(t, drs)
	if err := d.Bind(sh, drs); err != nil {
		return nil, nil, nil, err
	}
	t.Cleanup(func() { d.Close() })
	rows, probs = make([][]uint16, sh.EP), make([][]float32, sh.EP)
	outs := make([]device.RowCapacity, sh.EP)
	experts := func(r int) error {
		dr := drs[r]
		n := dr.Rows()
		x, p := make([]uint16, n*dw), make([]float32, n)
		if err := dr.Dev.Download(x, dr.ExpertX, dr.Stream); err != nil {
			return err
		}
		if err := dr.Dev.Download(p, dr.ExpertProbs, dr.Stream); err != nil {
			return err
		}
		rows[r], probs[r] = x, p
		ey := make([]float32, n*hd)
		for i := range n {
			v, s := unpackRow(x[i*dw:(i+1)*dw], hd)
			for j := range hd {
				ey[i*hd+j] = dt.Expert(fp8Dequant(v[j], s[j/dispatchers.FP8Block]), p[i])
			}
		}
		if err := outs[r].Ensure(dr.Dev, dr.Stream, n, device.RowBuffer{P: &dr.ExpertY, PerRow: int64(2 * hd)}); err != nil {
			return err
		}
		return dr.Dev.Upload(dr.ExpertY, kernels.BF16Bits(ey), dr.Stream)
	}
	if err := dt.IssuePhases(th, d, drs, d.Forward(experts)); err != nil {
		return nil, nil, nil, err
	}
	for _, dr := range drs {
		ok(dr.Dev.SyncStream(dr.Stream))
	}
	if err := d.CheckStep(); err != nil {
		return nil, nil, nil, err
	}
	for _, dr := range drs {
		out := make([]uint16, T*hd)
		ok(dr.Dev.Download(out, dr.Y, dr.Stream))
		y = append(y, kernels.FromBF16Bits(out))
	}
	return rows, probs, y, nil
}

// unpackRow is a packed row's e4m3 values and scales.
func unpackRow(w []uint16, h int) ([]float32, []float32) {
	b := make([]byte, 2*len(w))
	for i, x := range w {
		binary.LittleEndian.PutUint16(b[2*i:], x)
	}
	v, s := make([]float32, h), make([]float32, h/dispatchers.FP8Block)
	for j := range v {
		v[j] = kernels.E4M3ToFloat32(b[j])
	}
	for j := range s {
		s[j] = math.Float32frombits(binary.LittleEndian.Uint32(b[h+4*j:]))
	}
	return v, s
}

// fp8Dequant is the experts' bf16(fl32(e4m3·inv)).
func fp8Dequant(v, inv float32) float32 { return kernels.RoundBF16(v * inv) }

// hostFP8 is the host design's fp8 forward on ranks with the same
// experts: each rank's permuted rows packed (the pad bytes as the
// sources'), probabilities and output (bf16).
func hostFP8(t *testing.T, c fp8Case, ranks []*dispatchers.Rank) (rows [][]uint16, probs, y [][]float32) {
	t.Helper()
	sh := c.sh
	hd := sh.Hidden
	h := WithConfig(c.cfg)
	dt.Bind(t, h, sh, ranks)
	experts := func(r int) error {
		rk := ranks[r]
		n := len(rk.ExpertProbs)
		rk.ExpertY = kernels.Reslice(rk.ExpertY, n*hd)
		for i := range n * hd {
			rk.ExpertY[i] = dt.Expert(fp8Dequant(rk.ExpertX[i], rk.ExpertScales[i/dispatchers.FP8Block]), rk.ExpertProbs[i/hd])
		}
		return nil
	}
	for _, st := range h.Forward(experts) {
		for r := range ranks {
			if err := st.Run(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !h.fp8 {
		t.Fatal("the host design did not take the fp8 path")
	}
	for _, rk := range ranks {
		n := len(rk.ExpertProbs)
		rows = append(rows, packRows(rk.ExpertX[:n*hd], rk.ExpertScales, hd, 2*sh.DispatchWidth()))
		probs = append(probs, slices.Clone(rk.ExpertProbs[:n]))
		out := slices.Clone(rk.Y)
		kernels.RoundBF16Slice(out)
		y = append(y, out)
	}
	return rows, probs, y
}

// checkFP8 runs the fp8 cases on devs against the host design.
func checkFP8(t *testing.T, devs []device.Device) {
	for _, c := range fp8Cases() {
		t.Run(c.name, func(t *testing.T) {
			if c.ndev > len(devs) {
				t.Skipf("needs %d devices", c.ndev)
			}
			if _, emu := devs[0].(*device.Emu); !emu && c.ndev > 1 {
				hostsim.SkipIfShort(t, "ep2-h256-one-device")
			}
			wantRows, wantP, wantY := hostFP8(t, c, fp8Ranks(t, c.sh, 11))
			var (
				rows  [][]uint16
				probs [][]float32
				y     [][]float32
				err   error
			)
			d := WithDeviceConfig(c.cfg)
			hostsim.WithinNamed(t, 2*time.Minute, "deepep's fp8 forward", func() {
				rows, probs, y, err = runFP8(t, d, c, devs[:c.ndev], fp8Ranks(t, c.sh, 11))
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := sameFP8(c, rows, probs, y, wantRows, wantP, wantY); err != nil {
				t.Fatal(err)
			}
			// DeepEP's convention at fp8: each received token's hidden e4m3
			// bytes and hidden/128 fp32 scales; the combine bf16 rows
			tokens := 0
			for r := range d.st {
				tokens += d.st[r].tokens
			}
			h := int64(c.sh.Hidden)
			tr := d.Traffic()
			if want := int64(tokens) * (h + h/dispatchers.FP8Block*4); tr.DispatchAlgorithm != want || tr.CombineAlgorithm != int64(tokens)*2*h {
				t.Errorf("algorithm bytes: dispatch %d, combine %d; want %d (fp8 rows) and %d (bf16)", tr.DispatchAlgorithm, tr.CombineAlgorithm, want, int64(tokens)*2*h)
			}
		})
	}
}

// sameFP8 says where a device run differs from the host design's.
func sameFP8(c fp8Case, rows [][]uint16, probs, y [][]float32, wantRows [][]uint16, wantP, wantY [][]float32) error {
	dw, hd := c.sh.DispatchWidth(), c.sh.Hidden
	n := 0
	for r := range wantRows {
		n += len(wantP[r])
		if len(rows[r]) != len(wantRows[r]) || !slices.Equal(probs[r], wantP[r]) {
			return fmt.Errorf("rank %d: %d rows, probabilities %v; the host design's %d, %v", r, len(rows[r])/dw, probs[r], len(wantRows[r])/dw, wantP[r])
		}
		for i := range len(rows[r]) / dw {
			if !slices.Equal(rows[r][i*dw:(i+1)*dw], wantRows[r][i*dw:(i+1)*dw]) {
				return fmt.Errorf("rank %d row %d: the packed fp8 row (e4m3 values, scales, padding) differs from the host design's", r, i)
			}
		}
		for i, v := range y[r] {
			if v != wantY[r][i] {
				return fmt.Errorf("rank %d output %d (token %d): %v, the host design's %v", r, i, i/hd, v, wantY[r][i])
			}
		}
	}
	if n == 0 {
		return fmt.Errorf("no rows dispatched")
	}
	return nil
}

// TestDeviceFP8OnEmu: the fp8 forward through the kernels' twins.
func TestDeviceFP8OnEmu(t *testing.T) { checkFP8(t, emus(2)) }

// TestDeviceFP8OnHostSim: deepep.cu's fp8 dispatch (MB_DE_DHIDDEN) on the
// host simulation: the packed rows the experts get, their probabilities
// and the bf16 output equal the host design's bit for bit.
func TestDeviceFP8OnHostSim(t *testing.T) { checkFP8(t, dt.FakeGPUs(t, 2)) }

// TestDeviceFP8Faults: with the fp8 dispatch broken on purpose (deepep.cu's
// MB_DE_BUG 5: the senders copy a row's e4m3 bytes and not its scales; 6:
// the receivers store rows at the e4m3 bytes' stride), the rows the
// experts get differ from the host design's.
func TestDeviceFP8Faults(t *testing.T) {
	hostsim.SkipIfShort(t, "TestDeviceFP8OnHostSim")
	gs := dt.FakeGPUs(t, 1)
	c := fp8Cases()[0]
	wantRows, wantP, wantY := hostFP8(t, c, fp8Ranks(t, c.sh, 11))
	for _, bug := range []int{5, 6} {
		t.Run(fmt.Sprint("bug", bug), func(t *testing.T) {
			d := WithDeviceConfig(c.cfg)
			d.bug = bug
			var (
				rows  [][]uint16
				probs [][]float32
				y     [][]float32
				err   error
			)
			hostsim.WithinNamed(t, 2*time.Minute, "deepep's broken fp8 forward", func() {
				rows, probs, y, err = runFP8(t, d, c, gs, fp8Ranks(t, c.sh, 11))
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := sameFP8(c, rows, probs, y, wantRows, wantP, wantY); err == nil {
				t.Fatalf("MB_DE_BUG %d: the broken dispatch's rows equal the host design's", bug)
			} else {
				t.Logf("MB_DE_BUG %d: %v", bug, err)
			}
		})
	}
}
