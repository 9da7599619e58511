package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/internal/launch"
	"github.com/moebench/moebench/results"
)

// options holds the parsed flags.
type options struct {
	preset, dispatcher, impl, score, routing, device, out, format, dump string
	feplbBase, feplbPolicy, cudaLibs, rendezvous, hostExperts           string
	precision                                                           string
	overlap                                                             string  // --overlap (overlap.go)
	delayWgrad                                                          bool    // --delay-wgrad
	attentionMS                                                         float64 // --attention-ms
	domain, feplbDyn                                                    int
	tokens, hidden, ffn, experts, topk, shared, groups, groupTopK       int
	sms, ep, gpus, warmup, iters                                        int
	preprocessSMs, permuteSMs                                           int
	topkScale, maxSeconds                                               float64
	commTimeout, ncclepTimeout, watchdogTimeout, rendezvousTimeout      time.Duration
	seed                                                                uint64
	check, preSoftmax, routingFixed, cudaGraph, forwardOnly             bool
	wide                                                                bool // --wide: every column of the table
	checkAll                                                            bool // --check all
	// lists are the list flags' values (addPointFlags), nil where the
	// command's flags are single values (bench) or a point's are set
	lists *sweepOptions
}

// checkValue is --check: sample | all | off (true and false, the flag's
// older values, are sample and off). It sets the check and whether it
// compares every token.
type checkValue struct{ on, all *bool }

// checkValues are --check's values.
var checkValues = []string{"sample", "all", "off"}

func (v checkValue) String() string {
	switch {
	case v.on == nil || !*v.on:
		return "off"
	case *v.all:
		return "all"
	}
	return "sample"
}

func (v checkValue) Set(s string) error {
	switch s {
	case "sample", "true":
		*v.on, *v.all = true, false
	case "all":
		*v.on, *v.all = true, true
	case "off", "false":
		*v.on, *v.all = false, false
	default:
		return fmt.Errorf("allowed: %s (true and false: sample and off)", strings.Join(checkValues, ", "))
	}
	return nil
}

func (checkValue) Type() string { return "string" }

func newFlags(o *options) *pflag.FlagSet {
	d := setup.DefaultConfig()
	fs := pflag.NewFlagSet("moebench", pflag.ContinueOnError)
	fs.SortFlags = false
	addPointFlags(fs, o, &sweepOptions{})
	fs.StringVar(&o.hostExperts, "host-experts", setup.HostExpertsAuto, "host device: how the layer holds the experts' weights and fp32 weight gradients: "+
		"auto (the first of the others that fits in the available memory) | held (all, the whole run) | grads-by-rank (all weights; each rank's weight gradients "+
		"until its expert backward ends, checked there, then released) | drawn (weights drawn from the seed each time an expert's rows are computed, slower; gradients by rank)")
	fs.BoolVar(&o.cudaGraph, "cuda-graph", d.CUDAGraph, "cuda: issue each step as CUDA graphs (stream capture), cut at the dispatcher's host wait, each part replayed while its shapes repeat (alltoall native)")
	fs.StringVar(&o.out, "out", "", "append the JSON result record to this file (one line per run)")
	fs.StringVar(&o.format, "format", "table", "output format: "+strings.Join(results.Formats, "|"))
	fs.BoolVar(&o.wide, "wide", false, wideHelp)
	fs.StringVar(&o.dump, "dump", "", "write the layer's tensors as .npy files with an index.json to this new directory (a run of one process)")
	return fs
}

// addPointFlags defines the flags of a layer's points, the same for run
// and sweep: the list flags, which make one point per combination of their
// values (a run over more than one point is the sweep over them), with
// sweep's older plural names as deprecated aliases; feplb's, the shape's
// and the control flags.
func addPointFlags(fs *pflag.FlagSet, o *options, so *sweepOptions) {
	d := setup.DefaultConfig()
	o.lists = so
	fs.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if singular, ok := pluralAliases[name]; ok {
			return pflag.NormalizedName(singular)
		}
		return pflag.NormalizedName(name)
	})
	so.dispatchers, so.impls, so.sms, so.ep, so.gpus = []string{d.Dispatcher}, []string{d.Impl}, []int{d.SMs}, []int{d.EP}, []int{d.GPUs}
	so.presets, so.routings, so.precisions = []string{d.Preset}, []string{d.Routing.String()}, []string{d.Precision}
	fs.Var(strList{&so.dispatchers}, "dispatcher", "token dispatchers, comma-separated: "+strings.Join(dispatchers.Names(), "|")+aliasNote("dispatcher"))
	fs.Var(strList{&so.impls}, "impl", "implementations: native (moebench's own) | library (a real library on the node, one GPU per rank: alltoall through NCCL; "+
		"hybridep and deepep-ll through NCCL EP, its high-throughput and low-latency modes; deepep, DeepEP's normal mode, has none reachable from Go)"+aliasNote("impl"))
	fs.Var(intList{&so.sms}, "sms", "SMs per rank of SM-driven dispatchers' transfer kernels (one block holds one SM; at most the GPU's SMs ÷ its ranks): deepep (even; default 20), hybridep (default 16), "+
		"each default lowered to fit; with --impl library NCCL EP's max_num_sms; 0 = the dispatcher's (the library's) default; the other dispatchers run once, with 0")
	fs.IntVar(&o.preprocessSMs, "preprocess-sms", d.PreprocessSMs, "hybridep (cuda): blocks per rank of its preprocessing's own launches (HybridEP's num_sms_preprocessing_api); 0 = HybridEP's 108, lowered to the GPU's SMs ÷ its ranks")
	fs.IntVar(&o.permuteSMs, "permute-sms", d.PermuteSMs, "hybridep (cuda): blocks per rank of its permute's own launch (HybridEP's num_blocks_permute); 0 = the GPU's SMs ÷ its ranks")
	fs.Var(intList{&so.ep}, "ep", "expert-parallel ranks; each must divide --experts")
	fs.Var(intList{&so.gpus}, "gpus", "cuda: GPUs the ranks are spread over; 0 = every GPU, at most one per rank (more ranks than GPUs: packed, emulated EP; a count above a point's EP size is left out)")
	addFeplbFlags(fs, o)
	fs.Var(strList{&so.presets}, "preset", "layer shape presets (see 'moebench presets'); shape flags below override their fields"+aliasNote("preset"))
	addShapeFlags(fs, o)
	fs.Var(strList{&so.routings}, "routing", "routings: balanced|uniform|skewed:ALPHA|trace:FILE|natural"+aliasNote("routing"))
	fs.Var(strList{&so.precisions}, "precision", precisionHelp+aliasNote("precision"))
	addControlFlags(fs, o)
}

// precisionHelp is --precision's help.
const precisionHelp = "dispatch and expert precisions: bf16 | fp8 (Hopper's blockwise recipe: e4m3 rows with one fp32 scale " +
	"per 1×128 block sent by the dispatch, expert weights in 128×128 blocks, combine bf16; --hidden a multiple of 128) | mxfp8 (e4m3, one e8m0 scale per 32; " +
	"unavailable in this build); see docs/fp8.md"

// strList and intList are list flags (comma-separated values, one point
// each) whose every use sets the whole list, as a repeated single-valued
// flag sets its value: --ep 4 --ep 16 is 16, --ep 4,16 both. Their types
// are pflag's list types' names (checkBounds, the sweep file and --help
// read them so).
type (
	strList struct{ v *[]string }
	intList struct{ v *[]int }
)

func (l strList) Set(s string) error {
	*l.v = nil
	if s == "" {
		return nil
	}
	*l.v = strings.Split(s, ",")
	for i, v := range *l.v {
		(*l.v)[i] = strings.TrimSpace(v)
	}
	return nil
}

func (l strList) String() string { return "[" + strings.Join(*l.v, ",") + "]" }
func (strList) Type() string     { return "stringSlice" }

func (l intList) Set(s string) error {
	var vals []int
	if s == "" {
		*l.v = nil
		return nil
	}
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return err
		}
		vals = append(vals, n)
	}
	*l.v = vals
	return nil
}

func (l intList) String() string {
	parts := make([]string, len(*l.v))
	for i, n := range *l.v {
		parts[i] = strconv.Itoa(n)
	}
	return "[" + strings.Join(parts, ",") + "]"
}
func (intList) Type() string { return "intSlice" }

// pluralAliases are sweep's older names of its list flags, aliases of the
// singular names run and sweep share, deprecated: kept for one release.
var pluralAliases = map[string]string{"dispatchers": "dispatcher", "impls": "impl", "presets": "preset", "routings": "routing", "precisions": "precision"}

// aliasNote is the help's note of flag's deprecated plural alias.
func aliasNote(flag string) string {
	return fmt.Sprintf("; --%ss: alias of --%s, kept for one release (deprecated)", flag, flag)
}

// warnAliases tells stderr of each deprecated plural alias in args.
func warnAliases(args []string, stderr io.Writer) {
	for _, a := range args {
		if a == "--" {
			return
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if singular, ok := pluralAliases[name]; ok && strings.HasPrefix(a, "--") {
			fmt.Fprintf(stderr, "moebench: warning: %s\n", aliasWarning(name, singular))
		}
	}
}

// aliasWarning says that the alias plural of singular is deprecated.
func aliasWarning(plural, singular string) string {
	return fmt.Sprintf("--%s is deprecated: an alias of --%s, kept for one release", plural, singular)
}

// fromLists sets the single values of a run from its list flags, each of
// which must then hold one value (a run over several points is a sweep).
func (o *options) fromLists() error {
	l := o.lists
	strs := []struct {
		flag string
		v    []string
		dst  *string
	}{{"dispatcher", l.dispatchers, &o.dispatcher}, {"impl", l.impls, &o.impl}, {"preset", l.presets, &o.preset}, {"routing", l.routings, &o.routing},
		{"precision", l.precisions, &o.precision}}
	for _, s := range strs {
		if len(s.v) != 1 {
			return &setup.ConfigError{Flag: s.flag, Value: strings.Join(s.v, ","), Allowed: "one value here (a list of several is a sweep's)"}
		}
		*s.dst = s.v[0]
	}
	ints := []struct {
		flag string
		v    []int
		dst  *int
	}{{"sms", l.sms, &o.sms}, {"ep", l.ep, &o.ep}, {"gpus", l.gpus, &o.gpus}}
	for _, s := range ints {
		if len(s.v) != 1 {
			return &setup.ConfigError{Flag: s.flag, Value: s.v, Allowed: "one value here (a list of several is a sweep's)"}
		}
		*s.dst = s.v[0]
	}
	return nil
}

// addFeplbFlags defines the NVLink domain and feplb's options.
func addFeplbFlags(fs *pflag.FlagSet, o *options) {
	d := setup.DefaultConfig()
	fs.IntVar(&o.domain, "domain", d.Domain, "ranks per NVLink domain: feplb moves work only inside one, hybridep links them through its inter-domain path (NCCL; across processes each domain lies in one); 0 = all ranks")
	fs.StringVar(&o.feplbBase, "feplb-base", d.FeplbBase, "feplb: the dispatcher of phase 1")
	fs.IntVar(&o.feplbDyn, "feplb-dynamic", d.FeplbDyn, "feplb: dynamic experts per rank (its most loaded; the paper's dyn); 0: fitted to the layer, the paper's 4 or a rank's experts less one")
	fs.StringVar(&o.feplbPolicy, "feplb-policy", d.FeplbPolicy, "feplb: the scheduler: feplb (the paper's: whole dynamic experts move) | feplb-split (moebench's: chunks of them)")
}

// addShapeFlags defines the flags that override a preset's shape.
func addShapeFlags(fs *pflag.FlagSet, o *options) {
	fs.IntVar(&o.tokens, "tokens", 0, "tokens per rank (default: the preset's)")
	fs.IntVar(&o.hidden, "hidden", 0, "hidden size (default: the preset's)")
	fs.IntVar(&o.ffn, "ffn", 0, "per-expert intermediate size (default: the preset's)")
	fs.IntVar(&o.experts, "experts", 0, "routed experts (default: the preset's)")
	fs.IntVar(&o.topk, "topk", 0, "experts per token (default: the preset's)")
	fs.IntVar(&o.shared, "shared-experts", 0, "shared experts, each of --ffn size (default: the preset's)")
	fs.StringVar(&o.score, "score", "", "router score function: softmax|sigmoid (default: the preset's)")
	fs.IntVar(&o.groups, "groups", 0, "expert groups for group-limited routing, 0 = off (default: the preset's)")
	fs.IntVar(&o.groupTopK, "topk-groups", 0, "groups each token may use (default: the preset's)")
	fs.Float64Var(&o.topkScale, "topk-scale", 0, "scaling factor applied to the routing probabilities (default: the preset's)")
	fs.BoolVar(&o.preSoftmax, "pre-softmax", false, "softmax routers: softmax over all experts before the top-k, not renormalised (Megatron's; needed for --topk 1)")
}

// addControlFlags defines the flags that control how a layer is run.
func addControlFlags(fs *pflag.FlagSet, o *options) {
	d := setup.DefaultConfig()
	fs.Uint64Var(&o.seed, "seed", d.Seed, "seed of every random draw (inputs, weights, routing)")
	fs.BoolVar(&o.routingFixed, "routing-fixed", d.RoutingFixed, "replay the first iteration's routing every iteration (default: each iteration draws its own, seeded by the step)")
	fs.IntVar(&o.warmup, "warmup", d.Warmup, "untimed iterations before timing")
	fs.IntVar(&o.iters, "iters", d.Iters, fmt.Sprintf("timed iterations (at most %d)", setup.MaxIters))
	fs.Float64Var(&o.maxSeconds, "max-seconds", 0, "time budget of the warm-up and timed iterations: past it the run stops after the current iteration and records what it timed (at least one iteration); 0 = none")
	fs.BoolVar(&o.forwardOnly, "forward-only", d.ForwardOnly, "time the forward pass alone (default: every iteration is a training step, forward then backward, and the check covers every gradient; on the cuda device NCCL EP's low-latency mode, deepep-ll --impl library, has no backward and times the forward only, and the record says why)")
	o.check, o.checkAll = d.Check, d.CheckAll
	fs.Var(checkValue{&o.check, &o.checkAll}, "check", "check the output (and in a training step every gradient) against the float64 reference before the timed steps: "+
		"sample (where every token's reference is beyond the check's budget, a seeded sample of tokens per rank, the record says which) | all (every token) | off")
	addTimeoutFlags(fs, o)
	fs.StringVar(&o.rendezvous, "rendezvous", "", "a run over several processes (srun, mpirun, torchrun, MOEBENCH_RANK/MOEBENCH_WORLD): a file on a filesystem every node sees, where rank 0 writes NCCL's unique id and the processes watch each other; not needed with NCCL_COMM_ID=host:port, but without it a process that fails or never arrives is named only in a run of two processes")
	fs.DurationVar(&o.rendezvousTimeout, "rendezvous-timeout", launch.DefaultWait, "a run over several processes with --rendezvous: the longest time `dt` (a duration, 1s to 1h) a process waits at the start for the others to arrive, each giving the others its settings, which must be the same; one that never arrives is named")
	fs.StringVar(&o.device, "device", d.Device, "device: auto (cuda if a driver and GPU are found, else host) | host | cuda")
	addLibFlag(fs, &o.cudaLibs)
	addOverlapFlags(fs, o)
}

// addTimeoutFlags defines the bounds of cross-rank waits: moebench's own,
// NCCL EP's and the GPU threads' watchdog (run's, sweep's and advise's).
func addTimeoutFlags(fs *pflag.FlagSet, o *options) {
	d := setup.DefaultConfig()
	fs.DurationVar(&o.commTimeout, "comm-timeout", d.CommTimeout, "the longest one of moebench's own waits for another rank may take before the run fails naming it, in [1ms, 1h]: "+
		"a native SM-driven dispatcher's waits on the GPU (deepep, hybridep: a flag, a queue's head or tail, a counter the host polls; the error names the rank, phase and wait), "+
		"and in a run over several processes a process's wait for the others while none moves on (0 = 5s)")
	fs.DurationVar(&o.ncclepTimeout, "ncclep-timeout", d.NCCLEPTimeout, "--impl library of hybridep and deepep-ll: NCCL EP's timeout_ns, the library's bound on its kernels' waits for other ranks "+
		"(past it they trap and the run fails naming the last library call), in [1ms, 1h]; NCCL_EP_TIMEOUT_MS, when set, overrides it (0 = 5s)")
	fs.DurationVar(&o.watchdogTimeout, "watchdog-timeout", d.WatchdogTimeout, "cuda: the longest one call on a GPU's thread (a phase of a step, a library call) may take once the first step has run, "+
		"past which the run stops naming the GPUs whose thread has not returned (before it, the setup and the first steps, which compile the kernels, may take 10m); "+
		"0 = 6 × the longer of --comm-timeout and --ncclep-timeout, at least 30s; else in [1s, 24h] and above both")
}

// addLibFlag defines --cuda-libs; useLibDirs applies it.
func addLibFlag(fs *pflag.FlagSet, dirs *string) {
	fs.StringVar(dirs, "cuda-libs", "", "folders (a :-separated list) searched first for the CUDA libraries (sets "+cuda.LibDirsEnv+")")
}

// useLibDirs makes the CUDA library search start in dirs, when given.
func useLibDirs(dirs string) {
	if dirs != "" {
		os.Setenv(cuda.LibDirsEnv, dirs)
	}
}

// config builds the run configuration: the preset, overridden by the shape
// flags given explicitly.
func (o *options) config(fs *pflag.FlagSet) (setup.Config, error) {
	c := setup.DefaultConfig()
	if err := checkBounds(fs, flagBounds); err != nil {
		return c, err
	}
	if o.lists != nil {
		if err := o.fromLists(); err != nil {
			return c, err
		}
	}
	p, ok := setup.LookupPreset(o.preset)
	if !ok {
		return c, &setup.ConfigError{Flag: "preset", Value: o.preset, Allowed: "allowed: " + strings.Join(setup.PresetNames(), ", ")}
	}
	c.Preset, c.Shape = p.Name, p.Shape
	ints := []struct {
		flag string
		dst  *int
		v    int
	}{{"tokens", &c.Tokens, o.tokens}, {"hidden", &c.Hidden, o.hidden}, {"ffn", &c.FFN, o.ffn},
		{"experts", &c.Experts, o.experts}, {"topk", &c.TopK, o.topk}, {"shared-experts", &c.SharedExperts, o.shared},
		{"groups", &c.Groups, o.groups}, {"topk-groups", &c.GroupTopK, o.groupTopK}}
	custom := false
	for _, f := range ints {
		if fs.Changed(f.flag) {
			*f.dst, custom = f.v, true
		}
	}
	if fs.Changed("groups") && o.groups <= 1 && !fs.Changed("topk-groups") {
		c.GroupTopK = 0 // turning group limits off clears the preset's group top-k
	}
	if fs.Changed("score") {
		c.Score, custom = o.score, true
	}
	if fs.Changed("topk-scale") {
		c.TopKScale, custom = o.topkScale, true
	}
	if o.preSoftmax {
		c.PreSoftmax, custom = true, true
	}
	if custom {
		c.Preset += "+custom"
	}
	if !slices.Contains(dispatchers.Names(), o.dispatcher) {
		return c, &setup.ConfigError{Flag: "dispatcher", Value: o.dispatcher, Allowed: "allowed: " + strings.Join(dispatchers.Names(), ", ")}
	}
	r, err := setup.ParseRouting(o.routing)
	if err != nil {
		return c, err
	}
	c.Dispatcher, c.Impl, c.SMs, c.EP, c.GPUs = o.dispatcher, o.impl, o.sms, o.ep, o.gpus
	if _, smDriven := dispatchers.SMBudgetOf(c.Dispatcher, c.Impl); !smDriven {
		c.SMs = 0 // as the help says, and as a sweep's point of such a dispatcher is
	}
	c.PreprocessSMs, c.PermuteSMs = o.preprocessSMs, o.permuteSMs
	c.Domain, c.FeplbBase, c.FeplbDyn, c.FeplbPolicy, c.CommTimeout = o.domain, o.feplbBase, o.feplbDyn, o.feplbPolicy, o.commTimeout
	c.Routing, c.RoutingFixed, c.Seed, c.Warmup, c.Iters, c.Check, c.Device = r, o.routingFixed, o.seed, o.warmup, o.iters, o.check, o.device
	c.CheckAll = o.check && o.checkAll
	c.MaxSeconds, c.CUDAGraph, c.ForwardOnly, c.HostExperts = o.maxSeconds, o.cudaGraph, o.forwardOnly, o.hostExperts
	c.NCCLEPTimeout, c.WatchdogTimeout = o.ncclepTimeout, o.watchdogTimeout
	c.Precision = o.precision
	c.Overlap, c.DelayWgrad, c.AttentionMS = setup.ParseOverlap(o.overlap), o.delayWgrad, o.attentionMS
	if c.CommTimeout == 0 { // as the help says: 0 = the default
		c.CommTimeout = dispatchers.DefaultCommTimeout
	}
	if c.NCCLEPTimeout == 0 {
		c.NCCLEPTimeout = dispatchers.DefaultCommTimeout
	}
	if t := o.rendezvousTimeout; t != 0 && (t < time.Second || t > time.Hour) {
		return c, &setup.ConfigError{Flag: "rendezvous-timeout", Value: t, Allowed: fmt.Sprintf("must be in [1s, 1h] (0 = the default, %v)", launch.DefaultWait)}
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	if r.Kind == setup.RoutingTrace {
		if _, err := setup.ReadTrace(r.File, c.Experts, c.TopK); err != nil {
			return c, &setup.ConfigError{Flag: "routing", Value: o.routing, Allowed: err.Error()}
		}
	}
	return c, nil
}

// feplbOnly refuses feplb's own flags given without the feplb dispatcher
// among those that run (they would change nothing), and hybridep's
// without hybridep.
func feplbOnly(fs *pflag.FlagSet, running []string) error {
	for _, own := range []struct {
		design string
		names  []string
	}{{"feplb", []string{"feplb-base", "feplb-dynamic", "feplb-policy"}}, {"hybridep", []string{"preprocess-sms", "permute-sms"}}} {
		design := own.design
		if slices.Contains(running, design) {
			continue
		}
		for _, name := range own.names {
			if f := fs.Lookup(name); f != nil && f.Changed {
				return &setup.ConfigError{Flag: name, Value: f.Value, Allowed: "applies only to --dispatcher " + design}
			}
		}
	}
	return nil
}

// checkOutputs rejects, before any work, output settings that would fail or
// destroy something only after the run: an unknown --format, an --out that
// cannot be appended to or holds something other than moebench records, a
// --dump that is not a new or empty directory, or the two at one place. It
// tells stderr when --out ends in an unfinished record, which the append
// cuts off.
func (o *options) checkOutputs(stderr io.Writer) error {
	if !slices.Contains(results.Formats, o.format) {
		return &setup.ConfigError{Flag: "format", Value: o.format, Allowed: "allowed: " + strings.Join(results.Formats, ", ")}
	}
	if o.rendezvous != "" && o.out != "" {
		if rv, out := absPath(o.rendezvous), absPath(o.out); rv == out {
			return &setup.ConfigError{Flag: "rendezvous", Value: o.rendezvous, Allowed: "is the --out file: the rendezvous writes its own files there and removes them when the run ends; name another path"}
		}
	}
	if o.out != "" && writesRecords() {
		torn, err := results.CheckAppend(o.out)
		if err != nil {
			return &setup.ConfigError{Flag: "out", Value: o.out, Allowed: err.Error()}
		}
		if torn > 0 {
			fmt.Fprintf(stderr, "moebench: --out %s ends in an unfinished record (%d bytes: a run stopped while appending it); appending cuts it off\n", o.out, torn)
		}
	}
	if o.dump == "" {
		return nil
	}
	if err := harness.CheckDump(o.dump); err != nil {
		return &setup.ConfigError{Flag: "dump", Value: o.dump, Allowed: err.Error()}
	}
	if o.out != "" {
		out, _ := filepath.Abs(o.out)
		dump, _ := filepath.Abs(o.dump)
		if out == dump || strings.HasPrefix(out, dump+string(filepath.Separator)) {
			return &setup.ConfigError{Flag: "dump", Value: o.dump, Allowed: fmt.Sprintf("the --out file (%s) would be inside the dump's directory; give them different places", o.out)}
		}
	}
	return nil
}

// absPath is path made absolute (as given where it cannot be).
func absPath(path string) string {
	if p, err := filepath.Abs(path); err == nil {
		return p
	}
	return path
}

func usage(w io.Writer, fs *pflag.FlagSet) {
	fmt.Fprint(w, `moebench runs one Mixture-of-Experts layer (router → permute → dispatch →
expert GEMMs → combine → unpermute) and measures what the token dispatcher
does to it: per-phase times, tokens and bytes moved, stragglers, correctness.

Usage:
`)
	fmt.Fprintf(w, "  %-32s %s\n", "moebench [run] [flags]", "run one layer and print its results")
	for _, name := range commandOrder[1:] {
		fmt.Fprintf(w, "  %-32s %s\n", "moebench "+commands[name].synopsis, commands[name].summary)
	}
	fmt.Fprint(w, `
Each command answers --help (or 'moebench help COMMAND') with its own usage
and flags: 'moebench sweep --help', 'moebench bench kernels --help', ...

With no flags, moebench runs the small 'tiny' layer on 8 EP ranks with the
alltoall dispatcher and balanced routing. Without a GPU it runs on the host
device (a Go implementation of every kernel) and says so.

The flags that take lists (strings, ints: --dispatcher alltoall,deepep
--sms 16,32) run one point per combination of their values: the sweep over
them, as 'moebench sweep' runs it, each point's record appended to --out and
the table of the points printed at the end; it exits 1 when any point
failed or was unavailable, and an interrupt stops it between points, as
sweep does. A flag given twice takes its last value, as every flag does.

Flags:
`)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprint(w, `
Routing:
  balanced       Megatron's force-load-balancing: logits ~ N(0,1) per token, per rank
  uniform        each token picks k distinct experts uniformly at random
  skewed:ALPHA   Zipf(ALPHA) expert popularity shared by all ranks (stragglers)
  trace:FILE     replay recorded routing (format: docs/concepts.md, Routing)
  natural        the router's own logits on the random input

Exit status: 0 success; 1 runtime failure, failed correctness check, or
unavailable dispatcher/device or too little host memory (recorded with its
reason, never timed); 2 bad command line or input, found before any work
(a Go runtime crash, "fatal error:" on stderr, also exits 2: report it);
3 regression found, 4 stacks differ (compare); 130 interrupted (SIGINT,
SIGTERM): the record of the steps timed so far is written, marked
interrupted (a second signal quits without one).
`)
}

// writesRecords: this process writes --out — the only one, or rank 0 of a
// run launched over several (the others leave the file alone: it may be
// the same file, on a shared filesystem).
func writesRecords() bool {
	l, err := launch.Detect(os.Getenv)
	return err != nil || l.Rank == 0
}
