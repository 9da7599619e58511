package harness

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// fp8DeviceCases are the dispatchers whose cuda device implementation
// moves FP8 rows, in layers that exercise them: hidden 512 (4 blocks a
// row, packed rows of 528 bytes) and 384 (3 blocks, 396 bytes padded to
// 400), a shared expert, EP 1 (no exchange) and sigmoid routing; hybridep
// (hidden 512, its fp8 constraint) with one domain and with two; deepep
// at hidden 512 and at 384 (skewed, a shared expert).
func fp8DeviceCases() map[string]Config {
	base := fp8Config("alltoall")
	base.Device = "cuda"
	odd := base
	odd.Hidden = 384
	sig := base
	sig.Score, sig.Groups, sig.GroupTopK, sig.TopKScale, sig.SharedExperts = "sigmoid", 4, 2, 2.5, 1
	sig.Routing = Routing{Kind: RoutingSkewed, Alpha: 1.2}
	one := base
	one.EP = 1
	fe := base // skewed, so that phase 2 moves packed rows to helpers
	fe.Dispatcher, fe.FeplbBase, fe.Domain, fe.Routing = "feplb", "alltoall", 2, Routing{Kind: RoutingSkewed, Alpha: 1.5}
	he := base // hybridep: pack, dispatch and permute move the packed rows
	he.Dispatcher, he.SMs = "hybridep", 16
	he2 := he // two domains: the inter-domain path (pack, exchange) moves them too
	he2.Domain = 2
	de := base // deepep: its dispatch's rings, receive rows and permute move the packed rows
	de.Dispatcher, de.SMs = "deepep", 2
	de384 := de // packed rows of 396 bytes padded to 400, skewed, a shared expert
	de384.Hidden, de384.SharedExperts, de384.Routing = 384, 1, Routing{Kind: RoutingSkewed, Alpha: 1.2}
	return map[string]Config{"alltoall": base, "alltoall-h384": odd, "alltoall-sigmoid-shared": sig, "alltoall-ep1": one, "feplb": fe,
		"hybridep": he, "hybridep-domain2": he2, "deepep": de, "deepep-h384-shared": de384}
}

// TestFP8DeviceEqualsHost: at fp8 the cuda device (Emu; quant_fp8_rows,
// dequant_fp8_rows, fp8_rows_lt and quant_fp8_lt through their twins,
// which are the host functions the hostsim tests hold the CUDA C to, and
// Emu's FP8 MatMul, kernels.FP8GEMM) runs training steps that pass the
// check (the output and every gradient against the float64 reference on
// the same quantized inputs and weights), and its output, rows and traffic
// equal the host device's fp8 layer's bit for bit (equalsHostOn): both run
// the FP8 GEMMs on the same operands, feplb's layer the bf16 GEMMs on
// dequantized rows (fp8GEMMPath). On one device and with the ranks on
// three; the second step of each with the expert GEMMs over 4 streams.
func TestFP8DeviceEqualsHost(t *testing.T) {
	for name, c := range fp8DeviceCases() {
		if c.Dispatcher == "hybridep" && c.Domain > 1 { // its inter-domain path: a device per rank
			t.Run(name+"-4devices", func(t *testing.T) { equalsHost(t, c, c.EP) })
			continue
		}
		t.Run(name, func(t *testing.T) {
			equalsHost(t, c, 1)
			if c.Dispatcher == "feplb" {
				rec, err := Run(c, Env{Version: "test", OpenDevices: emus(1)})
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
// (cublaslt-fp8-block: Emu emulates cuBLASLt's FP8 GEMM; feplb's
// bf16-dequant, with its reason) and times the quantize phase.
// hybridep: issue 34's command, --dispatcher hybridep --sms 16 --precision
// fp8 --hidden 512.
func TestFP8DeviceRun(t *testing.T) {
	for _, name := range []string{"alltoall", "hybridep", "deepep", "feplb"} {
		c := fp8DeviceCases()[name]
		rec, err := Run(c, Env{Version: "test", OpenDevices: emus(1)})
		if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.Correctness.Grads == nil {
			t.Fatalf("%s: %v, %s %q, %+v", name, err, rec.Status, rec.Reason, rec.Correctness)
		}
		method, path, why := ExpertPathFP8Dev, kernels.FP8GEMMBlock, "Emu simulation runs cuBLASLt's block-scaled FP8 GEMM"
		if name == "feplb" {
			method, path, why = ExpertPathFP8, kernels.FP8GEMMDequant, "feplb's phase 2 moves"
		}
		if rec.Config.Precision != PrecisionFP8 || !strings.HasPrefix(rec.GEMM.Method, method+"; ") || rec.GEMM.FP8Path != string(path) || !strings.Contains(rec.GEMM.FP8PathReason, why) {
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
// on dequantized rows (feplb): each row dequantized from the next packed
// row (its values and multipliers), or not at all.
func TestFP8DeviceCheckCatchesBrokenDequantization(t *testing.T) {
	defer func() { fp8DevFault, fp8Fault = "", "" }()
	for _, fault := range []string{"lt-order", "a-missing", "w-block", "row", "none"} {
		c := fp8DeviceCases()["alltoall"]
		fp8DevFault, fp8Fault = fault, ""
		switch fault {
		case "w-block":
			fp8DevFault, fp8Fault = "", fault
		case "row", "none":
			c = fp8DeviceCases()["feplb"]
		}
		c.ForwardOnly = true
		rec, err := Run(c, Env{Version: "test", OpenDevices: emus(1)})
		if err == nil || rec.Status != results.StatusFailed || rec.Correctness == nil || rec.Correctness.MaxRelErr <= Tolerance {
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
// cublaslt-fp8-block (feplb's bf16-dequant), whose packed rows equal the
// host's QuantFP8Rows bit for bit (codes and multipliers), and whose
// outputs equal the host device's fp8 layer's bit for bit (equalsHostOn:
// the same FP8 GEMM path, feplb's the bf16 one).
func TestFP8CUDALayerOnHostSim(t *testing.T) {
	useHostSimLayer(t)
	for name, c := range fp8DeviceCases() {
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
			rec, err := Run(c, Env{Version: "test"})
			if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.Correctness.Grads == nil {
				t.Fatalf("%v, %s %q, %+v", err, rec.Status, rec.Reason, rec.Correctness)
			}
			t.Logf("max rel err %.2e, gradients %.2e", rec.Correctness.MaxRelErr, rec.Correctness.Grads.MaxRelErr)
			// the fake cuBLASLt is 13.0 on a GPU of sm_90: it offers block
			// scaling, and the layer ran it (feplb: bf16 on dequantized rows)
			path, why := kernels.FP8GEMMBlock, "has VEC128_32F/BLK128x128_32F"
			if c.Dispatcher == "feplb" {
				path, why = kernels.FP8GEMMDequant, "feplb's phase 2 moves"
			}
			if rec.GEMM.FP8Path != string(path) || !strings.Contains(rec.GEMM.FP8PathReason, why) {
				t.Errorf("record: fp8 GEMM path %q (%s)", rec.GEMM.FP8Path, rec.GEMM.FP8PathReason)
			}
			devs, err := OpenDevices(Env{}, min(c.EP, 2), c.EP, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { closeDevices(devs) })
			equalsHostOn(t, c, devs...)
			dl := deviceRun(t, c, devs...)
			if _, err := checkDevice(dl); err != nil {
				t.Fatal(err)
			}
			h, pitch := c.Hidden, kernels.FP8RowPitch(c.Hidden)
			for r, rk := range dl.ranks {
				words := make([]uint16, c.Tokens*pitch/2)
				if err := rk.Dev.Download(words, rk.X, rk.Stream); err != nil {
					t.Fatal(err)
				}
				got, _ := device.HostBytes(words)
				q, s, _ := kernels.QuantFP8Rows(dl.l.X[r], h, false)
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
// GEMM path where that is bf16 on dequantized rows (feplb's,
// fp8GEMMPath) for t, so that the two are compared bit for bit.
func hostRunsDevicePath(t *testing.T) {
	was := fp8GEMMHostPath
	fp8GEMMHostPath = kernels.FP8GEMMDequant
	t.Cleanup(func() { fp8GEMMHostPath = was })
}

// TestFP8GEMMPathChoice: the cuda layer runs the FP8 GEMMs only where
// every device offers block scaling (Emu emulates it), and otherwise says
// why it runs bf16 on dequantized rows: feplb, an ffn cuBLAS's FP8 rules
// refuse, no cuBLASLt, a library or GPU without block scaling (here a
// cuBLASLt 12.8 on a device of unknown compute capability), one such
// device among Emus.
func TestFP8GEMMPathChoice(t *testing.T) {
	emu, _ := emus(1)(1, 1)
	old := &device.CUDA{Lt: &cuda.CuBLASLt{Version: 120800}}
	c := fp8DeviceCases()["alltoall"]
	fe, ffn := c, c
	fe.Dispatcher = "feplb"
	ffn.FFN = 24
	for _, tc := range []struct {
		name string
		c    Config
		devs []device.Device
		path kernels.FP8GEMMPath
		why  string
	}{
		{"emu", c, emu, kernels.FP8GEMMBlock, "Emu simulation runs cuBLASLt's block-scaled FP8 GEMM"},
		{"feplb", fe, emu, kernels.FP8GEMMDequant, "feplb's phase 2 moves"},
		{"ffn24", ffn, emu, kernels.FP8GEMMDequant, "--ffn 24"},
		{"no-cublaslt", c, []device.Device{&device.CUDA{}}, kernels.FP8GEMMDequant, "no cuBLASLt"},
		{"old-cublaslt", c, []device.Device{old}, kernels.FP8GEMMDequant, "offers bf16-dequant (cuBLASLt 120800"},
		{"emu-and-old", c, append(append([]device.Device{}, emu...), old), kernels.FP8GEMMDequant, "offers bf16-dequant"},
	} {
		path, why := fp8GEMMPath(tc.devs, tc.c)
		if path != tc.path || !strings.Contains(why, tc.why) {
			t.Errorf("%s: %s (%s), want %s (…%s…)", tc.name, path, why, tc.path, tc.why)
		}
	}
}
