package layer

// The dispatch and expert precision of a run (--precision; issue 34, see
// docs/fp8.md): bf16, or one of the two FP8 recipes.

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// How the layer runs at fp8 (--precision fp8) on the host device:
//
//   - expert weights are quantized once, when drawn, in 128×128 blocks
//     (kernels.QuantFP8Weight) and held dequantized as bf16 values
//     (bf16(fl32(e4m3·inv))): what the bf16 GEMMs on dequantized weights
//     read, and what the reference takes;
//   - each step, after the router, the "quantize" phase casts each rank's
//     input rows to e4m3 in 1×128 blocks (kernels.QuantFP8Rows, DeepEP's
//     rule): Rank.X then holds the e4m3 values and Rank.Scales the
//     dequantization multipliers, which the dispatcher moves together
//     (Capabilities.FP8); the router and the shared expert read the
//     bf16 input (Layer.X);
//   - the expert phase dequantizes its segments' rows of ExpertX in place
//     with ExpertScales, bf16(fl32(e4m3·inv)) as dequant_fp8_1x128 (the
//     backward's operand), keeping their codes and multipliers, and runs
//     the expert GEMMs as cuBLASLt's block-scaled FP8 GEMM emulated
//     (fp8gemm.go; ExpertPathFP8Host); the combine is bf16;
//   - the backward is bf16 on the dequantized rows and weights, the
//     quantization straight-through (see docs/fp8.md for what differs from
//     Megatron's FP8 recipe).
//
// The check's reference (Reference, the gradient reference) takes the same
// quantized inputs and weights, computed here independently of the
// dispatch (expertInput; on the FP8 GEMM path fp8RefRow and
// fp8RefWeights, exact in float64).

// ExpertPathFP8 is what the record says of fp8 expert GEMMs run as bf16
// GEMMs on dequantized operands (gemm.fp8_path bf16-dequant).
const ExpertPathFP8 = "bf16 GEMMs on dequantized rows and weights (activations e4m3 1×128, weights e4m3 128×128)"

// ExpertPathFP8Dev is what the record says of the fp8 expert GEMMs on the
// cuda device's FP8 GEMM path (fp8dev.go).
const ExpertPathFP8Dev = "FP8 GEMMs (cuBLASLt's block-scaled FP8 GEMM: e4m3 activations 1×128 as dispatched, fc2's bf16 input quantized 1×128 on the device, weights e4m3 128×128, bf16 out)"

// ExpertPathFP8Host is what the record says of the fp8 expert GEMMs on
// the host device (fp8gemm.go).
const ExpertPathFP8Host = "FP8 GEMMs (cuBLASLt's block-scaled product emulated exactly: e4m3 activations 1×128, fc2's input quantized 1×128, weights e4m3 128×128, fp32 accumulation, bf16 out)"

// fp8GEMMHostReason is why the host device's record says
// fp8GEMMHostPath.
const fp8GEMMHostReason = "the host device runs what a Hopper GPU with cuBLASLt 12.9+ runs: kernels.FP8GEMM emulates cuBLASLt's " +
	"VEC128_32F×BLK128x128_32F FP8 GEMM exactly (the fake cuBLASLt's arithmetic bit for bit; a GPU's tensor cores accumulate differently)"

// HostFP8GEMMNote is what a host run's record says of its fp8 expert GEMMs:
// the method, gemm.fp8_path and why.
func HostFP8GEMMNote() (method, path, why string) {
	if FP8GEMMHostPath == kernels.FP8GEMMDequant {
		return ExpertPathFP8, string(kernels.FP8GEMMDequant), "the host device runs the cuda device's path (bf16 GEMMs on the dequantized rows and weights), as set to compare the two"
	}
	if FP8GEMMHostPath == kernels.FP8GEMMTensor {
		return ExpertPathFP8Tensor, string(kernels.FP8GEMMTensor), fp8GEMMHostTensorReason
	}
	return ExpertPathFP8Host, string(FP8GEMMHostPath), fp8GEMMHostReason
}

// FP8Fault, set by tests alone, breaks the expert side's dequantization on
// purpose ("scale": the multiplier doubled; "block": the next block's
// multiplier; "none": no dequantization; on the host's FP8 GEMM path
// (fp8gemm.go) also "lt-order": the activation multipliers in row-major
// order, not VEC128_32F's; "w-block": each weight block the
// next block's multiplier; "fc2-none": fc2's input not dequantized; on
// the per-tensor path (fp8tensor.go) "t-wscale": fc1 given the weights'
// multiplier for the activations'; "t-half": each operand's multiplier
// from the first half of its rows; "t-w1": fc1's weight multiplier
// doubled), to see the check fail.
var FP8Fault string

// e4m3Values decodes every e4m3 code.
var e4m3Values = func() (v [256]float32) {
	for c := range v {
		v[c] = kernels.E4M3ToFloat32(uint8(c))
	}
	return v
}()

// quantWeight replaces w ([n, k]) with its 128×128-block quantization,
// dequantized and rounded to bf16.
func quantWeight(w []float32, n, k int) {
	q, s, err := kernels.QuantFP8Weight(w, n, k, false)
	if err != nil {
		panic(err) // n, k > 0 and len(w) = n·k by construction
	}
	for i, v := range kernels.DequantFP8Weight(q, s, n, k) {
		w[i] = kernels.RoundBF16(v)
	}
}

// quantExpert quantizes an expert's weights when the layer runs at fp8.
func (l *Layer) quantExpert(fc1, fc2 []float32) {
	h, f := l.Cfg.Hidden, l.Cfg.FFN
	l.quantWeightAt(fc1, 2*f, h) // fp8's 128×128 blocks, or mxfp8's 1×32 (mxfp8.go)
	l.quantWeightAt(fc2, h, f)
}

// quantize is the fp8 step's phase after the router: rank r's input rows
// cast to e4m3 in 1×128 blocks, the values into Rank.X, the dequantization
// multipliers into Rank.Scales (what the dispatch sends).
func (l *Layer) quantize(r int) error {
	if l.Cfg.IsMXFP8() {
		return l.quantizeMX(r) // 1×32 blocks, E8M0 scales (mxfp8.go)
	}
	rk, run, x := l.Ranks[r], &l.run[r], l.X[r]
	if len(run.q8) != len(x) { // the buffers are the rank's, reused each step
		run.q8, run.xq = make([]uint8, len(x)), make([]float32, len(x))
	}
	if len(run.qs) != len(x)/kernels.FP8Block {
		run.qs = make([]float32, len(x)/kernels.FP8Block)
	}
	if err := kernels.QuantFP8RowsInto(run.q8, run.qs, x, l.Cfg.Hidden, false); err != nil {
		return err
	}
	for i, c := range run.q8 {
		run.xq[i] = e4m3Values[c]
	}
	rk.X, rk.Scales = run.xq, run.qs
	return nil
}

// dequantRows dequantizes rows [lo, hi) of rank r's ExpertX in place from
// its ExpertScales (once per step: done marks them).
func (l *Layer) dequantRows(r, lo, hi int) error {
	if l.Cfg.IsMXFP8() {
		return l.dequantRowsMX(r, lo, hi) // mxfp8.go
	}
	rk, run, h := l.Ranks[r], &l.run[r], l.Cfg.Hidden
	S := h / dispatchers.FP8Block
	if len(rk.ExpertScales) < hi*S {
		return fmt.Errorf("fp8: the dispatch delivered scales for %d rows; the experts compute rows up to %d", len(rk.ExpertScales)/S, hi)
	}
	if len(run.dq) < hi {
		run.dq = append(run.dq, make([]bool, hi-len(run.dq))...)
	}
	lt := l.FP8Lt()
	if lt && len(run.xc) < hi*h {
		run.xc, run.xs = append(run.xc, make([]uint8, hi*h-len(run.xc))...), append(run.xs, make([]float32, hi*S-len(run.xs))...)
	}
	for i := lo; i < hi; i++ {
		if run.dq[i] {
			continue
		}
		run.dq[i] = true
		row := rk.ExpertX[i*h : (i+1)*h]
		if lt { // the FP8 GEMM's operand: the codes and the multipliers applied below
			for j, v := range row {
				run.xc[i*h+j] = kernels.E4M3FromFloat32(v) // exact: row holds e4m3 values
			}
		}
		if FP8Fault == "none" {
			if lt {
				for b := range S {
					run.xs[i*S+b] = 1
				}
			}
			continue
		}
		for b := range S {
			inv := rk.ExpertScales[i*S+b]
			switch FP8Fault {
			case "scale":
				inv *= 2
			case "block":
				inv = rk.ExpertScales[(i*S+b+1)%len(rk.ExpertScales)]
			}
			if lt {
				run.xs[i*S+b] = inv
			}
			for j := b * dispatchers.FP8Block; j < (b+1)*dispatchers.FP8Block; j++ {
				row[j] = kernels.RoundBF16(row[j] * inv)
			}
		}
	}
	return nil
}

// ExpertInput is rank r's expert input as the reference takes it: the
// bf16 input, or at fp8 its 1×128 quantization dequantized to bf16,
// computed from Layer.X (not from what the dispatch delivered).
func (l *Layer) ExpertInput(r int) []float32 {
	if !l.Cfg.IsQuantized() {
		return l.X[r]
	}
	l.xeOnce.Do(func() {
		if l.Cfg.IsMXFP8() {
			l.xe = l.mxExpertInput() // 1×32 blocks (mxfp8.go)
			return
		}
		l.xe = make([][]float32, len(l.X))
		for i, x := range l.X {
			q, s, err := kernels.QuantFP8Rows(x, l.Cfg.Hidden, false)
			if err != nil {
				panic(err) // Validate checked --hidden
			}
			l.xe[i] = kernels.DequantFP8Rows(q, s)
			kernels.RoundBF16Slice(l.xe[i])
		}
	})
	return l.xe[r]
}

// FP8MinCC is the compute capability (×10) FP8 needs: e4m3 tensor cores
// (Ada, sm_89, and later).
const FP8MinCC = 89

// FP8Refusal is the run's refusal where c is at fp8 and FP8DeviceUnavailable
// says why devs cannot run it, else nil.
func FP8Refusal(c setup.Config, devs []device.Device) error {
	if !c.IsFP8() {
		return nil
	}
	if why := FP8DeviceUnavailable(devs); why != "" {
		return &dispatchers.UnavailableError{Name: c.Dispatcher, Impl: c.Impl, Reason: why}
	}
	return nil
}

// FP8DeviceUnavailable is why --precision fp8 cannot run on devs, or "":
// a GPU below sm_89 has no FP8 tensor cores, and the designs' own
// implementations refuse FP8 there (Transformer Engine's FP8 needs
// compute capability 8.9; DeepEP's sm_80 build, DISABLE_SM90_FEATURES,
// removes its FP8 path). moebench's conversion kernels would run there
// in software, but a run that the designs would refuse is not one to
// time. The Emu simulation models Hopper: no refusal.
func FP8DeviceUnavailable(devs []device.Device) string {
	for i, dev := range devs {
		if g, ok := dev.(*device.CUDA); ok && g.CC() < FP8MinCC {
			return fmt.Sprintf("--precision fp8 needs FP8 (e4m3) tensor cores, compute capability 8.9 or later (Ada, Hopper, Blackwell): "+
				"GPU %d is sm_%d, where Transformer Engine refuses FP8 and DeepEP's build has no FP8 path; --device host runs fp8 (emulated)", i, g.CC())
		}
	}
	return ""
}
