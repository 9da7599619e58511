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

// writeStraggler prints the simulation's results, policies ranked by their
// effective straggler, with the ratios against FEPLB and the warnings.
func writeStraggler(w io.Writer, format string, res []balance.SimResult, title string) {
	by := map[string]*balance.SimResult{}
	for i := range res {
		by[res[i].Policy] = &res[i]
	}
	none := by["none"]
	var notes []string
	for _, fe := range []string{"feplb", "feplb-split"} {
		f, x := by["fastermoe"], by[fe]
		if f == nil || x == nil || x.Token.Abs <= 0 || x.Effective.Abs <= 0 {
			continue
		}
		notes = append(notes, fmt.Sprintf("fastermoe ÷ %s: token straggler %.2f, effective straggler %.2f (above 1: %s's is lower)",
			fe, f.Token.Abs/x.Token.Abs, f.Effective.Abs/x.Effective.Abs, fe))
	}
	for _, r := range res {
		for _, warn := range r.Warnings {
			notes = append(notes, "warning: "+warn)
		}
	}
	red := func(v, base float64) string {
		if none == nil || base == 0 {
			return "—"
		}
		return fmt.Sprintf("%.0f%%", 100*(1-v/base))
	}
	pct := func(v float64) string {
		if math.IsNaN(v) {
			return "—"
		}
		return fmt.Sprintf("%.1f", 100*v)
	}
	us := func(v float64) string {
		if s := fmt.Sprintf("%.0f", 1e6*v); s != "-0" {
			return s
		}
		return "0"
	}
	head := []string{"policy", "eff_straggler_us", "eff_straggler_%", "eff_reduction", "token_straggler", "token_straggler_%", "token_reduction",
		"gemm_straggler_us", "gemm_straggler_%", "exposed_us", "moved/step", "ce_MB/step", "nvlink_MB/step", "network_MB/step",
		"ce_time_us", "back_us", "back_exposed_us", "ep_overhead_%"}
	backward := len(res) > 0 && res[0].Backward != nil
	if backward {
		head = append(head, "bwd_eff_straggler_us", "bwd_MB/step", "bwd_ce_time_us", "bwd_exposed_us")
	}
	head = append(head, "sched_us")
	order := make([]int, len(res))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch ea, eb := res[a].Effective.Abs, res[b].Effective.Abs; {
		case ea < eb:
			return -1
		case ea > eb:
			return 1
		}
		return 0
	})
	var rows [][]string
	for _, i := range order {
		r := res[i]
		row := []string{r.Policy, us(r.Effective.Abs), fmt.Sprintf("%.1f", 100*r.Effective.Rel), "—",
			fmt.Sprintf("%.0f", r.Token.Abs), fmt.Sprintf("%.1f", 100*r.Token.Rel), "—",
			fmt.Sprintf("%.1f", 1e6*r.GEMM.Abs), fmt.Sprintf("%.1f", 100*r.GEMM.Rel), us(r.Exposed), fmt.Sprintf("%.1f", r.Moved),
			fmt.Sprintf("%.1f", r.BytesPerStep[balance.LinkCE]/1e6), fmt.Sprintf("%.1f", r.BytesPerStep[balance.LinkNVLink]/1e6),
			fmt.Sprintf("%.1f", r.BytesPerStep[balance.LinkNetwork]/1e6), us(r.CETimeMax), us(r.BackTimeMax), us(r.BackExposed), pct(r.EPOverhead)}
		if none != nil {
			row[3], row[6] = red(r.Effective.Abs, none.Effective.Abs), red(r.Token.Abs, none.Token.Abs)
		}
		if b := r.Backward; b != nil {
			row = append(row, us(b.Effective.Abs), fmt.Sprintf("%.1f", b.Bytes/1e6), us(b.CETimeMax), us(b.Exposed))
		}
		rows = append(rows, append(row, fmt.Sprintf("%.0f", r.SchedulerMicro)))
	}
	table := append([][]string{head}, rows...)
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
	fmt.Fprintf(w, "# %s\n# means over steps, ranked by effective straggler; token straggler in copies, times modelled; reductions vs none\n", title)
	results.WriteAligned(w, table, 1)
	for _, n := range notes {
		fmt.Fprintf(w, "# %s\n", n)
	}
}
