package dispatchers

import (
	"strings"
	"testing"
)

// classic has the four classic phases; own declares its own.
type classic struct{ base }
type own struct{ base }
type none struct{ base }

type base struct{}

func (base) Name() string              { return "x" }
func (base) Impl() string              { return ImplNative }
func (base) Bind(Shape, []*Rank) error { return nil }
func (base) Traffic() Traffic          { return Traffic{} }
func (base) Footprint(int) int64       { return 0 }
func (classic) Permute(int) error      { return nil }
func (classic) Dispatch(int) error     { return nil }
func (classic) Combine(int) error      { return nil }
func (classic) Unpermute(int) error    { return nil }
func (own) Phases(ex func(int) error) []Step {
	return []Step{{"layout", nil}, {"dispatch", nil}, {ExpertPhases[0], ex}, {"combine", nil}}
}

func init() {
	Register("test-classic", func(string, Env) (Dispatcher, error) { return classic{}, nil })
	Register("test-own", func(string, Env) (Dispatcher, error) { return own{}, nil })
	Register("test-none", func(string, Env) (Dispatcher, error) { return none{}, nil })
}

func names(s []Step) string {
	var n []string
	for _, st := range s {
		n = append(n, st.Name)
	}
	return strings.Join(n, ",")
}

// TestSteps: a Phaser's own phases, else the classic sequence; New refuses
// a dispatcher that declares neither, and NewClassic one with its own.
func TestSteps(t *testing.T) {
	if got := names(Steps(classic{}, nil)); got != "permute,dispatch,experts,combine,unpermute" {
		t.Errorf("classic phases %s", got)
	}
	if got := names(Steps(own{}, nil)); got != "layout,dispatch,experts,combine" {
		t.Errorf("own phases %s", got)
	}
	if _, err := New("test-none", ImplNative, Env{}); err == nil || !strings.Contains(err.Error(), "declares no phases") {
		t.Errorf("a dispatcher without phases: %v", err)
	}
	if _, err := NewClassic("test-classic", ImplNative, Env{}); err != nil {
		t.Errorf("classic as a base: %v", err)
	}
	_, err := NewClassic("test-own", ImplNative, Env{})
	if !IsUnavailable(err) || !strings.Contains(err.Error(), "layout, dispatch, experts, combine") {
		t.Errorf("own phases as a base: %v", err)
	}
}

func TestSMBudget(t *testing.T) {
	b := SMBudget{Default: 20, Even: true, About: "pairs"}
	for n, ok := range map[int]bool{0: true, 2: true, 24: true, 3: false, -2: false, MaxSMBudget + 2: false} {
		if err := b.Check(n); (err == nil) != ok {
			t.Errorf("Check(%d) = %v", n, err)
		}
	}
	if b.Resolve(0) != 20 || b.Resolve(8) != 8 {
		t.Errorf("Resolve: %d, %d", b.Resolve(0), b.Resolve(8))
	}
	if err := (SMBudget{Default: 16}).Check(17); err != nil {
		t.Errorf("odd budget of a design that does not pair blocks: %v", err)
	}
}

// The backward's contract: classicBack has the classic backward, ownBack
// its own, rebalancing a rebalance without and with its backward.
type classicBack struct{ classic }
type ownBack struct{ own }
type rebalancing struct{ classicBack }
type rebalancingBack struct{ rebalancing }

func (classicBack) UnpermuteBackward(int) error { return nil }
func (classicBack) CombineBackward(int) error   { return nil }
func (classicBack) DispatchBackward(int) error  { return nil }
func (classicBack) PermuteBackward(int) error   { return nil }
func (ownBack) BackwardPhases(ex func(int) error) []Step {
	return []Step{{BackwardName("combine"), nil}, {ExpertBackwardPhases[0], ex}, {BackwardName("dispatch"), nil}}
}
func (rebalancing) Rebalance(int) error                  { return nil }
func (rebalancing) RebalanceStats() RebalanceStats       { return RebalanceStats{} }
func (rebalancing) Pause(bool)                           {}
func (rebalancingBack) RebalanceBackward(rank int) error { return nil }

// TestBackwardSteps: the classic backward is the forward's sequence
// reversed, each phase its dual (a rebalancer's expert phases and
// rebalance in reverse too); a design's own backward phases are its own; a
// dispatcher without a backward, or a rebalancer without the rebalance's,
// has none.
func TestBackwardSteps(t *testing.T) {
	for _, tc := range []struct {
		d    any
		want string
	}{
		{classicBack{}, "unpermute-bwd,combine-bwd,experts-bwd,dispatch-bwd,permute-bwd"},
		{rebalancingBack{}, "unpermute-bwd,combine-bwd,dynamic-bwd,rebalance-bwd,experts-bwd,dispatch-bwd,permute-bwd"},
		{ownBack{}, "combine-bwd,experts-bwd,dispatch-bwd"},
	} {
		s, err := BackwardSteps(tc.d, nil)
		if got := names(s); err != nil || got != tc.want || !HasBackward(tc.d) {
			t.Errorf("%T: backward %s (%v), want %s", tc.d, got, err, tc.want)
		}
		// each backward phase is the dual of a forward phase of the design
		fwd := map[string]bool{}
		for _, st := range Steps(tc.d, nil) {
			fwd[st.Name] = true
		}
		for _, st := range s {
			if name := strings.TrimSuffix(st.Name, "-bwd"); !fwd[name] {
				t.Errorf("%T: backward phase %s has no forward phase %s", tc.d, st.Name, name)
			}
		}
	}
	if _, err := BackwardSteps(rebalancing{}, nil); err == nil || !strings.Contains(err.Error(), "no RebalanceBackward") {
		t.Errorf("a rebalancer without the rebalance's backward: %v", err)
	}
	for _, d := range []any{classic{}, own{}} {
		if _, err := BackwardSteps(d, nil); HasBackward(d) || err == nil {
			t.Errorf("%T declares no backward, yet has one (%v)", d, err)
		}
	}
}
