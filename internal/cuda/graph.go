package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/abi
#include "abi.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// CUDA graphs through stream capture: the work queued on a stream between
// BeginCapture and EndCapture is recorded, not run; Instantiate makes it
// launchable and LaunchGraph runs all of it with one call.

// Graph is a captured graph (CUgraph); GraphExec its launchable form.
type (
	Graph     unsafe.Pointer
	GraphExec unsafe.Pointer
)

// captureModeThreadLocal is CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: only this
// thread's calls that are unsafe during a capture are refused.
const captureModeThreadLocal = 1

// eventRecordExternal is CU_EVENT_RECORD_EXTERNAL (CUevent_record_flags).
const eventRecordExternal = 1

// graphSymbols are the entry points of graphs (CUDA 11.4 and later;
// cuEventRecordWithFlags: 11.1).
var graphSymbols = []string{"cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags", "cuGraphLaunch",
	"cuGraphExecDestroy", "cuGraphDestroy", "cuEventRecordWithFlags"}

// HasGraphs reports whether the driver has stream capture and graphs.
func (d *Driver) HasGraphs() bool {
	for _, n := range graphSymbols {
		if d.fn[n] == nil {
			return false
		}
	}
	return true
}

func (d *Driver) graphs(call string) error {
	if !d.HasGraphs() {
		return fmt.Errorf("%s: this driver has no stream capture and graphs (CUDA 11.4 or later has them)", call)
	}
	return nil
}

// BeginCapture starts capturing the work queued on s (cuStreamBeginCapture,
// thread-local mode). Work other streams queue after waiting for an event
// recorded on s during the capture joins it.
func (d *Driver) BeginCapture(s Stream) error {
	if err := d.graphs("cuStreamBeginCapture"); err != nil {
		return err
	}
	return d.check("cuStreamBeginCapture", C.mbcall_cuStreamBeginCapture_v2(d.fn["cuStreamBeginCapture_v2"], unsafe.Pointer(s), captureModeThreadLocal))
}

// EndCapture ends the capture begun on s and returns the graph.
func (d *Driver) EndCapture(s Stream) (Graph, error) {
	if err := d.graphs("cuStreamEndCapture"); err != nil {
		return nil, err
	}
	var g unsafe.Pointer
	err := d.check("cuStreamEndCapture", C.mbcall_cuStreamEndCapture(d.fn["cuStreamEndCapture"], unsafe.Pointer(s), &g))
	return Graph(g), err
}

// Instantiate makes g launchable (cuGraphInstantiateWithFlags, no flags).
func (d *Driver) Instantiate(g Graph) (GraphExec, error) {
	if err := d.graphs("cuGraphInstantiateWithFlags"); err != nil {
		return nil, err
	}
	var x unsafe.Pointer
	err := d.check("cuGraphInstantiateWithFlags", C.mbcall_cuGraphInstantiateWithFlags(d.fn["cuGraphInstantiateWithFlags"], &x, unsafe.Pointer(g), 0))
	return GraphExec(x), err
}

// RecordNode records e on s, which is being captured, as an event record
// node (cuEventRecordWithFlags with CU_EVENT_RECORD_EXTERNAL): each launch
// of the graph records e, so that e can time part of a graph.
//
// A plain Record during a capture does not: it only orders the capture's
// work (a fork or a join: "Stream capture can handle cross-stream
// dependencies expressed with cudaEventRecord() and cudaStreamWaitEvent(),
// provided the event being waited upon was recorded into the same capture
// graph",
// https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#cross-stream-dependencies-and-events),
// no launch records the event, and cuEventElapsedTime on it fails with
// CUDA_ERROR_INVALID_VALUE (seen on an H200, driver 580.159.04; also
// https://forums.developer.nvidia.com/t/cuda-graphs-error-with-cudaeventelapsedtime-cudaeventinvalidvalue/205299,
// https://github.com/NVIDIA/warp/issues/556). CU_EVENT_RECORD_EXTERNAL:
// "When using stream capture, create an event record node instead of the
// default behavior. This flag is invalid when used outside of capture"
// (https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__TYPES.html);
// an event record node: "Each launch of the graph will record event to
// capture execution of the node's dependencies" (cuGraphAddEventRecordNode,
// https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html).
// PyTorch times parts of graphs with such events
// (https://github.com/pytorch/pytorch/pull/155372). Such an event is no
// dependency inside the capture: a stream of the capture must not wait for
// it (use a plain Record for that).
func (d *Driver) RecordNode(e Event, s Stream) error {
	if err := d.graphs("cuEventRecordWithFlags"); err != nil {
		return err
	}
	return d.check("cuEventRecordWithFlags", C.mbcall_cuEventRecordWithFlags(d.fn["cuEventRecordWithFlags"], unsafe.Pointer(e), unsafe.Pointer(s), eventRecordExternal))
}

// LaunchGraph queues the whole of x on s.
func (d *Driver) LaunchGraph(x GraphExec, s Stream) error {
	return d.check("cuGraphLaunch", C.mbcall_cuGraphLaunch(d.fn["cuGraphLaunch"], unsafe.Pointer(x), unsafe.Pointer(s)))
}

// DestroyGraph frees g and x (either may be nil).
func (d *Driver) DestroyGraph(g Graph, x GraphExec) error {
	var err error
	if x != nil {
		err = d.check("cuGraphExecDestroy", C.mbcall_cuGraphExecDestroy(d.fn["cuGraphExecDestroy"], unsafe.Pointer(x)))
	}
	if g != nil {
		if e := d.check("cuGraphDestroy", C.mbcall_cuGraphDestroy(d.fn["cuGraphDestroy"], unsafe.Pointer(g))); err == nil {
			err = e
		}
	}
	return err
}
