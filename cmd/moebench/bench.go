package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/harness/bench"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

const benchHelp = `moebench bench kernels times each kernel of one rank's layer step alone on the
GPU (CUDA events, median of --iters) and gives its achieved rate as a ratio to
ceilings measured in the same run: a large device-to-device copy for the
memory-bound kernels, a large dense bf16 GEMM (cuBLASLt) for the GEMMs, and
with two GPUs or more a large peer copy from GPU 0 to GPU 1 (the NVLink or PCIe
rate one way) for rank 0's alltoall dispatch sent as peer copies. Each timed
call follows a 128 MiB device copy on its stream, which flushes the L2 (no
call finds its inputs cached by the one before) and keeps the GPU busy while
the call is queued (no launch gap in its time). The router's top-k also runs
on every rank's tokens in one launch (one rank's logits may be too few bytes
to show a bandwidth rate). Routing is balanced. Targets (H100): permute and
unpermute ≥ 0.8 of the copy rate, router top-k ≥ 0.6, expert GEMMs ≥ 0.7 of
the dense GEMM rate.

Usage:
  moebench bench kernels [flags]
  moebench bench dispatch [flags]   dispatch and combine alone per SM budget (see bench dispatch --help)`

// benchCmd runs 'moebench bench kernels'. It needs the cuda device; without
// one it exits 1 and says why.
func benchCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "dispatch" {
		return benchDispatch(args[1:], stdout, stderr)
	}
	switch {
	case len(args) == 0:
		return usageError(stderr, errors.New("bench: which benchmark? 'moebench bench kernels' or 'moebench bench dispatch' (see 'moebench bench --help')"))
	case args[0] == "--help" || args[0] == "-h":
		fmt.Fprintln(stdout, benchHelp)
		return exitOK
	case args[0] != "kernels":
		return usageError(stderr, fmt.Errorf("bench: unknown benchmark %q (known: kernels, dispatch)", args[0]))
	}
	var o options
	var format, out string
	var wide bool
	fs := benchKernelsFlags(&o, &format, &out)
	fs.BoolVar(&wide, "wide", false, wideHelp)
	if code, ok := parseFlags(fs, args[1:], benchHelp, stdout, stderr); !ok {
		return code
	}
	useLibDirs(o.cudaLibs)
	if fs.NArg() > 0 {
		return usageError(stderr, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if format != "table" && format != "json" {
		return usageError(stderr, &setup.ConfigError{Flag: "format", Value: format, Allowed: "allowed: table, json"})
	}
	if err := checkBenchOut(out, bench.KernelSchema); err != nil {
		return usageError(stderr, err)
	}
	if err := checkNoOverlap(&o, benchKernelsNoOverlap); err != nil { // overlapflags.go
		return usageError(stderr, err)
	}
	d := setup.DefaultConfig()
	o.dispatcher, o.impl, o.routing, o.device, o.check, o.feplbBase, o.feplbDyn, o.feplbPolicy, o.commTimeout = d.Dispatcher, d.Impl, "balanced", "cuda", true, d.FeplbBase, d.FeplbDyn, d.FeplbPolicy, d.CommTimeout
	cfg, err := o.config(fs)
	if err != nil {
		return usageError(stderr, err)
	}
	dev, note := resolveDevice("auto")
	if dev != "cuda" {
		fmt.Fprintf(stderr, "moebench: bench kernels needs the cuda device: %s\n", note)
		return exitRuntime
	}
	kb, err := bench.Kernels(cfg, setup.Env{Version: version(), DeviceNote: note}, bench.DefaultSizes)
	return benchResult(stdout, stderr, "kernels", kb, kb != nil, err, format, out, func() { writeBenchWidth(stdout, kb, tableWidth(wide)) })
}

// benchKernelsFlags defines bench kernels' flags.
func benchKernelsFlags(o *options, format, out *string) *pflag.FlagSet {
	d := setup.DefaultConfig()
	fs := pflag.NewFlagSet("moebench bench kernels", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&o.preset, "preset", "qwen3-30b-a3b", "layer shape preset; the shape flags override it")
	fs.IntVar(&o.ep, "ep", 8, "expert-parallel ranks: rank 0 holds --experts/--ep experts")
	addShapeFlags(fs, o)
	fs.IntVar(&o.iters, "iters", 20, "timed calls of each kernel")
	fs.IntVar(&o.warmup, "warmup", 3, "untimed calls first")
	fs.Uint64Var(&o.seed, "seed", d.Seed, "seed of the random inputs")
	fs.StringVar(format, "format", "table", "output: table | json")
	fs.StringVar(out, "out", "", benchOutHelp(bench.KernelSchema))
	addLibFlag(fs, &o.cudaLibs)
	noOverlapFlag(fs, o, benchKernelsNoOverlap)
	return fs
}

// benchResult ends a bench command: a *setup.ConfigError is a usage
// error; another error is reported (exit 1) with the result that came, if
// any (have); the result goes to stdout as JSON or, for format table, by
// table, and as one JSON line appended to the file out when given
// (checkBenchOut checked it before the benchmark ran).
func benchResult(stdout, stderr io.Writer, what string, result any, have bool, err error, format, out string, table func()) int {
	var ce *setup.ConfigError
	if errors.As(err, &ce) {
		return usageError(stderr, err)
	}
	code := exitOK
	if err != nil {
		fmt.Fprintf(stderr, "moebench: bench %s: %v\n", what, err)
		code = exitRuntime
	}
	if !have {
		return exitRuntime
	}
	if format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(result)
	} else {
		table()
	}
	if out != "" {
		if err := results.AppendJSON(out, result); err != nil {
			fmt.Fprintf(stderr, "moebench: --out: %v\n", err)
			code = exitRuntime
		}
	}
	return code
}

// benchOutHelp is the help of a bench command's --out.
func benchOutHelp(schema string) string {
	return "append the JSON result to this file, one line per run (" + schema + "); a new file, or one that holds only such lines (any other is refused before the benchmark runs)"
}

// checkBenchOut tells, before a benchmark runs, whether its result can be
// appended to the file path (none when path is empty): see
// results.CheckAppendJSON. The error is a *setup.ConfigError naming --out.
func checkBenchOut(path, schema string) error {
	if path == "" {
		return nil
	}
	if err := results.CheckAppendJSON(path, schema); err != nil {
		return &setup.ConfigError{Flag: "out", Value: path, Allowed: err.Error()}
	}
	return nil
}

// writeBenchWidth prints the kernel benchmark as a table fitted to width
// columns (0: every column): the kernel, its time, rate and ratio to its
// ceiling first, its shape last.
func writeBenchWidth(w io.Writer, kb *bench.KernelBench, width int) {
	if width > 0 {
		fw, flush := results.FitWriter(w, width)
		defer flush()
		w = fw
	}
	c := kb.Config
	fmt.Fprintf(w, "# bench kernels · %s · rank 0 of EP %d · %s · %s\n", c.Preset, c.EP, kb.Stack.Note, kb.Routing)
	fmt.Fprintf(w, "# %s · %s\n", kb.Timing, kb.Peer)
	table := [][]string{{"kernel", "shape", "p50 µs", "rate", "unit", "ratio", "ceiling", "target", ""}}
	for _, r := range kb.Rows {
		ratio, target := "—", ""
		if r.Ceiling != "" { // the ceilings themselves have none
			ratio = fmt.Sprintf("%.2f", r.Ratio)
		}
		if r.Target > 0 {
			target = fmt.Sprintf("≥ %.2f", r.Target)
		}
		table = append(table, []string{r.Kernel, r.Shape, fmt.Sprintf("%.1f", r.P50us), fmt.Sprintf("%.1f", r.Rate), r.Unit, ratio, r.Ceiling, target, r.Verdict()})
	}
	var left []string
	if width > 0 {
		for i, row := range table {
			table[i] = append(append([]string{row[0]}, row[2:]...), row[1])
		}
		table, left = results.FitColumns(table, width, 1)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, row := range table {
		fmt.Fprintf(tw, "%s\t\n", strings.Join(row, "\t"))
	}
	tw.Flush()
	fmt.Fprint(w, results.LeftOut(left))
}
