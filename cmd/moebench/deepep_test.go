package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/bench"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// TestDeepEPRun: 'moebench --dispatcher deepep --sms 24' runs on the host
// device with PASS, its own phases, bandwidth per SM and its buffers; bad
// budgets and timeouts are usage errors naming the flag.
func TestDeepEPRun(t *testing.T) {
	out := filepath.Join(t.TempDir(), "r.jsonl")
	code, stdout, stderr := cli(append(quick, "--wide", "--dispatcher", "deepep", "--sms", "24", "--out", out)...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"correctness            PASS", "\n  layout ", "\n  notify ", "\n  dispatch ", "\n  permute ", "\n  combine ",
		"GB/s per SM (24 SMs)", "dispatcher buffers     queues "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("missing %q in\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "\n  unpermute ") {
		t.Errorf("deepep has no unpermute phase:\n%s", stdout)
	}
	recs, err := results.ReadFile(out, nil)
	if err != nil || len(recs) != 1 {
		t.Fatal(recs, err)
	}
	r := recs[0]
	tr := r.Traffic
	if r.SMs.Configured != 24 || r.SMs.Budget != 24 || r.Config.CommTimeoutS != 5 || tr.DispatchGBps <= 0 ||
		tr.DispatchGBpsPerSM != tr.DispatchGBps/24 || tr.CombineGBpsPerSM != tr.CombineGBps/24 || len(r.Memory.Buffers) != 4 {
		t.Errorf("record: sms %+v, comm timeout %v, traffic %+v, buffers %+v", r.SMs, r.Config.CommTimeoutS, tr, r.Memory.Buffers)
	}
	// queue memory by hand: EP 4, hidden 32, top-4, 24 SMs = 12 channels,
	// rings of 256: count matrices 4·(4·4 + 4·4) B, then per (channel,
	// source) 4 ints and 256 slots of 64 B row + 4 B index + 4·(4+4) B top-k
	if q := r.Memory.Buffers[0]; q.Name != "queues" || q.PerRankBytes[0] != 4*(16+16)+12*4*(16+256*(64+4+32)) {
		t.Errorf("queue memory %+v", q)
	}
	for _, c := range []struct{ args []string }{
		{[]string{"--dispatcher", "deepep", "--sms", "23"}},
		{[]string{"--dispatcher", "deepep", "--comm-timeout", "-1s"}},
	} {
		code, _, e := cli(append(quick, c.args...)...)
		if code != exitUsage || !strings.Contains(e, c.args[2]+"="+c.args[3]) {
			t.Errorf("%v: exit %d, %q", c.args, code, e)
		}
	}
	if code, _, e := cli(append(quick, "--dispatcher", "deepep", "--sms", "23")...); !strings.Contains(e, "must be even") {
		t.Errorf("odd budget: exit %d, %q", code, e)
	}
	code, stdout, _ = cli(append(quick, "--dispatcher", "deepep", "--ep", "16", "--format", "json")...)
	if code != exitRuntime || !strings.Contains(stdout, `"status":"unavailable"`) || !strings.Contains(stdout, "2, 4 or 8 ranks") {
		t.Errorf("EP 16: exit %d, %s", code, stdout)
	}
}

// TestSweepSMs: a sweep over alltoall and deepep at three budgets records
// one alltoall point and three deepep points, which the report shows side
// by side with their bandwidths.
func TestSweepSMs(t *testing.T) {
	out := filepath.Join(t.TempDir(), "s.jsonl")
	code, _, stderr := cli(append([]string{"sweep", "--out", out, "--dispatchers", "alltoall,deepep", "--sms", "16,24,32", "--ep", "4"}, sweepQuick...)...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	recs, err := results.ReadFile(out, nil)
	if err != nil || len(recs) != 4 {
		t.Fatalf("%d records, %v", len(recs), err)
	}
	seen := map[string]bool{}
	for _, r := range recs {
		seen[r.Config.Settings()] = r.Status == results.StatusOK
	}
	for _, s := range []string{"alltoall/native sms=0", "deepep/native sms=16", "deepep/native sms=24", "deepep/native sms=32"} {
		if !seen[s] {
			t.Errorf("no ok point %s (all: %v)", s, seen)
		}
	}
	code, report, _ := cli("report", "--wide", out)
	lines := 0
	for _, l := range strings.Split(report, "\n") {
		if strings.HasPrefix(l, "  deepep ") && strings.Contains(l, " ok ") {
			lines++
		}
	}
	if code != exitOK || lines != 3 || !strings.Contains(report, "dispatch_algo_GBps_per_SM") {
		t.Errorf("report: exit %d, %d deepep rows:\n%s", code, lines, report)
	}
}

// TestBenchDispatch: each point of 'bench dispatch' is timed and checked;
// budgets vary deepep only; a failing point is reported and exits 1; an
// odd budget is a usage error; the cuda device is refused with the reason.
func TestBenchDispatch(t *testing.T) {
	small := []string{"bench", "dispatch", "--ep", "2", "--tokens", "16", "--hidden", "32", "--warmup", "0", "--iters", "2"}
	out := filepath.Join(t.TempDir(), "b.json")
	code, stdout, stderr := cli(append(small, "--dispatcher", "alltoall,deepep", "--sms", "8,24", "--out", out)...)
	if code != exitOK || !strings.Contains(stderr, "not GPU performance") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	rows := 0
	for _, l := range strings.Split(stdout, "\n") {
		if strings.Contains(l, "round trip exact") {
			rows++
		}
	}
	if rows != 3 {
		t.Errorf("%d checked rows, want alltoall once and deepep at 8 and 24:\n%s", rows, stdout)
	}
	var b bench.DispatchBench
	if raw, err := os.ReadFile(out); err != nil || json.Unmarshal(raw, &b) != nil || len(b.Points) != 3 {
		t.Fatalf("--out: %v, %+v", err, b)
	}
	for _, p := range b.Points[1:] {
		tr := p.Traffic
		if p.Status != results.StatusOK || p.RoundTrip != "exact" || tr.DispatchGBps <= 0 || tr.CombineGBps <= 0 ||
			tr.DispatchGBpsPerSM != tr.DispatchGBps/float64(p.SMs) {
			t.Errorf("point %+v, traffic %+v", p, tr)
		}
	}
	code, stdout, _ = cli(append(small, "--dispatcher", "failing,deepep", "--sms", "8")...)
	if code != exitRuntime || !strings.Contains(stdout, "failed: combine on rank 0: combine: simulated failure") || !strings.Contains(stdout, "round trip exact") {
		t.Errorf("failing point: exit %d\n%s", code, stdout)
	}
	if code, _, e := cli(append(small, "--sms", "7")...); code != exitUsage || !strings.Contains(e, "--sms=7") {
		t.Errorf("odd budget: exit %d, %q", code, e)
	}
	t.Setenv("MOEBENCH_LIBCUDA", "/nonexistent/libcuda.so.1")
	if code, _, e := cli(append(small, "--device", "cuda")...); code != exitRuntime || !strings.Contains(e, "bench dispatch: device cuda: MOEBENCH_LIBCUDA") {
		t.Errorf("cuda without a driver: exit %d, %q", code, e)
	}
}

// TestDeepEPOnFakeGPUs: on the host simulation's fake GPUs (8 SMs each),
// 'moebench --device cuda --dispatcher deepep' passes with its phases and a
// budget above the GPU's SMs ÷ its ranks (EP 4 on two GPUs: 4) is
// unavailable with the reason; a sweep over
// alltoall and deepep at three budgets records one alltoall point and a
// deepep point per budget (the one above the SMs unavailable); the dispatch
// benchmark times and checks each point on the GPUs (hybridep's too).
func TestDeepEPOnFakeGPUs(t *testing.T) {
	hostsim.SkipIfShort(t, "TestDistributedRun/ep4-over-2 (the command on the fake GPUs) and deepep's TestDeviceOnHostSim")
	t.Setenv("FAKECUDA_SMS", "8")
	comp := hostsim.Setup(t)
	old := device.NewCompiler
	device.NewCompiler = func() (device.Compiler, error) { return comp, nil }
	t.Cleanup(func() { device.NewCompiler = old })
	gpu := []string{"--device", "cuda", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--ep", "4", "--warmup", "0", "--iters", "2"}
	code, stdout, stderr := cli(append(gpu, "--dispatcher", "deepep", "--sms", "2")...)
	if code != exitOK || !strings.Contains(stdout, "correctness            PASS") || !strings.Contains(stdout, "\n  notify ") {
		t.Fatalf("run: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, _ = cli(append(gpu, "--dispatcher", "deepep", "--sms", "10", "--format", "json")...)
	if code != exitRuntime || !strings.Contains(stdout, `"status":"unavailable"`) || !strings.Contains(stdout, "--sms 10: a rank's budget is at most 4: the GPU's 8 SMs ÷ its 2 rank(s)") {
		t.Errorf("--sms 10: exit %d\n%s", code, stdout)
	}
	out := filepath.Join(t.TempDir(), "s.jsonl")
	code, _, stderr = cli(append([]string{"sweep", "--out", out, "--dispatchers", "alltoall,deepep", "--sms", "2,4,10"}, gpu...)...)
	recs, err := results.ReadFile(out, nil)
	if code != exitOK || err != nil || len(recs) != 4 { // an unavailable point is no failure
		t.Fatalf("sweep: exit %d, %d records, %v: %s", code, len(recs), err, stderr)
	}
	want := map[string]string{"alltoall/native sms=0": results.StatusOK, "deepep/native sms=2": results.StatusOK, "deepep/native sms=4": results.StatusOK,
		"deepep/native sms=10": results.StatusUnavailable}
	for _, r := range recs {
		if s := r.Config.Settings(); want[s] != r.Status || r.Config.Device != "cuda" {
			t.Errorf("point %s on %s: %s (%s)", s, r.Config.Device, r.Status, r.Reason)
		}
	}
	code, stdout, stderr = cli(append([]string{"bench", "dispatch", "--dispatcher", "alltoall,deepep,hybridep", "--sms", "2,4"}, gpu...)...)
	if code != exitOK || strings.Count(stdout, "round trip exact") != 5 || !strings.Contains(stdout, "CUDA events") {
		t.Errorf("bench dispatch: exit %d\n%s%s", code, stdout, stderr)
	}
}
