package results

import (
	"encoding/csv"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// ReportFormats are the formats of moebench report.
var ReportFormats = []string{"table", "markdown", "csv", "html"}

// Row is one dispatcher × settings in a report group.
type Row struct {
	Rec     *Record
	Speedup float64 // alltoall step p50 / this step p50; 0 when either is not ok
	Runs    int     // records of this point; the last is shown
}

// Group is one workload on one stack.
type Group struct {
	Stack    Stack
	StackNo  int // 1-based, in order of first appearance
	Workload Config
	Rows     []Row
}

// BuildReport groups records by stack and workload, one row per dispatcher ×
// settings (the last record of a point), rows sorted by dispatcher, impl and
// SMs, with the speedup against the group's native alltoall row.
func BuildReport(recs []Record) []Group {
	var groups []Group
	gi := map[string]int{}
	stacks := map[string]int{}
	ri := map[string]map[string]int{}
	for i := range recs {
		r := &recs[i]
		sk := r.Stack.StackKey()
		if _, ok := stacks[sk]; !ok {
			stacks[sk] = len(stacks) + 1
		}
		gk := sk + "|" + r.Config.Workload()
		g, ok := gi[gk]
		if !ok {
			g = len(groups)
			gi[gk], ri[gk] = g, map[string]int{}
			groups = append(groups, Group{Stack: r.Stack, StackNo: stacks[sk], Workload: r.Config})
		}
		if j, ok := ri[gk][r.Config.Settings()]; ok {
			groups[g].Rows[j].Rec = r
			groups[g].Rows[j].Runs++
			continue
		}
		ri[gk][r.Config.Settings()] = len(groups[g].Rows)
		groups[g].Rows = append(groups[g].Rows, Row{Rec: r, Runs: 1})
	}
	for gix := range groups {
		rows := groups[gix].Rows
		sort.SliceStable(rows, func(a, b int) bool {
			x, y := rows[a].Rec.Config, rows[b].Rec.Config
			if x.Dispatcher != y.Dispatcher {
				return x.Dispatcher < y.Dispatcher
			}
			if x.Impl != y.Impl {
				return x.Impl > y.Impl // native first
			}
			return x.SMs < y.SMs
		})
		var ref *Record
		for _, row := range rows {
			c := row.Rec.Config
			if c.Dispatcher == "alltoall" && c.Impl == "native" && row.Rec.Status == StatusOK {
				ref = row.Rec
			}
		}
		for j := range rows {
			if ref != nil && rows[j].Rec.Status == StatusOK && rows[j].Rec.Timing.Step.P50 > 0 {
				rows[j].Speedup = ref.Timing.Step.P50 / rows[j].Rec.Timing.Step.P50
			}
		}
	}
	return groups
}

// column is one report column: its header (with unit) and its value for a
// row; ok-only columns print "—" for failed and unavailable rows.
type column struct {
	head   string
	okOnly bool
	val    func(Row) string
}

func f3(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }

// gbps is a bandwidth cell: "—" where the record has none (an older record,
// or no SM budget for the per-SM columns).
func gbps(v float64) string {
	if v == 0 {
		return "—"
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// passP50 is a pass's p50 (fwd or bwd), the step's for a forward-only
// record's forward.
func passP50(t *Timing, pass *Phase) float64 {
	if pass == nil {
		return t.Step.P50
	}
	return pass.P50
}

func phaseP50(r *Record, name string) float64 {
	for _, p := range r.Timing.Phases {
		if p.Name == name {
			return p.P50
		}
	}
	return 0
}

var columns = []column{
	{"dispatcher", false, func(r Row) string { return r.Rec.Config.Dispatcher }},
	{"impl", false, func(r Row) string { return r.Rec.Config.Impl }},
	{"sms", false, func(r Row) string {
		if r.Rec.Config.SMs == 0 {
			return "default"
		}
		return strconv.Itoa(r.Rec.Config.SMs)
	}},
	{"status", false, func(r Row) string { return r.Rec.Status }},
	{"step_p50_ms", true, func(r Row) string { return f3(r.Rec.Timing.Step.P50) }},
	{"step_stdev_ms", true, func(r Row) string { return f3(r.Rec.Timing.Step.Stdev) }},
	{"fwd_p50_ms", true, func(r Row) string { return f3(passP50(r.Rec.Timing, r.Rec.Timing.Forward)) }},
	{"bwd_p50_ms", true, func(r Row) string {
		if r.Rec.Timing.Backward == nil {
			return "—"
		}
		return f3(r.Rec.Timing.Backward.P50)
	}},
	{"dispatch_p50_ms", true, func(r Row) string { return f3(phaseP50(r.Rec, "dispatch")) }},
	{"combine_p50_ms", true, func(r Row) string { return f3(phaseP50(r.Rec, "combine")) }},
	{"dispatch_GBps", true, func(r Row) string { return gbps(r.Rec.Traffic.DispatchGBps) }},
	{"combine_GBps", true, func(r Row) string { return gbps(r.Rec.Traffic.CombineGBps) }},
	{"dispatch_GBps_per_SM", true, func(r Row) string { return gbps(r.Rec.Traffic.DispatchGBpsPerSM) }},
	{"combine_GBps_per_SM", true, func(r Row) string { return gbps(r.Rec.Traffic.CombineGBpsPerSM) }},
	{"speedup_vs_alltoall", true, func(r Row) string {
		if r.Speedup == 0 {
			return "—"
		}
		return fmt.Sprintf("%.2fx", r.Speedup)
	}},
	{"token_straggler_%", true, func(r Row) string { return fmt.Sprintf("%.1f", 100*r.Rec.Tokens.Straggler.Rel) }},
	{"gemm_straggler_%", true, func(r Row) string { return fmt.Sprintf("%.1f", 100*r.Rec.GEMM.Straggler.Rel) }},
	{"mem_max_MiB", true, func(r Row) string {
		if r.Rec.Memory == nil {
			return "—"
		}
		var hi int64
		for _, b := range r.Rec.Memory.PerRankBytes {
			hi = max(hi, b)
		}
		return fmt.Sprintf("%.1f", float64(hi)/(1<<20))
	}},
	{"sms_measured", true, func(r Row) string {
		if strings.HasPrefix(r.Rec.SMs.Measured, "not measured") {
			return "n/m"
		}
		return r.Rec.SMs.Measured
	}},
	{"max_rel_err", false, func(r Row) string {
		c := r.Rec.Correctness
		switch {
		case c == nil:
			return "—"
		case !c.Checked:
			return "unchecked"
		case !c.Passed:
			return fmt.Sprintf("FAIL %.1e", c.MaxRelErr)
		}
		return fmt.Sprintf("%.1e", c.MaxRelErr)
	}},
}

func (col column) cell(r Row) string {
	if col.okOnly && r.Rec.Status != StatusOK {
		return "—"
	}
	return col.val(r)
}

// Title is a one-line description of a group's workload.
func (g Group) Title() string {
	c := g.Workload
	s := fmt.Sprintf("%s · tokens/rank %d · hidden %d · ffn %d · experts %d top-%d %s", c.Preset, c.Tokens, c.Hidden, c.FFN, c.Experts, c.TopK, c.ScoreName())
	if c.Groups > 1 {
		s += fmt.Sprintf(" (groups %d/%d)", c.Groups, c.GroupTopK)
	}
	if c.SharedExperts > 0 {
		s += fmt.Sprintf(" · shared %d", c.SharedExperts)
	}
	return s + fmt.Sprintf(" · EP %d · routing %s · seed %d · device %s · %s · stack #%d", c.EP, c.Routing, c.Seed, c.Device, passLine(c), g.StackNo)
}

// notes are the reasons of failed and unavailable rows, and repeated runs.
func (g Group) notes() []string {
	var n []string
	for _, r := range g.Rows {
		c := r.Rec.Config
		if r.Rec.Status != StatusOK {
			n = append(n, fmt.Sprintf("%s/%s sms=%d %s: %s", c.Dispatcher, c.Impl, c.SMs, r.Rec.Status, r.Rec.Reason))
		}
		if r.Runs > 1 {
			n = append(n, fmt.Sprintf("%s/%s sms=%d: %d records, the last shown", c.Dispatcher, c.Impl, c.SMs, r.Runs))
		}
	}
	return n
}

// stacks lists the distinct stacks of the groups in order.
func stacks(groups []Group) []Group {
	var out []Group
	seen := map[int]bool{}
	for _, g := range groups {
		if !seen[g.StackNo] {
			seen[g.StackNo] = true
			out = append(out, g)
		}
	}
	return out
}

// WriteReport prints the groups in format (table, markdown, csv or html).
// title heads the markdown and html output.
func WriteReport(w io.Writer, groups []Group, format, title string) error {
	switch format {
	case "table":
		return reportTable(w, groups)
	case "markdown":
		return reportMarkdown(w, groups, title)
	case "csv":
		return reportCSV(w, groups)
	case "html":
		return reportHTML(w, groups, title)
	}
	return fmt.Errorf("unknown report format %q (allowed: %s)", format, strings.Join(ReportFormats, ", "))
}

// textColumns are the report's left-aligned columns (dispatcher, impl, sms, status).
const textColumns = 4

// cells is the group's table: the header, then one row per dispatcher × settings.
func (g Group) cells() [][]string {
	rows := [][]string{{}}
	for _, col := range columns {
		rows[0] = append(rows[0], col.head)
	}
	for _, r := range g.Rows {
		var row []string
		for _, col := range columns {
			row = append(row, col.cell(r))
		}
		rows = append(rows, row)
	}
	return rows
}

// rebalanceCells is the table of the group's rebalancing rows (FEPLB's
// phase 2): the token and the measured GEMM straggler before and after
// (after is the record's gemm.straggler), what moved and what it cost. Nil
// when no row rebalanced.
func (g Group) rebalanceCells() [][]string {
	rows := [][]string{{"rebalancing", "token_strag_before_%", "token_strag_after_%", "gemm_strag_before_%", "gemm_strag_after_%",
		"moves", "copy_MiB", "copy_ms_p50", "copies_exposed_ms_p50", "scheduler_ms_p50", "scheduler_exposed_ms_p50"}}
	pct := func(s Straggler) string {
		if len(s.PerRank) == 0 { // a record from before the measured "before"
			return "—"
		}
		return fmt.Sprintf("%.1f", 100*s.Rel)
	}
	for _, r := range g.Rows {
		rb := r.Rec.Rebalance
		if rb == nil || r.Rec.Status != StatusOK {
			continue
		}
		exposed := f3(rb.ExposedMS)
		switch {
		case rb.ExposedNote == "": // a record from before the exposed time
			exposed = "—"
		case !strings.HasPrefix(rb.ExposedNote, "median of"):
			exposed = "n/m"
		}
		rows = append(rows, []string{r.Rec.Config.Settings(), pct(rb.TokenBefore), pct(rb.TokenAfter), pct(rb.GEMMBefore), pct(r.Rec.GEMM.Straggler),
			strconv.Itoa(rb.Moves), fmt.Sprintf("%.2f", float64(rb.CopyBytes)/(1<<20)), f3(rb.CopyMS), exposed, f3(rb.SchedulerMS), f3(rb.SchedulerWaitMS)})
	}
	if len(rows) == 1 {
		return nil
	}
	return rows
}

func reportTable(w io.Writer, groups []Group) error {
	p := &printer{w: w}
	for _, g := range stacks(groups) {
		p.f("# stack #%d: %s\n", g.StackNo, g.Stack.Summary())
	}
	for _, g := range groups {
		p.f("#\n# %s\n", g.Title())
		if p.err == nil {
			p.err = WriteAligned(w, g.cells(), textColumns)
		}
		if rb := g.rebalanceCells(); rb != nil && p.err == nil {
			p.err = WriteAligned(w, rb, 1)
		}
		for _, n := range g.notes() {
			p.f("#   %s\n", n)
		}
	}
	return p.err
}

func reportMarkdown(w io.Writer, groups []Group, title string) error {
	p := &printer{w: w}
	p.f("# %s\n\n", title)
	for _, g := range stacks(groups) {
		p.f("- stack #%d: %s\n", g.StackNo, mdEscape(g.Stack.Summary()))
	}
	for _, g := range groups {
		p.f("\n## %s\n\n", mdEscape(g.Title()))
		if p.err == nil {
			p.err = WriteMarkdownTable(w, g.cells(), textColumns)
		}
		if rb := g.rebalanceCells(); rb != nil && p.err == nil {
			p.f("\nRebalancing (measured GEMM straggler: before = the same steps with phase 2 paused):\n\n")
			p.err = WriteMarkdownTable(w, rb, 1)
		}
		if n := g.notes(); len(n) > 0 {
			p.f("\n")
			for _, s := range n {
				p.f("- %s\n", mdEscape(s))
			}
		}
	}
	return p.err
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func reportCSV(w io.Writer, groups []Group) error {
	cw := csv.NewWriter(w)
	head := []string{"stack", "workload"}
	for _, col := range columns {
		head = append(head, col.head)
	}
	cw.Write(append(head, "reason"))
	for _, g := range groups {
		for _, r := range g.Rows {
			row := []string{strconv.Itoa(g.StackNo), g.Workload.Workload()}
			for _, col := range columns {
				row = append(row, col.cell(r))
			}
			cw.Write(append(row, r.Rec.Reason))
		}
	}
	cw.Flush()
	return cw.Error()
}
