package setup

import (
	"math"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"

	_ "github.com/moebench/moebench/dispatchers/all"
	"github.com/moebench/moebench/kernels"
)

func TestParseRouting(t *testing.T) {
	for _, ok := range []string{"balanced", "uniform", "skewed:1.2", "skewed:0", "trace:x.txt", "natural"} {
		r, err := ParseRouting(ok)
		if err != nil || r.String() != ok {
			t.Errorf("ParseRouting(%q) = %v, %v", ok, r, err)
		}
	}
	for _, bad := range []string{"", "zipf", "skewed", "skewed:abc", "skewed:-1", "trace:", "balanced:3"} {
		if _, err := ParseRouting(bad); err == nil {
			t.Errorf("ParseRouting(%q) accepted", bad)
		}
	}
}

// counts routes ranks·tokens random tokens with r and returns per-expert counts.
func counts(t *testing.T, r Routing, ranks, tokens, experts, k int) []int {
	c := DefaultConfig()
	c.Tokens, c.Experts, c.TopK, c.EP, c.Routing = tokens, experts, k, ranks, r
	rc := c.RouterConfig(nil)
	n := make([]int, experts)
	for rank := range ranks {
		logits := r.Logits(c.Seed, rank, tokens, experts)
		if logits == nil {
			t.Fatalf("%v gives no logits", r)
		}
		idx, probs := make([]int32, tokens*k), make([]float32, tokens*k)
		kernels.Route(rc, logits, tokens, idx, probs)
		for _, e := range idx {
			n[e]++
		}
	}
	return n
}

func TestRoutingStatistics(t *testing.T) {
	const ranks, tokens, E, k = 8, 512, 16, 4
	mean := float64(ranks*tokens*k) / E
	sigma := math.Sqrt(mean * (1 - float64(k)/E))
	for _, r := range []Routing{{Kind: RoutingBalanced}, {Kind: RoutingUniform}} {
		n := counts(t, r, ranks, tokens, E, k)
		for e, c := range n {
			if math.Abs(float64(c)-mean) > 6*sigma {
				t.Errorf("%v: expert %d got %d copies, mean %.0f ± 6σ (%.0f)", r, e, c, mean, 6*sigma)
			}
		}
	}
	// skewed routing breaks that bound, and follows its popularity order
	r := Routing{Kind: RoutingSkewed, Alpha: 1.2}
	n := counts(t, r, ranks, tokens, E, k)
	lp := ZipfLogPopularity(DefaultConfig().Seed, E, r.Alpha)
	order := make([]int, E)
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return lp[order[a]] > lp[order[b]] })
	if hot, cold := n[order[0]], n[order[E-1]]; float64(hot-cold) < 6*sigma || hot < 2*cold {
		t.Errorf("skewed:1.2: most popular expert %d copies, least %d: not skewed", hot, cold)
	}
	inversions := 0
	for i := 0; i+1 < E; i++ {
		if n[order[i]] < n[order[i+1]] {
			inversions++
		}
	}
	if inversions > 3 {
		t.Errorf("skewed counts %v do not follow the popularity order (%d inversions)", n, inversions)
	}
}

func TestRoutingReproducibleBySeed(t *testing.T) {
	r := Routing{Kind: RoutingSkewed, Alpha: 1}
	a, b, c := r.Logits(7, 2, 16, 8), r.Logits(7, 2, 16, 8), r.Logits(8, 2, 16, 8)
	if !slices.Equal(a, b) || slices.Equal(a, c) || slices.Equal(a, r.Logits(7, 3, 16, 8)) {
		t.Error("logits must repeat for the same seed and rank and differ otherwise")
	}
}

// TestCommitFromCheckout: a binary without Go's VCS stamp (go run, go test)
// still records the checkout's commit.
func TestCommitFromCheckout(t *testing.T) {
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	want := strings.TrimSpace(string(head))
	if got := BuildCommit(); strings.TrimSuffix(got, "+dirty") != want {
		t.Errorf("BuildCommit() = %q, want %q (+dirty)", got, want)
	}
	// another directory: no commit rather than a wrong one
	t.Chdir(t.TempDir())
	if got := checkoutCommit(); got != "" {
		t.Errorf("outside the checkout: %q", got)
	}
}
