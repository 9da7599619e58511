package feplb

import (
	"strings"
	"testing"

	"github.com/moebench/moebench/balance"
	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels/device"
)

// layoutCase: 4 ranks of 2 experts in 2-rank domains; expert 0 (rank 0,
// 10 rows) is dynamic.
func layoutCase() (balance.Topology, []bool, []int, []int) {
	t := balance.Topology{Ranks: 4, Experts: 8, Domain: 2}
	counts := []int{10, 2, 3, 3, 4, 4, 1, 1}
	start := []int{0, 10, 0, 3, 0, 4, 0, 1}
	dyn := make([]bool, 8)
	dyn[0] = true
	return t, dyn, start, counts
}

func owners(t balance.Topology, counts []int) balance.Plan {
	return balance.OwnerPlan(t, balance.Step{Counts: counts})
}

// TestLayoutCoversRowsOnce: the owner keeps the first rows of a split
// expert, the helpers get the rest in share order, each row exactly once.
func TestLayoutCoversRowsOnce(t *testing.T) {
	tp, dyn, start, counts := layoutCase()
	pl := owners(tp, counts)
	pl.Shares[0] = []balance.Share{{Rank: 0, Tokens: 4}, {Rank: 1, Tokens: 6}}
	lay, err := newLayout(tp, &pl, dyn, start, counts)
	if err != nil {
		t.Fatal(err)
	}
	if lay.keep[0] != 4 || lay.moves != 1 || lay.foreign[1] != 6 || len(lay.out[0]) != 1 {
		t.Fatalf("layout %+v", lay)
	}
	if c := lay.in[1][0]; c.src != 4 || c.n != 6 || c.dst != 0 || c.owner != 0 || c.expert != 0 {
		t.Errorf("chunk %+v: want rows [4, 10) of rank 0 at row 0 of rank 1", c)
	}
	for e := 1; e < 8; e++ {
		if lay.keep[e] != counts[e] {
			t.Errorf("static expert %d keeps %d of %d rows", e, lay.keep[e], counts[e])
		}
	}
}

// TestLayoutRefusesBadPlans: a plan that moves a static expert, leaves the
// domain or does not list the owner first is refused.
func TestLayoutRefusesBadPlans(t *testing.T) {
	tp, dyn, start, counts := layoutCase()
	for name, c := range map[string]struct {
		e      int
		shares []balance.Share
		want   string
	}{
		"static moved":    {1, []balance.Share{{Rank: 0, Tokens: 1}, {Rank: 1, Tokens: 1}}, "static expert 1"},
		"domain left":     {0, []balance.Share{{Rank: 0, Tokens: 5}, {Rank: 2, Tokens: 5}}, "out of its NVLink domain"},
		"owner not first": {0, []balance.Share{{Rank: 1, Tokens: 5}, {Rank: 0, Tokens: 5}}, "want its owner 0"},
	} {
		pl := owners(tp, counts)
		pl.Shares[c.e] = c.shares
		if _, err := newLayout(tp, &pl, dyn, start, counts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
	}
}

// TestPacked: ranks of one NVLink domain on one device are named, each
// group of them once; ranks on devices of their own, or packed across a
// domain's edge only, are not.
func TestPacked(t *testing.T) {
	a, b, c := &device.Emu{}, &device.Emu{}, &device.Emu{}
	ranks := func(devs ...device.Device) []*dispatchers.DeviceRank {
		var rs []*dispatchers.DeviceRank
		for _, d := range devs {
			rs = append(rs, &dispatchers.DeviceRank{Dev: d})
		}
		return rs
	}
	if got := packed(ranks(a, a, b, b, c, c), 6); !strings.Contains(got, "ranks 0–1, 2–3, 4–5 share one GPU") {
		t.Errorf("three pairs: %q", got)
	}
	if got := packed(ranks(a, b, c), 3); got != "" {
		t.Errorf("a device each: %q", got)
	}
	if got := packed(ranks(a, b, b, c), 2); got != "" {
		t.Errorf("ranks 1 and 2 share a device but not a domain of 2: %q", got)
	}
}

// TestBaseUnavailableReadsOnce: FEPLB over an unavailable base names the
// base once, its reason once ("feplb (native): unavailable: base dispatcher
// deepep (native): …", not "… deepep (native): unavailable: …").
func TestBaseUnavailableReadsOnce(t *testing.T) {
	err := baseUnavailable(dispatchers.ImplNative, &dispatchers.UnavailableError{Name: "deepep", Impl: dispatchers.ImplNative, Reason: "EP 16"})
	if got := err.Error(); !dispatchers.IsUnavailable(err) || strings.Count(got, "unavailable") != 1 || !strings.Contains(got, "base dispatcher deepep (native): ") {
		t.Errorf("%v", err)
	}
}

// TestDefaultDynamicFits: left at its default (Env.Dynamic 0), the
// dynamic experts per rank are the paper's 4 where a rank has more than 4
// experts, else all of a rank's experts but one, with no "asked, used"
// note; asked for explicitly, more than fit are capped and the note says
// so.
func TestDefaultDynamicFits(t *testing.T) {
	m := balance.H100(64, 64)
	for _, c := range []struct {
		experts, ep, dynamic, want int
		capped                     string
	}{
		{8, 4, 0, 1, ""},  // 2 experts per rank: 1 dynamic
		{64, 4, 0, 4, ""}, // 16 experts per rank: the paper's 4
		{24, 4, 0, 4, ""}, // 6 experts per rank: the paper's 4
		{16, 4, 0, 3, ""}, // 4 experts per rank: 3
		{8, 4, 4, 4, "4 dynamic experts per rank asked, 1 used"}, // asked: 4, capped to 1 when used
	} {
		shape := dispatchers.Shape{Tokens: 8, Hidden: 64, Experts: c.experts, TopK: 2, EP: c.ep}
		core, err := newCore(dispatchers.Env{Dynamic: c.dynamic}, shape, m)
		if err != nil {
			t.Fatal(err)
		}
		if core.perRank != c.want || (c.capped == "") != (core.capped == "") || !strings.Contains(core.capped, c.capped) {
			t.Errorf("%d experts, EP %d, --feplb-dynamic %d: %d dynamic per rank, note %q; want %d, note %q",
				c.experts, c.ep, c.dynamic, core.perRank, core.capped, c.want, c.capped)
		}
	}
}

// TestFP8CopyBytes: at fp8, where the layer runs the FP8 GEMM, phase 2
// moves an expert's e4m3 codes and their 128×128 multipliers in
// BLK128x128_32F's order, 3·f·h + 4·(⌈2f/128⌉·ld(h) + ⌈h/128⌉·ld(f))
// bytes (ld(k): ⌈k/128⌉ rounded up to 4), and the step's copy_bytes
// counts that per weight move, and each moved row as an e4m3 row with
// its 1×128 multipliers out (h + h/32 B) and a bf16 row back (2·h) — less
// than bf16's for the same moves. A known rebalance: EP 4 in one
// domain, rank 0's two experts holding most rows.
func TestFP8CopyBytes(t *testing.T) {
	const h, f = 256, 384
	// by hand: 3·384·256 codes; fc1 [768, 256]: 6 block rows of ld 4, fc2
	// [256, 384]: 2 block rows of ld 4 (⌈384/128⌉ = 3 rounded up)
	if got, want := dispatchers.FP8WeightBytes(h, f), int64(3*384*256+4*(6*4+2*4)); got != want {
		t.Fatalf("FP8WeightBytes(%d, %d) = %d, want %d", h, f, got, want)
	}
	// docs/dispatchers/feplb.md's example: h 7168, f 2048 (fc1 32 block
	// rows of ld 56, fc2 56 of ld 16)
	if got, want := dispatchers.FP8WeightBytes(7168, 2048), int64(3*7168*2048+4*(32*56+56*16)); got != want || want != 44050944 {
		t.Fatalf("FP8WeightBytes(7168, 2048) = %d, want %d (44050944)", got, want)
	}
	shape := dispatchers.Shape{Tokens: 256, Hidden: h, Experts: 8, TopK: 2, EP: 4}
	rows := [][]int{{300, 300}, {30, 30}, {20, 30}, {10, 20}}
	for _, fp8 := range []bool{false, true} {
		m := HostModel(h, f)
		if fp8 {
			m.ExpertBytes = dispatchers.FP8WeightBytes(h, f)
		}
		env := dispatchers.Env{Hidden: h, FFN: f}
		if fp8 {
			env.Precision = dispatchers.PrecisionFP8
		}
		c, err := newCore(env, shape, m)
		if err != nil {
			t.Fatal(err)
		}
		c.begin()
		for r, n := range rows {
			c.dispatchedRank(r, n)
		}
		if err := c.plan(); err != nil {
			t.Fatal(err)
		}
		moved := 0
		for _, in := range c.lay.in {
			for _, ch := range in {
				moved += ch.n
			}
		}
		wb, row := int64(6*h*f), int64(2*2*h)
		if fp8 {
			wb, row = dispatchers.FP8WeightBytes(h, f), int64(h+h/32+2*h)
		}
		want := int64(c.lay.moves)*wb + int64(moved)*row
		if c.lay.moves == 0 || c.stats.CopyBytes != want {
			t.Errorf("fp8 %v: copy_bytes %d for %d moves of %d rows, want %d", fp8, c.stats.CopyBytes, c.lay.moves, moved, want)
		}
		if bf := int64(c.lay.moves)*6*h*f + int64(moved)*2*2*h; fp8 && c.stats.CopyBytes >= bf {
			t.Errorf("fp8: copy_bytes %d, not less than bf16's %d for the same moves", c.stats.CopyBytes, bf)
		}
		t.Logf("fp8 %v: %d moves, %d rows, copy_bytes %d (%s %s)", fp8, c.lay.moves, moved, c.stats.CopyBytes, c.noOp, c.stats.Note)
	}
}
