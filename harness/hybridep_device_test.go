package harness

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/dispatchers/hybridep"
	"github.com/moebench/moebench/harness/check"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/comm"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// equalsHostHybridEP runs c's device layer on devs (two checked training
// steps: the forward and hybridep.cu's backward, every gradient checked
// against the float64 reference) and the host layer with hybridep's host
// implementation, and wants the same output bit for bit, the same rows per
// rank and the same traffic, the backward's bytes included.
func equalsHostHybridEP(t *testing.T, c setup.Config, devs ...device.Device) {
	t.Helper()
	dl := deviceRun(t, c, devs...)
	defer dl.Dispatcher.Close()
	if !dl.Train {
		t.Fatal("hybridep's device layer runs no backward")
	}
	for range 2 { // the second step reuses every buffer
		cr, err := check.CheckDevice(dl)
		if err != nil || !cr.Passed {
			t.Fatalf("check: %v, %+v", err, cr)
		}
		if g := cr.Grads; g == nil || len(g.PerTensor) < 4 || g.MaxRelErr > g.Tolerance {
			t.Fatalf("the gradients' check: %+v", g)
		}
	}
	hc := c
	hc.ForwardOnly = !dl.Train // the host's traffic counts the backward's bytes when the device's does
	hl, d := hostStep(t, hc, "hybridep")
	for r := range hl.Ranks {
		if !reflect.DeepEqual(hl.Ranks[r].Y, dl.Layer.Ranks[r].Y) {
			t.Fatalf("rank %d: the device's output differs from the host implementation's", r)
		}
		host := 0
		for _, sg := range hl.Ranks[r].Segments {
			host += sg.Len
		}
		if rows := dl.Ranks[r].Rows(); rows != host {
			t.Errorf("rank %d computes %d rows on the device, %d on the host", r, rows, host)
		}
	}
	got, want := dl.Dispatcher.Traffic(), d.Traffic()
	got.Formula, _, _ = strings.Cut(got.Formula, "; inter-domain path moved by ")
	if got != want {
		t.Errorf("traffic %+v, host %+v", got, want)
	}
}

// TestHybridEPDeviceOnEmu: hybridep's cuda implementation on Emu (its
// kernels' Go twins, Emu's stream-order check) gives the host
// implementation's output bit for bit, at EP 2, 4 and 8 in one domain and
// across domains, with balanced, skewed and trace routing; and a whole run
// passes the float64 check with the design's phases.
func TestHybridEPDeviceOnEmu(t *testing.T) {
	for _, lay := range harnesstest.HybridEPLayouts {
		for _, kind := range []string{"balanced", "skewed", "trace"} {
			t.Run(fmt.Sprintf("ep%d-domain%d-%s", lay.Ep, lay.Domain, kind), func(t *testing.T) {
				c := harnesstest.HybridEPConfig(t, lay.Ep, lay.Domain, kind)
				devs, _ := harnesstest.Emus(lay.Devs)(lay.Devs, c.EP)
				equalsHostHybridEP(t, c, devs...)
			})
		}
	}
	c := harnesstest.HybridEPConfig(t, 4, 2, "balanced")
	c.PermuteSMs = 3
	rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(4)})
	if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
		t.Fatalf("%v; %+v", err, rec)
	}
	// the preprocessing's and the permute's own budgets as they ran: the
	// default (HybridEP's 108, below an Emu's 132 SMs for its one rank) and
	// --permute-sms's, which the config records as given
	if rec.SMs.Preprocess != 108 || rec.SMs.Permute != 3 || rec.Config.PermuteSMs != 3 || rec.Config.PreprocessSMs != 0 {
		t.Errorf("budgets %+v, config's %d and %d: want preprocess 108 (the default), permute 3 as given", rec.SMs, rec.Config.PreprocessSMs, rec.Config.PermuteSMs)
	}
	var phases []string
	for _, p := range rec.Timing.Phases {
		phases = append(phases, p.Name)
	}
	if want := []string{"shared", "router", "allgather", "preprocess", "dispatch", "experts", "combine",
		"combine-bwd", "experts-bwd", "dispatch-bwd", "router-bwd", "shared-bwd"}; !reflect.DeepEqual(phases, want) {
		t.Errorf("phases %v, want %v", phases, want)
	}
	// a training step: hybridep.cu's backward, every gradient checked
	if g := rec.Correctness.Grads; rec.Config.Pass != results.PassTraining || g == nil || len(g.PerTensor) < 4 ||
		rec.Traffic.DispatchBackwardLogical == 0 || rec.Traffic.CombineBackwardOffRank == 0 {
		t.Errorf("pass %q, gradients %+v, traffic %+v", rec.Config.Pass, g, rec.Traffic)
	}
	// the worst-case receive buffers, as allocated: tokens per rank × ranks
	// rows of 2·hidden bytes
	bufs := map[string]int64{}
	for _, b := range rec.Memory.Buffers {
		bufs[b.Name] = b.PerRankBytes[0]
	}
	if want := int64(c.Tokens * c.EP * 2 * c.Hidden); bufs["receive"] != want || bufs["inter-domain"] == 0 || bufs["permute"] == 0 {
		t.Errorf("buffers %v: want receive %d B, an inter-domain buffer and the permuted rows", bufs, want)
	}
}

// TestHybridEPOnHostSim: hybridep's CUDA kernels (compiled for the CPU)
// on the fake driver's two GPUs give the host implementation's output bit
// for bit: one domain with ranks on both GPUs and packed two to a GPU, two
// domains of one rank (the inter-domain path through the fake NCCL); a
// whole run (a training step: the forward and hybridep.cu's backward)
// passes the check, the gradients' included; broken protocols, forward
// and backward, end by the kernels' timeouts, naming the rank, phase and
// wait.
func TestHybridEPOnHostSim(t *testing.T) {
	harnesstest.UseHostSimLayer(t)
	gs, err := device.OpenGPUs(2, 2, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, g := range gs {
			g.Close()
		}
	}()
	two := []device.Device{gs[0], gs[1]}
	for _, lay := range []struct{ ep, domain int }{{2, 0}, {4, 0}, {2, 1}} {
		t.Run(fmt.Sprintf("ep%d-domain%d", lay.ep, lay.domain), func(t *testing.T) {
			if lay.ep != 2 || lay.domain != 0 {
				hostsim.SkipIfShort(t, "ep2-domain0")
			}
			c := harnesstest.HybridEPConfig(t, lay.ep, lay.domain, "skewed")
			c.SMs = 1
			equalsHostHybridEP(t, c, two...)
		})
	}
	for _, bug := range []struct {
		name       string
		kind, rank int
		want       []string // any of them: whichever wait gives up first
	}{
		// the storer's wait for the slot, the loader's for its reuse, or
		// (the GPUs' launches issued at once) rank 0's for rank 1 at the
		// barrier after
		{"no-arrive", hybridep.BugNoArrive, 1, []string{"rank 1 timed out in phase dispatch at wait FIFO slot", "rank 0 timed out in phase dispatch at wait barrier flag of rank 1"}},
		{"barrier-not-reached", hybridep.BugNoBarrier, 1, []string{"rank 0 timed out in phase dispatch at wait barrier flag of rank 1"}},
		// the backward: the forward and combine-bwd run, then rank 1's
		// combine kernel ends before the barrier rank 0 waits at
		{"backward-barrier-not-reached", hybridep.BugBwdNoBarrier, 1, []string{"rank 0 timed out in phase dispatch-bwd (the combine kernel) at wait barrier flag of rank 1"}},
	} {
		t.Run(bug.name, func(t *testing.T) {
			if bug.name != "barrier-not-reached" {
				hostsim.SkipIfShort(t, "barrier-not-reached")
			}
			c := harnesstest.HybridEPConfig(t, 2, 0, "balanced")
			c.SMs, c.CommTimeout = 1, 200*time.Millisecond
			dl := deviceRun(t, c, two...)
			defer dl.Dispatcher.Close()
			dl.Dispatcher.(*hybridep.Device).Break(bug.kind, bug.rank)
			start := time.Now()
			err := dl.Step()
			var ce *comm.CommError
			if !errors.As(err, &ce) || !slices.ContainsFunc(bug.want, func(w string) bool { return strings.Contains(err.Error(), w) }) {
				t.Fatalf("%v: want the kernels' timeout, one of %q", err, bug.want)
			}
			t.Logf("%v (%.2f s)", err, time.Since(start).Seconds())
		})
	}
	c := harnesstest.HybridEPConfig(t, 2, 0, "balanced")
	c.SMs = 1
	rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.TheseDevices(two)})
	if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
		t.Fatalf("%v; %+v", err, rec)
	}
	if g := rec.Correctness.Grads; rec.Config.Pass != results.PassTraining || g == nil || len(g.PerTensor) < 4 || rec.Traffic.DispatchBackwardLogical == 0 {
		t.Fatalf("pass %q, gradients %+v, traffic %+v", rec.Config.Pass, g, rec.Traffic)
	}
}

// TestGPUHybridEP: hybridep's kernels on a GPU give the host
// implementation's output bit for bit (ranks packed on GPU 0; the
// bulk-copy path where the GPU is sm_90 and its NVRTC ≥ 12).
func TestGPUHybridEP(t *testing.T) {
	g := harnesstest.OpenGPU(t)
	for _, ep := range []int{2, 8} {
		t.Run(fmt.Sprintf("ep%d", ep), func(t *testing.T) {
			c := harnesstest.HybridEPConfig(t, ep, 0, "skewed")
			c.SMs = 4
			equalsHostHybridEP(t, c, g)
		})
	}
}
