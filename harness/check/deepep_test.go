package check

import (
	"reflect"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
)

// layerOutput runs one step of c with the named dispatcher and returns the
// ranks' outputs.
func layerOutput(t *testing.T, c setup.Config, name string) [][]float32 {
	t.Helper()
	l, err := layer.NewLayer(c)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dispatchers.New(name, "native", c.DispatcherEnv())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Bind(l.Shape, l.Ranks); err != nil {
		t.Fatal(err)
	}
	if err := l.Step(d, func(_ string, _ int, fn func() error) error { return fn() }); err != nil {
		t.Fatal(err)
	}
	var y [][]float32
	for _, rk := range l.Ranks {
		y = append(y, rk.Y)
	}
	return y
}

// TestDeepEPEqualsAlltoall: the layer's output with deepep equals
// alltoall's bit for bit where no token has two experts on one rank (one
// expert per rank), and within the check's tolerance otherwise (each
// rank's partial sum is rounded to bf16 once more).
func TestDeepEPEqualsAlltoall(t *testing.T) {
	c := harnesstest.Small()
	c.EP, c.Experts, c.TopK = 8, 8, 3
	if !reflect.DeepEqual(layerOutput(t, c, "deepep"), layerOutput(t, c, "alltoall")) {
		t.Error("one expert per rank: deepep's output differs from alltoall's")
	}
	c = harnesstest.Small()
	c.EP, c.Routing = 2, setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1}
	if diff, ref := harnesstest.LargestDiff(layerOutput(t, c, "deepep"), layerOutput(t, c, "alltoall")); diff == 0 || diff/ref > Tolerance {
		t.Errorf("EP 2, 8 experts a rank: largest difference %g of %g; want some, within %g", diff, ref, Tolerance)
	}
}
