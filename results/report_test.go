package results

import (
	"bytes"
	"encoding/csv"
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
	for _, want := range []string{"# stack #1: host", "speedup_vs_alltoall" + hostMark, "2.00x", "unavailable", "needs <the> cuda device", "# key:"} {
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
