package harness

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moebench/moebench/kernels/device"
)

// TestProgressLine: the line says the stage, then once steps run how many
// are done, the time elapsed and the time left at the steps' rate so far.
func TestProgressLine(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0.Add(3 * time.Second)
	p := &progress{now: func() time.Time { return now }, start: t0, total: 10, stage: "checking"}
	if got := p.line(); got != "checking · 3s elapsed" {
		t.Errorf("before the steps: %q", got)
	}
	now = t0.Add(2 * time.Second)
	p.stepping(0)
	for range 4 {
		p.stepDone()
	}
	p.set("timed step 2 of 8")
	now = t0.Add(10 * time.Second) // 4 steps in 8 s: 6 left take 12 s
	if got, want := p.line(), "timed step 2 of 8 · 4 of 10 steps done (40%) · 10s elapsed · about 12s left"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	now = t0.Add(1234 * time.Millisecond)
	if got := roundDuration(now.Sub(t0)); got != 1200*time.Millisecond {
		t.Errorf("rounded %v", got)
	}
	// a counted stage: its share done and the time left at its own rate
	q := &progress{now: func() time.Time { return now }, start: t0, stage: "building the layer"}
	now = t0.Add(20 * time.Second)
	q.work("building the layer", 128)
	if got, want := q.line(), "building the layer · 0% · 20s elapsed"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	now = t0.Add(30 * time.Second) // 32 experts in 10 s: 96 left take 30 s
	q.add(32)
	if got, want := q.line(), "building the layer · 25% · 30s elapsed · about 30s left in this stage"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	// within a long step: the share of its work done moves the estimate
	q.set("timed step 1 of 10")
	now = t0.Add(40 * time.Second)
	q.total = 10
	q.stepping(200)
	now = t0.Add(44 * time.Second)
	q.stepAdd(50) // a quarter of the first step in 4 s: 9.75 steps left take 156 s
	if got, want := q.line(), "timed step 1 of 10 · 0 of 10 steps done (2%) · 44s elapsed · about 2m36s left"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	q.stepDone()
	q.stepAdd(100) // the second step half done, at 44 s: 1.5 steps in 4 s
	if got, want := q.line(), "timed step 1 of 10 · 1 of 10 steps done (15%) · 44s elapsed · about 23s left"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	q.set("checking")
	if got, want := q.line(), "checking · 1 of 10 steps done (15%) · 44s elapsed · about 23s left"; got != want {
		t.Errorf("an uncounted stage after a counted one: %q, want %q", got, want)
	}
}

// lockedBuffer is a bytes.Buffer safe for the progress goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRunProgress: a run reports its progress to Env.Progress once it has
// run ProgressEvery, with the steps done and an estimate, and nothing of
// it goes into the record; a run shorter than that prints nothing.
func TestRunProgress(t *testing.T) {
	c := small()
	c.Dispatcher, c.Iters = "feplb", 30
	var out lockedBuffer
	rec, err := Run(c, Env{Version: "test", Progress: &out, ProgressEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	left := false
	for _, l := range lines {
		if !strings.HasPrefix(l, "moebench: ") || !strings.Contains(l, "elapsed") {
			t.Errorf("progress line %q", l)
		}
		left = left || strings.Contains(l, "steps done") && strings.Contains(l, "left")
	}
	if !left {
		t.Errorf("no line with the steps done and the time left:\n%s", out.String())
	}
	js, _ := json.Marshal(rec)
	if strings.Contains(string(js), "elapsed") {
		t.Error("progress went into the record")
	}
	var quiet lockedBuffer
	if _, err := Run(small(), Env{Version: "test", Progress: &quiet, ProgressEvery: time.Hour}); err != nil || quiet.String() != "" {
		t.Errorf("a short run reported progress: %v %q", err, quiet.String())
	}
}

// TestStagesCountTheirWork: building the layer counts the experts drawn,
// and the check counts its step's phases (each by its work: the expert
// GEMMs weigh most), its references' experts and its backward's phases,
// each stage to its total, so that the progress line's share and time
// left are those of the work; with the experts' weights drawn when used,
// the gradient reference's experts are counted while the backward runs.
func TestStagesCountTheirWork(t *testing.T) {
	for _, hold := range []string{HostExpertsHeld, HostExpertsDrawn} {
		c := small()
		c.HostExperts = hold
		p := &progress{now: time.Now}
		c.carry(p, c.interrupt())
		if hold == HostExpertsHeld { // drawn: no weights drawn before the check (Run)
			p.work(buildExperts, float64(c.Experts))
		}
		l, d, _ := trained(t, c)
		p.set("done")
		bsteps, err := l.backwardSteps(d)
		if err != nil {
			t.Fatal(err)
		}
		fwd, bwd := stepsWork(c, l.steps(d), c.EP), stepsWork(c, bsteps, c.EP)
		done := func(stage string, w float64) string { return fmt.Sprintf("%s: %g/%g", stage, w, w) }
		want := []string{done(checkStep, fwd), done(checkRef, float64(c.Experts))}
		if hold == HostExpertsHeld {
			want = append([]string{done(buildExperts, float64(c.Experts))}, want...)
			want = append(want, done(checkBackward, bwd), done(checkGradRef, float64(c.Experts)))
		} else {
			want = append(want, done(checkAlongside, float64(c.Experts)))
		}
		if !slices.Equal(p.stages, want) {
			t.Errorf("%s: stages\n%s\nwant\n%s", hold, strings.Join(p.stages, "\n"), strings.Join(want, "\n"))
		}
	}
	q, _ := LookupPreset("qwen3-30b-a3b")
	c := small()
	c.Shape = q.Shape
	if e, m := phaseWork(c, "experts"), phaseWork(c, "dispatch"); e < 100*m || phaseWork(c, "experts-bwd") != 2*e {
		t.Errorf("qwen3-30b-a3b: experts %g, experts-bwd %g, dispatch %g: the expert GEMMs must weigh most", e, phaseWork(c, "experts-bwd"), m)
	}
}

// TestDeviceStagesCountTheirWork: the device check's float64 references,
// computed on the host, count their experts as the host's do.
func TestDeviceStagesCountTheirWork(t *testing.T) {
	c := deviceCases()["softmax-natural"]
	p := &progress{now: time.Now}
	c.carry(p, c.interrupt())
	dl := deviceRun(t, c, &device.Emu{})
	if _, err := checkDevice(dl); err != nil {
		t.Fatal(err)
	}
	p.set("done")
	want := []string{fmt.Sprintf("%s: %d/%d", checkRef, c.Experts, c.Experts), fmt.Sprintf("%s: %d/%d", checkGradRef, c.Experts, c.Experts)}
	if !slices.Equal(p.stages, want) {
		t.Errorf("stages\n%s\nwant\n%s", strings.Join(p.stages, "\n"), strings.Join(want, "\n"))
	}
}
