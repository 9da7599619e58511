package results

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// The human-readable report tables (terminal, Markdown, HTML): their columns,
// the unit each time column takes in a group, and the key that explains
// them. The CSV (csv.go) has its own, numbers-only columns.

// column is one report column: its header and its value for a row. A time
// column's value is milliseconds; its header gets the unit the group's
// values print best in (ms, or µs when some value would print as 0.0xx ms).
// okOnly columns print "—" for failed and unavailable rows.
type column struct {
	head   string
	okOnly bool
	ms     func(Row) (float64, bool) // time columns; false: no value ("—")
	val    func(Row) string          // the others
	shown  func(Group) bool          // nil: always; else only for the groups it says
}

// noValue marks a cell without a value.
const noValue = "—"

// notMeasured marks a value a run could not measure; the key says why.
const notMeasured = "n/m"

// f3 prints v with three decimals.
func f3(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }

// sig3 prints v with three significant digits (at least the units digit),
// or "—" for zero (no value: an older record, or no such bandwidth).
func sig3(v float64) string {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return noValue
	}
	d := max(0, 2-int(math.Floor(math.Log10(math.Abs(v)))))
	return strconv.FormatFloat(v, 'f', d, 64)
}

func phaseP50(r *Record, name string) float64 {
	if p := phaseOf(r, name); p != nil {
		return p.P50
	}
	return 0
}

// phaseOf is r's phase called name, or nil.
func phaseOf(r *Record, name string) *Phase {
	if r.Timing == nil {
		return nil
	}
	for i := range r.Timing.Phases {
		if r.Timing.Phases[i].Name == name {
			return &r.Timing.Phases[i]
		}
	}
	return nil
}

// twoSteps are r's slowest rank's step and lockstep bound (either nil where
// an older record does not have it: there, Step is the lockstep bound on
// the host device and the slowest rank's step on a device).
func twoSteps(r *Record) (slowest, lockstep *Phase) {
	t := r.Timing
	if t == nil {
		return nil, nil
	}
	if t.SlowestRank != nil || t.Lockstep != nil {
		return t.SlowestRank, t.Lockstep
	}
	if stepIs(r) == StepLockstep {
		return nil, &t.Step
	}
	return &t.Step, nil
}

// stepIs says which step r's Step is (older records: by device).
func stepIs(r *Record) string {
	if r.Timing != nil && r.Timing.StepIs != "" {
		return r.Timing.StepIs
	}
	if r.Config.Device == "host" {
		return StepLockstep
	}
	return StepSlowestRank
}

// passOf is r's forward pass (PassForward) or backward pass ("bwd"): a
// training step's sums of their phases; a forward-only record's forward is
// its step, and it has no backward.
func passOf(r *Record, pass string) *Phase {
	t := r.Timing
	switch {
	case t == nil:
		return nil
	case pass != PassForward:
		return t.Backward
	case t.Forward != nil:
		return t.Forward
	}
	return &t.Step
}

func p50Of(p *Phase) (float64, bool) {
	if p == nil {
		return 0, false
	}
	return p.P50, true
}

func phaseMS(name string) func(Row) (float64, bool) {
	return func(r Row) (float64, bool) {
		p := phaseOf(r.Rec, name)
		if p == nil {
			return 0, false
		}
		return p.P50, true
	}
}

// smBudget is the blocks an SM-driven dispatcher ran its transfers with
// (older records: --sms as given); 0 for the other dispatchers.
func smBudget(r *Record) int {
	if r.SMs.Budget > 0 {
		return r.SMs.Budget
	}
	return r.Config.SMs
}

// smsCell is a row's SM budget, "(default)" when --sms left it to the
// dispatcher; "—" for dispatchers without one.
func smsCell(r Row) string {
	b := smBudget(r.Rec)
	switch {
	case b == 0:
		return noValue
	case r.Rec.SMs.Budget > 0 && r.Rec.SMs.Configured == 0:
		return strconv.Itoa(b) + " (default)"
	}
	return strconv.Itoa(b)
}

// smUtil is the measured SM utilisation, or n/m.
func smUtil(r *Record) string {
	if tm := r.Telemetry; tm != nil && tm.GPM {
		return fmt.Sprintf("%.1f", tm.SMUtilPct)
	}
	return notMeasured
}

func maxBytes(v []int64) int64 {
	var hi int64
	for _, b := range v {
		hi = max(hi, b)
	}
	return hi
}

var columns = []column{
	{head: "dispatcher", val: func(r Row) string { return r.Rec.Config.Dispatcher }},
	{head: "impl", val: func(r Row) string { return r.Rec.Config.Impl }},
	{head: "sms", val: smsCell},
	{head: "precision", shown: anyFP8, val: func(r Row) string { return r.Rec.Config.PrecisionName() }},
	{head: "fp8_gemm", shown: anyFP8, val: fp8GEMMCell},
	{head: "status", val: func(r Row) string { return r.Rec.Status }},
	{head: "sms_held", shown: held, val: heldCell},
	{head: "rank_step_p50", okOnly: true, ms: func(r Row) (float64, bool) { s, _ := twoSteps(r.Rec); return p50Of(s) }},
	{head: "lockstep_p50", okOnly: true, ms: func(r Row) (float64, bool) { _, l := twoSteps(r.Rec); return p50Of(l) }},
	{head: "fwd_p50", okOnly: true, ms: func(r Row) (float64, bool) { return p50Of(passOf(r.Rec, PassForward)) }},
	{head: "bwd_p50", okOnly: true, ms: func(r Row) (float64, bool) { return p50Of(passOf(r.Rec, "bwd")) }},
	{head: "speedup_vs_alltoall", okOnly: true, val: func(r Row) string {
		switch {
		case r.Rec.Config.Device == "host":
			return HostRatio
		case r.Speedup == 0:
			return noValue
		}
		return fmt.Sprintf("%.2fx", r.Speedup)
	}},
	{head: "dispatch_as_designed_p50", okOnly: true, shown: asDesigned, ms: func(r Row) (float64, bool) {
		if d := designOf(r.Rec); d != nil {
			return d.P50, true
		}
		return 0, false
	}},
	{head: "dispatch_as_designed_algo_GBps", okOnly: true, shown: asDesigned, val: func(r Row) string {
		if d := designOf(r.Rec); d != nil {
			return sig3(d.GBps)
		}
		return noValue
	}},
	{head: "dispatch_as_designed_algo_GBps_per_SM", okOnly: true, shown: asDesigned, val: func(r Row) string {
		if d := designOf(r.Rec); d != nil {
			return sig3(d.GBpsPerSM)
		}
		return noValue
	}},
	{head: "dispatch_p50", okOnly: true, ms: phaseMS("dispatch")},
	{head: "dispatch_copy_GBps", okOnly: true, val: func(r Row) string { return sig3(copyGBps(r.Rec, "dispatch")) }},
	{head: "dispatch_algo_GBps", okOnly: true, val: func(r Row) string { return sig3(r.Rec.Traffic.DispatchGBps) }},
	{head: "dispatch_algo_GBps_per_SM", okOnly: true, val: func(r Row) string { return sig3(r.Rec.Traffic.DispatchGBpsPerSM) }},
	{head: "combine_p50", okOnly: true, ms: phaseMS("combine")},
	{head: "combine_copy_GBps", okOnly: true, val: func(r Row) string { return sig3(copyGBps(r.Rec, "combine")) }},
	{head: "combine_algo_GBps", okOnly: true, val: func(r Row) string { return sig3(r.Rec.Traffic.CombineGBps) }},
	{head: "combine_algo_GBps_per_SM", okOnly: true, val: func(r Row) string { return sig3(r.Rec.Traffic.CombineGBpsPerSM) }},
	{head: "inter_node_MiB", okOnly: true, shown: interNode, val: func(r Row) string {
		return fmt.Sprintf("%.2f", float64(r.Rec.Traffic.InterNodeBytes)/(1<<20))
	}},
	{head: "dispatch_inter_node_GBps", okOnly: true, shown: interNode, val: func(r Row) string { return sig3(r.Rec.Traffic.DispatchInterNodeGBps) }},
	{head: "combine_inter_node_GBps", okOnly: true, shown: interNode, val: func(r Row) string { return sig3(r.Rec.Traffic.CombineInterNodeGBps) }},
	{head: "token_strag_%", okOnly: true, val: func(r Row) string { return fmt.Sprintf("%.1f", 100*r.Rec.Tokens.Straggler.Rel) }},
	{head: "gemm_strag_%", okOnly: true, val: func(r Row) string { return fmt.Sprintf("%.1f", 100*r.Rec.GEMM.Straggler.Rel) }},
	{head: "mem_max_MiB", okOnly: true, val: func(r Row) string {
		if r.Rec.Memory == nil {
			return noValue
		}
		return fmt.Sprintf("%.1f", float64(maxBytes(r.Rec.Memory.PerRankBytes))/(1<<20))
	}},
	{head: "sm_util_%", okOnly: true, val: func(r Row) string { return smUtil(r.Rec) }},
	{head: "max_rel_err", val: func(r Row) string {
		c := r.Rec.Correctness
		switch {
		case c == nil:
			return noValue
		case !c.Checked:
			return "unchecked"
		case !c.Passed:
			return fmt.Sprintf("FAIL %.1e", c.MaxRelErr)
		}
		return fmt.Sprintf("%.1e", c.MaxRelErr)
	}},
}

// asDesigned: some row of g has its dispatch as its design's test times
// it (Timing.DispatchAsDesigned); its parts are the phases' columns and
// the run's phase table.
func asDesigned(g Group) bool {
	for _, r := range g.Rows {
		if r.Rec.Status == StatusOK && r.Rec.Timing != nil && r.Rec.Timing.DispatchAsDesigned != nil {
			return true
		}
	}
	return false
}

// held: some row of g says what SMs it held (records from before the
// column say nothing).
// fp8GEMMCell is the expert GEMM path an fp8 row ran (gemm.fp8_path).
func fp8GEMMCell(r Row) string {
	if r.Rec.GEMM == nil || r.Rec.GEMM.FP8Path == "" {
		return noValue
	}
	return r.Rec.GEMM.FP8Path
}

// anyFP8: some row of g ran at a precision other than bf16 (--precision).
func anyFP8(g Group) bool {
	return slices.ContainsFunc(g.Rows, func(r Row) bool { return r.Rec.Config.PrecisionName() != "bf16" })
}

func held(g Group) bool {
	return slices.ContainsFunc(g.Rows, func(r Row) bool { return r.Rec.SMs.Held > 0 || r.Rec.SMs.HeldNote != "" })
}

// heldCell is the SMs each rank held (one block per SM), "n/a" where the
// run held none (the host device), "—" for dispatchers without a budget
// and older records.
func heldCell(r Row) string {
	switch s := r.Rec.SMs; {
	case s.Held > 0:
		return strconv.Itoa(s.Held)
	case strings.HasPrefix(s.HeldNote, "n/a"):
		return "n/a"
	}
	return noValue
}

// interNode: some row of g moved bytes between nodes.
func interNode(g Group) bool {
	for _, r := range g.Rows {
		if r.Rec.Status == StatusOK && r.Rec.Traffic != nil && r.Rec.Traffic.InterNodeBytes > 0 {
			return true
		}
	}
	return false
}

// textColumns are the report's left-aligned columns (dispatcher, impl, sms, status).
const textColumns = 4

// HostRatio stands in for a ratio of host-device times: the wall clock of
// Go code running every rank one after another is not a measurement, and
// a ratio of two such times is no number to read.
const HostRatio = "host: not a measurement"

// hostMark marks the speedup of host groups; the key says why.
const hostMark = "†"

// microseconds says whether times in ms print better in µs: some value
// would print as 0.0xx ms.
func microseconds(ms []float64) bool {
	for _, v := range ms {
		if v > 0 && v < 0.1 {
			return true
		}
	}
	return false
}

// timeUnit is the header suffix and the printer of a time column whose
// values (ms) are vals.
func timeUnit(vals []float64) (string, func(float64) string) {
	if microseconds(vals) {
		return "_us", func(ms float64) string { return strconv.FormatFloat(1e3*ms, 'f', 1, 64) }
	}
	return "_ms", f3
}

// cells is the group's table: the header, then one row per dispatcher × settings.
func (g Group) cells() [][]string { return g.cellsOf(columns) }

// cellsOf is the group's table of the columns cols.
func (g Group) cellsOf(cols []column) [][]string {
	out := make([][]string, len(g.Rows)+1)
	for _, col := range cols {
		if col.shown != nil && !col.shown(g) {
			continue
		}
		head := col.head
		var vals []string
		switch {
		case col.ms != nil:
			var ms []float64
			for _, r := range g.Rows {
				if v, ok := col.ms(r); ok && r.Rec.Status == StatusOK {
					ms = append(ms, v)
				}
			}
			unit, pr := timeUnit(ms)
			head += unit
			for _, r := range g.Rows {
				v, ok := col.ms(r)
				if !ok || (col.okOnly && r.Rec.Status != StatusOK) {
					vals = append(vals, noValue)
				} else {
					vals = append(vals, pr(v))
				}
			}
		default:
			if (col.head == "speedup_vs_alltoall" || col.head == "speedup") && g.Workload.Device == "host" {
				head += hostMark
			}
			for _, r := range g.Rows {
				if col.okOnly && r.Rec.Status != StatusOK {
					vals = append(vals, noValue)
				} else {
					vals = append(vals, col.val(r))
				}
			}
		}
		out[0] = append(out[0], head)
		for i, v := range vals {
			out[i+1] = append(out[i+1], v)
		}
	}
	return out
}

// rebalanceCells is the table of the group's rebalancing rows (FEPLB's
// phase 2): the token and the measured GEMM straggler before and after
// (after is the record's gemm.straggler), what moved and what it cost. Nil
// when no row rebalanced.
func (g Group) rebalanceCells() [][]string {
	var rbs []Row
	for _, r := range g.Rows {
		if r.Rec.Rebalance != nil && r.Rec.Status == StatusOK {
			rbs = append(rbs, r)
		}
	}
	if len(rbs) == 0 {
		return nil
	}
	pct := func(s Straggler) string {
		if len(s.PerRank) == 0 { // a record from before the measured "before"
			return noValue
		}
		return fmt.Sprintf("%.1f", 100*s.Rel)
	}
	// the times, in one unit for the table
	var all []float64
	for _, r := range rbs {
		rb := r.Rec.Rebalance
		all = append(all, rb.CopyMS, rb.SchedulerMS, rb.SchedulerWaitMS)
		if exposedMeasured(rb) {
			all = append(all, rb.ExposedMS)
		}
	}
	unit, pr := timeUnit(all)
	out := [][]string{{"rebalancing", "token_strag_before_%", "token_strag_after_%", "gemm_strag_before_%", "gemm_strag_after_%",
		"moves", "copy_MiB", "copy_p50" + unit, "copies_exposed_p50" + unit, "scheduler_p50" + unit, "scheduler_exposed_p50" + unit}}
	for _, r := range rbs {
		rb := r.Rec.Rebalance
		exposed := pr(rb.ExposedMS)
		switch {
		case rb.ExposedNote == "": // a record from before the exposed time
			exposed = noValue
		case !exposedMeasured(rb):
			exposed = notMeasured
		}
		tokenAfter, gemmAfter := pct(rb.TokenAfter), pct(r.Rec.GEMM.Straggler)
		if noMove(rb) {
			tokenAfter, gemmAfter = NoMoveUnchanged, NoMoveUnchanged
		}
		out = append(out, []string{r.Rec.Config.Settings(), pct(rb.TokenBefore), tokenAfter, pct(rb.GEMMBefore), gemmAfter,
			strconv.Itoa(rb.Moves), fmt.Sprintf("%.2f", float64(rb.CopyBytes)/(1<<20)), pr(rb.CopyMS), exposed, pr(rb.SchedulerMS), pr(rb.SchedulerWaitMS)})
	}
	return out
}

// exposedMeasured says whether rb's exposed copy time was measured.
func exposedMeasured(rb *Rebalance) bool { return strings.HasPrefix(rb.ExposedNote, "median of") }

// reportKey explains the tables' columns and marks for groups: what each
// step is and which one the speedup uses, the bandwidth conventions, the
// host caveat where a group ran on the host device, and why each "n/m" was
// not measured. One line per item.
func reportKey(groups []Group) []string {
	host, device, nodes := false, false, false
	smWhy, exposedWhy := map[string]bool{}, map[string]bool{}
	for _, g := range groups {
		nodes = nodes || interNode(g)
		host = host || g.Workload.Device == "host"
		device = device || g.Workload.Device != "host"
		for _, r := range g.Rows {
			if r.Rec.Status != StatusOK {
				continue
			}
			if smUtil(r.Rec) == notMeasured {
				smWhy[r.Rec.SMs.Measured] = true
			}
			if rb := r.Rec.Rebalance; rb != nil && rb.ExposedNote != "" && !exposedMeasured(rb) {
				exposedWhy[rb.ExposedNote] = true
			}
		}
	}
	var basis []string
	if host {
		basis = append(basis, "lockstep on the host device (its ranks run a phase one after another)")
	}
	if device {
		basis = append(basis, "rank_step on a GPU (each rank's step measured with its waits)")
	}
	key := []string{
		"rank_step: per iteration, the slowest rank's own step (on the host device its phases summed: a rank that waits for no one); " +
			"lockstep: per iteration, the sum of each phase's slowest rank (a barrier between phases); both p50 over the timed iterations",
		"speedup_vs_alltoall: the native alltoall row's step p50 over this row's, the step being " + strings.Join(basis, ", ") + "; it is the step compare decides on",
		"dispatch_p50, combine_p50: the phase's slowest rank per iteration, p50; times in µs (_us) where a value would print as 0.0xx ms",
		"fwd_p50, bwd_p50: a training step's forward and backward, each the lockstep sum of its phases (the group's title says whether the iterations timed both passes or the forward only, whose fwd is its step)",
		"GBps columns are GB/s (1e9 B/s) of a rank's share of a step's bytes over the phase's p50: copy = " + copyRows + ", the same bytes for every dispatcher; " +
			"algo = the design's own convention (DeepEP's test_intranode: each (token, destination rank) pair once, its bf16 row: fewer bytes where a design sends a token once to a rank holding several of its experts); " +
			"algo_GBps_per_SM = algo over the SM budget of an SM-driven dispatcher",
		"sms: the SM budget (blocks) of an SM-driven dispatcher's transfers, '(default)' when --sms left it to the dispatcher; sm_util_%: measured SM utilisation (NVML GPM)",
		noValue + ": no value (a failed or unavailable point, a record from before the column, or a quantity the dispatcher does not have)",
	}
	if slices.ContainsFunc(groups, held) {
		key = append(key, "sms_held: the SMs each rank held on a GPU (one block per SM; ranks packed on one GPU share its SMs, at most SMs ÷ ranks each), n/a on the host device")
	}
	if slices.ContainsFunc(groups, anyFP8) {
		key = append(key, "precision: --precision; fp8 dispatches e4m3 rows with one fp32 scale per 1×128 block (bytes and algo GB/s count them: hidden + hidden/128 × 4 B a row), "+
			"mxfp8 e4m3 rows with one E8M0 scale per 32 elements (hidden + hidden/32 B a row), "+
			"combine bf16, expert GEMMs as the record's gemm.method says (docs/fp8.md); "+
			"fp8_gemm: the expert GEMM path that ran (bf16-dequant: bf16 GEMMs on dequantized rows and weights; cublaslt-fp8-block / -tensor: cuBLASLt FP8 with 1×128/128×128 or per-tensor scales; "+
			"mx-emulated: the MXFP8 GEMM emulated on the host), why in gemm.fp8_path_reason")
	}
	if slices.ContainsFunc(groups, asDesigned) {
		key = append(key, "dispatch_as_designed_*: the dispatch as the design's own test times it, per iteration the sum of its parts' slowest ranks, p50 "+
			"(deepep: notify + dispatch, as DeepEP's test_intranode; hybridep: allgather + preprocess + dispatch, as HybridEP's test_hybrid_ep); dispatch_p50 is the dispatch phase alone")
	}
	if host {
		key = append(key, hostMark+" host device: the times are the wall clock of Go code running every rank on the CPU, one after another: "+
			"not a performance measurement, and its speedups say nothing about the dispatchers on a GPU")
	}
	if nodes {
		key = append(key, "inter_node_MiB, *_inter_node_GBps: a run over several nodes, its bytes to ranks of other nodes each way (and a rank's share of them over the phase's p50): "+NodeFormula)
	}
	if len(smWhy) > 0 {
		key = append(key, notMeasured+" in sm_util_%: "+whyNot(smWhy))
	}
	if len(exposedWhy) > 0 {
		key = append(key, notMeasured+" in copies_exposed: "+whyNot(exposedWhy))
	}
	return key
}

// whyNot says why values were not measured: the records' notes ("not
// measured…"), each once.
func whyNot(notes map[string]bool) string {
	delete(notes, "")
	if len(notes) == 0 {
		return "not measured"
	}
	return strings.Join(slices.Sorted(maps.Keys(notes)), "; ")
}

// designOf is r's dispatch as its design's test times it, or nil.
func designOf(r *Record) *DesignPhase {
	if r.Timing == nil {
		return nil
	}
	return r.Timing.DispatchAsDesigned
}
