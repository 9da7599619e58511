package setup

import (
	"math"
	"testing"

	"github.com/moebench/moebench/internal/launch"
)

// TestHostBytesShare: a process's estimate of its share of a training step
// over several processes counts the gradient check's gathers (every rank's
// routing, the all-reduce's rounds), and its own ranks' output reference
// only; a run of one process counts no gathers.
func TestHostBytesShare(t *testing.T) {
	c := DefaultConfig()
	c.Device, c.Dispatcher, c.Impl, c.EP = "cuda", "alltoall", "library", 8
	env := Env{Rendezvous: &launch.Rendezvous{L: launch.Launch{Rank: 1, World: 4}}}
	parts := func(c Config) map[string]float64 {
		m := map[string]float64{}
		for _, p := range MemParts(c, c.ResolvedHostExperts()) {
			m[p.Name] = p.Bytes
		}
		return m
	}
	one, share := parts(c), parts(env.Share(c))
	const gathers = "gradient check's gathers over NCCL"
	if _, ok := one[gathers]; ok {
		t.Errorf("one process counts %s", gathers)
	}
	if got, want := share[gathers], float64(24*c.EP*c.Tokens*c.TopK+2*SumChunk); got != want {
		t.Errorf("%s: %.0f bytes, want %.0f", gathers, got, want)
	}
	// the output reference's per-token buffers: a quarter of the ranks'
	T, h, k := float64(c.Tokens), float64(c.Hidden), float64(c.TopK)
	if d, want := one["float64 reference"]-share["float64 reference"], 0.75*float64(c.EP)*T*(k*(24+8*h)+8*h); math.Abs(d-want) > 1 {
		t.Errorf("float64 reference: a share of four is %.0f bytes less than one process's, want %.0f", d, want)
	}
	if env.HostBytes(c) <= HostBytes(c) || share["float64 gradient reference"] != one["float64 gradient reference"] {
		t.Errorf("HostBytes: one process %d, a share of four %d; gradient reference %.0f and %.0f", HostBytes(c), env.HostBytes(c),
			one["float64 gradient reference"], share["float64 gradient reference"])
	}
}
