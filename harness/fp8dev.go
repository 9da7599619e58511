package harness

// FP8 on the cuda device (--precision fp8; docs/fp8.md "The cuda device"):
// after the router the "quantize" phase casts each rank's bf16 input
// (devRank.xin) into packed rows in rk.X — each row its hidden e4m3 values
// then its hidden/128 fp32 multipliers, kernels.FP8RowPitch(hidden) bytes
// (quant_fp8_rows, DeepEP's 1×128 rule, bit for bit the host's
// QuantFP8Rows). The dispatcher moves those rows as rows of
// Shape.DispatchHidden bf16-sized elements; the expert phase dequantizes
// each block's rows (dequant_fp8_rows, bf16(fl32(e4m3·inv)) as the host's
// dequantRows) and runs the bf16 GEMMs on them; the combine and the
// backward are bf16 (the backward reads the dequantized rows the forward
// kept in its tape).

import (
	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// fp8GEMMPath is the expert GEMM path an fp8 run on dev runs, and why: the
// bf16 GEMMs on dequantized rows, whatever the device's cuBLASLt offers
// (kernels.FP8GEMMPathFor, said in the reason) — the cuda layer does not
// run the FP8 GEMMs yet (docs/fp8.md, FP8 GEMMs; the host's does).
func fp8GEMMPath(dev device.Device) (kernels.FP8GEMMPath, string) {
	g, ok := dev.(*device.CUDA)
	if !ok || g.Lt == nil {
		return kernels.FP8GEMMDequant, "no cuBLASLt on this device (the Emu simulation): bf16 GEMMs on the dequantized rows and weights"
	}
	offered, why := g.FP8GEMMPath()
	return kernels.FP8GEMMDequant, "bf16 GEMMs on the dequantized rows and weights: the cuda layer does not call the FP8 GEMM yet (the host device runs it, emulated); " +
		"this device's cuBLASLt offers " + string(offered) + " (" + why + ")"
}

// shape is the dispatcher's shape: at fp8 its dispatched rows are packed
// fp8 rows.
func (dl *deviceLayer) shape() dispatchers.Shape {
	sh := dl.l.Shape
	if dl.l.Cfg.isFP8() {
		sh.DispatchHidden = kernels.FP8RowPitch(sh.Hidden) / 2
	}
	return sh
}

// input is rank r's bf16 input rows [T, h] (the router's and the shared
// expert's).
func (dl *deviceLayer) input(r int) device.Addr {
	if x := dl.rr[r].xin; x != 0 {
		return x
	}
	return dl.ranks[r].X
}

// fp8Grid caps the FP8 kernels' grids.
func fp8Grid(dev device.Device, blocks int64) int {
	return kernels.FP8Grid(blocks, kernels.FP8Block, 4*max(dev.SMCount(), 1))
}

// quantize is the fp8 step's phase after the router: rank r's bf16 input
// into packed e4m3 rows with their 1×128 multipliers (rk.X).
func (dl *deviceLayer) quantize(r int) error {
	c, rk := dl.l.Cfg, dl.ranks[r]
	S := c.Hidden / kernels.FP8Block
	n := int64(c.Tokens * S)
	return rk.Dev.LaunchProgram(device.FP8QuantRowsProgram(), fp8Grid(rk.Dev, n), rk.Stream,
		dl.rr[r].xin, n, int32(0), int32(S), int64(kernels.FP8RowPitch(c.Hidden)), rk.X)
}

// dequant dequantizes rows [lo, hi) of work w's packed rows into bf16 rows
// (into xd, the tape's, when not 0; else the rank's scratch) and returns
// where they are (row lo first).
func (dl *deviceLayer) dequant(r int, w *dispatchers.DeviceWork, lo, hi int, xd device.Addr) (device.Addr, error) {
	c, rk, b := dl.l.Cfg, dl.ranks[r], &dl.rr[r]
	if xd == 0 {
		if err := b.dq.Ensure(rk.Dev, rk.Stream, hi-lo, device.RowBuffer{P: &b.xdq, PerRow: 2 * int64(c.Hidden)}); err != nil {
			return 0, err
		}
		xd = b.xdq
	}
	S, pitch := c.Hidden/kernels.FP8Block, int64(kernels.FP8RowPitch(c.Hidden))
	src := w.X + device.Addr(int64(lo)*pitch)
	n := int64((hi - lo) * S)
	if fp8DevFault == "row" && n > int64(S) { // tests: each row from the next packed row (its values and multipliers)
		src, n = src+device.Addr(pitch), n-int64(S)
	}
	if fp8DevFault == "none" { // tests: no dequantization (xd holds whatever it held)
		return xd, nil
	}
	return xd, rk.Dev.LaunchProgram(device.FP8DequantRowsProgram(), fp8Grid(rk.Dev, n), rk.Stream, src, n, int32(S), pitch, xd)
}

// fp8DevFault, set by tests alone, breaks the device's dequantization on
// purpose ("row": the next row's packed row; "none": no dequantization).
var fp8DevFault string
