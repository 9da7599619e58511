package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/advise"
	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

const adviseHelp = `moebench advise answers "which dispatcher, and how many SMs, for my model on
this node?" by measuring it, within a time budget (--budget):

  1. the availability gate of every design and implementation (native and
     library): what cannot run here, and why, as a table;
  2. for each SM-driven design (deepep, hybridep), its SM budget: a coarse
     then a finer search over --sms with bench dispatch, confirmed with the
     full layer step at the best two budgets (the SMs given to
     communication are taken from the GEMMs);
  3. the finalists' training steps, interleaved and repeated until compare's
     test (Hodges–Lehmann on log step times, 99% interval, 2% threshold)
     separates the two fastest, or the budget or --rounds ends.

The answer (text, Markdown, HTML or JSON): the fastest correct configuration,
the runner-up with the difference and its confidence interval, or "no
significant difference"; memory per rank and the SMs left for compute of each;
the smallest SM budget within 2% of the best; the static advice of NeMo
Megatron-Bridge's dispatcher selection guide for this GPU and model family
beside it, with a sentence where they disagree; and the one-line command that
reproduces the winner. The records it measured go to --out, for 'moebench
report' and 'moebench compare'.

On the host device advise runs end to end but its times do not predict GPU
performance (it says so first and last): unless --tokens, --hidden or --ffn are
given, the layer is scaled down (64 tokens per rank, hidden and FFN ÷ 16, at
fp8 the hidden rounded up to a multiple of 512 as HybridEP's FP8 dispatch
needs, the experts and top-k kept) and each measurement runs few steps, so that
it finishes in minutes on CPUs; and compare's test decides host times only on a
gross difference (above 400%).

Usage:
  moebench advise --preset MODEL [--ep N] [shape flags] [flags]

Writes into --out (a new or empty folder; default ./moebench-advise-STAMP):
  records.jsonl  every record measured     answer.txt, answer.md, answer.html,
  report.html    report's page of them     answer.json  the answer

Exit status: 0 an answer; 1 no design ran correctly, or an output could not
be written; 2 bad command line; 130 interrupted (the answer from what was
measured is still written).`

// adviseArgs are advise's own flags.
type adviseArgs struct {
	designs       []string
	budget        time.Duration
	rounds        int
	format, out   string
	history       string
	threshold     float64
	confidencePct float64
	hostGross     float64
}

// Bounds of advise's own flags.
const (
	minBudget = 10 * time.Second
	maxBudget = 24 * time.Hour
	maxRounds = 100
)

// adviseFlags defines advise's flags.
func adviseFlags(o *options, a *adviseArgs) *pflag.FlagSet {
	d := setup.DefaultConfig()
	fs := pflag.NewFlagSet("moebench advise", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&o.preset, "preset", "qwen3-30b-a3b", "layer shape preset (see 'moebench presets'); the shape flags override it")
	addShapeFlags(fs, o)
	fs.IntVar(&o.ep, "ep", d.EP, "expert-parallel ranks; must divide --experts")
	fs.IntVar(&o.gpus, "gpus", d.GPUs, "cuda: GPUs the ranks are spread over; 0 = every GPU, at most one per rank")
	fs.IntVar(&o.domain, "domain", d.Domain, "ranks per NVLink domain (hybridep, feplb); 0 = all ranks")
	fs.StringVar(&o.routing, "routing", d.Routing.String(), "routing: balanced|uniform|skewed:ALPHA|trace:FILE|natural")
	fs.Uint64Var(&o.seed, "seed", d.Seed, "seed of every random draw (inputs, weights, routing)")
	fs.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "dispatchers" { // run's and sweep's deprecated plural, accepted alike
			name = "dispatcher"
		}
		return pflag.NormalizedName(name)
	})
	fs.StringSliceVar(&a.designs, "dispatcher", nil, "the designs to gate and measure, comma-separated (default: all: "+strings.Join(dispatchers.Names(), ",")+"); each with both implementations"+aliasNote("dispatcher"))
	fs.StringVar(&o.precision, "precision", d.Precision, "the dispatch and expert precision every design runs at: bf16 | fp8 | mxfp8 (as run's --precision; see docs/fp8.md)")
	fs.DurationVar(&a.budget, "budget", 10*time.Minute, "the `duration` the whole advice may take (10s to 24h); measuring stops when it ends and the answer says what it could decide")
	fs.IntVar(&a.rounds, "rounds", 0, fmt.Sprintf("most rounds of the finalists' interleaved training steps (1 to %d); 0 = the device's default: host %d, cuda %d",
		maxRounds, advise.DefaultSteps("host").Rounds, advise.DefaultSteps("cuda").Rounds))
	fs.Float64Var(&a.threshold, "threshold-pct", 100*results.DefaultCompareOptions.Threshold, "compare's threshold: a difference below it, in percent, is no difference (0 to 100, exclusive)")
	fs.Float64Var(&a.confidencePct, "confidence-pct", 100*results.DefaultCompareOptions.Confidence, "confidence of the difference's interval, in percent (50 to 100, exclusive)")
	fs.Float64Var(&a.hostGross, "host-gross-pct", 100*results.DefaultCompareOptions.HostGross, "host device: the difference, in percent, whose whole interval must lie above it to separate host times (compare's; above --threshold-pct, below 1e6)")
	o.check, o.checkAll = d.Check, d.CheckAll
	fs.Var(checkValue{&o.check, &o.checkAll}, "check", "check every finalist (and each confirmed budget) against the float64 reference before it is timed: sample | all | off (a design that fails is never the answer)")
	addTimeoutFlags(fs, o) // advise runs the library implementations too
	fs.StringVar(&o.device, "device", d.Device, "device: auto (cuda if a driver and GPU are found, else host) | host | cuda")
	addLibFlag(fs, &o.cudaLibs)
	fs.StringVar(&a.out, "out", "", "folder for the records and the answer: new, or empty (default: ./moebench-advise-STAMP, a new one)")
	fs.StringVar(&a.format, "format", "text", "the answer on stdout: "+strings.Join(advise.Formats, " | "))
	fs.StringVar(&a.history, "history", "", "append the answer to this history file (JSON lines) and say when the winner differs from the last answer there to the same question (scripts/nightly.sh)")
	return fs
}

// fp8HostHidden: at a precision below bf16 the host's scaled hidden is a
// multiple of it (HybridEP's FP8 dispatch: hidden % 512 == 0).
const fp8HostHidden = 512

// hostScale shrinks a real model's layer for the host device: tokens,
// hidden and FFN (those not given on the command line), the experts, top-k
// and routing kept. It returns the note the answer gives, "" when nothing
// was scaled.
func hostScale(fs *pflag.FlagSet, c *setup.Config) string {
	var parts []string
	scale := func(flag string, v *int, to int) {
		if fs.Changed(flag) || *v <= to {
			return
		}
		parts = append(parts, fmt.Sprintf("%s %d (not %d)", flag, to, *v))
		*v = to
	}
	scale("tokens", &c.Tokens, 64)
	hidden := max(32, c.Hidden/16/8*8)
	if c.Precision != "" && c.Precision != setup.PrecisionBF16 {
		// fp8 quantizes rows in blocks of 128 and HybridEP's FP8 dispatch
		// needs hidden % 512 == 0: round up so that the scaled layer is
		// valid and hybridep stays in (the user gave no --hidden to blame)
		hidden = (hidden + fp8HostHidden - 1) / fp8HostHidden * fp8HostHidden
	}
	scale("hidden", &c.Hidden, hidden)
	scale("ffn", &c.FFN, max(16, c.FFN/16/8*8))
	if len(parts) == 0 {
		return ""
	}
	if !strings.HasSuffix(c.Preset, "+custom") {
		c.Preset += "+custom"
	}
	return "host device: the layer scaled to " + strings.Join(parts, ", ") + " per rank, experts and top-k kept, so that advise finishes in minutes on CPUs; give --tokens, --hidden or --ffn to choose"
}

// checkOutDir refuses an --out that is not a new or empty folder.
func checkOutDir(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return &setup.ConfigError{Flag: "out", Value: dir, Allowed: "must be a new or empty folder: " + err.Error()}
	case len(entries) > 0:
		return &setup.ConfigError{Flag: "out", Value: dir, Allowed: fmt.Sprintf("holds %d entries; advise writes only into a new or empty folder (it replaces no file)", len(entries))}
	}
	return nil
}

// defaultOutDir is ./moebench-advise-STAMP, one that does not exist yet.
func defaultOutDir(now time.Time) string {
	base := "moebench-advise-" + now.UTC().Format("20060102T150405Z")
	dir := base
	for n := 1; ; n++ {
		if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
			return dir
		}
		dir = fmt.Sprintf("%s-%d", base, n)
	}
}

func adviseCmd(args []string, stdout, stderr io.Writer) int {
	var o options
	var a adviseArgs
	fs := adviseFlags(&o, &a)
	if code, ok := parseFlags(fs, args, adviseHelp, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(stderr, fmt.Errorf("advise: unexpected argument %q", fs.Arg(0)))
	}
	useLibDirs(o.cudaLibs)
	warnAliases(args, stderr)
	if err := a.check(fs); err != nil {
		return usageError(stderr, err)
	}
	d := setup.DefaultConfig()
	o.dispatcher, o.impl, o.feplbBase, o.feplbDyn, o.feplbPolicy = d.Dispatcher, d.Impl, d.FeplbBase, d.FeplbDyn, d.FeplbPolicy
	o.warmup, o.iters = d.Warmup, d.Iters
	cfg, err := o.config(fs)
	if err != nil {
		return usageError(stderr, err)
	}
	if a.out == "" {
		a.out = defaultOutDir(time.Now())
	} else if err := checkOutDir(a.out); err != nil {
		return usageError(stderr, err)
	}
	if a.history != "" {
		if err := advise.CheckHistory(a.history); err != nil {
			return usageError(stderr, &setup.ConfigError{Flag: "history", Value: a.history, Allowed: err.Error()})
		}
	}
	dev, note := resolveDevice(cfg.Device)
	cfg.Device = dev
	scaled := ""
	if dev == "host" {
		cfg.GPUs = 0
		scaled = hostScale(fs, &cfg)
		if err := cfg.Validate(); err != nil {
			return usageError(stderr, err)
		}
		fmt.Fprintf(stderr, "moebench advise: %s\n", advise.HostWarning)
		fmt.Fprintf(stderr, "moebench advise: on the host device (%s)\n", note)
		if scaled != "" {
			fmt.Fprintf(stderr, "moebench advise: %s\n", scaled)
		}
	}
	if err := os.MkdirAll(a.out, 0o755); err != nil {
		return usageError(stderr, &setup.ConfigError{Flag: "out", Value: a.out, Allowed: err.Error()})
	}
	recFile := filepath.Join(a.out, "records.jsonl")
	fmt.Fprintf(stderr, "moebench advise: %s at EP %d on the %s device, budget %v → %s\n", cfg.Preset, cfg.EP, dev, a.budget, a.out)

	env := setup.Env{Version: version(), DeviceNote: note, Interrupt: &setup.Interrupt{}}
	var writing atomic.Bool
	defer catchSignals(env.Interrupt, &writing, false, stderr)()
	defer limitMemory(env.HostBytes(cfg))()
	var recs []results.Record
	co := results.DefaultCompareOptions
	co.Threshold, co.Confidence, co.HostGross = a.threshold/100, a.confidencePct/100, a.hostGross/100
	ans, err := advise.Advise(advise.Options{Base: cfg, Env: env, Designs: a.designs, Budget: a.budget, Rounds: a.rounds, Compare: co, Progress: stderr,
		Command: "moebench advise " + strings.Join(args, " "), Scaled: scaled,
		Record: func(r *results.Record) error {
			writing.Store(true)
			defer writing.Store(false)
			recs = append(recs, *r)
			return appendRecord(recFile, r, stderr)
		}})
	writing.Store(true)
	code := exitOK
	if err != nil {
		fmt.Fprintf(stderr, "moebench advise: %v\n", err)
		code = exitRuntime
	}
	if ans == nil {
		return exitRuntime
	}
	if env.Interrupt.Why() != "" {
		code = exitInterrupted
	}
	if werr := writeAnswer(a.out, ans, recs); werr != nil {
		fmt.Fprintf(stderr, "moebench advise: --out %s: %v\n", a.out, werr)
		code = exitRuntime
	}
	if !a.writeAnswer(ans, recs, stdout, stderr) {
		code = exitRuntime
	}
	fmt.Fprintf(stderr, "moebench advise: answer and records in %s\n", a.out)
	if dev == "host" {
		fmt.Fprintf(stderr, "moebench advise: %s\n", advise.HostWarning)
	}
	return code
}

// check checks advise's own flags' values.
func (a *adviseArgs) check(fs *pflag.FlagSet) error {
	switch {
	case a.budget < minBudget || a.budget > maxBudget:
		return &setup.ConfigError{Flag: "budget", Value: a.budget, Allowed: "must be in [10s, 24h]"}
	case a.rounds < 0 || a.rounds > maxRounds:
		return &setup.ConfigError{Flag: "rounds", Value: a.rounds, Allowed: fmt.Sprintf("must be in [0, %d] (0 = the device's default)", maxRounds)}
	case !(a.threshold > 0 && a.threshold < 100):
		return &setup.ConfigError{Flag: "threshold-pct", Value: a.threshold, Allowed: "must be in (0, 100)"}
	case !(a.confidencePct > 50 && a.confidencePct < 100):
		return &setup.ConfigError{Flag: "confidence-pct", Value: a.confidencePct, Allowed: "must be in (50, 100)"}
	case !(a.hostGross > a.threshold && a.hostGross < 1e6):
		return &setup.ConfigError{Flag: "host-gross-pct", Value: a.hostGross, Allowed: fmt.Sprintf("must be above --threshold-pct (%g) and below 1e6", a.threshold)}
	case fs.Changed("dispatcher"):
		if err := checkDispatchers(a.designs); err != nil {
			return err
		}
	}
	if !isFormat(a.format) {
		return &setup.ConfigError{Flag: "format", Value: a.format, Allowed: "allowed: " + strings.Join(advise.Formats, ", ")}
	}
	return nil
}

// writeAnswer prints the answer on stdout and appends it to --history
// (saying whether the winner changed); false when either failed.
func (a *adviseArgs) writeAnswer(ans *advise.Answer, recs []results.Record, stdout, stderr io.Writer) bool {
	ok := true
	if err := advise.Write(stdout, ans, a.format, recs); err != nil {
		fmt.Fprintf(stderr, "moebench advise: writing the answer: %v\n", err)
		ok = false
	}
	if a.history != "" {
		change, herr := advise.AppendHistory(a.history, ans, a.out)
		switch {
		case herr != nil:
			fmt.Fprintf(stderr, "moebench advise: --history %s: %v\n", a.history, herr)
			ok = false
		case change != "":
			fmt.Fprintf(stderr, "moebench advise: history: %s\n", change)
		default:
			fmt.Fprintf(stderr, "moebench advise: history: appended to %s; the winner is the same as last time (or this is the first answer to this question)\n", a.history)
		}
	}
	return ok
}

func isFormat(f string) bool {
	for _, x := range advise.Formats {
		if x == f {
			return true
		}
	}
	return false
}

// writeAnswer writes the answer in every format, and report's page of the
// records, into dir (new files: the folder was new or empty).
func writeAnswer(dir string, ans *advise.Answer, recs []results.Record) error {
	var errs []error
	for _, f := range []struct{ name, format string }{{"answer.txt", "text"}, {"answer.md", "markdown"}, {"answer.html", "html"}, {"answer.json", "json"}} {
		var b bytes.Buffer
		if err := advise.Write(&b, ans, f.format, recs); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, writeNew(filepath.Join(dir, f.name), b.Bytes()))
	}
	if len(recs) > 0 {
		var b bytes.Buffer
		err := results.WriteReport(&b, results.BuildReport(recs), "html", "moebench advise: the records measured for "+ans.Preset)
		if err == nil {
			err = writeNew(filepath.Join(dir, advise.ReportFile), b.Bytes())
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// writeNew writes a file that must not exist yet.
func writeNew(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
