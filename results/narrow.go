package results

import (
	"bytes"
	"fmt"
	"io"
	"strings"
)

// The default (terminal) tables fit TermWidth columns: a run's table and a
// report's keep their most-read columns first and leave out, from the
// right, those that do not fit (a line names them); their prose lines
// wrap. --wide (width 0 below) prints every column, as the Markdown,
// HTML, CSV and JSON outputs always do.

// narrowColumns are the report's columns in a default table, most-read
// first: what ran (dispatcher, impl, SM budget, precision where a row is
// not bf16) and whether it ran, the
// step (the time compare decides on) and its speedup, the two phases a
// dispatcher is about and their bandwidth, then correctness, memory and
// the rest. Text cells are cut to keep the table within the width.
var narrowColumns = []column{
	{head: "dispatcher", val: func(r Row) string { return Truncate(r.Rec.Config.Dispatcher, 16) }},
	{head: "impl", val: func(r Row) string { return Truncate(r.Rec.Config.Impl, 10) }},
	{head: "sms", val: func(r Row) string {
		if s := smsCell(r); strings.HasSuffix(s, " (default)") {
			return strings.TrimSuffix(s, " (default)") + "*"
		}
		return smsCell(r)
	}},
	columnNamed("precision"), // only in a group with a row not at bf16
	{head: "status", val: func(r Row) string { return Truncate(r.Rec.Status, 12) }},
	{head: "step_p50", okOnly: true, ms: func(r Row) (float64, bool) {
		if r.Rec.Timing == nil {
			return 0, false
		}
		return r.Rec.Timing.Step.P50, true
	}},
	{head: "speedup", okOnly: true, val: func(r Row) string {
		switch {
		case r.Rec.Config.Device == "host":
			return "host"
		case r.Speedup == 0:
			return noValue
		}
		return fmt.Sprintf("%.2fx", r.Speedup)
	}},
	{head: "dispatch_p50", okOnly: true, ms: phaseMS("dispatch")},
	{head: "combine_p50", okOnly: true, ms: phaseMS("combine")},
	{head: "dispatch_GBps", okOnly: true, val: func(r Row) string { return sig3(r.Rec.Traffic.DispatchGBps) }},
	{head: "combine_GBps", okOnly: true, val: func(r Row) string { return sig3(r.Rec.Traffic.CombineGBps) }},
	columnNamed("max_rel_err"),
	columnNamed("mem_max_MiB"),
	columnNamed("sm_util_%"),
	columnNamed("token_strag_%"),
	columnNamed("gemm_strag_%"),
}

// columnNamed is the wide table's column called head.
func columnNamed(head string) column {
	for _, c := range columns {
		if c.head == head {
			return c
		}
	}
	panic("results: no column " + head)
}

// narrowKey explains the default table's own headers (the key's other
// lines name the wide table's columns).
var narrowKey = []string{
	"step_p50: the record's step, p50 (rank_step on a GPU, lockstep on the host device: the step speedup and compare use; --wide shows both); " +
		"speedup: speedup_vs_alltoall; dispatch_GBps, combine_GBps: the algo GB/s (dispatch_algo_GBps, combine_algo_GBps); sms N*: the dispatcher's default budget (--sms left it)",
}

// narrowRebalanceHeads are the rebalancing table's shorter headers.
var narrowRebalanceHeads = map[string]string{
	"token_strag_before_%": "token_before_%", "token_strag_after_%": "token_after_%",
	"gemm_strag_before_%": "gemm_before_%", "gemm_strag_after_%": "gemm_after_%",
}

// WriteWidth is Write with the table fitted to width columns (see
// TermWidth); width 0 prints every column (--wide).
func WriteWidth(w io.Writer, rec *Record, format string, width int) error {
	if format != "table" || width <= 0 {
		return Write(w, rec, format)
	}
	fw, flush := FitWriter(w, width)
	if err := WriteTable(fw, rec); err != nil {
		return err
	}
	return flush()
}

// WriteReportWidth is WriteReport with the terminal table fitted to width
// columns; width 0 prints every column (--wide). The other formats keep
// every column.
func WriteReportWidth(w io.Writer, groups []Group, format, title string, width int) error {
	if format != "table" || width <= 0 {
		return WriteReport(w, groups, format, title)
	}
	fw, flush := FitWriter(w, width)
	if err := reportTableNarrow(fw, groups, width); err != nil {
		return err
	}
	return flush()
}

// reportTableNarrow is reportTable with the narrow columns.
func reportTableNarrow(w io.Writer, groups []Group, width int) error {
	p := &printer{w: w}
	for _, g := range stacks(groups) {
		p.f("# stack #%d: %s\n", g.StackNo, g.Stack.Summary())
	}
	for _, g := range groups {
		p.f("#\n# %s\n", g.Title())
		t, left := FitColumns(g.cellsOf(narrowColumns), width, textColumns)
		var b bytes.Buffer
		WriteAligned(&b, t, textColumns)
		p.f("%s%s", b.String(), LeftOut(left))
		if rb := g.rebalanceCells(); rb != nil {
			for j, h := range rb[0] {
				if s, ok := narrowRebalanceHeads[h]; ok {
					rb[0][j] = s
				}
			}
			for _, row := range rb[1:] {
				row[0] = Truncate(row[0], 40)
				for j, c := range row {
					if c == NoMoveUnchanged {
						row[j] = "no move"
					}
				}
			}
			t, left := FitColumns(rb, width, 1)
			b.Reset()
			WriteAligned(&b, t, 1)
			p.f("%s%s", b.String(), LeftOut(left))
		}
		for _, n := range g.notes() {
			p.f("#   %s\n", n)
		}
	}
	p.f("#\n# key:\n")
	for _, k := range append(append([]string(nil), narrowKey...), reportKey(groups)...) {
		p.f("#   %s\n", k)
	}
	return p.err
}
