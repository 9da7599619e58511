package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
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
var commandOrder = []string{"run", "sweep", "report", "compare", "straggler", "bench", "presets", "doctor", "version", "help"}

func init() {
	commands = map[string]command{
		"sweep":     {"sweep [flags]", "run a matrix of points, one record each", sweep},
		"report":    {"report FILE...", "tables (terminal, Markdown, CSV) or an HTML page of result records", report},
		"compare":   {"compare BASE NEW", "decide whether NEW regressed against BASE (exit 3)", compare},
		"straggler": {"straggler [flags]", "simulate load-balancing policies over many steps", straggler},
		"bench":     {"bench kernels|dispatch", "time each kernel alone, or dispatch and combine alone", bench},
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
