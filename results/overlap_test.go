package results

import (
	"bytes"
	"strings"
	"testing"
)

// TestCompareOverlapIsConfiguration: records that differ in --overlap or
// --delay-wgrad are different points, never compared with each other.
func TestCompareOverlapIsConfiguration(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"overlap":     func(c *Config) { c.Overlap = "a2a" },
		"delay_wgrad": func(c *Config) { c.DelayWgrad = true },
	} {
		base := okRecord("alltoall", []float64{1, 1, 1, 1, 1})
		other := base
		mut(&other.Config)
		c, err := Compare([]Record{base}, []Record{other}, DefaultCompareOptions, false)
		if err == nil || len(c.Changes) != 2 {
			t.Errorf("%s: records that differ in it were matched: %v, %+v", name, err, c)
		}
	}
}

// TestOverlapShownInTableAndRecord: the run table has the overlap columns
// (exposed communication among them) for a group with an overlapped row,
// and the record's text says what was measured.
func TestOverlapShownInTableAndRecord(t *testing.T) {
	rec := okRecord("deepep", []float64{2, 2, 2})
	rec.Config.Overlap, rec.Config.DelayWgrad = "a2a", true
	rec.Overlap = &Overlap{Forms: "a2a", DelayWgrad: true, MicroBatches: 2, Step: &Stat{P50: 2}, Sequential: &Stat{P50: 3}, Ratio: 1.5,
		Comm: &Stat{P50: 1}, Exposed: &Stat{P50: 0.25}, GEMMSMs: 84, GEMMSMsNote: "the GPU's 132 SMs less 24", Equal: true, Note: "the schedule"}
	var b bytes.Buffer
	if err := WriteTable(&b, &rec); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"overlap", "a2a, delay-wgrad", "exposed 0.250 ms", "1.50x", "GEMMs had 84 SMs", "bit for bit"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("record text lacks %q:\n%s", want, b.String())
		}
	}
	g := BuildReport([]Record{rec, okRecord("alltoall", []float64{1, 1, 1})})
	heads := map[string]bool{}
	for _, gr := range g {
		for _, c := range columns {
			if c.shown != nil && c.shown(gr) {
				heads[c.head] = true
			}
		}
	}
	for _, h := range []string{"overlap", "exposed_comm_p50", "overlap_step_p50", "sequential_step_p50", "overlap_speedup", "gemm_sms"} {
		if !heads[h] {
			t.Errorf("column %s not shown for a group with overlap", h)
		}
	}
}

// TestOverlapNoSMsLeftIsShown: a run whose dispatcher held every SM records
// that the GEMMs had none, rather than leaving the count out.
func TestOverlapNoSMsLeftIsShown(t *testing.T) {
	rec := okRecord("deepep", []float64{2})
	rec.Overlap = &Overlap{Forms: "a2a", MicroBatches: 2, Step: &Stat{P50: 2}, Sequential: &Stat{P50: 3}, GEMMSMs: 0, GEMMSMsNote: "the GPU's 4 SMs less 4", Equal: true}
	var b bytes.Buffer
	if err := WriteTable(&b, &rec); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "GEMMs had 0 SMs") {
		t.Errorf("record text:\n%s", b.String())
	}
}
