package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/balance"
	"github.com/moebench/moebench/harness/setup"
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
	sched                              float64 // resolved --sched-us, seconds; -1: measured
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
	if err := a.resolve(fs); err != nil {
		return usageError(stderr, err)
	}
	t := a.topology()
	m, err := a.model(stderr)
	if err != nil {
		return usageError(stderr, err)
	}
	source, err := a.source(t)
	if err != nil {
		return usageError(stderr, err)
	}
	if a.explain != "" {
		if err := a.explainStep(stdout, t, m, source(a.seed)); err != nil {
			return usageError(stderr, err)
		}
	}
	var runs [][]balance.SimResult // per seed
	for i := range a.seeds {
		cfg := balance.SimConfig{Topology: t, Model: m, Options: a.o, Source: source(a.seed + uint64(i)), Steps: a.steps, Policies: a.policies,
			Tokens: a.tokens, TopK: a.topk, Counts: a.countsUS / 1e6, Sched: a.sched, Backward: a.backward}
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
	if a.format == "markdown" && a.sched < 0 {
		fmt.Fprintln(stderr, "moebench straggler: warning: --sched-us=measured makes the table depend on this machine's timing")
	}
	writeStragglerWidth(stdout, a.format, tableWidth(a.wide), runs, a.title(m))
	return exitOK
}

// resolve checks a's flags, in the order their errors are reported, and
// completes them: the preset's shape where a size is 0, the feplb fallback
// and dynamic experts in a.o, the scheduler's time in a.sched.
func (a *stragglerArgs) resolve(fs *pflag.FlagSet) error {
	switch a.fallback {
	case "next":
	case "stop":
		a.o.BusiestOnly = true
	default:
		return fmt.Errorf("--feplb-fallback=%s: allowed: next, stop", a.fallback)
	}
	p, ok := setup.LookupPreset(a.preset)
	if !ok {
		return fmt.Errorf("--preset=%s: allowed: %s", a.preset, strings.Join(setup.PresetNames(), ", "))
	}
	pick := func(v, def int) int {
		if v != 0 {
			return v
		}
		return def
	}
	a.experts, a.topk, a.hidden, a.ffn, a.tokens = pick(a.experts, p.Experts), pick(a.topk, p.TopK), pick(a.hidden, p.Hidden), pick(a.ffn, p.FFN), pick(a.tokens, p.Tokens)
	if err := stragglerBounds(a.ep, a.experts, a.tokens, a.hidden, a.ffn, a.steps); err != nil {
		return err
	}
	if err := checkBounds(fs, policyBounds(a.ep, a.experts)); err != nil {
		return err
	}
	if !fs.Changed("feplb-dynamic") && a.experts%a.ep == 0 {
		a.o.DynamicPerRank = balance.DefaultDynamic(a.experts / a.ep)
	}
	if err := a.checkLayout(); err != nil {
		return err
	}
	a.sched = -1 // measured
	if a.schedUS != "measured" {
		v, err := strconv.ParseFloat(a.schedUS, 64)
		if err != nil || !(v >= 0) || v > 1e6 {
			return fmt.Errorf("--sched-us=%s: want 'measured' or a number of µs in [0, 1e6]", a.schedUS)
		}
		a.sched = v / 1e6
	}
	for _, pol := range a.policies {
		if _, err := balance.New(pol, a.topology(), balance.H100(a.hidden, a.ffn), a.o); err != nil {
			return fmt.Errorf("--policies: %v", err)
		}
	}
	return nil
}

// checkLayout refuses a layout, routing drift, format or model setting out
// of its range.
func (a *stragglerArgs) checkLayout() error {
	switch ep, experts, domain := a.ep, a.experts, a.domain; {
	case experts%ep != 0:
		return fmt.Errorf("--ep=%d: must divide --experts (%d)", ep, experts)
	case domain < 1 || domain > ep || ep%domain != 0:
		return fmt.Errorf("--domain=%d: must be in [1, --ep=%d] and divide it", domain, ep)
	case a.topk < 1 || a.topk > experts:
		return fmt.Errorf("--topk=%d: must be in [1, --experts=%d]", a.topk, experts)
	case !(a.drift >= 0) || a.drift > 10:
		return fmt.Errorf("--drift=%g: must be in [0, 10]", a.drift)
	case a.format != "table" && a.format != "markdown":
		return fmt.Errorf("--format=%s: allowed: table, markdown", a.format)
	case !(a.countsUS >= 0) || a.countsUS > 1e6:
		return fmt.Errorf("--counts-us=%g: must be in [0, 1e6]", a.countsUS)
	case !(a.ceShare > 0) || a.ceShare > 1:
		return fmt.Errorf("--nvlink-ce-share=%g: must be in (0, 1]", a.ceShare)
	case !(a.tflops >= 0) || a.tflops > 1e5:
		return fmt.Errorf("--gemm-tflops=%g: must be in (0, 1e5] (0: the H100 roofline)", a.tflops)
	case a.tflops > 0 && a.rateFile != "":
		return errors.New("--gemm-tflops and --gemm-rate-from: give one of them")
	}
	return nil
}

// topology is the simulated ranks, experts and NVLink domains.
func (a *stragglerArgs) topology() balance.Topology {
	return balance.Topology{Ranks: a.ep, Experts: a.experts, Domain: a.domain}
}

// model is the GEMM and copy model: the H100's, at the rate --gemm-tflops
// or --gemm-rate-from gives.
func (a *stragglerArgs) model(stderr io.Writer) (balance.Model, error) {
	m := balance.H100(a.hidden, a.ffn)
	m.CEShare = a.ceShare
	if a.tflops > 0 {
		m.GEMMRate, m.RateSource = a.tflops*1e12, fmt.Sprintf("%g TFLOP/s (--gemm-tflops), 3.35 TB/s HBM", a.tflops)
	}
	if a.rateFile != "" {
		rate, src, err := measuredRate(a.rateFile, stderr)
		if err != nil {
			return m, fmt.Errorf("--gemm-rate-from=%s: %v", a.rateFile, err)
		}
		m.GEMMRate, m.RateSource = rate, src
	}
	return m, nil
}

// source is --routing's expert load per seed.
func (a *stragglerArgs) source(t balance.Topology) (func(seed uint64) balance.Source, error) {
	r, err := setup.ParseRouting(a.routing)
	if err != nil {
		return nil, err
	}
	switch r.Kind {
	case setup.RoutingSkewed:
		return func(seed uint64) balance.Source {
			return balance.NewSkewed(t, a.topk, a.tokens, r.Alpha, a.drift, seed, a.steps)
		}, nil
	case setup.RoutingBalanced: // fresh i.i.d. routing every step, as Megatron's force-balancing: no drift
		return func(seed uint64) balance.Source { return balance.NewSkewed(t, a.topk, a.tokens, 0, 0, seed, a.steps) }, nil
	case setup.RoutingTrace:
		if a.seeds != 1 {
			return nil, fmt.Errorf("--seeds=%d: a trace has no seed; give 1 with --routing trace:FILE", a.seeds)
		}
		tr, err := setup.ReadTrace(r.File, a.experts, a.topk)
		if err != nil {
			return nil, &setup.ConfigError{Flag: "routing", Value: a.routing, Allowed: err.Error()}
		}
		return func(uint64) balance.Source { return traceSource{tr, t, a.tokens} }, nil
	}
	return nil, fmt.Errorf("--routing=%s: allowed: skewed:ALPHA, balanced, trace:FILE", a.routing)
}

// explainStep prints each policy's plan of step --explain of src.
func (a *stragglerArgs) explainStep(stdout io.Writer, t balance.Topology, m balance.Model, src balance.Source) error {
	var i int
	if _, err := fmt.Sscan(a.explain, &i); err != nil || i < 0 || i >= a.steps {
		return fmt.Errorf("--explain=%s: want a step in [0, %d)", a.explain, a.steps)
	}
	ready := a.countsUS/1e6 + max(a.sched, 0)
	if a.sched < 0 {
		ready = a.countsUS/1e6 + balance.PaperSchedSeconds
	}
	for _, name := range a.policies {
		pol, _ := balance.New(name, t, m, a.o)
		var pl balance.Plan
		for s := 0; s <= i; s++ { // policies with history see the steps before
			st := src.Step(s)
			st.Ready = ready
			pl = pol.Plan(st)
		}
		fmt.Fprintf(stdout, "step %d, %s", i, pl.Explain(t))
	}
	return nil
}

// title is the straggler table's heading: the layout, routing, seeds and
// model.
func (a *stragglerArgs) title(m balance.Model) string {
	d := fmt.Sprintf(" drift %g", a.drift)
	if !strings.HasPrefix(a.routing, setup.RoutingSkewed) {
		d = ""
	}
	schedNote := "measured"
	if a.sched >= 0 {
		schedNote = fmt.Sprintf("%g µs", a.sched*1e6)
	}
	share := ""
	if a.ceShare < 1 {
		share = fmt.Sprintf(" · copies get %g of NVLink", a.ceShare)
	}
	seedNote := fmt.Sprintf("seed %d", a.seed)
	if a.seeds > 1 {
		seedNote = fmt.Sprintf("seeds %d–%d (means; [min, max] over seeds)", a.seed, a.seed+uint64(a.seeds)-1)
	}
	if a.o.BusiestOnly {
		share += " · feplb fallback: stop (only the busiest dynamic expert)"
	}
	return fmt.Sprintf("EP %d (domains of %d) · %d experts top-%d · hidden %d ffn %d · %d tokens/rank · routing %s%s · %d steps · %s · GEMM model: %s · plan known %g µs (counts) + %s (scheduler) after phase 1%s",
		a.ep, a.domain, a.experts, a.topk, a.hidden, a.ffn, a.tokens, a.routing, d, a.steps, seedNote, m.RateSource, a.countsUS, schedNote, share)
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
	tr     *setup.Trace
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
