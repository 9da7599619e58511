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
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// overlapCase is a small training layer on the deepep design with a shared
// expert, its ranks on two Emus.
func overlapCase() Config {
	c := small()
	c.Device, c.Dispatcher, c.SMs = "cuda", "deepep", 4
	c.SharedExperts = 1
	return c
}

// newOverlapRun builds c's device layer on Emus and its overlap engine.
func newOverlapRun(t *testing.T, c Config, shared, a2a, delay bool, plant string) *overlap {
	t.Helper()
	devs, _ := emus(2)(2, c.EP)
	dl := deviceRun(t, c, devs...)
	var l1 *Layer
	var d1 dispatchers.DeviceDispatcher
	if a2a {
		var err error
		if l1, err = microBatch(c, 1); err != nil {
			t.Fatal(err)
		}
		if d1, err = dispatchers.NewDevice(c.Dispatcher, c.Impl, c.dispatcherEnv()); err != nil {
			t.Fatal(err)
		}
	}
	for r := range dl.rr { // the grouped GEMM choice chooseGrouped makes
		dl.rr[r].grouped, _ = device.NewGrouped(dl.ranks[r].Dev, 0)
	}
	ov, err := newOverlap(dl, shared, a2a, delay, l1, d1)
	if err != nil {
		t.Fatal(err)
	}
	ov.plant = plant
	return ov
}

// TestOverlapEqualsSequential: every overlap form's step gives the outputs
// and gradients of the same step run phase after phase, bit for bit, and
// Emu's stream-order check passes it (every cross-stream access has its
// event).
func TestOverlapEqualsSequential(t *testing.T) {
	fp8 := overlapCase()
	fp8.Dispatcher, fp8.Hidden, fp8.Precision = "alltoall", 128, PrecisionFP8
	fe := feplbCase()
	fe.SharedExperts = 1
	for _, tc := range []struct {
		name               string
		shared, a2a, delay bool
		c                  Config
	}{{"shared", true, false, false, overlapCase()}, {"a2a", false, true, false, overlapCase()}, {"a2a-delay-wgrad", false, true, true, overlapCase()},
		{"delay-wgrad", false, false, true, overlapCase()}, {"shared-delay-wgrad", true, false, true, overlapCase()},
		{"fp8-a2a-delay-wgrad", false, true, true, fp8}, {"feplb-a2a-delay-wgrad", false, true, true, fe}, {"feplb-shared", true, false, false, fe}} {
		t.Run(tc.name, func(t *testing.T) {
			ov := newOverlapRun(t, tc.c, tc.shared, tc.a2a, tc.delay, "")
			for rep := range 2 { // the second reuses every buffer
				if err := ov.step(false); err != nil {
					t.Fatal(err)
				}
				want, err := ov.snapshot()
				if err != nil {
					t.Fatal(err)
				}
				if err := ov.step(true); err != nil {
					t.Fatalf("step %d, overlapped: %v", rep, err)
				}
				got, err := ov.snapshot()
				if err != nil {
					t.Fatal(err)
				}
				if d := want.diff(got); d != "" {
					t.Fatalf("step %d: overlapped differs from sequential: %s", rep, d)
				}
				if _, err := ov.times(true); err != nil {
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
			ov := newOverlapRun(t, overlapCase(), tc.shared, tc.a2a, tc.delay, tc.plant)
			err := ov.step(true)
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
	ov := newOverlapRun(t, overlapCase(), false, true, false, "")
	if err := ov.step(true); err != nil {
		t.Fatal(err)
	}
	order := ov.order()
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

func TestExposedOf(t *testing.T) {
	comm := [][2]float64{{0, 2}, {5, 9}}
	comp := [][2]float64{{1, 6}, {8, 12}}
	if got := exposedOf(comm, comp); got != 1+2 {
		t.Fatalf("exposed %v, want 3", got)
	}
}

func TestOverlapValidate(t *testing.T) {
	for _, tc := range []struct {
		overlap string
		delay   bool
		mut     func(*Config)
		flag    string
		want    string
	}{
		{"shared,a2a", false, nil, "overlap", "moe_shared_expert_overlap"},
		{"bogus", false, nil, "overlap", "allowed: a comma-separated list of shared, a2a"},
		{"a2a,a2a", false, nil, "overlap", "twice"},
		{"a2a", false, func(c *Config) { c.ForwardOnly = true }, "overlap", "forward-only"},
		{"", true, func(c *Config) { c.ForwardOnly = true }, "delay-wgrad", "forward-only"},
		{"shared", false, func(c *Config) { c.SharedExperts = 0 }, "overlap", "shared-experts 0"},
	} {
		c := small()
		c.Overlap, c.DelayWgrad = ParseOverlap(tc.overlap), tc.delay
		if tc.mut != nil {
			tc.mut(&c)
		}
		err := c.Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Flag != tc.flag || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--overlap %q --delay-wgrad=%v: %v, want --%s naming %q", tc.overlap, tc.delay, err, tc.flag, tc.want)
		}
	}
	c := small()
	c.Overlap, c.DelayWgrad = ParseOverlap("a2a"), true
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if r := c.Record(); r.Overlap != "a2a" || !r.DelayWgrad || !strings.Contains(r.Settings(), "overlap=a2a delay-wgrad") {
		t.Errorf("record %q %v, settings %q", r.Overlap, r.DelayWgrad, r.Settings())
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
		c := small()
		c.Device, c.Dispatcher, c.SMs, c.Overlap, c.DelayWgrad = dev, "deepep", 24, []string{OverlapA2A}, true
		c.EP = 2
		rec, err := Run(c, Env{Version: "test", OpenDevices: emus(1)})
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
		c := small()
		c.Device, c.Dispatcher, c.Overlap, c.DelayWgrad, c.EP, c.Iters, c.Warmup = "cuda", name, []string{OverlapA2A}, true, 2, 1, 0
		rec, err := Run(c, Env{Version: "test", OpenDevices: emus(1)})
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
	c := small()
	c.Device, c.Dispatcher, c.EP, c.Iters, c.Warmup = "cuda", "deepep", 2, 1, 0
	c.Overlap, c.AttentionMS = []string{OverlapA2A}, 0.5
	rec, err := Run(c, Env{Version: "test", OpenDevices: emus(1)})
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
	}{{-1, "cuda"}, {MaxAttentionMS + 1, "cuda"}, {1, "host"}} {
		c := small()
		c.AttentionMS, c.Device = bad.ms, bad.dev
		var ce *ConfigError
		if err := c.Validate(); !errors.As(err, &ce) || ce.Flag != "attention-ms" {
			t.Errorf("--attention-ms %g on %s: %v", bad.ms, bad.dev, err)
		}
	}
}

// syncLog is an Emu that logs its Record and Wait calls, in order.
type syncLog struct {
	*device.Emu
	mu  *sync.Mutex
	log *[]string
}

func (d syncLog) add(s string) {
	d.mu.Lock()
	*d.log = append(*d.log, s)
	d.mu.Unlock()
}

func (d syncLog) Record(e device.Event, s device.Stream) error {
	d.add(fmt.Sprintf("record %p %p", e, s))
	return d.Emu.Record(e, s)
}

func (d syncLog) Wait(s device.Stream, e device.Event) error {
	d.add(fmt.Sprintf("wait %p %p", s, e))
	return d.Emu.Wait(s, e)
}

// TestOverlapF1AfterF0: in the overlapped step micro-batch 1's forward
// starts after micro-batch 0's, as in 1F1B: each rank's stream of
// micro-batch 1 waits, between F0's end and F1's start, for an event
// recorded on its stream of micro-batch 0 after F0.
func TestOverlapF1AfterF0(t *testing.T) {
	c := overlapCase()
	c.EP = 2
	var mu sync.Mutex
	var log []string
	dev := syncLog{&device.Emu{}, &mu, &log}
	dl := deviceRun(t, c, dev)
	l1, err := microBatch(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	d1, err := dispatchers.NewDevice(c.Dispatcher, c.Impl, c.dispatcherEnv())
	if err != nil {
		t.Fatal(err)
	}
	ov, err := newOverlap(dl, false, true, false, l1, d1)
	if err != nil {
		t.Fatal(err)
	}
	mark := func(i, at int, what string) {
		run := ov.over[i][at].Run
		ov.over[i][at].Run = func(r int) error { dev.add(what); return run(r) }
	}
	f0 := ov.mb[0].forward
	run := ov.over[0][f0-1].Run
	ov.over[0][f0-1].Run = func(r int) error { err := run(r); dev.add("F0 end"); return err }
	mark(1, 0, "F1 start")
	if err := ov.step(true); err != nil {
		t.Fatal(err)
	}
	s0, s1 := fmt.Sprintf("%p", ov.mb[0].ranks[0].Stream), fmt.Sprintf("%p", ov.mb[1].ranks[0].Stream)
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
	c := small()
	c.Device, c.Dispatcher, c.SMs, c.EP, c.Iters, c.Warmup = "cuda", "deepep", 4, 2, 1, 0
	base, err := Run(c, Env{Version: "test", OpenDevices: emus(1)})
	if err != nil || base.Status != results.StatusOK {
		t.Fatalf("%v, %+v", err, base)
	}
	c.Overlap, c.DelayWgrad = []string{OverlapA2A}, true
	rec, err := Run(c, Env{Version: "test", OpenDevices: emus(1)})
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
	c := small()
	c.Dispatcher, c.EP, c.Iters, c.Warmup = "deepep", 2, 1, 0
	base, err := Run(c, Env{Version: "test"})
	if err != nil || base.Status != results.StatusOK {
		t.Fatalf("%v, %+v", err, base)
	}

	c.Overlap = []string{OverlapA2A}
	rec, err := Run(c, Env{Version: "test"})
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
		n := HostBytes(c)
		c.Overlap = []string{OverlapA2A}
		if a := HostBytes(c); a-n < int64(c.EP)*mb1 {
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
		c := small()
		c.Device, c.Overlap, c.EP = dev, []string{OverlapA2A}, 2
		rec, err := Run(c, Env{Version: "test", OpenDevices: emus(1), Dump: filepath.Join(t.TempDir(), "dump")})
		var ce *ConfigError
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
	base := overlapCase()
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
	for _, rt := range []Routing{{Kind: RoutingUniform}, {Kind: RoutingBalanced}, {Kind: RoutingSkewed, Alpha: 1.2}, {Kind: RoutingTrace, File: writeTrace(t, tr.String())}} {
		t.Run(rt.Kind, func(t *testing.T) {
			c := base
			c.Routing = rt
			ov := newOverlapRun(t, c, false, true, false, "")
			var prev [][]float32 // micro-batch 1's overrides at the step before
			for _, step := range []int{0, 3} {
				var got [2][][]float32 // per micro-batch, per rank: the override
				for i, dl := range ov.mb {
					if err := dl.setRouting(step); err != nil {
						t.Fatal(err)
					}
					for r, rk := range dl.ranks {
						if rt.Kind == RoutingTrace {
							for tok := range c.Tokens {
								at := (((2*step+i)*c.EP+r)*c.Tokens + tok) % len(lines)
								if g := dl.l.Ranks[r].Idx[tok*c.TopK : (tok+1)*c.TopK]; !slices.Equal(g, lines[at]) {
									t.Fatalf("step %d, micro-batch %d, rank %d, token %d: experts %v, want trace line %d's %v", step, i, r, tok, g, at, lines[at])
								}
							}
							continue
						}
						v := make([]float32, c.Tokens*c.Experts)
						if err := rk.Dev.Download(v, dl.rr[r].override, rk.Stream); err != nil {
							t.Fatal(err)
						}
						want := make([]float32, len(v))
						c.Routing.fillLogits(want, c.Seed, r, c.Experts, step, i)
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
		c := small()
		c.Device, c.Dispatcher, c.Overlap, c.DelayWgrad, c.CUDAGraph, c.EP = "cuda", tc.dispatcher, []string{OverlapA2A}, true, true, 2
		if err := c.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.dispatcher, err)
		}
		rec, err := Run(c, Env{Version: "test", OpenDevices: emus(1)})
		if rec == nil || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason+fmt.Sprint(err), tc.want) {
			t.Errorf("%s: %v, %+v; want unavailable: %q", tc.dispatcher, err, rec, tc.want)
		}
	}
}

// traceOf is a routing trace of n lines for c, each line its own draw.
func traceOf(t *testing.T, c Config, n int) string {
	g := rand.New(rand.NewPCG(1, 2))
	var tr strings.Builder
	for range n {
		for j, e := range g.Perm(c.Experts)[:c.TopK] {
			if j > 0 {
				tr.WriteString(" ")
			}
			fmt.Fprint(&tr, e)
		}
		tr.WriteString("\n")
	}
	return writeTrace(t, tr.String())
}

// TestOverlapA2AShortTraceRefused: with --overlap a2a a step takes
// 2·EP·tokens trace lines (micro-batch 0's, then micro-batch 1's); a trace
// shorter than that would wrap inside a step (with EP·tokens lines,
// micro-batch 1 would route micro-batch 0's tokens), so it is a usage
// error naming --routing, the trace's lines and the minimum; 2·EP·tokens
// lines are taken.
func TestOverlapA2AShortTraceRefused(t *testing.T) {
	c := overlapCase()
	c.Overlap = []string{OverlapA2A}
	least := 2 * c.EP * c.Tokens
	for _, n := range []int{c.EP * c.Tokens, least - 1} {
		c.Routing = Routing{Kind: RoutingTrace, File: traceOf(t, c, n)}
		_, err := newLayer(c, false)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Flag != "routing" || !strings.Contains(err.Error(), fmt.Sprintf("%d lines", n)) || !strings.Contains(err.Error(), fmt.Sprint(least)) {
			t.Errorf("a trace of %d lines with --overlap a2a: %v; want a --routing usage error naming %d lines and the minimum %d", n, err, n, least)
		}
	}
	c.Routing = Routing{Kind: RoutingTrace, File: traceOf(t, c, least)}
	if _, err := newLayer(c, false); err != nil {
		t.Errorf("a trace of %d lines with --overlap a2a: %v", least, err)
	}
	c.Overlap = nil
	c.Routing = Routing{Kind: RoutingTrace, File: traceOf(t, c, c.EP*c.Tokens)}
	if _, err := newLayer(c, false); err != nil {
		t.Errorf("a trace of EP·tokens lines without --overlap a2a: %v", err)
	}
}
