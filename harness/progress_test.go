package harness

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/harness/check"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels/device"
)

// TestRunProgress: a run reports its progress to Env.Progress once it has
// run ProgressEvery, with the steps done and an estimate, and nothing of
// it goes into the record; a run shorter than that prints nothing.
func TestRunProgress(t *testing.T) {
	c := harnesstest.Small()
	c.Dispatcher, c.Iters = "feplb", 30
	var out harnesstest.LockedBuffer
	rec, err := Run(c, setup.Env{Version: "test", Progress: &out, ProgressEvery: time.Millisecond})
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
	var quiet harnesstest.LockedBuffer
	if _, err := Run(harnesstest.Small(), setup.Env{Version: "test", Progress: &quiet, ProgressEvery: time.Hour}); err != nil || quiet.String() != "" {
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
	for _, hold := range []string{setup.HostExpertsHeld, setup.HostExpertsDrawn} {
		c := harnesstest.Small()
		c.HostExperts = hold
		p := &setup.Progress{Now: time.Now}
		c.AttachRunState(p, c.Interrupt())
		if hold == setup.HostExpertsHeld { // drawn: no weights drawn before the check (Run)
			p.Work(setup.BuildExperts, float64(c.Experts))
		}
		l, d, _ := trained(t, c)
		p.Set("done")
		bsteps, err := l.BackwardSteps(d)
		if err != nil {
			t.Fatal(err)
		}
		fwd, bwd := check.StepsWork(c, l.Steps(d), c.EP), check.StepsWork(c, bsteps, c.EP)
		done := func(stage string, w float64) string { return fmt.Sprintf("%s: %g/%g", stage, w, w) }
		want := []string{done(check.StageStep, fwd), done(check.StageRef, float64(c.Experts))}
		if hold == setup.HostExpertsHeld {
			want = append([]string{done(setup.BuildExperts, float64(c.Experts))}, want...)
			want = append(want, done(check.StageBackward, bwd), done(check.StageGradRef, float64(c.Experts)))
		} else {
			want = append(want, done(check.StageAlongside, float64(c.Experts)))
		}
		if !slices.Equal(p.Stages, want) {
			t.Errorf("%s: stages\n%s\nwant\n%s", hold, strings.Join(p.Stages, "\n"), strings.Join(want, "\n"))
		}
	}
	q, _ := setup.LookupPreset("qwen3-30b-a3b")
	c := harnesstest.Small()
	c.Shape = q.Shape
	if e, m := check.PhaseWork(c, "experts"), check.PhaseWork(c, "dispatch"); e < 100*m || check.PhaseWork(c, "experts-bwd") != 2*e {
		t.Errorf("qwen3-30b-a3b: experts %g, experts-bwd %g, dispatch %g: the expert GEMMs must weigh most", e, check.PhaseWork(c, "experts-bwd"), m)
	}
}

// TestDeviceStagesCountTheirWork: the device check's float64 references,
// computed on the host, count their experts as the host's do.
func TestDeviceStagesCountTheirWork(t *testing.T) {
	c := harnesstest.DeviceCases()["softmax-natural"]
	p := &setup.Progress{Now: time.Now}
	c.AttachRunState(p, c.Interrupt())
	dl := deviceRun(t, c, &device.Emu{})
	if _, err := check.CheckDevice(dl); err != nil {
		t.Fatal(err)
	}
	p.Set("done")
	want := []string{fmt.Sprintf("%s: %d/%d", check.StageRef, c.Experts, c.Experts), fmt.Sprintf("%s: %d/%d", check.StageGradRef, c.Experts, c.Experts)}
	if !slices.Equal(p.Stages, want) {
		t.Errorf("stages\n%s\nwant\n%s", strings.Join(p.Stages, "\n"), strings.Join(want, "\n"))
	}
}
