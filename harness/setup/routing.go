package setup

import (
	"bufio"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
)

// Routing kinds (--routing).
const (
	// RoutingBalanced is Megatron's force-load-balancing: the router's logits
	// are replaced by i.i.d. N(0,1) draws, per rank, and the configured score
	// function and top-k then run as usual. Balance holds only on average.
	RoutingBalanced = "balanced"
	// RoutingUniform: each token's k experts are a uniformly random k-subset
	// (logits replaced by i.i.d. Gumbel draws; with group-limited routing the
	// group limit still applies).
	RoutingUniform = "uniform"
	// RoutingSkewed: experts get a Zipf popularity p ∝ 1/rank^ALPHA over a
	// seeded random order shared by all EP ranks; logits are log p + Gumbel
	// noise, so top-k samples k experts without replacement in proportion to p
	// (Plackett–Luce). ALPHA = 0 is uniform; larger ALPHA makes stragglers.
	RoutingSkewed = "skewed"
	// RoutingTrace replays recorded routing from a file (see ReadTrace).
	RoutingTrace = "trace"
	// RoutingNatural uses the router's own logits (x · Wrᵀ) on the random
	// input: real routing, nearly balanced for random weights.
	RoutingNatural = "natural"
)

// Routing is a parsed --routing value.
type Routing struct {
	Kind  string
	Alpha float64
	File  string
}

const routingAllowed = "allowed: balanced, uniform, skewed:ALPHA (ALPHA ≥ 0), trace:FILE, natural"

// ParseRouting parses balanced | uniform | skewed:ALPHA | trace:FILE | natural.
func ParseRouting(s string) (Routing, error) {
	kind, arg, hasArg := strings.Cut(s, ":")
	r := Routing{Kind: kind}
	switch kind {
	case RoutingBalanced, RoutingUniform, RoutingNatural:
		if hasArg {
			return r, &ConfigError{"routing", s, kind + " takes no argument; " + routingAllowed}
		}
	case RoutingSkewed:
		a, err := strconv.ParseFloat(arg, 64)
		if !hasArg || err != nil {
			return r, &ConfigError{"routing", s, "skewed needs a number, e.g. skewed:1.2; " + routingAllowed}
		}
		r.Alpha = a
	case RoutingTrace:
		if arg == "" {
			return r, &ConfigError{"routing", s, "trace needs a file, e.g. trace:routing.txt"}
		}
		r.File = arg
	default:
		return r, &ConfigError{"routing", s, routingAllowed}
	}
	return r, r.validate()
}

// String is the --routing spelling of r.
func (r Routing) String() string {
	switch r.Kind {
	case RoutingSkewed:
		return fmt.Sprintf("skewed:%g", r.Alpha)
	case RoutingTrace:
		return "trace:" + r.File
	}
	return r.Kind
}

func (r Routing) validate() error {
	switch r.Kind {
	case RoutingBalanced, RoutingUniform, RoutingNatural:
	case RoutingSkewed:
		if !(r.Alpha >= 0) || r.Alpha > 100 {
			return &ConfigError{"routing", r.String(), "ALPHA must be in [0, 100]"}
		}
	case RoutingTrace:
		if r.File == "" {
			return &ConfigError{"routing", r.String(), "trace needs a file"}
		}
	default:
		return &ConfigError{"routing", r.Kind, routingAllowed}
	}
	return nil
}

// RNG returns a generator for one purpose and rank, reproducible by seed.
func RNG(seed uint64, purpose string, rank int) *rand.Rand {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", purpose, rank)
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

// Logits returns rank r's router-logit override [tokens, experts] of the
// first step, or nil when the routing comes from the router itself
// (natural) or from a trace.
func (r Routing) Logits(seed uint64, rank, tokens, experts int) []float32 {
	switch r.Kind {
	case RoutingBalanced, RoutingUniform, RoutingSkewed:
		out := make([]float32, tokens*experts)
		r.FillLogits(out, seed, rank, experts, 0, 0)
		return out
	}
	return nil
}

// FillLogits draws rank r's override of one step into out ([tokens,
// experts]): from the seed, the rank and the step, so that each step has its
// own routing (step 0's draws are the ones every step had before routing
// was drawn per step), and from the micro-batch: --overlap a2a's second
// micro-batch draws from the same distribution, its own stream.
func (r Routing) FillLogits(out []float32, seed uint64, rank, experts, step, micro int) {
	purpose := "logits"
	if micro > 0 {
		purpose = fmt.Sprintf("logits-micro-batch-%d@%d", micro, step)
	} else if step > 0 {
		purpose = fmt.Sprintf("logits@%d", step)
	}
	g := RNG(seed, purpose, rank)
	if r.Kind == RoutingBalanced {
		for i := range out {
			out[i] = float32(g.NormFloat64())
		}
		return
	}
	logBias := make([]float64, experts)
	if r.Kind == RoutingSkewed {
		logBias = ZipfLogPopularity(seed, experts, r.Alpha)
	}
	for i := range out {
		out[i] = float32(logBias[i%experts] + gumbel(g))
	}
}

// ZipfLogPopularity returns log p_e for Zipf(alpha) popularities over a
// random order of the experts drawn from seed (the same on every rank).
func ZipfLogPopularity(seed uint64, experts int, alpha float64) []float64 {
	order := RNG(seed, "popularity", 0).Perm(experts)
	lp := make([]float64, experts)
	for i, e := range order {
		lp[e] = -alpha * math.Log(float64(i+1))
	}
	return lp
}

func gumbel(g *rand.Rand) float64 {
	u := g.Float64()
	for u == 0 {
		u = g.Float64()
	}
	return -math.Log(-math.Log(u))
}

// Limits of a trace: the longest line (a line holds one token's k experts)
// and the largest probability (1 times the largest --topk-scale).
const (
	maxTraceLine = 1 << 20
	maxTraceProb = 1e6
)

// Trace is recorded routing read by ReadTrace.
type Trace struct {
	TopK  int
	Idx   []int32   // [lines, TopK]
	Probs []float32 // [lines, TopK], nil when the file has no probabilities
}

// Lines is the number of tokens the trace holds.
func (t *Trace) Lines() int { return len(t.Idx) / t.TopK }

// Token returns the routing of global token g (rank·tokens + t); a trace
// shorter than the run is replayed cyclically.
func (t *Trace) Token(g int) (idx []int32, probs []float32) {
	l := g % t.Lines()
	idx = t.Idx[l*t.TopK : (l+1)*t.TopK]
	if t.Probs != nil {
		probs = t.Probs[l*t.TopK : (l+1)*t.TopK]
	}
	return idx, probs
}

// ReadTrace reads a routing trace. Format: UTF-8 text, one token per line;
// blank lines and lines starting with '#' are ignored. A line holds exactly
// topk distinct expert indices in [0, experts), separated by spaces or tabs,
// each optionally followed by ':' and its routing probability (a number in
// [0, 1e6]); a line is at most 1 MiB. Either every line has probabilities or none has; without them
// the probabilities come from the router's score function over the chosen
// experts. Rank r's token t replays line (r·tokens + t) mod lines.
// Every error names the file, the line and the value at fault.
func ReadTrace(path string, experts, topk int) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := &Trace{TopK: topk}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxTraceLine)
	withProbs := -1 // unknown until the first token line
	ln := 0
	for sc.Scan() {
		ln++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		bad := func(format string, a ...any) error {
			return fmt.Errorf("%s:%d: %s", path, ln, fmt.Sprintf(format, a...))
		}
		fields := strings.Fields(line)
		if len(fields) != topk {
			return nil, bad("%d experts, want --topk = %d", len(fields), topk)
		}
		seen := make(map[int64]bool, topk)
		for _, fld := range fields {
			es, ps, hasP := strings.Cut(fld, ":")
			if want := withProbs == 1; withProbs >= 0 && hasP != want {
				return nil, bad("%q: probabilities must be given on every line or on none", fld)
			}
			withProbs = 0
			if hasP {
				withProbs = 1
			}
			e, err := strconv.ParseInt(es, 10, 64)
			if err != nil {
				return nil, bad("expert %q is not an integer", es)
			}
			if e < 0 || e >= int64(experts) {
				return nil, bad("expert %d out of range [0, %d)", e, experts)
			}
			if seen[e] {
				return nil, bad("expert %d appears twice", e)
			}
			seen[e] = true
			tr.Idx = append(tr.Idx, int32(e))
			if hasP {
				p, err := strconv.ParseFloat(ps, 32)
				if err != nil || !(p >= 0 && p <= maxTraceProb) {
					return nil, bad("probability %q must be a number in [0, %g] (a routing probability times at most --topk-scale's limit)", ps, maxTraceProb)
				}
				tr.Probs = append(tr.Probs, float32(p))
			}
		}
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return nil, fmt.Errorf("%s:%d: line longer than %d bytes, the longest a trace line may be", path, ln+1, maxTraceLine)
	} else if err != nil {
		return nil, fmt.Errorf("%s:%d: %v", path, ln+1, err)
	}
	if len(tr.Idx) == 0 {
		return nil, fmt.Errorf("%s: no routing lines", path)
	}
	return tr, nil
}
