package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/bench"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

const benchDispatchHelp = `moebench bench dispatch times dispatch and combine alone, as DeepEP's
test_intranode does, for each dispatcher and SM budget, so that a budget can be
picked: per point the p50 of each phase, the bytes in the design's own
convention (DeepEP's: tokens received × hidden × 2 B, a rank's tokens to
itself included) and GB/s, and GB/s per SM for SM-driven dispatchers. Every
iteration is checked: dispatch then combine must give each rank's input back
exactly. --sms varies only SM-driven dispatchers (deepep, hybridep); the
others run once.

On the cuda device (--device auto finds it) the phases are timed with CUDA
events as a run times them, the experts copy their rows (each rank gets k
times its input back, exactly), and where NVML has GPM each point also
reports the GPU's SM utilisation over its timed iterations; a budget above
the GPU's SMs, or whose blocks for the GPU's ranks cannot all be resident,
is unavailable, with the reason. On the host device the experts multiply
each row by its probability, and the times are host wall-clock times: they
show the data movement, not GPU performance.

Usage:
  moebench bench dispatch [flags]`

// benchDispatch runs 'moebench bench dispatch'.
func benchDispatch(args []string, stdout, stderr io.Writer) int {
	var o options
	var names []string
	var sms []int
	var format, out string
	var wide bool
	fs := benchDispatchFlags(&o, &names, &sms, &format, &out)
	precisions := fs.Lookup("precision").Value.(pflag.SliceValue)
	fs.BoolVar(&wide, "wide", false, wideHelp)
	if code, ok := parseFlags(fs, args, benchDispatchHelp, stdout, stderr); !ok {
		return code
	}
	useLibDirs(o.cudaLibs)
	if fs.NArg() > 0 {
		return usageError(stderr, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if format != "table" && format != "json" {
		return usageError(stderr, &setup.ConfigError{Flag: "format", Value: format, Allowed: "allowed: table, json"})
	}
	if err := checkDispatchers(names); err != nil {
		return usageError(stderr, err)
	}
	if err := checkBenchOut(out, bench.DispatchSchema); err != nil {
		return usageError(stderr, err)
	}
	if err := checkNoOverlap(&o, benchDispatchNoOverlap); err != nil { // overlapflags.go
		return usageError(stderr, err)
	}
	d := setup.DefaultConfig()
	o.dispatcher, o.impl, o.check, o.feplbBase, o.feplbDyn, o.feplbPolicy = d.Dispatcher, d.Impl, true, d.FeplbBase, d.FeplbDyn, d.FeplbPolicy
	cfg, err := o.config(fs)
	if err != nil {
		return usageError(stderr, err)
	}
	precs := precisions.GetSlice()
	if len(precs) == 0 || slices.Contains(precs, "") {
		return usageError(stderr, &setup.ConfigError{Flag: "precision", Value: fmt.Sprintf("%q", strings.Join(precs, ",")),
			Allowed: "an empty list or entry; give one or more of: " + strings.Join(setup.Precisions, ", ")})
	}
	for _, n := range names { // every point is valid before anything runs
		c := cfg
		c.Dispatcher = n
		for _, s := range sms {
			for _, p := range precs {
				c.SMs, c.Precision = s, p
				if err := c.Validate(); err != nil {
					return usageError(stderr, err)
				}
			}
		}
	}
	dev, note := resolveDevice(cfg.Device)
	cfg.Device = dev
	if dev == "host" {
		fmt.Fprintf(stderr, "moebench: bench dispatch on the host device (%s): host wall-clock times, not GPU performance\n", note)
	}
	b, err := bench.DispatchAt(cfg, names, sms, precs, setup.Env{Version: version(), DeviceNote: note})
	return benchResult(stdout, stderr, "dispatch", b, b != nil, err, format, out, func() { writeDispatchBenchWidth(stdout, b, tableWidth(wide)) })
}

// benchDispatchFlags defines bench dispatch's flags.
func benchDispatchFlags(o *options, names *[]string, sms *[]int, format, out *string) *pflag.FlagSet {
	d := setup.DefaultConfig()
	fs := pflag.NewFlagSet("moebench bench dispatch", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringSliceVar(names, "dispatcher", []string{"alltoall", "deepep", "hybridep"}, "dispatchers, comma-separated: "+strings.Join(dispatchers.Names(), ","))
	fs.IntSliceVar(sms, "sms", []int{8, 16, 24, 32}, "SM budgets of SM-driven dispatchers (0 = the dispatcher's default)")
	fs.StringSlice("precision", []string{setup.PrecisionBF16}, "precisions, comma-separated, each point run at each side by side: bf16 | fp8 (e4m3 rows with 1×128 fp32 scales; combine bf16) | mxfp8")
	fs.IntVar(&o.ep, "ep", d.EP, "expert-parallel ranks")
	fs.IntVar(&o.domain, "domain", d.Domain, "ranks per NVLink domain (hybridep links domains through its inter-domain path); 0 = all ranks")
	fs.StringVar(&o.preset, "preset", d.Preset, "layer shape preset; the shape flags override it")
	addShapeFlags(fs, o)
	fs.StringVar(&o.routing, "routing", d.Routing.String(), "routing: balanced|uniform|skewed:ALPHA|trace:FILE|natural")
	fs.Uint64Var(&o.seed, "seed", d.Seed, "seed of the inputs and routing")
	fs.IntVar(&o.warmup, "warmup", d.Warmup, "untimed iterations first")
	fs.IntVar(&o.iters, "iters", d.Iters, "timed iterations")
	fs.DurationVar(&o.commTimeout, "comm-timeout", d.CommTimeout, "the longest one of the dispatchers' kernels' waits for another rank may take, in [1ms, 1h] (0 = 5s)")
	fs.StringVar(&o.device, "device", d.Device, "device: auto (cuda if a driver and GPU are found, else host) | host | cuda")
	fs.IntVar(&o.gpus, "gpus", d.GPUs, "cuda: GPUs the ranks are spread over; 0 = every GPU, at most one per rank")
	addLibFlag(fs, &o.cudaLibs)
	fs.StringVar(format, "format", "table", "output: table | json")
	fs.StringVar(out, "out", "", benchOutHelp(bench.DispatchSchema))
	noOverlapFlag(fs, o, benchDispatchNoOverlap)
	return fs
}

// checkDispatchers refuses an empty --dispatcher list (no point would run)
// and a dispatcher that does not exist.
func checkDispatchers(names []string) error {
	known := dispatchers.Names()
	if len(names) == 0 {
		return &setup.ConfigError{Flag: "dispatcher", Value: `""`, Allowed: "empty list; give one or more of: " + strings.Join(known, ", ")}
	}
	for _, n := range names {
		if !slices.Contains(known, n) {
			return &setup.ConfigError{Flag: "dispatcher", Value: n, Allowed: "allowed: " + strings.Join(known, ", ")}
		}
	}
	return nil
}

// pred is a point's predicted ceiling (GB/s per SM, from the machine
// code) of dispatch or combine, or "—".
func pred(p bench.DispatchPoint, dispatch bool) string {
	switch {
	case p.Predicted == nil:
		return "—"
	case dispatch:
		return fmt.Sprintf("%.1f", p.Predicted.DispatchGBpsPerSM)
	}
	return fmt.Sprintf("%.1f", p.Predicted.CombineGBpsPerSM)
}

// mib is bytes in MiB for a table: three significant digits, no exponent.
func mib(bytes int64) string {
	v := float64(bytes) / (1 << 20)
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// writeDispatchBenchWidth prints the dispatch benchmark as a table fitted
// to width columns (0: every column): the parts of a design's dispatch
// move last, and a point that did not run says so in its check cell, its
// reason below the table.
func writeDispatchBenchWidth(w io.Writer, b *bench.DispatchBench, width int) {
	if width > 0 {
		fw, flush := results.FitWriter(w, width)
		defer flush()
		w = fw
	}
	c := b.Config
	fmt.Fprintf(w, "# bench dispatch · %s: tokens/rank %d, hidden %d, experts %d, top-%d · EP %d · routing %s · device %s\n",
		c.Preset, c.Tokens, c.Hidden, c.Experts, c.TopK, c.EP, b.Routing, c.Device)
	fmt.Fprintf(w, "# times: %s\n# bytes: %s\n# check: %s\n# MiB: the dispatch's bytes of one step, every rank's, in that convention; buf MiB: the dispatcher's own buffers, every rank's\n", b.Clock, b.Bytes, b.Check)
	if b.Ranks != "" {
		fmt.Fprintf(w, "# ranks: %s\n", b.Ranks)
	}
	table := [][]string{{"dispatcher", "prec", "sms", "dispatch ms", "parts ms", "GB/s", "GB/s/SM", "pred/SM", "combine ms", "GB/s", "GB/s/SM", "pred/SM", "check", "MiB", "buf MiB"}}
	var why []string // narrow: the reasons of the points that did not run
	for _, p := range b.Points {
		sms := "—"
		if p.Budget > 0 {
			sms = fmt.Sprint(p.Budget)
		}
		prec := setup.PrecisionBF16
		if p.Precision != "" {
			prec = p.Precision
		}
		if p.Status != results.StatusOK {
			check := results.StatusLine(p.Status, p.Dispatcher, p.Impl, p.Reason)
			if width > 0 {
				check = p.Status
				why = append(why, fmt.Sprintf("# %s (%s) at %s SMs: %s\n", p.Dispatcher, prec, sms, results.StatusLine(p.Status, p.Dispatcher, p.Impl, p.Reason)))
			}
			table = append(table, []string{p.Dispatcher, prec, sms, "—", "—", "—", "—", pred(p, true), "—", "—", "—", pred(p, false), check, "—", "—"})
			continue
		}
		var dms, cms float64
		p50 := map[string]float64{}
		for _, ph := range p.Phases {
			p50[ph.Name] = ph.P50
			switch ph.Name {
			case "dispatch":
				dms = ph.P50
			case "combine":
				cms = ph.P50
			}
		}
		parts := "—" // the dispatch as the design's test times it: its parts
		if d := p.DispatchAsDesigned; d != nil {
			dms, parts = d.P50, ""
			for i, n := range d.Parts {
				if i > 0 {
					parts += " + "
				}
				parts += fmt.Sprintf("%s %.3f", n, p50[n])
			}
		}
		perSM := func(v float64) string {
			if v == 0 {
				return "—"
			}
			return fmt.Sprintf("%.4f", v)
		}
		tr := p.Traffic
		table = append(table, []string{p.Dispatcher, prec, sms, fmt.Sprintf("%.3f", dms), parts, fmt.Sprintf("%.3f", tr.DispatchGBps), perSM(tr.DispatchGBpsPerSM),
			pred(p, true), fmt.Sprintf("%.3f", cms), fmt.Sprintf("%.3f", tr.CombineGBps), perSM(tr.CombineGBpsPerSM), pred(p, false),
			"round trip " + p.RoundTrip, mib(tr.DispatchAlgorithm), mib(p.BufferBytes)})
	}
	var left []string
	if width > 0 { // the parts last: the dispatch's own time and bandwidth first
		for i, row := range table {
			table[i] = append(append(append([]string(nil), row[:4]...), row[5:]...), row[4])
		}
		table, left = results.FitColumns(table, width, 2)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, row := range table {
		fmt.Fprintf(tw, "%s\t\n", strings.Join(row, "\t"))
	}
	tw.Flush()
	fmt.Fprint(w, results.LeftOut(left))
	fmt.Fprint(w, strings.Join(why, ""))
	said := map[string]bool{}
	for _, p := range b.Points {
		if q := p.Predicted; q != nil && !said[p.Dispatcher+" "+p.Precision] {
			said[p.Dispatcher+" "+p.Precision] = true
			of := p.Dispatcher
			if p.Precision != "" {
				of += " at " + p.Precision
			}
			fmt.Fprintf(w, "# pred/SM of %s: predicted ceiling (from machine code, not measured): %.1f GB/s per SM dispatch, %.1f combine; %s, %s (kernels/comm/inflight.json, the cuda device's kernels, whatever device ran)\n",
				of, q.DispatchGBpsPerSM, q.CombineGBpsPerSM, q.Kernels, q.Source)
		}
	}
	for _, p := range b.Points {
		if d := p.DispatchAsDesigned; d != nil && !said["design "+p.Dispatcher] {
			said["design "+p.Dispatcher] = true
			fmt.Fprintf(w, "# dispatch ms of %s: %s, %s; its GB/s are over that time\n", p.Dispatcher, strings.Join(d.Parts, " + "), d.About)
		}
		if p.HeldNote != "" && p.Status == results.StatusOK && !said[fmt.Sprint("held ", p.Dispatcher, p.Budget)] {
			said[fmt.Sprint("held ", p.Dispatcher, p.Budget)] = true
			fmt.Fprintf(w, "# SMs held by %s at %d: %s\n", p.Dispatcher, p.Budget, p.HeldNote)
		}
	}
	for _, p := range b.Points {
		if p.SMUse != "" && p.Status == results.StatusOK {
			at := ""
			if p.Budget > 0 {
				at = fmt.Sprintf(" at %d SMs", p.Budget)
			}
			fmt.Fprintf(w, "# SM use of %s%s: %s\n", p.Dispatcher, at, p.SMUse)
		}
	}
}
