package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// TestDefaultPresetHybridEPFP8: the issue's "done" command, 'moebench
// --dispatcher hybridep --sms 16 --precision fp8', at the default preset
// (tiny: hidden 512, which HybridEP's FP8 dispatch allows, hidden % 512)
// runs on the host device and on the simulated cuda device (the fake GPUs,
// two of 64 SMs: EP 8's four ranks a GPU, 16 SMs each), exits 0, prints
// PASS and records an fp8 training step whose outputs and gradients are
// within their tolerances. No shape flag is given: only the device, the
// record's file and, on the simulation, one timed iteration (the check
// runs before the timed iterations, whatever their number) and a
// cross-rank wait scaled as the simulation's other tests scale theirs (its
// 128 blocks spin on the CPU's cores).
func TestDefaultPresetHybridEPFP8(t *testing.T) {
	issue := []string{"--dispatcher", "hybridep", "--sms", "16", "--precision", "fp8"}
	tiny, _ := setup.LookupPreset("tiny")
	for _, c := range []struct {
		device string
		more   []string
	}{
		{"host", nil},
		{"cuda", []string{"--warmup", "0", "--iters", "1", "--comm-timeout", commTimeout(t)}},
	} {
		t.Run(c.device, func(t *testing.T) {
			if c.device == "cuda" {
				hostsim.SkipIfShort(t, "the host device's run and the harness's TestFP8CUDALayerOnHostSim (hybridep at fp8 on the fake GPUs)")
				t.Setenv("FAKECUDA_SMS", "64")
				comp := hostsim.Setup(t)
				old := device.NewCompiler
				device.NewCompiler = func() (device.Compiler, error) { return comp, nil }
				t.Cleanup(func() { device.NewCompiler = old })
			}
			out := filepath.Join(t.TempDir(), "r.jsonl")
			args := append(append(append([]string{"--device", c.device}, issue...), c.more...), "--out", out)
			code, stdout, stderr := cli(args...)
			if code != exitOK || !strings.Contains(stdout, "correctness            PASS") || !strings.Contains(stdout, "gradients              PASS") {
				t.Fatalf("%v: exit %d\n%s%s", args, code, stdout, stderr)
			}
			recs, err := results.ReadFile(out, nil)
			if err != nil || len(recs) != 1 {
				t.Fatalf("record: %v, %d records", err, len(recs))
			}
			r := recs[0]
			cr, g := r.Correctness, r.Correctness.Grads
			if r.Status != results.StatusOK || r.Config.Preset != "tiny" || r.Config.Hidden != tiny.Hidden || r.Config.Hidden%512 != 0 ||
				r.Config.Precision != setup.PrecisionFP8 || r.Config.Dispatcher != "hybridep" || r.Config.SMs != 16 {
				t.Fatalf("status %s %q, config %+v", r.Status, r.Reason, r.Config)
			}
			if !cr.Passed || !(cr.MaxRelErr <= cr.Tolerance) || g == nil || !(g.MaxRelErr <= g.Tolerance) {
				t.Fatalf("check %+v, gradients %+v", cr, g)
			}
			// the fp8 path ran, not a bf16 one that would pass the same check:
			// the expert GEMMs' FP8 path, and the dispatch moving e4m3 rows
			// with their scales (hidden + hidden/128 × 4 B a token) where the
			// combine moves bf16's hidden × 2 B for the same tokens
			if r.GEMM == nil || r.GEMM.FP8Path != "cublaslt-fp8-block" || r.Traffic == nil ||
				r.Traffic.DispatchAlgorithm*2*512 != r.Traffic.CombineAlgorithm*(512+4*512/128) || r.Traffic.DispatchAlgorithm == 0 {
				t.Fatalf("gemm %+v, traffic %+v: want the FP8 GEMM path and fp8 rows in dispatch", r.GEMM, r.Traffic)
			}
			t.Logf("%s: max rel err %.2e (tolerance %.0e), gradients %.2e (tolerance %.0e)", c.device, cr.MaxRelErr, cr.Tolerance, g.MaxRelErr, g.Tolerance)
		})
	}
}
