package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/moebench/moebench/balance"
	"github.com/moebench/moebench/results"
)

// tieWithNone is the tie rule: a policy whose mean straggler is within
// this share of none's (above or below) is "= none" — it moved nothing that
// mattered, and the difference is floating-point or re-placement noise —
// and it is ranked with none, in the order the policies were given, not by
// the noise.
const tieWithNone = 0.005

// tied says whether v is within tieWithNone of none's base.
func tied(v, base float64) bool { return math.Abs(v-base) <= tieWithNone*math.Abs(base) }

// writeStraggler prints the simulation's results (one run per seed; means
// over seeds, with [min, max] over seeds when there are several), policies
// ranked by their effective straggler, with the ratios against FEPLB and
// the warnings; the table has every column.
func writeStraggler(w io.Writer, format string, runs [][]balance.SimResult, title string) {
	writeStragglerWidth(w, format, 0, runs, title)
}

// narrowStraggler are the terminal table's columns, most-read first: the
// policy, its effective straggler (what a step waits for) and reduction,
// the token straggler's, the GEMM straggler, then what the policy costs
// (exposed time, moves, the EP overhead) and the rest in the wide table's
// order.
var narrowStraggler = []string{"policy", "eff_straggler_us", "eff_straggler_%", "eff_reduction", "token_straggler_%", "token_reduction",
	"gemm_straggler_us", "exposed_us", "moved/step", "ep_overhead_%"}

// writeStragglerWidth is writeStraggler with the terminal table fitted to
// width columns (0: every column).
func writeStragglerWidth(w io.Writer, format string, width int, runs [][]balance.SimResult, title string) {
	s := newStragglerTable(runs)
	table := append([][]string{s.head()}, s.rows()...)
	notes := s.notes()
	if format == "markdown" { // for committing: deterministic, so no wall-clock column
		for i := range table {
			table[i] = table[i][:len(table[i])-1]
		}
		fmt.Fprintf(w, "%s\n\n", title)
		results.WriteMarkdownTable(w, table, 1)
		if len(notes) > 0 {
			fmt.Fprintf(w, "\n- %s\n", strings.Join(notes, "\n- "))
		}
		return
	}
	var left []string
	if width > 0 {
		fw, flush := results.FitWriter(w, width)
		defer flush()
		w = fw
		table, left = results.FitColumns(reorder(table, narrowStraggler), width, 1)
	}
	fmt.Fprintf(w, "# %s\n# means over steps, ranked by effective straggler; token straggler in copies, times modelled; reductions vs none\n", title)
	results.WriteAligned(w, table, 1)
	fmt.Fprint(w, results.LeftOut(left))
	for _, n := range notes {
		fmt.Fprintf(w, "# %s\n", n)
	}
}

// stragglerTable is the straggler output's data: the runs (one per seed),
// their means, and the means by policy name and index.
type stragglerTable struct {
	runs  [][]balance.SimResult
	res   []balance.SimResult
	seeds int
	by    map[string]*balance.SimResult
	index map[string]int
	none  *balance.SimResult
}

func newStragglerTable(runs [][]balance.SimResult) *stragglerTable {
	s := &stragglerTable{runs: runs, res: meanResults(runs), seeds: len(runs),
		by: map[string]*balance.SimResult{}, index: map[string]int{}}
	for i := range s.res {
		s.by[s.res[i].Policy] = &s.res[i]
		s.index[s.res[i].Policy] = i
	}
	s.none = s.by["none"]
	return s
}

// span is [min, max] over seeds of f's value for the policy at index i.
func (s *stragglerTable) span(i int, f func(r *balance.SimResult) float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, run := range s.runs {
		v := f(&run[i])
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

// notes are the ratios of FasterMoE against FEPLB, the policies worse
// than or tied with none, and the warnings.
func (s *stragglerTable) notes() []string {
	var notes []string
	for _, fe := range []string{"feplb", "feplb-split"} {
		f, x := s.by["fastermoe"], s.by[fe]
		if f == nil || x == nil || x.Token.Abs <= 0 || x.Effective.Abs <= 0 {
			continue
		}
		n := fmt.Sprintf("fastermoe ÷ %s: token straggler %.2f, effective straggler %.2f (above 1: %s's is lower)",
			fe, f.Token.Abs/x.Token.Abs, f.Effective.Abs/x.Effective.Abs, fe)
		if s.seeds > 1 {
			fi, xi := s.index["fastermoe"], s.index[fe]
			lo, hi := math.Inf(1), math.Inf(-1)
			for _, run := range s.runs {
				v := run[fi].Token.Abs / run[xi].Token.Abs
				lo, hi = min(lo, v), max(hi, v)
			}
			n = fmt.Sprintf("fastermoe ÷ %s: token straggler %.2f (ratio of the means; per seed [%.2f, %.2f]), effective straggler %.2f (above 1: %s's is lower)",
				fe, f.Token.Abs/x.Token.Abs, lo, hi, f.Effective.Abs/x.Effective.Abs, fe)
		}
		notes = append(notes, n)
	}
	notes = append(notes, s.noneNotes()...)
	for _, r := range s.res {
		for _, warn := range r.Warnings {
			notes = append(notes, "warning: "+warn)
		}
	}
	return notes
}

// noneNotes name the policies worse than none and those tied with it.
func (s *stragglerTable) noneNotes() []string {
	none := s.none
	if none == nil {
		return nil
	}
	var notes, eq, worse []string
	for _, r := range s.res {
		if r.Policy != "none" && tied(r.Effective.Abs, none.Effective.Abs) {
			eq = append(eq, r.Policy)
		}
	}
	for _, r := range s.res {
		if v := r.Effective.Abs; r.Policy != "none" && !tied(v, none.Effective.Abs) && v > none.Effective.Abs {
			worse = append(worse, fmt.Sprintf("%s (+%.0f%%)", r.Policy, 100*(v/none.Effective.Abs-1)))
		}
	}
	if len(worse) > 0 {
		notes = append(notes, "worse than none (effective straggler): "+strings.Join(worse, ", ")+
			"; fastermoe decides by fastmoe's own latency model, eplb and feplb+place from the load history, not by this step's timeline")
	}
	if len(eq) > 0 {
		notes = append(notes, fmt.Sprintf("= none: %s within %.1f%% of none's effective straggler (tie rule: ranked with none, not by the difference)",
			strings.Join(eq, ", "), 100*tieWithNone))
	}
	return notes
}

// head is the table's header: the backward columns when the backward pass
// was modelled, the ranges over seeds when there are several.
func (s *stragglerTable) head() []string {
	head := []string{"policy", "eff_straggler_us", "eff_straggler_%", "eff_reduction", "token_straggler", "token_straggler_%", "token_reduction",
		"gemm_straggler_us", "gemm_straggler_%", "exposed_us", "moved/step", "ce_MB/step", "nvlink_MB/step", "network_MB/step",
		"ce_time_us", "back_us", "back_exposed_us", "ep_overhead_%"}
	if len(s.res) > 0 && s.res[0].Backward != nil {
		head = append(head, "bwd_eff_straggler_us", "bwd_MB/step", "bwd_ce_time_us", "bwd_exposed_us")
	}
	if s.seeds > 1 {
		head = append(head, "eff_straggler_us_range", "token_straggler_range")
	}
	return append(head, "sched_us")
}

// order ranks the policies by effective straggler; ties with none rank
// with none, in the order given.
func (s *stragglerTable) order() []int {
	order := make([]int, len(s.res))
	for i := range order {
		order[i] = i
	}
	key := func(i int) float64 {
		if v := s.res[i].Effective.Abs; s.none == nil || !tied(v, s.none.Effective.Abs) {
			return v
		}
		return s.none.Effective.Abs
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch ea, eb := key(a), key(b); {
		case ea < eb:
			return -1
		case ea > eb:
			return 1
		}
		return 0
	})
	return order
}

// stragglerUS prints seconds as whole µs, never "-0".
func stragglerUS(v float64) string {
	if s := fmt.Sprintf("%.0f", 1e6*v); s != "-0" {
		return s
	}
	return "0"
}

// reduction is v's reduction against none's base: "—" without none,
// "= none" within the tie.
func (s *stragglerTable) reduction(v, base float64) string {
	switch {
	case s.none == nil || base == 0:
		return "—"
	case tied(v, base):
		return "= none"
	}
	return fmt.Sprintf("%.0f%%", 100*(1-v/base))
}

// rows are the table's rows, in order().
func (s *stragglerTable) rows() [][]string {
	us := stragglerUS
	pct := func(v float64) string {
		if math.IsNaN(v) {
			return "—"
		}
		return fmt.Sprintf("%.1f", 100*v)
	}
	none := s.none
	var rows [][]string
	for _, i := range s.order() {
		r := s.res[i]
		row := []string{r.Policy, us(r.Effective.Abs), fmt.Sprintf("%.1f", 100*r.Effective.Rel), "—",
			fmt.Sprintf("%.0f", r.Token.Abs), fmt.Sprintf("%.1f", 100*r.Token.Rel), "—",
			fmt.Sprintf("%.1f", 1e6*r.GEMM.Abs), fmt.Sprintf("%.1f", 100*r.GEMM.Rel), us(r.Exposed), fmt.Sprintf("%.1f", r.Moved),
			fmt.Sprintf("%.1f", r.BytesPerStep[balance.LinkCE]/1e6), fmt.Sprintf("%.1f", r.BytesPerStep[balance.LinkNVLink]/1e6),
			fmt.Sprintf("%.1f", r.BytesPerStep[balance.LinkNetwork]/1e6), us(r.CETimeMax), us(r.BackTimeMax), us(r.BackExposed), pct(r.EPOverhead)}
		if none != nil && r.Policy != "none" {
			row[3], row[6] = s.reduction(r.Effective.Abs, none.Effective.Abs), s.reduction(r.Token.Abs, none.Token.Abs)
		} else if none != nil {
			row[3], row[6] = "0%", "0%"
		}
		if b := r.Backward; b != nil {
			row = append(row, us(b.Effective.Abs), fmt.Sprintf("%.1f", b.Bytes/1e6), us(b.CETimeMax), us(b.Exposed))
		}
		if s.seeds > 1 {
			elo, ehi := s.span(i, func(r *balance.SimResult) float64 { return r.Effective.Abs })
			tlo, thi := s.span(i, func(r *balance.SimResult) float64 { return r.Token.Abs })
			row = append(row, fmt.Sprintf("[%s, %s]", us(elo), us(ehi)), fmt.Sprintf("[%.0f, %.0f]", tlo, thi))
		}
		rows = append(rows, append(row, fmt.Sprintf("%.0f", r.SchedulerMicro)))
	}
	return rows
}

// reorder puts the columns of table headed first, in that order, before
// the others (in theirs).
func reorder(table [][]string, first []string) [][]string {
	var order []int
	for _, h := range first {
		if j := slices.Index(table[0], h); j >= 0 {
			order = append(order, j)
		}
	}
	for j := range table[0] {
		if !slices.Contains(order, j) {
			order = append(order, j)
		}
	}
	out := make([][]string, len(table))
	for i, row := range table {
		for _, j := range order {
			out[i] = append(out[i], row[j])
		}
	}
	return out
}

// meanResults is each policy's results averaged over runs (one per seed,
// the same policies in the same order); warnings are kept once each.
func meanResults(runs [][]balance.SimResult) []balance.SimResult {
	if len(runs) == 1 {
		return runs[0]
	}
	n := float64(len(runs))
	out := make([]balance.SimResult, len(runs[0]))
	for i := range out {
		m := &out[i]
		*m = balance.SimResult{Policy: runs[0][i].Policy, Steps: runs[0][i].Steps, BytesPerStep: map[string]float64{}}
		if runs[0][i].Backward != nil {
			m.Backward = &balance.BackwardResult{}
		}
		stat := func(dst *balance.Stat, src balance.Stat) { dst.Abs += src.Abs / n; dst.Rel += src.Rel / n }
		for _, run := range runs {
			r := &run[i]
			stat(&m.Token, r.Token)
			stat(&m.GEMM, r.GEMM)
			stat(&m.Effective, r.Effective)
			for _, f := range []struct{ dst, src *float64 }{{&m.Exposed, &r.Exposed}, {&m.CETimeMax, &r.CETimeMax},
				{&m.BackTimeMax, &r.BackTimeMax}, {&m.BackExposed, &r.BackExposed}, {&m.LinkLoad, &r.LinkLoad},
				{&m.EPOverhead, &r.EPOverhead}, {&m.Moved, &r.Moved}, {&m.SchedulerMicro, &r.SchedulerMicro}, {&m.ReadyMicro, &r.ReadyMicro}} {
				*f.dst += *f.src / n
			}
			for k, v := range r.BytesPerStep {
				m.BytesPerStep[k] += v / n
			}
			if b := r.Backward; b != nil && m.Backward != nil {
				mb := m.Backward
				stat(&mb.GEMM, b.GEMM)
				stat(&mb.Effective, b.Effective)
				mb.Bytes += b.Bytes / n
				mb.CETimeMax += b.CETimeMax / n
				mb.Exposed += b.Exposed / n
			}
			for _, w := range r.Warnings {
				if !slices.Contains(m.Warnings, w) {
					m.Warnings = append(m.Warnings, w)
				}
			}
		}
	}
	return out
}
