package advise

import (
	"bytes"
	"encoding/json"
	"html"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/moebench/moebench/dispatchers/all"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// TestRefineAndSmallest: the fine step halves the gaps around the best
// coarse budget (even where the design needs it), and the smallest budget
// within 2% of the best is found among all measured ones.
func TestRefineAndSmallest(t *testing.T) {
	pts := []SMPoint{{SMs: 8, Ms: 3, Status: "ok"}, {SMs: 16, Ms: 2.01, Status: "ok"}, {SMs: 32, Ms: 2, Status: "ok"}, {SMs: 64, Status: "unavailable"}}
	if got := Refine(pts, true); len(got) != 2 || got[0] != 24 || got[1] != 48 { // 32 is best; 64 was tried (unavailable): between them too
		t.Errorf("Refine: %v, want [24 48]", got)
	}
	if got := Refine([]SMPoint{{SMs: 8, Ms: 1, Status: "ok"}, {SMs: 10, Ms: 2, Status: "ok"}}, true); len(got) != 0 {
		t.Errorf("Refine of neighbours 8 and 10 (even): %v, want none (no even budget between)", got)
	}
	if got := Refine([]SMPoint{{SMs: 9, Ms: 1, Status: "ok"}, {SMs: 16, Ms: 2, Status: "ok"}}, false); len(got) != 1 || got[0] != 12 {
		t.Errorf("Refine odd: %v, want [12]", got)
	}
	if n := Smallest(pts, 0.02); n != 16 {
		t.Errorf("Smallest within 2%%: %d, want 16 (2.01 ≤ 2×1.02)", n)
	}
	if n := Smallest(pts, 0.001); n != 32 {
		t.Errorf("Smallest within 0.1%%: %d, want 32", n)
	}
	if n := Smallest([]SMPoint{{SMs: 8, Status: "failed"}}, 0.02); n != 0 {
		t.Errorf("Smallest of none: %d", n)
	}
}

// samples are n draws around ms with a relative spread.
func samples(r *rand.Rand, n int, ms, spread float64) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = ms * (1 + spread*(r.Float64()-0.5))
	}
	return x
}

// TestDecide: on a GPU's times compare's fine test separates a finalist
// planted 10% slower, and finds no significant difference between two
// equal ones; on the host device only a gross difference separates.
func TestDecide(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	o := Options{Compare: results.DefaultCompareOptions}
	o.Base.Device = "cuda"
	fast := &Final{Dispatcher: "deepep", Impl: "native", SMs: 24, Status: "ok", Samples: samples(r, 40, 1.0, 0.02)}
	slow := &Final{Dispatcher: "alltoall", Impl: "native", Status: "ok", Samples: samples(r, 40, 1.1, 0.02)}
	for _, f := range []*Final{fast, slow} {
		f.P50 = medianOf(f.Samples)
	}
	d := decide([]*Final{slow, fast}, o)
	if !d.Separated || d.Winner != "deepep/native sms=24" || d.RunnerUp != "alltoall/native" || d.Shift.Lo <= 0 || !strings.Contains(d.Summary, "is the fastest") {
		t.Errorf("planted 10%% slower: %+v", d)
	}
	same := &Final{Dispatcher: "hybridep", Impl: "native", SMs: 16, Status: "ok", Samples: samples(r, 40, 1.0, 0.02)}
	same.P50 = medianOf(same.Samples)
	d = decide([]*Final{fast, same}, o)
	if d.Separated || !strings.Contains(d.Summary, "no significant difference") || d.Verdict != results.VerdictSame {
		t.Errorf("equal: %+v", d)
	}
	// the host device: 10% is no decision, 10× is
	o.Base.Device = "host"
	if d = decide([]*Final{slow, fast}, o); d.Separated || d.Verdict != results.VerdictHost {
		t.Errorf("host, 10%%: %+v", d)
	}
	gross := &Final{Dispatcher: "alltoall", Impl: "native", Status: "ok", Samples: samples(r, 10, 10, 0.02)}
	gross.P50 = medianOf(gross.Samples)
	if d = decide([]*Final{gross, fast}, o); !d.Separated || d.Winner != fast.Label() {
		t.Errorf("host, 10×: %+v", d)
	}
	// skewed samples: the lower median is not the faster by compare's
	// estimate over all pairs, which decides (the runner-up is never
	// "faster" than the winner)
	a := &Final{Dispatcher: "alltoall", Impl: "native", Status: "ok", Samples: []float64{1, 1, 1, 1, 3, 3, 3}}            // median 1
	b := &Final{Dispatcher: "feplb", Impl: "native", Status: "ok", Samples: []float64{1.5, 1.5, 1.5, 1.5, 0.5, 0.5, 0.5}} // median 1.5; lower in 33 of 49 pairs
	a.P50, b.P50 = medianOf(a.Samples), medianOf(b.Samples)
	o.Base.Device = "cuda"
	if d = decide([]*Final{a, b}, o); d.Winner != b.Label() || d.Shift.Est < 0 {
		t.Errorf("skewed: %+v (medians %g and %g)", d, a.P50, b.P50)
	}
	o.Base.Device = "host"
	// a finalist that failed its check is never the winner
	bad := &Final{Dispatcher: "feplb", Impl: "native", Status: results.StatusFailed, Samples: samples(r, 10, 0.1, 0.02)}
	bad.P50 = medianOf(bad.Samples)
	if d = decide([]*Final{bad, fast}, o); d.Winner != fast.Label() || d.RunnerUp != "" {
		t.Errorf("failed finalist: %+v", d)
	}
}

// answer is an answer measured on an H100 where alltoall beat deepep.
func answer(device, gpu string) *Answer {
	r := rand.New(rand.NewPCG(3, 4))
	a := &Answer{Schema: Schema, Device: device, GPU: gpu, Preset: "qwen3-30b-a3b", Workload: "qwen3-30b-a3b tokens=4096 ep=8 device=" + device, BudgetS: 600, Rounds: 3,
		Gate: []Gate{{Dispatcher: "alltoall", Impl: "native", Available: true}, {Dispatcher: "deepep", Impl: "library", Reason: "NCCL EP is missing", Stage: "gate"}}}
	w := &Final{Dispatcher: "alltoall", Impl: "native", Status: "ok", Correct: "PASS", Samples: samples(r, 30, 1, 0.01), MemPerRank: 3 << 30, SMsLeft: "132 of 132"}
	l := &Final{Dispatcher: "deepep", Impl: "native", SMs: 24, Status: "ok", Correct: "PASS", Samples: samples(r, 30, 1.2, 0.01), MemPerRank: 4 << 30, SMsLeft: "108 of 132"}
	w.P50, l.P50 = medianOf(w.Samples), medianOf(l.Samples)
	a.Finalists = []*Final{l, w}
	a.Tuning = []Tuning{{Dispatcher: "deepep", Impl: "native", Points: []SMPoint{{SMs: 16, Ms: 0.5, Status: "ok"}, {SMs: 24, Ms: 0.4, Status: "ok"}}, Best: 24, Smallest: 24}}
	o := Options{Compare: results.DefaultCompareOptions}
	o.Base.Device, o.Base.Preset = device, "qwen3-30b-a3b"
	a.Decision = decide(a.Finalists, o)
	a.Reproduce = "moebench --preset qwen3-30b-a3b --ep 8 --dispatcher alltoall --impl native --device " + device
	a.Guide = StaticGuide(device, gpu, a.Preset)
	a.Guide.Agreement = agreement(a, "alltoall")
	return a
}

// TestGuide: the guide's pick follows the GPU and the model family, and
// the sentence beside the measurement says where they disagree.
func TestGuide(t *testing.T) {
	for _, c := range []struct{ device, gpu, preset, pick string }{
		{"cuda", "NVIDIA H100 80GB HBM3", "qwen3-30b-a3b", "deepep"},
		{"cuda", "NVIDIA H200", "qwen3-235b-a22b", "deepep"},
		{"cuda", "NVIDIA GB200", "qwen3-235b-a22b", "hybridep"},
		{"cuda", "NVIDIA GB200", "deepseek-v3+custom", "hybridep"},
		{"cuda", "NVIDIA H100", "qwen3-next-80b", ""},
		{"cuda", "Fake GPU 0", "mixtral-8x7b", "alltoall"},
		{"host", "", "qwen3-30b-a3b", "alltoall"},
	} {
		if g := StaticGuide(c.device, c.gpu, c.preset); g.Pick != c.pick {
			t.Errorf("%s %q %s: pick %q, want %q (%+v)", c.device, c.gpu, c.preset, g.Pick, c.pick, g)
		}
	}
	a := answer("cuda", "NVIDIA H100 80GB HBM3")
	if !a.Decision.Separated || !strings.Contains(a.Guide.Agreement, "disagrees with the guide: it picks deepep, but alltoall/native was faster") {
		t.Errorf("H100, alltoall faster: %+v; %q", a.Decision, a.Guide.Agreement)
	}
	h := answer("host", "")
	if !strings.Contains(h.Guide.Agreement, "guide's pick, alltoall, has the fastest median") {
		t.Errorf("host: %q", h.Guide.Agreement)
	}
	// the winner and runner-up not separated, the guide's pick third: the
	// measurement separated nothing, so it does not contradict the guide
	r := rand.New(rand.NewPCG(5, 6))
	u := answer("cuda", "NVIDIA H100 80GB HBM3")
	tie := &Final{Dispatcher: "hybridep", Impl: "native", SMs: 16, Status: "ok", Correct: "PASS", Samples: samples(r, 30, 1, 0.3)}
	tie.P50 = medianOf(tie.Samples)
	u.Finalists = append(u.Finalists, tie)
	for _, f := range u.Finalists {
		if f.Dispatcher == "alltoall" {
			f.Samples = samples(r, 30, 1, 0.3)
			f.P50 = medianOf(f.Samples)
		}
	}
	o := Options{Compare: results.DefaultCompareOptions}
	o.Base.Device, o.Base.Preset = "cuda", "qwen3-30b-a3b"
	u.Decision = decide(u.Finalists, o)
	u.Guide.Agreement = agreement(u, "alltoall")
	if u.Decision.Separated || strings.Contains(u.Decision.RunnerUp, "deepep") || !strings.Contains(u.Guide.Agreement, "separates no finalist here") {
		t.Errorf("H100, no finalist separated, the guide's pick third: %+v; %q", u.Decision, u.Guide.Agreement)
	}
}

// TestWriteFormats: every format carries the decision, the runner-up's
// difference with its interval, memory, SMs left, the guide and the
// reproducing command; on the host device the warning comes first and
// last; JSON reads back.
func TestWriteFormats(t *testing.T) {
	for _, device := range []string{"cuda", "host"} {
		a := answer(device, map[string]string{"cuda": "NVIDIA H100 80GB HBM3"}[device])
		for _, f := range Formats {
			var b bytes.Buffer
			if err := Write(&b, a, f, nil); err != nil {
				t.Fatalf("%s %s: %v", device, f, err)
			}
			s := b.String()
			if f == "html" {
				s = html.UnescapeString(s)
			}
			if f == "json" {
				var back Answer
				if err := json.Unmarshal(b.Bytes(), &back); err != nil || back.Decision.Winner != "alltoall/native" || len(back.Finalists) != 2 {
					t.Errorf("json: %v, %+v", err, back.Decision)
				}
				continue
			}
			for _, want := range []string{"alltoall/native", "deepep/native sms=24", "CI", "4096.0", "108 of 132", "NCCL EP is missing",
				"moebench --preset qwen3-30b-a3b --ep 8 --dispatcher alltoall", GuideSource, a.Guide.Agreement} {
				if !strings.Contains(s, want) {
					t.Errorf("%s %s: no %q in\n%s", device, f, want, s)
				}
			}
			lines := strings.Split(strings.TrimSpace(s), "\n")
			warned := strings.Count(s, HostWarning)
			switch {
			case device == "cuda" && warned != 0:
				t.Errorf("%s %s: the host warning on a GPU's answer", device, f)
			case device == "host" && f == "html" && warned != 2:
				t.Errorf("host html: the warning %d times, want first and last", warned)
			case device == "host" && f != "html" && (!strings.Contains(lines[0], HostWarning) || !strings.Contains(lines[len(lines)-1], HostWarning)):
				t.Errorf("host %s: the warning is not first and last:\n%s", f, s)
			}
		}
	}
}

// TestHistoryWinnerChange: the history says when the winner of the same
// question changed, and only then.
func TestHistoryWinnerChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "history.jsonl")
	a := answer("cuda", "NVIDIA H100")
	a.Time = "2026-11-26T02:30:00Z"
	if ch, err := AppendHistory(path, a, "night1"); err != nil || ch != "" {
		t.Fatalf("first: %q, %v", ch, err)
	}
	other := answer("cuda", "NVIDIA H200") // another question: no change
	other.Decision.Winner = "hybridep/native sms=16"
	if ch, err := AppendHistory(path, other, "x"); err != nil || ch != "" {
		t.Fatalf("another question: %q, %v", ch, err)
	}
	if ch, err := AppendHistory(path, a, "night2"); err != nil || ch != "" {
		t.Fatalf("same winner: %q, %v", ch, err)
	}
	b := answer("cuda", "NVIDIA H100")
	b.Decision.Winner = "deepep/native sms=24"
	ch, err := AppendHistory(path, b, "night3")
	if err != nil || !strings.Contains(ch, "the winner changed since 2026-11-26T02:30:00Z: alltoall/native then") || !strings.Contains(ch, "deepep/native sms=24 now") {
		t.Fatalf("changed: %q, %v", ch, err)
	}
	h, err := ReadHistory(path)
	if err != nil || len(h) != 4 {
		t.Fatalf("history: %d entries, %v", len(h), err)
	}
	if err := CheckHistory(filepath.Join(t.TempDir(), "no", "such", "dir")); err == nil {
		t.Error("CheckHistory of a path that cannot be created passed")
	}
}

// TestAbsorbRefusesAnotherPass: a finalist whose run timed the forward
// pass alone (a library without a backward on the cuda device) while the
// others time training steps is not ranked with them; one that failed
// its check is failed; one that passed adds its samples.
func TestAbsorbRefusesAnotherPass(t *testing.T) {
	var c setup.Config = setup.DefaultConfig()
	c.Dispatcher, c.Impl = "deepep", "library"
	ok := func(pass string) *results.Record {
		return &results.Record{Status: results.StatusOK, Config: results.Config{Pass: pass, PassNote: "NCCL EP's low-latency mode has no backward"},
			Correctness: &results.Correctness{Checked: true, Passed: true}, Timing: &results.Timing{Step: results.Phase{Samples: []float64{1, 2, 3}}}}
	}
	f := &Final{Dispatcher: "deepep", Impl: "library", Status: results.StatusOK}
	f.absorb(ok(results.PassForward), c)
	if f.Status != results.StatusUnavailable || !strings.Contains(f.Reason, "cannot be ranked") || !strings.Contains(f.Reason, "no backward") || len(f.Samples) != 0 {
		t.Errorf("forward only among training steps: %+v", f)
	}
	g := &Final{Dispatcher: "deepep", Impl: "library", Status: results.StatusOK}
	g.absorb(ok(results.PassTraining), c)
	if g.Status != results.StatusOK || g.Correct != "PASS" || len(g.Samples) != 3 || g.P50 != 2 {
		t.Errorf("training step: %+v", g)
	}
	bad := ok(results.PassTraining)
	bad.Correctness.Passed, bad.Correctness.Detail = false, "max rel err 1"
	h := &Final{Dispatcher: "deepep", Impl: "library", Status: results.StatusOK}
	h.absorb(bad, c)
	if h.Status != results.StatusFailed || h.Correct != "FAIL" || len(h.Samples) != 0 {
		t.Errorf("failed check: %+v", h)
	}
}

// TestSearchFailed: a search whose every budget was unavailable makes the
// design unavailable; one where a budget failed makes it a failed
// finalist; one that ran, or was never tried, neither.
func TestSearchFailed(t *testing.T) {
	for _, c := range []struct {
		t            Tuning
		status, want string
	}{
		{Tuning{Points: []SMPoint{{SMs: 8, Status: "unavailable", Reason: "does not fit"}}}, "unavailable", "does not fit"},
		{Tuning{Points: []SMPoint{{SMs: 8, Status: "unavailable", Reason: "does not fit"}, {SMs: 16, Status: "failed", Reason: "round trip differs"}}}, "failed", "round trip differs"},
		{Tuning{Points: []SMPoint{{SMs: 8, Status: "ok", Ms: 1}}, Best: 8}, "", ""},
		{Tuning{}, "", ""},
	} {
		if st, why := searchFailed(&c.t); st != c.status || why != c.want {
			t.Errorf("%+v: %q, %q; want %q, %q", c.t, st, why, c.status, c.want)
		}
	}
}

// TestPrecisionInAnswer: an fp8 answer reproduces at fp8 (and with
// hybridep's own block budgets where they are not the default), says fp8
// in its question, workload and winner, and is another question than the
// bf16 one in the history; a bf16 command stays as it was.
func TestPrecisionInAnswer(t *testing.T) {
	c := setup.DefaultConfig()
	c.Preset, c.Device, c.Dispatcher, c.Impl = "tiny", "host", "hybridep", "native"
	bf16 := Reproduce(c)
	if strings.Contains(bf16, "--precision") || strings.Contains(bf16, "-sms") {
		t.Errorf("bf16: %s", bf16)
	}
	c.Precision, c.PreprocessSMs, c.PermuteSMs = setup.PrecisionFP8, 8, 12
	if r := Reproduce(c); !strings.Contains(r, "--precision fp8") || !strings.Contains(r, "--preprocess-sms 8") || !strings.Contains(r, "--permute-sms 12") {
		t.Errorf("fp8: %s", r)
	}

	path := filepath.Join(t.TempDir(), "history.jsonl")
	a := answer("cuda", "NVIDIA H100")
	if _, err := AppendHistory(path, a, "bf16"); err != nil {
		t.Fatal(err)
	}
	o := Options{Compare: results.DefaultCompareOptions}
	o.Base.Device, o.Base.Preset, o.Base.Precision = "cuda", "qwen3-30b-a3b", setup.PrecisionFP8
	b := answer("cuda", "NVIDIA H100")
	b.setPrecision(o)
	b.Decision = decide(b.Finalists, o)
	var buf strings.Builder
	if err := Write(&buf, b, "text", nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"at EP 8 in fp8 on this node?", "precision=fp8", "ANSWER: alltoall/native fp8 is the fastest"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the fp8 answer does not say %q:\n%s", want, buf.String())
		}
	}
	b.Decision.Winner = "deepep/native sms=24 fp8"
	if ch, err := AppendHistory(path, b, "fp8"); err != nil || ch != "" {
		t.Errorf("fp8 after bf16 is another question, not a changed winner: %q, %v", ch, err)
	}
}
