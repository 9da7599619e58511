package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
)

// command is a subcommand of moebench: what it does, in one line for the
// top-level help, and how it runs (each answers --help with its own usage).
type command struct {
	synopsis, summary string
	run               func(args []string, stdout, stderr io.Writer) int
}

// commands are moebench's subcommands besides run (the default); filled in
// init, since help refers to the table.
var commands map[string]command

// commandOrder is the order commands are listed in.
var commandOrder = []string{"run", "advise", "sweep", "report", "compare", "straggler", "bench", "presets", "doctor", "version", "help"}

func init() {
	commands = map[string]command{
		"advise":    {"advise --preset MODEL", "measure which dispatcher and SM budget is fastest here; answer with the evidence", adviseCmd},
		"sweep":     {"sweep [flags]", "run a matrix of points, one record each", sweep},
		"report":    {"report FILE...", "tables (terminal, Markdown, CSV) or an HTML page of result records", report},
		"compare":   {"compare BASE NEW", "decide whether NEW regressed against BASE (exit 3)", compare},
		"straggler": {"straggler [flags]", "simulate load-balancing policies over many steps", straggler},
		"bench":     {"bench kernels|dispatch", "time each kernel alone, or dispatch and combine alone", benchCmd},
		"presets":   {"presets", "list the built-in layer shapes", presetsCmd},
		"doctor":    {"doctor", "which CUDA libraries and GPUs are here, and their versions", doctor},
		"version":   {"version", "print the version (also --version)", versionCmd},
		"help":      {"help [COMMAND]", "print this help, or a command's", helpCmd},
	}
}

func commandNames() []string { return commandOrder }

const presetsHelp = `moebench presets lists the built-in layer shapes (--preset NAME): hidden size,
expert FFN size, routed experts, top-k, shared experts, score function, expert
groups, top-k scaling factor and the default tokens per rank.

Usage:
  moebench presets`

func presetsCmd(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("moebench presets", pflag.ContinueOnError)
	if code, ok := parseFlags(fs, args, presetsHelp, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(stderr, fmt.Errorf("presets: unexpected argument %q", fs.Arg(0)))
	}
	return presets(stdout)
}

const versionHelp = `moebench version prints moebench's version, with the commit it was built from
when known (go build stamps it; under go run, the checkout's HEAD).

Usage:
  moebench version
  moebench --version`

func versionCmd(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("moebench version", pflag.ContinueOnError)
	if code, ok := parseFlags(fs, args, versionHelp, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(stderr, fmt.Errorf("version: unexpected argument %q", fs.Arg(0)))
	}
	fmt.Fprintln(stdout, "moebench", version())
	return exitOK
}

const helpHelp = `moebench help prints moebench's help, or with a command its own usage and
flags (the same as 'moebench COMMAND --help').

Usage:
  moebench help [COMMAND [SUBCOMMAND]]`

func helpCmd(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0:
		usage(stdout, newFlags(&options{}))
		return exitOK
	case args[0] == "--help" || args[0] == "-h":
		fmt.Fprintln(stdout, helpHelp)
		return exitOK
	case args[0] == "run":
		return runLayer([]string{"--help"}, stdout, stderr)
	}
	if _, ok := commands[args[0]]; !ok {
		return usageError(stderr, fmt.Errorf("help: unknown command %q (commands: %s)", args[0], strings.Join(commandNames(), ", ")))
	}
	return commands[args[0]].run(append(append([]string(nil), args[1:]...), "--help"), stdout, stderr)
}

// bound is the range [lo, hi] of an integer flag's values; about says what
// a value means where that helps ("0 = ...").
type bound struct {
	lo, hi int
	about  string
}

// maxSharedExperts bounds --shared-experts: far more than any model has
// (DeepSeek-V3 has 1, Qwen2-MoE 4 of its FFN size).
const maxSharedExperts = 1024

// flagBounds are the ranges of the integer flags of a layer (run, sweep,
// bench) that no other setting decides; setup.Config.Validate checks the
// others (and these flags' finer rules, e.g. an SM-driven dispatcher's
// budget).
var flagBounds = map[string]bound{
	"sms":            {0, dispatchers.MaxSMBudget, "0 = the dispatcher's default"},
	"preprocess-sms": {0, dispatchers.MaxSMBudget, "0 = the default"},
	"permute-sms":    {0, dispatchers.MaxSMBudget, "0 = the default"},
	"shared-experts": {0, maxSharedExperts, ""},
	"ep":             {1, 1 << 20, ""}, // as Validate's; sweep's list is checked before its points are made
}

// checkBounds refuses a value of an integer flag of fs (each value of a
// list flag) given outside its range in bounds, as a *setup.ConfigError
// naming the flag, the value and the range.
func checkBounds(fs *pflag.FlagSet, bounds map[string]bound) error {
	for _, name := range slices.Sorted(maps.Keys(bounds)) {
		f := fs.Lookup(name)
		if f == nil || !f.Changed {
			continue
		}
		var vals []int
		switch f.Value.Type() {
		case "int":
			v, _ := fs.GetInt(name)
			vals = []int{v}
		case "intSlice":
			vals, _ = fs.GetIntSlice(name)
		default:
			panic("checkBounds: --" + name + " is a " + f.Value.Type())
		}
		b := bounds[name]
		for _, v := range vals {
			if v < b.lo || v > b.hi {
				allowed := fmt.Sprintf("must be in [%d, %d]", b.lo, b.hi)
				if b.about != "" {
					allowed += " (" + b.about + ")"
				}
				return &setup.ConfigError{Flag: name, Value: v, Allowed: allowed}
			}
		}
	}
	return nil
}
