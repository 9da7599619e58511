package harness

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/dispatchers/feplb"
	"github.com/moebench/moebench/harness/check"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// TestFP8DeviceEqualsHost: at fp8 the cuda device (Emu; quant_fp8_rows,
// dequant_fp8_rows, fp8_rows_lt and quant_fp8_lt through their twins,
// which are the host functions the hostsim tests hold the CUDA C to, and
// Emu's FP8 MatMul, kernels.FP8GEMM) runs training steps that pass the
// check (the output and every gradient against the float64 reference on
// the same quantized inputs and weights), and its output, rows and traffic
// equal the host device's fp8 layer's bit for bit (equalsHostOn): both run
// the FP8 GEMMs on the same operands (feplb's helpers on the e4m3 weights
// and multipliers its phase 2 moved). On one device and with the ranks on
// three; the second step of each with the expert GEMMs over 4 streams.
// feplb-dequant: the bf16 GEMMs on dequantized rows (layer.FP8DevDequant),
// where phase 2 moves bf16 weights, against the host's same path.
func TestFP8DeviceEqualsHost(t *testing.T) {
	t.Run("feplb-dequant", func(t *testing.T) {
		layer.FP8DevDequant = true
		t.Cleanup(func() { layer.FP8DevDequant = false })
		equalsHost(t, harnesstest.FP8DeviceCases()["feplb"], 1)
	})
	for name, c := range harnesstest.FP8DeviceCases() {
		if c.Dispatcher == "hybridep" && c.Domain > 1 { // its inter-domain path: a device per rank
			t.Run(name+"-4devices", func(t *testing.T) { equalsHost(t, c, c.EP) })
			continue
		}
		t.Run(name, func(t *testing.T) {
			equalsHost(t, c, 1)
			if c.Dispatcher == "feplb" {
				rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
				if err != nil || rec.Status != results.StatusOK || rec.Rebalance == nil || rec.Rebalance.Moves == 0 {
					t.Errorf("feplb at fp8 moved nothing: %v, %+v", err, rec.Rebalance)
				}
			}
		})
		if c.EP > 1 {
			t.Run(name+"-3devices", func(t *testing.T) { equalsHost(t, c, 3) })
		}
	}
}

// TestFP8DeviceRun: moebench's run on the emulated cuda device at fp8
// passes its check, says fp8 and the FP8 GEMM path in the record
// (cublaslt-fp8-block: Emu emulates cuBLASLt's FP8 GEMM; feplb's too, its
// helpers on the e4m3 weights phase 2 moved) and times the quantize phase.
// hybridep: issue 34's command, --dispatcher hybridep --sms 16 --precision
// fp8 --hidden 512.
func TestFP8DeviceRun(t *testing.T) {
	for _, name := range []string{"alltoall", "hybridep", "deepep", "feplb"} {
		c := harnesstest.FP8DeviceCases()[name]
		rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
		if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.Correctness.Grads == nil {
			t.Fatalf("%s: %v, %s %q, %+v", name, err, rec.Status, rec.Reason, rec.Correctness)
		}
		method, path, why := layer.ExpertPathFP8Dev, kernels.FP8GEMMBlock, "Emu simulation runs cuBLASLt's block-scaled FP8 GEMM"
		if rec.Config.Precision != setup.PrecisionFP8 || !strings.HasPrefix(rec.GEMM.Method, method+"; ") || rec.GEMM.FP8Path != string(path) || !strings.Contains(rec.GEMM.FP8PathReason, why) {
			t.Errorf("%s: record: precision %q, expert path %q, fp8 path %q (%s)", name, rec.Config.Precision, rec.GEMM.Method, rec.GEMM.FP8Path, rec.GEMM.FP8PathReason)
		}
		if !slices.ContainsFunc(rec.Timing.Phases, func(p results.Phase) bool { return p.Name == "quantize" }) {
			t.Errorf("%s: no quantize phase in the timings: %+v", name, rec.Timing.Phases)
		}
		t.Logf("%s: output max rel err %.3g, gradients %.3g; expert path %q", name, rec.Correctness.MaxRelErr, rec.Correctness.Grads.MaxRelErr, rec.GEMM.Method)
	}
}

// TestFP8DeviceCheckCatchesBrokenDequantization: with the device's fp8
// expert input broken on purpose the check fails. On the FP8 GEMM path
// (alltoall): fc1's activation multipliers row-major instead of in
// VEC128_32F's order ("lt-order"), or lost ("a-missing"), or each weight
// block given the next block's multiplier ("w-block", the uploaded
// BLK128x128 multipliers; the reference's are right). On the bf16 GEMMs
// on dequantized rows (alltoall with layer.FP8DevDequant): each row
// dequantized from the next packed row (its values and multipliers), or
// not at all. feplb's phase 2 at fp8: its helpers' multipliers copied from
// the home copy one float off ("scale-offset", each block the next
// block's), or the e4m3 weights not moved ("unmoved").
func TestFP8DeviceCheckCatchesBrokenDequantization(t *testing.T) {
	defer func() { layer.FP8DevFault, layer.FP8Fault, layer.FP8DevDequant, feplb.FP8Fault = "", "", false, "" }()
	for _, fault := range []string{"lt-order", "a-missing", "w-block", "row", "none", "scale-offset", "unmoved"} {
		c := harnesstest.FP8DeviceCases()["alltoall"]
		layer.FP8DevFault, layer.FP8Fault, layer.FP8DevDequant, feplb.FP8Fault = fault, "", false, ""
		switch fault {
		case "w-block":
			layer.FP8DevFault, layer.FP8Fault = "", fault
		case "row", "none":
			layer.FP8DevDequant = true
		case "scale-offset", "unmoved":
			c = harnesstest.FP8DeviceCases()["feplb"]
			layer.FP8DevFault, feplb.FP8Fault = "", fault
		}
		c.ForwardOnly = true
		rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
		if err == nil || rec.Status != results.StatusFailed || rec.Correctness == nil || rec.Correctness.MaxRelErr <= check.Tolerance {
			t.Errorf("%s broken (%s): %v, %+v", c.Dispatcher, fault, err, rec.Correctness)
		} else {
			t.Logf("%s broken (%s): max rel err %.3g", c.Dispatcher, fault, rec.Correctness.MaxRelErr)
		}
	}
}

// TestFP8CUDALayerOnHostSim runs the fp8 layers on the host simulation
// (fp8.cu's kernels compiled for the CPU, the fake driver's two GPUs and
// its cuBLASLt 13.0 on sm_90, whose FP8 GEMM is kernels.FP8GEMM's
// arithmetic): training steps that pass the check, whose record says
// cublaslt-fp8-block (feplb's too: its helpers' FP8 GEMMs on the e4m3
// weights phase 2 moved), whose packed rows equal the host's QuantFP8Rows
// bit for bit (codes and multipliers), and whose outputs equal the host
// device's fp8 layer's bit for bit (equalsHostOn: the same FP8 GEMM path).
func TestFP8CUDALayerOnHostSim(t *testing.T) {
	harnesstest.UseHostSimLayer(t)
	for name, c := range harnesstest.FP8DeviceCases() {
		c.Warmup, c.Iters = 0, 1
		if c.Dispatcher == "hybridep" { // the fake driver's GPUs: two, of 4 SMs
			c.SMs = 2
			if c.Domain > 1 { // two domains of one rank
				c.EP, c.Domain = 2, 1
			}
		}
		t.Run(name, func(t *testing.T) {
			if name != "alltoall" {
				hostsim.SkipIfShort(t, "alltoall")
			}
			rec, err := Run(c, setup.Env{Version: "test"})
			if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.Correctness.Grads == nil {
				t.Fatalf("%v, %s %q, %+v", err, rec.Status, rec.Reason, rec.Correctness)
			}
			t.Logf("max rel err %.2e, gradients %.2e", rec.Correctness.MaxRelErr, rec.Correctness.Grads.MaxRelErr)
			// the fake cuBLASLt is 13.0 on a GPU of sm_90: it offers block
			// scaling, and the layer ran it (feplb too)
			path, why := kernels.FP8GEMMBlock, "has VEC128_32F/BLK128x128_32F"
			if rec.GEMM.FP8Path != string(path) || !strings.Contains(rec.GEMM.FP8PathReason, why) {
				t.Errorf("record: fp8 GEMM path %q (%s)", rec.GEMM.FP8Path, rec.GEMM.FP8PathReason)
			}
			devs, err := layer.OpenDevices(setup.Env{}, min(c.EP, 2), c.EP, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { layer.CloseDevices(devs) })
			equalsHostOn(t, c, devs...)
			dl := deviceRun(t, c, devs...)
			if _, err := check.CheckDevice(dl); err != nil {
				t.Fatal(err)
			}
			h, pitch := c.Hidden, kernels.FP8RowPitch(c.Hidden)
			for r, rk := range dl.Ranks {
				words := make([]uint16, c.Tokens*pitch/2)
				if err := rk.Dev.Download(words, rk.X, rk.Stream); err != nil {
					t.Fatal(err)
				}
				got, _ := device.HostBytes(words)
				q, s, _ := kernels.QuantFP8Rows(dl.Layer.X[r], h, false)
				for i := range c.Tokens {
					row := got[i*pitch:]
					if !bytes.Equal(row[:h], q[i*h:(i+1)*h]) {
						t.Fatalf("rank %d row %d: the packed e4m3 values differ from QuantFP8Rows's", r, i)
					}
					for b := range h / kernels.FP8Block {
						if g := math.Float32frombits(binary.LittleEndian.Uint32(row[h+4*b:])); g != s[i*h/kernels.FP8Block+b] {
							t.Fatalf("rank %d row %d block %d: multiplier %g, want %g", r, i, b, g, s[i*h/kernels.FP8Block+b])
						}
					}
				}
			}
		})
	}
}

// hostRunsDevicePath makes the host layer run the cuda device's fp8 expert
// GEMM path where that is bf16 on dequantized rows (an old cuBLASLt, or
// layer.FP8DevDequant) for t, so that the two are compared bit for bit.
func hostRunsDevicePath(t *testing.T) {
	was := layer.FP8GEMMHostPath
	layer.FP8GEMMHostPath = kernels.FP8GEMMDequant
	t.Cleanup(func() { layer.FP8GEMMHostPath = was })
}

// tensorPath makes every device answer that its cuBLASLt offers the
// per-tensor FP8 GEMM only (layer.FP8GEMMOffered) and the host device run
// that path, for t.
func tensorPath(t *testing.T) {
	was, wasHost := layer.FP8GEMMOffered, layer.FP8GEMMHostPath
	layer.FP8GEMMOffered, layer.FP8GEMMHostPath = kernels.FP8GEMMTensor, kernels.FP8GEMMTensor
	t.Cleanup(func() { layer.FP8GEMMOffered, layer.FP8GEMMHostPath = was, wasHost })
}

// TestFP8TensorDeviceEqualsHost: where the devices' cuBLASLt offers the
// per-tensor FP8 GEMM only (faked), the cuda layer on Emu (dequant_fp8_rows,
// amax_fp8_tensor and quant_fp8_tensor through their twins, Emu's FP8
// MatMul per tensor) runs training steps that pass the check, its record
// says cublaslt-fp8-tensor with the reason, and its output, rows and
// traffic equal the host device's per-tensor layer bit for bit; with fc1
// given the weights' multiplier for the activations', or each amax over
// half the values, the check fails.
func TestFP8TensorDeviceEqualsHost(t *testing.T) {
	tensorPath(t)
	for name, c := range harnesstest.FP8DeviceCases() {
		if c.Dispatcher == "feplb" { // bf16-dequant (fp8GEMMPath)
			continue
		}
		if c.Dispatcher == "hybridep" && c.Domain > 1 {
			t.Run(name+"-4devices", func(t *testing.T) { equalsHost(t, c, c.EP) })
			continue
		}
		t.Run(name, func(t *testing.T) { equalsHost(t, c, 1) })
		if c.EP > 1 {
			t.Run(name+"-3devices", func(t *testing.T) { equalsHost(t, c, 3) })
		}
	}
	c := harnesstest.FP8DeviceCases()["alltoall"]
	rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
	if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.Correctness.Grads == nil {
		t.Fatalf("run: %v, %+v", err, rec.Correctness)
	}
	if !strings.HasPrefix(rec.GEMM.Method, layer.ExpertPathFP8Tensor+"; ") || rec.GEMM.FP8Path != string(kernels.FP8GEMMTensor) ||
		!strings.Contains(rec.GEMM.FP8PathReason, "per-tensor FP8 GEMM") || !strings.Contains(rec.GEMM.FP8PathReason, "faked by a test") {
		t.Errorf("record: %q, %q (%s)", rec.GEMM.Method, rec.GEMM.FP8Path, rec.GEMM.FP8PathReason)
	}
	t.Logf("output max rel err %.3g, gradients %.3g", rec.Correctness.MaxRelErr, rec.Correctness.Grads.MaxRelErr)
	defer func() { layer.FP8DevFault = "" }()
	for _, fault := range []string{"t-wscale", "t-half"} {
		layer.FP8DevFault = fault
		c.ForwardOnly = true
		rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
		if err == nil || rec.Status != results.StatusFailed || rec.Correctness == nil || rec.Correctness.MaxRelErr <= check.Tolerance {
			t.Errorf("per tensor broken (%s): %v, %+v", fault, err, rec.Correctness)
		} else {
			t.Logf("broken (%s): max rel err %.3g", fault, rec.Correctness.MaxRelErr)
		}
	}
}

// TestFP8TensorCUDALayerOnHostSim: the per-tensor path on the host
// simulation (fp8.cu's dequant_fp8_rows, amax_fp8_tensor and
// quant_fp8_tensor compiled for the CPU, the fake cuBLASLt's per-tensor FP8
// GEMM; the library's answer faked: its GPUs say sm_90): a training step
// passes the check, the record says cublaslt-fp8-tensor, and the outputs
// equal the host device's per-tensor layer bit for bit.
func TestFP8TensorCUDALayerOnHostSim(t *testing.T) {
	harnesstest.UseHostSimLayer(t)
	tensorPath(t)
	for _, name := range []string{"alltoall", "deepep"} {
		c := harnesstest.FP8DeviceCases()[name]
		c.Warmup, c.Iters = 0, 1
		t.Run(name, func(t *testing.T) {
			if name != "alltoall" {
				hostsim.SkipIfShort(t, "alltoall")
			}
			rec, err := Run(c, setup.Env{Version: "test"})
			if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.Correctness.Grads == nil {
				t.Fatalf("%v, %s %q, %+v", err, rec.Status, rec.Reason, rec.Correctness)
			}
			if rec.GEMM.FP8Path != string(kernels.FP8GEMMTensor) || !strings.Contains(rec.GEMM.FP8PathReason, "per-tensor FP8 GEMM") {
				t.Errorf("record: fp8 GEMM path %q (%s)", rec.GEMM.FP8Path, rec.GEMM.FP8PathReason)
			}
			t.Logf("max rel err %.2e, gradients %.2e", rec.Correctness.MaxRelErr, rec.Correctness.Grads.MaxRelErr)
			devs, err := layer.OpenDevices(setup.Env{}, min(c.EP, 2), c.EP, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { layer.CloseDevices(devs) })
			equalsHostOn(t, c, devs...)
		})
	}
}

// TestNCCLEPFP8TensorOnHostSim: the per-tensor path under NCCL EP's
// per-expert work (--impl library, the fake libnccl_ep): hybridep's
// high-throughput mode (a training step) and deepep-ll's low-latency mode,
// whose experts apply no routing weight (the combine does), so that fc2's
// tensor is SwiGLU(h1) alone and the reference takes it so
// (FP8TensorUnweighted); both pass the check and say cublaslt-fp8-tensor.
func TestNCCLEPFP8TensorOnHostSim(t *testing.T) {
	harnesstest.UseHostSimLayer(t)
	harnesstest.UseFakeNCCLEP(t)
	tensorPath(t)
	for _, d := range []string{"deepep-ll", "hybridep"} {
		t.Run(d, func(t *testing.T) {
			if d != "deepep-ll" {
				hostsim.SkipIfShort(t, "deepep-ll")
			}
			cfg := harnesstest.DeviceCases()["softmax-natural"]
			cfg.Dispatcher, cfg.Impl, cfg.EP, cfg.Hidden, cfg.Precision = d, dispatchers.ImplLibrary, 2, 512, setup.PrecisionFP8
			rec, err := Run(cfg, setup.Env{Version: "test"})
			if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.GEMM.FP8Path != string(kernels.FP8GEMMTensor) {
				t.Fatalf("%v; %s %q %+v (%s)", err, rec.Status, rec.Reason, rec.Correctness, rec.GEMM.FP8Path)
			}
			t.Logf("max rel err %.3g", rec.Correctness.MaxRelErr)
		})
	}
}

// TestFP8FEPLBBytesAgree: at fp8 the host and the cuda device (Emu) count
// feplb's phase-2 bytes the same way for the same step (a first step: both
// plan with the host model): copy_bytes is each move's FP8WeightBytes plus
// each moved row's h + h/32 out (e4m3 and multipliers; the device's 16-byte
// padding not counted) and 2·h back, and backward_copy_bytes each move's
// bf16 weights (pushed in combine-bwd for the bf16 backward) and weight
// gradients plus each moved row's 2·h out, 2·h + 4 back — the same rows in
// both.
func TestFP8FEPLBBytesAgree(t *testing.T) {
	c := harnesstest.FP8DeviceCases()["feplb"]
	dl := deviceRun(t, c, &device.Emu{})
	if cr, err := check.CheckDevice(dl); err != nil || !cr.Passed {
		t.Fatalf("check: %v, %+v", err, cr)
	}
	dev := dl.Dispatcher.Capabilities().Rebalance.Stats()
	_, d := hostStep(t, c, "feplb")
	host := d.Capabilities().Rebalance.Stats()
	if dev.Moves == 0 || dev.Moves != host.Moves || dev.CopyBytes != host.CopyBytes || dev.BackwardCopyBytes != host.BackwardCopyBytes || dev.WGradBytes != host.WGradBytes {
		t.Fatalf("device: %d moves, copy %d B, backward %d B (wgrad %d); host: %d moves, copy %d B, backward %d B (wgrad %d)",
			dev.Moves, dev.CopyBytes, dev.BackwardCopyBytes, dev.WGradBytes, host.Moves, host.CopyBytes, host.BackwardCopyBytes, host.WGradBytes)
	}
	h, f, m := int64(c.Hidden), int64(c.FFN), int64(dev.Moves)
	fwd := dev.CopyBytes - m*dispatchers.FP8WeightBytes(c.Hidden, c.FFN)
	bwd := dev.BackwardCopyBytes - dev.WGradBytes - m*6*h*f
	row := dispatchers.RowBytes(dispatchers.PrecisionFP8, c.Hidden) + 2*h
	if fwd <= 0 || fwd%row != 0 || bwd <= 0 || bwd%(4*h+4) != 0 || fwd/row != bwd/(4*h+4) {
		t.Errorf("copy_bytes %d, backward_copy_bytes %d (wgrad %d) for %d moves: rows %d B forward, %d B backward — not the same rows",
			dev.CopyBytes, dev.BackwardCopyBytes, dev.WGradBytes, m, fwd, bwd)
	}
	t.Logf("%d moves of %d rows: copy_bytes %d, backward_copy_bytes %d", m, fwd/row, dev.CopyBytes, dev.BackwardCopyBytes)
	// the copies issued against the plan's copy_bytes: an extra copy (the
	// bf16 weights too) or a missing one breaks the relation
	// (docs/dispatchers/feplb.md, "Bytes counted, bytes issued"): a moved
	// row adds its fp32 probability, and on the device the padding of its
	// packed row (FP8RowPitch(h) bytes as held, RowBytes counted)
	type issuer interface{ Issued() (int64, int) }
	pad := int64(kernels.FP8RowPitch(c.Hidden)) - dispatchers.RowBytes(dispatchers.PrecisionFP8, c.Hidden)
	for _, x := range []struct {
		name  string
		d     any
		stats dispatchers.RebalanceStats
		pad   int64
	}{{"device", dl.Dispatcher, dev, pad}, {"host", d, host, 0}} {
		is, ok := x.d.(issuer)
		if !ok {
			t.Fatalf("%s: %T has no Issued", x.name, x.d)
		}
		b, rows := is.Issued()
		if want := x.stats.CopyBytes + int64(rows)*(4+x.pad); rows == 0 || int64(rows) != fwd/row || b != want {
			t.Errorf("%s: phase 2 issued %d B for %d rows; copy_bytes %d (%d rows) + %d rows × (4 + %d padding) = %d",
				x.name, b, rows, x.stats.CopyBytes, fwd/row, rows, x.pad, want)
		}
	}
}

// TestFP8FEPLBForwardOnlyFootprint: a forward-only step at fp8 on the
// cuda device (Emu) holds no bf16 weight slots on the helpers (the FP8
// GEMM reads the moved e4m3 weights; the bf16 ones are the backward's):
// feplb's phase-2 buffers (its Footprint beyond its base's) are below the
// same forward-only step's at bf16, and below the same step's at fp8 in
// training, where the slots are held for combine-bwd's push. Seen failing
// with the bf16 slots held at fp8 forward-only too.
func TestFP8FEPLBForwardOnlyFootprint(t *testing.T) {
	phase2 := func(c setup.Config) (int64, int) {
		dl := deviceRun(t, c, &device.Emu{})
		if cr, err := check.CheckDevice(dl); err != nil || !cr.Passed {
			t.Fatalf("%s, forward only %v: check: %v, %+v", c.Precision, c.ForwardOnly, err, cr)
		}
		fd, ok := dl.Dispatcher.(*feplb.Device)
		if !ok {
			t.Fatalf("%T is not feplb's device dispatcher", dl.Dispatcher)
		}
		n := int64(0)
		for r := range dl.Ranks {
			n += fd.Footprint(r) - fd.DeviceDispatcher.Footprint(r)
		}
		return n, fd.RebalanceStats().Moves
	}
	c := harnesstest.FP8DeviceCases()["feplb"]
	train, mt := phase2(c)
	c.ForwardOnly = true
	fp8, m8 := phase2(c)
	c.Precision = setup.PrecisionBF16
	bf, mb := phase2(c)
	if m8 == 0 || m8 != mb || m8 != mt || !(fp8 < bf && fp8 < train) {
		t.Errorf("feplb's phase-2 buffers: fp8 forward-only %d B (%d moves), bf16 forward-only %d B (%d moves), fp8 training %d B (%d moves)", fp8, m8, bf, mb, train, mt)
	}
	t.Logf("phase-2 buffers: fp8 forward-only %d B, bf16 forward-only %d B, fp8 training %d B; %d moves", fp8, bf, train, m8)
}

// TestFP8DeviceCheckCatchesFEPLBFaults: feplb's planted phase-2 faults at
// fp8 act on every step and stay faults of the data, not of the memory.
// "scale-offset" where the moved expert is its owner's last local one (a
// trace makes rank 0's last expert the hot one; needs 4 or more local
// experts and topk − 1 ≤ the other domain's): the check's error, not a
// read past the owner's multipliers. And on a second step after a clean
// first one (whose slots held the right weights, the same helper's slots
// the second reuses where they suffice): the multipliers copied one float
// off fail it there too.
func TestFP8DeviceCheckCatchesFEPLBFaults(t *testing.T) {
	defer func() { feplb.FP8Fault = "" }()
	c := harnesstest.FP8DeviceCases()["feplb"]
	c.ForwardOnly = true
	L := c.Experts / c.EP
	var trace strings.Builder
	// rank 0's last expert the heaviest (half the tokens; a quarter each to
	// the two before it), rank 1 idle, the rest on the other domain's
	// experts: moving the last expert to rank 1 evens rank 0's domain best
	for i := range c.EP * c.Tokens {
		fmt.Fprintf(&trace, "%d", L-1-max(0, i%4-1))
		for j := 1; j < c.TopK; j++ {
			fmt.Fprintf(&trace, " %d", 2*L+(i+j-1)%(c.Experts-2*L))
		}
		trace.WriteString("\n")
	}
	last := c
	last.Routing = setup.Routing{Kind: setup.RoutingTrace, File: harnesstest.WriteTrace(t, trace.String())}
	feplb.FP8Fault = "scale-offset"
	dl0 := deviceRun(t, last, &device.Emu{})
	cr0, err := check.CheckDevice(dl0)
	st := dl0.Dispatcher.Capabilities().Rebalance.Stats()
	if hot := c.EP * c.Tokens / 2; len(st.TokensAfter) < 2 || st.TokensAfter[1]-st.TokensBefore[1] != hot {
		t.Fatalf("rank 1 took %v − %v rows, want rank 0's last expert's %d", st.TokensAfter, st.TokensBefore, hot)
	}
	if err != nil || cr0.Passed || cr0.MaxRelErr <= check.Tolerance {
		t.Errorf("scale-offset at rank 0's last expert: %v, %+v", err, cr0)
	} else {
		t.Logf("scale-offset at rank 0's last expert: max rel err %.3g", cr0.MaxRelErr)
	}
	feplb.FP8Fault = ""
	dl := deviceRun(t, c, &device.Emu{})
	if cr, err := check.CheckDevice(dl); err != nil || !cr.Passed {
		t.Fatalf("the clean first step: %v, %+v", err, cr)
	}
	feplb.FP8Fault = "scale-offset"
	cr, err := check.CheckDevice(dl)
	if st := dl.Dispatcher.Capabilities().Rebalance.Stats(); err != nil || cr.Passed || cr.MaxRelErr <= check.Tolerance || st.Moves == 0 {
		t.Errorf("scale-offset on the second step: %v, %+v (%d moves)", err, cr, st.Moves)
	} else {
		t.Logf("scale-offset on the second step: max rel err %.3g", cr.MaxRelErr)
	}
}
