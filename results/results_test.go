package results

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
)

func sample(status string) *Record {
	r := &Record{Schema: Schema, Time: "2026-11-22T00:00:00Z", Status: status,
		Config: Config{Preset: "tiny", Tokens: 8, Hidden: 4, FFN: 2, Experts: 4, TopK: 2, EP: 2, Dispatcher: "alltoall",
			Impl: "native", Routing: "balanced", Seed: 3, Iters: 1, Device: "host"},
		Stack: Stack{Device: "host", GoVersion: "go", Version: "test"}, Ranks: Ranks{EP: 2, Devices: []int{-1, -1}}}
	if status == StatusOK {
		ph := Phase{Name: "step", Stat: Stat{P50: 1, P90: 1, P99: 1, Mean: 1}, PerRank: []float64{1, 1}, Samples: []float64{1}}
		r.Timing = &Timing{Unit: "ms", Iters: 1, Phases: []Phase{ph}, Step: ph}
		r.Tokens = &Tokens{Received: []int{8, 8}}
		r.GEMM = &GEMM{}
		r.Traffic = &Traffic{DispatchOffRank: 10}
	} else {
		r.Reason = "because"
	}
	return r
}

func TestAppendRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "r.jsonl")
	for _, s := range []string{StatusOK, StatusUnavailable, StatusFailed} {
		if _, err := Append(p, sample(s)); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := ReadFile(p, nil)
	if err != nil || len(recs) != 3 || recs[0].Timing.Step.P50 != 1 || recs[1].Reason != "because" {
		t.Fatalf("read back %d records, err %v", len(recs), err)
	}
}

func TestReadIsStrict(t *testing.T) {
	good, _ := json.Marshal(sample(StatusOK))
	bad := map[string]string{
		string(good) + "\nnot json\n":                                                       "x:2: not a JSON object",
		strings.Replace(string(good), Schema, "moebench.record/v9", 1) + "\n":               `x:1: schema "moebench.record/v9" is not supported`,
		strings.Replace(string(good), `"status":"ok"`, `"status":"ok","extra":1`, 1) + "\n": `x:1: bad record: json: unknown field "extra"`,
		strings.Replace(string(good), `"status":"ok"`, `"status":"failed"`, 1) + "\n":       "x:1: a failed record carries timings",
		strings.Replace(string(good), `"status":"ok"`, `"status":"maybe"`, 1) + "\n":        `x:1: status "maybe"`,
		"not json": "x:1: incomplete last line (no newline): not a JSON object",
		"\n":       "x:1: empty line",
		string(good) + "\n" + `{"schema":"moebench.record/v1","status":"ok"}` + "\n": `x:2: an ok record without "timing"`,
	}
	for in, want := range bad {
		_, err := Read(strings.NewReader(in), "x", nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want %q", err, want)
		}
	}
}

func TestWriteFormats(t *testing.T) {
	for _, st := range []string{StatusOK, StatusUnavailable} {
		t.Run(st, func(t *testing.T) {
			t.Parallel()
			for _, f := range Formats {
				t.Run(f, func(t *testing.T) {
					t.Parallel()
					var b bytes.Buffer
					if err := Write(&b, sample(st), f); err != nil {
						t.Fatalf("%s/%s: %v", st, f, err)
					}
					out := b.String()
					switch {
					case f == "table" && st == StatusOK && !strings.Contains(out, "p50_ms"):
						t.Errorf("table has no phase header:\n%s", out)
					case f == "table" && st != StatusOK && (strings.Contains(out, "p50_ms") || !strings.Contains(out, "unavailable: because")):
						t.Errorf("unavailable table shows timings or no reason:\n%s", out)
					case f == "csv" && strings.Count(out, "\n") != 2:
						t.Errorf("csv: want header and one row:\n%s", out)
					case f == "json":
						if _, err := Read(strings.NewReader(out), "json", nil); err != nil {
							t.Errorf("json output does not read back: %v", err)
						}
					}
				})
			}
		})
	}
	if err := Write(&bytes.Buffer{}, sample(StatusOK), "xml"); err == nil {
		t.Error("unknown format accepted")
	}
	// a device run's host issue time, flagged when near the step's
	for _, c := range []struct {
		share   float64
		flagged bool
	}{{0.3, false}, {0.9, true}} {
		t.Run(fmt.Sprintf("share%g", c.share), func(t *testing.T) {
			t.Parallel()
			rec := sample(StatusOK)
			rec.Timing.HostIssue = &Stat{P50: c.share * rec.Timing.Step.P50}
			var b bytes.Buffer
			if err := Write(&b, rec, "table"); err != nil {
				t.Fatal(err)
			}
			line := fmt.Sprintf("%.0f%% of the step's p50", 100*c.share)
			if out := b.String(); !strings.Contains(out, line) || strings.Contains(out, "waited for the host") != c.flagged {
				t.Errorf("host issue at %.0f%% of the step:\n%s", 100*c.share, out)
			}
		})
	}
}

// FuzzRead: whatever the reader accepts re-encodes to as many records, and
// every output built from records — the run's own output in each format,
// reports in each format, a comparison of the records with themselves —
// is built without a crash.
func FuzzRead(f *testing.F) {
	good, _ := json.Marshal(sample(StatusOK))
	f.Add(append(good, '\n'))
	f.Add([]byte("{\"schema\":\"moebench.record/v1\"}\n"))
	f.Add([]byte("{\"schema\":\"moebench.record/v1\",\"status\":\"ok\"}\n"))
	f.Add([]byte("{\"schema\":\"moebench.record/v1\",\"status\":\"failed\"}\n"))
	f.Add([]byte("{\"schema\":\"moebench.record/v1\",\"status\":\"ok\",\"timing\":{\"step\":{\"samples\":[1]}},\"tokens\":{},\"gemm\":{},\"traffic\":{},\"rebalance\":{}}\n"))
	f.Add([]byte("\n\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := Read(bytes.NewReader(data), "fuzz", nil)
		if err != nil {
			return
		}
		// whatever reads cleanly must re-encode and read back to as many records
		var b bytes.Buffer
		for i := range recs {
			line, merr := json.Marshal(&recs[i])
			if merr != nil {
				t.Fatalf("re-encode: %v", merr)
			}
			b.Write(append(line, '\n'))
		}
		again, err := Read(&b, "again", nil)
		if err != nil || len(again) != len(recs) {
			t.Fatalf("re-read %d of %d records: %v", len(again), len(recs), err)
		}
		for i := range recs {
			for _, format := range Formats {
				Write(io.Discard, &recs[i], format)
			}
		}
		for _, format := range ReportFormats {
			WriteReport(io.Discard, BuildReport(recs), format, "fuzz")
		}
		Compare(recs, again, DefaultCompareOptions, true)
	})
}

// TestRankNote: the table's header says where the ranks ran.
func TestRankNote(t *testing.T) {
	for _, tc := range []struct {
		device   string
		devices  []int
		emulated bool
		want     string
	}{
		{"host", []int{-1, -1}, false, " (host ranks)"},
		{"cuda", []int{0, 0, 0, 0}, true, " (emulated: ranks packed onto one GPU)"},
		{"cuda", []int{0, 0, 1, 1}, true, " (emulated: ranks packed onto 2 GPUs)"},
		{"cuda", []int{0, 1, 2, 3}, false, " (one rank per GPU, 4 GPUs)"},
		{"cuda", []int{0}, false, ""},
	} {
		rec := &Record{Stack: Stack{Device: tc.device}, Ranks: Ranks{EP: len(tc.devices), Devices: tc.devices, Emulated: tc.emulated}}
		if got := rankNote(rec); got != tc.want {
			t.Errorf("%s %v: %q, want %q", tc.device, tc.devices, got, tc.want)
		}
	}
}

// TestStatusReadsOnce: an unavailable record's reason, an error of its own
// dispatcher ("deepep (native): unavailable: …"), reads once in the table's
// status line and the report's notes, not "unavailable: deepep (native):
// unavailable: …"; another dispatcher's label (a base's) stays.
func TestStatusReadsOnce(t *testing.T) {
	rec := sample(StatusUnavailable)
	rec.Config.Dispatcher, rec.Config.Impl = "deepep", "native"
	rec.Reason = "deepep (native): unavailable: EP 16"
	var b bytes.Buffer
	if err := Write(&b, rec, "table"); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "# status: unavailable: EP 16\n") {
		t.Errorf("table:\n%s", out)
	}
	if got := StatusLine(StatusUnavailable, "feplb", "native", rec.Reason); got != "unavailable: deepep (native): unavailable: EP 16" {
		t.Errorf("another dispatcher's reason: %q", got)
	}
}
