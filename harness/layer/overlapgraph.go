package layer

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/moebench/moebench/kernels/device"
)

// The overlapped step as CUDA graphs (--overlap with --cuda-graph;
// docs/overlap.md). The step's actions (overlap.plan: both micro-batches'
// phases and the events between their streams) are cut, as graph.go cuts
// a plain step, before each host wait (Capabilities.HostWait: alltoall's
// count exchange before each micro-batch's dispatch), which cannot be
// captured: it runs on the host between the graphs. Each segment is
// captured from device 0's begin stream (graphs.origin): every stream of
// the step — both micro-batches' rank streams, the shared expert's and the
// deferred wgrad's side streams of each, the other devices' begin streams —
// is forked from it by waiting for an event recorded there, and joined back
// before the capture ends (each records an event the origin waits for), as
// CUDA requires (an unjoined stream: CUDA_ERROR_STREAM_CAPTURE_UNJOINED; a
// stream not forked that the origin waits for:
// CUDA_ERROR_STREAM_CAPTURE_ISOLATION). Inside the capture the events
// between the streams stay plain records (they order the captured work);
// the events that time phases (each phase's start and end, the shared
// expert's, the deferred wgrad's, the step's start) are event record nodes
// (deviceLayer.timing), which every launch records, so that a launched
// graph's phases are timed by its own nodes. A segment's graph is replayed
// while its key (every micro-batch's dispatchers.Graph.Key) stays the same:
// with per-step routing the keys change, so timed steps capture afresh (and
// a step's time includes the GPU idle while the host captures). A capture
// the driver refuses (captureRefused: a call that cannot be captured, such
// as a buffer that has to grow) is issued as plain launches, with every
// stream forked again after it; any other capture error (a missing fork or
// join) fails the step.

// ovGraphs is the overlap's graph state: its segments' graphs, and every
// stream of the step with the event it joins the origin with.
type ovGraphs struct {
	gs       *graphs         // mb0's: the origin, the fork event, the capturer
	streams  [][]ovJoin      // per device
	parts    graphCache[int] // the overlapped step's segments, by position
	segs     int             // segments issued so far (overlap.seg)
	compared string          // how the step compared bit for bit was issued (compare)
}

// Launches and Fallbacks count the overlapped steps' segments launched as
// graphs and issued as plain launches when the driver refused their
// capture.
func (og *ovGraphs) Launches() int  { return og.parts.launches }
func (og *ovGraphs) Fallbacks() int { return og.parts.fallbacks }

// compare says how the step issued since og was before ran: replayed
// from graphs captured earlier, captured, or partly as plain launches.
func (og *ovGraphs) compare(before ovGraphs) string {
	n, c, f := og.parts.launches-before.parts.launches, og.parts.captures-before.parts.captures, og.parts.fallbacks-before.parts.fallbacks
	if c == 0 && f == 0 {
		return fmt.Sprintf("the compared step was replayed from graphs captured before (%d launches)", n)
	}
	return fmt.Sprintf("the compared step: %d graph launches, %d of them captured at that step, %d segments as plain launches", n, c, f)
}

// ovJoin is one stream of the overlapped step and its join event.
type ovJoin struct {
	dev  device.Device
	s    device.Stream
	join device.Event
	what string // for the plants (tests)
}

// NewOverlapCUDAGraphs prepares ov for --cuda-graph: mb0's layer has its graphs
// (NewCUDAGraphs); micro-batch 1's layer shares them, so that its phases' events
// are event record nodes while a segment is captured.
func NewOverlapCUDAGraphs(ov *Overlap) (*ovGraphs, error) {
	l0 := ov.Mb[0]
	og := &ovGraphs{gs: l0.Graph, parts: graphCache[int]{capturer: l0.Graph.capturer, cache: map[int]keyed{}}, streams: make([][]ovJoin, len(l0.devs))}
	if l1 := ov.Mb[1]; l1 != nil {
		l1.Graph = l0.Graph
	}
	add := func(d int, dev device.Device, s device.Stream, what string) error {
		e, err := dev.NewEvent()
		if err != nil {
			return err
		}
		og.streams[d] = append(og.streams[d], ovJoin{dev, s, e, what})
		return nil
	}
	for d := range l0.devs {
		if d > 0 {
			if err := add(d, l0.devs[d], l0.dc[d].beginS, "begin"); err != nil {
				return nil, err
			}
		}
		for _, r := range l0.of[d] {
			for i, l := range ov.Mb {
				if l == nil {
					continue
				}
				dev, o := l.Ranks[r].Dev, &ov.ranks[i][r]
				for _, s := range []struct {
					s    device.Stream
					what string
				}{{l.Ranks[r].Stream, "rank"}, {o.side, "shared"}, {o.wside, "wgrad"}} {
					if err := add(d, dev, s.s, fmt.Sprintf("micro-batch %d rank %d %s", i, r, s.what)); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	return og, nil
}

// planted reports whether the plant (tests) leaves out stream j's fork or
// join: the wgrad side stream of micro-batch 0's first rank.
func (ov *Overlap) planted(what, j string) bool {
	return ov.Plant == what && j == fmt.Sprintf("micro-batch 0 rank %d wgrad", ov.Mb[0].of[0][0])
}

// forkAll makes every stream of the step wait for the origin's work so
// far: inside a capture, they join it.
func (ov *Overlap) forkAll() error {
	l0, gs := ov.Mb[0], ov.Graph.gs
	if err := l0.onDevice0(func() error { return l0.devs[0].Record(gs.fork, gs.origin) }); err != nil {
		return err
	}
	return l0.th.Each(func(d int) error {
		for _, j := range ov.Graph.streams[d] {
			if ov.planted("graph-fork", j.what) {
				continue
			}
			if err := j.dev.Wait(j.s, gs.fork); err != nil {
				return fmt.Errorf("%s: %w", j.what, err)
			}
		}
		return nil
	})
}

// joinAll makes the origin wait for every stream of the step: inside a
// capture, they are joined back.
func (ov *Overlap) joinAll() error {
	l0, gs := ov.Mb[0], ov.Graph.gs
	err := l0.th.Each(func(d int) error {
		for _, j := range ov.Graph.streams[d] {
			if ov.planted("graph-join", j.what) {
				continue
			}
			if err := j.dev.Record(j.join, j.s); err != nil {
				return fmt.Errorf("%s: %w", j.what, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return l0.onDevice0(func() error {
		for _, js := range ov.Graph.streams {
			for _, j := range js {
				if ov.planted("graph-join", j.what) {
					continue
				}
				if err := l0.devs[0].Wait(gs.origin, j.join); err != nil {
					return fmt.Errorf("joining %s back: %w", j.what, err)
				}
			}
		}
		return nil
	})
}

// segments cuts plan before each phase with a host wait.
func (ov *Overlap) segments(plan []ovItem) [][]ovItem {
	var out [][]ovItem
	lo := 0
	for k, it := range plan {
		if k > lo && ov.hostWaits(it) {
			out, lo = append(out, plan[lo:k]), k
		}
	}
	return append(out, plan[lo:])
}

// hostWaits reports whether it is a phase its dispatcher waits on the host
// before.
func (ov *Overlap) hostWaits(it ovItem) bool {
	if it.ph == nil {
		return false
	}
	hw := ov.Mb[it.mb].caps.HostWait
	return hw != nil && hw.Before(it.ph.Name)
}

// graphKey is what the segments' graphs were captured under: every
// micro-batch's dispatcher's key for each of its phases.
func (ov *Overlap) graphKey() string {
	var b strings.Builder
	for i, l := range ov.Mb {
		if l == nil {
			continue
		}
		g := l.caps.Graph
		for _, ph := range ov.plain[i] {
			b.WriteString(g.Key(ph.Name))
			b.WriteByte(0)
		}
	}
	return b.String()
}

// stepGraph issues plan (the overlapped step) as graphs: each segment after
// its host wait, a cached graph launched or a new one captured and
// launched; the streams follow each launch.
func (ov *Overlap) stepGraph(plan []ovItem) error {
	og, l0 := ov.Graph, ov.Mb[0]
	defer func() { ov.seg = 0 }()
	for k, seg := range ov.segments(plan) {
		og.segs++
		ov.seg = og.segs
		if k > 0 && ov.hostWaits(seg[0]) {
			t := time.Now()
			if err := ov.Mb[seg[0].mb].each(jobHostWait, seg[0].ph, false); err != nil {
				return fmt.Errorf("%s of micro-batch %d: host wait: %w", seg[0].ph.Name, seg[0].mb, err)
			}
			l0.WaitMS += float64(time.Since(t).Nanoseconds()) / 1e6
		}
		key := ov.graphKey()
		graph := og.parts.cached(k, key)
		if graph == nil {
			var err error
			if graph, err = ov.capture(seg, k == 0); err != nil {
				if !og.parts.refused(fmt.Sprintf("segment %d", k), err) {
					return fmt.Errorf("overlap: capturing segment %d of the overlapped step: %w", k, err)
				}
				if k == 0 {
					if err := l0.begin(); err != nil {
						return err
					}
				}
				if err := ov.issue(seg, false); err != nil {
					return err
				}
				// Joined into the origin and every stream forked from it again:
				// the next segment (a graph launched on the origin, or plain
				// launches again) follows, and crossWait leaves out its waits
				// for this segment's events.
				if err := ov.joinAll(); err != nil {
					return err
				}
				if err := ov.forkAll(); err != nil {
					return err
				}
				continue
			}
			og.parts.captured(k, key, graph)
		} else {
			ov.replayed(seg)
		}
		if err := l0.onDevice0(func() error { return og.gs.capturer.LaunchGraph(graph, og.gs.origin) }); err != nil {
			return err
		}
		og.parts.launches++
		if err := ov.forkAll(); err != nil { // the streams' later work, and the host's waits on them, follow the graph
			return err
		}
	}
	return nil
}

// replayed notes seg's phases as issued (ov.order) when its graph is
// launched without a capture.
func (ov *Overlap) replayed(seg []ovItem) {
	for _, it := range seg {
		if it.ph != nil {
			ov.lastOrdered = append(ov.lastOrdered, orderedPhase{it.mb, it.ph.Name})
		}
	}
}

// capture records seg as a graph: begun on the origin (with the step's
// begin events in the first segment), every stream forked from it, seg's
// actions, every stream joined back. A refused call ends the capture and
// returns the driver's error; nothing of the segment has run then.
func (ov *Overlap) capture(seg []ovItem, first bool) (*device.Graph, error) {
	l0, gs := ov.Mb[0], ov.Graph.gs
	if err := l0.onDevice0(func() error { return gs.capturer.BeginCapture(gs.origin) }); err != nil {
		return nil, err
	}
	gs.capturing = true
	n := len(ov.lastOrdered)
	if ov.Plant == "graph-drop" { // the graph leaves out micro-batch 0's last forward phase (tests)
		last := ov.plain[0][l0.Forward-1].Name
		seg = slices.DeleteFunc(slices.Clone(seg), func(it ovItem) bool { return it.mb == 0 && it.ph != nil && it.ph.Name == last })
	}
	err := func() error {
		if first {
			if err := l0.begin(); err != nil {
				return err
			}
		}
		if err := ov.forkAll(); err != nil {
			return err
		}
		if err := ov.issue(seg, false); err != nil {
			return err
		}
		return ov.joinAll()
	}()
	gs.capturing = false
	var graph *device.Graph
	var endErr error
	l0.onDevice0(func() error {
		graph, endErr = gs.capturer.EndCapture(gs.origin)
		return nil
	})
	if err == nil {
		err = endErr
	}
	if err != nil {
		ov.lastOrdered = ov.lastOrdered[:n] // issued again as plain launches, or failed
		if graph != nil {
			l0.onDevice0(func() error { return gs.capturer.FreeGraph(graph) })
		}
		return nil, err
	}
	return graph, nil
}

// Free frees the segments' graphs (the streams idle).
func (og *ovGraphs) Free() { og.parts.Free() }

// Describe says how the overlapped steps were issued, for the record.
func (og *ovGraphs) Describe(steps int) string {
	s := og.parts.describe(steps, "the overlapped step issued as CUDA graphs: ",
		"segments cut at the host waits, every stream forked from the capture's origin and joined back, each replayed while every micro-batch's key stays the same")
	if og.compared != "" {
		s += "; " + og.compared
	}
	return s
}
