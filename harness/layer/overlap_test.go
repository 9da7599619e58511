package layer

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
)

func TestExposedOf(t *testing.T) {
	comm := [][2]float64{{0, 2}, {5, 9}}
	comp := [][2]float64{{1, 6}, {8, 12}}
	if got := exposedOf(comm, comp); got != 1+2 {
		t.Fatalf("exposed %v, want 3", got)
	}
}

func TestOverlapValidate(t *testing.T) {
	for _, tc := range []struct {
		overlap string
		delay   bool
		mut     func(*setup.Config)
		flag    string
		want    string
	}{
		{"shared,a2a", false, nil, "overlap", "moe_shared_expert_overlap"},
		{"bogus", false, nil, "overlap", "allowed: a comma-separated list of shared, a2a"},
		{"a2a,a2a", false, nil, "overlap", "twice"},
		{"a2a", false, func(c *setup.Config) { c.ForwardOnly = true }, "overlap", "forward-only"},
		{"", true, func(c *setup.Config) { c.ForwardOnly = true }, "delay-wgrad", "forward-only"},
		{"shared", false, func(c *setup.Config) { c.SharedExperts = 0 }, "overlap", "shared-experts 0"},
	} {
		c := harnesstest.Small()
		c.Overlap, c.DelayWgrad = setup.ParseOverlap(tc.overlap), tc.delay
		if tc.mut != nil {
			tc.mut(&c)
		}
		err := c.Validate()
		var ce *setup.ConfigError
		if !errors.As(err, &ce) || ce.Flag != tc.flag || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--overlap %q --delay-wgrad=%v: %v, want --%s naming %q", tc.overlap, tc.delay, err, tc.flag, tc.want)
		}
	}
	c := harnesstest.Small()
	c.Overlap, c.DelayWgrad = setup.ParseOverlap("a2a"), true
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if r := c.Record(); r.Overlap != "a2a" || !r.DelayWgrad || !strings.Contains(r.Settings(), "overlap=a2a delay-wgrad") {
		t.Errorf("record %q %v, settings %q", r.Overlap, r.DelayWgrad, r.Settings())
	}
}

// TestOverlapA2AShortTraceRefused: with --overlap a2a a step takes
// 2·EP·tokens trace lines (micro-batch 0's, then micro-batch 1's); a trace
// shorter than that would wrap inside a step (with EP·tokens lines,
// micro-batch 1 would route micro-batch 0's tokens), so it is a usage
// error naming --routing, the trace's lines and the minimum; 2·EP·tokens
// lines are taken.
func TestOverlapA2AShortTraceRefused(t *testing.T) {
	c := harnesstest.OverlapCase()
	c.Overlap = []string{setup.OverlapA2A}
	least := 2 * c.EP * c.Tokens
	for _, n := range []int{c.EP * c.Tokens, least - 1} {
		c.Routing = setup.Routing{Kind: setup.RoutingTrace, File: harnesstest.TraceOf(t, c, n)}
		_, err := MakeLayer(c, false)
		var ce *setup.ConfigError
		if !errors.As(err, &ce) || ce.Flag != "routing" || !strings.Contains(err.Error(), fmt.Sprintf("%d lines", n)) || !strings.Contains(err.Error(), fmt.Sprint(least)) {
			t.Errorf("a trace of %d lines with --overlap a2a: %v; want a --routing usage error naming %d lines and the minimum %d", n, err, n, least)
		}
	}
	c.Routing = setup.Routing{Kind: setup.RoutingTrace, File: harnesstest.TraceOf(t, c, least)}
	if _, err := MakeLayer(c, false); err != nil {
		t.Errorf("a trace of %d lines with --overlap a2a: %v", least, err)
	}
	c.Overlap = nil
	c.Routing = setup.Routing{Kind: setup.RoutingTrace, File: harnesstest.TraceOf(t, c, c.EP*c.Tokens)}
	if _, err := MakeLayer(c, false); err != nil {
		t.Errorf("a trace of EP·tokens lines without --overlap a2a: %v", err)
	}
}
