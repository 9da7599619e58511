package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/moebench/moebench/harness/bench"
	"github.com/moebench/moebench/results"
)

// published is the results file the repository publishes (host device:
// ok, unavailable and rebalancing rows over four EP sizes).
const published = "../../results/published/host-tiny.jsonl"

// recordsFixture writes published's records to a new file with two more:
// an unavailable point of a dispatcher with a long name and a long reason,
// and a copy of the first ok record moved to the cuda device (so that its
// group has a speedup, a number).
func recordsFixture(t *testing.T) string {
	t.Helper()
	recs, err := results.ReadFile(published, nil)
	if err != nil {
		t.Fatal(err)
	}
	var un, ok *results.Record
	for i := range recs {
		switch {
		case un == nil && recs[i].Status == results.StatusUnavailable:
			un = &recs[i]
		case ok == nil && recs[i].Status == results.StatusOK:
			ok = &recs[i]
		}
	}
	long := *un
	long.Config.Dispatcher = "a-dispatcher-with-a-very-long-name-from-a-future-design"
	long.Reason = longReason
	cu := *ok
	cu.Config.Device, cu.Stack.Device = "cuda", "cuda"
	p := filepath.Join(t.TempDir(), "records.jsonl")
	for _, r := range append(recs, long, cu) {
		if _, err := results.Append(p, &r); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// tooWide lists the lines of out wider than results.TermWidth.
func tooWide(out string) []string {
	var bad []string
	for _, l := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(l); n > results.TermWidth {
			bad = append(bad, l)
		}
	}
	return bad
}

// smallRun is a run of the host device that takes well under a second.
var smallRun = []string{"--device", "host", "--ep", "2", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--warmup", "0", "--iters", "2"}

// TestDefaultTablesFit: every command's default output (run, report,
// compare, straggler, bench dispatch and kernels) fits results.TermWidth
// columns on inputs with long dispatcher names, unavailable points with
// long reasons and every kind of row; the reasons are kept in full below
// the tables.
func TestDefaultTablesFit(t *testing.T) {
	recs := recordsFixture(t)
	outs := map[string]string{}
	for name, args := range map[string][]string{
		"run":            append([]string{"--dispatcher", "feplb"}, smallRun...),
		"report":         {"report", recs},
		"compare":        {"compare", published, published}, // one stack
		"straggler":      {"straggler", "--ep", "16", "--experts", "64", "--steps", "20", "--seeds", "2", "--backward", "--sched-us", "5"},
		"bench dispatch": {"bench", "dispatch", "--device", "host", "--ep", "1", "--tokens", "16", "--hidden", "32", "--warmup", "0", "--iters", "2"},
	} {
		code, out, e := cli(args...)
		if code != exitOK && !(name == "bench dispatch" && code == exitRuntime) || out == "" { // bench dispatch: a point was unavailable
			t.Fatalf("%s: exit %d\n%s", name, code, e)
		}
		outs[name] = out
	}
	var b bytes.Buffer
	writeBenchWidth(&b, kernelBenchFixture(), tableWidth(false))
	outs["bench kernels"] = b.String()
	b.Reset()
	writeDispatchBenchWidth(&b, dispatchBenchFixture(), tableWidth(false))
	outs["bench dispatch (cuda)"] = b.String()
	for name, out := range outs {
		if bad := tooWide(out); len(bad) > 0 {
			t.Errorf("%s: %d lines wider than %d columns, the first:\n%s", name, len(bad), results.TermWidth, bad[0])
		}
	}
	// the reasons, in full, below the tables (wrapped)
	for _, name := range []string{"report", "bench dispatch (cuda)"} {
		if flat := strings.Join(strings.Fields(strings.ReplaceAll(outs[name], "\n#", " ")), " "); !strings.Contains(flat, strings.Join(strings.Fields(longReason), " ")) {
			t.Errorf("%s: the long reason is not there in full:\n%s", name, outs[name])
		}
	}
	if !strings.Contains(outs["report"], "a-dispatcher-wi…") {
		t.Errorf("report: the long dispatcher name is not cut to fit:\n%s", outs["report"])
	}
	// the most-read columns first
	for name, head := range map[string]string{
		"report":         "# dispatcher impl sms status step_p50_ms speedup† dispatch_p50_us combine_p50_us",
		"straggler":      "# policy eff_straggler_us eff_straggler_% eff_reduction token_straggler_% token_reduction",
		"bench kernels":  "kernel p50 µs rate unit ratio ceiling target",
		"bench dispatch": "dispatcher prec sms dispatch ms GB/s GB/s/SM pred/SM combine ms GB/s GB/s/SM pred/SM check",
	} {
		found := false
		for _, l := range strings.Split(outs[name], "\n") {
			found = found || strings.HasPrefix(strings.Join(strings.Fields(l), " "), head)
		}
		if !found {
			t.Errorf("%s: no header starting %q\n%s", name, head, outs[name])
		}
	}
}

// TestWideShowsEveryColumn: with --wide each command prints every column,
// as the tables were before they fitted the terminal: report's is
// results.WriteReport's table, a run's is results.Write's table of its own
// record, compare's has the workload column, straggler's and the bench
// tables' every header.
func TestWideShowsEveryColumn(t *testing.T) {
	recs := recordsFixture(t)
	code, out, e := cli("report", "--wide", recs)
	rs, err := results.ReadFile(recs, nil)
	if err != nil || code != exitOK {
		t.Fatal(code, e, err)
	}
	var want bytes.Buffer
	results.WriteReport(&want, results.BuildReport(rs), "table", "")
	if out != want.String() {
		t.Errorf("report --wide is not the full table:\n%s", out)
	}
	for _, h := range []string{"rank_step_p50", "lockstep_p50", "speedup_vs_alltoall", "dispatch_copy_GBps", "combine_algo_GBps_per_SM", "mem_max_MiB", "sm_util_%", "max_rel_err", "scheduler_exposed_p50"} {
		if !strings.Contains(out, h) {
			t.Errorf("report --wide: no %s", h)
		}
	}

	rec := filepath.Join(t.TempDir(), "run.jsonl")
	code, out, e = cli(append([]string{"--wide", "--out", rec, "--dispatcher", "feplb"}, smallRun...)...)
	if rs, err = results.ReadFile(rec, nil); code != exitOK || err != nil || len(rs) != 1 {
		t.Fatal(code, e, err)
	}
	want.Reset()
	results.Write(&want, &rs[0], "table")
	if out != want.String() || len(tooWide(out)) == 0 {
		t.Errorf("run --wide is not the record's full table:\n%s", out)
	}

	code, out, _ = cli("compare", "--wide", published, published)
	if code != exitOK || !strings.Contains(out, "interval_%  workload") || len(tooWide(out)) == 0 {
		t.Errorf("compare --wide: exit %d\n%s", code, out)
	}

	code, out, _ = cli("straggler", "--wide", "--ep", "16", "--experts", "64", "--steps", "20", "--seeds", "2", "--backward", "--sched-us", "5")
	for _, h := range []string{"policy", "eff_straggler_us", "token_straggler ", "nvlink_MB/step", "network_MB/step", "ep_overhead_%", "bwd_exposed_us", "token_straggler_range", "sched_us"} {
		if code != exitOK || !strings.Contains(out, h) {
			t.Errorf("straggler --wide: exit %d, no %s", code, h)
		}
	}

	var b bytes.Buffer
	writeBenchWidth(&b, kernelBenchFixture(), tableWidth(true))
	if !strings.Contains(b.String(), "kernel                            shape  p50 µs") {
		t.Errorf("bench kernels --wide:\n%s", b.String())
	}
	b.Reset()
	writeDispatchBenchWidth(&b, dispatchBenchFixture(), tableWidth(true))
	if !strings.Contains(b.String(), "parts ms") || !strings.Contains(b.String(), "unavailable: "+longReason[:40]) {
		t.Errorf("bench dispatch --wide:\n%s", b.String())
	}
	for _, args := range [][]string{{"bench", "kernels", "--help"}, {"bench", "dispatch", "--help"}, {"report", "--help"}, {"compare", "--help"}, {"straggler", "--help"}, {"--help"}} {
		if _, out, _ := cli(args...); !strings.Contains(out, "--wide") {
			t.Errorf("%v: no --wide", args)
		}
	}
}

// longReason is an unavailable point's reason, longer than a line.
var longReason = "DeepEP's intranode mode runs 2, 4 or 8 ranks (the GPUs of one NVLink node), not EP 1; larger EP is its internode mode (NVSHMEM), which moebench does not model " + strings.Repeat("and more words ", 8)

// kernelBenchFixture is a kernel benchmark with long kernel names, shapes
// and ceilings (as on a GPU).
func kernelBenchFixture() *bench.KernelBench {
	kb := &bench.KernelBench{Config: results.Config{Preset: "qwen3-30b-a3b", EP: 8},
		Routing: "balanced routing: rank 0 receives 4096 tokens × 8 experts from each of 8 ranks, the experts of rank 0 get 512 rows each",
		Timing:  "each timed call follows an L2 flush (256 MiB copied on the stream), so no call finds its inputs in the L2",
		Peer:    "peer rows copy from GPU 0 to GPU 1 (NVLink, peer access on)"}
	kb.Stack.Note = "cuda: NVIDIA H100 80GB HBM3 (132 SMs), driver 580.65, CUDA 13.0"
	kb.Rows = []bench.Row{
		{Kernel: "peer copy (ceiling)", Shape: "256 MiB", P50us: 812.5, Rate: 330.4, Unit: "GB/s"},
		{Kernel: "alltoall dispatch (peer copies)", Shape: "7 chunks × 4096 rows × 2048", P50us: 123.4, Rate: 290.1, Unit: "GB/s", Ceiling: "peer copy", Ratio: 0.88},
		{Kernel: "deepep dispatch (16-byte path, 20 SMs)", Shape: "4096 tokens × top-8 × 2048", P50us: 98.7, Rate: 2512.3, Unit: "GB/s", Ceiling: "SM copy (0.85 of the CE copy)", Ratio: 0.71, Target: 0.6},
		{Kernel: "grouped expert GEMM fc1 (cuBLASLt)", Shape: "128 experts × 512 × 2048 × 1536", P50us: 1530.2, Rate: 612.3, Unit: "TFLOP/s", Ceiling: "dense GEMM", Ratio: 0.81, Target: 0.9},
	}
	return kb
}

// dispatchBenchFixture is a dispatch benchmark with ok points (one whose
// design times its dispatch in parts), an unavailable one with a long
// reason and a failed one.
func dispatchBenchFixture() *bench.DispatchBench {
	b := &bench.DispatchBench{Config: results.Config{Preset: "tiny", Tokens: 128, Hidden: 128, Experts: 16, TopK: 4, EP: 8, Device: "cuda"},
		Routing: "balanced", Clock: "CUDA events around each phase, its slowest rank per iteration",
		Bytes: "each design's own convention (DeepEP's test_intranode and HybridEP's test_hybrid_ep: tokens received × hidden × 2 B, a rank's tokens to itself included)",
		Check: "every iteration: dispatch then combine gives each rank's input back exactly", Ranks: "8 ranks on 8 GPUs (one per GPU)"}
	tr := &results.Traffic{DispatchGBps: 123.456, CombineGBps: 98.765, DispatchGBpsPerSM: 6.1728, CombineGBpsPerSM: 4.9383}
	ph := []results.Phase{{Name: "notify", Stat: results.Stat{P50: 0.012}}, {Name: "dispatch", Stat: results.Stat{P50: 0.345}}, {Name: "combine", Stat: results.Stat{P50: 0.456}}}
	b.Points = []bench.DispatchPoint{
		{Dispatcher: "alltoall", Impl: "native", Status: results.StatusOK, RoundTrip: "exact", Phases: ph[1:], Traffic: &results.Traffic{DispatchGBps: 50.5, CombineGBps: 40.25}},
		{Dispatcher: "deepep", Impl: "native", SMs: 20, Budget: 20, Status: results.StatusOK, RoundTrip: "exact", Phases: ph, Traffic: tr,
			DispatchAsDesigned: &results.DesignPhase{Parts: []string{"notify", "dispatch"}, About: "as DeepEP's test_intranode.py times buffer.dispatch", Phase: results.Phase{Name: "notify+dispatch", Stat: results.Stat{P50: 0.357}}},
			HeldNote:           "20 SMs held by each rank (one block per SM)", SMUse: "GPM SM utilisation 45.5% over the timed iterations"},
		{Dispatcher: "hybridep", Impl: "native", SMs: 16, Budget: 16, Status: results.StatusUnavailable, Reason: longReason},
		{Dispatcher: "deepep", Impl: "native", SMs: 32, Budget: 32, Status: results.StatusFailed, Reason: "cuda: " + longReason},
	}
	return b
}
