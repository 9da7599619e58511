// Package dispatchtest is what the dispatcher packages' tests share: EP
// ranks whose rows say where they came from, a step run through a
// dispatcher's phases with a stand-in expert, and probabilities that make
// the order of a sum show in its rounding.
//
// Testing without a GPU: docs/testing.md.
package dispatchtest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// Tagged makes EP ranks whose rows encode (rank, token) in their first two
// columns and random bf16 values after, with random routing (k distinct
// experts a token), and probabilities that encode (rank, token, slot).
func Tagged(sh dispatchers.Shape, seed uint64) []*dispatchers.Rank {
	g := rand.New(rand.NewPCG(seed, 1))
	ranks := make([]*dispatchers.Rank, sh.EP)
	for r := range ranks {
		rk := &dispatchers.Rank{ID: r, X: make([]float32, sh.Tokens*sh.Hidden),
			Idx: make([]int32, sh.Tokens*sh.TopK), Probs: make([]float32, sh.Tokens*sh.TopK)}
		for t := range sh.Tokens {
			for c := range sh.Hidden {
				rk.X[t*sh.Hidden+c] = kernels.RoundBF16(float32(g.NormFloat64()))
			}
			rk.X[t*sh.Hidden], rk.X[t*sh.Hidden+1] = float32(r), float32(t)
			for j, e := range g.Perm(sh.Experts)[:sh.TopK] {
				rk.Idx[t*sh.TopK+j] = int32(e)
				rk.Probs[t*sh.TopK+j] = float32(1000*r + 10*t + j)
			}
		}
		ranks[r] = rk
	}
	return ranks
}

// Run runs d's phases on ranks, experts computing y = f(row, prob); it
// stops after the phase named stop ("" for all).
func Run(d dispatchers.Dispatcher, ranks []*dispatchers.Rank, f func(x, p float32) float32, stop string) error {
	experts := func(r int) error {
		rk := ranks[r]
		rk.ExpertY = kernels.Reslice(rk.ExpertY, len(rk.ExpertX))
		for i, v := range rk.ExpertX {
			rk.ExpertY[i] = f(v, rk.ExpertProbs[i/(len(rk.ExpertX)/len(rk.ExpertProbs))])
		}
		return nil
	}
	for _, st := range d.Forward(experts) {
		for r := range ranks {
			if err := st.Run(r); err != nil {
				return err
			}
		}
		if st.Name == stop {
			break
		}
	}
	return nil
}

// Bind binds d to ranks or fails the test.
func Bind(t testing.TB, d dispatchers.Dispatcher, sh dispatchers.Shape, ranks []*dispatchers.Rank) {
	t.Helper()
	if err := d.Bind(sh, ranks); err != nil {
		t.Fatal(err)
	}
}

// Expert is the tests' expert: y = x·p + 1, stored as bf16.
func Expert(x, p float32) float32 { return kernels.RoundBF16(x*p + 1) }

// Probabilities by top-k slot: mild ones, and ones that make the order of
// a sum change its rounding (2²⁰·x + x − 2²⁰·x).
var (
	Mild       = func(j int) float32 { return float32(j+1) / 8 }
	Cancelling = func(j int) float32 { return []float32{1 << 20, 1, -1 << 20}[j%3] }
)

// Outputs runs two steps with Expert on tagged ranks whose probabilities
// are prob(slot), and returns every rank's Y and the ranks.
func Outputs(t testing.TB, d dispatchers.Dispatcher, sh dispatchers.Shape, seed uint64, prob func(int) float32) ([][]float32, []*dispatchers.Rank) {
	t.Helper()
	ranks := Tagged(sh, seed)
	for _, rk := range ranks {
		for i := range rk.Probs {
			rk.Probs[i] = prob(i % sh.TopK)
		}
	}
	Bind(t, d, sh, ranks)
	var y [][]float32
	for range 2 { // the second step reuses every buffer
		if err := Run(d, ranks, Expert, ""); err != nil {
			t.Fatal(err)
		}
		y = y[:0]
		for _, rk := range ranks {
			y = append(y, slices.Clone(rk.Y))
		}
	}
	return y, ranks
}

// SlotsByExpert are token t's top-k slots in ascending expert order.
func SlotsByExpert(rk *dispatchers.Rank, k, t int) []int {
	slots := make([]int, k)
	for j := range slots {
		slots[j] = j
	}
	idx := rk.Idx[t*k : (t+1)*k]
	slices.SortFunc(slots, func(a, b int) int { return int(idx[a] - idx[b]) })
	return slots
}

// IssuePhases runs a device dispatcher's phases on drs as the layer issues
// them (dispatchers' contract): each device's ranks, in rank order, from
// its thread of th, all devices at once, a barrier between phases, and the
// dispatcher's host waits (Capabilities.HostWait) before a phase.
func IssuePhases(th *device.Threads, d dispatchers.DeviceDispatcher, drs []*dispatchers.DeviceRank, phases []dispatchers.Step) error {
	hw := d.Capabilities().HostWait
	devs := th.Devices()
	each := func(f func(r int) error) error {
		return th.Each(func(dev int) error {
			for r, dr := range drs {
				if dr.Dev == devs[dev] {
					if err := f(r); err != nil {
						return fmt.Errorf("rank %d: %w", r, err)
					}
				}
			}
			return nil
		})
	}
	for _, st := range phases {
		if hw != nil && hw.Before(st.Name) {
			if err := each(func(r int) error { return hw.Wait(st.Name, r) }); err != nil {
				return fmt.Errorf("%s: host wait: %w", st.Name, err)
			}
		}
		if err := each(st.Run); err != nil {
			return fmt.Errorf("%s: %w", st.Name, err)
		}
	}
	return nil
}

// Threads makes the issuing threads of drs' devices (each device once, in
// order of first use) and sets every rank's Threads; the test closes them.
func Threads(t testing.TB, drs []*dispatchers.DeviceRank) *device.Threads {
	var devs []device.Device
	for _, dr := range drs {
		if !slices.Contains(devs, dr.Dev) {
			devs = append(devs, dr.Dev)
		}
	}
	th := device.NewThreads(devs)
	t.Cleanup(th.Close)
	for _, dr := range drs {
		dr.Threads = th
	}
	return th
}

// ExpertBackward is Expert's backward on the rows of the rank's segments
// (y = x·p + 1): dx = dy·p stored as bf16, dp = Σ x·dy (a float32 sum in
// column order).
func ExpertBackward(rk *dispatchers.Rank, h int) {
	rows := len(rk.ExpertProbs)
	rk.ExpertDX = kernels.Reslice(rk.ExpertDX, rows*h)
	rk.ExpertDProbs = kernels.Reslice(rk.ExpertDProbs, rows)
	for _, sg := range rk.Segments {
		for i := sg.Start; i < sg.Start+sg.Len; i++ {
			var dp float32
			for c := range h {
				dy := rk.ExpertDY[i*h+c]
				rk.ExpertDX[i*h+c] = kernels.RoundBF16(dy * rk.ExpertProbs[i])
				dp += rk.ExpertX[i*h+c] * dy
			}
			rk.ExpertDProbs[i] = dp
		}
	}
}

// Gradients runs Outputs' steps, then d's backward with ExpertBackward and
// random bf16 output gradients, and returns each rank's DX and DProbs and
// the ranks.
func Gradients(t testing.TB, d dispatchers.Dispatcher, sh dispatchers.Shape, seed uint64, prob func(int) float32) (dx, dprobs [][]float32, ranks []*dispatchers.Rank) {
	t.Helper()
	_, ranks = Outputs(t, d, sh, seed, prob)
	g := rand.New(rand.NewPCG(seed, 2))
	for _, rk := range ranks {
		rk.DY = make([]float32, sh.Tokens*sh.Hidden)
		for i := range rk.DY {
			rk.DY[i] = kernels.RoundBF16(float32(g.NormFloat64()))
		}
	}
	steps := d.Backward(func(r int) error {
		ExpertBackward(ranks[r], sh.Hidden)
		return nil
	})
	if steps == nil {
		t.Fatalf("%s declares no backward: %s", d.Name(), d.Capabilities().NoBackward)
	}
	for _, st := range steps {
		for r := range ranks {
			if err := st.Run(r); err != nil {
				t.Fatalf("%s on rank %d: %v", st.Name, r, err)
			}
		}
	}
	for _, rk := range ranks {
		dx, dprobs = append(dx, slices.Clone(rk.DX)), append(dprobs, slices.Clone(rk.DProbs))
	}
	return dx, dprobs, ranks
}

// WantGradients are Gradients' results computed directly from the ranks:
// a token's input gradient is its copies' bf16(dy·p) summed in float32 in
// ascending expert order and rounded to bf16 once (alltoall's order and
// rounding), each copy's probability gradient x·dy.
func WantGradients(ranks []*dispatchers.Rank, sh dispatchers.Shape) (dx, dprobs [][]float32) {
	h, k := sh.Hidden, sh.TopK
	for _, rk := range ranks {
		x, p := make([]float32, sh.Tokens*h), make([]float32, sh.Tokens*k)
		for t := range sh.Tokens {
			dy, row := rk.DY[t*h:(t+1)*h], x[t*h:(t+1)*h]
			for _, j := range SlotsByExpert(rk, k, t) {
				for c, v := range dy {
					row[c] += kernels.RoundBF16(v * rk.Probs[t*k+j])
					p[t*k+j] += rk.X[t*h+c] * v
				}
			}
			kernels.RoundBF16Slice(row)
		}
		dx, dprobs = append(dx, x), append(dprobs, p)
	}
	return dx, dprobs
}

// Contract checks what the dispatcher contract asks of d beyond its
// methods' types: Backward returns steps exactly when
// Capabilities().NoBackward gives no reason why not, each backward step is
// the dual of a forward step, the design rebalances (Capabilities.Rebalance)
// exactly when its forward has a "rebalance" step, and a design whose
// steps may be graphed has the host waits that cut them.
func Contract[R dispatchers.Rank | dispatchers.DeviceRank](t testing.TB, d dispatchers.Design[R]) {
	t.Helper()
	c, what := d.Capabilities(), d.Name()+" ("+d.Impl()+")"
	fwd, bwd := map[string]bool{}, d.Backward(nil)
	for _, s := range d.Forward(nil) {
		fwd[s.Name] = true
	}
	if (bwd == nil) == (c.NoBackward == "") {
		t.Errorf("%s: %d backward steps, and its reason for none is %q: want steps or a reason, not both", what, len(bwd), c.NoBackward)
	}
	for _, s := range bwd {
		if name, ok := strings.CutSuffix(s.Name, "-bwd"); !ok || !fwd[name] {
			t.Errorf("%s: backward step %s is the dual of no forward step", what, s.Name)
		}
	}
	if (c.Rebalance != nil) != fwd["rebalance"] {
		t.Errorf("%s: Capabilities.Rebalance set %v, a rebalance step %v", what, c.Rebalance != nil, fwd["rebalance"])
	}
	if c.Graph != nil && c.HostWait == nil {
		t.Errorf("%s: its steps may be graphed, but it declares no host waits to cut them at", what)
	}
}
