package deepep

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

// TestReceivedOrder: each rank receives every token that has an expert on
// it exactly once, sorted by (source rank, token), with its k expert indices
// made local (−1 elsewhere) and its probabilities (0 elsewhere); the
// permuted rows and probabilities equal alltoall's bit for bit.
func TestReceivedOrder(t *testing.T) {
	sh := dispatchers.Shape{Tokens: 37, Hidden: 8, Experts: 16, TopK: 5, EP: 4}
	ranks := dt.Tagged(sh, 1)
	h := WithConfig(Config{SMs: 6, Dispatch: Queue{Chunk: 2, Ring: 5}, Combine: Queue{Chunk: 3, Ring: 4}})
	dt.Bind(t, h, sh, ranks)
	if err := dt.Run(h, ranks, nil, "permute"); err != nil {
		t.Fatal(err)
	}
	N, k, L, hd := sh.EP, sh.TopK, sh.LocalExperts(), sh.Hidden
	perm := make([][]float32, N)
	permP := make([][]float32, N)
	for r := range ranks {
		perm[r] = slices.Clone(ranks[r].ExpertX)
		permP[r] = slices.Clone(ranks[r].ExpertProbs)
		s := &h.st[r]
		i := 0
		for src, sr := range ranks {
			for tok := range sh.Tokens {
				on := false
				for _, e := range sr.Idx[tok*k : (tok+1)*k] {
					on = on || sh.Owner(e) == r
				}
				if !on {
					if h.st[src].sendHead[tok*N+r] != -1 {
						t.Errorf("rank %d token %d: send_head %d for rank %d, which it does not go to", src, tok, h.st[src].sendHead[tok*N+r], r)
					}
					continue
				}
				if i >= s.recv {
					t.Fatalf("rank %d: received %d tokens, more are expected", r, s.recv)
				}
				row := s.recvX[i*hd : (i+1)*hd]
				if !slices.Equal(row, sr.X[tok*hd:(tok+1)*hd]) || s.recvSrc[i] != int32(tok) {
					t.Fatalf("rank %d received row %d: (rank %v, token %v, src %d), want rank %d token %d", r, i, row[0], row[1], s.recvSrc[i], src, tok)
				}
				for j, e := range sr.Idx[tok*k : (tok+1)*k] {
					wantIdx, wantW := int32(-1), float32(0)
					if sh.Owner(e) == r {
						wantIdx, wantW = e-int32(r*L), sr.Probs[tok*k+j]
					}
					if s.recvIdx[i*k+j] != wantIdx || s.recvW[i*k+j] != wantW {
						t.Fatalf("rank %d row %d slot %d: expert %d prob %v, want %d %v", r, i, j, s.recvIdx[i*k+j], s.recvW[i*k+j], wantIdx, wantW)
					}
				}
				i++
			}
		}
		if i != s.recv {
			t.Fatalf("rank %d: received %d tokens, want %d", r, s.recv, i)
		}
	}
	a, _ := alltoall.New(dispatchers.ImplNative, dispatchers.Env{Device: "host"})
	dt.Bind(t, a, sh, ranks)
	if err := dt.Run(a, ranks, nil, "dispatch"); err != nil {
		t.Fatal(err)
	}
	for r, rk := range ranks {
		if !slices.Equal(perm[r], rk.ExpertX) || !slices.Equal(permP[r], rk.ExpertProbs) {
			t.Errorf("rank %d: permuted rows differ from alltoall's", r)
		}
	}
}

// designSum is the design's rounding, computed directly: for each rank
// holding experts of the token, in ascending rank order, the float32 sum
// of those experts' outputs in ascending expert order, rounded to bf16,
// added to a float32 sum. The outputs are val's (nil: the forward's,
// dt.Expert of the token's row and probability).
func designSum(sh dispatchers.Shape, ranks []*dispatchers.Rank, val func(rk *dispatchers.Rank, t, j, c int) float32) [][]float32 {
	if val == nil {
		val = func(rk *dispatchers.Rank, t, j, c int) float32 {
			return dt.Expert(rk.X[t*sh.Hidden+c], rk.Probs[t*sh.TopK+j])
		}
	}
	k, hd := sh.TopK, sh.Hidden
	out := make([][]float32, len(ranks))
	for r, rk := range ranks {
		out[r] = make([]float32, sh.Tokens*hd)
		for t := range sh.Tokens {
			slots, idx := dt.SlotsByExpert(rk, k, t), rk.Idx[t*k:(t+1)*k]
			for c := range hd {
				var total, part float32
				for i, j := range slots {
					part += val(rk, t, j, c)
					if i == k-1 || sh.Owner(idx[slots[i+1]]) != sh.Owner(idx[j]) {
						total += kernels.RoundBF16(part)
						part = 0
					}
				}
				out[r][t*hd+c] = total
			}
		}
	}
	return out
}

// TestCombineEqualsAlltoall: the output is the design's rounding computed
// directly; with one expert per rank no token has two experts on a rank,
// and it equals alltoall's bit for bit, with several within a few bf16
// roundings. Small rings that wrap many times give the same output as
// DeepEP's default ones.
func TestCombineEqualsAlltoall(t *testing.T) {
	for _, sh := range []dispatchers.Shape{
		{Tokens: 29, Hidden: 16, Experts: 8, TopK: 3, EP: 8},
		{Tokens: 29, Hidden: 16, Experts: 16, TopK: 6, EP: 2},
	} {
		t.Run(fmt.Sprintf("ep%d", sh.EP), func(t *testing.T) {
			t.Parallel()
			a, _ := alltoall.New(dispatchers.ImplNative, dispatchers.Env{Device: "host"})
			want, _ := dt.Outputs(t, a, sh, 2, dt.Mild)
			d, _ := New(dispatchers.ImplNative, dispatchers.Env{Device: "host", SMs: 4})
			got, _ := dt.Outputs(t, d, sh, 2, dt.Mild)
			design, ranks := dt.Outputs(t, d, sh, 2, dt.Cancelling)
			if !reflect.DeepEqual(design, designSum(sh, ranks, nil)) {
				t.Errorf("EP %d: output differs from the design's rounding computed directly", sh.EP)
			}
			small, _ := dt.Outputs(t, WithConfig(Config{SMs: 4, Dispatch: Queue{Chunk: 1, Ring: 2}, Combine: Queue{Chunk: 2, Ring: 3}}), sh, 2, dt.Mild)
			if !reflect.DeepEqual(got, small) {
				t.Errorf("EP %d: output with small rings differs from DeepEP's default rings", sh.EP)
			}
			exact := sh.LocalExperts() == 1
			if exact {
				want, _ = dt.Outputs(t, a, sh, 2, dt.Cancelling)
				got = design
			}
			worst := 0.0
			for r := range want {
				for i, v := range got[r] {
					if exact && v != want[r][i] {
						t.Fatalf("EP %d, one expert per rank: rank %d value %d: %v, alltoall %v", sh.EP, r, i, v, want[r][i])
					}
					worst = max(worst, float64(abs(v-want[r][i])/max(abs(want[r][i]), 1)))
				}
			}
			if !exact && (worst == 0 || worst > float64(sh.TopK)/256) {
				t.Errorf("EP %d: largest difference from alltoall %g; want some (bf16 partial sums), and within %d bf16 roundings", sh.EP, worst, sh.TopK)
			}
		})
	}
}

func abs(f float32) float32 { return max(f, -f) }

// TestDedupTraffic: a hand count of the bytes on a routing whose tokens
// have several experts on one rank.
func TestDedupTraffic(t *testing.T) {
	// EP 2, 4 experts (rank 0: 0 and 1; rank 1: 2 and 3), top-2, 3 tokens a rank
	sh := dispatchers.Shape{Tokens: 3, Hidden: 4, Experts: 4, TopK: 2, EP: 2}
	idx := [][]int32{
		{0, 1, 0, 2, 2, 3}, // rank 0: {0,1} → rank 0 once; {0,2} → both; {2,3} → rank 1 once
		{3, 2, 1, 3, 1, 0}, // rank 1: {3,2} → rank 1 once; {1,3} → both; {1,0} → rank 0 once
	}
	ranks := dt.Tagged(sh, 3)
	for r, rk := range ranks {
		rk.Idx = idx[r]
	}
	h := WithConfig(DefaultConfig(2, 0))
	dt.Bind(t, h, sh, ranks)
	if err := dt.Run(h, ranks, func(x, p float32) float32 { return x }, ""); err != nil {
		t.Fatal(err)
	}
	// tokens: rank 0 sends 2 to itself (t0, t1), 2 to rank 1 (t1, t2); rank 1
	// sends 2 to itself (t0, t1), 2 to rank 0 (t1, t2): 8, 4 of them off-rank
	const all, off = 8, 4
	row, disp, comb := int64(4*2), int64(4*2+4+2*(4+4)), int64(4*2+4)
	tr := h.Traffic()
	want := dispatchers.Traffic{DispatchOffRank: off * disp, DispatchLogical: all * disp, CombineOffRank: off * comb, CombineLogical: all * comb,
		DispatchAlgorithm: all * row, CombineAlgorithm: all * row}
	tr.Formula, tr.AlgorithmFormula = "", ""
	if tr != want {
		t.Errorf("traffic %+v,\nhand count %+v", tr, want)
	}
	// alltoall sends every copy: 12 copies, 6 of them off-rank
	a, _ := alltoall.New(dispatchers.ImplNative, dispatchers.Env{Device: "host"})
	dt.Bind(t, a, sh, ranks)
	if err := dt.Run(a, ranks, func(x, p float32) float32 { return x }, ""); err != nil {
		t.Fatal(err)
	}
	if at := a.Traffic(); at.DispatchLogical != 12*(row+4) || at.DispatchOffRank != 6*(row+4) {
		t.Errorf("alltoall traffic %+v, want 12 copies, 6 off-rank", at)
	}
	for r := range ranks {
		if got := h.Buffers(r)[1]; got.Name != "receive" || got.Bytes != 4*disp {
			t.Errorf("rank %d: %+v, want receive of 4 tokens = %d B", r, got, 4*disp)
		}
	}
}

// TestStallNamed: a queue that can never deliver what the receiver expects
// is an error naming the rank, phase, channel and peer, not a hang.
func TestStallNamed(t *testing.T) {
	sh := dispatchers.Shape{Tokens: 16, Hidden: 4, Experts: 8, TopK: 2, EP: 2}
	ranks := dt.Tagged(sh, 4)
	h := WithConfig(DefaultConfig(2, 4))
	dt.Bind(t, h, sh, ranks)
	if err := dt.Run(h, ranks, func(x, p float32) float32 { return x }, dispatchers.ExpertPhases[0]); err != nil {
		t.Fatal(err)
	}
	// token 0 of rank 1 now expects its row from rank 0 far past the end of the stream
	h.st[1].sendHead[0*sh.EP+0] = 1000
	h.st[1].inRank[0] = true
	err := h.Combine(1)
	var se *StallError
	if !errors.As(err, &se) || se.Rank != 1 || se.Phase != "combine" || se.Channel != 0 || se.Peer != 0 || !strings.Contains(err.Error(), "still expected") {
		t.Fatalf("err %v; want a stall of rank 1's combine, channel 0, queue of rank 0", err)
	}
}

// TestLimits: DeepEP's intranode mode runs 2, 4 or 8 ranks with an even
// SM budget; other EP sizes are unavailable, with the reason.
func TestLimits(t *testing.T) {
	for _, ep := range []int{1, 16} {
		sh := dispatchers.Shape{Tokens: 4, Hidden: 4, Experts: 16, TopK: 2, EP: ep}
		d, _ := New(dispatchers.ImplNative, dispatchers.Env{Device: "host"})
		if err := d.Bind(sh, dt.Tagged(sh, 5)); !dispatchers.IsUnavailable(err) || !strings.Contains(err.Error(), "2, 4 or 8 ranks") {
			t.Errorf("EP %d: %v", ep, err)
		}
	}
	if err := DefaultConfig(8, 7).check(8); err == nil {
		t.Error("odd SM budget accepted")
	}
	if c := DefaultConfig(8, 0); c.SMs != DefaultSMs || c.Channels() != 10 {
		t.Errorf("default config %+v", c)
	}
	if _, err := dispatchers.NewDevice(Name, dispatchers.ImplLibrary, dispatchers.Env{Device: "cuda"}); !dispatchers.IsUnavailable(err) ||
		!strings.Contains(err.Error(), "no library of DeepEP's normal mode") {
		t.Errorf("cuda library: %v", err)
	}
}

// TestBackward: the input gradient is the design's rounding of the copies'
// gradients (each rank's partial sum in bf16, the home's float32 sum
// rounded once), through DeepEP's default rings and through small ones
// that wrap; with one expert per rank it equals alltoall's bit for bit;
// the probability gradients come back exactly.
func TestBackward(t *testing.T) {
	for _, sh := range []dispatchers.Shape{
		{Tokens: 29, Hidden: 16, Experts: 8, TopK: 3, EP: 8},
		{Tokens: 29, Hidden: 16, Experts: 16, TopK: 6, EP: 2},
	} {
		t.Run(fmt.Sprintf("ep%d", sh.EP), func(t *testing.T) {
			t.Parallel()
			for _, d := range []*Host{{sms: 4}, WithConfig(Config{SMs: 4, Dispatch: Queue{Chunk: 1, Ring: 2}, Combine: Queue{Chunk: 2, Ring: 3}})} {
				dx, dp, ranks := dt.Gradients(t, d, sh, 5, dt.Cancelling)
				design := designSum(sh, ranks, func(rk *dispatchers.Rank, t, j, c int) float32 {
					return kernels.RoundBF16(rk.DY[t*sh.Hidden+c] * rk.Probs[t*sh.TopK+j])
				})
				wx, wp := dt.WantGradients(ranks, sh)
				for r := range ranks {
					kernels.RoundBF16Slice(design[r])
					if !reflect.DeepEqual(dx[r], design[r]) || !reflect.DeepEqual(dp[r], wp[r]) {
						t.Fatalf("EP %d rings %+v: rank %d's gradients differ from the design's computed directly", sh.EP, d.cfg, r)
					}
					if sh.LocalExperts() == 1 && !reflect.DeepEqual(dx[r], wx[r]) {
						t.Fatalf("EP %d, one expert per rank: rank %d's input gradient differs from alltoall's", sh.EP, r)
					}
				}
				tr := d.Traffic()
				if tr.CombineBackwardLogical != tr.CombineLogical || tr.DispatchBackwardLogical <= tr.CombineLogical {
					t.Errorf("EP %d: backward bytes %+v: the forward's tokens the other way, the probability gradients with them", sh.EP, tr)
				}
			}
		})
	}
}
