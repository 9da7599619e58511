package layer

import (
	"errors"
	"fmt"
	"time"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels/device"
)

// --cuda-graph: the step issued as CUDA graphs (stream capture), as
// Transformer Engine scopes graphs over the router and preprocessing. The
// step is cut at the dispatcher's host waits (alltoall: before dispatch,
// the count exchange) into segments. A segment is captured from device 0's
// begin stream — every rank's stream joins the capture by waiting for an
// event recorded in it and is joined back at its end — instantiated, and
// launched with one call; it is replayed, not captured again, while its
// key (dispatchers.Graph.Key: for alltoall's second segment, every
// rank's counts) stays the same from step to step (the dispatcher's host
// state is then the one the capture left). A capture the driver refuses
// (captureRefused: a call that cannot be captured, such as a buffer that
// has to grow) is dropped and its phases are issued as plain launches; the
// record counts such steps. Any other capture error fails the step.
//
// Phase times under graphs: an event recorded with a plain cuEventRecord
// during a capture only orders the captured work — no launch records it,
// and cuEventElapsedTime on it fails with CUDA_ERROR_INVALID_VALUE, as it
// did on an H200 (driver 580) for every phase. So while a segment is
// captured, the events that time phases (each phase's start and end per
// rank, and each device's step start, begin) are recorded as event record
// nodes (device.Capturer.RecordNode: cuEventRecordWithFlags with
// CU_EVENT_RECORD_EXTERNAL), which each launch records; the events that
// fork and join streams stay plain records, and the step start that the
// ranks wait for (devCommon.begin) has a timing twin here. See
// cuda.Driver.RecordNode for the driver's documentation.
type graphs struct {
	g         dispatchers.Capabilities // with a Graph and a HostWait
	capturer  device.Capturer
	origin    device.Stream // device 0's begin stream
	fork      device.Event  // recorded on origin: the ranks' streams wait for it
	join      []device.Event
	joinDev   []device.Event     // devices' begin streams but device 0's
	begin     []device.Event     // per device: the step's start for timing (see timing), recorded beside devCommon.begin
	capturing bool               // a segment is being captured: timing events are event record nodes
	segs      graphCache[string] // by segment (its first phase)
}

// graphCache holds a step's segments' graphs, each with the key it was
// captured under, and counts how the segments were issued: graphs
// launched, captured, and issued as plain launches when the driver refused
// the capture (why: the first refusal).
type graphCache[K comparable] struct {
	capturer                      device.Capturer
	cache                         map[K]keyed
	launches, captures, fallbacks int
	why                           string
}

// keyed is a segment's graph and the key it was captured under.
type keyed struct {
	key   string
	graph *device.Graph
}

// cached is segment seg's graph if it was captured under key, else nil
// (a graph under another key is freed: the streams are idle, the step
// before ended with a sync).
func (c *graphCache[K]) cached(seg K, key string) *device.Graph {
	e, ok := c.cache[seg]
	if ok && e.key == key {
		return e.graph
	}
	if ok {
		c.capturer.FreeGraph(e.graph)
		delete(c.cache, seg)
	}
	return nil
}

// captured keeps g, segment seg's graph captured under key.
func (c *graphCache[K]) captured(seg K, key string, g *device.Graph) {
	c.captures++
	c.cache[seg] = keyed{key, g}
}

// refused counts err, a capture's failure, as a fallback to plain launches
// if it is the driver's refusal (captureRefused), and reports whether it
// is; where names the segment in the record.
func (c *graphCache[K]) refused(where string, err error) bool {
	if !captureRefused(err) {
		return false
	}
	c.fallbacks++
	if c.why == "" {
		c.why = fmt.Sprintf("%s: %v", where, err)
	}
	return true
}

// Free frees the cached graphs (the streams idle).
func (c *graphCache[K]) Free() {
	for _, e := range c.cache {
		c.capturer.FreeGraph(e.graph)
	}
	clear(c.cache)
}

// describe is the record's sentence: what was issued over steps, how
// (the caller's words), and the fallbacks.
func (c *graphCache[K]) describe(steps int, what, how string) string {
	s := fmt.Sprintf("%s%d graph launches over %d steps (%s), %d captures; phases timed by event record nodes inside the graphs (cuEventRecordWithFlags, CU_EVENT_RECORD_EXTERNAL)",
		what, c.launches, steps, how, c.captures)
	if c.fallbacks > 0 {
		s += fmt.Sprintf("; %d segments issued as plain launches when the driver refused their capture (first: %s)", c.fallbacks, c.why)
	}
	return s
}

// NewCUDAGraphs prepares dl for --cuda-graph, or says why it cannot be.
func NewCUDAGraphs(dl *DeviceLayer) (*graphs, error) {
	g := dl.caps
	if g.Graph == nil || g.HostWait == nil {
		return nil, fmt.Errorf("%s does not issue its steps as graphs in this build", dl.Dispatcher.Name())
	}
	if why := g.Graph.No(); why != "" {
		return nil, errors.New(why)
	}
	capt, ok := dl.devs[0].(device.Capturer)
	if !ok {
		return nil, fmt.Errorf("the %s device captures no graphs", dl.devs[0].Name())
	}
	if c, ok := dl.devs[0].(*device.CUDA); ok && !c.Drv.HasGraphs() {
		return nil, fmt.Errorf("this driver has no stream capture and graphs (CUDA 11.4 or later has them)")
	}
	gs := &graphs{g: g, capturer: capt, origin: dl.dc[0].beginS, segs: graphCache[string]{capturer: capt, cache: map[string]keyed{}}}
	var err error
	if gs.fork, err = dl.devs[0].NewEvent(); err != nil {
		return nil, err
	}
	for _, rk := range dl.Ranks {
		e, err := rk.Dev.NewEvent()
		if err != nil {
			return nil, err
		}
		gs.join = append(gs.join, e)
	}
	for _, dev := range dl.devs[1:] {
		e, err := dev.NewEvent()
		if err != nil {
			return nil, err
		}
		gs.joinDev = append(gs.joinDev, e)
	}
	for i, dev := range dl.devs {
		if _, ok := dev.(device.Capturer); !ok {
			return nil, fmt.Errorf("the %s device (GPU %d) captures no graphs", dev.Name(), i)
		}
		e, err := dev.NewEvent()
		if err != nil {
			return nil, err
		}
		gs.begin = append(gs.begin, e)
	}
	return gs, nil
}

// timing records e, an event that times (a phase's start or end, a step's
// start), on dev's stream s: while a segment is being captured as an event
// record node, which each launch of the graph records (a plain record
// there would time nothing: see graphs), otherwise as a plain record.
func (dl *DeviceLayer) timing(dev device.Device, e device.Event, s device.Stream) error {
	if dl.Graph == nil || !dl.Graph.capturing {
		return dev.Record(e, s)
	}
	if err := dev.(device.Capturer).RecordNode(e, s); err != nil { // NewCUDAGraphs checked every device
		return fmt.Errorf("recording a timing event as an event record node of the graph (cuEventRecordWithFlags, CU_EVENT_RECORD_EXTERNAL): %w", err)
	}
	return nil
}

// timeBegin records device dev's timing twin of its begin event (see
// graphs), after begin, with --cuda-graph.
func (dl *DeviceLayer) timeBegin(dev int) error {
	if dl.Graph == nil {
		return nil
	}
	return dl.timing(dl.devs[dev], dl.Graph.begin[dev], dl.dc[dev].beginS)
}

// stepBegin is the event a rank's step time runs from: its device's begin
// event, or with --cuda-graph that event's timing twin.
func (dl *DeviceLayer) stepBegin(r int) device.Event {
	if dl.Graph != nil {
		return dl.Graph.begin[dl.on[r]]
	}
	return dl.dc[dl.on[r]].begin
}

// segments cuts the step's phases before each host wait.
func (gs *graphs) segments(phs []dispatchers.Step) [][]dispatchers.Step {
	var out [][]dispatchers.Step
	lo := 0
	for i, ph := range phs {
		if i > lo && gs.g.HostWait.Before(ph.Name) {
			out, lo = append(out, phs[lo:i]), i
		}
	}
	return append(out, phs[lo:])
}

// stepGraph is step with --cuda-graph: each segment after its host wait, a
// cached graph launched or a new one captured and launched.
func (dl *DeviceLayer) stepGraph() error {
	gs := dl.Graph
	t0 := time.Now()
	dl.WaitMS = 0
	for i, seg := range gs.segments(dl.Steps()) {
		if gs.g.HostWait.Before(seg[0].Name) {
			t := time.Now()
			if err := dl.each(jobHostWait, &seg[0], false); err != nil {
				return fmt.Errorf("%s: host wait: %w", seg[0].Name, err)
			}
			dl.WaitMS += float64(time.Since(t).Nanoseconds()) / 1e6
		}
		key := gs.g.Graph.Key(seg[0].Name)
		graph := gs.segs.cached(seg[0].Name, key)
		if graph == nil {
			var err error
			if graph, err = dl.capture(seg, i == 0); err != nil {
				if !gs.segs.refused(seg[0].Name, err) { // not the capture's refusal: a failure
					return err
				}
				if err := dl.plain(seg, i == 0); err != nil {
					return err
				}
				continue
			}
			gs.segs.captured(seg[0].Name, key, graph)
		}
		if err := dl.onDevice0(func() error { return gs.capturer.LaunchGraph(graph, gs.origin) }); err != nil {
			return err
		}
		gs.segs.launches++
		if err := dl.forkRanks(); err != nil { // the ranks' later work, and the host's waits on their streams, follow the graph
			return err
		}
	}
	dl.IssueMS = float64(time.Since(t0).Nanoseconds())/1e6 - dl.WaitMS
	return dl.Finish()
}

// plain issues a segment as plain launches (the first with the step's
// begin events).
func (dl *DeviceLayer) plain(seg []dispatchers.Step, first bool) error {
	if first {
		if err := dl.begin(); err != nil {
			return err
		}
	}
	return dl.phases(seg, false, false)
}

// capture records seg as a graph: begun on the origin stream, the ranks'
// streams joining (through the begin events in the first segment, a fork
// event after), joined back at the end. The capture is begun and ended on
// device 0's thread; every device's thread issues its ranks' work into it.
// A refused call ends the capture and returns the driver's error; nothing
// of the segment has run then.
func (dl *DeviceLayer) capture(seg []dispatchers.Step, first bool) (*device.Graph, error) {
	gs := dl.Graph
	if err := dl.onDevice0(func() error { return gs.capturer.BeginCapture(gs.origin) }); err != nil {
		return nil, err
	}
	gs.capturing = true
	err := func() error {
		if first {
			if err := dl.begin(); err != nil {
				return err
			}
		} else if err := dl.forkRanks(); err != nil {
			return err
		}
		if err := dl.phases(seg, false, false); err != nil {
			return err
		}
		return dl.joinBack(first)
	}()
	gs.capturing = false
	var graph *device.Graph
	var endErr error
	dl.onDevice0(func() error {
		graph, endErr = gs.capturer.EndCapture(gs.origin)
		return nil
	})
	if err != nil { // the refused call's error says more than the invalidated capture's
		if graph != nil {
			dl.onDevice0(func() error { return gs.capturer.FreeGraph(graph) })
		}
		return nil, err
	}
	return graph, endErr
}

// onDevice0 runs f on device 0's thread.
func (dl *DeviceLayer) onDevice0(f func() error) error {
	return dl.th.Each(func(dev int) error {
		if dev != 0 {
			return nil
		}
		return f()
	})
}

// forkRanks makes every rank's stream wait for the origin stream's work so
// far (inside a capture: the ranks' streams join it): the fork event
// recorded on device 0's thread, then each device's ranks waiting for it
// on theirs.
func (dl *DeviceLayer) forkRanks() error {
	gs := dl.Graph
	if err := dl.onDevice0(func() error { return dl.devs[0].Record(gs.fork, gs.origin) }); err != nil {
		return err
	}
	return dl.th.Each(func(dev int) error {
		for _, r := range dl.of[dev] {
			if err := dl.Ranks[r].Dev.Wait(dl.Ranks[r].Stream, gs.fork); err != nil {
				return err
			}
		}
		return nil
	})
}

// joinBack makes the origin stream wait for every rank's stream (and, in
// the first segment, every device's begin stream): each device's thread
// records its join events, then device 0's waits for them all.
func (dl *DeviceLayer) joinBack(first bool) error {
	gs := dl.Graph
	err := dl.th.Each(func(dev int) error {
		for _, r := range dl.of[dev] {
			if err := dl.Ranks[r].Dev.Record(gs.join[r], dl.Ranks[r].Stream); err != nil {
				return err
			}
		}
		if first && dev > 0 {
			return dl.devs[dev].Record(gs.joinDev[dev-1], dl.dc[dev].beginS)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return dl.onDevice0(func() error {
		for r := range dl.Ranks {
			if err := dl.devs[0].Wait(gs.origin, gs.join[r]); err != nil {
				return err
			}
		}
		if !first {
			return nil
		}
		for i := range dl.devs[1:] {
			if err := dl.devs[0].Wait(gs.origin, gs.joinDev[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

// Free frees the cached graphs (the streams idle).
func (gs *graphs) Free() { gs.segs.Free() }

// Describe says how the steps were issued, for the record.
func (gs *graphs) Describe(steps int) string {
	return gs.segs.describe(steps, "used: ", "segments cut at the host waits, each replayed while its key stays the same")
}

// captureRefused reports whether err is the driver's refusal of a call
// that cannot be captured (the segment is then issued as plain launches),
// not a fault of the capture's forks and joins (unjoined, isolation,
// unmatched, merged), which fails the step. err joins every device's
// error (device.Threads.Each): it is a refusal only if every error in it
// is the driver's, each CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900) or
// CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901, the capture a 900 ended),
// with at least one 900. A 901 beside any other error (an isolation on
// another device, say) or alone, an implicit capture (906) or a captured
// event (907) is a fault of the harness: the run fails.
func captureRefused(err error) bool {
	var unsupported, other bool
	var walk func(error)
	walk = func(err error) {
		if ce, ok := err.(*cuda.Error); ok {
			switch ce.Code {
			case 900:
				unsupported = true
			case 901:
			default:
				other = true
			}
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			if e := u.Unwrap(); e != nil {
				walk(e)
				return
			}
			other = true
		default:
			other = true
		}
	}
	if err != nil {
		walk(err)
	}
	return unsupported && !other
}
