package results

import (
	"fmt"
	"strings"
)

// Overlap is what a run with MoE communication overlap (--overlap,
// --delay-wgrad) measured: the overlapped step beside the same step's
// phases run one after another, interleaved in the same invocation, and
// the communication the overlap left exposed. See docs/overlap.md.
type Overlap struct {
	// Forms: "shared", "a2a" (comma-separated, as --overlap); DelayWgrad:
	// --delay-wgrad; MicroBatches: micro-batches a step (2 with a2a).
	Forms        string `json:"forms,omitempty"`
	DelayWgrad   bool   `json:"delay_wgrad,omitempty"`
	MicroBatches int    `json:"micro_batches"`
	// Step is the overlapped step (slowest rank, from the common start to
	// its end); Sequential the same phases one after another; Ratio is
	// Sequential's p50 over Step's.
	Step       *Stat   `json:"step_ms,omitempty"`
	Sequential *Stat   `json:"sequential_step_ms,omitempty"`
	Ratio      float64 `json:"ratio,omitempty"`
	// Comm is the dispatcher's phases' busy time in the overlapped step
	// (the union of their intervals, slowest rank); Exposed the part of it
	// no compute on another stream covered; SequentialExposed the same in
	// the sequential step (all of its communication).
	Comm              *Stat `json:"comm_ms,omitempty"`
	Exposed           *Stat `json:"exposed_comm_ms,omitempty"`
	SequentialExposed *Stat `json:"sequential_exposed_comm_ms,omitempty"`
	// GEMMSMs is how many SMs the GEMMs had beside the dispatcher's
	// kernels (the device's, less the SMs they hold); GEMMSMsNote says how
	// it was counted.
	GEMMSMs     int    `json:"gemm_sms"` // 0 with a note: none left (or not measured: the note says)
	GEMMSMsNote string `json:"gemm_sms_note,omitempty"`
	// Equal says whether the overlapped step's output and every gradient
	// equal the sequential step's, bit for bit.
	Equal bool   `json:"equal"`
	Note  string `json:"note,omitempty"`
}

// The run table's overlap columns, shown where some row of the group ran
// with overlap, before max_rel_err.
func init() {
	at := len(columns) - 1
	columns = append(columns[:at], append(overlapColumns, columns[at:]...)...)
}

// overlapOf is r's overlap measurement, nil when it has none.
func overlapOf(r Row) *Overlap {
	if r.Rec == nil {
		return nil
	}
	return r.Rec.Overlap
}

var overlapColumns = []column{
	{head: "overlap", shown: anyOverlap, val: func(r Row) string {
		c := r.Rec.Config
		switch {
		case c.Overlap == "" && !c.DelayWgrad:
			return "none"
		case c.Overlap == "":
			return "delay-wgrad"
		case c.DelayWgrad:
			return c.Overlap + "+delay-wgrad"
		}
		return c.Overlap
	}},
	{head: "overlap_step_p50", okOnly: true, shown: anyOverlap, ms: overlapMS(func(o *Overlap) *Stat { return o.Step })},
	{head: "sequential_step_p50", okOnly: true, shown: anyOverlap, ms: overlapMS(func(o *Overlap) *Stat { return o.Sequential })},
	{head: "overlap_speedup", okOnly: true, shown: anyOverlap, val: func(r Row) string {
		if o := overlapOf(r); o != nil && o.Ratio > 0 {
			return fmt.Sprintf("%.2fx", o.Ratio)
		}
		return noValue
	}},
	{head: "exposed_comm_p50", okOnly: true, shown: anyOverlap, ms: overlapMS(func(o *Overlap) *Stat { return o.Exposed })},
	{head: "gemm_sms", okOnly: true, shown: anyOverlap, val: func(r Row) string {
		if o := overlapOf(r); o != nil && o.GEMMSMsNote != "" && o.Step != nil {
			return fmt.Sprint(o.GEMMSMs)
		}
		return noValue
	}},
}

// overlapMS is a time column of the overlap measurement.
func overlapMS(pick func(*Overlap) *Stat) func(Row) (float64, bool) {
	return func(r Row) (float64, bool) {
		if o := overlapOf(r); o != nil {
			if s := pick(o); s != nil {
				return s.P50, true
			}
		}
		return 0, false
	}
}

// anyOverlap: some row of g ran with overlap.
func anyOverlap(g Group) bool {
	for _, r := range g.Rows {
		if r.Rec != nil && r.Rec.Overlap != nil {
			return true
		}
	}
	return false
}

// overlapLines prints the record's overlap measurement (format.go).
func overlapLines(p *printer, rec *Record) {
	o := rec.Overlap
	if o == nil {
		return
	}
	forms := o.Forms
	if o.DelayWgrad {
		forms = strings.TrimPrefix(forms+", delay-wgrad", ", ")
	}
	p.f("# %-22s %s, %d micro-batch(es) a step", "overlap", forms, o.MicroBatches)
	if o.Step != nil && o.Sequential != nil {
		p.f(": step p50 %.3f ms overlapped, %.3f ms sequential (%.2fx)", o.Step.P50, o.Sequential.P50, o.Ratio)
	}
	if o.Exposed != nil && o.Comm != nil {
		p.f("; communication p50 %.3f ms, exposed %.3f ms", o.Comm.P50, o.Exposed.P50)
	}
	if o.GEMMSMsNote != "" && o.Step != nil {
		p.f("; GEMMs had %d SMs (%s)", o.GEMMSMs, o.GEMMSMsNote)
	}
	if o.Step != nil {
		if o.Equal {
			p.f("; output and gradients equal the sequential step's bit for bit")
		} else {
			p.f("; NOT equal to the sequential step")
		}
	}
	p.f("\n# %-22s %s\n", "", o.Note)
}
