package main

import (
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
	"github.com/moebench/moebench/results"
)

// sweepOptions are the matrix axes of moebench sweep.
type sweepOptions struct {
	dispatchers, impls, presets, routings []string
	sms, ep, gpus                         []int
	file                                  string
}

func sweepFlags(o *options, so *sweepOptions) *pflag.FlagSet {
	d := harness.DefaultConfig()
	fs := pflag.NewFlagSet("moebench sweep", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringSliceVar(&so.dispatchers, "dispatchers", []string{d.Dispatcher}, "dispatchers, comma-separated: "+strings.Join(dispatchers.Names(), ","))
	fs.StringSliceVar(&so.impls, "impls", []string{d.Impl}, "implementations: native,library")
	fs.IntSliceVar(&so.sms, "sms", []int{0}, "SM budgets; used only by SM-driven dispatchers (deepep, hybridep; others run once, with 0)")
	fs.IntSliceVar(&so.ep, "ep", []int{d.EP}, "EP sizes")
	fs.IntSliceVar(&so.gpus, "gpus", []int{d.GPUs}, "cuda: GPU counts the ranks are spread over; 0 = every GPU, at most one per rank (a count above a point's EP size is left out)")
	addFeplbFlags(fs, o)
	fs.StringSliceVar(&so.presets, "presets", []string{d.Preset}, "layer presets")
	addShapeFlags(fs, o)
	fs.StringSliceVar(&so.routings, "routings", []string{d.Routing.String()}, "routings")
	addControlFlags(fs, o)
	fs.StringVar(&o.out, "out", "", "results file to append one record per point to (required)")
	fs.StringVar(&so.file, "file", "", "sweep file: a JSON object whose keys are these flags' names; flags given on the command line win")
	return fs
}

const sweepHelp = `moebench sweep runs a matrix of dispatchers × implementations × --sms × EP sizes
× GPU counts × presets × routings and appends one record per point to --out. A failing or
unavailable point is recorded with its reason and the sweep goes on; Ctrl-C stops
after the current point (twice: at once), leaving the file valid.

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
	if so.file != "" {
		if err := applySweepFile(fs, so.file); err != nil {
			return usageError(stderr, err)
		}
	}
	useLibDirs(o.cudaLibs)
	if o.out == "" {
		return usageError(stderr, errors.New("sweep: --out FILE is required"))
	}
	o.format = "table"
	if err := o.checkOutputs(); err != nil {
		return usageError(stderr, err)
	}
	points, err := expand(fs, o, so)
	if err != nil {
		return usageError(stderr, err)
	}
	dev, note := resolveDevice(o.device)
	if dev == "host" {
		var dropped int
		if points, dropped = withoutGPUs(points); dropped > 0 {
			note += fmt.Sprintf("; --gpus does not apply: %d point(s) that differed only in it left out", dropped)
		}
	}
	fmt.Fprintf(stderr, "moebench sweep: %d points on the %s device (%s) → %s\n", len(points), dev, note, o.out)
	for i := range points {
		points[i].Device = dev
	}

	// Ctrl-C: stop between points; a second one quits at once, but never
	// while a record is being appended.
	var appendMu sync.Mutex
	stop := make(chan struct{})
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer func() { // stop delivery before closing, or a late signal would panic
		signal.Stop(sig)
		close(sig)
	}()
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

	counts := map[string]int{}
	record := func(rec *results.Record) error {
		appendMu.Lock()
		defer appendMu.Unlock()
		return results.Append(o.out, rec)
	}
	progress := func(ev harness.SweepEvent) {
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
		line := fmt.Sprintf("[%d/%d] %s/%s sms=%d ep=%d%s %s %s: %s", ev.Index, ev.Total, c.Dispatcher, c.Impl, c.SMs, c.EP, gpus,
			c.Preset, c.Routing, status)
		if status == results.StatusOK {
			line += fmt.Sprintf(" (step p50 %.3f ms)", ev.Record.Timing.Step.P50)
		} else if ev.Err != nil {
			line += " — " + ev.Err.Error()
		}
		if ev.Index < ev.Total {
			line += fmt.Sprintf(" · ~%s left", ev.Remaining.Round(1e8))
		}
		fmt.Fprintln(stderr, line)
	}
	done, err := harness.Sweep(points, harness.Env{Version: version(), DeviceNote: note, Progress: stderr}, stop, record, progress)
	fmt.Fprintf(stderr, "moebench sweep: %d of %d points: %d ok, %d unavailable, %d failed → %s\n", done, len(points),
		counts[results.StatusOK], counts[results.StatusUnavailable], counts[results.StatusFailed], o.out)
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "moebench sweep: --out: %v\n", err)
		return exitRuntime
	case done < len(points):
		return 130
	case counts[results.StatusFailed] > 0:
		return exitRuntime
	}
	return exitOK
}

// applySweepFile sets every flag named in the JSON file that the command line
// did not set.
func applySweepFile(fs *pflag.FlagSet, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return &harness.ConfigError{Flag: "file", Value: path, Allowed: err.Error()}
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return &harness.ConfigError{Flag: "file", Value: path, Allowed: "not a JSON object: " + err.Error()}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		f := fs.Lookup(k)
		if f == nil || k == "file" {
			var names []string
			fs.VisitAll(func(f *pflag.Flag) {
				if f.Name != "file" {
					names = append(names, f.Name)
				}
			})
			return &harness.ConfigError{Flag: "file", Value: path, Allowed: fmt.Sprintf("unknown key %q (keys are flag names: %s)", k, strings.Join(names, ", "))}
		}
		if f.Changed {
			continue
		}
		var val string
		switch v := m[k].(type) {
		case []any:
			parts := make([]string, len(v))
			for i, x := range v {
				parts[i] = fmt.Sprint(x)
			}
			val = strings.Join(parts, ",")
		case float64, string, bool:
			val = fmt.Sprint(v)
		default:
			return &harness.ConfigError{Flag: "file", Value: path, Allowed: fmt.Sprintf("key %q: want a string, number, boolean or list", k)}
		}
		if err := f.Value.Set(val); err != nil {
			return &harness.ConfigError{Flag: "file", Value: path, Allowed: fmt.Sprintf("key %q: %v", k, err)}
		}
	}
	return nil
}

// expand builds and validates every point of the matrix; a bad point stops
// the sweep before anything runs. A GPU count above a point's EP size is
// no point (each rank is on one GPU).
func expand(fs *pflag.FlagSet, base options, so sweepOptions) ([]harness.Config, error) {
	var out []harness.Config
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
							if _, smDriven := dispatchers.SMBudgetOf(d); !smDriven {
								sms = []int{0}
							}
							for _, n := range sms {
								o := base
								o.preset, o.routing, o.ep, o.gpus, o.dispatcher, o.impl, o.sms = preset, routing, ep, g, d, impl, n
								c, err := o.config(fs)
								if err != nil {
									return nil, fmt.Errorf("point preset=%s routing=%s ep=%d gpus=%d dispatcher=%s impl=%s sms=%d: %w", preset, routing, ep, g, d, impl, n, err)
								}
								out = append(out, c)
							}
						}
					}
				}
			}
		}
	}
	if len(out) == 0 {
		return nil, &harness.ConfigError{Flag: "gpus", Value: so.gpus, Allowed: fmt.Sprintf("every count is above every EP size (--ep %v): no point left", so.ep)}
	}
	return out, nil
}

// withoutGPUs is points on the host device: --gpus set to 0, and a point
// that then repeats an earlier one left out (how many it returns).
func withoutGPUs(points []harness.Config) ([]harness.Config, int) {
	var out []harness.Config
	for _, p := range points {
		p.GPUs = 0
		if !slices.ContainsFunc(out, func(q harness.Config) bool { return reflect.DeepEqual(p, q) }) {
			out = append(out, p)
		}
	}
	return out, len(points) - len(out)
}
