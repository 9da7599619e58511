package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// compare's own exit statuses (and scripts/nightly.sh's).
const (
	exitRegression  = 3 // a point regressed
	exitStackChange = 4 // the stacks (or the passes) differ in what changes results: a new baseline is needed
	exitUndecided   = 5 // points left undecided, with --fail-on-undecided
)

const compareHelp = `moebench compare matches the points of two results files by workload and settings
and decides, from the per-iteration step samples, whether NEW is slower than BASE:
a regression is an estimated slowdown (Hodges–Lehmann, on log times) above the
threshold whose confidence interval excludes no change, or a point that was ok in
BASE and failed or became unavailable in NEW. Points whose samples are too noisy
(robust CV above --max-noise-pct) or too few, and every host-device point (host
times drift between identical runs by far more than their samples show), are left
undecided with a warning, unless the whole interval of the slowdown lies above
--gross-pct (--host-gross-pct on the host device): such a gross slowdown is a
regression however noisy the samples.

Records from stacks that differ in what changes results (GPU, driver, libraries,
clocks, power limit, topology, CPU model, kernel series, Go, recorded environment)
are refused; harmless differences (memory sizes within 2%, the kernel's patch
level, where moebench keeps its files, the host name) are listed as a note.
Forward-only records and training steps (config.pass) are never the same point;
files that match only across passes are refused as a stack change is.
A record written under an older name of its dispatcher (deepep --impl library,
NCCL EP's low-latency mode, is now deepep-ll) is read under today's, with a note.

Usage:
  moebench compare [flags] BASE NEW

Exit status: 0 no regression, 3 regression, 4 the stacks or the passes differ (a
new baseline is needed), 5 undecided points with --fail-on-undecided, 2 bad input.`

// compareArgs are compare's flags; the percentages are percent.
type compareArgs struct {
	o                            results.CompareOptions
	pct, noise, gross, hostGross float64
	failUndecided, allow, wide   bool
}

// compareFlags defines compare's flags on a.
func compareFlags(a *compareArgs) *pflag.FlagSet {
	a.o = results.DefaultCompareOptions
	o := &a.o
	fs := pflag.NewFlagSet("moebench compare", pflag.ContinueOnError)
	fs.Float64Var(&a.pct, "threshold-pct", 100*o.Threshold, "slowdown of the step time, in percent, that counts as a regression")
	fs.Float64Var(&o.Confidence, "confidence", o.Confidence, "confidence of the interval that must exclude no change")
	fs.IntVar(&o.MinSamples, "min-samples", o.MinSamples, "fewer timed iterations on either side: no decision")
	fs.Float64Var(&a.noise, "max-noise-pct", 100*o.MaxNoise, "robust CV (1.4826·MAD/median, percent) above which a side is too noisy to decide")
	fs.Float64Var(&a.gross, "gross-pct", 100*o.Gross, "slowdown, in percent, that is a regression even when the samples are too noisy to decide (its whole interval must lie above it)")
	fs.Float64Var(&a.hostGross, "host-gross-pct", 100*o.HostGross, "the same for host-device points, which are otherwise never decided")
	fs.BoolVar(&a.failUndecided, "fail-on-undecided", false, "exit 5 when a point could not be decided (noisy, host timing or too few samples)")
	fs.BoolVar(&a.allow, "allow-stack-change", false, "compare records from different stacks (and list what differs)")
	fs.BoolVar(&a.wide, "wide", false, wideHelp)
	return fs
}

func compare(args []string, stdout, stderr io.Writer) int {
	var a compareArgs
	fs := compareFlags(&a)
	o, pct, noise, gross, hostGross, failUndecided, allow := &a.o, &a.pct, &a.noise, &a.gross, &a.hostGross, &a.failUndecided, &a.allow
	if code, ok := parseFlags(fs, args, compareHelp, stdout, stderr); !ok {
		return code
	}
	switch {
	case fs.NArg() != 2:
		return usageError(stderr, fmt.Errorf("compare: want BASE and NEW files, got %d arguments", fs.NArg()))
	case !(*pct > 0 && *pct < 1000):
		return usageError(stderr, fmt.Errorf("--threshold-pct=%g: must be in (0, 1000)", *pct))
	case !(o.Confidence > 0.5 && o.Confidence < 1):
		return usageError(stderr, fmt.Errorf("--confidence=%g: must be in (0.5, 1)", o.Confidence))
	case !(*noise > 0 && *noise < 1e6):
		return usageError(stderr, fmt.Errorf("--max-noise-pct=%g: must be in (0, 1e6)", *noise))
	case o.MinSamples < 2 || o.MinSamples > setup.MaxIters:
		return usageError(stderr, fmt.Errorf("--min-samples=%d: must be in [2, %d] (a record has at most %d timed iterations)", o.MinSamples, setup.MaxIters, setup.MaxIters))
	case !(*gross > *pct && *gross < 1e6):
		return usageError(stderr, fmt.Errorf("--gross-pct=%g: must be above --threshold-pct (%g) and below 1e6", *gross, *pct))
	case !(*hostGross > *pct && *hostGross < 1e6):
		return usageError(stderr, fmt.Errorf("--host-gross-pct=%g: must be above --threshold-pct (%g) and below 1e6", *hostGross, *pct))
	}
	o.Threshold, o.MaxNoise, o.Gross, o.HostGross = *pct/100, *noise/100, *gross/100, *hostGross/100
	base, err := readAll(fs.Args()[:1], stderr)
	if err != nil {
		return usageError(stderr, err)
	}
	new, err := readAll(fs.Args()[1:], stderr)
	if err != nil {
		return usageError(stderr, err)
	}
	c, err := results.Compare(base, new, *o, *allow)
	var sc *results.StackChangeError
	var pc *results.PassChangeError
	if errors.As(err, &sc) || errors.As(err, &pc) {
		fmt.Fprintf(stderr, "moebench compare: %v\n", err)
		return exitStackChange
	}
	if err != nil {
		return usageError(stderr, err)
	}
	var notes []string // records read under a name mapped from an older one
	for _, side := range []struct {
		name string
		recs []results.Record
	}{{"BASE", base}, {"NEW", new}} {
		for _, n := range results.MappedNotes(side.recs) {
			notes = append(notes, side.name+": "+n)
		}
	}
	writeCompare(stdout, c, *o, a.wide, notes)
	if c.Undecided > 0 {
		fmt.Fprintf(stderr, "moebench compare: warning: %d points could not be decided (noisy, host timing or too few samples); see the table\n", c.Undecided)
	}
	switch {
	case c.Regressions > 0:
		return exitRegression
	case c.Undecided > 0 && *failUndecided:
		return exitUndecided
	}
	return exitOK
}

// writeCompare prints the comparison: with wide, one line per point with
// its workload; else the points under their workload, in TermWidth
// columns.
func writeCompare(stdout io.Writer, c *results.Comparison, o results.CompareOptions, wide bool, notes []string) {
	w, flush := io.Writer(stdout), func() error { return nil }
	if !wide {
		w, flush = results.FitWriter(stdout, results.TermWidth)
	}
	defer flush()
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	if len(c.StackDiffs) > 0 {
		p("# stacks differ (allowed by --allow-stack-change):\n#   %s\n", strings.Join(c.StackDiffs, "\n#   "))
	}
	if len(c.StackNotes) > 0 {
		p("# note: the stacks differ only in what does not change results:\n#   %s\n", strings.Join(c.StackNotes, "\n#   "))
	}
	for _, n := range notes {
		p("# note: %s\n", n)
	}
	p("# threshold %.1f%% · confidence %.0f%% · step time, per-iteration samples\n", 100*o.Threshold, 100*o.Confidence)
	if !wide {
		writeCompareNarrow(p, c)
		return
	}
	p("# %-12s %-22s %11s %11s %9s %20s  %s\n", "verdict", "settings", "base_p50_ms", "new_p50_ms", "change_%", "interval_%", "workload")
	for _, ch := range c.Changes {
		bp, np, chg, ci := compareCells(ch)
		p("  %-12s %-22s %11s %11s %9s %20s  %s\n", ch.Verdict, ch.Settings, bp, np, chg, ci, ch.Workload)
		if ch.Why != "" && ch.Verdict != results.VerdictSame {
			p("#   %s\n", ch.Why)
		}
	}
	p("# %d points, %d regressions, %d undecided\n", len(c.Changes), c.Regressions, c.Undecided)
}

// compareCells are a point's base and new step p50, its change and the
// change's interval, "—" where there is none.
func compareCells(ch results.Change) (bp, np, chg, ci string) {
	bp, np, chg, ci = "—", "—", "—", "—"
	if ch.Base != nil && ch.Base.Timing != nil {
		bp = fmt.Sprintf("%.3f", ch.Base.Timing.Step.P50)
	}
	if ch.New != nil && ch.New.Timing != nil {
		np = fmt.Sprintf("%.3f", ch.New.Timing.Step.P50)
	}
	if s := ch.Shift; s.N > 0 && s.M > 0 {
		chg = fmt.Sprintf("%+.1f", 100*s.Est)
		ci = fmt.Sprintf("%+.1f…%+.1f", 100*s.Lo, 100*s.Hi)
	}
	return bp, np, chg, ci
}

// writeCompareNarrow prints the points under a line naming their workload
// (the wide table's last column), each point's settings cut to fit.
func writeCompareNarrow(p func(string, ...any), c *results.Comparison) {
	const fixed = 2 + 12 + 1 + 1 + 11 + 1 + 11 + 1 + 9 + 1 + 15 // every column but the settings
	sw := 22
	for _, ch := range c.Changes {
		sw = max(sw, utf8.RuneCountInString(ch.Settings))
	}
	sw = min(sw, results.TermWidth-fixed)
	p("# %-12s %-*s %11s %11s %9s %15s\n", "verdict", sw, "settings", "base_p50_ms", "new_p50_ms", "change_%", "interval_%")
	workload := ""
	for _, ch := range c.Changes {
		if ch.Workload != workload {
			workload = ch.Workload
			p("# workload %s\n", workload)
		}
		bp, np, chg, ci := compareCells(ch)
		p("  %-12s %-*s %11s %11s %9s %15s\n", ch.Verdict, sw, settingsCell(ch.Settings, sw), bp, np, chg, ci)
		if ch.Why != "" && ch.Verdict != results.VerdictSame {
			p("#   %s\n", ch.Why)
		}
	}
	p("# %d points, %d regressions, %d undecided\n", len(c.Changes), c.Regressions, c.Undecided)
}

// settingsCell fits a point's settings to width columns, cut on the right
// but keeping a precision other than bf16 (" precision=fp8", the last
// setting), which alone may tell two rows apart.
func settingsCell(s string, width int) string {
	i := strings.LastIndex(s, " precision=")
	if i < 0 || utf8.RuneCountInString(s) <= width {
		return results.Truncate(s, width)
	}
	p := s[i:]
	if n := utf8.RuneCountInString(p); n < width {
		return results.Truncate(s[:i], width-n) + p
	}
	return results.Truncate(s, width)
}
