package results

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// ReportFormats are the formats of moebench report.
var ReportFormats = []string{"table", "markdown", "csv", "html"}

// Row is one dispatcher × settings in a report group.
type Row struct {
	Rec     *Record
	Speedup float64 // alltoall's step p50 / this row's (the records' Step: StepIs says which); 0 when either is not ok
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
			if x.SMs != y.SMs {
				return x.SMs < y.SMs
			}
			return x.PrecisionName() < y.PrecisionName() // bf16 before fp8: side by side
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

// notes are the reasons of failed and unavailable rows, of runs stopped
// early, repeated runs, and rows read under a new name of their dispatcher.
func (g Group) notes() []string {
	var n []string
	for _, r := range g.Rows {
		c := r.Rec.Config
		if r.Rec.Status != StatusOK {
			n = append(n, fmt.Sprintf("%s/%s sms=%d %s", c.Dispatcher, c.Impl, c.SMs, StatusLine(r.Rec.Status, c.Dispatcher, c.Impl, r.Rec.Reason)))
		}
		if t := r.Rec.Timing; t != nil && t.Stopped != "" {
			n = append(n, fmt.Sprintf("%s/%s sms=%d: %s", c.Dispatcher, c.Impl, c.SMs, t.Stopped))
		}
		if r.Runs > 1 {
			n = append(n, fmt.Sprintf("%s/%s sms=%d: %d records, the last shown", c.Dispatcher, c.Impl, c.SMs, r.Runs))
		}
		if r.Rec.Mapped != "" {
			n = append(n, fmt.Sprintf("%s/%s sms=%d: %s", c.Dispatcher, c.Impl, c.SMs, r.Rec.Mapped))
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
		return writeCSV(w, groups)
	case "html":
		return reportHTML(w, groups, title)
	}
	return fmt.Errorf("unknown report format %q (allowed: %s)", format, strings.Join(ReportFormats, ", "))
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
	p.f("#\n# key:\n")
	for _, k := range reportKey(groups) {
		p.f("#   %s\n", k)
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
	p.f("\n## Key\n\n")
	for _, k := range reportKey(groups) {
		p.f("- %s\n", mdEscape(k))
	}
	return p.err
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
