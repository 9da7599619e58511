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
	if fwd, bwd := Verdicts(d, shape, x, routed, true); fwd != "exact" || bwd != "exact" {
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
