package harnesstest

import (
	"errors"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels/device"
)

// RefusingEmu is an Emu whose every capture the driver refuses
// (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), so that every segment of the
// overlapped step falls back to plain launches.
type RefusingEmu struct{ *device.Emu }

var errUnsupported = &cuda.Error{Call: "cuStreamBeginCapture", Code: 900, Name: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"}

func (RefusingEmu) BeginCapture(device.Stream) error { return errUnsupported }
func (RefusingEmu) EndCapture(device.Stream) (*device.Graph, error) {
	return nil, errors.New("no capture begun")
}
func (RefusingEmu) LaunchGraph(*device.Graph, device.Stream) error {
	return errors.New("no graph captured")
}
func (RefusingEmu) FreeGraph(*device.Graph) error { return nil }
func (RefusingEmu) RecordNode(device.Event, device.Stream) error {
	return errors.New("no capture begun")
}
