package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/balance"
	"github.com/moebench/moebench/harness"
	"github.com/moebench/moebench/results"
)

const stragglerHelp = `moebench straggler simulates many steps of expert load at any EP size and compares
balancing policies: token straggler (copies on the busiest rank − mean), modelled
GEMM straggler, bytes each policy moves and over which link, the busiest rank's
copy-engine time (ce_time_us), of it the outputs' way back to their owner
(back_us) and how much of that lands after the slowest rank's GEMMs
(back_exposed_us), scheduler time.

Usage:
  moebench straggler [flags]`

func straggler(args []string, stdout, stderr io.Writer) int {
	var (
		preset, routing, rateFile, explain string
		ep, experts, topk, tokens, domain  int
		hidden, ffn, steps                 int
		drift                              float64
		seed                               uint64
		policies                           []string
		format                             string
	)
	o := balance.DefaultOptions
	fs := pflag.NewFlagSet("moebench straggler", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringSliceVar(&policies, "policies", balance.PolicyNames, "balancing policies: "+strings.Join(balance.PolicyNames, ","))
	fs.StringVar(&preset, "preset", "qwen3-30b-a3b", "layer shape preset; the flags below override it")
	fs.IntVar(&ep, "ep", 8, "EP ranks (8 to 256 and more)")
	fs.IntVar(&domain, "domain", 8, "ranks per NVLink domain (copy-engine moves stay inside one)")
	fs.IntVar(&experts, "experts", 0, "routed experts (default: the preset's)")
	fs.IntVar(&topk, "topk", 0, "experts per token (default: the preset's)")
	fs.IntVar(&hidden, "hidden", 0, "hidden size (default: the preset's)")
	fs.IntVar(&ffn, "ffn", 0, "per-expert intermediate size (default: the preset's)")
	fs.IntVar(&tokens, "tokens", 0, "tokens per rank per step (default: the preset's)")
	fs.StringVar(&routing, "routing", "skewed:0.8", "skewed:ALPHA (Zipf popularity with drift) | balanced | trace:FILE (steps of ep×tokens lines)")
	fs.Float64Var(&drift, "drift", 0.3, "step-to-step popularity drift: stationary std of log popularity (skewed/balanced)")
	fs.IntVar(&steps, "steps", 1000, "simulated steps (micro-batches)")
	fs.Uint64Var(&seed, "seed", 1, "seed of the routing draws")
	fs.IntVar(&o.RedundantPerRank, "eplb-redundant", o.RedundantPerRank, "eplb: redundant expert slots per rank")
	fs.IntVar(&o.ReplanEvery, "eplb-interval", o.ReplanEvery, "eplb, feplb+place: steps between placements")
	fs.IntVar(&o.DynamicPerRank, "feplb-dynamic", o.DynamicPerRank, "feplb: dynamic experts per rank (its most loaded)")
	fs.IntVar(&o.MinChunk, "feplb-min-chunk", o.MinChunk, "feplb: fewest tokens worth moving an expert's weights for")
	fs.StringVar(&rateFile, "gemm-rate-from", "", "results file: model GEMM time with the best measured expert-GEMM rate in it (default: H100 roofline)")
	fs.StringVar(&explain, "explain", "", "print the plan of one step (e.g. 0) for each policy, then the summary")
	fs.StringVar(&format, "format", "table", "output: table | markdown (deterministic: without the scheduler's wall time)")
	if code, ok := parseFlags(fs, args, stragglerHelp, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(stderr, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
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
	for _, c := range []struct {
		flag string
		v    int
	}{{"ep", ep}, {"domain", domain}, {"experts", experts}, {"topk", topk}, {"hidden", hidden}, {"ffn", ffn}, {"tokens", tokens}, {"steps", steps}} {
		if c.v < 1 {
			return usageError(stderr, fmt.Errorf("--%s=%d: must be ≥ 1", c.flag, c.v))
		}
	}
	if err := stragglerBounds(ep, experts, tokens, hidden, ffn, steps); err != nil {
		return usageError(stderr, err)
	}
	t := balance.Topology{Ranks: ep, Experts: experts, Domain: domain}
	switch {
	case experts%ep != 0:
		return usageError(stderr, fmt.Errorf("--ep=%d: must divide --experts (%d)", ep, experts))
	case ep%domain != 0:
		return usageError(stderr, fmt.Errorf("--domain=%d: must divide --ep (%d)", domain, ep))
	case topk > experts:
		return usageError(stderr, fmt.Errorf("--topk=%d: must be ≤ --experts (%d)", topk, experts))
	case !(drift >= 0) || drift > 10:
		return usageError(stderr, fmt.Errorf("--drift=%g: must be in [0, 10]", drift))
	case format != "table" && format != "markdown":
		return usageError(stderr, fmt.Errorf("--format=%s: allowed: table, markdown", format))
	}
	for _, pol := range policies {
		if _, err := balance.New(pol, t, balance.H100(hidden, ffn), o); err != nil {
			return usageError(stderr, fmt.Errorf("--policies: %v", err))
		}
	}
	m := balance.H100(hidden, ffn)
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
	var src balance.Source
	switch r.Kind {
	case harness.RoutingSkewed:
		src = balance.NewSkewed(t, topk, tokens, r.Alpha, drift, seed, steps)
	case harness.RoutingBalanced:
		src = balance.NewSkewed(t, topk, tokens, 0, drift, seed, steps)
	case harness.RoutingTrace:
		tr, err := harness.ReadTrace(r.File, experts, topk)
		if err != nil {
			return usageError(stderr, &harness.ConfigError{Flag: "routing", Value: routing, Allowed: err.Error()})
		}
		src = traceSource{tr, t, tokens}
	default:
		return usageError(stderr, fmt.Errorf("--routing=%s: allowed: skewed:ALPHA, balanced, trace:FILE", routing))
	}
	if explain != "" {
		var i int
		if _, err := fmt.Sscan(explain, &i); err != nil || i < 0 || i >= steps {
			return usageError(stderr, fmt.Errorf("--explain=%s: want a step in [0, %d)", explain, steps))
		}
		for _, name := range policies {
			pol, _ := balance.New(name, t, m, o)
			var pl balance.Plan
			for s := 0; s <= i; s++ { // policies with history see the steps before
				pl = pol.Plan(src.Step(s))
			}
			fmt.Fprintf(stdout, "step %d, %s", i, pl.Explain(t))
		}
	}
	res, err := balance.Simulate(t, m, src, steps, policies, o)
	if err != nil {
		fmt.Fprintf(stderr, "moebench straggler: %v\n", err)
		return exitRuntime
	}
	writeStraggler(stdout, format, res, fmt.Sprintf("EP %d (domains of %d) · %d experts top-%d · hidden %d ffn %d · %d tokens/rank · routing %s drift %g · %d steps · seed %d · GEMM model: %s",
		ep, domain, experts, topk, hidden, ffn, tokens, routing, drift, steps, seed, m.RateSource))
	return exitOK
}

// stragglerBounds refuses sizes the simulation cannot hold in memory (the
// steps' expert loads, per-rank tables of the experts) or count in int.
func stragglerBounds(ep, experts, tokens, hidden, ffn, steps int) error {
	const maxDim, maxSteps, maxCells = 1 << 20, 1_000_000, 1 << 26
	for _, c := range []struct {
		flag   string
		v, max int
		why    string
	}{{"ep", ep, 1 << 16, ""}, {"experts", experts, maxDim, ""}, {"tokens", tokens, maxDim, ""}, {"hidden", hidden, maxDim, ""},
		{"ffn", ffn, maxDim, ""}, {"steps", steps, maxSteps, ""},
		{"experts", experts, maxCells / ep, fmt.Sprintf(" with --ep %d (experts × ranks ≤ %d)", ep, maxCells)},
		{"steps", steps, maxCells / experts, fmt.Sprintf(" with %d experts (steps × experts ≤ %d: each step's loads are kept)", experts, maxCells)}} {
		if c.v > c.max {
			return fmt.Errorf("--%s=%d: must be ≤ %d%s", c.flag, c.v, c.max, c.why)
		}
	}
	return nil
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

func writeStraggler(w io.Writer, format string, res []balance.SimResult, title string) {
	var none, faster, fe *balance.SimResult
	for i := range res {
		switch res[i].Policy {
		case "none":
			none = &res[i]
		case "fastermoe":
			faster = &res[i]
		case "feplb":
			fe = &res[i]
		}
	}
	ratio := ""
	if faster != nil && fe != nil && fe.Token.Abs > 0 {
		ratio = fmt.Sprintf("token straggler fastermoe ÷ feplb = %.2f (above 1: feplb's is lower)", faster.Token.Abs/fe.Token.Abs)
	}
	red := func(v, base float64) string {
		if none == nil || base == 0 {
			return "—"
		}
		return fmt.Sprintf("%.0f%%", 100*(1-v/base))
	}
	head := []string{"policy", "token_straggler", "token_straggler_%", "reduction", "gemm_straggler_us", "gemm_straggler_%", "reduction",
		"ce_MB/step", "nvlink_MB/step", "network_MB/step", "ce_time_us", "back_us", "back_exposed_us", "sched_us"}
	var rows [][]string
	for _, r := range res {
		row := []string{r.Policy, fmt.Sprintf("%.0f", r.Token.Abs), fmt.Sprintf("%.1f", 100*r.Token.Rel), "—",
			fmt.Sprintf("%.1f", 1e6*r.GEMM.Abs), fmt.Sprintf("%.1f", 100*r.GEMM.Rel), "—",
			fmt.Sprintf("%.1f", r.BytesPerStep[balance.LinkCE]/1e6), fmt.Sprintf("%.1f", r.BytesPerStep[balance.LinkNVLink]/1e6),
			fmt.Sprintf("%.1f", r.BytesPerStep[balance.LinkNetwork]/1e6), fmt.Sprintf("%.0f", 1e6*r.CETimeMax), fmt.Sprintf("%.0f", 1e6*r.BackTimeMax), fmt.Sprintf("%.0f", 1e6*r.BackExposed), fmt.Sprintf("%.0f", r.SchedulerMicro)}
		if none != nil {
			row[3], row[6] = red(r.Token.Rel, none.Token.Rel), red(r.GEMM.Rel, none.GEMM.Rel)
		}
		rows = append(rows, row)
	}
	table := append([][]string{head}, rows...)
	if format == "markdown" { // for committing: deterministic, so no wall-clock column
		for i := range table {
			table[i] = table[i][:len(table[i])-1]
		}
		fmt.Fprintf(w, "%s\n\n", title)
		results.WriteMarkdownTable(w, table, 1)
		if ratio != "" {
			fmt.Fprintf(w, "\n%s.\n", ratio)
		}
		return
	}
	fmt.Fprintf(w, "# %s\n# means over steps; token straggler in copies, GEMM straggler modelled; reduction vs none\n", title)
	results.WriteAligned(w, table, 1)
	if ratio != "" {
		fmt.Fprintf(w, "# %s\n", ratio)
	}
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
