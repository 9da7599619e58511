package kernels

import "fmt"

// Group is one GEMM of a grouped GEMM: C[M,n] = A[M,k] · W[n,k]ᵀ, with n and
// k common to the group.
type Group struct {
	C, A, W Ptr
	M       int
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
	fork    Event
	join    []Event
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
		return dev.GroupedGEMM(groups, n, k, s)
	}
	if len(g.Side) == 0 {
		for _, gr := range groups {
			if err := dev.GEMM(gr.C, gr.A, gr.W, gr.M, n, k, false, s); err != nil {
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
		if err := dev.GEMM(gr.C, gr.A, gr.W, gr.M, n, k, false, on); err != nil {
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
