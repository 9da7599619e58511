package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/internal/launch"
	"github.com/moebench/moebench/results"
)

// options holds the parsed flags.
type options struct {
	preset, dispatcher, impl, score, routing, device, out, format, dump string
	feplbBase, feplbPolicy, cudaLibs, rendezvous, hostExperts           string
	domain, feplbDyn                                                    int
	tokens, hidden, ffn, experts, topk, shared, groups, groupTopK       int
	sms, ep, gpus, warmup, iters                                        int
	preprocessSMs, permuteSMs                                           int
	topkScale, maxSeconds                                               float64
	commTimeout, rendezvousTimeout                                      time.Duration
	seed                                                                uint64
	check, preSoftmax, routingFixed, cudaGraph, forwardOnly             bool
	checkAll                                                            bool // --check all
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
	d := harness.DefaultConfig()
	fs := pflag.NewFlagSet("moebench", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&o.dispatcher, "dispatcher", d.Dispatcher, "token dispatcher: "+strings.Join(dispatchers.Names(), "|"))
	fs.StringVar(&o.impl, "impl", d.Impl, "implementation: native (moebench's own) | library (a real library on the node, one GPU per rank: alltoall through NCCL; hybridep and deepep through NCCL EP, its high-throughput and low-latency modes)")
	fs.IntVar(&o.sms, "sms", d.SMs, "SMs per rank of SM-driven dispatchers' transfer kernels (one block holds one SM; at most the GPU's SMs ÷ its ranks): deepep (even; default 20), hybridep (default 16), each default lowered to fit; with --impl library NCCL EP's max_num_sms; 0 = the dispatcher's (the library's) default")
	fs.IntVar(&o.preprocessSMs, "preprocess-sms", d.PreprocessSMs, "hybridep (cuda): blocks per rank of its preprocessing's own launches (HybridEP's num_sms_preprocessing_api); 0 = HybridEP's 108, lowered to the GPU's SMs ÷ its ranks")
	fs.IntVar(&o.permuteSMs, "permute-sms", d.PermuteSMs, "hybridep (cuda): blocks per rank of its permute's own launch (HybridEP's num_blocks_permute); 0 = the GPU's SMs ÷ its ranks")
	fs.IntVar(&o.ep, "ep", d.EP, "expert-parallel ranks; must divide --experts")
	fs.IntVar(&o.gpus, "gpus", d.GPUs, "cuda: GPUs the ranks are spread over; 0 = every GPU, at most one per rank (more ranks than GPUs: packed, emulated EP)")
	addFeplbFlags(fs, o)
	fs.StringVar(&o.preset, "preset", d.Preset, "layer shape preset (see 'moebench presets'); shape flags below override its fields")
	addShapeFlags(fs, o)
	fs.StringVar(&o.routing, "routing", d.Routing.String(), "routing: balanced|uniform|skewed:ALPHA|trace:FILE|natural")
	addControlFlags(fs, o)
	fs.StringVar(&o.hostExperts, "host-experts", harness.HostExpertsAuto, "host device: how the layer holds the experts' weights and fp32 weight gradients: "+
		"auto (the first of the others that fits in the available memory) | held (all, the whole run) | grads-by-rank (all weights; each rank's weight gradients "+
		"until its expert backward ends, checked there, then released) | drawn (weights drawn from the seed each time an expert's rows are computed, slower; gradients by rank)")
	fs.BoolVar(&o.cudaGraph, "cuda-graph", d.CUDAGraph, "cuda: issue each step as CUDA graphs (stream capture), cut at the dispatcher's host wait, each part replayed while its shapes repeat (alltoall native)")
	fs.StringVar(&o.out, "out", "", "append the JSON result record to this file (one line per run)")
	fs.StringVar(&o.format, "format", "table", "output format: "+strings.Join(results.Formats, "|"))
	fs.StringVar(&o.dump, "dump", "", "write the layer's tensors as .npy files with an index.json to this new directory (a run of one process)")
	return fs
}

// addFeplbFlags defines the NVLink domain and feplb's options.
func addFeplbFlags(fs *pflag.FlagSet, o *options) {
	d := harness.DefaultConfig()
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
	d := harness.DefaultConfig()
	fs.Uint64Var(&o.seed, "seed", d.Seed, "seed of every random draw (inputs, weights, routing)")
	fs.BoolVar(&o.routingFixed, "routing-fixed", d.RoutingFixed, "replay the first iteration's routing every iteration (default: each iteration draws its own, seeded by the step)")
	fs.IntVar(&o.warmup, "warmup", d.Warmup, "untimed iterations before timing")
	fs.IntVar(&o.iters, "iters", d.Iters, fmt.Sprintf("timed iterations (at most %d)", harness.MaxIters))
	fs.Float64Var(&o.maxSeconds, "max-seconds", 0, "time budget of the warm-up and timed iterations: past it the run stops after the current iteration and records what it timed (at least one iteration); 0 = none")
	fs.BoolVar(&o.forwardOnly, "forward-only", d.ForwardOnly, "time the forward pass alone (default: every iteration is a training step, forward then backward, and the check covers every gradient; on the cuda device NCCL EP's low-latency mode, deepep --impl library, has no backward and times the forward only, and the record says why)")
	o.check, o.checkAll = d.Check, d.CheckAll
	fs.Var(checkValue{&o.check, &o.checkAll}, "check", "check the output (and in a training step every gradient) against the float64 reference before the timed steps: "+
		"sample (where every token's reference is beyond the check's budget, a seeded sample of tokens per rank, the record says which) | all (every token) | off")
	fs.DurationVar(&o.commTimeout, "comm-timeout", d.CommTimeout, "SM-driven dispatchers: the longest a cross-rank wait may take before the run fails naming the rank, phase and wait (NCCL EP: its timeout_ns); a run over several processes: the longest any process waits for the others while none moves on; a call on a GPU's thread after the first step may take 6 times it, at least 30s (0 = 5s)")
	fs.StringVar(&o.rendezvous, "rendezvous", "", "a run over several processes (srun, mpirun, torchrun, MOEBENCH_RANK/MOEBENCH_WORLD): a file on a filesystem every node sees, where rank 0 writes NCCL's unique id and the processes watch each other; not needed with NCCL_COMM_ID=host:port, but without it a process that fails or never arrives is named only in a run of two processes")
	fs.DurationVar(&o.rendezvousTimeout, "rendezvous-timeout", launch.DefaultWait, "a run over several processes with --rendezvous: the longest time `dt` (a duration, 1s to 1h) a process waits at the start for the others to arrive, each giving the others its settings, which must be the same; one that never arrives is named")
	fs.StringVar(&o.device, "device", d.Device, "device: auto (cuda if a driver and GPU are found, else host) | host | cuda")
	addLibFlag(fs, &o.cudaLibs)
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
func (o *options) config(fs *pflag.FlagSet) (harness.Config, error) {
	c := harness.DefaultConfig()
	if err := checkBounds(fs, flagBounds); err != nil {
		return c, err
	}
	p, ok := harness.LookupPreset(o.preset)
	if !ok {
		return c, &harness.ConfigError{Flag: "preset", Value: o.preset, Allowed: "allowed: " + strings.Join(harness.PresetNames(), ", ")}
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
		return c, &harness.ConfigError{Flag: "dispatcher", Value: o.dispatcher, Allowed: "allowed: " + strings.Join(dispatchers.Names(), ", ")}
	}
	r, err := harness.ParseRouting(o.routing)
	if err != nil {
		return c, err
	}
	c.Dispatcher, c.Impl, c.SMs, c.EP, c.GPUs = o.dispatcher, o.impl, o.sms, o.ep, o.gpus
	c.PreprocessSMs, c.PermuteSMs = o.preprocessSMs, o.permuteSMs
	c.Domain, c.FeplbBase, c.FeplbDyn, c.FeplbPolicy, c.CommTimeout = o.domain, o.feplbBase, o.feplbDyn, o.feplbPolicy, o.commTimeout
	c.Routing, c.RoutingFixed, c.Seed, c.Warmup, c.Iters, c.Check, c.Device = r, o.routingFixed, o.seed, o.warmup, o.iters, o.check, o.device
	c.CheckAll = o.check && o.checkAll
	c.MaxSeconds, c.CUDAGraph, c.ForwardOnly, c.HostExperts = o.maxSeconds, o.cudaGraph, o.forwardOnly, o.hostExperts
	if c.CommTimeout == 0 { // as the help says: 0 = the default
		c.CommTimeout = dispatchers.DefaultCommTimeout
	}
	if t := o.rendezvousTimeout; t != 0 && (t < time.Second || t > time.Hour) {
		return c, &harness.ConfigError{Flag: "rendezvous-timeout", Value: t, Allowed: fmt.Sprintf("must be in [1s, 1h] (0 = the default, %v)", launch.DefaultWait)}
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	if r.Kind == harness.RoutingTrace {
		if _, err := harness.ReadTrace(r.File, c.Experts, c.TopK); err != nil {
			return c, &harness.ConfigError{Flag: "routing", Value: o.routing, Allowed: err.Error()}
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
				return &harness.ConfigError{Flag: name, Value: f.Value, Allowed: "applies only to --dispatcher " + design}
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
		return &harness.ConfigError{Flag: "format", Value: o.format, Allowed: "allowed: " + strings.Join(results.Formats, ", ")}
	}
	if o.rendezvous != "" && o.out != "" {
		if rv, out := absPath(o.rendezvous), absPath(o.out); rv == out {
			return &harness.ConfigError{Flag: "rendezvous", Value: o.rendezvous, Allowed: "is the --out file: the rendezvous writes its own files there and removes them when the run ends; name another path"}
		}
	}
	if o.out != "" && writesRecords() {
		torn, err := results.CheckAppend(o.out)
		if err != nil {
			return &harness.ConfigError{Flag: "out", Value: o.out, Allowed: err.Error()}
		}
		if torn > 0 {
			fmt.Fprintf(stderr, "moebench: --out %s ends in an unfinished record (%d bytes: a run stopped while appending it); appending cuts it off\n", o.out, torn)
		}
	}
	if o.dump == "" {
		return nil
	}
	if err := harness.CheckDump(o.dump); err != nil {
		return &harness.ConfigError{Flag: "dump", Value: o.dump, Allowed: err.Error()}
	}
	if o.out != "" {
		out, _ := filepath.Abs(o.out)
		dump, _ := filepath.Abs(o.dump)
		if out == dump || strings.HasPrefix(out, dump+string(filepath.Separator)) {
			return &harness.ConfigError{Flag: "dump", Value: o.dump, Allowed: fmt.Sprintf("the --out file (%s) would be inside the dump's directory; give them different places", o.out)}
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

Flags:
`)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprint(w, `
Routing:
  balanced       Megatron's force-load-balancing: logits ~ N(0,1) per token, per rank
  uniform        each token picks k distinct experts uniformly at random
  skewed:ALPHA   Zipf(ALPHA) expert popularity shared by all ranks (stragglers)
  trace:FILE     replay recorded routing (format: see README)
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
