package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/moebench/moebench/internal/cuda"
)

// doctor prints what this machine offers moebench: each CUDA library with
// where it was found and its version, or why it is missing. It always exits
// 0: missing pieces are information, not failures.
func doctor(stdout io.Writer) int {
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
