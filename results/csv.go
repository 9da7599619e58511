package results

import (
	"encoding/csv"
	"io"
	"math"
	"slices"
	"strconv"
)

// The CSV of records, for programs: one row per point (a report's rows, or
// one record), the rebalancing table's values in the same row (empty where
// a point did not rebalance). Numeric columns hold plain numbers (times in
// ms, bandwidths in GB/s, bytes, ratios rather than percentages), empty
// where there is no value; status and reason say why a row has no timings,
// and the note columns why a value was not measured.

// csvField is one CSV column: its header and its cell for a row.
type csvField struct {
	head string
	cell func(g *Group, r Row) string
}

// num prints v with 7 significant digits (more than any timing here
// resolves), without an exponent unless v is tiny or huge.
func num(v float64) string { return strconv.FormatFloat(v, 'g', 7, 64) }

// nonZero is v, or empty for 0 (no value).
func nonZero(v float64) string {
	if v == 0 {
		return ""
	}
	return num(v)
}

func integer(v int64) string { return strconv.FormatInt(v, 10) }

// ok wraps a cell of a timed row: empty for failed and unavailable rows.
func ok(f func(r *Record) string) func(*Group, Row) string {
	return func(_ *Group, r Row) string {
		if r.Rec.Status != StatusOK {
			return ""
		}
		return f(r.Rec)
	}
}

func stepCell(pick func(*Record) *Phase, stat func(*Phase) float64) func(*Group, Row) string {
	return ok(func(r *Record) string {
		p := pick(r)
		if p == nil {
			return ""
		}
		return num(stat(p))
	})
}

// percentile is the nearest-rank percentile q (0–100) of x (unsorted);
// false for no samples.
func percentile(x []float64, q float64) (float64, bool) {
	if len(x) == 0 {
		return 0, false
	}
	s := slices.Sorted(slices.Values(x))
	i := int(math.Ceil(q/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)], true
}

func sampleCell(q float64) func(*Group, Row) string {
	return ok(func(r *Record) string {
		if v, ok := percentile(r.Timing.Step.Samples, q); ok {
			return num(v)
		}
		return ""
	})
}

// traffic is a cell of r.Traffic's v: empty where there is none or it is 0.
func traffic(v func(t *Traffic) float64) func(*Group, Row) string {
	return ok(func(r *Record) string {
		if r.Traffic == nil {
			return ""
		}
		return nonZero(v(r.Traffic))
	})
}

// trafficBytes is a cell of r.Traffic's byte count v: empty where there is
// none or it is 0.
func trafficBytes(v func(t *Traffic) int64) func(*Group, Row) string {
	return ok(func(r *Record) string {
		if r.Traffic == nil || v(r.Traffic) == 0 {
			return ""
		}
		return integer(v(r.Traffic))
	})
}

func rebalanceCell(f func(rb *Rebalance, r *Record) string) func(*Group, Row) string {
	return ok(func(r *Record) string {
		if r.Rebalance == nil {
			return ""
		}
		return f(r.Rebalance, r)
	})
}

func stragglerRel(s Straggler) string {
	if len(s.PerRank) == 0 {
		return ""
	}
	return num(s.Rel)
}

var csvHead = []csvField{
	{"stack", func(g *Group, _ Row) string { return strconv.Itoa(g.StackNo) }},
	{"stack_summary", func(g *Group, _ Row) string { return g.Stack.Summary() }},
	{"preset", func(_ *Group, r Row) string { return r.Rec.Config.Preset }},
	{"tokens", func(_ *Group, r Row) string { return strconv.Itoa(r.Rec.Config.Tokens) }},
	{"hidden", func(_ *Group, r Row) string { return strconv.Itoa(r.Rec.Config.Hidden) }},
	{"ffn", func(_ *Group, r Row) string { return strconv.Itoa(r.Rec.Config.FFN) }},
	{"experts", func(_ *Group, r Row) string { return strconv.Itoa(r.Rec.Config.Experts) }},
	{"topk", func(_ *Group, r Row) string { return strconv.Itoa(r.Rec.Config.TopK) }},
	{"shared_experts", func(_ *Group, r Row) string { return strconv.Itoa(r.Rec.Config.SharedExperts) }},
	{"score", func(_ *Group, r Row) string { return r.Rec.Config.ScoreName() }},
	{"ep", func(_ *Group, r Row) string { return strconv.Itoa(r.Rec.Config.EP) }},
	{"routing", func(_ *Group, r Row) string { return r.Rec.Config.Routing }},
	{"seed", func(_ *Group, r Row) string { return strconv.FormatUint(r.Rec.Config.Seed, 10) }},
	{"device", func(_ *Group, r Row) string { return r.Rec.Config.Device }},
	{"dispatcher", func(_ *Group, r Row) string { return r.Rec.Config.Dispatcher }},
	{"impl", func(_ *Group, r Row) string { return r.Rec.Config.Impl }},
	{"precision", func(_ *Group, r Row) string { return r.Rec.Config.PrecisionName() }},
	{"sms", func(_ *Group, r Row) string { return strconv.Itoa(r.Rec.Config.SMs) }}, // as given; 0 = the dispatcher's default
	{"sm_budget", func(_ *Group, r Row) string { return nonZero(float64(smBudget(r.Rec))) }},
	{"status", func(_ *Group, r Row) string { return r.Rec.Status }},
	{"reason", func(_ *Group, r Row) string { return r.Rec.Reason }},
	{"records", func(_ *Group, r Row) string { return strconv.Itoa(r.Runs) }},
	{"stopped", func(_ *Group, r Row) string {
		if t := r.Rec.Timing; t != nil {
			return t.Stopped
		}
		return ""
	}},
	{"timing_note", func(_ *Group, r Row) string {
		if r.Rec.Config.Device == "host" {
			return "host device: wall clock of Go code, ranks one after another; not a performance measurement"
		}
		return ""
	}},
	{"step_is", ok(stepIs)},
	{"step_p50_ms", stepCell(func(r *Record) *Phase { return &r.Timing.Step }, func(p *Phase) float64 { return p.P50 })},
	{"step_p10_ms", sampleCell(10)},
	{"step_p90_ms", sampleCell(90)},
	{"step_mean_ms", stepCell(func(r *Record) *Phase { return &r.Timing.Step }, func(p *Phase) float64 { return p.Mean })},
	{"step_stdev_ms", stepCell(func(r *Record) *Phase { return &r.Timing.Step }, func(p *Phase) float64 { return p.Stdev })},
	{"rank_step_p50_ms", stepCell(func(r *Record) *Phase { s, _ := twoSteps(r); return s }, func(p *Phase) float64 { return p.P50 })},
	{"lockstep_p50_ms", stepCell(func(r *Record) *Phase { _, l := twoSteps(r); return l }, func(p *Phase) float64 { return p.P50 })},
	{"pass", func(_ *Group, r Row) string { return r.Rec.Config.PassName() }},
	{"fwd_p50_ms", stepCell(func(r *Record) *Phase { return passOf(r, PassForward) }, func(p *Phase) float64 { return p.P50 })},
	{"bwd_p50_ms", stepCell(func(r *Record) *Phase { return passOf(r, "bwd") }, func(p *Phase) float64 { return p.P50 })},
	{"speedup_vs_alltoall", func(_ *Group, r Row) string { // none on the host: timing_note says why
		if r.Rec.Config.Device == "host" {
			return ""
		}
		return nonZero(r.Speedup)
	}},
}

var csvTail = []csvField{
	{"dispatch_copy_GBps", ok(func(r *Record) string { return nonZero(copyGBps(r, "dispatch")) })},
	{"combine_copy_GBps", ok(func(r *Record) string { return nonZero(copyGBps(r, "combine")) })},
	{"dispatch_algo_GBps", traffic(func(t *Traffic) float64 { return t.DispatchGBps })},
	{"combine_algo_GBps", traffic(func(t *Traffic) float64 { return t.CombineGBps })},
	{"dispatch_algo_GBps_per_SM", traffic(func(t *Traffic) float64 { return t.DispatchGBpsPerSM })},
	{"combine_algo_GBps_per_SM", traffic(func(t *Traffic) float64 { return t.CombineGBpsPerSM })},
	{"copy_payload_bytes", ok(func(r *Record) string { return integer(CopyPayload(r.Config)) })},
	{"dispatch_algo_bytes", trafficBytes(func(t *Traffic) int64 { return t.DispatchAlgorithm })},
	{"combine_algo_bytes", trafficBytes(func(t *Traffic) int64 { return t.CombineAlgorithm })},
	{"dispatch_off_rank_bytes", trafficBytes(func(t *Traffic) int64 { return t.DispatchOffRank })},
	{"combine_off_rank_bytes", trafficBytes(func(t *Traffic) int64 { return t.CombineOffRank })},
	{"inter_node_bytes", trafficBytes(func(t *Traffic) int64 { return t.InterNodeBytes })},
	{"intra_node_bytes", trafficBytes(func(t *Traffic) int64 { return t.IntraNodeBytes })},
	{"dispatch_inter_node_GBps", traffic(func(t *Traffic) float64 { return t.DispatchInterNodeGBps })},
	{"combine_inter_node_GBps", traffic(func(t *Traffic) float64 { return t.CombineInterNodeGBps })},
	{"token_straggler_rel", ok(func(r *Record) string {
		if r.Tokens == nil {
			return ""
		}
		return num(r.Tokens.Straggler.Rel)
	})},
	{"gemm_straggler_rel", ok(func(r *Record) string {
		if r.GEMM == nil {
			return ""
		}
		return num(r.GEMM.Straggler.Rel)
	})},
	{"gemm_tflops_per_rank", ok(func(r *Record) string {
		if r.GEMM == nil {
			return ""
		}
		return nonZero(r.GEMM.TFLOPS)
	})},
	{"mem_max_bytes", ok(func(r *Record) string {
		if r.Memory == nil {
			return ""
		}
		return integer(maxBytes(r.Memory.PerRankBytes))
	})},
	{"sm_util_pct", ok(func(r *Record) string {
		if tm := r.Telemetry; tm != nil && tm.GPM {
			return num(tm.SMUtilPct)
		}
		return ""
	})},
	{"sm_util_note", ok(func(r *Record) string { return r.SMs.Measured })},
	{"checked", func(_ *Group, r Row) string {
		if c := r.Rec.Correctness; c != nil {
			return strconv.FormatBool(c.Checked)
		}
		return ""
	}},
	{"check_passed", func(_ *Group, r Row) string {
		if c := r.Rec.Correctness; c != nil && c.Checked {
			return strconv.FormatBool(c.Passed)
		}
		return ""
	}},
	{"max_rel_err", func(_ *Group, r Row) string {
		if c := r.Rec.Correctness; c != nil && c.Checked {
			return num(c.MaxRelErr)
		}
		return ""
	}},
	{"grad_max_rel_err", func(_ *Group, r Row) string {
		if c := r.Rec.Correctness; c != nil && c.Grads != nil {
			return num(c.Grads.MaxRelErr)
		}
		return ""
	}},
	{"rebalance_policy", rebalanceCell(func(rb *Rebalance, _ *Record) string { return rb.Policy })},
	{"rebalance_token_straggler_before_rel", rebalanceCell(func(rb *Rebalance, _ *Record) string { return stragglerRel(rb.TokenBefore) })},
	{"rebalance_token_straggler_after_rel", rebalanceCell(func(rb *Rebalance, _ *Record) string { return stragglerRel(rb.TokenAfter) })},
	{"rebalance_gemm_straggler_before_rel", rebalanceCell(func(rb *Rebalance, _ *Record) string { return stragglerRel(rb.GEMMBefore) })},
	{"rebalance_gemm_straggler_after_rel", rebalanceCell(func(_ *Rebalance, r *Record) string {
		if r.GEMM == nil {
			return ""
		}
		return stragglerRel(r.GEMM.Straggler)
	})},
	{"rebalance_moves", rebalanceCell(func(rb *Rebalance, _ *Record) string { return strconv.Itoa(rb.Moves) })},
	{"rebalance_copy_bytes", rebalanceCell(func(rb *Rebalance, _ *Record) string { return integer(rb.CopyBytes) })},
	{"rebalance_copy_ms_p50", rebalanceCell(func(rb *Rebalance, _ *Record) string { return num(rb.CopyMS) })},
	{"rebalance_copies_exposed_ms_p50", rebalanceCell(func(rb *Rebalance, _ *Record) string {
		if !exposedMeasured(rb) {
			return ""
		}
		return num(rb.ExposedMS)
	})},
	{"rebalance_copies_exposed_note", rebalanceCell(func(rb *Rebalance, _ *Record) string { return rb.ExposedNote })},
	{"rebalance_scheduler_ms_p50", rebalanceCell(func(rb *Rebalance, _ *Record) string { return num(rb.SchedulerMS) })},
	{"rebalance_scheduler_exposed_ms_p50", rebalanceCell(func(rb *Rebalance, _ *Record) string { return num(rb.SchedulerWaitMS) })},
}

// csvFields are the columns for groups: csvHead, each phase's p50 (the
// phases of every row, in pipeline order), csvTail.
func csvFields(groups []Group) []csvField {
	fields := slices.Clone(csvHead)
	for _, name := range phaseUnion(allRows(groups)) {
		fields = append(fields, csvField{name + "_p50_ms", ok(func(r *Record) string {
			if p := phaseOf(r, name); p != nil {
				return num(p.P50)
			}
			return ""
		})})
	}
	return append(fields, csvTail...)
}

func allRows(groups []Group) []Row {
	var rows []Row
	for _, g := range groups {
		rows = append(rows, g.Rows...)
	}
	return rows
}

// writeCSV prints the header and one row per row of groups.
func writeCSV(w io.Writer, groups []Group) error {
	fields := csvFields(groups)
	cw := csv.NewWriter(w)
	var line []string
	for _, f := range fields {
		line = append(line, f.head)
	}
	cw.Write(line)
	for gi := range groups {
		g := &groups[gi]
		for _, r := range g.Rows {
			line = line[:0]
			for _, f := range fields {
				line = append(line, f.cell(g, r))
			}
			cw.Write(line)
		}
	}
	cw.Flush()
	return cw.Error()
}

// phaseUnion is the phases of rows' records, each once, in pipeline
// order: a phase one record has and the others have not goes after the
// phase it follows there (deepep's layout and notify after the router,
// feplb's rebalance and dynamic after its experts).
func phaseUnion(rows []Row) []string {
	var out []string
	for _, r := range rows {
		if r.Rec.Timing == nil {
			continue
		}
		at := 0 // where the next new phase goes: after the last known one
		for _, p := range r.Rec.Timing.Phases {
			if i := slices.Index(out, p.Name); i >= 0 {
				at = i + 1
				continue
			}
			out = slices.Insert(out, at, p.Name)
			at++
		}
	}
	return out
}
