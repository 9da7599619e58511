package layer

// FP8 on the cuda device (--precision fp8; docs/fp8.md "The cuda device"):
// after the router the "quantize" phase casts each rank's bf16 input
// (devRank.xin) into packed rows in rk.X — each row its hidden e4m3 values
// then its hidden/128 fp32 multipliers, kernels.FP8RowPitch(hidden) bytes
// (quant_fp8_rows, DeepEP's 1×128 rule, bit for bit the host's
// QuantFP8Rows). The dispatcher moves those rows as rows of
// Shape.DispatchHidden bf16-sized elements. The expert phase then runs one
// of three paths (fp8GEMMPath, said in gemm.fp8_path; the third,
// cublaslt-fp8-tensor, is fp8devtensor.go's):
//
//   - cublaslt-fp8-block (computeFP8): per expert segment fp8_rows_lt
//     unpacks the rows into e4m3 rows and their 1×128 multipliers in
//     VEC128_32F's order, fc1 is cuBLASLt's block-scaled FP8 GEMM on them
//     and the expert's e4m3 weights (uploaded once with their 128×128
//     multipliers in BLK128x128_32F's order: devFP8, which DeviceRank.FP8
//     names; a moved expert's where feplb's phase 2 copied them,
//     DeviceSegment.FP8), SwiGLU × prob is
//     bf16 as at bf16, quant_fp8_lt quantizes fc2's bf16 input 1×128 into
//     the same layout and fc2 is the FP8 GEMM too (the Grouped's
//     per-expert calls, on one stream or several; cuBLASLt's grouped call
//     has no FP8 types);
//   - bf16-dequant: dequant_fp8_rows (bf16(fl32(e4m3·inv)) as the host's
//     dequantRows) and the bf16 GEMMs on the dequantized rows.
//
// The combine and the backward are bf16 (the backward reads the
// dequantized rows, which the forward writes into its tape on both paths,
// and the bf16 dequantized weights).

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// fp8DequantWhy begins the reason of every bf16-dequant choice.
const fp8DequantWhy = "bf16 GEMMs on the dequantized rows and weights: "

// FP8GEMMPath is the expert GEMM path the cuda layer of config c runs at
// fp8 on devs, and why: cuBLASLt's block-scaled FP8 GEMM (fc1 on the
// dispatched e4m3 rows and their 1×128 multipliers, fc2 on its input
// quantized 1×128, the weights e4m3 in 128×128 blocks; computeFP8) where
// every device offers it (kernels.FP8GEMMPathFor: sm_90 and cuBLASLt
// 12.9+; Emu emulates it exactly), else cuBLASLt's per-tensor FP8 GEMM
// where every device offers that (fp8devtensor.go; not feplb, whose phase
// 2 moves the block-scaled weights), else bf16 GEMMs on the dequantized
// rows and weights: on an older library or GPU and where cuBLAS's FP8
// shape rules refuse ffn. (feplb runs the block-scaled FP8 GEMM too: its
// phase 2 moves the e4m3 weights and their multipliers, DeviceSegment.FP8.)
func FP8GEMMPath(devs []device.Device, c setup.Config) (kernels.FP8GEMMPath, string) {
	if FP8DevDequant {
		return kernels.FP8GEMMDequant, fp8DequantWhy + "a test's hook (FP8DevDequant)"
	}
	if c.FFN%16 != 0 {
		return kernels.FP8GEMMDequant, fmt.Sprintf(fp8DequantWhy+"--ffn %d: cuBLASLt's FP8 GEMM needs fc2's k (ffn) a multiple of 16", c.FFN)
	}
	path, why := fp8GEMMOffers(devs)
	if path == kernels.FP8GEMMTensor && c.Dispatcher == "feplb" {
		return kernels.FP8GEMMDequant, fp8DequantWhy + "the devices offer cublaslt-fp8-tensor, but feplb's phase 2 moves its dynamic experts' block-scaled " +
			"e4m3 weights (the per-tensor GEMM would need each expert's per-tensor codes and multiplier on the helper)"
	}
	return path, why
}

// fp8GEMMOffers is the finest FP8 GEMM every device offers (block, else
// per tensor, else bf16 on dequantized values; FP8GEMMOffered, tests,
// fakes each device's answer), and why.
func fp8GEMMOffers(devs []device.Device) (kernels.FP8GEMMPath, string) {
	path, why, whyT := kernels.FP8GEMMBlock, "", ""
	for _, dev := range devs {
		g, ok := dev.(*device.CUDA)
		offered, w := kernels.FP8GEMMBlock, "the Emu simulation runs cuBLASLt's FP8 GEMM emulated exactly (kernels.FP8GEMM)"
		if ok {
			if g.Lt == nil {
				return kernels.FP8GEMMDequant, fp8DequantWhy + "no cuBLASLt"
			}
			offered, w = g.FP8GEMMPath()
		}
		if FP8GEMMOffered != "" {
			offered, w = FP8GEMMOffered, w+"; the answer faked by a test: "+string(FP8GEMMOffered)
		}
		switch offered {
		case kernels.FP8GEMMBlock:
			if ok {
				w = "cuBLASLt's block-scaled FP8 GEMM (" + w + "): activations e4m3 1×128 as dispatched, fc2's input quantized 1×128 on the device, weights e4m3 128×128"
			} else {
				w = "the Emu simulation runs cuBLASLt's block-scaled FP8 GEMM emulated exactly (kernels.FP8GEMM)"
			}
			why = w
		case kernels.FP8GEMMTensor:
			path, whyT = kernels.FP8GEMMTensor, "cuBLASLt's per-tensor FP8 GEMM, the finest this device's library offers ("+w+
				"): each expert's rows on its rank dequantized 1×128 as dispatched and requantized with one multiplier (SCALAR_32F), fc2's input likewise, weights one multiplier each"
		default:
			return kernels.FP8GEMMDequant, fp8DequantWhy + "this device's cuBLASLt offers " + string(offered) + " (" + w + "): no FP8 GEMM"
		}
	}
	if path == kernels.FP8GEMMTensor {
		return path, whyT
	}
	return path, why
}

// shape is the dispatcher's shape: at fp8 its dispatched rows are packed
// fp8 rows.
func (dl *DeviceLayer) shape() dispatchers.Shape {
	sh := dl.Layer.Shape
	if dl.Layer.Cfg.IsFP8() {
		sh.DispatchHidden = kernels.FP8RowPitch(sh.Hidden) / 2
	}
	return sh
}

// input is rank r's bf16 input rows [T, h] (the router's and the shared
// expert's).
func (dl *DeviceLayer) input(r int) device.Addr {
	if x := dl.RankBufs[r].xin; x != 0 {
		return x
	}
	return dl.Ranks[r].X
}

// fp8Grid caps the FP8 kernels' grids.
func fp8Grid(dev device.Device, blocks int64) int {
	return kernels.FP8Grid(blocks, kernels.FP8Block, 4*max(dev.SMCount(), 1))
}

// quantize is the fp8 step's phase after the router: rank r's bf16 input
// into packed e4m3 rows with their 1×128 multipliers (rk.X).
func (dl *DeviceLayer) quantize(r int) error {
	c, rk := dl.Layer.Cfg, dl.Ranks[r]
	S := c.Hidden / kernels.FP8Block
	n := int64(c.Tokens * S)
	return rk.Dev.LaunchProgram(device.FP8QuantRowsProgram(), fp8Grid(rk.Dev, n), rk.Stream,
		dl.RankBufs[r].xin, n, int32(0), int32(S), int64(kernels.FP8RowPitch(c.Hidden)), rk.X)
}

// dequant dequantizes rows [lo, hi) of work w's packed rows into bf16 rows
// (into xd, the tape's, when not 0; else the rank's scratch) and returns
// where they are (row lo first).
func (dl *DeviceLayer) dequant(r int, w *dispatchers.DeviceWork, lo, hi int, xd device.Addr) (device.Addr, error) {
	c, rk, b := dl.Layer.Cfg, dl.Ranks[r], &dl.RankBufs[r]
	if xd == 0 {
		if err := b.dq.Ensure(rk.Dev, rk.Stream, hi-lo, device.RowBuffer{P: &b.xdq, PerRow: 2 * int64(c.Hidden)}); err != nil {
			return 0, err
		}
		xd = b.xdq
	}
	S, pitch := c.Hidden/kernels.FP8Block, int64(kernels.FP8RowPitch(c.Hidden))
	src := w.X + device.Addr(int64(lo)*pitch)
	n := int64((hi - lo) * S)
	if FP8DevFault == "row" && n > int64(S) { // tests: each row from the next packed row (its values and multipliers)
		src, n = src+device.Addr(pitch), n-int64(S)
	}
	if FP8DevFault == "none" { // tests: no dequantization (xd holds whatever it held)
		return xd, nil
	}
	return xd, rk.Dev.LaunchProgram(device.FP8DequantRowsProgram(), fp8Grid(rk.Dev, n), rk.Stream, src, n, int32(S), pitch, xd)
}

// fp8DevFault, set by tests alone, breaks the device's dequantization on
// purpose ("row": the next row's packed row; "none": no dequantization)
// or, on the FP8 GEMM path, fc1's operand ("lt-order": its multipliers
// row-major, not in VEC128_32F's order; "a-missing": its multipliers
// lost); on the per-tensor path (fp8devtensor.go) "t-wscale": fc1 given
// the weights' multiplier for the activations'; "t-half": each operand's
// amax over the first half of its values).
var FP8DevFault string

// FP8DevDequant, set by tests alone, makes the cuda layer run the bf16
// GEMMs on dequantized rows where it would run the FP8 GEMM, so that that
// path and its faults ("row", "none") stay tested on Emu and hostsim.
var FP8DevDequant bool

// devFP8 are a rank's local experts' weights as the FP8 GEMM takes them:
// e4m3 codes fc1 [L, 2f, h] and fc2 [L, h, f], and their 128×128
// multipliers in BLK128x128_32F's order (kernels.FP8WeightScalesLt), n1
// and n2 floats an expert; and the expert phase's operands (fp8_rows_lt's
// and quant_fp8_lt's output: codes xq, aq and multipliers xs, as).
type devFP8 struct {
	q1, q2, s1, s2 device.Addr
	n1, n2         int
	xq, xs, aq, as device.Addr
	ops            device.RowCapacity
}

// allocFP8 allocates rank r's devFP8 weights (uploadFP8 fills them).
func (dl *DeviceLayer) allocFP8(r int) error {
	c, rk, b := dl.Layer.Cfg, dl.Ranks[r], &dl.RankBufs[r]
	h, f, L := c.Hidden, c.FFN, dl.Layer.Shape.LocalExperts()
	n1, n2 := dispatchers.FP8WeightScales(h, f) // as feplb moves them
	b.fp8 = &devFP8{n1: n1, n2: n2}
	held, err := device.Resize(rk.Dev, 1, device.RowBuffer{P: &b.fp8.q1, PerRow: int64(L * 2 * f * h)}, device.RowBuffer{P: &b.fp8.q2, PerRow: int64(L * h * f)},
		device.RowBuffer{P: &b.fp8.s1, PerRow: int64(4 * L * n1)}, device.RowBuffer{P: &b.fp8.s2, PerRow: int64(4 * L * n2)})
	b.bytes += held
	// the dispatcher's view (feplb's phase 2 moves them to its helpers)
	rk.FP8 = dispatchers.FP8Weights{Q1: b.fp8.q1, Q2: b.fp8.q2, S1: b.fp8.s1, S2: b.fp8.s2}
	return err
}

// uploadFP8 uploads expert e's e4m3 weights and multipliers (w) to its
// owner rank's devFP8.
func (dl *DeviceLayer) uploadFP8(e int, w *fp8Weights) error {
	return dl.uploadExpertFP8(e, w.q1, w.q2, w.lt1, w.lt2)
}

// uploadExpertFP8 uploads expert e's e4m3 codes q1, q2 and multipliers
// s1, s2 (devFP8's n1, n2 floats an expert) to its owner rank's devFP8.
func (dl *DeviceLayer) uploadExpertFP8(e int, q1, q2 []uint8, s1, s2 []float32) error {
	c, L := dl.Layer.Cfg, dl.Layer.Shape.LocalExperts()
	h, f, r, i := c.Hidden, c.FFN, e/L, e%L
	rk, fp := dl.Ranks[r], dl.RankBufs[r].fp8
	for _, u := range []struct {
		at   device.Addr
		host any
	}{{fp.q1 + device.Addr(i*2*f*h), codeWords(q1)}, {fp.q2 + device.Addr(i*h*f), codeWords(q2)},
		{fp.s1 + device.Addr(4*i*fp.n1), s1}, {fp.s2 + device.Addr(4*i*fp.n2), s2}} {
		if err := rk.Dev.Upload(u.at, u.host, rk.Stream); err != nil {
			return err
		}
	}
	return nil
}

// codeWords are e4m3 codes as the little-endian 16-bit words Upload takes
// (an even count: every weight's is).
func codeWords(q []uint8) []uint16 {
	w := make([]uint16, len(q)/2)
	for i := range w {
		w[i] = uint16(q[2*i]) | uint16(q[2*i+1])<<8
	}
	return w
}

// computeFP8 queues the FP8 GEMM path of one block of work, rows [lo, hi)
// (the file's comment), into h1 and act (bf16 [hi-lo, 2f], [hi-lo, f]) and
// y (row 0 of w's output at y).
func (dl *DeviceLayer) computeFP8(r int, w *dispatchers.DeviceWork, lo, hi int, h1, act, y device.Addr) error {
	c, rk, b := dl.Layer.Cfg, dl.Ranks[r], &dl.RankBufs[r]
	h, f, L, fp := c.Hidden, c.FFN, dl.Layer.Shape.LocalExperts(), b.fp8
	Sh, Sf, pitch := h/kernels.FP8Block, (f+kernels.FP8Block-1)/kernels.FP8Block, int64(kernels.FP8RowPitch(h))
	segs := 0
	for _, sg := range w.Segments {
		if sg.Len == 0 {
			continue
		}
		if sg.FP8.Q1 == 0 && sg.Expert/L != r || (sg.FP8.Q1 == 0) != (sg.FP8.Q2 == 0) || (sg.FP8.Q1 == 0) != (sg.FP8.S1 == 0) || (sg.FP8.Q1 == 0) != (sg.FP8.S2 == 0) {
			return fmt.Errorf("fp8 GEMM path: segment of expert %d on rank %d: e4m3 weights %+v (all 0 only for a local expert; the FP8 GEMM reads e4m3 weights, a moved expert's where the dispatcher put them)", sg.Expert, r, sg.FP8)
		}
		segs++
	}
	// each segment's multipliers start 16-byte aligned (cuBLASLt): its rows
	// rounded up to 4 in the multiplier buffers
	if err := fp.ops.Ensure(rk.Dev, rk.Stream, hi-lo+4*segs, device.RowBuffer{P: &fp.xq, PerRow: int64(h)}, device.RowBuffer{P: &fp.xs, PerRow: int64(4 * Sh)},
		device.RowBuffer{P: &fp.aq, PerRow: int64(f)}, device.RowBuffer{P: &fp.as, PerRow: int64(4 * Sf)}); err != nil {
		return err
	}
	groups := func(second bool) ([]device.Group, error) {
		b.groups = b.groups[:0]
		at := 0 // the segment's first multiplier row
		for _, sg := range w.Segments {
			if sg.Len == 0 {
				continue
			}
			e, row := sg.Expert-r*L, sg.Start-lo
			wt := sg.FP8 // a moved expert's (feplb's helpers), or the rank's own:
			if wt.Q1 == 0 {
				wt = dispatchers.FP8Weights{Q1: fp.q1 + device.Addr(e*2*f*h), Q2: fp.q2 + device.Addr(e*h*f), S1: fp.s1 + device.Addr(4*e*fp.n1), S2: fp.s2 + device.Addr(4*e*fp.n2)}
			}
			var g device.Group
			if !second {
				g = device.Group{C: h1 + device.Addr(2*row*2*f), A: fp.xq + device.Addr(row*h), W: wt.Q1,
					AScale: fp.xs + device.Addr(4*Sh*at), WScale: wt.S1, M: sg.Len}
				if err := dl.fp8Operand(r, w.X+device.Addr(int64(sg.Start)*pitch), sg.Len, g.A, g.AScale); err != nil {
					return nil, err
				}
			} else {
				g = device.Group{C: y + device.Addr(2*sg.Start*h), A: fp.aq + device.Addr(row*f), W: wt.Q2,
					AScale: fp.as + device.Addr(4*Sf*at), WScale: wt.S2, M: sg.Len}
				n := int64(sg.Len * Sf)
				if err := rk.Dev.LaunchProgram(device.FP8QuantLtProgram(), fp8Grid(rk.Dev, n), rk.Stream,
					act+device.Addr(2*row*f), int32(sg.Len), int32(f), int32(0), g.A, g.AScale); err != nil {
					return nil, err
				}
			}
			b.groups = append(b.groups, g)
			at += (sg.Len + 3) / 4 * 4
		}
		return b.groups, nil
	}
	return dl.fp8Groups(r, w, lo, hi, act, h1, cuda.FP8Block, groups)
}

// fp8Groups queues a block of work's FP8 expert GEMMs at scaling mode:
// fc1 on groups(false), act = SwiGLU(h1) × prob, fc2 on groups(true).
func (dl *DeviceLayer) fp8Groups(r int, w *dispatchers.DeviceWork, lo, hi int, act, h1 device.Addr, mode cuda.FP8Scale,
	groups func(second bool) ([]device.Group, error)) error {
	c, rk, b := dl.Layer.Cfg, dl.Ranks[r], &dl.RankBufs[r]
	h, f := c.Hidden, c.FFN
	b.Grouped.FP8 = mode
	defer func() { b.Grouped.FP8 = cuda.FP8None }()
	g1, err := groups(false)
	if err != nil {
		return err
	}
	if err := b.Grouped.Run(rk.Dev, g1, 2*f, h, rk.Stream); err != nil {
		return err
	}
	if err := dl.swiGLUProbs(r, w, lo, hi, act, h1); err != nil {
		return err
	}
	g2, err := groups(true)
	if err != nil {
		return err
	}
	return b.Grouped.Run(rk.Dev, g2, h, f, rk.Stream)
}

// swiGLUProbs queues act = SwiGLU(h1) × prob over rows [lo, hi) of work w
// (bf16 [hi-lo, f] from [hi-lo, 2f]; w.Probs 0: no probabilities, the
// combine applies them): the step between fc1 and fc2 on every path.
func (dl *DeviceLayer) swiGLUProbs(r int, w *dispatchers.DeviceWork, lo, hi int, act, h1 device.Addr) error {
	rk, probs := dl.Ranks[r], w.Probs
	if probs != 0 {
		probs += device.Addr(4 * lo)
	}
	return rk.Dev.SwiGLU(act, h1, probs, hi-lo, dl.Layer.Cfg.FFN, rk.Stream)
}

// fp8Operand writes fc1's operand of m packed rows at src: their e4m3
// codes into q and their multipliers, VEC128_32F's order, into s
// (fp8_rows_lt).
func (dl *DeviceLayer) fp8Operand(r int, src device.Addr, m int, q, s device.Addr) error {
	c, rk := dl.Layer.Cfg, dl.Ranks[r]
	S, pitch := c.Hidden/kernels.FP8Block, int64(kernels.FP8RowPitch(c.Hidden))
	prog := device.FP8RowsLtProgram()
	if FP8DevFault == "lt-order" { // tests: row-major multipliers (one row a launch), not VEC128_32F's order
		for i := range m {
			if err := rk.Dev.LaunchProgram(prog, 1, rk.Stream, src+device.Addr(int64(i)*pitch), int32(1), int32(S), pitch,
				q+device.Addr(i*c.Hidden), s+device.Addr(4*i*S)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := rk.Dev.LaunchProgram(prog, fp8Grid(rk.Dev, int64(m*S)), rk.Stream, src, int32(m), int32(S), pitch, q, s); err != nil {
		return err
	}
	if FP8DevFault == "a-missing" { // tests: the rows' multipliers lost (each ≈1: 0x3F803F80)
		return rk.Dev.Fill16(s, 0x3F80, int64(2*m*S), rk.Stream)
	}
	return nil
}
