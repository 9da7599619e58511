package layer

import (
	"math"
	"runtime"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
)

// How a host layer holds its experts' weights and fp32 weight gradients
// (Config.HostExperts). Held is the layer as it always was: every expert's
// weights and weight gradients for the whole run. When those do not fit, a
// rank's weight gradients live only from its expert backward until they
// are complete — the check compares them with the reference there — and
// are then released for the next rank's (grads-by-rank); when the weights
// do not fit either, they are drawn from the seed when an expert's rows are
// computed, a few experts at a time (drawn), in the forward and again in
// the backward. Every mode computes the same numbers: an expert's draws are
// its own streams, so drawn weights are the held ones, and a segment's
// blocks of rows are computed as in held mode, only fewer experts at once.

// HostExpertsNote says how a host run holds its experts in mode when it
// does not hold them all (why: chosen with the flag or by auto), and what
// that does to its times; "" when it does.
func HostExpertsNote(mode string, forced bool) string {
	why := "chosen with --host-experts"
	switch {
	case mode == setup.HostExpertsHeld:
		return ""
	case !forced && mode == setup.HostExpertsByRank:
		why = "the experts' weights and weight gradients do not all fit in the available memory"
	case !forced:
		why = "the experts' weights do not all fit in the available memory with what the run needs besides"
	}
	if mode == setup.HostExpertsByRank {
		return "expert weight gradients kept one rank at a time (" + why + "): each rank's are checked when its expert backward ends, then released"
	}
	return "expert weights drawn on demand (" + why + "): drawn from the seed each time an expert's rows are computed, a few experts at a time, " +
		"so host times include drawing them; each rank's weight gradients are checked when its expert backward ends, then released"
}

// HostExpertsHeldNote says what a rank's accounted host buffers leave out
// in mode (not held).
func HostExpertsHeldNote(mode string) string {
	if mode == setup.HostExpertsDrawn {
		return "the rank holds no expert weights (drawn when used) and, after its backward, no expert weight gradients (released)"
	}
	return "after its backward the rank holds no expert weight gradients (released)"
}

// drawExpert draws expert e's weights into fc1 [2f, h] and fc2 [h, f]
// from its own streams of the seed.
func (l *Layer) drawExpert(e int, fc1, fc2 []float32) {
	h, f := l.Cfg.Hidden, l.Cfg.FFN
	normalInto(fc1, l.Cfg.Seed, "fc1", e, 1/math.Sqrt(float64(h)))
	normalInto(fc2, l.Cfg.Seed, "fc2", e, 1/math.Sqrt(float64(f)))
}

// drawExperts draws the weights of experts (at most ExpertsDrawnAtOnce of them)
// into the layer's draw buffers, each matrix on its own goroutine; the
// weights are valid until the next call.
func (l *Layer) drawExperts(experts []int) []dispatchers.ExpertWeights {
	h, f := l.Cfg.Hidden, l.Cfg.FFN
	for len(l.Drawn) < len(experts) {
		l.Drawn = append(l.Drawn, dispatchers.ExpertWeights{FC1: make([]float32, 2*f*h), FC2: make([]float32, h*f)})
	}
	seed, std1, std2 := l.Cfg.Seed, 1/math.Sqrt(float64(h)), 1/math.Sqrt(float64(f))
	ParallelFor(2*len(experts), runtime.GOMAXPROCS(0), func(_, i int) {
		e, w := experts[i/2], &l.Drawn[i/2]
		if i%2 == 0 {
			normalInto(w.FC1, seed, "fc1", e, std1)
			l.quantWeightAt(w.FC1, 2*f, h)
		} else {
			normalInto(w.FC2, seed, "fc2", e, std2)
			l.quantWeightAt(w.FC2, h, f)
		}
	})
	return l.Drawn[:len(experts)]
}

// drawGroups splits segs, in order, into runs of consecutive segments
// that need the weights of at most n distinct experts drawn (a segment
// with weights of its own needs none).
func drawGroups(segs []dispatchers.Segment, n int) [][]dispatchers.Segment {
	var groups [][]dispatchers.Segment
	start, distinct := 0, map[int]bool{}
	for i, sg := range segs {
		if sg.Weights != nil || distinct[sg.Expert] {
			continue
		}
		if len(distinct) == n {
			groups, start, distinct = append(groups, segs[start:i]), i, map[int]bool{}
		}
		distinct[sg.Expert] = true
	}
	if start < len(segs) {
		groups = append(groups, segs[start:])
	}
	return groups
}

// withDrawn runs fn over segs a group at a time (drawGroups), with a
// function that gives each segment's weights: its own, else its expert's
// drawn for the group.
func (l *Layer) withDrawn(segs []dispatchers.Segment, fn func(segs []dispatchers.Segment, weights func(dispatchers.Segment) *dispatchers.ExpertWeights)) {
	for _, g := range drawGroups(segs, setup.ExpertsDrawnAtOnce(l.Cfg)) {
		var experts []int
		at := map[int]int{}
		for _, sg := range g {
			if _, ok := at[sg.Expert]; sg.Weights == nil && !ok {
				at[sg.Expert] = len(experts)
				experts = append(experts, sg.Expert)
			}
		}
		drawn := l.drawExperts(experts)
		fn(g, func(sg dispatchers.Segment) *dispatchers.ExpertWeights {
			if sg.Weights != nil {
				return sg.Weights
			}
			return &drawn[at[sg.Expert]]
		})
	}
}

// takeGrads gives g zeroed weight-gradient buffers, released ones when
// there are (grads-by-rank and drawn layers).
func (l *Layer) takeGrads(g *dispatchers.ExpertWeights) {
	h, f := l.Cfg.Hidden, l.Cfg.FFN
	if n := len(l.gradFree); n > 0 {
		*g, l.gradFree = l.gradFree[n-1], l.gradFree[:n-1]
		clear(g.FC1)
		clear(g.FC2)
		return
	}
	*g = dispatchers.ExpertWeights{FC1: make([]float32, 2*f*h), FC2: make([]float32, h*f)}
}

// releaseGrads hands rank r's expert weight gradients, complete, to
// gradsDone (the check's comparison) and then releases them for the next
// rank's.
func (l *Layer) releaseGrads(r int) {
	if l.GradsDone != nil {
		l.GradsDone(r)
	}
	for i, g := range l.Ranks[r].ExpertGrads {
		if g.FC1 != nil {
			l.gradFree = append(l.gradFree, g)
			l.Ranks[r].ExpertGrads[i] = dispatchers.ExpertWeights{}
		}
	}
}
