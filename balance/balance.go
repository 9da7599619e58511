// Package balance computes per-step MoE load-balancing plans from routing
// counts: which rank computes how many of each expert's tokens, and which
// tokens and expert weights move over which link to make that so. Plans are
// plain data — printable, checkable, and executed by the same engine on host
// and GPU. Policies: none, DeepSeek EPLB's replication, FasterMoE's
// shadowing (fastermoe.go), and FEPLB — the paper's whole-expert greedy
// scheduler and moebench's split-chunk variant (feplb.go). timeline.go plays
// a plan out in time (the model every policy is judged by), sim.go runs the
// policies over many simulated steps.
//
// The policies and the simulator: docs/load-balancing.md.
package balance

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// Topology is the EP layout: Ranks ranks, rank r owning experts
// [r·L, (r+1)·L), grouped into NVLink domains of Domain consecutive ranks.
type Topology struct {
	Ranks, Experts, Domain int
}

// Local is L, the experts per rank.
func (t Topology) Local() int { return t.Experts / t.Ranks }

// Owner is the rank that owns expert e in the default placement.
func (t Topology) Owner(e int) int { return e / t.Local() }

// DomainOf is the NVLink domain of rank r.
func (t Topology) DomainOf(r int) int { return r / t.Domain }

// Validate checks the layout.
func (t Topology) Validate() error {
	switch {
	case t.Ranks < 1 || t.Experts < 1:
		return fmt.Errorf("ranks = %d, experts = %d: both must be ≥ 1", t.Ranks, t.Experts)
	case t.Experts%t.Ranks != 0:
		return fmt.Errorf("ranks = %d must divide experts = %d", t.Ranks, t.Experts)
	case t.Domain < 1 || t.Ranks%t.Domain != 0:
		return fmt.Errorf("domain = %d must be ≥ 1 and divide ranks = %d", t.Domain, t.Ranks)
	}
	return nil
}

// Step is what a policy sees of one micro-batch.
type Step struct {
	Index int
	// Counts[e] is the number of token copies routed to expert e, all ranks together.
	Counts []int
	// FromRank(e) splits Counts[e] by source rank (tokens originate on every
	// rank); policies that compute tokens where they come from ask for it.
	FromRank func(e int) []int
	// Ready is when, in seconds after phase 1, a plan made for this step is
	// known and its copies may start: the counts' arrival plus the CPU
	// scheduler's time (what the planner expects it to be).
	Ready float64
}

// Share is part of an expert's tokens computed on one rank.
type Share struct {
	Rank, Tokens int
}

// Link kinds a move can use.
const (
	LinkCE      = "ce"      // copy engine inside an NVLink domain: no SMs
	LinkNVLink  = "nvlink"  // SM-driven or collective transfer inside a domain
	LinkNetwork = "network" // between domains
)

// Move kinds: what a move is for, which decides when it happens in the
// step (timeline.go).
const (
	// KindRebalance is FEPLB's phase 2: an expert's weights and rows go from
	// its owner to a helper over copy engines once the plan is known, and the
	// outputs come back.
	KindRebalance = "rebalance"
	// KindShadow is FasterMoE's shadowing: an expert's weights broadcast to
	// every rank, which computes the expert's tokens it holds itself.
	KindShadow = "shadow"
	// KindPlacement moves weights to a new placement (EPLB's replicas,
	// feplb+place's re-placement) before the step starts.
	KindPlacement = "placement"
)

// Move is data a plan transfers: an expert's weights, or some of its tokens
// (and, for tokens, their outputs back).
type Move struct {
	Expert   int
	From, To int
	Tokens   int   // 0 for a weight move
	Bytes    int64 // payload of the move (tokens: the rows one way)
	Link     string
	Weights  bool
	Kind     string
}

// Plan is one step's decision.
type Plan struct {
	Policy string
	// Shares[e] lists who computes expert e's tokens; the shares sum to Counts[e].
	Shares [][]Share
	// Holders[e] lists the ranks that hold expert e's weights this step.
	Holders [][]int
	Moves   []Move
	// Dynamic marks FEPLB's dynamic experts this step (nil for the other
	// policies): their owners compute the share they keep after the chunks
	// they compute for others (see phaseEnds).
	Dynamic []bool
	// SchedulerNote says what the policy decided, for --explain.
	Note string
}

// Loads is the token copies each rank computes under p.
func (p *Plan) Loads(ranks int) []int {
	l := make([]int, ranks)
	for _, sh := range p.Shares {
		for _, s := range sh {
			l[s.Rank] += s.Tokens
		}
	}
	return l
}

// BytesByLink sums the plan's moves per link; token moves count both ways
// (rows out, outputs back).
func (p *Plan) BytesByLink() map[string]int64 {
	b := map[string]int64{}
	for _, m := range p.Moves {
		if m.Weights {
			b[m.Link] += m.Bytes
		} else {
			b[m.Link] += 2 * m.Bytes
		}
	}
	return b
}

// Check verifies a plan against its step: every token copy is computed
// exactly once; every rank computing an expert holds its weights; FEPLB moves
// stay inside a domain. It returns the first violation.
func (p *Plan) Check(t Topology, st Step) error {
	if len(p.Shares) != t.Experts || len(p.Holders) != t.Experts {
		return fmt.Errorf("%s: plan covers %d/%d experts, want %d", p.Policy, len(p.Shares), len(p.Holders), t.Experts)
	}
	for e, shares := range p.Shares {
		sum := 0
		for _, s := range shares {
			if s.Tokens < 0 || s.Rank < 0 || s.Rank >= t.Ranks {
				return fmt.Errorf("%s: expert %d: bad share %+v", p.Policy, e, s)
			}
			sum += s.Tokens
			if s.Tokens > 0 && !slices.Contains(p.Holders[e], s.Rank) {
				return fmt.Errorf("%s: expert %d: rank %d computes %d tokens without its weights (holders %v)", p.Policy, e, s.Rank, s.Tokens, p.Holders[e])
			}
		}
		if sum != st.Counts[e] {
			return fmt.Errorf("%s: expert %d: shares sum to %d tokens, routed %d", p.Policy, e, sum, st.Counts[e])
		}
	}
	for _, m := range p.Moves {
		if m.Link == LinkCE && t.DomainOf(m.From) != t.DomainOf(m.To) {
			return fmt.Errorf("%s: copy-engine move of expert %d from rank %d to rank %d leaves the NVLink domain", p.Policy, m.Expert, m.From, m.To)
		}
	}
	return nil
}

// Explain prints the plan: loads, moves and the policy's note.
func (p *Plan) Explain(t Topology) string {
	var b strings.Builder
	fmt.Fprintf(&b, "policy %s: %s\n", p.Policy, p.Note)
	fmt.Fprintf(&b, "  tokens per rank: %v\n", p.Loads(t.Ranks))
	moves := append([]Move(nil), p.Moves...)
	sort.SliceStable(moves, func(i, j int) bool { return moves[i].Expert < moves[j].Expert })
	for _, m := range moves {
		what := fmt.Sprintf("%d tokens", m.Tokens)
		if m.Weights {
			what = "weights"
		}
		fmt.Fprintf(&b, "  expert %4d: %-10s rank %3d → %3d over %-7s %-9s %s\n", m.Expert, what, m.From, m.To, m.Link, m.Kind, byteStr(m.Bytes))
	}
	bl := p.BytesByLink()
	for _, link := range slices.Sorted(maps.Keys(bl)) {
		fmt.Fprintf(&b, "  %s bytes: %s\n", link, byteStr(bl[link]))
	}
	return b.String()
}

func byteStr(n int64) string { return fmt.Sprintf("%.2f MB", float64(n)/1e6) }

// OwnerPlan computes every expert on its owner with all its tokens: the
// load before any balancing.
func OwnerPlan(t Topology, st Step) Plan {
	p := Plan{Shares: make([][]Share, t.Experts), Holders: make([][]int, t.Experts)}
	for e := range t.Experts {
		o := t.Owner(e)
		p.Shares[e] = []Share{{o, st.Counts[e]}}
		p.Holders[e] = []int{o}
	}
	return p
}
