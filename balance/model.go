package balance

import "math"

// Model turns a plan into modelled times and bytes.
type Model struct {
	Hidden, FFN int
	GEMMRate    float64 // FLOP/s of the expert GEMMs
	HBM         float64 // B/s, bounds a small expert GEMM by its weight reads
	CE          float64 // B/s of copy-engine P2P transfers per rank
	NVLink      float64 // B/s per rank and direction inside a domain
	Network     float64 // B/s per rank and direction between domains
	// CEShare is the share of a rank's NVLink bandwidth its copy-engine
	// copies get when EP dispatch/combine traffic shares the link with them
	// (1: the copies have the link to themselves). The copies then run at
	// min(CE, CEShare·NVLink).
	CEShare    float64
	RateSource string // where GEMMRate came from
	// ExpertBytes, when not 0, is one expert's weights as they move (feplb
	// at fp8: the FP8 GEMM's e4m3 codes and multipliers,
	// dispatchers.FP8WeightBytes); 0: bf16's, 6·h·f.
	ExpertBytes int64
}

// H100 is the stated roofline of one H100 SXM (docs/references.md):
// dense BF16 989 TFLOP/s, HBM3 3.35 TB/s, NVLink 450 GB/s per direction,
// copy-engine P2P 380 GB/s one way (measured by others), 50 GB/s network
// (CX7 400 Gb/s).
func H100(hidden, ffn int) Model {
	return Model{Hidden: hidden, FFN: ffn, GEMMRate: 989e12, HBM: 3.35e12, CE: 380e9, NVLink: 450e9, Network: 50e9, CEShare: 1,
		RateSource: "H100 SXM roofline: 989 TFLOP/s dense BF16, 3.35 TB/s HBM"}
}

// TokenBytes is one bf16 token row.
func (m Model) TokenBytes() int64 { return 2 * int64(m.Hidden) }

// WeightBytes is one expert's weights as they move: bf16 (fc1 h→2f, fc2
// f→h; and so also its bf16 weight gradient), or ExpertBytes when set.
func (m Model) WeightBytes() int64 {
	if m.ExpertBytes > 0 {
		return m.ExpertBytes
	}
	return 6 * int64(m.Hidden) * int64(m.FFN)
}

// TokenCompute is one token copy's expert GEMM time at GEMMRate.
func (m Model) TokenCompute() float64 { return 6 * float64(m.Hidden) * float64(m.FFN) / m.GEMMRate }

// CERate is the copy-engine rate the copies get: CE, or CEShare of the
// NVLink bandwidth when that is lower.
func (m Model) CERate() float64 {
	if m.CEShare > 0 && m.CEShare < 1 {
		return math.Min(m.CE, m.CEShare*m.NVLink)
	}
	return m.CE
}

// ExpertTime is the modelled forward time of one expert GEMM pair on n
// tokens: the larger of its FLOPs at GEMMRate and its weight reads at HBM.
func (m Model) ExpertTime(n int) float64 {
	if n <= 0 {
		return 0
	}
	return math.Max(float64(n)*m.TokenCompute(), float64(m.WeightBytes())/m.HBM)
}

// GEMMTimes is each rank's modelled expert-GEMM time under p, in seconds.
func (m Model) GEMMTimes(p *Plan, ranks int) []float64 {
	t := make([]float64, ranks)
	for _, shares := range p.Shares {
		for _, s := range shares {
			t[s.Rank] += m.ExpertTime(s.Tokens)
		}
	}
	return t
}

// linkBW is the link between two ranks for traffic other than FEPLB's
// copy-engine moves, and its rate.
func (m Model) linkBW(t Topology, a, b int) (string, float64) {
	if t.DomainOf(a) == t.DomainOf(b) {
		return LinkNVLink, m.NVLink
	}
	return LinkNetwork, m.Network
}

// rate is the rate of a link kind.
func (m Model) rate(link string) float64 {
	switch link {
	case LinkCE:
		return m.CERate()
	case LinkNVLink:
		return m.NVLink
	}
	return m.Network
}
