package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// TestAdviseSimulatedCUDA: advise on the simulated cuda device (the fake
// driver, the kernels compiled for the CPU, two fake GPUs of 32 SMs, two
// ranks each), with alltoall made clearly slower by a test-only delay in
// the simulation (each launch of sort_chunks, alltoall's own kernel, ends
// 100 ms later on the event clock that times the steps:
// FAKECUDA_DELAY_KERNELS; a step's floor there, the fake cuBLASLt's GEMM
// times and half a millisecond per event record of every rank, is ~200 ms,
// and alltoall runs sort_chunks four times a step, so the delay adds at
// least 400 ms to each of its steps). It gates the designs on the cuda
// device (deepep's library needs NCCL, missing; alltoall's library is
// found unavailable when it runs: two ranks share a GPU), finds the
// budgets that do not fit two ranks' blocks on a 32-SM GPU unavailable,
// tunes deepep within those that fit, and separates the finalists with
// compare's fine test (not the host's gross one): deepep wins, with the
// SMs it leaves to the GEMMs, and no host warning.
func TestAdviseSimulatedCUDA(t *testing.T) {
	hostsim.SkipIfShort(t, "TestAdvisePlantedDelay's host runs (skipped too) and the advise package's tests")
	t.Setenv("FAKECUDA_SMS", "32")
	comp := hostsim.Setup(t)
	old := device.NewCompiler
	device.NewCompiler = func() (device.Compiler, error) { return comp, nil }
	t.Cleanup(func() { device.NewCompiler = old })
	t.Setenv("MOEBENCH_NCCL", filepath.Join(t.TempDir(), "no-libnccl.so.2"))
	t.Setenv("FAKECUDA_DELAY_KERNELS", "sort_chunks=100000")
	out := filepath.Join(t.TempDir(), "advice")
	code, stdout, stderr := cli("advise", "--device", "cuda", "--preset", "tiny", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--ep", "4",
		"--dispatcher", "alltoall,deepep", "--rounds", "2", "--budget", "15m", "--out", out)
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	a := readAnswer(t, out)
	d := a.Decision
	if a.Device != "cuda" || !strings.Contains(a.GPU, "Fake GPU") || strings.Contains(stdout+stderr, "HOST DEVICE") {
		t.Errorf("device %s, gpu %q", a.Device, a.GPU)
	}
	if !d.Separated || !strings.HasPrefix(d.Winner, "deepep/native sms=") || d.RunnerUp != "alltoall/native" || d.Verdict != results.VerdictRegression {
		t.Errorf("decision: %+v\n%s", d, stdout)
	}
	p50 := map[string]float64{}
	for _, f := range a.Finalists {
		p50[f.Dispatcher+"/"+f.Impl] = f.P50
	}
	if p50["alltoall/native"]-p50["deepep/native"] < 100 { // the planted delay dominates the step's floor
		t.Errorf("alltoall's step p50 %.3f ms is not the planted 100 ms above deepep's %.3f ms", p50["alltoall/native"], p50["deepep/native"])
	}
	gate := map[string]string{}
	for _, g := range a.Gate {
		if !g.Available {
			gate[g.Dispatcher+"/"+g.Impl] = g.Stage
		}
	}
	if gate["deepep/library"] != "gate" || gate["alltoall/library"] != "steps" || len(gate) != 2 {
		t.Errorf("unavailable: %v", gate)
	}
	if len(a.Tuning) != 1 {
		t.Fatalf("tuning: %+v", a.Tuning)
	}
	fit := map[int]string{}
	for _, p := range a.Tuning[0].Points {
		fit[p.SMs] = p.Status
	}
	if fit[8] != "ok" || fit[16] != "ok" || fit[32] != "unavailable" || fit[64] != "unavailable" || a.Tuning[0].Best > 16 || a.Tuning[0].Smallest == 0 {
		t.Errorf("SM search: %+v", a.Tuning[0])
	}
	for _, f := range a.Finalists {
		if f.Label() == d.Winner && !strings.Contains(f.SMsLeft, "of 32 (") {
			t.Errorf("SMs left: %q", f.SMsLeft)
		}
	}
}
