package harness

import (
	"errors"
	"fmt"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels/device"
)

// refusingEmu is an Emu whose every capture the driver refuses
// (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), so that every segment of the
// overlapped step falls back to plain launches.
type refusingEmu struct{ *device.Emu }

var errUnsupported = &cuda.Error{Call: "cuStreamBeginCapture", Code: 900, Name: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"}

func (refusingEmu) BeginCapture(device.Stream) error { return errUnsupported }
func (refusingEmu) EndCapture(device.Stream) (*device.Graph, error) {
	return nil, errors.New("no capture begun")
}
func (refusingEmu) LaunchGraph(*device.Graph, device.Stream) error {
	return errors.New("no graph captured")
}
func (refusingEmu) FreeGraph(*device.Graph) error { return nil }
func (refusingEmu) RecordNode(device.Event, device.Stream) error {
	return errors.New("no capture begun")
}

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
			c := overlapCase()
			c.Dispatcher = "alltoall"
			devs := []device.Device{refusingEmu{&device.Emu{}}, refusingEmu{&device.Emu{}}}
			dl := deviceRun(t, c, devs...)
			var l1 *Layer
			var d1 dispatchers.DeviceDispatcher
			var err error
			if tc.a2a {
				if l1, err = microBatch(c, 1); err != nil {
					t.Fatal(err)
				}
				if d1, err = dispatchers.NewDevice(c.Dispatcher, c.Impl, c.dispatcherEnv()); err != nil {
					t.Fatal(err)
				}
			}
			if dl.graph, err = newGraphs(dl); err != nil {
				t.Fatal(err)
			}
			ov, err := newOverlap(dl, tc.shared, tc.a2a, tc.delay, l1, d1)
			if err != nil {
				t.Fatal(err)
			}
			if ov.graph, err = newOvGraphs(ov); err != nil {
				t.Fatal(err)
			}
			for rep := range 2 {
				if err := ov.step(false); err != nil {
					t.Fatal(err)
				}
				want, err := ov.snapshot()
				if err != nil {
					t.Fatal(err)
				}
				if err := ov.step(true); err != nil {
					t.Fatalf("step %d, overlapped, every capture refused: %v", rep, err)
				}
				got, err := ov.snapshot()
				if err != nil {
					t.Fatal(err)
				}
				if d := want.diff(got); d != "" {
					t.Fatalf("step %d: overlapped differs from sequential: %s", rep, d)
				}
			}
			if ov.graph.fallbacks < 2 || ov.graph.launches != 0 {
				t.Fatalf("%d fallbacks, %d launches; want every segment (at least 2 a step) issued as plain launches", ov.graph.fallbacks, ov.graph.launches)
			}
		})
	}
}

// TestCaptureRefused: only the driver's refusal of a call that cannot be
// captured (900), with the capture it invalidated (901) beside it, is a
// refusal; a 901 with a fault of the capture (isolation, 905) on another
// device, a 901 alone, 906, 907 or an error of another kind fail the run.
func TestCaptureRefused(t *testing.T) {
	e := func(code int) error {
		return &cuda.Error{Call: "cuStreamEndCapture", Code: code, Name: fmt.Sprint("code ", code)}
	}
	wrap := func(err error) error { return fmt.Errorf("micro-batch 0 rank 1 wgrad: %w", err) }
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{e(900), true},
		{wrap(e(900)), true},
		{errors.Join(wrap(e(900)), e(900)), true},
		{errors.Join(e(901), wrap(e(900))), true},
		{fmt.Errorf("capture: %w", errors.Join(e(901), e(900))), true},
		{errors.Join(e(901), e(905)), false},
		{errors.Join(e(901), e(900), e(905)), false},
		{errors.Join(e(900), errors.New("emu: stream order: ...")), false},
		{e(901), false},
		{e(905), false},
		{e(906), false},
		{e(907), false},
		{errors.New("no capture"), false},
		{nil, false},
	} {
		if got := captureRefused(tc.err); got != tc.want {
			t.Errorf("captureRefused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
