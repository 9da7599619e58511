package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// sweepOptions are the matrix axes of moebench sweep.
type sweepOptions struct {
	dispatchers, impls, presets, routings []string
	precisions                            []string
	sms, ep, gpus                         []int
	file                                  string
}

func sweepFlags(o *options, so *sweepOptions) *pflag.FlagSet {
	fs := pflag.NewFlagSet("moebench sweep", pflag.ContinueOnError)
	fs.SortFlags = false
	addPointFlags(fs, o, so)
	overlapAxisFlag(fs, o) // overlapflags.go
	fs.StringVar(&o.out, "out", "", "results file to append one record per point to (required)")
	fs.StringVar(&so.file, "file", "", "sweep file: a JSON object whose keys are these flags' names; flags given on the command line win")
	return fs
}

// single says whether the lists make one point.
func (so sweepOptions) single() bool {
	for _, n := range []int{len(so.dispatchers), len(so.impls), len(so.presets), len(so.routings), len(so.precisions), len(so.sms), len(so.ep), len(so.gpus)} {
		if n != 1 {
			return false
		}
	}
	return true
}

// checkLists refuses an empty list of dispatchers, implementations, presets
// or routings (as --presets "" gives), which would leave no point.
func (so sweepOptions) checkLists() error {
	for _, l := range []struct {
		flag    string
		v       []string
		allowed []string
	}{{"dispatcher", so.dispatchers, dispatchers.Names()}, {"impl", so.impls, []string{"native", "library"}},
		{"preset", so.presets, setup.PresetNames()}, {"routing", so.routings, []string{"balanced", "uniform", "skewed:ALPHA", "trace:FILE", "natural"}},
		{"precision", so.precisions, setup.Precisions}} {
		if len(l.v) == 0 {
			return &setup.ConfigError{Flag: l.flag, Value: `""`, Allowed: "empty list; give one or more of: " + strings.Join(l.allowed, ", ")}
		}
	}
	return nil
}

const sweepHelp = `moebench sweep runs a matrix of dispatchers × implementations × --sms × EP sizes
× GPU counts × presets × routings × precisions and appends one record per point to --out. A failing or
unavailable point is recorded with its reason and the sweep goes on; Ctrl-C stops
after the current point (twice: at once), leaving the file valid.

The list flags are the run command's, which takes lists too (a run over more
than one point is this sweep); sweep's older plural names (--dispatchers,
--impls, --presets, --routings, --precisions) are deprecated aliases, kept for
one release.
A --file holds the same flags as JSON keys: each key acts exactly as the flag
(validation included); the command line wins.

Usage:
  moebench sweep --out FILE [flags]`

func sweep(args []string, stdout, stderr io.Writer) int {
	var o options
	var so sweepOptions
	fs := sweepFlags(&o, &so)
	if code, ok := parseFlags(fs, args, sweepHelp, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(stderr, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	warnAliases(args, stderr)
	if so.file != "" {
		if err := applySweepFile(fs, so.file, warnTo(stderr)); err != nil {
			return usageError(stderr, err)
		}
	}
	return sweepPoints(fs, o, so, true, stdout, stderr)
}

// sweepPoints runs the points of the list flags, one record each: sweep's
// work, and run's where its lists make several points (then --out is not
// required, and the report's table of the points is printed on stdout).
func sweepPoints(fs *pflag.FlagSet, o options, so sweepOptions, isSweep bool, stdout, stderr io.Writer) int {
	if err := checkSweepPoints(fs, &o, so, isSweep, stderr); err != nil {
		return usageError(stderr, err)
	}
	points, err := expand(fs, o, so)
	if err != nil {
		return usageError(stderr, err)
	}
	dev, note := resolveDevice(o.device)
	points, note = onDevice(points, dev, note)
	rv, err := rendezvous(o, points[0])
	if err == nil && rv != nil && rv.File == "" {
		err = fmt.Errorf("a sweep over %d processes (%s) needs --rendezvous FILE: every point's set-up ends in an agreement through files beside it (all processes run it, or none does)", rv.L.World, rv.L.Via)
	}
	if err != nil {
		return usageError(stderr, err)
	}
	writes := "→ " + o.out
	if o.out == "" {
		writes = "(no --out: the records are not kept)"
	}
	if rv != nil {
		defer rv.Close()
		if rv.L.Rank != 0 {
			writes = fmt.Sprintf("(process %d of %d: rank 0 writes %s)", rv.L.Rank, rv.L.World, o.out)
		}
	}
	fmt.Fprintf(stderr, "moebench sweep: %d points on the %s device (%s) %s\n", len(points), dev, note, writes)

	var appendMu sync.Mutex
	stop, unwatch := watchInterrupt(&appendMu, stderr)
	defer unwatch()
	counts := map[string]int{}
	var recs []results.Record // run's: the points' table
	record := func(rec *results.Record) error {
		if rv != nil && rv.L.Rank != 0 { // rank 0 writes the run's records
			return nil
		}
		recs = append(recs, *rec)
		if o.out == "" {
			return nil
		}
		appendMu.Lock()
		defer appendMu.Unlock()
		return appendRecord(o.out, rec, stderr)
	}
	progress := func(ev harness.SweepEvent) { sweepProgress(ev, counts, stderr) }
	env := setup.Env{Version: version(), DeviceNote: note, Progress: stderr, Rendezvous: rv}
	var most int64
	for _, p := range points {
		most = max(most, env.HostBytes(p))
	}
	defer limitMemory(most)()
	done, err := harness.Sweep(points, env, stop, record, progress)
	fmt.Fprintf(stderr, "moebench sweep: %d of %d points: %d ok, %d unavailable, %d failed %s\n", done, len(points),
		counts[results.StatusOK], counts[results.StatusUnavailable], counts[results.StatusFailed], writes)
	if !isSweep && len(recs) > 0 {
		if werr := results.WriteReportWidth(stdout, results.BuildReport(recs), "table", "", tableWidth(o.wide)); werr != nil {
			fmt.Fprintf(stderr, "moebench: writing output: %v\n", werr)
		}
	}
	return sweepExit(err, done, len(points), counts, isSweep, stderr)
}

// checkSweepPoints checks the flags of a run over several points before
// any is made (and sets the libraries' directories); o's format becomes
// "table".
func checkSweepPoints(fs *pflag.FlagSet, o *options, so sweepOptions, isSweep bool, stderr io.Writer) error {
	if err := so.checkLists(); err != nil {
		return err
	}
	if err := checkBounds(fs, flagBounds); err != nil { // the lists' values, before points are made of them
		return err
	}
	if err := feplbOnly(fs, so.dispatchers); err != nil {
		return err
	}
	useLibDirs(o.cudaLibs)
	if isSweep && o.out == "" {
		return errors.New("sweep: --out FILE is required")
	}
	if !isSweep && o.dump != "" {
		return &setup.ConfigError{Flag: "dump", Value: o.dump, Allowed: "dumps one layer's tensors: give each list flag one value"}
	}
	if !isSweep && o.format != "table" {
		return &setup.ConfigError{Flag: "format", Value: o.format, Allowed: "a run over several points prints the report's table of them; " +
			"each point's record goes to --out (moebench report --format csv prints them as CSV)"}
	}
	o.format = "table"
	return o.checkOutputs(stderr)
}

// onDevice puts the points on dev; on the host device, points that
// differed only in --gpus are left out (said in the note).
func onDevice(points []setup.Config, dev, note string) ([]setup.Config, string) {
	if dev == "host" {
		var dropped int
		if points, dropped = withoutGPUs(points); dropped > 0 {
			note += fmt.Sprintf("; --gpus does not apply: %d point(s) that differed only in it left out", dropped)
		}
	}
	for i := range points {
		points[i].Device = dev
	}
	return points, note
}

// watchInterrupt handles Ctrl-C: the first closes stop (the sweep stops
// between points); a second quits at once, but never while a record is
// being appended (appendMu held). unwatch stops the delivery.
func watchInterrupt(appendMu *sync.Mutex, stderr io.Writer) (stop chan struct{}, unwatch func()) {
	stop = make(chan struct{})
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		if _, ok := <-sig; !ok {
			return
		}
		fmt.Fprintln(stderr, "moebench sweep: interrupted; stopping after the current point (interrupt again to quit now)")
		close(stop)
		if _, ok := <-sig; ok {
			appendMu.Lock()
			fmt.Fprintln(stderr, "moebench sweep: quit; the results file holds every finished point")
			os.Exit(130)
		}
	}()
	return stop, func() { // stop delivery before closing, or a late signal would panic
		signal.Stop(sig)
		close(sig)
	}
}

// sweepProgress counts a finished point's status and prints its line.
func sweepProgress(ev harness.SweepEvent, counts map[string]int, stderr io.Writer) {
	c := ev.Config
	status := results.StatusFailed
	if ev.Record != nil {
		status = ev.Record.Status
	}
	counts[status]++
	gpus := ""
	if c.GPUs > 0 {
		gpus = fmt.Sprintf(" gpus=%d", c.GPUs)
	}
	if c.Precision != "" && c.Precision != setup.PrecisionBF16 {
		gpus += " precision=" + c.Precision
	}
	line := fmt.Sprintf("[%d/%d] %s/%s sms=%d ep=%d%s %s %s: %s", ev.Index, ev.Total, c.Dispatcher, c.Impl, c.SMs, c.EP, gpus,
		c.Preset, c.Routing, status)
	if status == results.StatusOK {
		line += fmt.Sprintf(" (step p50 %.3f ms)", ev.Record.Timing.Step.P50)
		if s := ev.Record.Timing.Stopped; s != "" {
			line += " — " + s
		}
	} else if ev.Err != nil {
		line += " — " + ev.Err.Error()
	}
	if ev.Index < ev.Total {
		line += fmt.Sprintf(" · ~%s left", ev.Remaining.Round(1e8))
	}
	fmt.Fprintln(stderr, line)
}

// sweepExit is the sweep's exit status from its error, how many of the
// points were done, and their statuses.
func sweepExit(err error, done, total int, counts map[string]int, isSweep bool, stderr io.Writer) int {
	var stopped *harness.SweepStopped
	var ce *setup.ConfigError
	switch {
	case errors.As(err, &ce):
		return usageError(stderr, err)
	case errors.As(err, &stopped):
		fmt.Fprintf(stderr, "moebench sweep: %v\n", err)
		return exitRuntime
	case err != nil:
		fmt.Fprintf(stderr, "moebench sweep: --out: %v\n", err)
		return exitRuntime
	case done < total:
		return 130
	case counts[results.StatusFailed] > 0:
		return exitRuntime
	case !isSweep && counts[results.StatusUnavailable] > 0: // as a run of one point that is unavailable
		return exitRuntime
	}
	return exitOK
}

// maxSweepFile is the largest sweep file read.
const maxSweepFile = 1 << 20

// applySweepFile sets every flag named in the JSON file that the command line
// did not set, exactly as if it had been given there: through the flag set
// (so the same parsing, the same "given" mark, and the same validation).
func applySweepFile(fs *pflag.FlagSet, path string, warn func(string)) error {
	bad := func(format string, a ...any) error {
		return &setup.ConfigError{Flag: "file", Value: path, Allowed: fmt.Sprintf(format, a...)}
	}
	f, err := os.Open(path)
	if err != nil {
		return bad("%v", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSweepFile+1))
	if err != nil {
		return bad("%v", err)
	}
	if len(b) > maxSweepFile {
		return bad("larger than %d bytes; a sweep file is a small JSON object", maxSweepFile)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // numbers keep their spelling: 1000000, not 1e+06
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil || dec.More() {
		if err == nil {
			err = errors.New("null or trailing data")
		}
		return bad("want one JSON object whose keys are flag names, e.g. {\"presets\": [\"tiny\"]}: %v", err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fromFile := map[string]string{} // flag name → the key that set it
	for _, k := range keys {
		fl := fs.Lookup(k)
		if fl == nil || fl.Name == "file" {
			var names []string
			fs.VisitAll(func(f *pflag.Flag) {
				if f.Name != "file" {
					names = append(names, f.Name)
				}
			})
			return bad("unknown key %q (keys are flag names: %s)", k, strings.Join(names, ", "))
		}
		if other, ok := fromFile[fl.Name]; ok {
			return bad("keys %q and %q both set --%s", other, k, fl.Name)
		}
		fromFile[fl.Name] = k
		if singular, ok := pluralAliases[k]; ok {
			warn(fmt.Sprintf("--file %s: key %q: %s", path, k, aliasWarning(k, singular)))
		}
		if fl.Changed { // given on the command line, which wins
			continue
		}
		val, err := flagValue(m[k], strings.HasSuffix(fl.Value.Type(), "Slice"))
		if err != nil {
			return bad("key %q: %v", k, err)
		}
		if err := fs.Set(fl.Name, val); err != nil {
			return bad("key %q: %v", k, err)
		}
	}
	return nil
}

// flagValue spells a sweep file's value as the command line would: a
// string, number or boolean as itself, a list (for list flags) joined by
// commas.
func flagValue(v any, list bool) (string, error) {
	items, isList := v.([]any)
	if !isList {
		items = []any{v}
	}
	switch {
	case isList && !list:
		return "", errors.New("takes one value, not a list")
	case isList && len(items) == 0:
		return "", errors.New("empty list; give one or more values")
	}
	parts := make([]string, len(items))
	for i, x := range items {
		switch x := x.(type) {
		case json.Number, string, bool:
			parts[i] = fmt.Sprint(x)
		default:
			return "", errors.New("want a string, number, boolean or a list of them")
		}
	}
	return strings.Join(parts, ","), nil
}

// expand builds and validates every point of the matrix; a bad point stops
// the sweep before anything runs. A GPU count above a point's EP size is
// no point (each rank is on one GPU).
func expand(fs *pflag.FlagSet, base options, so sweepOptions) ([]setup.Config, error) {
	var out []setup.Config
	for _, preset := range so.presets {
		for _, routing := range so.routings {
			for _, ep := range so.ep {
				for _, g := range so.gpus {
					if g > ep {
						continue
					}
					for _, d := range so.dispatchers {
						for _, impl := range so.impls {
							sms := so.sms
							if _, smDriven := dispatchers.SMBudgetOf(d, impl); !smDriven {
								sms = []int{0}
							}
							for _, n := range sms {
								for _, p := range so.precisions {
									for _, ov := range overlapPoints(base.overlap) { // overlapflags.go
										o := base
										o.lists = nil // the point's values, set here
										o.preset, o.routing, o.ep, o.gpus, o.dispatcher, o.impl, o.sms, o.precision = preset, routing, ep, g, d, impl, n, p
										o.overlap = ov
										c, err := o.config(fs)
										if err != nil {
											return nil, fmt.Errorf("point preset=%s routing=%s ep=%d gpus=%d dispatcher=%s impl=%s sms=%d precision=%s overlap=%s: %w", preset, routing, ep, g, d, impl, n, p, ov, err)
										}
										out = append(out, c)
									}
								}
							}
						}
					}
				}
			}
		}
	}
	if len(out) == 0 {
		return nil, &setup.ConfigError{Flag: "gpus", Value: so.gpus, Allowed: fmt.Sprintf("every count is above every EP size (--ep %v): no point left", so.ep)}
	}
	return out, nil
}

// withoutGPUs is points on the host device: --gpus set to 0, and a point
// that then repeats an earlier one left out (how many it returns).
func withoutGPUs(points []setup.Config) ([]setup.Config, int) {
	var out []setup.Config
	for _, p := range points {
		p.GPUs = 0
		if !slices.ContainsFunc(out, func(q setup.Config) bool { return reflect.DeepEqual(p, q) }) {
			out = append(out, p)
		}
	}
	return out, len(points) - len(out)
}
