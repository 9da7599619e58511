package main

import (
	"strings"
	"testing"
)

// TestPrecisionFlag: --precision takes bf16, fp8 or mxfp8; another value,
// or fp8 with --hidden not a multiple of 128, is a usage error (exit 2)
// naming the flag, the value and what is allowed.
func TestPrecisionFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--precision", "fp16"}, "--precision=fp16: allowed: bf16, fp8, mxfp8"},
		{[]string{"--precision", "fp8", "--hidden", "192"}, "--precision=fp8: needs --hidden a multiple of 128 (it quantizes rows in blocks of 128; --hidden is 192)"},
		{[]string{"--precision", "mxfp8", "--hidden", "48"}, "--precision=mxfp8: needs --hidden a multiple of 32"},
	} {
		code, _, e := cli(append(append([]string{}, quick...), c.args...)...)
		if code != exitUsage || !strings.Contains(e, c.want) {
			t.Errorf("%v: exit %d, %s; want exit %d and %q", c.args, code, e, exitUsage, c.want)
		}
	}
}
