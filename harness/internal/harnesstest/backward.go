package harnesstest

import (
	"encoding/binary"
	"math"
	"os"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/dispatchers/alltoall"
)

// RelDiff is max|a − b| / max|b|.
func RelDiff(a, b []float32) float64 {
	var d, m float64
	for i, v := range b {
		d, m = math.Max(d, math.Abs(float64(a[i]-v))), math.Max(m, math.Abs(float64(v)))
	}
	return d / m
}

func OrElse(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// BrokenBackward wraps alltoall and swaps two rows of rank 0's expert
// output gradients (copies of different tokens) in the combine's backward:
// a backward bug the gradient check must catch.
type BrokenBackward struct{ *alltoall.A2A }

func (b BrokenBackward) Name() string { return "broken-bwd" }

var brokenRanks []*dispatchers.Rank

func (b BrokenBackward) Bind(s dispatchers.Shape, ranks []*dispatchers.Rank) error {
	brokenRanks = ranks
	return b.A2A.Bind(s, ranks)
}

// Backward is alltoall's with CombineBackward in place of its combine-bwd.
func (b BrokenBackward) Backward(experts func(rank int) error) []dispatchers.Step {
	return replace(b.A2A.Backward(experts), dispatchers.BackwardName("combine"), b.CombineBackward)
}

func (b BrokenBackward) CombineBackward(r int) error {
	if err := b.A2A.CombineBackward(r); err != nil || r != 0 {
		return err
	}
	dy := brokenRanks[0].ExpertDY
	h := len(dy) / len(brokenRanks[0].ExpertProbs)
	for j := range h {
		dy[j], dy[len(dy)-h+j] = dy[len(dy)-h+j], dy[j]
	}
	return nil
}

// ReadNpy returns a float32 NPY file's values.
func ReadNpy(t *testing.T, path string) []float32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data := b[10+int(binary.LittleEndian.Uint16(b[8:10])):]
	v := make([]float32, len(data)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return v
}
