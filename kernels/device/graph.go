package device

import (
	"fmt"

	"github.com/moebench/moebench/internal/cuda"
)

// CUDA graphs: work queued on streams between BeginCapture and EndCapture
// is recorded, not run, and LaunchGraph then queues all of it with one
// call (see cuda.Driver's graph entry points). A capture begins on one
// stream; other streams join it by waiting for an event recorded in it, and
// must be joined back (an event recorded after their last work, which the
// first stream waits for) before it ends. Such a Record inside a capture
// only orders the captured work: no launch records the event, and Elapsed
// on it fails (CUDA_ERROR_INVALID_VALUE); an event that times part of a
// graph is recorded with RecordNode instead (cuda.Driver.RecordNode says
// why, with the driver's documentation).

// Graph is a captured, instantiated graph.
type Graph struct {
	g cuda.Graph
	x cuda.GraphExec
}

// Capturer is a device that captures graphs (the cuda device).
type Capturer interface {
	BeginCapture(s Stream) error
	// EndCapture ends the capture begun on s and instantiates its graph; an
	// error (a call the capture refused invalidates it) leaves no capture.
	EndCapture(s Stream) (*Graph, error)
	LaunchGraph(g *Graph, s Stream) error
	FreeGraph(g *Graph) error
	// RecordNode records e on s, which is being captured, as an event
	// record node: each launch of the graph records e, so that Elapsed
	// times from or to it. It is no dependency inside the capture (a
	// stream of the capture must not Wait for it).
	RecordNode(e Event, s Stream) error
}

func (c *CUDA) BeginCapture(s Stream) error {
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	return c.Drv.BeginCapture(s)
}

func (c *CUDA) EndCapture(s Stream) (*Graph, error) {
	if err := c.MakeCurrent(); err != nil {
		return nil, err
	}
	g, err := c.Drv.EndCapture(s)
	if err != nil {
		return nil, err
	}
	x, err := c.Drv.Instantiate(g)
	if err != nil {
		c.Drv.DestroyGraph(g, nil)
		return nil, fmt.Errorf("instantiating the captured graph: %w", err)
	}
	return &Graph{g: g, x: x}, nil
}

func (c *CUDA) LaunchGraph(g *Graph, s Stream) error {
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	return c.Drv.LaunchGraph(g.x, s)
}

func (c *CUDA) RecordNode(e Event, s Stream) error {
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	return c.Drv.RecordNode(e, s)
}

func (c *CUDA) FreeGraph(g *Graph) error {
	if g == nil {
		return nil
	}
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	return c.Drv.DestroyGraph(g.g, g.x)
}

var _ Capturer = (*CUDA)(nil)
