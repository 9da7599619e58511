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

// graphSymbols are the entry points of graphs (CUDA 11.4 and later).
var graphSymbols = []string{"cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags", "cuGraphLaunch",
	"cuGraphExecDestroy", "cuGraphDestroy"}

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
