package harness

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/dispatchers/alltoall"
	"github.com/moebench/moebench/harness/check"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/results"
)

// bound builds c's host layer and its dispatcher, bound to it.
func bound(t *testing.T, c setup.Config) (*layer.Layer, dispatchers.Dispatcher) {
	t.Helper()
	d, err := dispatchers.New(c.Dispatcher, c.Impl, c.DispatcherEnv())
	if err != nil {
		t.Fatal(err)
	}
	l, err := layer.NewLayer(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Bind(l.Shape, l.Ranks); err != nil {
		t.Fatal(err)
	}
	return l, d
}

// trained builds c's host layer and dispatcher and runs Check (a training
// step with its gradients checked).
func trained(t *testing.T, c setup.Config) (*layer.Layer, dispatchers.Dispatcher, *results.Correctness) {
	t.Helper()
	fresh := func() (dispatchers.Dispatcher, error) {
		return dispatchers.New(c.Dispatcher, c.Impl, c.DispatcherEnv())
	}
	l, d := bound(t, c)
	cc, err := check.Check(l, d, fresh)
	if err != nil {
		t.Fatal(err)
	}
	return l, d, cc
}

// layerGrads are a layer's gradients by name, each tensor flattened in a
// fixed order (ranks, then experts).
func layerGrads(l *layer.Layer) map[string][]float32 {
	g := map[string][]float32{"router weight": l.Replica.Router, "shared fc1": l.Replica.Shared.FC1, "shared fc2": l.Replica.Shared.FC2}
	for r, rk := range l.Ranks {
		g["input"] = append(g["input"], l.Grads[r].Dx...)
		g["probs"] = append(g["probs"], rk.DProbs...)
		for _, w := range rk.ExpertGrads {
			g["expert fc1"], g["expert fc2"] = append(g["expert fc1"], w.FC1...), append(g["expert fc2"], w.FC2...)
		}
	}
	return g
}

// TestTrainingStepDispatchersAgree: a training step of every dispatcher
// passes the gradient check (every gradient against the float64 reference
// and the backward round trip), and its gradients are alltoall's: bit for
// bit for what no dispatcher rounds differently — the experts' weight
// gradients (the same rows in the same order), the probabilities' and so
// the router's, the shared expert's — and for the input gradient where
// no token has two experts on one rank (top-1); deepep's and hybridep's
// input gradients otherwise within the tolerance (their per-rank partial
// sums are rounded to bf16), feplb's moved experts' weight gradients
// within it (the helper's share summed apart) and the rest bit for bit.
func TestTrainingStepDispatchersAgree(t *testing.T) {
	top1 := harnesstest.Small()
	top1.TopK, top1.PreSoftmax, top1.Routing, top1.Tokens = 1, true, setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}, 128 // enough copies for feplb to move some
	skewed := harnesstest.Small()
	skewed.Routing, skewed.Score, skewed.TopKScale = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.5}, kernels.ScoreSigmoid, 2.5
	for name, base := range map[string]setup.Config{"top-1 pre-softmax": top1, "top-4 sigmoid": skewed} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			base.Dispatcher = "alltoall"
			la, _, cc := trained(t, base)
			if !cc.Passed || cc.Grads == nil {
				t.Fatalf("%s alltoall: %+v", name, cc)
			}
			want := layerGrads(la)
			for _, d := range []struct{ dispatcher, policy string }{{"deepep", ""}, {"hybridep", ""}, {"feplb", "feplb"}, {"feplb", "feplb-split"}} {
				c := base
				c.Dispatcher, c.FeplbPolicy, c.SMs, c.Domain = d.dispatcher, harnesstest.OrElse(d.policy, c.FeplbPolicy), 0, 0
				if d.dispatcher == "hybridep" {
					c.Domain = 2 // the inter-domain path too
				}
				at := name + " " + d.dispatcher + " " + d.policy
				l, disp, cc := trained(t, c)
				if !cc.Passed || cc.Grads == nil || cc.Grads.RoundTrip != "exact" || cc.Grads.MaxRelErr == 0 {
					t.Fatalf("%s: correctness %+v, grads %+v", at, cc, cc.Grads)
				}
				moved := false
				if rb := disp.Capabilities().Rebalance; rb != nil {
					moved = rb.Stats().Moves > 0
					if !moved {
						t.Fatalf("%s: the checked step moved no work", at)
					}
				}
				got := layerGrads(l)
				for tensor, w := range want {
					inexact := (tensor == "input" && c.TopK > 1 && !moved) || (moved && strings.HasPrefix(tensor, "expert"))
					switch e := harnesstest.RelDiff(got[tensor], w); {
					case !inexact && !slices.Equal(got[tensor], w):
						t.Errorf("%s: %s gradient differs from alltoall's by %.3g; want it bit for bit", at, tensor, e)
					case !(e <= kernels.GradTolerance):
						t.Errorf("%s: %s gradient differs from alltoall's by %.3g > %g", at, tensor, e, kernels.GradTolerance)
					}
				}
			}
		})
	}
}

func init() {
	dispatchers.Register("broken-bwd", func(impl string, env dispatchers.Env) (dispatchers.Dispatcher, error) {
		d, err := alltoall.New(impl, env)
		if err != nil {
			return nil, err
		}
		return harnesstest.BrokenBackward{A2A: d.(*alltoall.A2A)}, nil
	})
}

// TestGradCheckCatchesBrokenBackward: a dispatcher whose forward is right
// and whose backward misplaces two rows fails the run (no timings): the
// gradients it touches are over the tolerance and the backward round trip
// is not exact. Forward-only, the same dispatcher passes.
func TestGradCheckCatchesBrokenBackward(t *testing.T) {
	c := harnesstest.Small()
	c.Dispatcher = "broken-bwd"
	rec, err := Run(c, setup.Env{Version: "test"})
	if err == nil || rec == nil || rec.Status != results.StatusFailed || rec.Timing != nil {
		t.Fatalf("broken backward: err %v, record %+v; want failed without timings", err, rec)
	}
	cc := rec.Correctness
	if g := cc.Grads; g == nil || cc.MaxRelErr > check.Tolerance || g.RoundTrip == "exact" ||
		!(g.PerTensor["input"] > g.Tolerance) || !(g.PerTensor["expert fc2"] > g.Tolerance) || !strings.Contains(cc.Detail, "gradient error over the tolerance") {
		t.Errorf("correctness %+v, grads %+v: want the forward passing and the gradients and backward round trip failing", cc, cc.Grads)
	}
	c.ForwardOnly = true
	if rec, err := Run(c, setup.Env{Version: "test"}); err != nil || rec.Status != results.StatusOK || rec.Correctness.Grads != nil {
		t.Errorf("forward only: %v, %+v", err, rec)
	}
}

// TestTrainingRecord: a training step's record has the backward's phases
// after the forward's, fwd and bwd sums whose samples add up to the
// step's, the backward GEMMs (twice the forward's FLOPs, their rate and
// straggler), the backward's bytes, what the forward keeps, and more host
// memory than the forward alone; --forward-only has none of them.
func TestTrainingRecord(t *testing.T) {
	c := harnesstest.Small()
	train, err := Run(c, setup.Env{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	c.ForwardOnly = true
	fwd, err := Run(c, setup.Env{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	tt := train.Timing
	var names []string
	for _, p := range tt.Phases {
		names = append(names, p.Name)
	}
	want := "shared,router,permute,dispatch,experts,combine,unpermute,unpermute-bwd,combine-bwd,experts-bwd,dispatch-bwd,permute-bwd,router-bwd,shared-bwd"
	if train.Config.Pass != results.PassTraining || strings.Join(names, ",") != want || tt.Forward == nil || tt.Backward == nil {
		t.Fatalf("training record: pass %q, phases %v, fwd %v, bwd %v", train.Config.Pass, names, tt.Forward, tt.Backward)
	}
	for i, s := range tt.Step.Samples {
		if d := s - tt.Forward.Samples[i] - tt.Backward.Samples[i]; math.Abs(d) > 1e-9*s {
			t.Errorf("iteration %d: step %g ms, fwd %g + bwd %g", i, s, tt.Forward.Samples[i], tt.Backward.Samples[i])
		}
	}
	g := train.GEMM
	if g.BackwardFLOPsPerIter != 2*g.FLOPsPerIter || g.BackwardStraggler == nil || g.BackwardTFLOPS <= 0 {
		t.Errorf("backward GEMMs %+v: want twice the forward's %g FLOPs, a rate and a straggler", g, g.FLOPsPerIter)
	}
	tr, m := train.Traffic, train.Memory
	if tr.CombineBackwardLogical == 0 || tr.DispatchBackwardLogical == 0 || tr.BackwardFormula == "" {
		t.Errorf("backward traffic %+v", tr)
	}
	for r, rows := range train.Tokens.Received {
		want := kernels.SavedBytes(rows, c.Tokens, c.Hidden, c.FFN, c.FFN*c.SharedExperts, c.TopK)
		if m.SavedPerRankBytes[r] != want || m.PerRankBytes[r] <= fwd.Memory.PerRankBytes[r]+want {
			t.Errorf("rank %d: kept %d bytes (want %d), memory %d, forward-only %d", r, m.SavedPerRankBytes[r], want, m.PerRankBytes[r], fwd.Memory.PerRankBytes[r])
		}
	}
	if fwd.Config.Pass != results.PassForward || fwd.Timing.Forward != nil || len(fwd.Timing.Phases) != 7 || fwd.GEMM.BackwardStraggler != nil ||
		fwd.Memory.SavedPerRankBytes != nil || fwd.Traffic.BackwardFormula != "" || fwd.Correctness.Grads != nil {
		t.Errorf("forward-only record has backward parts: %+v", fwd)
	}
}

// TestCUDADeviceTrainingStep: on the cuda device (here Emu) a run times
// forward and backward and checks every gradient against the float64
// reference; deepep's and hybridep's own kernels have their backward too,
// so neither needs a reason to run forward-only (NCCL EP's: its
// high-throughput mode trains through the library's backward, its
// low-latency mode, deepep-ll's, is forward-only with its reason: ncclep_test.go).
func TestCUDADeviceTrainingStep(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	c := harnesstest.Small()
	c.Device = "cuda"
	rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
	if err != nil || rec.Status != results.StatusOK {
		t.Fatalf("%v, %+v", err, rec)
	}
	g := rec.Correctness.Grads
	if rec.Config.Pass != results.PassTraining || rec.Config.PassNote != "" || rec.Timing.Backward == nil || g == nil || len(g.PerTensor) < 5 || !(g.MaxRelErr <= g.Tolerance) {
		t.Errorf("cuda record: pass %q (%s), backward %v, gradients %+v", rec.Config.Pass, rec.Config.PassNote, rec.Timing.Backward, g)
	}
	if m := rec.Memory; len(m.SavedPerRankBytes) != c.EP {
		t.Errorf("memory kept for the backward: %+v", m)
	}
	for _, name := range []string{"deepep", "hybridep"} {
		c.Dispatcher = name
		if why := setup.ForwardOnlyReason(c); why != "" {
			t.Errorf("%s: forward-only on the cuda device: %q", name, why)
		}
	}
	if c.ForwardOnly = true; setup.ForwardOnlyReason(c) != "" {
		t.Error("a run asked to be forward-only needs no reason")
	}
}

// TestDumpGradients: a training step's dump holds the upstream gradient and
// every gradient the layer computed, as computed, each listed in
// index.json.
func TestDumpGradients(t *testing.T) {
	c := harnesstest.Small()
	l, _, _ := trained(t, c)
	dir := filepath.Join(t.TempDir(), "dump")
	if err := Dump(dir, l, &results.Record{Config: c.Record()}); err != nil {
		t.Fatal(err)
	}
	index, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	g := layerGrads(l)
	for file, want := range map[string][]float32{"dout.npy": concat(l.DOut), "grad_x.npy": g["input"], "grad_router_weight.npy": g["router weight"],
		"grad_routing_probs.npy": g["probs"], "grad_fc1.npy": g["expert fc1"], "grad_fc2.npy": g["expert fc2"],
		"grad_shared_fc1.npy": g["shared fc1"], "grad_shared_fc2.npy": g["shared fc2"]} {
		if !strings.Contains(string(index), `"file": "`+file+`"`) {
			t.Errorf("index.json does not list %s", file)
		}
		if got := harnesstest.ReadNpy(t, filepath.Join(dir, file)); len(want) == 0 || !slices.Equal(got, want) {
			t.Errorf("%s: %d values, not the layer's %d", file, len(got), len(want))
		}
	}
}
