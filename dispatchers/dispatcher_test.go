package dispatchers

import (
	"strings"
	"testing"
)

// classic has Megatron's phases and their backward; own declares its own
// forward and no backward.
type classic struct{}
type own struct{}

func (classic) Name() string              { return "x" }
func (classic) Impl() string              { return ImplNative }
func (classic) Bind(Shape, []*Rank) error { return nil }
func (classic) Traffic() Traffic          { return Traffic{} }
func (classic) Footprint(int) int64       { return 0 }
func (classic) Close() error              { return nil }
func (classic) Capabilities() Capabilities {
	return Capabilities{}
}
func (classic) Forward(ex func(int) error) []Step {
	return Sequence(ex, nil, nil, nil, nil)
}
func (classic) Backward(ex func(int) error) []Step {
	return SequenceBackward(ex, nil, nil, nil, nil)
}

func (own) Name() string              { return "y" }
func (own) Impl() string              { return ImplNative }
func (own) Bind(Shape, []*Rank) error { return nil }
func (own) Traffic() Traffic          { return Traffic{} }
func (own) Footprint(int) int64       { return 0 }
func (own) Close() error              { return nil }
func (own) Capabilities() Capabilities {
	return Capabilities{NoBackward: "not built"}
}
func (own) Forward(ex func(int) error) []Step {
	return []Step{{"layout", nil}, {"dispatch", nil}, {ExpertPhases[0], ex}, {"combine", nil}}
}
func (own) Backward(func(int) error) []Step { return nil }

func init() {
	Register("test-classic", func(string, Env) (Dispatcher, error) { return classic{}, nil })
	Register("test-own", func(string, Env) (Dispatcher, error) { return own{}, nil })
}

func names(s []Step) string {
	var n []string
	for _, st := range s {
		n = append(n, st.Name)
	}
	return strings.Join(n, ",")
}

// TestSteps: Sequence is Megatron's phases, the experts in their place;
// a design's own steps are its own, and Runs finds them by name.
func TestSteps(t *testing.T) {
	if got := names(classic{}.Forward(nil)); got != "permute,dispatch,experts,combine,unpermute" {
		t.Errorf("classic phases %s", got)
	}
	d, err := New("test-own", ImplNative, Env{})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(d.Forward(nil)); got != "layout,dispatch,experts,combine" {
		t.Errorf("own phases %s", got)
	}
	called := 0
	run := Runs(classic{}.Forward(func(int) error { called++; return nil }))
	if err := run[ExpertPhases[0]](0); err != nil || called != 1 || len(run) != 5 {
		t.Errorf("Runs: %d runs, experts called %d times (%v)", len(run), called, err)
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

// TestBackwardSteps: SequenceBackward is the forward's sequence reversed,
// each phase its dual; FusedBackward a fused design's; a design without a
// backward returns none and says why.
func TestBackwardSteps(t *testing.T) {
	for _, tc := range []struct {
		fwd, bwd []Step
		want     string
	}{
		{classic{}.Forward(nil), classic{}.Backward(nil), "unpermute-bwd,combine-bwd,experts-bwd,dispatch-bwd,permute-bwd"},
		{own{}.Forward(nil), FusedBackward(nil, nil, nil), "combine-bwd,experts-bwd,dispatch-bwd"},
	} {
		if got := names(tc.bwd); got != tc.want {
			t.Errorf("backward %s, want %s", got, tc.want)
		}
		// each backward phase is the dual of a forward phase of the design
		fwd := map[string]bool{}
		for _, st := range tc.fwd {
			fwd[st.Name] = true
		}
		for _, st := range tc.bwd {
			if name := strings.TrimSuffix(st.Name, "-bwd"); !fwd[name] {
				t.Errorf("backward phase %s has no forward phase %s", st.Name, name)
			}
		}
	}
	if d := (own{}); d.Backward(nil) != nil || d.Capabilities().NoBackward == "" {
		t.Errorf("a design without a backward: %v, %q", d.Backward(nil), d.Capabilities().NoBackward)
	}
}
