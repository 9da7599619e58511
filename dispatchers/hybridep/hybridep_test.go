package hybridep

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/dispatchers/alltoall"
	dt "github.com/moebench/moebench/dispatchers/dispatchtest"
	"github.com/moebench/moebench/kernels"
)

// layouts are the EP sizes and domains the tests cover: one domain, and
// domains smaller than EP (the inter-domain path), down to one rank each.
var layouts = []struct{ ep, domain int }{{2, 2}, {2, 1}, {4, 4}, {4, 2}, {8, 8}, {8, 4}, {8, 2}, {8, 1}}

// small is a config with chunks of 3 tokens and 2 blocks, so that every
// rank's tokens span several chunks and blocks.
func small(domain int) Config { return Config{SMs: 2, Domain: domain, Chunk: 3} }

// TestPlacement: each rank receives every token that has an expert on it
// exactly once, in global order (source rank, token), with the domain's
// probabilities; its expert-major rows and probabilities equal alltoall's
// bit for bit, in alltoall's order.
func TestPlacement(t *testing.T) {
	for _, lay := range layouts {
		t.Run(fmt.Sprintf("ep%d-domain%d", lay.ep, lay.domain), func(t *testing.T) {
			t.Parallel()
			sh := dispatchers.Shape{Tokens: 11, Hidden: 8, Experts: 16, TopK: 5, EP: lay.ep}
			ranks := dt.Tagged(sh, uint64(lay.ep*10+lay.domain))
			h := WithConfig(small(lay.domain))
			dt.Bind(t, h, sh, ranks)
			if err := dt.Run(h, ranks, nil, "dispatch"); err != nil {
				t.Fatal(err)
			}
			N, k, L, hd, D := sh.EP, sh.TopK, sh.LocalExperts(), sh.Hidden, h.D
			perm := make([][]float32, N)
			permP := make([][]float32, N)
			segs := make([][]dispatchers.Segment, N)
			for r, rk := range ranks {
				perm[r], permP[r], segs[r] = slices.Clone(rk.ExpertX), slices.Clone(rk.ExpertProbs), slices.Clone(rk.Segments)
				s, i := &h.st[r], 0
				dom := r / D
				for src, sr := range ranks {
					for tok := range sh.Tokens {
						on := false
						for _, e := range sr.Idx[tok*k : (tok+1)*k] {
							on = on || sh.Owner(e) == r
						}
						if !on {
							continue
						}
						if i >= s.recv {
							t.Fatalf("EP %d domain %d: rank %d received %d tokens, more are expected", N, D, r, s.recv)
						}
						if !slices.Equal(s.recvX[i*hd:(i+1)*hd], sr.X[tok*hd:(tok+1)*hd]) {
							t.Fatalf("EP %d domain %d: rank %d row %d is (rank %v, token %v), want rank %d token %d", N, D, r, i, s.recvX[i*hd], s.recvX[i*hd+1], src, tok)
						}
						for e := range L * D { // the domain's experts' probabilities
							want := float32(0)
							for j, x := range sr.Idx[tok*k : (tok+1)*k] {
								if int(x) == dom*L*D+e {
									want = sr.Probs[tok*k+j]
								}
							}
							if got := s.recvP[i*L*D+e]; got != want {
								t.Fatalf("EP %d domain %d: rank %d row %d: probability of domain expert %d is %v, want %v", N, D, r, i, e, got, want)
							}
						}
						i++
					}
				}
				if i != s.recv {
					t.Fatalf("EP %d domain %d: rank %d received %d tokens, want %d", N, D, r, s.recv, i)
				}
			}
			a, _ := alltoall.New(dispatchers.ImplNative, dispatchers.Env{Device: "host"})
			dt.Bind(t, a, sh, ranks)
			if err := dt.Run(a, ranks, nil, "dispatch"); err != nil {
				t.Fatal(err)
			}
			for r, rk := range ranks {
				if !slices.Equal(perm[r], rk.ExpertX) || !slices.Equal(permP[r], rk.ExpertProbs) || !reflect.DeepEqual(segs[r], rk.Segments) {
					t.Errorf("EP %d domain %d: rank %d's expert-major rows, probabilities or segments differ from alltoall's", N, D, r)
				}
			}
		})
	}
}

// designSum is the design's rounding computed directly from the routing:
// home rank r = (n, l) adds, in float32 from 0, for each rank of its own
// domain holding the token (ascending), that rank's float32 sum of its
// experts' outputs (ascending) rounded to bf16; then for each other domain
// in the order n−1, n−2, … holding the token, the float32 sum of its ranks'
// rounded partial sums, rounded to bf16. The outputs are val's (nil: the
// forward's, dt.Expert of the token's row and probability).
func designSum(sh dispatchers.Shape, D int, ranks []*dispatchers.Rank, val func(rk *dispatchers.Rank, t, j, c int) float32) [][]float32 {
	if val == nil {
		val = func(rk *dispatchers.Rank, t, j, c int) float32 {
			return dt.Expert(rk.X[t*sh.Hidden+c], rk.Probs[t*sh.TopK+j])
		}
	}
	k, hd, M := sh.TopK, sh.Hidden, sh.EP/D
	out := make([][]float32, len(ranks))
	for r, rk := range ranks {
		out[r] = make([]float32, sh.Tokens*hd)
		n := r / D
		for t := range sh.Tokens {
			slots := dt.SlotsByExpert(rk, k, t)
			for c := range hd {
				// partial[q]: rank q's rounded sum, in ascending expert order
				partial := map[int]float32{}
				for _, j := range slots {
					q := sh.Owner(rk.Idx[t*k+j])
					partial[q] += val(rk, t, j, c)
				}
				var y float32
				for i := range M {
					m := (n - i + M) % M
					var pre float32
					held := false
					for q := m * D; q < (m+1)*D; q++ {
						if v, ok := partial[q]; ok {
							p := kernels.RoundBF16(v)
							if m == n {
								y += p
							} else {
								pre += p
							}
							held = true
						}
					}
					if held && m != n {
						y += kernels.RoundBF16(pre)
					}
				}
				out[r][t*hd+c] = y
			}
		}
	}
	return out
}

// TestCombine: at every layout the output is the design's rounding
// computed directly (with probabilities that make every rounding show),
// the same with HybridEP's defaults as with small chunks and budgets. With
// one domain and one expert per rank it equals alltoall's bit for bit; at
// top-2 the layer's bf16 output equals alltoall's at every layout; else it
// differs within a few bf16 roundings.
func TestCombine(t *testing.T) {
	for _, lay := range layouts {
		t.Run(fmt.Sprintf("ep%d-domain%d", lay.ep, lay.domain), func(t *testing.T) {
			t.Parallel()
			for _, sh := range []dispatchers.Shape{
				{Tokens: 13, Hidden: 8, Experts: 16, TopK: 6, EP: lay.ep},         // several experts a rank
				{Tokens: 13, Hidden: 8, Experts: lay.ep, TopK: 3, EP: lay.ep},     // one expert a rank
				{Tokens: 13, Hidden: 8, Experts: 2 * lay.ep, TopK: 2, EP: lay.ep}, // top-2
			} {
				t.Run(fmt.Sprintf("e%d-top%d", sh.Experts, sh.TopK), func(t *testing.T) {
					sh.TopK = min(sh.TopK, sh.Experts)
					name := fmt.Sprintf("EP %d domain %d, %d experts top-%d", lay.ep, lay.domain, sh.Experts, sh.TopK)
					h := WithConfig(small(lay.domain))
					got, ranks := dt.Outputs(t, h, sh, 3, dt.Cancelling)
					if !reflect.DeepEqual(got, designSum(sh, h.D, ranks, nil)) {
						t.Errorf("%s: output differs from the design's rounding computed directly", name)
					}
					def, _ := New(dispatchers.ImplNative, dispatchers.Env{Device: "host", Domain: lay.domain})
					if d, _ := dt.Outputs(t, def, sh, 3, dt.Cancelling); !reflect.DeepEqual(d, got) {
						t.Errorf("%s: HybridEP's chunks and budget give another output than small ones", name)
					}
					a, _ := alltoall.New(dispatchers.ImplNative, dispatchers.Env{Device: "host"})
					want, _ := dt.Outputs(t, a, sh, 3, dt.Cancelling)
					exact := sh.LocalExperts() == 1 && lay.domain == lay.ep
					differs := false
					for r := range want {
						for i, v := range got[r] {
							switch w := want[r][i]; {
							case exact && v != w:
								t.Fatalf("%s: rank %d value %d: %v, alltoall %v", name, r, i, v, w)
							case sh.TopK == 2 && kernels.RoundBF16(v) != kernels.RoundBF16(w):
								t.Fatalf("%s: rank %d value %d: bf16 %v, alltoall's %v", name, r, i, kernels.RoundBF16(v), kernels.RoundBF16(w))
							}
							differs = differs || v != want[r][i]
						}
					}
					if sh.TopK == 6 && !differs {
						t.Errorf("%s: no difference from alltoall; the cancelling probabilities should show the bf16 partial sums", name)
					}
					got, _ = dt.Outputs(t, h, sh, 3, dt.Mild)
					want, _ = dt.Outputs(t, a, sh, 3, dt.Mild)
					worst := 0.0
					for r := range want {
						for i, v := range got[r] {
							worst = max(worst, float64(abs(v-want[r][i])/max(abs(want[r][i]), 1)))
						}
					}
					if worst > float64(sh.TopK)/256 {
						t.Errorf("%s: largest difference from alltoall %g; want within %d bf16 roundings", name, worst, sh.TopK)
					}
				})
			}
		})
	}
}

func abs(f float32) float32 { return max(f, -f) }

// handRouting is EP 4 in two domains of two (rank r owns experts 2r and
// 2r+1), top-2, two tokens a rank, hidden 8, and the rows that routing
// moves, counted by hand.
func handRouting(t *testing.T) (*Host, []*dispatchers.Rank) {
	sh := dispatchers.Shape{Tokens: 2, Hidden: 8, Experts: 8, TopK: 2, EP: 4}
	idx := [][]int32{
		{0, 1, 2, 6}, // rank 0: t0 → rank 0 (twice); t1 → rank 1 and rank 3 (domain 1)
		{4, 5, 0, 2}, // rank 1: t0 → rank 2 (domain 1, twice); t1 → ranks 0 and 1
		{6, 7, 4, 0}, // rank 2: t0 → rank 3 (twice); t1 → rank 2 and rank 0 (domain 0)
		{1, 3, 7, 5}, // rank 3: t0 → ranks 0 and 1 (domain 0); t1 → ranks 3 and 2
	}
	ranks := dt.Tagged(sh, 4)
	for r, rk := range ranks {
		rk.Idx = idx[r]
	}
	h := WithConfig(Config{SMs: 1, Domain: 2, Chunk: 1})
	dt.Bind(t, h, sh, ranks)
	if err := dt.Run(h, ranks, func(x, p float32) float32 { return x }, ""); err != nil {
		t.Fatal(err)
	}
	return h, ranks
}

// TestTrafficByHand: the bytes of a routing counted by hand.
func TestTrafficByHand(t *testing.T) {
	h, _ := handRouting(t)
	// (token, receiving rank) pairs, each with its path:
	//   rank 0 t0 → 0 (self); t1 → 1 (0 stores into 1), → 3 (inter-domain 0→2, 2 stores into 3)
	//   rank 1 t0 → 2 (inter-domain 1→3, 3 stores into 2); t1 → 0 (1 stores into 0), → 1 (self)
	//   rank 2 t0 → 3 (2 stores into 3); t1 → 2 (self), → 0 (inter-domain 2→0, 0 stores into itself)
	//   rank 3 t0 → 0, 1 (inter-domain 3→1 once, 1 stores into 0 and itself); t1 → 3 (self), → 2 (3 stores into 2)
	// 13 deliveries; 7 stores into another rank; 4 inter-domain sends
	const deliveries, fanOut, inter = 13, 7, 4
	// combine mirrors it: 13 partial sums, 7 read from another rank (by the
	// home in its domain, by the forwarder in another: rank 2 reads 3's for
	// rank 0's t1, rank 3 reads 2's for rank 1's t0, rank 1 reads 0's for
	// rank 3's t0), 4 pre-reduced sums sent home (one per token and remote
	// domain)
	row, disp := int64(8*2), int64(8*2+4*2*2) // L·D = 4 probabilities
	// HybridEP's rdma convention: per token, the domains that need it, its own included:
	// rank 0: t0 1, t1 2; rank 1: 1, 1; rank 2: 1, 2; rank 3: 1, 1 → 10
	want := dispatchers.Traffic{
		DispatchLogical: deliveries * disp, DispatchOffRank: (fanOut + inter) * disp, DispatchInterDomain: inter * disp,
		CombineLogical: deliveries * row, CombineOffRank: (fanOut + inter) * row, CombineInterDomain: inter * row,
		DispatchAlgorithm: deliveries * row, CombineAlgorithm: deliveries * row, InterDomainAlgorithm: 10 * row,
	}
	tr := h.Traffic()
	tr.Formula, tr.AlgorithmFormula = "", ""
	if tr != want {
		t.Errorf("traffic %+v,\nhand count %+v", tr, want)
	}
}

// TestBuffersByHand: the worst-case buffers HybridEP preallocates, by hand.
func TestBuffersByHand(t *testing.T) {
	h, _ := handRouting(t)
	// T 2, N 4, hidden 8, E 8, L 2, D 2, M 2, one-token chunks (2 a rank)
	want := map[string]int64{
		"receive":       2 * 4 * 16,                                            // T·N rows of 16 B
		"receive-probs": 2 * 4 * 4 * 4,                                         // T·N × L·D fp32
		"inter-domain":  2 * 1 * (16 + 4*4),                                    // T·(M−1) rows and probabilities
		"routing-map":   4*2*8 + 2*8*4,                                         // bool [N·T, E] and fp32 [T, E]
		"metadata":      4*(2*2*2+2*4*2+4*2+1) + 2*2 + 4*2*2*2 + 4*(2*1*2+4*2), // … inter-domain slots int32 [2, M, T]
	}
	for r := range 4 {
		got := map[string]int64{}
		for _, b := range h.Buffers(r) {
			got[b.Name] = b.Bytes
		}
		// permute: the rank's copies (rank 0 receives 5: t0 of rank 0 twice,
		// t1 of rank 1, t1 of rank 2, t0 of rank 3) × (16 B row + 4 B prob)
		if r == 0 && got["permute"] != 5*20 {
			t.Errorf("rank 0 permute %d B, want %d", got["permute"], 5*20)
		}
		delete(got, "permute")
		if !reflect.DeepEqual(got, want) {
			t.Errorf("rank %d buffers %v,\nby hand %v", r, got, want)
		}
	}
	one := WithConfig(Config{SMs: 1, Chunk: 1})
	sh := dispatchers.Shape{Tokens: 2, Hidden: 8, Experts: 8, TopK: 2, EP: 4}
	dt.Bind(t, one, sh, dt.Tagged(sh, 1))
	for _, b := range one.Buffers(0) {
		if b.Name == "inter-domain" {
			t.Errorf("one domain: an inter-domain buffer of %d B", b.Bytes)
		}
	}
}

// TestRoundTripByHand: on the hand routing every token comes back as the
// sum of its two experts' outputs (x each, so 2x) at its home rank.
func TestRoundTripByHand(t *testing.T) {
	_, ranks := handRouting(t)
	for r, rk := range ranks {
		for i, v := range rk.Y {
			if want := 2 * rk.X[i]; v != want {
				t.Fatalf("rank %d value %d: %v, want %v", r, i, v, want)
			}
		}
	}
}

// TestPreprocessingAgrees: the positions a forwarder computes for a rank of
// its domain are the positions that rank computes for itself, whichever
// rank forwards (the maps are computed identically on every rank); a
// mismatch is an error of the phase that notices it, not a wrong output.
func TestPreprocessingAgrees(t *testing.T) {
	sh := dispatchers.Shape{Tokens: 7, Hidden: 8, Experts: 16, TopK: 4, EP: 8}
	ranks := dt.Tagged(sh, 6)
	h := WithConfig(small(2))
	dt.Bind(t, h, sh, ranks)
	if err := dt.Run(h, ranks, dt.Expert, "preprocess"); err != nil {
		t.Fatal(err)
	}
	T, D, M := sh.Tokens, h.D, h.M
	for f := range sh.EP {
		n, l := f/D, f%D
		for m := range M {
			for tok := range T {
				g := (m*D+l)*T + tok
				for j := range D {
					q := n*D + j
					// q's own receive position of g: its tokens before g it needs
					want := int32(-1)
					if needs(sh, ranks, q, g) {
						want = 0
						for g2 := range g {
							if needs(sh, ranks, q, g2) {
								want++
							}
						}
					}
					if got := h.st[f].s2d[(m*T+tok)*D+j]; got != want {
						t.Fatalf("forwarder %d: token %d of rank %d at rank %d: position %d, want %d", f, tok, m*D+l, q, got, want)
					}
				}
			}
		}
	}
	// a forwarder whose map disagrees with its receiver's count: the
	// receiver's dispatch notices
	h.st[1].s2d[0] = -1 - h.st[1].s2d[0]
	err := error(nil)
	for r := range sh.EP {
		err = errors.Join(err, h.Dispatch(r))
	}
	if err == nil || !strings.Contains(err.Error(), "the forwarders stored") {
		t.Errorf("a corrupted map: %v", err)
	}
}

// needs says whether rank q holds an expert of global token g.
func needs(sh dispatchers.Shape, ranks []*dispatchers.Rank, q, g int) bool {
	src, t := g/sh.Tokens, g%sh.Tokens
	for _, e := range ranks[src].Idx[t*sh.TopK : (t+1)*sh.TopK] {
		if sh.Owner(e) == q {
			return true
		}
	}
	return false
}

// TestLimits: a domain that does not divide EP is an error naming
// --domain; a domain beyond NVL72, a hidden size bulk copies cannot move,
// the library implementation and the cuda device are unavailable, with the
// reason; --sms 0 is Megatron's 16; a bad routing row is an error naming
// the rank and token.
func TestLimits(t *testing.T) {
	sh := dispatchers.Shape{Tokens: 4, Hidden: 8, Experts: 160, TopK: 2, EP: 80}
	for _, c := range []struct {
		cfg         Config
		hidden      int
		unavailable bool
		want        string
	}{
		{Config{SMs: 16, Domain: 3, Chunk: 64}, 8, false, "--domain 3 must divide EP 80"},
		{Config{SMs: 16, Domain: 0, Chunk: 64}, 8, true, "at most 72"},
		{Config{SMs: 16, Domain: 8, Chunk: 64}, 12, true, "multiple of 8"},
		{Config{SMs: 0, Domain: 8, Chunk: 64}, 8, false, "SM budget 0"},
	} {
		s := sh
		s.Hidden = c.hidden
		err := WithConfig(c.cfg).Bind(s, dt.Tagged(s, 1))
		if err == nil || dispatchers.IsUnavailable(err) != c.unavailable || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v hidden %d: %v; want %q (unavailable %v)", c.cfg, c.hidden, err, c.want, c.unavailable)
		}
	}
	if err := WithConfig(Config{SMs: 16, Domain: 8, Chunk: 64}).Bind(sh, dt.Tagged(sh, 1)); err != nil {
		t.Errorf("EP 80 in domains of 8: %v", err)
	}
	if _, err := New(dispatchers.ImplLibrary, dispatchers.Env{Device: "host"}); !dispatchers.IsUnavailable(err) {
		t.Errorf("library: %v", err)
	}
	if _, err := dispatchers.NewDevice(Name, dispatchers.ImplLibrary, dispatchers.Env{Device: "cuda"}); !dispatchers.IsUnavailable(err) {
		t.Errorf("cuda library: %v", err)
	}
	if d, _ := New(dispatchers.ImplNative, dispatchers.Env{Device: "host"}); d.(*Host).cfg.SMs != DefaultSMs || DefaultSMs != 16 {
		t.Errorf("default budget %+v", d.(*Host).cfg)
	}
	two := dispatchers.Shape{Tokens: 2, Hidden: 8, Experts: 4, TopK: 2, EP: 2}
	for _, idx := range [][]int32{{0, 4, 1, 2}, {1, 1, 0, 2}} {
		ranks := dt.Tagged(two, 1)
		ranks[1].Idx = idx
		h := WithConfig(small(0))
		dt.Bind(t, h, two, ranks)
		if err := dt.Run(h, ranks, dt.Expert, ""); err == nil || !strings.Contains(err.Error(), "rank 1: token 0") {
			t.Errorf("routing %v: %v", idx, err)
		}
	}
}

// TestNextStepSeesNewData: a step after one with other inputs and routing
// gives the design's output for its own (no flag or buffer of the earlier
// step is taken for this one's).
func TestNextStepSeesNewData(t *testing.T) {
	sh := dispatchers.Shape{Tokens: 9, Hidden: 8, Experts: 16, TopK: 4, EP: 8}
	ranks := dt.Tagged(sh, 7)
	h := WithConfig(small(2))
	dt.Bind(t, h, sh, ranks)
	if err := dt.Run(h, ranks, dt.Expert, ""); err != nil {
		t.Fatal(err)
	}
	for r, next := range dt.Tagged(sh, 8) {
		copy(ranks[r].X, next.X)
		copy(ranks[r].Idx, next.Idx)
		copy(ranks[r].Probs, next.Probs)
	}
	if err := dt.Run(h, ranks, dt.Expert, ""); err != nil {
		t.Fatal(err)
	}
	want := designSum(sh, h.D, ranks, nil)
	for r, rk := range ranks {
		if !slices.Equal(rk.Y, want[r]) {
			t.Fatalf("rank %d: the second step's output is not the design's for its inputs", r)
		}
	}
}

// TestBackward: at every layout the input gradient is the design's
// rounding of the copies' gradients (the combine's, over the forward's
// maps), with HybridEP's defaults and with small chunks and budgets; with
// one domain and one expert per rank it equals alltoall's bit for bit; the
// probability gradients come back exactly.
func TestBackward(t *testing.T) {
	for _, lay := range layouts {
		t.Run(fmt.Sprintf("ep%d-domain%d", lay.ep, lay.domain), func(t *testing.T) {
			t.Parallel()
			for _, sh := range []dispatchers.Shape{
				{Tokens: 13, Hidden: 8, Experts: 16, TopK: 6, EP: lay.ep},
				{Tokens: 13, Hidden: 8, Experts: lay.ep, TopK: 3, EP: lay.ep},
			} {
				t.Run(fmt.Sprintf("e%d-top%d", sh.Experts, sh.TopK), func(t *testing.T) {
					sh.TopK = min(sh.TopK, sh.Experts)
					def, _ := New(dispatchers.ImplNative, dispatchers.Env{Device: "host", Domain: lay.domain})
					for _, h := range []*Host{WithConfig(small(lay.domain)), def.(*Host)} {
						name := fmt.Sprintf("EP %d domain %d, %d experts top-%d, %+v", lay.ep, lay.domain, sh.Experts, sh.TopK, h.cfg)
						dx, dp, ranks := dt.Gradients(t, h, sh, 6, dt.Cancelling)
						design := designSum(sh, h.D, ranks, func(rk *dispatchers.Rank, t, j, c int) float32 {
							return kernels.RoundBF16(rk.DY[t*sh.Hidden+c] * rk.Probs[t*sh.TopK+j])
						})
						wx, wp := dt.WantGradients(ranks, sh)
						for r := range ranks {
							kernels.RoundBF16Slice(design[r])
							if !reflect.DeepEqual(dx[r], design[r]) || !reflect.DeepEqual(dp[r], wp[r]) {
								t.Fatalf("%s: rank %d's gradients differ from the design's computed directly", name, r)
							}
							if sh.LocalExperts() == 1 && lay.domain == lay.ep && !reflect.DeepEqual(dx[r], wx[r]) {
								t.Fatalf("%s: rank %d's input gradient differs from alltoall's", name, r)
							}
						}
						tr := h.Traffic()
						if tr.CombineBackwardLogical != tr.DispatchAlgorithm || tr.DispatchBackwardOffRank == 0 || (tr.CombineBackwardOffRank == 0) != (lay.ep == 1) {
							t.Errorf("%s: backward bytes %+v", name, tr)
						}
					}
				})
			}
		})
	}
}
