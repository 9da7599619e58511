package device

import (
	"fmt"

	"github.com/moebench/moebench/internal/cuda"
)

// Group is one GEMM of a grouped GEMM: C[M,n] = A[M,k] · W[n,k]ᵀ, with n and
// k common to the group.
type Group struct {
	C, A, W Addr
	M       int
	// AScale, WScale: a Grouped of FP8 groups' multipliers of A and W (one
	// each per tensor; for block scaling A's M rows in FP8ActScalesLt's
	// order, W's in FP8WeightScalesLt's)
	AScale, WScale Addr
}

// Grouped runs a group of GEMMs (one per expert) as separate GEMM calls,
// spread round-robin over the caller's stream and Side streams: the calls
// fork from the caller's stream and join back into it with events, so the
// group as a whole is ordered on the caller's stream. With no Side streams
// the calls run one after another. A Batched Grouped makes one grouped call
// (Device.GroupedGEMM) instead.
type Grouped struct {
	Side    []Stream
	Batched string // the grouped call's name; "" for separate calls
	// FP8: the groups are e4m3 with fp32 multipliers (cuBLASLt's FP8 GEMM,
	// one call per group; the batched call has no FP8 types)
	FP8  cuda.FP8Scale
	fork Event
	join []Event
}

// NewBatched makes a Grouped that runs each group as one grouped call, or
// says why dev has none.
func NewBatched(dev Device) (*Grouped, error) {
	name, ok := dev.GroupedGEMMName()
	if !ok {
		return nil, fmt.Errorf("no grouped GEMM: %s", name)
	}
	return &Grouped{Batched: name}, nil
}

// NewGrouped makes a Grouped with side extra streams on dev.
func NewGrouped(dev Device, side int) (*Grouped, error) {
	g := &Grouped{}
	var err error
	if side == 0 {
		return g, nil
	}
	if g.fork, err = dev.NewEvent(); err != nil {
		return nil, err
	}
	for range side {
		s, err := dev.NewStream()
		if err != nil {
			return nil, err
		}
		e, err := dev.NewEvent()
		if err != nil {
			return nil, err
		}
		g.Side, g.join = append(g.Side, s), append(g.join, e)
	}
	return g, nil
}

// Name says how the group runs, for records.
func (g *Grouped) Name() string {
	if g.Batched != "" {
		return g.Batched
	}
	if len(g.Side) == 0 {
		return "per-expert cuBLASLt calls on the rank's stream"
	}
	return fmt.Sprintf("per-expert cuBLASLt calls over %d streams", len(g.Side)+1)
}

// Run queues the group on s.
func (g *Grouped) Run(dev Device, groups []Group, n, k int, s Stream) error {
	if g.Batched != "" {
		if g.FP8 != cuda.FP8None {
			return fmt.Errorf("fp8 (%v) groups: %s takes bf16/fp16/fp32 operands only; run them as per-expert calls (NewGrouped)", g.FP8, g.Batched)
		}
		return dev.GroupedGEMM(groups, n, k, s)
	}
	if len(g.Side) == 0 {
		for _, gr := range groups {
			if err := g.gemm(dev, gr, n, k, s); err != nil {
				return err
			}
		}
		return nil
	}
	if err := dev.Record(g.fork, s); err != nil {
		return err
	}
	for _, side := range g.Side {
		if err := dev.Wait(side, g.fork); err != nil {
			return err
		}
	}
	for i, gr := range groups {
		on := s // round-robin over s, then the side streams
		if j := i % (len(g.Side) + 1); j > 0 {
			on = g.Side[j-1]
		}
		if err := g.gemm(dev, gr, n, k, on); err != nil {
			return err
		}
	}
	for i, side := range g.Side {
		if err := dev.Record(g.join[i], side); err != nil {
			return err
		}
		if err := dev.Wait(s, g.join[i]); err != nil {
			return err
		}
	}
	return nil
}

// gemm runs one group on s: a bf16 GEMM, or at FP8 an FP8 MatMul with its
// multipliers (bf16 out).
func (g *Grouped) gemm(dev Device, gr Group, n, k int, s Stream) error {
	if g.FP8 == cuda.FP8None {
		return dev.GEMM(gr.C, gr.A, gr.W, gr.M, n, k, false, s)
	}
	return dev.MatMul(MatMul{C: gr.C, A: gr.A, B: gr.W, AScale: gr.AScale, BScale: gr.WScale,
		MatMul: cuda.MatMul{M: gr.M, N: n, K: k, TransB: true, FP8: g.FP8}}, s)
}
