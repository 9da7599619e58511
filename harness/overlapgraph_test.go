package harness

import (
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/kernels/device"
)

// TestOverlapGraphFallbackForks: when the driver refuses every segment's
// capture, each segment is issued as plain launches after the streams are
// forked from the origin again, so that the waits left out for events of
// earlier segments (crossWait) are ordered; Emu's stream-order check passes
// the step and it equals the sequential one. Without the fork after a
// fallback's join, shared and a2a-delay-wgrad failed the check here.
func TestOverlapGraphFallbackForks(t *testing.T) {
	for _, tc := range []struct {
		name               string
		shared, a2a, delay bool
	}{{"shared", true, false, false}, {"a2a", false, true, false}, {"a2a-delay-wgrad", false, true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			c := harnesstest.OverlapCase()
			c.Dispatcher = "alltoall"
			devs := []device.Device{harnesstest.RefusingEmu{Emu: &device.Emu{}}, harnesstest.RefusingEmu{Emu: &device.Emu{}}}
			dl := deviceRun(t, c, devs...)
			var l1 *layer.Layer
			var d1 dispatchers.DeviceDispatcher
			var err error
			if tc.a2a {
				if l1, err = layer.MicroBatch(c, 1); err != nil {
					t.Fatal(err)
				}
				if d1, err = dispatchers.NewDevice(c.Dispatcher, c.Impl, c.DispatcherEnv()); err != nil {
					t.Fatal(err)
				}
			}
			if dl.Graph, err = layer.NewCUDAGraphs(dl); err != nil {
				t.Fatal(err)
			}
			ov, err := layer.NewOverlap(dl, tc.shared, tc.a2a, tc.delay, l1, d1)
			if err != nil {
				t.Fatal(err)
			}
			if ov.Graph, err = layer.NewOverlapCUDAGraphs(ov); err != nil {
				t.Fatal(err)
			}
			for rep := range 2 {
				stepBothWays(t, ov, rep, ", every capture refused")
			}
			if ov.Graph.Fallbacks() < 2 || ov.Graph.Launches() != 0 {
				t.Fatalf("%d fallbacks, %d launches; want every segment (at least 2 a step) issued as plain launches", ov.Graph.Fallbacks(), ov.Graph.Launches())
			}
		})
	}
}
