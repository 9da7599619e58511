package results

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// reportRecords: one workload with alltoall, deepep at two SM budgets, an
// unavailable hybridep and a failed feplb; and a second workload.
func reportRecords() []Record {
	g := rand.New(rand.NewPCG(5, 5))
	mk := func(d string, sms int, ms float64) Record {
		r := okRecord(d, noisy(g, 10, ms, 0.01))
		r.Config.SMs = sms
		t := *r.Timing
		t.Step.P50 = ms
		t.Phases = []Phase{{Name: "dispatch", Stat: Stat{P50: ms / 3}}, {Name: "experts", Stat: Stat{P50: ms / 2}}, {Name: "combine", Stat: Stat{P50: ms / 6}}}
		r.Timing = &t
		r.Tokens.Straggler.Rel = 0.25
		r.GEMM = &GEMM{Straggler: Straggler{Rel: 0.1}}
		r.Memory = &Memory{PerRankBytes: []int64{3 << 20, 4 << 20}}
		r.Correctness = &Correctness{Checked: true, Passed: true, MaxRelErr: 0.006}
		return r
	}
	un := *sample(StatusUnavailable)
	un.Config.Dispatcher, un.Reason = "hybridep", "needs <the> cuda device"
	failed := *sample(StatusFailed)
	failed.Config.Dispatcher, failed.Reason = "feplb", "correctness check failed"
	other := mk("alltoall", 0, 3)
	other.Config.EP = 4
	return []Record{mk("deepep", 32, 5), mk("alltoall", 0, 10), mk("deepep", 16, 8), un, failed, other}
}

func TestBuildReport(t *testing.T) {
	groups := BuildReport(reportRecords())
	if len(groups) != 2 || len(groups[0].Rows) != 5 || len(groups[1].Rows) != 1 {
		t.Fatalf("groups: %d (rows %d)", len(groups), len(groups[0].Rows))
	}
	var order []string
	for _, r := range groups[0].Rows {
		order = append(order, r.Rec.Config.Settings())
		if r.Rec.Config.Dispatcher == "deepep" && r.Rec.Config.SMs == 32 && r.Speedup != 2 {
			t.Errorf("deepep 32 SMs speedup %v, want 10/5 = 2", r.Speedup)
		}
		if r.Rec.Status != StatusOK && r.Speedup != 0 {
			t.Errorf("%s has a speedup", r.Rec.Status)
		}
	}
	want := "alltoall/native sms=0,deepep/native sms=16,deepep/native sms=32,feplb/native sms=0,hybridep/native sms=0"
	if strings.Join(order, ",") != want {
		t.Errorf("row order %v", order)
	}
}

func TestReportFormats(t *testing.T) {
	groups := BuildReport(reportRecords())
	out := map[string]string{}
	for _, f := range ReportFormats {
		t.Run(f, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteReport(&b, groups, f, "Title <x>"); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			out[f] = b.String()
		})
	}
	tab := out["table"]
	for _, want := range []string{"# stack #1: host", "speedup_vs_alltoall" + hostMark, HostRatio, "unavailable", "needs <the> cuda device", "# key:"} {
		if !strings.Contains(tab, want) {
			t.Errorf("table lacks %q:\n%s", want, tab)
		}
	}
	for _, line := range strings.Split(tab, "\n") {
		if strings.HasPrefix(line, "  hybridep") && strings.ContainsAny(line, "0123456789") {
			t.Errorf("unavailable row shows numbers: %q", line)
		}
	}
	md := out["markdown"]
	if !strings.HasPrefix(md, "# Title <x>\n") || !strings.Contains(md, "| dispatcher | impl |") || !strings.Contains(md, "|---|---|---|---|---:|") {
		t.Errorf("markdown:\n%s", md)
	}
	rows, err := csv.NewReader(strings.NewReader(out["csv"])).ReadAll()
	if err != nil || len(rows) != 7 || !slices.Contains(rows[0], "dispatcher") {
		t.Errorf("csv: %v, %d rows", err, len(rows))
	}
	h := out["html"]
	if strings.Count(h, "<svg") != 4+3 { // group 1: step, phases, dispatch/combine, sms; group 2: step, phases, dispatch/combine
		t.Errorf("html has %d charts, want 7", strings.Count(h, "<svg"))
	}
	if strings.Contains(h, "<the>") || !strings.Contains(h, "&lt;the&gt;") || strings.Contains(h, "<?xml") {
		t.Error("html does not escape record text, or inlines an XML declaration")
	}
	for _, want := range []string{"step time vs SM budget", "per-phase time", `class="unavailable"`, `class="caveat"`} {
		if !strings.Contains(h, want) {
			t.Errorf("html lacks %q", want)
		}
	}
	if err := WriteReport(&bytes.Buffer{}, groups, "pdf", ""); err == nil {
		t.Error("unknown report format accepted")
	}
}

// TestReportRebalance: a group with a rebalancing row gets the rebalancing
// table (table and markdown), with "—" for a before or an exposed time an
// older record did not have, and "n/m" for an exposed time a run did not
// measure, which the key explains; a group without gets none.
func TestReportRebalance(t *testing.T) {
	recs := reportRecords()
	rb := recs[1] // the ok alltoall row, made into feplb
	rb.Config.Dispatcher, rb.Config.FeplbBase, rb.Config.FeplbDynamic = "feplb", "alltoall", 2
	rb.GEMM = &GEMM{Straggler: Straggler{PerRank: []float64{1, 1.1}, Rel: 0.048}} // after
	rb.Rebalance = &Rebalance{TokenBefore: Straggler{PerRank: []float64{1, 3}, Rel: 0.5}, TokenAfter: Straggler{PerRank: []float64{2, 2}},
		GEMMBefore: Straggler{PerRank: []float64{1, 2}, Rel: 0.333},
		Moves:      3, CopyBytes: 3 << 20, CopyMS: 0.25, ExposedMS: 0.125, ExposedNote: "median of 20 steps; events", SchedulerMS: 0.04}
	old := rb
	old.Config.Seed++ // another workload: an older record, without the measured before or the exposed time
	r2 := *old.Rebalance
	old.Rebalance = &r2
	old.Rebalance.GEMMBefore, old.Rebalance.ExposedMS, old.Rebalance.ExposedNote, old.Rebalance.HiddenShare = Straggler{}, 0, "", "not measured: host"
	host := rb
	host.Config.Seed += 2 // a host run: exposed time not measured
	r3 := *host.Rebalance
	host.Rebalance = &r3
	host.Rebalance.ExposedNote = "not measured: the host device runs the copies in their own phase"
	for _, f := range []string{"table", "markdown"} {
		t.Run(f, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteReport(&b, BuildReport(append(recs, rb, old, host)), f, "t"); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			if strings.Count(out, "token_strag_before_%") != 3 {
				t.Errorf("%s: want a rebalancing table for each of the three feplb groups, none for the others:\n%s", f, out)
			}
			var lines []string
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "base=alltoall dynamic=2") {
					lines = append(lines, strings.Join(strings.Fields(strings.ReplaceAll(l, "|", " ")), " "))
				}
			}
			// times in µs: the scheduler's 0.04 ms would print as 0.040
			want := []string{"feplb/native sms=0 base=alltoall dynamic=2 50.0 0.0 33.3 4.8 3 3.00 250.0 125.0 40.0 0.0",
				"feplb/native sms=0 base=alltoall dynamic=2 50.0 0.0 — 4.8 3 3.00 250.0 — 40.0 0.0",
				"feplb/native sms=0 base=alltoall dynamic=2 50.0 0.0 33.3 4.8 3 3.00 250.0 n/m 40.0 0.0"}
			if strings.Join(lines, "\n") != strings.Join(want, "\n") {
				t.Errorf("%s rows:\n%s\nwant\n%s", f, strings.Join(lines, "\n"), strings.Join(want, "\n"))
			}
			if !strings.Contains(out, "n/m in copies_exposed: not measured: the host device") || !strings.Contains(out, "copy_p50_us") {
				t.Errorf("%s: no key for n/m, or no µs unit:\n%s", f, out)
			}
		})
	}
}

// TestReportHostRatiosNotNumbers: on the host device the speedup over
// alltoall is a ratio of host wall clocks, not a measurement: text,
// markdown and HTML say "host: not a measurement" in its place and the CSV
// leaves it empty (its timing_note says why); a GPU group's ratios are
// printed.
func TestReportHostRatiosNotNumbers(t *testing.T) {
	host := browserRecords()[:2] // alltoall, deepep 8
	gpu := onCUDA(browserRecords()[:2]...)
	for i := range gpu {
		gpu[i].Config.Seed = 9
		tm := *gpu[i].Timing
		tm.Step, tm.StepIs = *tm.SlowestRank, StepSlowestRank
		tm.Step.P50 *= 1 + float64(i) // deepep twice as slow on the GPU: a ratio unlike the host's
		gpu[i].Timing = &tm
	}
	groups := BuildReport(append(host, gpu...))
	if len(groups) != 2 || groups[0].Workload.Device != "host" {
		t.Fatalf("%d groups, the first on %q", len(groups), groups[0].Workload.Device)
	}
	hostRatio := fmt.Sprintf("%.2fx", groups[0].Rows[1].Speedup)
	gpuRatio := fmt.Sprintf("%.2fx", groups[1].Rows[1].Speedup)
	for _, f := range []string{"table", "markdown", "html"} {
		var b bytes.Buffer
		if err := WriteReport(&b, groups, f, "t"); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		if n := strings.Count(out, "host: not a measurement"); n != 2 {
			t.Errorf("%s: %d host speedups say \"host: not a measurement\", want 2 (alltoall and deepep)", f, n)
		}
		if hostRatio == gpuRatio {
			t.Fatalf("the host and GPU ratios are both %s: the test cannot tell them apart", hostRatio)
		}
		if strings.Contains(out, hostRatio) {
			t.Errorf("%s prints the host ratio %s", f, hostRatio)
		}
		if !strings.Contains(out, gpuRatio) {
			t.Errorf("%s lacks the GPU ratio %s", f, gpuRatio)
		}
	}
	var b bytes.Buffer
	if err := WriteReport(&b, groups, "csv", ""); err != nil {
		t.Fatal(err)
	}
	_, rows := readCSV(t, b.String())
	for _, r := range rows {
		host := r["timing_note"] != ""
		if host && r["speedup_vs_alltoall"] != "" || !host && r["speedup_vs_alltoall"] == "" {
			t.Errorf("csv %s (timing note %q): speedup %q; want empty on the host, a number on a GPU", r["dispatcher"], r["timing_note"], r["speedup_vs_alltoall"])
		}
	}
}

// TestRebalanceNoMove: a feplb run that moved nothing in any timed step
// (the harness warns "moved nothing", or a setting made it a no-op: "moves
// nothing") has no before/after: its GEMM straggler before (phase 2
// paused) and after differ by noise alone. The run's table and the
// report's rebalancing table say "no move: unchanged" instead of an after
// value; a run that moved keeps its before → after.
func TestRebalanceNoMove(t *testing.T) {
	mk := func(seed uint64, moves int, warn string) Record {
		r := reportRecords()[1]
		r.Config.Dispatcher, r.Config.FeplbBase, r.Config.FeplbDynamic, r.Config.Seed = "feplb", "alltoall", 2, seed
		r.GEMM = &GEMM{Straggler: Straggler{PerRank: []float64{1, 1.026}, Abs: 0.026, Rel: 0.026}} // after
		r.Rebalance = &Rebalance{Policy: "feplb", TokenBefore: Straggler{PerRank: []float64{2, 3}, Abs: 0.5, Rel: 0.2}, TokenAfter: Straggler{PerRank: []float64{2, 3}, Abs: 0.5, Rel: 0.2},
			GEMMBefore: Straggler{PerRank: []float64{1, 1.065}, Abs: 0.065, Rel: 0.065}, GEMMAfter: Straggler{PerRank: []float64{1, 1.026}, Abs: 0.026, Rel: 0.026},
			Moves: moves, ExposedNote: "not measured: host"}
		if warn != "" {
			r.Rebalance.Warnings = []string{warn}
		}
		return r
	}
	still := mk(3, 0, "feplb moved nothing in 20 timed steps: the run equals its base dispatcher's (x)")
	noop := mk(4, 0, "feplb moves nothing, every step is the base dispatcher's alone: 0 dynamic experts per rank")
	moved := mk(5, 2, "")
	for _, c := range []struct {
		rec  Record
		want bool
	}{{still, true}, {noop, true}, {moved, false}} {
		var b bytes.Buffer
		if err := Write(&b, &c.rec, "table"); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		if got := strings.Contains(out, "no move: unchanged"); got != c.want {
			t.Errorf("warnings %q: says no move %v, want %v:\n%s", c.rec.Rebalance.Warnings, got, c.want, out)
		}
		if shown := strings.Contains(out, "+6.5%) → +0.026 ms (+2.6%)"); shown == c.want {
			t.Errorf("warnings %q: GEMM straggler before → after shown: %v, want %v:\n%s", c.rec.Rebalance.Warnings, shown, !c.want, out)
		}
	}
	for _, f := range []string{"table", "markdown", "html"} {
		var b bytes.Buffer
		if err := WriteReport(&b, BuildReport([]Record{still, moved}), f, "t"); err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(b.String(), "no move: unchanged"); n != 2 { // token and GEMM straggler after, the run that did not move
			t.Errorf("%s: %d cells say \"no move: unchanged\", want 2:\n%s", f, n, b.String())
		}
	}
}
