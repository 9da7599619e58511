package results

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// TestOldNamesReadMapped: a record written before deepep-ll had its name —
// deepep --impl library, which ran NCCL EP's low-latency mode (DeepEP's
// low-latency design), ok or unavailable — reads back as deepep-ll with a
// note that the report prints; deepep --impl library's own unavailable
// record (no library of the normal mode) and native deepep stay deepep.
func TestOldNamesReadMapped(t *testing.T) {
	p := filepath.Join(t.TempDir(), "r.jsonl")
	old := sample(StatusOK)
	old.Config.Dispatcher, old.Config.Impl, old.Config.SMs = "deepep", "library", 24
	oldUn := sample(StatusUnavailable)
	oldUn.Config.Dispatcher, oldUn.Config.Impl, oldUn.Reason = "deepep", "library", "deepep (library): unavailable: NCCL EP cannot run here: no libnccl_ep"
	now := sample(StatusUnavailable)
	now.Config.Dispatcher, now.Config.Impl, now.Reason = "deepep", "library",
		"deepep (library): unavailable: no library of DeepEP's normal mode is reachable from Go: DeepEP is a PyTorch extension"
	native := sample(StatusOK)
	native.Config.Dispatcher = "deepep"
	for _, r := range []*Record{old, oldUn, now, native} {
		if _, err := Append(p, r); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := ReadFile(p, nil)
	if err != nil || len(recs) != 4 {
		t.Fatalf("%d records, %v", len(recs), err)
	}
	for i, want := range []struct {
		dispatcher, impl string
		mapped           bool
	}{{"deepep-ll", "library", true}, {"deepep-ll", "library", true}, {"deepep", "library", false}, {"deepep", "native", false}} {
		c := recs[i].Config
		if c.Dispatcher != want.dispatcher || c.Impl != want.impl || (recs[i].Mapped != "") != want.mapped {
			t.Errorf("record %d: %s/%s, mapped %q; want %s/%s, mapped %v", i, c.Dispatcher, c.Impl, recs[i].Mapped, want.dispatcher, want.impl, want.mapped)
		}
	}
	if m := recs[0].Mapped; !strings.Contains(m, "deepep --impl library") || !strings.Contains(m, "deepep-ll") {
		t.Errorf("the note: %q", m)
	}
	if recs[0].Reason != "" || recs[1].Reason != oldUn.Reason {
		t.Errorf("the recorded reasons changed: %q, %q", recs[0].Reason, recs[1].Reason)
	}
	var b bytes.Buffer
	if err := WriteReport(&b, BuildReport(recs), "markdown", "t"); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "- deepep-ll/library sms=24: "+recs[0].Mapped) || !strings.Contains(out, "| deepep-ll | library | 24 |") {
		t.Errorf("the report does not say the name was mapped:\n%s", out)
	}
	if n := MappedNotes(recs); len(n) != 1 || !strings.HasPrefix(n[0], "2 records: ") {
		t.Errorf("MappedNotes: %q", n)
	}
}
