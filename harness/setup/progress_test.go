package setup

import (
	"testing"
	"time"
)

// TestProgressLine: the line says the stage, then once steps run how many
// are done, the time elapsed and the time left at the steps' rate so far.
func TestProgressLine(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0.Add(3 * time.Second)
	p := &Progress{Now: func() time.Time { return now }, start: t0, total: 10, stage: "checking"}
	if got := p.line(); got != "checking · 3s elapsed" {
		t.Errorf("before the steps: %q", got)
	}
	now = t0.Add(2 * time.Second)
	p.Stepping(0)
	for range 4 {
		p.StepDone()
	}
	p.Set("timed step 2 of 8")
	now = t0.Add(10 * time.Second) // 4 steps in 8 s: 6 left take 12 s
	if got, want := p.line(), "timed step 2 of 8 · 4 of 10 steps done (40%) · 10s elapsed · about 12s left"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	now = t0.Add(1234 * time.Millisecond)
	if got := roundDuration(now.Sub(t0)); got != 1200*time.Millisecond {
		t.Errorf("rounded %v", got)
	}
	// a counted stage: its share done and the time left at its own rate
	q := &Progress{Now: func() time.Time { return now }, start: t0, stage: "building the layer"}
	now = t0.Add(20 * time.Second)
	q.Work("building the layer", 128)
	if got, want := q.line(), "building the layer · 0% · 20s elapsed"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	now = t0.Add(30 * time.Second) // 32 experts in 10 s: 96 left take 30 s
	q.Add(32)
	if got, want := q.line(), "building the layer · 25% · 30s elapsed · about 30s left in this stage"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	// within a long step: the share of its work done moves the estimate
	q.Set("timed step 1 of 10")
	now = t0.Add(40 * time.Second)
	q.total = 10
	q.Stepping(200)
	now = t0.Add(44 * time.Second)
	q.StepAdd(50) // a quarter of the first step in 4 s: 9.75 steps left take 156 s
	if got, want := q.line(), "timed step 1 of 10 · 0 of 10 steps done (2%) · 44s elapsed · about 2m36s left"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	q.StepDone()
	q.StepAdd(100) // the second step half done, at 44 s: 1.5 steps in 4 s
	if got, want := q.line(), "timed step 1 of 10 · 1 of 10 steps done (15%) · 44s elapsed · about 23s left"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	q.Set("checking")
	if got, want := q.line(), "checking · 1 of 10 steps done (15%) · 44s elapsed · about 23s left"; got != want {
		t.Errorf("an uncounted stage after a counted one: %q, want %q", got, want)
	}
}
