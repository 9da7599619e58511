package harnesstest

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	_ "github.com/moebench/moebench/dispatchers/all"
	"github.com/moebench/moebench/dispatchers/alltoall"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// Small is a quick layer for tests (fast under -race).
func Small() setup.Config {
	c := setup.DefaultConfig()
	c.Device = "host"
	c.Tokens, c.Hidden, c.FFN, c.EP, c.Warmup, c.Iters = 32, 64, 32, 4, 1, 2
	return c
}

func WriteTrace(t *testing.T, body string) string {
	p := filepath.Join(t.TempDir(), "trace.txt")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Broken wraps alltoall and swaps the first and last rows delivered to rank
// 0 (copies of different tokens): a dispatcher bug the check must catch.
type Broken struct {
	*alltoall.A2A
	ranks  []*dispatchers.Rank
	hidden int
}

func (b *Broken) Name() string { return "broken" }

func (b *Broken) Bind(s dispatchers.Shape, ranks []*dispatchers.Rank) error {
	b.ranks, b.hidden = ranks, s.Hidden
	return b.A2A.Bind(s, ranks)
}

// Forward is alltoall's with Dispatch in place of its dispatch.
func (b *Broken) Forward(experts func(rank int) error) []dispatchers.Step {
	return replace(b.A2A.Forward(experts), "dispatch", b.Dispatch)
}

// replace is steps with the step named name running run.
func replace(steps []dispatchers.Step, name string, run func(rank int) error) []dispatchers.Step {
	for i := range steps {
		if steps[i].Name == name {
			steps[i].Run = run
		}
	}
	return steps
}

func (b *Broken) Dispatch(r int) error {
	if err := b.A2A.Dispatch(r); err != nil || r != 0 {
		return err
	}
	x, h := b.ranks[0].ExpertX, b.hidden
	last := len(x) - h
	for j := range h {
		x[j], x[last+j] = x[last+j], x[j]
	}
	return nil
}

// GEMMBeforeAfter checks a rebalancing run's measured GEMM straggler: after
// is the record's, before comes from as many paused steps, and every step
// of both has its straggler.
func GEMMBeforeAfter(t *testing.T, rec *results.Record) {
	t.Helper()
	rb, ep, iters := rec.Rebalance, rec.Config.EP, rec.Config.Iters
	if !reflect.DeepEqual(rb.GEMMAfter, rec.GEMM.Straggler) {
		t.Errorf("GEMM straggler after %+v, the record's %+v", rb.GEMMAfter, rec.GEMM.Straggler)
	}
	if len(rb.GEMMBefore.PerRank) != ep || slices.Min(rb.GEMMBefore.PerRank) <= 0 || rb.GEMMBefore.Abs < 0 {
		t.Errorf("GEMM straggler before %+v", rb.GEMMBefore)
	}
	if len(rb.PerStep.GEMMBeforeMS) != iters || len(rb.PerStep.GEMMAfterMS) != iters {
		t.Errorf("per-step GEMM stragglers: %d before, %d after; want %d", len(rb.PerStep.GEMMBeforeMS), len(rb.PerStep.GEMMAfterMS), iters)
	}
}

var registerBroken sync.Once

// RegisterBroken registers Broken as dispatcher "broken" (once: the tests
// of every package that names it call this).
func RegisterBroken() {
	registerBroken.Do(func() {
		dispatchers.Register("broken", func(impl string, env dispatchers.Env) (dispatchers.Dispatcher, error) {
			d, err := alltoall.New(impl, env)
			if err != nil {
				return nil, err
			}
			return &Broken{A2A: d.(*alltoall.A2A)}, nil
		})
	})
}
