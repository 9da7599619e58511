package results

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Formats a record can be printed in.
var Formats = []string{"table", "json", "csv"}

// HostBoundShare: a device run whose host issue time per step (median) is at
// least this share of its step time (median) is flagged as possibly
// host-bound. The host issues calls while the GPU runs earlier ones, so a
// share near 1 means the GPU finished about when the host finished issuing:
// it was likely waiting for calls. Below it the host kept ahead.
const HostBoundShare = 0.8

// Write prints rec in format (table, json or csv).
func Write(w io.Writer, rec *Record, format string) error {
	switch format {
	case "table":
		return WriteTable(w, rec)
	case "json":
		b, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "csv":
		return WriteCSV(w, rec)
	}
	return fmt.Errorf("unknown format %q (allowed: %s)", format, strings.Join(Formats, ", "))
}

// WriteTable prints rec as a fixed-column table with units, nccl-tests style:
// a header of '#' lines, one row per phase, then the derived quantities.
func WriteTable(w io.Writer, rec *Record) error {
	p := &printer{w: w}
	writeTableHeader(p, rec)
	if rec.Status != StatusOK {
		p.f("# status: %s\n", StatusLine(rec.Status, rec.Config.Dispatcher, rec.Config.Impl, rec.Reason))
		writeCorrectness(p, rec.Correctness)
		return p.err
	}
	t := rec.Timing
	p.f("# times: %s\n", t.Clock)
	if t.Stopped != "" {
		p.f("# %s\n", t.Stopped)
	}
	if rec.Stack.Device == "host" {
		p.f("# host device: Go code runs every rank on the CPU, one after another: its times show the pipeline, they are not a performance measurement\n")
	}
	p.f("#\n")
	writePhaseTable(p, t)
	p.f("#\n")
	writeStepNotes(p, rec)
	writeRebalance(p, rec.Rebalance)
	writeTokens(p, rec.Tokens)
	writeGEMM(p, rec.GEMM)
	if rec.Stack.Device != "host" {
		p.f("# %-22s %s\n", "SMs measured", rec.SMs.Measured)
	}
	writeTelemetry(p, rec.Telemetry)
	writeTraffic(p, rec.Traffic, rec.SMs.Budget)
	writeMemory(p, rec.Memory)
	writeCorrectness(p, rec.Correctness)
	return p.err
}

// writeTableHeader prints the table's first lines: the version and
// device, the layer, the dispatcher and the run's settings, the library
// and the SM budget's note.
func writeTableHeader(p *printer, rec *Record) {
	c := rec.Config
	dev := rec.Stack.Device
	if note := rec.Stack.Note; note != "" { // its first clause: the whole reason is in the record (and on stderr)
		if i := strings.IndexAny(note, ":("); i > 0 {
			note = strings.TrimSpace(note[:i])
		}
		dev += " (" + note + ")"
	}
	p.f("# moebench %s · device %s\n", rec.Stack.Version, dev)
	shared := ""
	if c.SharedExperts > 0 {
		shared = fmt.Sprintf(", shared %d", c.SharedExperts)
	}
	groups := ""
	if c.Groups > 1 {
		groups = fmt.Sprintf(", groups %d top-%d", c.Groups, c.GroupTopK)
	}
	p.f("# layer %s: tokens/rank %d, hidden %d, ffn %d, experts %d, top-%d %s%s%s · EP %d%s\n",
		c.Preset, c.Tokens, c.Hidden, c.FFN, c.Experts, c.TopK, c.ScoreName(), groups, shared, c.EP, rankNote(rec))
	sms := "default"
	if c.SMs > 0 {
		sms = strconv.Itoa(c.SMs)
	}
	routing := c.Routing
	if c.RoutingPerStep {
		routing += " (drawn per step)"
	}
	if c.Domain > 0 {
		sms += fmt.Sprintf(" · domain %d", c.Domain)
	}
	if c.Precision != "" {
		sms += " · precision " + c.Precision
	}
	p.f("# dispatcher %s (%s) · sms %s · routing %s · seed %d · warmup %d · iters %d · %s\n",
		c.Dispatcher, c.Impl, sms, routing, c.Seed, c.Warmup, c.Iters, passLine(c))
	if lib := rec.Library; lib != nil {
		p.f("# library: %s · %s %s (%s) · %s\n", lib.Design, lib.Name, lib.Version, lib.Path, lib.Detail)
	}
	if rec.SMs.Note != "" {
		p.f("# sms: %s\n", rec.SMs.Note)
	}
}

// writeStepNotes prints what qualifies the phase table's times: the
// dispatch as the design times it, the SMs held, which step the record
// uses, the host's issue, wait and call times, CUDA graphs.
func writeStepNotes(p *printer, rec *Record) {
	t := rec.Timing
	if d := t.DispatchAsDesigned; d != nil {
		p.f("# %-22s %s = %s, %s", "dispatch as designed", d.Name, strings.Join(d.Parts, " + "), d.About)
		if d.GBps > 0 {
			p.f(" · %.3f GB/s per rank", d.GBps)
		}
		if d.GBpsPerSM > 0 {
			p.f(", %.4f per SM (%d SMs)", d.GBpsPerSM, rec.SMs.Budget)
		}
		p.f("\n")
	}
	if rec.SMs.HeldNote != "" {
		p.f("# %-22s %s\n", "SMs held", rec.SMs.HeldNote)
	}
	if t.SlowestRank != nil && t.Lockstep != nil {
		is := "rank_step"
		if t.StepIs == StepLockstep {
			is = "lockstep"
		}
		p.f("# %-22s rank_step: per iteration the slowest rank's own step; lockstep: the sum of each phase's slowest rank (a barrier between phases); the record's step, which compare uses, is %s\n", "steps", is)
	}
	if hi := t.HostIssue; hi != nil {
		p.f("# %-22s p50 %.3f ms, %.0f%% of the step's p50", "host issue/step", hi.P50, 100*hi.P50/t.Step.P50)
		if hi.P50 >= HostBoundShare*t.Step.P50 {
			p.f(" · the GPU may have waited for the host: times include launch gaps")
		}
		p.f("\n")
	}
	if t.CUDAGraph != "" {
		p.f("# %-22s %s\n", "cuda graph", t.CUDAGraph)
	}
	overlapLines(p, rec) // overlap.go
	if hw := t.HostWait; hw != nil {
		p.f("# %-22s p50 %.3f ms (the dispatcher's wait for the device before a phase; in the step, in no phase)\n", "host wait/step", hw.P50)
	}
	for _, ph := range t.Phases {
		if hc := ph.HostCall; hc != nil {
			p.f("# %-22s %s p50 %.3f ms (the library's calls' wall time on the host, its synchronizations included; the table's %s is CUDA events around them)\n",
				"host call", ph.Name, hc.P50, ph.Name)
		}
	}
}

// writeRebalance prints feplb's rebalance: the stragglers before and
// after (or that nothing moved), its copies and warnings.
func writeRebalance(p *printer, rb *Rebalance) {
	if rb == nil {
		return
	}
	if noMove(rb) {
		p.f("# %-22s %s: %s (nothing moved in any timed step) · token straggler +%.0f (+%.1f%%) · copies %.3f ms, scheduler %.3f ms\n",
			"rebalance", rb.Policy, NoMoveUnchanged, rb.TokenAfter.Abs, 100*rb.TokenAfter.Rel, rb.CopyMS, rb.SchedulerMS)
		p.f("# %-22s %s · straggler +%.3f ms (+%.1f%%), measured (the paused steps' differs from it by noise alone)\n",
			"rebalance GEMMs", NoMoveUnchanged, rb.GEMMAfter.Abs, 100*rb.GEMMAfter.Rel)
	} else {
		p.f("# %-22s %s: token straggler +%.0f (+%.1f%%) → +%.0f (+%.1f%%) · %d moves, %s · copies %.3f ms, scheduler %.3f ms\n",
			"rebalance", rb.Policy, rb.TokenBefore.Abs, 100*rb.TokenBefore.Rel, rb.TokenAfter.Abs, 100*rb.TokenAfter.Rel,
			rb.Moves, bytesStr(rb.CopyBytes), rb.CopyMS, rb.SchedulerMS)
		p.f("# %-22s straggler +%.3f ms (+%.1f%%) → +%.3f ms (+%.1f%%), measured (before: the same steps with phase 2 paused) · modelled +%.3f → +%.3f ms\n",
			"rebalance GEMMs", rb.GEMMBefore.Abs, 100*rb.GEMMBefore.Rel, rb.GEMMAfter.Abs, 100*rb.GEMMAfter.Rel, 1e3*rb.ModelledBefore, 1e3*rb.ModelledAfter)
	}
	p.f("# %-22s %s · scheduler exposed %.3f ms · copies exposed %.3f ms (%s)\n", "rebalance copies", rb.CopyMethod, rb.SchedulerWaitMS, rb.ExposedMS, rb.ExposedNote)
	if rb.BackwardCopyBytes > 0 {
		p.f("# %-22s %s moved, of them %s of fp32 weight gradients back to the owners · copies %.3f ms\n", "rebalance backward",
			bytesStr(rb.BackwardCopyBytes), bytesStr(rb.WGradBytes), rb.BackwardCopyMS)
	}
	for _, w := range rb.Warnings {
		p.f("# %-22s %s\n", "rebalance warning", w)
	}
	p.f("# %-22s %s\n", "phase-2 SMs", rb.PhaseTwoSMs)
}

// writeTokens prints the tokens each rank computed and their straggler.
func writeTokens(p *printer, tk *Tokens) {
	if tk == nil || len(tk.Received) == 0 {
		return
	}
	lo, hi := tk.Received[0], tk.Received[0]
	for _, n := range tk.Received {
		lo, hi = min(lo, n), max(hi, n)
	}
	steps := ""
	if n := len(tk.StragglerPerStep); n > 1 {
		v := slices.Sorted(slices.Values(tk.StragglerPerStep))
		steps = fmt.Sprintf(" (last step) · median of %d steps +%.1f", n, (v[(n-1)/2]+v[n/2])/2)
	}
	p.f("# %-22s min %d, max %d · straggler +%.1f copies (+%.1f%%)%s\n", "tokens computed/rank", lo, hi, tk.Straggler.Abs, 100*tk.Straggler.Rel, steps)
}

// writeGEMM prints the expert GEMMs' work, rate and straggler.
func writeGEMM(p *printer, g *GEMM) {
	if g == nil {
		return
	}
	p.f("# %-22s %.3f GFLOP/step · %.4f TFLOP/s per rank · straggler +%.3f ms (+%.1f%%)\n", "expert GEMMs",
		g.FLOPsPerIter/1e9, g.TFLOPS, g.Straggler.Abs, 100*g.Straggler.Rel)
	if g.Method != "" {
		p.f("# %-22s %s\n", "expert GEMM method", g.Method)
	}
	if bs := g.BackwardStraggler; bs != nil {
		p.f("# %-22s %.3f GFLOP/step · %.4f TFLOP/s per rank · straggler +%.3f ms (+%.1f%%)\n", "expert GEMMs backward",
			g.BackwardFLOPsPerIter/1e9, g.BackwardTFLOPS, bs.Abs, 100*bs.Rel)
	}
}

// writeTelemetry prints NVML's power, clocks and memory in use.
func writeTelemetry(p *printer, tm *Telemetry) {
	if tm == nil {
		return
	}
	var mem int64
	for _, b := range tm.MemoryUsedMax {
		mem = max(mem, b)
	}
	p.f("# %-22s power %.0f W · SM clock %.0f MHz · memory clock %.0f MHz · GPU memory in use up to %s\n", "telemetry (NVML)",
		tm.PowerW, tm.SMClockMHz, tm.MemClockMHz, bytesStr(mem))
}

// writeTraffic prints the bytes each step moves and their rates; budget
// is the SMs the rates per SM are of.
func writeTraffic(p *printer, tr *Traffic, budget int) {
	if tr == nil {
		return
	}
	for _, d := range []struct {
		name                   string
		off, logical, interDom int64
	}{{"dispatch", tr.DispatchOffRank, tr.DispatchLogical, tr.DispatchInterDomain}, {"combine", tr.CombineOffRank, tr.CombineLogical, tr.CombineInterDomain}} {
		p.f("# %-22s off-rank %s, logical %s", d.name+" bytes/step", bytesStr(d.off), bytesStr(d.logical))
		if d.interDom > 0 {
			p.f(", inter-domain %s", bytesStr(d.interDom))
		}
		p.f("\n")
	}
	if tr.BackwardFormula != "" {
		p.f("# %-22s combine-bwd off-rank %s, logical %s · dispatch-bwd off-rank %s, logical %s\n", "backward bytes/step",
			bytesStr(tr.CombineBackwardOffRank), bytesStr(tr.CombineBackwardLogical), bytesStr(tr.DispatchBackwardOffRank), bytesStr(tr.DispatchBackwardLogical))
	}
	if tr.CopyBytes > 0 {
		p.f("# %-22s %s (every (token, expert) copy's bf16 row) · dispatch %.3f, combine %.3f GB/s per rank\n", "copy bytes/step",
			bytesStr(tr.CopyBytes), tr.DispatchCopyGBps, tr.CombineCopyGBps)
	}
	if tr.InterNodeBytes > 0 {
		p.f("# %-22s inter-node %s, intra-node %s each way ((token, rank) rows) · dispatch %.3f and %.3f, combine %.3f and %.3f GB/s per rank (inter, intra)\n",
			"node bytes/step", bytesStr(tr.InterNodeBytes), bytesStr(tr.IntraNodeBytes),
			tr.DispatchInterNodeGBps, tr.DispatchIntraNodeGBps, tr.CombineInterNodeGBps, tr.CombineIntraNodeGBps)
	}
	if tr.DispatchAlgorithm > 0 {
		p.f("# %-22s dispatch %s, combine %s · %.3f and %.3f GB/s per rank", "algorithm bytes/step",
			bytesStr(tr.DispatchAlgorithm), bytesStr(tr.CombineAlgorithm), tr.DispatchGBps, tr.CombineGBps)
		if tr.DispatchGBpsPerSM > 0 {
			p.f(" · %.4f and %.4f GB/s per SM (%d SMs)", tr.DispatchGBpsPerSM, tr.CombineGBpsPerSM, budget)
		}
		if tr.InterDomainAlgorithm > 0 {
			p.f(" · inter-domain %s each way", bytesStr(tr.InterDomainAlgorithm))
		}
		p.f("\n")
	}
}

// writeMemory prints the most memory a rank held and the dispatcher's
// buffers.
func writeMemory(p *printer, m *Memory) {
	if m == nil || len(m.PerRankBytes) == 0 {
		return
	}
	var hi int64
	for _, b := range m.PerRankBytes {
		hi = max(hi, b)
	}
	p.f("# %-22s max %s (%s)", "memory/rank", bytesStr(hi), strings.SplitN(m.Method, ":", 2)[0])
	if len(m.SavedPerRankBytes) > 0 {
		p.f(" · kept for the backward: max %s per rank as a GPU keeps it", bytesStr(maxBytes(m.SavedPerRankBytes)))
	}
	p.f("\n")
	var bufs []string
	for _, b := range m.Buffers {
		var hi int64
		for _, n := range b.PerRankBytes {
			hi = max(hi, n)
		}
		bufs = append(bufs, b.Name+" "+bytesStr(hi))
	}
	if bufs != nil {
		p.f("# %-22s %s (max per rank, as a GPU holds them)\n", "dispatcher buffers", strings.Join(bufs, ", "))
	}
}

// writePhaseTable prints t's phases, then its two steps where the record
// has them (else its step), in ms, or in µs when a value would print as
// 0.0xx ms.
func writePhaseTable(p *printer, t *Timing) {
	rows := append([]Phase(nil), t.Phases...)
	if d := t.DispatchAsDesigned; d != nil { // the dispatch as the design's test times it, after its parts
		rows = append(rows, d.Phase)
	}
	if t.Forward != nil && t.Backward != nil { // a training step's two passes
		rows = append(rows, *t.Forward, *t.Backward)
	}
	slowest, lockstep := t.SlowestRank, t.Lockstep
	if slowest != nil && lockstep != nil {
		s, l := *slowest, *lockstep
		s.Name, l.Name = "rank_step", "lockstep"
		rows = append(rows, s, l)
	} else { // an older record
		rows = append(rows, t.Step)
	}
	var all []float64
	for _, ph := range rows {
		all = append(all, ph.P50, ph.P90, ph.P99, ph.Mean, ph.Stdev, ph.RankMin, ph.RankMax)
	}
	unit, pr := timeUnit(all)
	unit = unit[1:]
	wide := 10 // the phase column: at least "phase", as wide as the longest name
	for _, ph := range rows {
		wide = max(wide, len(ph.Name))
	}
	p.f("# %-*s %10s %10s %10s %10s %10s %12s %12s\n", wide, "phase", "p50_"+unit, "p90_"+unit, "p99_"+unit, "mean_"+unit, "stdev_"+unit, "rank_min_"+unit, "rank_max_"+unit)
	for _, ph := range rows {
		lo, hi := pr(ph.RankMin), pr(ph.RankMax)
		if len(ph.PerRank) == 0 && ph.Name == "lockstep" { // no rank has this step
			lo, hi = noValue, noValue
		}
		p.f("  %-*s %10s %10s %10s %10s %10s %12s %12s\n", wide, ph.Name, pr(ph.P50), pr(ph.P90), pr(ph.P99), pr(ph.Mean), pr(ph.Stdev), lo, hi)
	}
}

func writeCorrectness(p *printer, c *Correctness) {
	switch {
	case c == nil:
	case !c.Checked:
		p.f("# %-22s not checked (%s)\n", "correctness", c.Detail)
	default:
		verdict := "PASS"
		if !c.Passed {
			verdict = "FAIL"
		}
		p.f("# %-22s %s · max rel err %.2e (tolerance %.0e) · round trip %s · routing near-ties %d\n",
			"correctness", verdict, c.MaxRelErr, c.Tolerance, c.RoundTrip, c.RoutingDiffs)
		if c.Sample != "" {
			p.f("# %-22s %s\n", "compared", c.Sample)
		}
		if g := c.Grads; g != nil {
			verdict := "PASS"
			if !(g.MaxRelErr <= g.Tolerance) || g.RoundTrip != "exact" && !strings.HasPrefix(g.RoundTrip, RoundTripNotRun) {
				verdict = "FAIL"
			}
			var each []string
			for _, n := range GradTensors {
				if e, ok := g.PerTensor[n]; ok {
					each = append(each, fmt.Sprintf("%s %.1e", n, e))
				}
			}
			p.f("# %-22s %s · max rel err %.2e (tolerance %.0e) · backward round trip %s\n", "gradients", verdict, g.MaxRelErr, g.Tolerance, g.RoundTrip)
			p.f("# %-22s %s\n", "gradient errors", strings.Join(each, ", "))
		}
	}
}

// GradTensors are the gradients a training step's check compares
// (GradCheck.PerTensor's names), in the order tables list them.
var GradTensors = []string{"input", "router weight", "probs", "expert fc1", "expert fc2", "shared fc1", "shared fc2"}

// passLine says what the iterations timed.
func passLine(c Config) string {
	if c.PassName() == PassTraining {
		return "forward + backward"
	}
	s := "forward only"
	if c.PassNote != "" {
		s += " (" + strings.SplitN(c.PassNote, ":", 2)[0] + ")"
	}
	return s
}

func rankNote(rec *Record) string {
	if rec.Stack.Device == "host" {
		return " (host ranks)"
	}
	gpus := 0
	for _, d := range rec.Ranks.Devices {
		gpus = max(gpus, d+1)
	}
	switch {
	case rec.Ranks.Emulated && gpus <= 1:
		return " (emulated: ranks packed onto one GPU)"
	case rec.Ranks.Emulated:
		return fmt.Sprintf(" (emulated: ranks packed onto %d GPUs)", gpus)
	case gpus > 1:
		return fmt.Sprintf(" (one rank per GPU, %d GPUs)", gpus)
	}
	return ""
}

// WriteCSV prints a header line and one row for rec, in the report's CSV
// columns (without a speedup: it has no alltoall row to compare with).
func WriteCSV(w io.Writer, rec *Record) error {
	groups := BuildReport([]Record{*rec})
	groups[0].Rows[0].Speedup = 0
	return writeCSV(w, groups)
}

func bytesStr(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.2f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// printer remembers the first write error.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) f(format string, a ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, a...)
	}
}

// NoMoveUnchanged stands in for the "after" of a rebalance that moved
// nothing: its before (phase 2 paused) and after differ by noise alone.
const NoMoveUnchanged = "no move: unchanged"

// noMove says whether a rebalance moved nothing in any timed step: the
// harness then warns that the policy "moved nothing in N timed steps"
// (harness/run.go), or the dispatcher that its setting makes it a no-op
// that "moves nothing" (dispatchers/feplb).
func noMove(rb *Rebalance) bool {
	if rb.Moves != 0 {
		return false
	}
	for _, w := range rb.Warnings {
		if strings.Contains(w, "moved nothing") || strings.Contains(w, "moves nothing") {
			return true
		}
	}
	return false
}
