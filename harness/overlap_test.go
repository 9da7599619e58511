package harness

import (
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
)

// overlapCase is a small training layer on the deepep design with a shared
// expert, its ranks on two Emus.
func overlapCase() Config {
	c := small()
	c.Device, c.Dispatcher, c.SMs = "cuda", "deepep", 4
	c.SharedExperts = 1
	return c
}

// newOverlapRun builds c's device layer on Emus and its overlap engine.
func newOverlapRun(t *testing.T, c Config, shared, a2a, delay bool, plant string) *overlap {
	t.Helper()
	devs, _ := emus(2)(2, c.EP)
	dl := deviceRun(t, c, devs...)
	var l1 *Layer
	var d1 dispatchers.DeviceDispatcher
	if a2a {
		var err error
		if l1, err = microBatch(c, 1); err != nil {
			t.Fatal(err)
		}
		if d1, err = dispatchers.NewDevice(c.Dispatcher, c.Impl, c.dispatcherEnv()); err != nil {
			t.Fatal(err)
		}
	}
	for r := range dl.rr { // the grouped GEMM choice chooseGrouped makes
		dl.rr[r].grouped, _ = kernels.NewGrouped(dl.ranks[r].Dev, 0)
	}
	ov, err := newOverlap(dl, shared, a2a, delay, l1, d1)
	if err != nil {
		t.Fatal(err)
	}
	ov.plant = plant
	return ov
}

// TestOverlapEqualsSequential: every overlap form's step gives the outputs
// and gradients of the same step run phase after phase, bit for bit, and
// Emu's stream-order check passes it (every cross-stream access has its
// event).
func TestOverlapEqualsSequential(t *testing.T) {
	for _, tc := range []struct {
		name               string
		shared, a2a, delay bool
	}{{"shared", true, false, false}, {"a2a", false, true, false}, {"a2a-delay-wgrad", false, true, true}, {"delay-wgrad", false, false, true}, {"shared-delay-wgrad", true, false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ov := newOverlapRun(t, overlapCase(), tc.shared, tc.a2a, tc.delay, "")
			for rep := range 2 { // the second reuses every buffer
				if err := ov.step(false); err != nil {
					t.Fatal(err)
				}
				want, err := ov.snapshot()
				if err != nil {
					t.Fatal(err)
				}
				if err := ov.step(true); err != nil {
					t.Fatalf("step %d, overlapped: %v", rep, err)
				}
				got, err := ov.snapshot()
				if err != nil {
					t.Fatal(err)
				}
				if d := want.diff(got); d != "" {
					t.Fatalf("step %d: overlapped differs from sequential: %s", rep, d)
				}
				if _, err := ov.times(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestOverlapPlantedMissingEventFails: leaving out one event of each form
// on purpose makes Emu's stream-order check fail the overlapped step.
func TestOverlapPlantedMissingEventFails(t *testing.T) {
	for _, tc := range []struct {
		plant              string
		shared, a2a, delay bool
	}{{"shared", true, false, false}, {"wgrad", false, false, true}, {"a2a", false, true, false}} {
		t.Run(tc.plant, func(t *testing.T) {
			ov := newOverlapRun(t, overlapCase(), tc.shared, tc.a2a, tc.delay, tc.plant)
			err := ov.step(true)
			if err == nil || !strings.Contains(err.Error(), "stream order") {
				t.Fatalf("a step missing its %s event: %v, want Emu's stream-order failure", tc.plant, err)
			}
			t.Log(err)
		})
	}
}

// TestOverlapMergedOrder: the a2a step pairs each micro-batch's
// communication with the other's compute, as the combined 1F1B schedule.
func TestOverlapMergedOrder(t *testing.T) {
	ov := newOverlapRun(t, overlapCase(), false, true, false, "")
	if err := ov.step(true); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(ov.lastOrdered, " ")
	t.Log(got)
	for _, want := range []string{"0:combine-bwd", "1:router", "1:dispatch", "0:experts-bwd"} {
		if !strings.Contains(got, want) {
			t.Errorf("order %q lacks %s", got, want)
		}
	}
	slots := mergeSlots(ov.over[0][ov.mb[0].forward:], ov.over[1][:ov.mb[1].forward])
	for k, s := range slots {
		if len(s[0]) > 0 && len(s[1]) > 0 && isComm(s[0][0].Name) == isComm(s[1][0].Name) {
			t.Errorf("slot %d pairs %s with %s: both communication or both compute", k, s[0][0].Name, s[1][0].Name)
		}
	}
}

func TestExposedOf(t *testing.T) {
	comm := [][2]float64{{0, 2}, {5, 9}}
	comp := [][2]float64{{1, 6}, {8, 12}}
	if got := exposedOf(comm, comp); got != 1+2 {
		t.Fatalf("exposed %v, want 3", got)
	}
}
