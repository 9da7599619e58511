package results

import (
	"bytes"
	"encoding/csv"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// csvText are the CSV columns that hold text; every other one holds a
// number or nothing.
var csvText = []string{"stack_summary", "preset", "score", "routing", "device", "dispatcher", "impl", "precision", "fp8_gemm", "status", "reason", "timing_note", "stopped", "step_is", "pass",
	"sm_util_note", "checked", "check_passed", "rebalance_policy", "rebalance_copies_exposed_note"}

func readCSV(t *testing.T, s string) (head []string, rows []map[string]string) {
	t.Helper()
	all, err := csv.NewReader(strings.NewReader(s)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all[1:] {
		m := map[string]string{}
		for i, h := range all[0] {
			m[h] = r[i]
		}
		rows = append(rows, m)
	}
	return all[0], rows
}

// TestReportCSV: the CSV is for programs: every numeric column holds a
// plain number or nothing (no "1.00x", "—", "n/m" or "default"); failed and
// unavailable rows have a status and a reason and no numbers; the
// rebalancing table's values are in the rebalancing row; each phase of
// every row has its column; a single record's CSV has the same columns.
func TestReportCSV(t *testing.T) {
	recs := browserRecords()
	var b bytes.Buffer
	if err := WriteReport(&b, BuildReport(recs), "csv", ""); err != nil {
		t.Fatal(err)
	}
	head, rows := readCSV(t, b.String())
	if len(rows) != len(recs) {
		t.Fatalf("%d rows for %d records", len(rows), len(recs))
	}
	for _, ph := range []string{"layout", "notify", "rebalance", "dynamic", "unpermute"} {
		if !slices.Contains(head, ph+"_p50_ms") {
			t.Errorf("no column for phase %s: %v", ph, head)
		}
	}
	for _, r := range rows {
		for _, h := range head {
			v := r[h]
			if slices.Contains(csvText, h) || h == "stack" || v == "" {
				continue
			}
			if f, err := strconv.ParseFloat(v, 64); err != nil || math.IsNaN(f) {
				t.Errorf("%s/%s: %s = %q is not a number", r["dispatcher"], r["sms"], h, v)
			}
		}
		switch r["status"] {
		case StatusOK:
			if r["step_p50_ms"] == "" || r["rank_step_p50_ms"] == "" || r["lockstep_p50_ms"] == "" || r["dispatch_copy_GBps"] == "" || r["step_is"] != StepLockstep {
				t.Errorf("%s: an ok row without its times: %v", r["dispatcher"], r)
			}
		default:
			if r["reason"] == "" || r["step_p50_ms"] != "" || r["speedup_vs_alltoall"] != "" || r["dispatch_p50_ms"] != "" {
				t.Errorf("%s %s: no reason, or numbers: %v", r["dispatcher"], r["status"], r)
			}
		}
		rebalancing := r["dispatcher"] == "feplb"
		if (r["rebalance_moves"] != "") != rebalancing || (r["rebalance_token_straggler_before_rel"] == "0.5") != rebalancing {
			t.Errorf("%s: rebalancing columns %q %q", r["dispatcher"], r["rebalance_moves"], r["rebalance_token_straggler_before_rel"])
		}
		if rebalancing && (r["rebalance_copies_exposed_ms_p50"] != "" || !strings.HasPrefix(r["rebalance_copies_exposed_note"], "not measured")) {
			t.Errorf("an exposed time not measured is a number, or lacks its note: %v", r)
		}
		if r["dispatcher"] == "alltoall" && r["speedup_vs_alltoall"] != "" { // host records: no ratio (TestReportHostRatiosNotNumbers)
			t.Errorf("alltoall's speedup on the host %q, want none", r["speedup_vs_alltoall"])
		}
	}
	var one bytes.Buffer
	if err := Write(&one, &recs[0], "csv"); err != nil {
		t.Fatal(err)
	}
	h1, r1 := readCSV(t, one.String())
	if len(r1) != 1 || r1[0]["speedup_vs_alltoall"] != "" || r1[0]["step_p50_ms"] == "" || !slices.Contains(h1, "rebalance_moves") {
		t.Errorf("one record's CSV: %v %v", h1, r1)
	}
}

// TestReportPrecision: records of one workload at bf16 and fp8 are rows
// side by side (bf16 first) with a precision column and its key; a group
// of bf16 rows alone has no such column; the CSV always has it. The fp8
// row's fp8_gemm column names the expert GEMM path it ran (gemm.fp8_path).
func TestReportPrecision(t *testing.T) {
	bf, fp := okRecord("alltoall", []float64{2, 2, 2}), okRecord("alltoall", []float64{1, 1, 1})
	fp.Config.Precision = "fp8"
	fp.GEMM = &GEMM{FP8Path: "cublaslt-fp8-block"}
	var b bytes.Buffer
	if err := WriteReport(&b, BuildReport([]Record{fp, bf}), "table", ""); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !regexp.MustCompile(`precision +fp8_gemm[^\n]*\n[^\n]*alltoall[^\n]* bf16 +— [^\n]*\n[^\n]*alltoall[^\n]* fp8 +cublaslt-fp8-block `).MatchString(out) ||
		!strings.Contains(out, "precision: --precision; fp8 dispatches e4m3 rows") || !strings.Contains(out, "fp8_gemm: the expert GEMM path that ran") {
		t.Errorf("bf16 and fp8 rows:\n%s", out)
	}
	b.Reset()
	WriteReport(&b, BuildReport([]Record{bf}), "table", "")
	if strings.Contains(b.String(), "precision") {
		t.Errorf("a bf16 group shows a precision column:\n%s", b.String())
	}
	// the default (terminal) table too: bf16 and fp8 rows told apart
	b.Reset()
	if err := WriteReportWidth(&b, BuildReport([]Record{fp, bf}), "table", "", 120); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !regexp.MustCompile(`dispatcher +impl +sms +precision +status[^\n]*\n[^\n]*alltoall +native +[^ ]+ +bf16 +ok[^\n]*\n[^\n]*alltoall +native +[^ ]+ +fp8 +ok `).MatchString(out) {
		t.Errorf("the 120-column table does not tell bf16 from fp8:\n%s", out)
	}
	b.Reset()
	WriteReportWidth(&b, BuildReport([]Record{bf}), "table", "", 120)
	if strings.Contains(b.String(), "precision") {
		t.Errorf("a bf16 group's 120-column table shows a precision column:\n%s", b.String())
	}
	b.Reset()
	WriteReport(&b, BuildReport([]Record{bf}), "csv", "")
	if head, rows := readCSV(t, b.String()); !slices.Contains(head, "precision") || rows[0]["precision"] != "bf16" {
		t.Errorf("csv: %v %v", head, rows)
	}
}

// TestReportTimeUnits: a time column whose values would print as 0.0xx ms
// is in µs, with the unit in its header; larger ones stay in ms.
func TestReportTimeUnits(t *testing.T) {
	recs := browserRecords()[:1]
	g := BuildReport(recs)[0]
	c := g.cells()
	col := func(head string) string {
		for i, h := range c[0] {
			if h == head {
				return c[1][i]
			}
		}
		t.Fatalf("no column %s in %v", head, c[0])
		return ""
	}
	p := phaseOf(&recs[0], "dispatch").P50
	if got, want := col("dispatch_p50_us"), strconv.FormatFloat(1e3*p, 'f', 1, 64); got != want {
		t.Errorf("dispatch %q, want %q µs", got, want)
	}
	if got, want := col("lockstep_p50_ms"), f3(recs[0].Timing.Lockstep.P50); got != want {
		t.Errorf("lockstep %q, want %q ms", got, want)
	}
	var b bytes.Buffer
	if err := Write(&b, &recs[0], "table"); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "p50_us") || regexp.MustCompile(`(?m)^  .*\b0\.0\d\d\b`).MatchString(out) {
		t.Errorf("a record with 0.0xx ms phases is not printed in µs:\n%s", out)
	}
}

// TestReportSteps: the slowest rank's step and the lockstep bound are both
// shown, the key says which one the speedup uses on each device (and why
// an "n/m" was not measured), and host groups carry the caveat that their
// times are not performance (the speedup's header marked); GPU groups do
// not.
func TestReportSteps(t *testing.T) {
	host := browserRecords()[:2] // alltoall, deepep 8
	gpu := onCUDA(browserRecords()[:2]...)
	for i := range gpu {
		gpu[i].Config.Seed = 9
		tm := *gpu[i].Timing
		tm.Step, tm.StepIs = *tm.SlowestRank, StepSlowestRank
		gpu[i].Timing = &tm
	}
	groups := BuildReport(append(host, gpu...))
	if len(groups) != 2 {
		t.Fatalf("%d groups", len(groups))
	}
	want := host[1].Timing.Lockstep.P50 / host[0].Timing.Lockstep.P50
	if got := groups[0].Rows[1].Speedup; math.Abs(got-1/want) > 1e-12 {
		t.Errorf("host speedup %v, want lockstep ratio %v", got, 1/want)
	}
	if got, want := groups[1].Rows[1].Speedup, gpu[0].Timing.SlowestRank.P50/gpu[1].Timing.SlowestRank.P50; math.Abs(got-want) > 1e-12 {
		t.Errorf("GPU speedup %v, want the slowest ranks' ratio %v", got, want)
	}
	for _, f := range []string{"table", "markdown", "html"} {
		t.Run(f, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			if err := WriteReport(&b, groups, f, "t"); err != nil {
				t.Fatal(err)
			}
			out := strings.ReplaceAll(b.String(), "<wbr>", "")
			for _, w := range []string{"rank_step_p50_ms", "lockstep_p50_ms", "the step being lockstep on the host device", "rank_step on a GPU",
				"speedup_vs_alltoall" + hostMark, "not a performance measurement", f3(host[0].Timing.SlowestRank.P50), f3(host[0].Timing.Lockstep.P50),
				"n/m in sm_util_%: not measured on the host device"} {
				if !strings.Contains(out, w) {
					t.Errorf("%s lacks %q", f, w)
				}
			}
			if n := strings.Count(out, "speedup_vs_alltoall"+hostMark); n != 1 && f != "html" {
				t.Errorf("%s: %d speedup headers marked as host, want the host group's only", f, n)
			}
			if f == "html" && strings.Count(out, `class="caveat"`) != 1 {
				t.Errorf("html: the host caveat heads %d groups, want 1", strings.Count(out, `class="caveat"`))
			}
		})
	}
	// a run's table: both steps, and which one is the record's
	var b bytes.Buffer
	if err := Write(&b, &host[0], "table"); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"\n  rank_step ", "\n  lockstep ", "the record's step, which compare uses, is lockstep", "not a performance measurement"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("run table lacks %q:\n%s", w, b.String())
		}
	}
}

// TestReportBandwidth: every dispatcher's row has dispatch and combine GB/s
// in moebench's per-copy convention (for an older record without them,
// from its configuration), next to the design's own where it states one.
func TestReportBandwidth(t *testing.T) {
	recs := browserRecords()[:2]
	old := recs[0]
	old.Traffic = &Traffic{} // before the bandwidth fields
	old.Config.Seed++
	recs = append(recs, old)
	g := BuildReport(recs)
	copyGB := GBps(8*128*4*128*2, 8, phaseP50(&recs[0], "dispatch"))
	for _, gr := range g {
		c := gr.cells()
		idx := slices.Index(c[0], "dispatch_copy_GBps")
		algo := slices.Index(c[0], "dispatch_algo_GBps")
		if idx < 0 || algo < 0 || slices.Index(c[0], "combine_copy_GBps") < 0 {
			t.Fatalf("no bandwidth columns: %v", c[0])
		}
		for i, r := range gr.Rows {
			if c[i+1][idx] == noValue {
				t.Errorf("%s: no copy GB/s", r.Rec.Config.Settings())
			}
			if r.Rec.Config.Dispatcher == "alltoall" && c[i+1][idx] != sig3(copyGB) {
				t.Errorf("alltoall copy GB/s %s, want %s", c[i+1][idx], sig3(copyGB))
			}
			if (r.Rec.Traffic.DispatchGBps == 0) != (c[i+1][algo] == noValue) {
				t.Errorf("%s: algo GB/s %s for %v", r.Rec.Config.Settings(), c[i+1][algo], r.Rec.Traffic.DispatchGBps)
			}
		}
	}
}

// TestReportInterNode: the inter-node columns and their key appear for a
// group where some run moved bytes between nodes, and only there.
func TestReportInterNode(t *testing.T) {
	recs := browserRecords()[:1]
	heads := func() string {
		g := BuildReport(recs)
		return strings.Join(g[0].cells()[0], " ") + strings.Join(reportKey(g), " ")
	}
	if h := heads(); strings.Contains(h, "inter_node") {
		t.Errorf("one node: %s", h)
	}
	tr := *recs[0].Traffic
	tr.InterNodeBytes, tr.CombineInterNodeGBps = 3<<20, 2.5
	recs[0].Traffic = &tr
	if h := heads(); !strings.Contains(h, "inter_node_MiB") || !strings.Contains(h, "combine_inter_node_GBps") || !strings.Contains(h, NodeFormula) {
		t.Errorf("two nodes: %s", h)
	}
	if c := BuildReport(recs)[0].cells(); !strings.Contains(strings.Join(c[1], " "), " 3.00 ") {
		t.Errorf("row %v", c[1])
	}
}
