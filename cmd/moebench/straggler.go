package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/balance"
	"github.com/moebench/moebench/harness"
	"github.com/moebench/moebench/results"
)

const stragglerHelp = `moebench straggler simulates many steps of expert load at any EP size and compares
balancing policies, ranked by their effective straggler: when the slowest rank is
done with the expert phase (its GEMMs, waits for copies, outputs back, broadcasts,
placement traffic) minus the mean GEMM time with every expert home. Also: token
straggler (copies on the busiest rank − mean), modelled GEMM straggler, what the
policy's own costs add (exposed_us), bytes moved by link, the busiest rank's
copy-engine time (ce_time_us), of it the outputs' way back (back_us) and how much
of that lands after the slowest rank's GEMMs (back_exposed_us), the extra bytes on
the busiest NVLink direction as a share of the EP dispatch/combine bytes there
(ep_overhead_%), and with --backward the backward pass's traffic and exposure.
Per-step plans (fastermoe, feplb*) are known --counts-us + --sched-us after phase
1; their copies and broadcasts start then. A policy within 0.5% of none's
effective straggler prints "= none" and ranks with none; a note names any policy
worse than none. --seeds N prints means over N seeds with [min, max] over them.

Usage:
  moebench straggler [flags]`

// stragglerArgs are straggler's flags.
type stragglerArgs struct {
	preset, routing, rateFile, explain string
	ep, experts, topk, tokens, domain  int
	hidden, ffn, steps                 int
	drift                              float64
	seed                               uint64
	seeds                              int
	fallback                           string
	policies                           []string
	format                             string
	schedUS                            string
	countsUS, ceShare, tflops          float64
	backward, wide                     bool
	o                                  balance.Options
}

// stragglerFlags defines straggler's flags on a.
// maxSteps and maxCells bound straggler's simulated steps, and the cells
// (experts × ranks, steps × experts, redundant slots × ranks) it keeps.
const maxSteps, maxCells = 1_000_000, 1 << 26

func stragglerFlags(a *stragglerArgs) *pflag.FlagSet {
	a.o = balance.DefaultOptions
	o := &a.o
	fs := pflag.NewFlagSet("moebench straggler", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringSliceVar(&a.policies, "policies", balance.PolicyNames, "balancing policies: "+strings.Join(balance.PolicyNames, ","))
	fs.StringVar(&a.preset, "preset", "qwen3-30b-a3b", "layer shape preset; the flags below override it")
	fs.IntVar(&a.ep, "ep", 8, "EP ranks (8 to 256 and more)")
	fs.IntVar(&a.domain, "domain", 8, "ranks per NVLink domain (copy-engine moves stay inside one)")
	fs.IntVar(&a.experts, "experts", 0, "routed experts (default: the preset's)")
	fs.IntVar(&a.topk, "topk", 0, "experts per token (default: the preset's)")
	fs.IntVar(&a.hidden, "hidden", 0, "hidden size (default: the preset's)")
	fs.IntVar(&a.ffn, "ffn", 0, "per-expert intermediate size (default: the preset's)")
	fs.IntVar(&a.tokens, "tokens", 0, "tokens per rank per step (default: the preset's)")
	fs.StringVar(&a.routing, "routing", "skewed:0.8", "skewed:ALPHA (Zipf popularity with drift) | balanced | trace:FILE (steps of ep×tokens lines)")
	fs.Float64Var(&a.drift, "drift", 0.3, "step-to-step popularity drift of skewed routing: stationary std of log popularity (balanced routing is i.i.d. each step)")
	fs.IntVar(&a.steps, "steps", 1000, "simulated steps (micro-batches)")
	fs.Uint64Var(&a.seed, "seed", 1, "seed of the routing draws")
	fs.IntVar(&a.seeds, "seeds", 1, "run seeds --seed … --seed+N−1 and print means over them, with [min, max] of the stragglers and ratios")
	fs.IntVar(&o.RedundantPerRank, "eplb-redundant", o.RedundantPerRank, "eplb: redundant expert slots per rank")
	fs.IntVar(&o.ReplanEvery, "eplb-interval", o.ReplanEvery, "eplb, feplb+place: steps between placements")
	fs.IntVar(&o.DynamicPerRank, "feplb-dynamic", 0, "feplb*: dynamic experts per rank (its most loaded; the paper's dyn); default: fitted to the layer, the paper's 4 or a rank's experts less one")
	fs.IntVar(&o.Tau, "feplb-tau", o.Tau, "feplb*: τ, fewest tokens worth moving an expert's weights for (feplb: a whole expert; feplb-split: a chunk)")
	fs.IntVar(&o.Tau, "feplb-min-chunk", o.Tau, "")
	_ = fs.MarkDeprecated("feplb-min-chunk", "use --feplb-tau")
	fs.IntVar(&o.MaxDyn, "feplb-max-dyn", o.MaxDyn, "feplb*: moved experts' weights a helper's buffer holds (the paper's max_num_dyn)")
	fs.StringVar(&a.fallback, "feplb-fallback", "next", "feplb*: when the busiest rank's busiest dynamic expert cannot move usefully: next (try its next one) | stop (the strict reading of the paper: stop)")
	fs.StringVar(&a.schedUS, "sched-us", "measured", "the CPU scheduler's time per step charged to per-step plans, µs, or 'measured' (its wall time here; not deterministic)")
	fs.Float64Var(&a.countsUS, "counts-us", 10, "µs after phase 1 until the step's counts are on the CPU (a small all-gather and a device-to-host copy; assumed)")
	fs.Float64Var(&a.ceShare, "nvlink-ce-share", 1, "share of NVLink bandwidth the copy-engine copies get while EP traffic shares the link (1: the link to themselves)")
	fs.BoolVar(&a.backward, "backward", false, "also model the backward pass: gradients back to owners (FEPLB: 6·hidden·ffn bytes of weight gradient per (expert, helper)), their time and exposure")
	fs.StringVar(&a.rateFile, "gemm-rate-from", "", "results file: model GEMM time with the best measured expert-GEMM rate in it (default: H100 roofline)")
	fs.Float64Var(&a.tflops, "gemm-tflops", 0, "expert-GEMM rate of the model, TFLOP/s (default: the H100 roofline, 989)")
	fs.StringVar(&a.explain, "explain", "", "print the plan of one step (e.g. 0) for each policy, then the summary")
	fs.StringVar(&a.format, "format", "table", "output: table | markdown (without the scheduler's wall time: deterministic with a fixed --sched-us)")
	fs.BoolVar(&a.wide, "wide", false, wideHelp)
	return fs
}

func straggler(args []string, stdout, stderr io.Writer) int {
	var a stragglerArgs
	fs := stragglerFlags(&a)
	if code, ok := parseFlags(fs, args, stragglerHelp, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(stderr, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	preset, routing, rateFile, explain := a.preset, a.routing, a.rateFile, a.explain
	ep, experts, topk, tokens, domain, hidden, ffn, steps := a.ep, a.experts, a.topk, a.tokens, a.domain, a.hidden, a.ffn, a.steps
	drift, seed, policies, format, schedUS := a.drift, a.seed, a.policies, a.format, a.schedUS
	countsUS, ceShare, tflops, backward, o := a.countsUS, a.ceShare, a.tflops, a.backward, a.o
	switch a.fallback {
	case "next":
	case "stop":
		o.BusiestOnly = true
	default:
		return usageError(stderr, fmt.Errorf("--feplb-fallback=%s: allowed: next, stop", a.fallback))
	}
	p, ok := harness.LookupPreset(preset)
	if !ok {
		return usageError(stderr, fmt.Errorf("--preset=%s: allowed: %s", preset, strings.Join(harness.PresetNames(), ", ")))
	}
	pick := func(v, def int) int {
		if v != 0 {
			return v
		}
		return def
	}
	experts, topk, hidden, ffn, tokens = pick(experts, p.Experts), pick(topk, p.TopK), pick(hidden, p.Hidden), pick(ffn, p.FFN), pick(tokens, p.Tokens)
	if err := stragglerBounds(ep, experts, tokens, hidden, ffn, steps); err != nil {
		return usageError(stderr, err)
	}
	if err := checkBounds(fs, policyBounds(ep, experts)); err != nil {
		return usageError(stderr, err)
	}
	t := balance.Topology{Ranks: ep, Experts: experts, Domain: domain}
	if !fs.Changed("feplb-dynamic") && experts%ep == 0 {
		o.DynamicPerRank = balance.DefaultDynamic(experts / ep)
	}
	switch {
	case experts%ep != 0:
		return usageError(stderr, fmt.Errorf("--ep=%d: must divide --experts (%d)", ep, experts))
	case domain < 1 || domain > ep || ep%domain != 0:
		return usageError(stderr, fmt.Errorf("--domain=%d: must be in [1, --ep=%d] and divide it", domain, ep))
	case topk < 1 || topk > experts:
		return usageError(stderr, fmt.Errorf("--topk=%d: must be in [1, --experts=%d]", topk, experts))
	case !(drift >= 0) || drift > 10:
		return usageError(stderr, fmt.Errorf("--drift=%g: must be in [0, 10]", drift))
	case format != "table" && format != "markdown":
		return usageError(stderr, fmt.Errorf("--format=%s: allowed: table, markdown", format))
	case !(countsUS >= 0) || countsUS > 1e6:
		return usageError(stderr, fmt.Errorf("--counts-us=%g: must be in [0, 1e6]", countsUS))
	case !(ceShare > 0) || ceShare > 1:
		return usageError(stderr, fmt.Errorf("--nvlink-ce-share=%g: must be in (0, 1]", ceShare))
	case !(tflops >= 0) || tflops > 1e5:
		return usageError(stderr, fmt.Errorf("--gemm-tflops=%g: must be in (0, 1e5] (0: the H100 roofline)", tflops))
	case tflops > 0 && rateFile != "":
		return usageError(stderr, errors.New("--gemm-tflops and --gemm-rate-from: give one of them"))
	}
	sched := -1.0 // measured
	if schedUS != "measured" {
		v, err := strconv.ParseFloat(schedUS, 64)
		if err != nil || !(v >= 0) || v > 1e6 {
			return usageError(stderr, fmt.Errorf("--sched-us=%s: want 'measured' or a number of µs in [0, 1e6]", schedUS))
		}
		sched = v / 1e6
	}
	for _, pol := range policies {
		if _, err := balance.New(pol, t, balance.H100(hidden, ffn), o); err != nil {
			return usageError(stderr, fmt.Errorf("--policies: %v", err))
		}
	}
	m := balance.H100(hidden, ffn)
	m.CEShare = ceShare
	if tflops > 0 {
		m.GEMMRate, m.RateSource = tflops*1e12, fmt.Sprintf("%g TFLOP/s (--gemm-tflops), 3.35 TB/s HBM", tflops)
	}
	if rateFile != "" {
		rate, src, err := measuredRate(rateFile, stderr)
		if err != nil {
			return usageError(stderr, fmt.Errorf("--gemm-rate-from=%s: %v", rateFile, err))
		}
		m.GEMMRate, m.RateSource = rate, src
	}
	r, err := harness.ParseRouting(routing)
	if err != nil {
		return usageError(stderr, err)
	}
	var source func(seed uint64) balance.Source
	switch r.Kind {
	case harness.RoutingSkewed:
		source = func(seed uint64) balance.Source {
			return balance.NewSkewed(t, topk, tokens, r.Alpha, drift, seed, steps)
		}
	case harness.RoutingBalanced: // fresh i.i.d. routing every step, as Megatron's force-balancing: no drift
		source = func(seed uint64) balance.Source { return balance.NewSkewed(t, topk, tokens, 0, 0, seed, steps) }
	case harness.RoutingTrace:
		if a.seeds != 1 {
			return usageError(stderr, fmt.Errorf("--seeds=%d: a trace has no seed; give 1 with --routing trace:FILE", a.seeds))
		}
		tr, err := harness.ReadTrace(r.File, experts, topk)
		if err != nil {
			return usageError(stderr, &harness.ConfigError{Flag: "routing", Value: routing, Allowed: err.Error()})
		}
		source = func(uint64) balance.Source { return traceSource{tr, t, tokens} }
	default:
		return usageError(stderr, fmt.Errorf("--routing=%s: allowed: skewed:ALPHA, balanced, trace:FILE", routing))
	}
	src := source(seed)
	if explain != "" {
		var i int
		if _, err := fmt.Sscan(explain, &i); err != nil || i < 0 || i >= steps {
			return usageError(stderr, fmt.Errorf("--explain=%s: want a step in [0, %d)", explain, steps))
		}
		ready := countsUS/1e6 + max(sched, 0)
		if sched < 0 {
			ready = countsUS/1e6 + balance.PaperSchedSeconds
		}
		for _, name := range policies {
			pol, _ := balance.New(name, t, m, o)
			var pl balance.Plan
			for s := 0; s <= i; s++ { // policies with history see the steps before
				st := src.Step(s)
				st.Ready = ready
				pl = pol.Plan(st)
			}
			fmt.Fprintf(stdout, "step %d, %s", i, pl.Explain(t))
		}
	}
	var runs [][]balance.SimResult // per seed
	for i := range a.seeds {
		cfg := balance.SimConfig{Topology: t, Model: m, Options: o, Source: source(seed + uint64(i)), Steps: steps, Policies: policies,
			Tokens: tokens, TopK: topk, Counts: countsUS / 1e6, Sched: sched, Backward: backward}
		res, err := balance.Simulate(cfg)
		if err != nil {
			fmt.Fprintf(stderr, "moebench straggler: %v\n", err)
			return exitRuntime
		}
		runs = append(runs, res)
	}
	for _, r := range meanResults(runs) {
		for _, w := range r.Warnings {
			fmt.Fprintf(stderr, "moebench straggler: warning: %s\n", w)
		}
	}
	if format == "markdown" && sched < 0 {
		fmt.Fprintln(stderr, "moebench straggler: warning: --sched-us=measured makes the table depend on this machine's timing")
	}
	d := fmt.Sprintf(" drift %g", drift)
	if !strings.HasPrefix(routing, harness.RoutingSkewed) {
		d = ""
	}
	schedNote := "measured"
	if sched >= 0 {
		schedNote = fmt.Sprintf("%g µs", sched*1e6)
	}
	share := ""
	if ceShare < 1 {
		share = fmt.Sprintf(" · copies get %g of NVLink", ceShare)
	}
	seedNote := fmt.Sprintf("seed %d", seed)
	if a.seeds > 1 {
		seedNote = fmt.Sprintf("seeds %d–%d (means; [min, max] over seeds)", seed, seed+uint64(a.seeds)-1)
	}
	if o.BusiestOnly {
		share += " · feplb fallback: stop (only the busiest dynamic expert)"
	}
	writeStragglerWidth(stdout, format, tableWidth(a.wide), runs, fmt.Sprintf("EP %d (domains of %d) · %d experts top-%d · hidden %d ffn %d · %d tokens/rank · routing %s%s · %d steps · %s · GEMM model: %s · plan known %g µs (counts) + %s (scheduler) after phase 1%s",
		ep, domain, experts, topk, hidden, ffn, tokens, routing, d, steps, seedNote, m.RateSource, countsUS, schedNote, share))
	return exitOK
}

// stragglerBounds refuses sizes out of their range: below 1, or more than
// the simulation can hold in memory (the steps' expert loads, per-rank
// tables of the experts) or count in int.
func stragglerBounds(ep, experts, tokens, hidden, ffn, steps int) error {
	const maxDim = 1 << 20
	for _, c := range []struct {
		flag   string
		v, max int
	}{{"ep", ep, 1 << 16}, {"experts", experts, maxDim}, {"tokens", tokens, maxDim}, {"hidden", hidden, maxDim},
		{"ffn", ffn, maxDim}, {"steps", steps, maxSteps}} {
		if c.v < 1 || c.v > c.max {
			return fmt.Errorf("--%s=%d: must be in [1, %d]", c.flag, c.v, c.max)
		}
	}
	for _, c := range []struct {
		flag   string
		v, max int
		why    string
	}{{"experts", experts, maxCells / ep, fmt.Sprintf("with --ep %d (experts × ranks ≤ %d)", ep, maxCells)},
		{"steps", steps, maxCells / experts, fmt.Sprintf("with %d experts (steps × experts ≤ %d: each step's loads are kept)", experts, maxCells)}} {
		if c.v > c.max {
			return fmt.Errorf("--%s=%d: must be ≤ %d %s", c.flag, c.v, c.max, c.why)
		}
	}
	return nil
}

// policyBounds are the ranges of the balancing policies' flags at ep ranks
// and experts experts: replicas and moved experts up to the experts (as
// many as there are, and EPLB's slots within the simulation's table
// bound), intervals up to the most steps, τ up to 2^30 tokens.
func policyBounds(ep, experts int) map[string]bound {
	const maxTau = 1 << 30
	tau := bound{1, maxTau, "the fewest tokens worth moving"}
	return map[string]bound{
		"eplb-redundant":  {0, min(experts, maxCells/ep), fmt.Sprintf("at most --experts, and slots × --ep ≤ %d", maxCells)},
		"eplb-interval":   {1, maxSteps, "steps"},
		"feplb-dynamic":   {0, experts, "at most --experts; a rank keeps one static expert"},
		"feplb-tau":       tau,
		"feplb-min-chunk": tau,
		"feplb-max-dyn":   {1, experts, "at most --experts"},
		"seeds":           {1, 1000, "seeds run one after another"},
	}
}

// measuredRate is the best expert-GEMM rate among a file's ok records.
func measuredRate(path string, stderr io.Writer) (float64, string, error) {
	recs, err := results.ReadFile(path, warnTo(stderr))
	if err != nil {
		return 0, "", err
	}
	best := 0.0
	for _, r := range recs {
		if r.Status == results.StatusOK && r.GEMM != nil && r.GEMM.TFLOPS > best {
			best = r.GEMM.TFLOPS
		}
	}
	if best <= 0 {
		return 0, "", errors.New("no ok record with an expert-GEMM rate")
	}
	return best * 1e12, fmt.Sprintf("measured %.4g TFLOP/s (best in %s); HBM 3.35 TB/s", best, path), nil
}

// traceSource replays a trace: step i uses ep×tokens consecutive lines
// (cyclically), rank r the r-th block of tokens.
type traceSource struct {
	tr     *harness.Trace
	t      balance.Topology
	tokens int
}

func (s traceSource) Step(i int) balance.Step {
	per := make([][]int, s.t.Experts) // per expert, per source rank
	for e := range per {
		per[e] = make([]int, s.t.Ranks)
	}
	counts := make([]int, s.t.Experts)
	base := i * s.t.Ranks * s.tokens
	for r := range s.t.Ranks {
		for tok := range s.tokens {
			idx, _ := s.tr.Token(base + r*s.tokens + tok)
			for _, e := range idx {
				per[e][r]++
				counts[e]++
			}
		}
	}
	return balance.Step{Index: i, Counts: counts, FromRank: func(e int) []int { return per[e] }}
}
