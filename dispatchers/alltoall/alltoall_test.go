package alltoall

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/dispatchers/dispatchtest"
)

// TestPlan checks the alltoall plan: every token copy lands exactly once on
// the rank owning its expert, grouped by local expert, then by source rank,
// then in token order; its probability travels with it; and combine returns
// each output to its home slot.
func TestPlan(t *testing.T) {
	sh := dispatchers.Shape{Tokens: 40, Hidden: 3, Experts: 12, TopK: 3, EP: 4}
	g := rand.New(rand.NewPCG(1, 1))
	ranks := make([]*dispatchers.Rank, sh.EP)
	for r := range ranks {
		rk := &dispatchers.Rank{ID: r, X: make([]float32, sh.Tokens*sh.Hidden),
			Idx: make([]int32, sh.Tokens*sh.TopK), Probs: make([]float32, sh.Tokens*sh.TopK)}
		for tok := range sh.Tokens {
			rk.X[tok*sh.Hidden] = float32(r) // row encodes its origin
			rk.X[tok*sh.Hidden+1] = float32(tok)
			for j, e := range g.Perm(sh.Experts)[:sh.TopK] {
				rk.Idx[tok*sh.TopK+j] = int32(e)
				rk.Probs[tok*sh.TopK+j] = float32(1000*r + 10*tok + j)
			}
		}
		ranks[r] = rk
	}
	dd, err := New(dispatchers.ImplNative, dispatchers.Env{Device: "host"})
	if err != nil {
		t.Fatal(err)
	}
	d := dd.(*A2A)
	if err := d.Bind(sh, ranks); err != nil {
		t.Fatal(err)
	}
	for _, step := range []func(int) error{d.Permute, d.Dispatch} {
		for r := range ranks {
			if err := step(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	L, h := sh.LocalExperts(), sh.Hidden
	seen := 0
	for r, rk := range ranks {
		row := 0
		for l, sg := range rk.Segments {
			e, n := int32(r*L+l), sg.Len
			if sg.Expert != int(e) || sg.Start != row || sg.Weights != nil {
				t.Fatalf("rank %d segment %d: %+v, want local expert %d from row %d", r, l, sg, e, row)
			}
			// expected: copies routed to e, by source rank then token
			var want [][2]int
			for src, sr := range ranks {
				for tok := range sh.Tokens {
					for j := range sh.TopK {
						if sr.Idx[tok*sh.TopK+j] == e {
							want = append(want, [2]int{src, tok*sh.TopK + j})
						}
					}
				}
			}
			if n != len(want) {
				t.Fatalf("rank %d expert %d: %d rows, want %d", r, e, n, len(want))
			}
			for _, w := range want {
				src, slot := w[0], w[1]
				gotSrc, gotTok := rk.ExpertX[row*h], rk.ExpertX[row*h+1]
				if int(gotSrc) != src || int(gotTok) != slot/sh.TopK || rk.ExpertProbs[row] != ranks[src].Probs[slot] {
					t.Fatalf("rank %d expert %d row %d: got copy (rank %v, token %v, prob %v), want (rank %d, slot %d)",
						r, e, row, gotSrc, gotTok, rk.ExpertProbs[row], src, slot)
				}
				row++
			}
		}
		if row != len(rk.ExpertProbs) {
			t.Fatalf("rank %d: %d rows delivered, %d accounted for", r, len(rk.ExpertProbs), row)
		}
		seen += row
		// expert output = probability in column 2, so unpermute sums the k probs
		rk.ExpertY = make([]float32, len(rk.ExpertX))
		for i := range rk.ExpertProbs {
			rk.ExpertY[i*h+2] = rk.ExpertProbs[i]
		}
	}
	if seen != sh.EP*sh.Tokens*sh.TopK {
		t.Fatalf("%d copies delivered, want %d", seen, sh.EP*sh.Tokens*sh.TopK)
	}
	for _, step := range []func(int) error{d.Combine, d.Unpermute} {
		for r := range ranks {
			if err := step(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	for r, rk := range ranks {
		for tok := range sh.Tokens {
			var want float32
			for j := range sh.TopK {
				want += rk.Probs[tok*sh.TopK+j]
			}
			if rk.Y[tok*h+2] != want {
				t.Fatalf("rank %d token %d: combined %v, want the sum of its probs %v", r, tok, rk.Y[tok*h+2], want)
			}
		}
	}
	tr := d.Traffic()
	if tr.DispatchLogical != int64(seen)*(int64(h)*2+4) || tr.DispatchOffRank >= tr.DispatchLogical || tr.DispatchOffRank == 0 {
		t.Errorf("traffic %+v inconsistent with %d copies", tr, seen)
	}
}

func TestLibraryUnavailable(t *testing.T) {
	_, err := New(dispatchers.ImplLibrary, dispatchers.Env{Device: "host"})
	if !dispatchers.IsUnavailable(err) {
		t.Fatalf("library impl: err = %v, want unavailable", err)
	}
}

// TestBackward: the backward returns each token's input gradient as its
// copies' gradients summed in ascending expert order in float32 and
// rounded once, and each copy's probability gradient to its slot, bit for
// bit (with a second step over the same buffers); its bytes are the
// forward's rows the other way.
func TestBackward(t *testing.T) {
	sh := dispatchers.Shape{Tokens: 40, Hidden: 16, Experts: 12, TopK: 3, EP: 4}
	d, _ := New(dispatchers.ImplNative, dispatchers.Env{Device: "host"})
	dx, dp, ranks := dispatchtest.Gradients(t, d, sh, 3, dispatchtest.Mild)
	wx, wp := dispatchtest.WantGradients(ranks, sh)
	for r := range ranks {
		if !slices.Equal(dx[r], wx[r]) || !slices.Equal(dp[r], wp[r]) {
			t.Fatalf("rank %d: gradients differ from the direct computation", r)
		}
	}
	tr := d.Traffic()
	if tr.CombineBackwardLogical != tr.CombineLogical || tr.DispatchBackwardLogical != tr.DispatchLogical ||
		tr.DispatchBackwardOffRank != tr.DispatchOffRank || tr.BackwardFormula == "" {
		t.Errorf("backward traffic %+v: want the forward's rows the other way", tr)
	}
}
