package harness

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// newOverlapRun builds c's device layer on Emus and its overlap engine.
func newOverlapRun(t *testing.T, c setup.Config, shared, a2a, delay bool, plant string) *layer.Overlap {
	t.Helper()
	devs, _ := harnesstest.Emus(2)(2, c.EP)
	dl := deviceRun(t, c, devs...)
	var l1 *layer.Layer
	var d1 dispatchers.DeviceDispatcher
	if a2a {
		var err error
		if l1, err = layer.MicroBatch(c, 1); err != nil {
			t.Fatal(err)
		}
		if d1, err = dispatchers.NewDevice(c.Dispatcher, c.Impl, c.DispatcherEnv()); err != nil {
			t.Fatal(err)
		}
	}
	for r := range dl.RankBufs { // the grouped GEMM choice ChooseGrouped makes
		dl.RankBufs[r].Grouped, _ = device.NewGrouped(dl.Ranks[r].Dev, 0)
	}
	ov, err := layer.NewOverlap(dl, shared, a2a, delay, l1, d1)
	if err != nil {
		t.Fatal(err)
	}
	ov.Plant = plant
	return ov
}

// TestOverlapEqualsSequential: every overlap form's step gives the outputs
// and gradients of the same step run phase after phase, bit for bit, and
// Emu's stream-order check passes it (every cross-stream access has its
// event).
func TestOverlapEqualsSequential(t *testing.T) {
	fp8 := harnesstest.OverlapCase()
	fp8.Dispatcher, fp8.Hidden, fp8.Precision = "alltoall", 128, setup.PrecisionFP8
	fe := harnesstest.FEPLBCase()
	fe.SharedExperts = 1
	for _, tc := range []struct {
		name               string
		shared, a2a, delay bool
		c                  setup.Config
	}{{"shared", true, false, false, harnesstest.OverlapCase()}, {"a2a", false, true, false, harnesstest.OverlapCase()}, {"a2a-delay-wgrad", false, true, true, harnesstest.OverlapCase()},
		{"delay-wgrad", false, false, true, harnesstest.OverlapCase()}, {"shared-delay-wgrad", true, false, true, harnesstest.OverlapCase()},
		{"fp8-a2a-delay-wgrad", false, true, true, fp8}, {"feplb-a2a-delay-wgrad", false, true, true, fe}, {"feplb-shared", true, false, false, fe}} {
		t.Run(tc.name, func(t *testing.T) {
			ov := newOverlapRun(t, tc.c, tc.shared, tc.a2a, tc.delay, "")
			for rep := range 2 { // the second reuses every buffer
				stepBothWays(t, ov, rep, "")
				if _, err := ov.Times(true); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestOverlapPlantedMissingEventFails: leaving out one event of each form
// on purpose makes Emu's stream-order check fail the overlapped step.
func TestOverlapPlantedMissingEventFails(t *testing.T) {
	for _, tc := range []struct {
		plant              string
		shared, a2a, delay bool
	}{{"shared", true, false, false}, {"wgrad", false, false, true}, {"a2a", false, true, false}} {
		t.Run(tc.plant, func(t *testing.T) {
			ov := newOverlapRun(t, harnesstest.OverlapCase(), tc.shared, tc.a2a, tc.delay, tc.plant)
			err := ov.Step(true)
			if err == nil || !strings.Contains(err.Error(), "stream order") {
				t.Fatalf("a step missing its %s event: %v, want Emu's stream-order failure", tc.plant, err)
			}
			t.Log(err)
		})
	}
}

// TestOverlapMergedOrder: the a2a step pairs each micro-batch's
// communication with the other's compute, as the combined 1F1B schedule:
// B0's combine backward, then F1's router, B0's expert backward beside
// F1's dispatch, B0's dispatch backward beside F1's experts, B0's router
// backward, and F1's combine last.
func TestOverlapMergedOrder(t *testing.T) {
	ov := newOverlapRun(t, harnesstest.OverlapCase(), false, true, false, "")
	if err := ov.Step(true); err != nil {
		t.Fatal(err)
	}
	order := ov.Order()
	got := strings.Join(order, " ")
	t.Log(got)
	at := 0
	for _, want := range []string{"0:combine-bwd", "1:router", "0:experts-bwd", "1:dispatch", "0:dispatch-bwd", "1:experts", "0:router-bwd", "1:combine"} {
		i := slices.Index(order[at:], want)
		if i < 0 {
			t.Fatalf("order %q: no %s after position %d", got, want, at)
		}
		at += i + 1
	}
}

// TestOverlapRunRecord: the run, deepep with 24 SMs, a2a and the
// delayed wgrad, on the simulated cuda device records the overlapped step
// beside the sequential one, their equality and the exposed communication;
// on the host device the record says overlap only changes the order. Every
// dispatcher takes part or says why it cannot.
func TestOverlapRunRecord(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	for _, dev := range []string{"cuda", "host"} {
		c := harnesstest.Small()
		c.Device, c.Dispatcher, c.SMs, c.Overlap, c.DelayWgrad = dev, "deepep", 24, []string{setup.OverlapA2A}, true
		c.EP = 2
		rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
		if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
			t.Fatalf("%s: %v, %+v", dev, err, rec)
		}
		o := rec.Overlap
		if o == nil || o.Forms != "a2a" || !o.DelayWgrad || o.MicroBatches != 2 || rec.Config.Overlap != "a2a" || !rec.Config.DelayWgrad {
			t.Fatalf("%s: overlap record %+v", dev, o)
		}
		t.Logf("%s: %+v", dev, *o)
		if dev == "host" {
			if o.Step != nil || !strings.Contains(o.Note, "only their order") || !strings.Contains(o.Note, "micro-batch 1's training step") || o.Equal {
				t.Errorf("host: %+v", o)
			}
			continue
		}
		if !o.Equal || o.Step == nil || o.Sequential == nil || o.Exposed == nil || o.Comm == nil || o.GEMMSMs != 132-2*24 || o.GEMMSMsNote == "" || o.Ratio <= 0 {
			t.Errorf("cuda: %+v", o)
		}
		if o.Exposed.P50 > o.Comm.P50+1e-9 {
			t.Errorf("exposed %g above the communication %g", o.Exposed.P50, o.Comm.P50)
		}
	}
}

func TestOverlapEveryDispatcher(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	for _, name := range []string{"alltoall", "deepep", "hybridep", "feplb"} {
		c := harnesstest.Small()
		c.Device, c.Dispatcher, c.Overlap, c.DelayWgrad, c.EP, c.Iters, c.Warmup = "cuda", name, []string{setup.OverlapA2A}, true, 2, 1, 0
		rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
		if err != nil || rec.Status != results.StatusOK || rec.Overlap == nil {
			t.Errorf("%s: %v, %+v", name, err, rec)
			continue
		}
		if o := rec.Overlap; !o.Equal && !strings.Contains(o.Note, "cannot overlap") {
			t.Errorf("%s: neither equal nor a reason: %+v", name, o)
		}
		t.Logf("%s: equal %v, %s", name, rec.Overlap.Equal, rec.Overlap.Note)
	}
}

// TestAttentionStandIn: --attention-ms adds the attention phases, leaves
// the output and gradients as they are (the check passes, overlap's
// equality holds), and is recorded; the host device refuses it.
func TestAttentionStandIn(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	c := harnesstest.Small()
	c.Device, c.Dispatcher, c.EP, c.Iters, c.Warmup = "cuda", "deepep", 2, 1, 0
	c.Overlap, c.AttentionMS = []string{setup.OverlapA2A}, 0.5
	rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
	if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
		t.Fatalf("%v, %+v", err, rec)
	}
	var names []string
	for _, p := range rec.Timing.Phases {
		names = append(names, p.Name)
	}
	if names[0] != "attention" || names[len(names)-1] != "attention-bwd" {
		t.Errorf("phases %v: want attention first and attention-bwd last", names)
	}
	if !strings.Contains(rec.GEMM.Method, "attention stand-in (--attention-ms 0.5)") || rec.Config.AttentionMS != 0.5 || !rec.Overlap.Equal {
		t.Errorf("gemm %q, config %v, overlap %+v", rec.GEMM.Method, rec.Config.AttentionMS, rec.Overlap)
	}
	for _, bad := range []struct {
		ms  float64
		dev string
	}{{-1, "cuda"}, {setup.MaxAttentionMS + 1, "cuda"}, {1, "host"}} {
		c := harnesstest.Small()
		c.AttentionMS, c.Device = bad.ms, bad.dev
		var ce *setup.ConfigError
		if err := c.Validate(); !errors.As(err, &ce) || ce.Flag != "attention-ms" {
			t.Errorf("--attention-ms %g on %s: %v", bad.ms, bad.dev, err)
		}
	}
}

// TestOverlapF1AfterF0: in the overlapped step micro-batch 1's forward
// starts after micro-batch 0's, as in 1F1B: each rank's stream of
// micro-batch 1 waits, between F0's end and F1's start, for an event
// recorded on its stream of micro-batch 0 after F0.
func TestOverlapF1AfterF0(t *testing.T) {
	c := harnesstest.OverlapCase()
	c.EP = 2
	var mu sync.Mutex
	var log []string
	dev := harnesstest.SyncLog{Emu: &device.Emu{}, Mu: &mu, Log: &log}
	dl := deviceRun(t, c, dev)
	l1, err := layer.MicroBatch(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	d1, err := dispatchers.NewDevice(c.Dispatcher, c.Impl, c.DispatcherEnv())
	if err != nil {
		t.Fatal(err)
	}
	ov, err := layer.NewOverlap(dl, false, true, false, l1, d1)
	if err != nil {
		t.Fatal(err)
	}
	mark := func(i, at int, what string) {
		run := ov.Over[i][at].Run
		ov.Over[i][at].Run = func(r int) error { dev.Add(what); return run(r) }
	}
	f0 := ov.Mb[0].Forward
	run := ov.Over[0][f0-1].Run
	ov.Over[0][f0-1].Run = func(r int) error { err := run(r); dev.Add("F0 end"); return err }
	mark(1, 0, "F1 start")
	if err := ov.Step(true); err != nil {
		t.Fatal(err)
	}
	s0, s1 := fmt.Sprintf("%p", ov.Mb[0].Ranks[0].Stream), fmt.Sprintf("%p", ov.Mb[1].Ranks[0].Stream)
	from, to := slices.Index(log, "F0 end"), slices.Index(log, "F1 start")
	if from < 0 || to < from {
		t.Fatalf("markers at %d, %d", from, to)
	}
	recorded := map[string]bool{}
	for _, l := range log[from:to] {
		f := strings.Fields(l)
		if f[0] == "record" && f[2] == s0 {
			recorded[f[1]] = true
		}
		if f[0] == "wait" && f[1] == s1 && recorded[f[2]] {
			return
		}
	}
	t.Fatalf("micro-batch 1's stream waits for no event of micro-batch 0's recorded after F0 before F1 starts: %v", log[from:to])
}

// TestOverlapMemoryCountsSecondMicroBatch: with a2a the step holds two
// micro-batches' buffers, and the record's device bytes count both: at
// least micro-batch 1's input, output and their gradients (bf16, T×h each)
// more than the same run without overlap.
func TestOverlapMemoryCountsSecondMicroBatch(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	c := harnesstest.Small()
	c.Device, c.Dispatcher, c.SMs, c.EP, c.Iters, c.Warmup = "cuda", "deepep", 4, 2, 1, 0
	base, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
	if err != nil || base.Status != results.StatusOK {
		t.Fatalf("%v, %+v", err, base)
	}
	c.Overlap, c.DelayWgrad = []string{setup.OverlapA2A}, true
	rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
	if err != nil || rec.Status != results.StatusOK || rec.Overlap == nil || !rec.Overlap.Equal {
		t.Fatalf("%v, %+v", err, rec)
	}
	mb1 := int64(4 * 2 * c.Tokens * c.Hidden)
	for r, b := range rec.Memory.PerRankBytes {
		if d := b - base.Memory.PerRankBytes[r]; d < mb1 {
			t.Errorf("rank %d: %d bytes with a2a, %d without: %d more, want at least micro-batch 1's %d", r, b, base.Memory.PerRankBytes[r], d, mb1)
		}
	}
	if !strings.Contains(rec.Memory.Method, "second micro-batch") {
		t.Errorf("method %q says nothing of the second micro-batch", rec.Memory.Method)
	}
}

// TestHostOverlapMemoryCountsSecondMicroBatch: on the host device a2a runs
// a second layer; the record's bytes and the memory estimate count it.
func TestHostOverlapMemoryCountsSecondMicroBatch(t *testing.T) {
	c := harnesstest.Small()
	c.Dispatcher, c.EP, c.Iters, c.Warmup = "deepep", 2, 1, 0
	base, err := Run(c, setup.Env{Version: "test"})
	if err != nil || base.Status != results.StatusOK {
		t.Fatalf("%v, %+v", err, base)
	}

	c.Overlap = []string{setup.OverlapA2A}
	rec, err := Run(c, setup.Env{Version: "test"})
	if err != nil || rec.Status != results.StatusOK || rec.Overlap == nil {
		t.Fatalf("%v, %+v", err, rec)
	}
	mb1 := int64(4 * 2 * c.Tokens * c.Hidden) // its input, output and their gradients, float32
	for r, b := range rec.Memory.PerRankBytes {
		if d := b - base.Memory.PerRankBytes[r]; d < mb1 {
			t.Errorf("rank %d: %d bytes with a2a, %d without: %d more, want at least %d", r, b, base.Memory.PerRankBytes[r], d, mb1)
		}
	}
	if !strings.Contains(rec.Memory.Method, "second micro-batch") {
		t.Errorf("method %q", rec.Memory.Method)
	}
	for _, dev := range []string{"host", "cuda"} {
		c.Device = dev
		c.Overlap = nil
		n := setup.HostBytes(c)
		c.Overlap = []string{setup.OverlapA2A}
		if a := setup.HostBytes(c); a-n < int64(c.EP)*mb1 {
			t.Errorf("%s: estimate %d with a2a, %d without: want at least %d more", dev, a, n, int64(c.EP)*mb1)
		}
	}

}

// TestOverlapRefusesDump: with --overlap a2a the weight gradients are the
// sum of two micro-batches while a dump holds micro-batch 0's inputs only,
// so the backward could not be recomputed from it: --dump is refused,
// naming the flag.
func TestOverlapRefusesDump(t *testing.T) {
	for _, dev := range []string{"host", "cuda"} {
		c := harnesstest.Small()
		c.Device, c.Overlap, c.EP = dev, []string{setup.OverlapA2A}, 2
		rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1), Dump: filepath.Join(t.TempDir(), "dump")})
		var ce *setup.ConfigError
		if !errors.As(err, &ce) || ce.Flag != "dump" || !strings.Contains(err.Error(), "a2a") || rec != nil {
			t.Errorf("%s: %v, %+v; want a --dump usage error", dev, err, rec)
		}
	}
}

// TestOverlapMicroBatchOwnRouting: with a2a, micro-batch 1 routes tokens of
// its own, as the routing mode draws them, not micro-batch 0's again. A
// random routing: each micro-batch's override is its own draw for the step
// (fillLogits of that step and micro-batch), so the two differ on every
// rank and micro-batch 1's changes from step to step. A trace: step s's
// micro-batch m routes rank r's token t by line (((2s+m)·EP + r)·tokens + t)
// mod L of the trace's L lines (3·EP·tokens + 1 here, so that step 3 wraps).
func TestOverlapMicroBatchOwnRouting(t *testing.T) {
	base := harnesstest.OverlapCase()
	g := rand.New(rand.NewPCG(1, 2))
	var tr strings.Builder
	var lines [][]int32
	for range 3*base.EP*base.Tokens + 1 {
		var line []int32
		for j, e := range g.Perm(base.Experts)[:base.TopK] {
			if j > 0 {
				tr.WriteString(" ")
			}
			fmt.Fprint(&tr, e)
			line = append(line, int32(e))
		}
		tr.WriteString("\n")
		lines = append(lines, line)
	}
	for _, rt := range []setup.Routing{{Kind: setup.RoutingUniform}, {Kind: setup.RoutingBalanced}, {Kind: setup.RoutingSkewed, Alpha: 1.2}, {Kind: setup.RoutingTrace, File: harnesstest.WriteTrace(t, tr.String())}} {
		t.Run(rt.Kind, func(t *testing.T) {
			c := base
			c.Routing = rt
			ov := newOverlapRun(t, c, false, true, false, "")
			var prev [][]float32 // micro-batch 1's overrides at the step before
			for _, step := range []int{0, 3} {
				var got [2][][]float32 // per micro-batch, per rank: the override
				for i, dl := range ov.Mb {
					if err := dl.SetRouting(step); err != nil {
						t.Fatal(err)
					}
					for r, rk := range dl.Ranks {
						if rt.Kind == setup.RoutingTrace {
							for tok := range c.Tokens {
								at := (((2*step+i)*c.EP+r)*c.Tokens + tok) % len(lines)
								if g := dl.Layer.Ranks[r].Idx[tok*c.TopK : (tok+1)*c.TopK]; !slices.Equal(g, lines[at]) {
									t.Fatalf("step %d, micro-batch %d, rank %d, token %d: experts %v, want trace line %d's %v", step, i, r, tok, g, at, lines[at])
								}
							}
							continue
						}
						v := make([]float32, c.Tokens*c.Experts)
						if err := rk.Dev.Download(v, dl.RankBufs[r].Override, rk.Stream); err != nil {
							t.Fatal(err)
						}
						want := make([]float32, len(v))
						c.Routing.FillLogits(want, c.Seed, r, c.Experts, step, i)
						if !slices.Equal(v, want) {
							t.Errorf("step %d, micro-batch %d, rank %d: the override is not the step's own draw for the micro-batch", step, i, r)
						}
						got[i] = append(got[i], v)
					}
				}
				for r := range got[0] {
					if slices.Equal(got[0][r], got[1][r]) {
						t.Errorf("step %d, rank %d: micro-batch 1's routing is micro-batch 0's", step, r)
					}
					if prev != nil && slices.Equal(prev[r], got[1][r]) {
						t.Errorf("step %d, rank %d: micro-batch 1's routing is the step before's", step, r)
					}
				}
				prev = got[1]
			}
		})
	}
}

// TestOverlapCUDAGraphRefusals: --cuda-graph with --overlap is valid
// configuration; a run it cannot capture is unavailable with the reason,
// as without --overlap: a design that does not issue its steps as graphs
// (deepep, and feplb, whose rebalance waits on the host inside the step),
// a device that captures nothing (Emu).
func TestOverlapCUDAGraphRefusals(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	for _, tc := range []struct{ dispatcher, want string }{
		{"deepep", "deepep does not issue its steps as graphs"}, {"feplb", "feplb does not issue its steps as graphs"},
		{"alltoall", "the emu device captures no graphs"}} {
		c := harnesstest.Small()
		c.Device, c.Dispatcher, c.Overlap, c.DelayWgrad, c.CUDAGraph, c.EP = "cuda", tc.dispatcher, []string{setup.OverlapA2A}, true, true, 2
		if err := c.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.dispatcher, err)
		}
		rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
		if rec == nil || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason+fmt.Sprint(err), tc.want) {
			t.Errorf("%s: %v, %+v; want unavailable: %q", tc.dispatcher, err, rec, tc.want)
		}
	}
}

// stepBothWays runs ov's step sequentially, then overlapped, and fails
// unless both leave the same outputs and gradients; why says what the
// overlapped step runs under.
func stepBothWays(t *testing.T, ov *layer.Overlap, rep int, why string) {
	t.Helper()
	if err := ov.Step(false); err != nil {
		t.Fatal(err)
	}
	want, err := ov.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := ov.Step(true); err != nil {
		t.Fatalf("step %d, overlapped%s: %v", rep, why, err)
	}
	got, err := ov.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if d := want.Diff(got); d != "" {
		t.Fatalf("step %d: overlapped differs from sequential: %s", rep, d)
	}
}
