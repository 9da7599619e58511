package harness

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// TestDispatchAsDesigned: a run records the dispatch as the design's own
// test times it — deepep's notify + dispatch, hybridep's allgather +
// preprocess + dispatch, per iteration the sum of the parts' slowest
// ranks — with its GB/s, and its table shows it after its parts, with the
// SMs held; alltoall has none (bench dispatch's: TestBenchDispatchAsDesigned, harness/bench).
func TestDispatchAsDesigned(t *testing.T) {
	for _, c := range []struct {
		name  string
		parts []string
	}{{"deepep", []string{"notify", "dispatch"}}, {"hybridep", []string{"allgather", "preprocess", "dispatch"}}, {"alltoall", nil}} {
		cfg := harnesstest.Small()
		cfg.Dispatcher, cfg.ForwardOnly = c.name, true
		rec, err := Run(cfg, setup.Env{Version: "test"})
		if err != nil || rec.Status != results.StatusOK {
			t.Fatalf("%s: %v", c.name, err)
		}
		d := rec.Timing.DispatchAsDesigned
		if c.parts == nil {
			if d != nil {
				t.Errorf("%s: a dispatch as designed %+v", c.name, d)
			}
			continue
		}
		if d == nil || !slices.Equal(d.Parts, c.parts) || d.Name != strings.Join(c.parts, "+") {
			t.Fatalf("%s: dispatch as designed %+v, want the parts %v", c.name, d, c.parts)
		}
		for i, v := range d.Samples {
			sum := 0.0
			for _, ph := range rec.Timing.Phases {
				if slices.Contains(c.parts, ph.Name) {
					sum += ph.Samples[i]
				}
			}
			if math.Abs(v-sum) > 1e-9*sum {
				t.Errorf("%s: iteration %d: %g, want the parts' sum %g", c.name, i, v, sum)
			}
		}
		if want := results.GBps(rec.Traffic.DispatchAlgorithm, cfg.EP, d.P50); d.GBps != want || want == 0 || d.GBpsPerSM != want/float64(rec.SMs.Budget) {
			t.Errorf("%s: %g GB/s (%g per SM), want %g over %d SMs", c.name, d.GBps, d.GBpsPerSM, want, rec.SMs.Budget)
		}
		var out bytes.Buffer
		if err := results.WriteTable(&out, rec); err != nil {
			t.Fatal(err)
		}
		if s := out.String(); !strings.Contains(s, "\n  "+d.Name+" ") || !strings.Contains(s, "dispatch as designed") || !strings.Contains(s, "SMs held               n/a") {
			t.Errorf("%s: the table lacks the dispatch as designed or the SMs held:\n%s", c.name, s)
		}
		out.Reset()
		if err := results.WriteReport(&out, results.BuildReport([]results.Record{*rec}), "table", ""); err != nil {
			t.Fatal(err)
		}
		if s := out.String(); !strings.Contains(s, "dispatch_as_designed_p50") || !strings.Contains(s, "sms_held") {
			t.Errorf("%s: the report lacks the columns:\n%s", c.name, s)
		}
	}
}
