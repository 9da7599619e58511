package balance

import (
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Tests use a shape where moving tokens can pay: a token costs 2·hidden bytes
// to copy and 6·hidden·ffn FLOPs to compute, so with ffn well above
// 989e12/380e9/3 ≈ 870 the copy is cheaper than the compute it relieves.
var (
	topo  = Topology{Ranks: 16, Experts: 64, Domain: 4}
	model = H100(4096, 4096)
)

// TestPolicyInvariants: over skewed, drifting steps every policy's plan
// computes each token copy exactly once, on ranks holding the expert's
// weights, with copy-engine moves inside a domain (Plan.Check).
func TestPolicyInvariants(t *testing.T) {
	o := DefaultOptions
	o.ReplanEvery = 7 // exercise re-placements
	src := NewSkewed(topo, 8, 4096, 1.1, 0.5, 3, 40)
	for _, name := range PolicyNames {
		p, err := New(name, topo, model, o)
		if err != nil {
			t.Fatal(err)
		}
		moves := 0
		for i := range 40 {
			st := src.Step(i)
			pl := p.Plan(st)
			if err := pl.Check(topo, st); err != nil {
				t.Fatalf("%s step %d: %v", name, i, err)
			}
			total := 0
			for _, n := range st.Counts {
				total += n
			}
			sum := 0
			for _, l := range pl.Loads(topo.Ranks) {
				sum += l
			}
			if sum != total {
				t.Fatalf("%s step %d: ranks compute %d copies, %d routed", name, i, sum, total)
			}
			for _, m := range pl.Moves {
				if m.Link == LinkCE && topo.DomainOf(m.From) != topo.DomainOf(m.To) {
					t.Fatalf("%s: CE move leaves its domain: %+v", name, m)
				}
				if m.From == m.To {
					t.Fatalf("%s: move to itself: %+v", name, m)
				}
			}
			moves += len(pl.Moves)
		}
		if name != "none" && moves == 0 {
			t.Errorf("%s moved nothing on skewed routing", name)
		}
	}
}

func TestCheckCatchesBadPlans(t *testing.T) {
	src := NewSkewed(topo, 8, 4096, 1, 0, 1, 1)
	st := src.Step(0)
	p, _ := New("feplb", topo, model, DefaultOptions)
	good := p.Plan(st)
	if len(good.Moves) == 0 {
		t.Fatal("feplb made no moves to corrupt")
	}
	var e int // an expert with a helper
	for _, m := range good.Moves {
		if !m.Weights {
			e = m.Expert
			break
		}
	}
	clone := func() Plan {
		c := good
		c.Shares = make([][]Share, len(good.Shares))
		c.Holders = make([][]int, len(good.Holders))
		for i := range good.Shares {
			c.Shares[i] = append([]Share(nil), good.Shares[i]...)
			c.Holders[i] = append([]int(nil), good.Holders[i]...)
		}
		c.Moves = append([]Move(nil), good.Moves...)
		return c
	}
	lost := clone()
	lost.Shares[e][0].Tokens--
	noWeights := clone()
	noWeights.Holders[e] = noWeights.Holders[e][:1]
	leaves := clone()
	leaves.Moves = append(leaves.Moves, Move{Expert: e, From: 0, To: topo.Domain, Link: LinkCE, Weights: true})
	for name, bad := range map[string]Plan{"lost copy": lost, "no weights": noWeights, "leaves domain": leaves} {
		if err := bad.Check(topo, st); err == nil {
			t.Errorf("%s: Check passed", name)
		}
	}
}

// TestFEPLBBalancesHotRank: one rank's expert is hot; FEPLB spreads it over
// the domain and cuts the token straggler, within the copy budget.
func TestFEPLBBalancesHotRank(t *testing.T) {
	tp := Topology{Ranks: 4, Experts: 16, Domain: 4}
	counts := make([]int, 16)
	for e := range counts {
		counts[e] = 4000
	}
	counts[1] = 36000 // rank 0's second expert
	st := Step{Counts: counts}
	pn, _ := New("none", tp, model, DefaultOptions)
	pf, _ := New("feplb", tp, model, DefaultOptions)
	before, after := pn.Plan(st), pf.Plan(st)
	if err := after.Check(tp, st); err != nil {
		t.Fatal(err)
	}
	lb, la := before.Loads(4), after.Loads(4)
	if slices.Max(lb) != 48000 || slices.Max(la) > 32000 {
		t.Errorf("loads before %v, after %v: want the hot rank relieved", lb, la)
	}
	if !strings.Contains(after.Explain(tp), "weights") {
		t.Errorf("explain shows no weight move:\n%s", after.Explain(tp))
	}
}

// TestFEPLBMovesWhatLandsInTime: an expert so hot that no helper's static
// work can hide its whole share is still partly moved (as much as lands in
// time), and on skewed steps no helper's incoming copies outlast its static
// work (copies into a rank are modelled one after another).
func TestFEPLBMovesWhatLandsInTime(t *testing.T) {
	tp := Topology{Ranks: 4, Experts: 16, Domain: 4}
	counts := make([]int, 16)
	for e := range counts {
		counts[e] = 4000
	}
	counts[1] = 120000
	st := Step{Counts: counts}
	pf, _ := New("feplb", tp, model, DefaultOptions)
	pl := pf.Plan(st)
	if err := pl.Check(tp, st); err != nil {
		t.Fatal(err)
	}
	if l := pl.Loads(4); l[0] > 120000 {
		t.Errorf("loads %v: the hot rank (132000 before) kept its expert", l)
	}
	src := NewSkewed(topo, 8, 4096, 1.2, 0.3, 5, 30)
	pf, _ = New("feplb", topo, model, DefaultOptions)
	for i := range 30 {
		st := src.Step(i)
		pl := pf.Plan(st)
		dyn := DynamicExperts(topo, st.Counts, DefaultOptions.DynamicPerRank)
		static := make([]float64, topo.Ranks)
		for e, n := range st.Counts {
			if !dyn[e] {
				static[topo.Owner(e)] += model.ExpertTime(n)
			}
		}
		in := make([]float64, topo.Ranks)
		for _, m := range pl.Moves {
			in[m.To] += float64(m.Bytes) / model.CE
		}
		for r, s := range in {
			if s > static[r]*(1+1e-9) {
				t.Fatalf("step %d: rank %d receives %.0f µs of copies, has %.0f µs of static work", i, r, s*1e6, static[r]*1e6)
			}
		}
	}
}

func TestEPLBReplicatesHotExperts(t *testing.T) {
	load := make([]float64, topo.Experts)
	for e := range load {
		load[e] = 1
	}
	load[5], load[6] = 50, 30
	h := eplbPlace(topo, load, 1)
	slots := 0
	for _, hs := range h {
		slots += len(hs)
	}
	if slots != topo.Experts+topo.Ranks || len(h[5]) < len(h[6]) || len(h[6]) < 2 || len(h[0]) != 1 {
		t.Errorf("replicas: expert 5 %v, 6 %v, 0 %v; %d slots", h[5], h[6], h[0], slots)
	}
}

func TestSimulateReproducible(t *testing.T) {
	run := func(seed uint64) []SimResult {
		src := NewSkewed(topo, 8, 4096, 0.8, 0.3, seed, 30)
		o := DefaultOptions
		o.ReplanEvery = 5
		r, err := Simulate(topo, model, src, 30, PolicyNames, o)
		if err != nil {
			t.Fatal(err)
		}
		for i := range r {
			r[i].SchedulerMicro = 0 // wall time: the only non-deterministic field
		}
		return r
	}
	a, b, c := run(1), run(1), run(2)
	if !reflect.DeepEqual(a, b) {
		t.Error("same seed, different results")
	}
	if reflect.DeepEqual(a, c) {
		t.Error("different seeds, same results")
	}
	// feplb works inside 4-rank domains only; feplb+place also evens out domains
	if none, fe, fp := a[0].Token.Rel, a[3].Token.Rel, a[4].Token.Rel; !(fe < none && fp < none/2) {
		t.Errorf("token straggler: none %.3f, feplb %.3f, feplb+place %.3f: want feplb < none, feplb+place < none/2", none, fe, fp)
	}
}

func TestSamplers(t *testing.T) {
	g := rand.New(rand.NewPCG(9, 9))
	for _, c := range []struct {
		n int
		p float64
	}{{100, 0.05}, {100000, 0.3}, {50, 0.9}} {
		sum, sq := 0.0, 0.0
		const draws = 4000
		for range draws {
			x := float64(binomial(g, c.n, c.p))
			if x < 0 || x > float64(c.n) {
				t.Fatalf("binomial(%d, %g) = %v", c.n, c.p, x)
			}
			sum += x
			sq += x * x
		}
		mean, v := sum/draws, sq/draws-(sum/draws)*(sum/draws)
		wantM, wantV := float64(c.n)*c.p, float64(c.n)*c.p*(1-c.p)
		if math.Abs(mean-wantM) > 5*math.Sqrt(wantV/draws) || math.Abs(v/wantV-1) > 0.15 {
			t.Errorf("binomial(%d, %g): mean %.2f var %.2f, want %.2f, %.2f", c.n, c.p, mean, v, wantM, wantV)
		}
	}
	p := []float64{0.5, 0.2, 0.1, 0.1, 0.05, 0.05}
	pi := inclusion(p, 3)
	s := 0.0
	for i, x := range pi {
		s += x
		if x > 1 || (i > 0 && x > pi[i-1]) {
			t.Errorf("inclusion %v not in [0,1] and ordered like p", pi)
		}
	}
	if math.Abs(s-3) > 1e-6 {
		t.Errorf("inclusion sums to %v, want k = 3", s)
	}
	split := multinomialEven(g, 1000, 7)
	tot := 0
	for _, x := range split {
		tot += x
	}
	if tot != 1000 {
		t.Errorf("multinomial split %v sums to %d", split, tot)
	}
}

// BenchmarkSimulateEP64 is the target: 1,000 steps at EP 64 with 256
// experts should take under a second for one policy on one core.
func BenchmarkSimulateEP64(b *testing.B) {
	tp := Topology{Ranks: 64, Experts: 256, Domain: 8}
	m := H100(2048, 768)
	for _, pol := range PolicyNames {
		b.Run(pol, func(b *testing.B) {
			for range b.N {
				src := NewSkewed(tp, 8, 4096, 0.8, 0.3, 1, 1000)
				if _, err := Simulate(tp, m, src, 1000, []string{pol}, DefaultOptions); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestCETimes: an owner sending rows to two helpers and weights to one. Its
// way out carries rows and weights, its way in the outputs back; each
// helper's way in carries what it received, its way out its outputs.
func TestCETimes(t *testing.T) {
	moves := []Move{
		{Expert: 0, From: 0, To: 1, Bytes: 600, Link: LinkCE, Weights: true},
		{Expert: 0, From: 0, To: 1, Tokens: 3, Bytes: 300, Link: LinkCE},
		{Expert: 1, From: 0, To: 2, Tokens: 5, Bytes: 500, Link: LinkCE},
		{Expert: 2, From: 3, To: 2, Tokens: 9, Bytes: 9000, Link: LinkNVLink}, // not a copy-engine move
	}
	busiest, back := ceTimes(moves, 4, 100)
	// rank 0: out 600+300+500 = 1400, in 300+500 = 800; rank 1: in 900, out 300
	if busiest != 14 || back != 8 {
		t.Errorf("ceTimes = %v, %v s; want 14 (rank 0's way out), 8 (rank 0's outputs back)", busiest, back)
	}
	// a helper receiving from two owners is the busiest on its way in
	moves = append(moves, Move{Expert: 3, From: 3, To: 1, Tokens: 10, Bytes: 1000, Link: LinkCE, Weights: false})
	if busiest, back = ceTimes(moves, 4, 100); busiest != 19 || back != 10 {
		t.Errorf("ceTimes = %v, %v s; want 19 (rank 1's way in), 10 (rank 3's outputs back)", busiest, back)
	}
}

// TestPhaseEnds: a helper computes its chunks for others before its own
// dynamic experts' kept share, and the outputs go back one after another on
// the owner's way in. Units: one token takes 1 s to compute and 1 s to copy.
func TestPhaseEnds(t *testing.T) {
	m := Model{Hidden: 1, FFN: 1, GEMMRate: 6, HBM: 1e18, CE: 2}
	p := Plan{
		Shares:  [][]Share{{{0, 4}, {1, 3}, {2, 2}}, {{1, 5}}, {{2, 6}}, {{1, 2}}},
		Dynamic: []bool{true, false, false, true},
		Moves: []Move{
			{Expert: 0, From: 0, To: 1, Bytes: 6, Link: LinkCE, Weights: true},
			{Expert: 0, From: 0, To: 1, Tokens: 3, Bytes: 6, Link: LinkCE},
			{Expert: 0, From: 0, To: 2, Bytes: 6, Link: LinkCE, Weights: true},
			{Expert: 0, From: 0, To: 2, Tokens: 2, Bytes: 4, Link: LinkCE},
		},
	}
	// rank 1 computes 5 static + 3 for rank 0 (done at 8), then its own 2;
	// rank 2 computes 6 + 2 (done at 8); rank 0's way in takes rank 1's
	// outputs over 8–11, then rank 2's over 11–13
	gemm, back := phaseEnds(&p, m, 3)
	if !slices.Equal(gemm, []float64{4, 10, 8}) || !slices.Equal(back, []float64{13, 0, 0}) {
		t.Errorf("phaseEnds: GEMMs end %v, outputs back %v; want [4 10 8], [13 0 0]", gemm, back)
	}
	if x := BackExposed(gemm, back); x != 3 {
		t.Errorf("BackExposed = %v s, want 3 (13 − 10)", x)
	}
}

// TestFEPLBPlansTheWayBack: at mild skew, balancing to the mean leaves the
// outputs' way back exposed after the GEMMs; planning for it ends the
// modelled expert phase earlier.
func TestFEPLBPlansTheWayBack(t *testing.T) {
	src := NewSkewed(topo, 8, 4096, 0.4, 0.3, 3, 30)
	var end, exposed [2]float64 // without the rule, with it
	for i, way := range []bool{false, true} {
		pol, _ := New("feplb", topo, model, DefaultOptions)
		pol.(*feplb).wayBack = way
		for s := range 30 {
			pl := pol.Plan(src.Step(s))
			gemm, back := phaseEnds(&pl, model, topo.Ranks)
			x := BackExposed(gemm, back)
			end[i] += slices.Max(gemm) + x
			exposed[i] += x
		}
	}
	t.Logf("mean over 30 steps: expert phase ends %.0f µs → %.0f µs, way back exposed %.0f µs → %.0f µs", end[0]/30*1e6, end[1]/30*1e6, exposed[0]/30*1e6, exposed[1]/30*1e6)
	if exposed[1] > exposed[0]/2 || end[1] >= end[0] {
		t.Errorf("with the rule: ends %.0f µs (without %.0f), exposed %.0f µs (without %.0f): want an earlier end and at most half the exposure",
			end[1]/30*1e6, end[0]/30*1e6, exposed[1]/30*1e6, exposed[0]/30*1e6)
	}
}
