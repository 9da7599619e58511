// Command moebench runs one Mixture-of-Experts layer and measures what the
// token dispatcher does to it. This file parses and validates the command
// line; the work is done by package harness and the output by package results.
//
// Every command and flag: docs/cli.md; the design: docs/design.md.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/dispatchers"
	_ "github.com/moebench/moebench/dispatchers/all"
	"github.com/moebench/moebench/harness"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/internal/launch"
	kdevice "github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// Exit statuses.
const (
	exitOK      = 0
	exitRuntime = 1 // runtime failure, failed check, unavailable dispatcher/device
	exitUsage   = 2 // bad command line or unreadable input files
	// exitRegression (3) is moebench compare's "regression found"
	exitInterrupted = 130 // SIGINT or SIGTERM stopped the run (128 + SIGINT's 2, as a shell reports it)
)

const baseVersion = "0.1.0-dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole program, testable: it never panics out and returns the exit status.
func run(args []string, stdout, stderr io.Writer) (code int) {
	defer func() {
		if p := recover(); p != nil {
			fmt.Fprintf(stderr, "moebench: internal error: %v\n(please report this with the command line that caused it; MOEBENCH_DEBUG=1 adds a stack trace)\n", p)
			if os.Getenv("MOEBENCH_DEBUG") == "1" {
				stderr.Write(debug.Stack())
			}
			code = exitRuntime
		}
	}()
	if len(args) > 0 {
		name, rest := args[0], args[1:]
		if name == "--version" {
			name = "version"
		}
		if c, ok := commands[name]; ok {
			return c.run(rest, stdout, stderr)
		}
		if name == "run" {
			args = rest
		} else if !strings.HasPrefix(name, "-") {
			return usageError(stderr, fmt.Errorf("unknown command %q (commands: %s)", name, strings.Join(commandNames(), ", ")))
		}
	}
	return runLayer(args, stdout, stderr)
}

// runLayer is 'moebench [run]': one layer, its results printed and
// recorded; where a list flag holds several values, the sweep over them
// (sweepPoints).
func runLayer(args []string, stdout, stderr io.Writer) (code int) {
	var o options
	fs := newFlags(&o)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			usage(stdout, fs)
			return exitOK
		}
		return usageError(stderr, err)
	}
	if fs.NArg() > 0 {
		return usageError(stderr, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	warnAliases(args, stderr)
	if !o.lists.single() { // several points: the sweep over them
		return sweepPoints(fs, o, *o.lists, false, stdout, stderr)
	}
	useLibDirs(o.cudaLibs)
	cfg, err := o.config(fs)
	if err == nil {
		err = feplbOnly(fs, []string{o.dispatcher})
	}
	if err == nil {
		err = o.checkOutputs(stderr)
	}
	if err != nil {
		return usageError(stderr, err)
	}
	dev, note := resolveDevice(cfg.Device)
	cfg.Device = dev
	if dev == "host" {
		line := "running on the host device"
		if note != "" {
			line += " (" + note + ")"
		}
		if cfg.GPUs > 0 { // auto chose the host
			line += fmt.Sprintf("; --gpus %d does not apply", cfg.GPUs)
			cfg.GPUs = 0
		}
		fmt.Fprintf(stderr, "moebench: %s; host timings are not comparable with GPU timings\n", line)
		if a := hostAdvice(cfg); a != "" {
			fmt.Fprintf(stderr, "moebench: note: %s\n", a)
		}
	}
	rv, err := rendezvous(o, cfg)
	if err != nil {
		return usageError(stderr, err)
	}
	if rv != nil {
		defer rv.Close()
	}
	env := setup.Env{Version: version(), DeviceNote: note, Dump: o.dump, Progress: stderr, Rendezvous: rv}
	var writing atomic.Bool // the record is being written: a second signal waits for it
	// a run over several processes stops where every process agrees to
	// (docs/interrupts.md): all after the same step
	env.Interrupt = &setup.Interrupt{}
	defer catchSignals(env.Interrupt, &writing, rv != nil, stderr)()
	if why := env.ForwardOnlyReason(cfg); why != "" {
		fmt.Fprintf(stderr, "moebench: forward only: %s (add --forward-only to say so)\n", why)
	}
	defer limitMemory(env.HostBytes(cfg))()
	rec, err := harness.Run(cfg, env)
	var ce *setup.ConfigError
	if errors.As(err, &ce) {
		return usageError(stderr, err)
	}
	code = exitOK
	if err != nil {
		fmt.Fprintf(stderr, "moebench: %v\n", err)
		code = exitRuntime
	}
	if rec == nil {
		return exitRuntime
	}
	writing.Store(true)
	if rec.Interrupted != "" || setup.IsInterrupted(err) {
		code = exitInterrupted
	}
	if rv != nil && rv.L.Rank != 0 { // rank 0 writes the run's one record
		status := rec.Status
		if rec.Interrupted != "" {
			status += ", interrupted (" + rec.Interrupted + ")"
		}
		fmt.Fprintf(stderr, "moebench: process %d of %d (%s): %s; rank 0 writes the record\n", rv.L.Rank, rv.L.World, rv.L.Host, status)
		return code
	}
	if rec.Timing != nil && rec.Timing.Stopped != "" {
		fmt.Fprintf(stderr, "moebench: %s\n", rec.Timing.Stopped)
	}
	if werr := results.WriteWidth(stdout, rec, o.format, tableWidth(o.wide)); werr != nil {
		fmt.Fprintf(stderr, "moebench: writing output: %v\n", werr)
		code = exitRuntime
	}
	if o.out != "" {
		if aerr := appendRecord(o.out, rec, stderr); aerr != nil {
			fmt.Fprintf(stderr, "moebench: --out: %v\n", aerr)
			if code != exitInterrupted {
				code = exitRuntime
			}
		}
	}
	return code
}

// catchSignals makes SIGINT and SIGTERM stop the run through intr: it
// ends after the step it is in and its record, marked interrupted, is
// printed and appended — in a run over several processes (several), after
// the step the processes agree on, and rank 0 writes the record. A second
// signal quits at once (exit 130, no record) unless the record is being
// written. It returns what restores the signals' default.
func catchSignals(intr *setup.Interrupt, writing *atomic.Bool, several bool, stderr io.Writer) func() {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		for n := 0; ; n++ {
			var sig os.Signal
			select {
			case sig = <-ch:
			case <-done:
				return
			}
			name := signalName(sig)
			switch {
			case n == 0 && several:
				intr.Stop(name)
				fmt.Fprintf(stderr, "moebench: %s: stopping, with every other process of the run, after the step they agree on, to record what was measured (%s again to quit this process without a record: the others then stop within --comm-timeout, exit 1)\n", name, name)
			case n == 0:
				intr.Stop(name)
				fmt.Fprintf(stderr, "moebench: %s: stopping after the current step to record what was measured (%s again to quit without a record)\n", name, name)
			case writing.Load():
				fmt.Fprintf(stderr, "moebench: %s: writing the record; it ends in a moment\n", name)
			default:
				fmt.Fprintf(stderr, "moebench: %s again: quitting without a record\n", name)
				os.Exit(exitInterrupted)
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}

// signalName is SIGINT or SIGTERM.
func signalName(sig os.Signal) string {
	if sig == syscall.SIGTERM {
		return "SIGTERM"
	}
	return "SIGINT"
}

// hostAdvice is the advice for a layer slow on the host device, or "".
func hostAdvice(cfg setup.Config) string {
	fl := harness.HostFLOPs(cfg)
	if fl <= 50e9 {
		return ""
	}
	return fmt.Sprintf("%.0f GFLOP of expert GEMMs per step on the host device; expect minutes (reduce --tokens or --iters, add --forward-only, "+
		"or --check off to skip the check's untimed step and its float64 reference)", fl/1e9)
}

// rendezvous is the meeting of a run launched over several processes
// (internal/launch), or nil for a run of this process alone.
func rendezvous(o options, cfg setup.Config) (*launch.Rendezvous, error) {
	l, err := launch.Detect(os.Getenv)
	if err != nil || !l.Distributed() {
		if err == nil && o.rendezvous != "" {
			err = fmt.Errorf("--rendezvous=%s: applies to a run launched over several processes (srun, mpirun, torchrun, MOEBENCH_RANK/MOEBENCH_WORLD); none was detected", o.rendezvous)
		}
		return nil, err
	}
	if cfg.Device != "cuda" {
		return nil, fmt.Errorf("--device=%s: a run over %d processes (%s) needs the cuda device (the host device runs every rank in one process)", cfg.Device, l.World, l.Via)
	}
	if o.dump != "" {
		return nil, fmt.Errorf("--dump=%s: does not apply to a run over %d processes (%s): each process holds only its own ranks' tensors and gradients; dump a run of one process", o.dump, l.World, l.Via)
	}
	timeout := cfg.CommTimeout
	if timeout == 0 {
		timeout = dispatchers.DefaultCommTimeout
	}
	return launch.NewRendezvous(l, o.rendezvous, timeout, o.rendezvousTimeout)
}

// appendRecord appends rec to the results file at path and tells stderr
// when it first cut off an unfinished record a stopped run left there.
func appendRecord(path string, rec *results.Record, stderr io.Writer) error {
	dropped, err := results.Append(path, rec)
	if dropped > 0 {
		fmt.Fprintf(stderr, "moebench: --out %s: dropped the %d bytes of an unfinished record at its end (a run stopped while appending it)\n", path, dropped)
	}
	return err
}

// warnTo prints a reader's warnings to stderr.
func warnTo(stderr io.Writer) func(string) {
	return func(s string) { fmt.Fprintf(stderr, "moebench: warning: %s\n", s) }
}

// limitMemory bounds Go's heap to a run's estimated host memory (less what
// the estimate allows for the binary and its libraries), so that garbage
// is collected before the process outgrows the estimate the run was let in
// by; GOMEMLIMIT, when set, wins. It returns what restores the old bound.
func limitMemory(estimate int64) func() {
	if os.Getenv("GOMEMLIMIT") != "" {
		return func() {}
	}
	old := debug.SetMemoryLimit(estimate - 32<<20)
	return func() { debug.SetMemoryLimit(old) }
}

// resolveDevice turns auto into cuda or host and says why: cuda when the
// driver reports a GPU and the cuda device opens (device.ProbeCUDA), else
// host.
func resolveDevice(want string) (device, note string) {
	if want == "host" {
		return "host", "chosen with --device host"
	}
	drv, gpus, err := cuda.Probe()
	var found string
	switch {
	case err != nil:
		found = "no GPU: " + err.Error()
	case len(gpus) == 0:
		found = "no GPU: the CUDA driver reports none"
	default:
		found = fmt.Sprintf("%d GPU(s), %s, driver API %d.%d", len(gpus), gpus[0].Name, drv/1000, drv%1000/10)
	}
	if want == "cuda" {
		return "cuda", found
	}
	if len(gpus) == 0 {
		return "host", found
	}
	if err := kdevice.ProbeCUDA(); err != nil {
		return "host", found + "; but the cuda device does not open: " + err.Error()
	}
	return "cuda", found
}

// parseFlags parses a subcommand's arguments. On --help it prints help and
// the flags to stdout. ok is false when the command should stop with code.
func parseFlags(fs *pflag.FlagSet, args []string, help string, stdout, stderr io.Writer) (code int, ok bool) {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprint(stdout, help+"\n\nFlags:\n")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return exitOK, false
		}
		return usageError(stderr, err), false
	}
	return exitOK, true
}

func usageError(stderr io.Writer, err error) int {
	fmt.Fprintf(stderr, "moebench: %v\nRun 'moebench --help' for usage.\n", err)
	return exitUsage
}

func presets(w io.Writer) int {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "preset\thidden\tffn\texperts\ttopk\tshared\tscore\tgroups\ttopk_scale\ttokens/rank\t")
	for _, p := range setup.Presets {
		g := "-"
		if p.Groups > 1 {
			g = fmt.Sprintf("%d/top-%d", p.Groups, p.GroupTopK)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%g\t%d\t\n", p.Name, p.Hidden, p.FFN, p.Experts, p.TopK,
			p.SharedExperts, p.Score, g, p.TopKScale, p.Tokens)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, p := range setup.Presets {
		fmt.Fprintf(w, "%-16s %s\n", p.Name, p.About)
	}
	return exitOK
}

func version() string {
	v := baseVersion
	if c := setup.BuildCommit(); len(c) >= 12 {
		v += "+" + c[:12]
		if strings.HasSuffix(c, "+dirty") {
			v += "-dirty"
		}
	}
	return v
}
