package harness

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/moebench/moebench/harness/check"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/comm"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// TestDeepEPDeviceLayer: the deepep device pipeline on Emu (the kernels'
// twins, the dispatcher's buffers, descriptors, collective launches and
// host waits, stream order checked) passes the check and equals the host
// deepep layer bit for bit, at EP 2, 4 and 8 with balanced, skewed and
// trace routing, its ranks on one device and on two.
func TestDeepEPDeviceLayer(t *testing.T) {
	for _, ep := range []int{2, 4, 8} {
		for _, routing := range []string{"balanced", "skewed", "trace"} {
			for _, n := range []int{1, 2} {
				t.Run(fmt.Sprintf("ep%d-%s-%ddev", ep, routing, n), func(t *testing.T) { equalsHost(t, harnesstest.DeepEPDevice(t, ep, routing), n) })
			}
		}
	}
}

// TestDeepEPLayerOnHostSim: deepep.cu's kernels in whole layers on the
// host simulation, ranks on one fake GPU (16 SMs, so that 8 ranks' blocks,
// one per SM, fit at once) and on two: each passes the check and gives the host
// deepep layer's output bit for bit (the router's and experts' kernels
// compute as the host does there), training steps whose gradients pass
// the check; one runs through Run, whose record has the design's forward
// and backward phases and buffers.
func TestDeepEPLayerOnHostSim(t *testing.T) {
	t.Setenv("FAKECUDA_SMS", "16")
	comp := hostsim.Setup(t)
	old := device.NewCompiler
	device.NewCompiler = func() (device.Compiler, error) { return comp, nil }
	t.Cleanup(func() { device.NewCompiler = old })
	gs, err := device.OpenGPUs(2, 2, "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, g := range gs {
			g.Close()
		}
	}()
	for _, tc := range []struct {
		ep, gpus int
		routing  string
	}{{2, 1, "balanced"}, {4, 2, "skewed"}, {8, 1, "trace"}, {8, 2, "balanced"}} {
		t.Run(fmt.Sprintf("ep%d-%dgpu-%s", tc.ep, tc.gpus, tc.routing), func(t *testing.T) {
			if tc.ep != 2 {
				hostsim.SkipIfShort(t, "ep2-1gpu-balanced")
			}
			start := time.Now()
			devs := []device.Device{gs[0], gs[1]}
			equalsHostOn(t, harnesstest.DeepEPDevice(t, tc.ep, tc.routing), devs[:tc.gpus]...)
			t.Logf("%.1f s", time.Since(start).Seconds())
		})
	}
	hostsim.SkipIfShort(t, "ep2-1gpu-balanced") // the run below: a training step at EP 8
	c := harnesstest.DeepEPDevice(t, 8, "skewed")
	c.GPUs = 1
	rec, err := Run(c, setup.Env{Version: "test"})
	if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
		t.Fatalf("%v; record %+v", err, rec)
	}
	// a training step: deepep.cu's backward (the cached notify, the
	// dispatch of the output gradients, the combine of the input and
	// probability gradients), every gradient checked against the reference
	if g := rec.Correctness.Grads; rec.Config.Pass != results.PassTraining || g == nil || len(g.PerTensor) < 5 || rec.Traffic.DispatchBackwardLogical == 0 {
		t.Fatalf("pass %q, gradients %+v, traffic %+v", rec.Config.Pass, g, rec.Traffic)
	}
	var phases []string
	for _, p := range rec.Timing.Phases {
		phases = append(phases, p.Name)
	}
	if want := []string{"shared", "router", "layout", "notify", "dispatch", "permute", "experts", "combine",
		"combine-bwd", "experts-bwd", "dispatch-bwd", "router-bwd", "shared-bwd"}; !slices.Equal(phases, want) {
		t.Errorf("phases %v, want %v", phases, want)
	}
	if slices.Max(rec.Ranks.Devices) != 0 || len(rec.Memory.Buffers) != 4 || rec.SMs.Budget != 2 || !rec.Ranks.Emulated {
		t.Errorf("ranks %+v, buffers %+v, SMs %+v", rec.Ranks, rec.Memory.Buffers, rec.SMs)
	}
}

// TestStepReportsKernelFailure: what a dispatcher's CheckStep returns after
// the step's synchronization fails the step (and so the run), as it is.
func TestStepReportsKernelFailure(t *testing.T) {
	dl := deviceRun(t, harnesstest.DeepEPDevice(t, 2, "balanced"), &device.Emu{})
	want := &comm.CommError{Records: []comm.CommRecord{{Rank: 1, PhaseName: "dispatch", WaitName: "tail", TimedOut: true}}}
	dl.Dispatcher = harnesstest.CheckFails{DeviceDispatcher: dl.Dispatcher, Err: want}
	if err := dl.Step(); err != want {
		t.Fatalf("step: %v, want the dispatcher's %v", err, want)
	}
	if _, err := check.CheckDevice(dl); err != want {
		t.Fatalf("check: %v", err)
	}
}
