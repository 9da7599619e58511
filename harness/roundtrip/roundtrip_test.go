package roundtrip

import (
	"math"
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/dispatchers/alltoall"
)

// TestVerdict: alltoall gives every rank its input back exactly, forward
// and backward; a combine that loses a value is caught.
func TestVerdict(t *testing.T) {
	shape := dispatchers.Shape{Tokens: 6, Hidden: 8, Experts: 4, TopK: 3, EP: 2}
	x, routed := make([][]float32, shape.EP), make([]*dispatchers.Rank, shape.EP)
	for r := range x {
		x[r] = make([]float32, shape.Tokens*shape.Hidden)
		for i := range x[r] {
			x[r][i] = float32(math.Sin(float64(1 + i + 100*r)))
		}
		idx := make([]int32, shape.Tokens*shape.TopK)
		for i := range idx {
			idx[i] = int32((i/shape.TopK + i%shape.TopK + r) % shape.Experts) // k distinct experts a token
		}
		routed[r] = &dispatchers.Rank{ID: r, Idx: idx}
	}
	d, err := alltoall.New("native", dispatchers.Env{Device: "host"})
	if err != nil {
		t.Fatal(err)
	}
	if fwd, bwd := Verdicts(d, shape, x, routed, true, ""); fwd != "exact" || bwd != "exact" {
		t.Errorf("alltoall: forward %q, backward %q; want exact", fwd, bwd)
	}
	rt := New(shape, x, routed)
	if err := d.Bind(shape, rt.Ranks); err != nil {
		t.Fatal(err)
	}
	for _, st := range d.Forward(rt.Identity) {
		for r := range rt.Ranks {
			if err := st.Run(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	rt.Ranks[1].Y[3] = float32(math.NaN())
	if v := rt.Verdict(); !strings.HasPrefix(v, "rank 1 token 0 element 3:") {
		t.Errorf("a lost value: verdict %q", v)
	}
}

// scaleDropper is a dispatcher that loses the scales of its rows: the
// expert side reads multipliers of 1 (tests).
type scaleDropper struct {
	dispatchers.Dispatcher
	ranks []*dispatchers.Rank
}

func (s *scaleDropper) Bind(shape dispatchers.Shape, ranks []*dispatchers.Rank) error {
	s.ranks = ranks
	return s.Dispatcher.Bind(shape, ranks)
}

func (s *scaleDropper) Forward(expert func(rank int) error) []dispatchers.Step {
	return s.Dispatcher.Forward(func(r int) error {
		for i := range s.ranks[r].ExpertScales {
			s.ranks[r].ExpertScales[i] = 1
		}
		return expert(r)
	})
}

// TestVerdictsAtPrecision: at fp8 and mxfp8 the round trip sends the
// quantized rows and their scales, as the step does (the layer check's
// round_trip verdict is about the rows the run moves): alltoall is exact
// at each, forward and backward; a dispatcher that loses the scales is
// caught (at bf16 rows it would pass: nothing to lose).
func TestVerdictsAtPrecision(t *testing.T) {
	shape := dispatchers.Shape{Tokens: 6, Hidden: 128, Experts: 4, TopK: 2, EP: 2}
	x, routed := make([][]float32, shape.EP), make([]*dispatchers.Rank, shape.EP)
	for r := range x {
		x[r] = make([]float32, shape.Tokens*shape.Hidden)
		for i := range x[r] {
			x[r][i] = float32(math.Sin(float64(1+i+100*r))) * float32(1+i%7)
		}
		idx := make([]int32, shape.Tokens*shape.TopK)
		for i := range idx {
			idx[i] = int32((i/shape.TopK + i%shape.TopK + r) % shape.Experts)
		}
		routed[r] = &dispatchers.Rank{ID: r, Idx: idx}
	}
	for _, p := range []string{dispatchers.PrecisionFP8, dispatchers.PrecisionMXFP8} {
		d, err := alltoall.New("native", dispatchers.Env{Device: "host", Precision: p, Hidden: shape.Hidden})
		if err != nil {
			t.Fatal(err)
		}
		if fwd, bwd := Verdicts(d, shape, x, routed, true, p); fwd != "exact" || bwd != "exact" {
			t.Errorf("alltoall at %s: forward %q, backward %q; want exact", p, fwd, bwd)
		}
		d, _ = alltoall.New("native", dispatchers.Env{Device: "host", Precision: p, Hidden: shape.Hidden})
		if fwd, _ := Verdicts(&scaleDropper{Dispatcher: d}, shape, x, routed, false, p); fwd == "exact" {
			t.Errorf("at %s a dispatcher that loses the scales passes the round trip", p)
		}
	}
}
