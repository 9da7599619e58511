package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/internal/cuda"
)

const doctorHelp = `moebench doctor prints each CUDA library moebench uses, where it was found and
its version, or why it is missing, and which device a run would use.

Usage:
  moebench doctor [--cuda-libs DIRS]`

// doctor prints what this machine offers moebench: each CUDA library with
// where it was found and its version, or why it is missing. It exits 0
// (missing pieces are information, not failures) unless its command line is
// bad.
func doctor(args []string, stdout, stderr io.Writer) int {
	var dirs string
	fs := pflag.NewFlagSet("moebench doctor", pflag.ContinueOnError)
	addLibFlag(fs, &dirs)
	if code, ok := parseFlags(fs, args, doctorHelp, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(stderr, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	useLibDirs(dirs)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "component\tstatus\tversion\twhere / why")
	for _, c := range cuda.Doctor() {
		status, where := "missing", c.Detail
		if c.Found {
			status, where = "found", c.Path
			if where == "" {
				where = c.Detail
			} else {
				where += " (" + c.Detail + ")"
			}
		}
		v := c.Version
		if v == "" {
			v = "—"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Name, status, v, where)
	}
	tw.Flush()
	dev, note := resolveDevice("auto")
	fmt.Fprintf(stdout, "\nmoebench runs on the %s device here (%s); the host device is always available.\n", dev, note)
	return exitOK
}
