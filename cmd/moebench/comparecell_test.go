package main

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestSettingsCell: compare's narrow settings cell keeps a point's
// precision when it cuts the settings to fit, so that bf16 and fp8 rows of
// the same design stay apart; short settings are kept whole.
func TestSettingsCell(t *testing.T) {
	long := "feplb/native sms=0 base=alltoall dynamic=3 policy=feplb-split"
	for _, c := range []struct {
		s         string
		width     int
		want, end string
	}{
		{"alltoall/native sms=0", 30, "alltoall/native sms=0", ""},
		{long + " precision=fp8", 40, "", " precision=fp8"},
		{long, 40, "", "…"},
	} {
		got := settingsCell(c.s, c.width)
		if n := utf8.RuneCountInString(got); n > c.width {
			t.Errorf("%q in %d: %q is %d wide", c.s, c.width, got, n)
		}
		if c.want != "" && got != c.want || c.end != "" && !strings.HasSuffix(got, c.end) {
			t.Errorf("%q in %d: %q", c.s, c.width, got)
		}
	}
}
