package harness

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/balance"
	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/dispatchers/feplb"
	"github.com/moebench/moebench/harness/check"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// deviceRun builds c's device layer with its ranks spread over devs.
func deviceRun(t testing.TB, c setup.Config, devs ...device.Device) *layer.DeviceLayer {
	t.Helper()
	l, err := layer.MakeLayer(c, false)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dispatchers.NewDevice(c.Dispatcher, c.Impl, c.DispatcherEnv())
	if err != nil {
		t.Fatal(err)
	}
	th := device.NewThreads(devs)
	t.Cleanup(th.Close)
	dl, err := layer.NewDeviceLayer(l, devs, th, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	return dl
}

func TestDeviceLayerEqualsHostLayer(t *testing.T) {
	for name, c := range harnesstest.DeviceCases() {
		t.Run(name, func(t *testing.T) { equalsHost(t, c, 1) })
		if c.EP > 1 { // ranks on 3 devices: unequal blocks, copies between devices and within one
			t.Run(name+"-3devices", func(t *testing.T) { equalsHost(t, c, 3) })
		}
	}
	for name, body := range map[string]string{"trace": "0 5 9 2\n3 1 7 15\n", "trace-probs": "0:0.4 5:0.3 9:0.2 2:0.1\n3:0.5 1:0.25 7:0.125 15:0.125\n"} {
		c := harnesstest.DeviceCases()["softmax-natural"]
		c.Routing = setup.Routing{Kind: setup.RoutingTrace, File: harnesstest.WriteTrace(t, body)}
		t.Run(name, func(t *testing.T) { equalsHost(t, c, 1) })
	}
}

// equalsHost runs c with its ranks on n Emus twice (the second time with
// the expert GEMMs over 3 extra streams) and compares outputs, routing, rows
// and traffic with the host layer's (the same dispatcher's host design).
func equalsHost(t *testing.T, c setup.Config, n int) {
	t.Helper()
	devs, _ := harnesstest.Emus(n)(n, c.EP)
	equalsHostOn(t, c, devs...)
}

// equalsHostOn is equalsHost with the ranks on devs. At fp8 the host runs
// the cuda device's expert GEMM path, so that the two compare bit for bit:
// its own FP8 GEMM path where the device runs the FP8 GEMMs, else the bf16
// GEMMs on dequantized rows (hostRunsDevicePath).
func equalsHostOn(t *testing.T, c setup.Config, devs ...device.Device) {
	t.Helper()
	if path, _ := layer.FP8GEMMPath(devs, c); c.IsFP8() && path == kernels.FP8GEMMDequant {
		hostRunsDevicePath(t)
	}
	dl := deviceRun(t, c, devs...)
	for i := range 2 { // the second step reuses every buffer
		if i == 1 {
			for r, rk := range dl.Ranks {
				dl.RankBufs[r].Grouped, _ = device.NewGrouped(rk.Dev, 3)
			}
		}
		cr, err := check.CheckDevice(dl)
		if err != nil || !cr.Passed {
			t.Fatalf("check: %v, %+v", err, cr)
		}
	}
	host := c.Dispatcher // the same design on the host; feplb's output and rows are its base's (the plans differ)
	if host == "feplb" {
		host = c.FeplbBase
	}
	hc := c
	hc.ForwardOnly = !dl.Train // the host's traffic counts the backward's bytes when the device's does
	hl, d := hostStep(t, hc, host)
	for r := range hl.Ranks {
		if !reflect.DeepEqual(hl.Ranks[r].Y, dl.Layer.Ranks[r].Y) {
			t.Fatalf("rank %d: device output differs from the host layer's", r)
		}
		if !reflect.DeepEqual(hl.Ranks[r].Idx, dl.Layer.Ranks[r].Idx) {
			t.Fatalf("rank %d: device routing differs from the host layer's", r)
		}
	}
	for r, rk := range dl.Ranks {
		host := 0
		for _, sg := range hl.Ranks[r].Segments {
			host += sg.Len
		}
		if rk.Rows() != host {
			t.Errorf("rank %d computes %d rows on the device, %d on the host", r, rk.Rows(), host)
		}
	}
	got, want := dl.Dispatcher.Traffic(), d.Traffic()
	got.Formula, _, _ = strings.Cut(got.Formula, "; moved by ")                   // what moved it: the device's own
	got.Formula, _, _ = strings.Cut(got.Formula, "; inter-domain path moved by ") // (hybridep's)
	if got != want {
		t.Errorf("traffic %+v, host %+v", got, want)
	}
}

// hostStep runs one step of c on the host device with dispatcher name's
// host implementation: the forward, then the backward unless c is
// forward-only.
func hostStep(t *testing.T, c setup.Config, name string) (*layer.Layer, dispatchers.Dispatcher) {
	t.Helper()
	hc := c
	hc.Device, hc.Dispatcher = "host", name
	hl, err := layer.NewLayer(hc)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dispatchers.New(name, "native", hc.DispatcherEnv())
	if err == nil {
		err = d.Bind(hl.Shape, hl.Ranks)
	}
	if err == nil {
		err = hl.Iteration(d, func(_ string, _ int, fn func() error) error { return fn() })
	}
	if err != nil {
		t.Fatal(err)
	}
	return hl, d
}

// TestDeviceFEPLB: FEPLB on the device pipeline (Emu) gives the host layer's
// output without FEPLB bit for bit, after moving work; a lost phase-2 copy
// fails the check.
func TestDeviceFEPLB(t *testing.T) {
	c := harnesstest.FEPLBCase()
	equalsHost(t, c, 1)  // training steps: the backward's phase 2 too
	equalsHost(t, c, 4)  // one device per rank: every phase-2 copy goes between devices
	c.ForwardOnly = true // from here on the forward's phase 2 is the subject
	dl := deviceRun(t, c, &device.Emu{})
	if cr, err := check.CheckDevice(dl); err != nil || !cr.Passed {
		t.Fatalf("check: %v, %+v", err, cr)
	}
	rb := dl.Dispatcher.Capabilities().Rebalance.Stats()
	before, after := slices.Max(rb.TokensBefore)-slices.Min(rb.TokensBefore), slices.Max(rb.TokensAfter)-slices.Min(rb.TokensAfter)
	if rb.Moves == 0 || after >= before || rb.CopyBytes == 0 || rb.CopyMethod == "" {
		t.Fatalf("rebalance %+v", rb)
	}
	// Emu runs each copy when it is issued, after the helper's static
	// experts: the helper's stream waited for its copies
	if !(rb.Exposed > 0) || !strings.Contains(rb.ExposedNote, "ready − static end") {
		t.Errorf("exposed %v s (%s): want the helpers' wait for their copies", rb.Exposed, rb.ExposedNote)
	}
	// paused, phase 2 moves nothing and the output is still right
	dl.Dispatcher.Capabilities().Rebalance.Pause(true)
	if cr, err := check.CheckDevice(dl); err != nil || !cr.Passed {
		t.Fatalf("paused check: %v, %+v", err, cr)
	}
	if p := dl.Dispatcher.Capabilities().Rebalance.Stats(); p.Moves != 0 || !slices.Equal(p.TokensAfter, p.TokensBefore) || !math.IsNaN(p.Exposed) {
		t.Fatalf("paused rebalance %+v", p)
	}
	// a step ends with the incoming chunks (4 copies each: rows,
	// probabilities, fc1, fc2), then per rank its outputs pulled back (one
	// per chunk; rank 0 gives work away) and the base combine's (one per
	// rank): garble each of the first chunk's and rank 0's first pull-back
	probe := &harnesstest.DropCopy{}
	dl = deviceRun(t, c, probe)
	probe.N = 0
	if _, err := check.CheckDevice(dl); err != nil {
		t.Fatal(err)
	}
	if rb.TokensAfter[0] >= rb.TokensBefore[0] {
		t.Fatalf("rank 0 gave no work away: %+v", rb)
	}
	copies := probe.N
	in := copies - c.EP*c.EP - 5*rb.Moves + 1
	for _, drop := range []int{in, in + 1, in + 2, in + 3, in + 4*rb.Moves} {
		// garbled, not lost: the buffers still hold the last step's rows
		probe.N, probe.Drop, probe.Garble = 0, drop, true
		if cr, err := check.CheckDevice(dl); err == nil && cr.Passed {
			t.Errorf("copy %d of %d lost, check passed", drop, copies)
		}
	}
}

// TestDeviceFEPLBSplitsOverHelpers: a plan that splits one expert over the
// owner and two helpers (splitCase) runs on the device pipeline with the host
// layer's output, each rank computing what the plan says.
func TestDeviceFEPLBSplitsOverHelpers(t *testing.T) {
	c, counts := harnesstest.SplitCase(t)
	// the premise: the policy splits expert 0 over two helpers
	tp := balance.Topology{Ranks: c.EP, Experts: c.Experts, Domain: c.Domain}
	o := balance.DefaultOptions
	o.DynamicPerRank = c.FeplbDynamic()
	pol, err := balance.New(c.FeplbPolicy, tp, feplb.HostModel(c.Hidden, c.FFN), o) // an emulated device's first plan
	if err != nil {
		t.Fatal(err)
	}
	pl := pol.Plan(balance.Step{Counts: counts, Ready: balance.PaperSchedSeconds})
	if len(pl.Shares[0]) < 3 {
		t.Fatalf("premise: expert 0's shares %v, want the owner and two helpers", pl.Shares[0])
	}
	equalsHost(t, c, 1)  // training steps: expert 0's weight gradients from two helpers
	c.ForwardOnly = true // the forward's work stays the ranks' Work (a backward sets its own)
	equalsHost(t, c, 4)
	lg := &harnesstest.BatchLog{}
	dl := deviceRun(t, c, lg)
	if cr, err := check.CheckDevice(dl); err != nil || !cr.Passed {
		t.Fatalf("check: %v, %+v", err, cr)
	}
	if rb := dl.Dispatcher.Capabilities().Rebalance.Stats(); !slices.Equal(rb.TokensAfter, pl.Loads(c.EP)) || rb.Moves != len(pl.Moves)/2 {
		t.Fatalf("rebalance %+v; plan loads %v, %d moves", rb, pl.Loads(c.EP), len(pl.Moves)/2)
	}
	// the order the policy's model of the way back assumes: a helper
	// computes its chunks for others first and marks them done; the owner
	// takes the outputs back off its own stream, so its own work overlaps
	for _, s := range pl.Shares[0][1:] {
		w := dl.Ranks[s.Rank].Work
		if len(w) != 2 || w[0].Done == nil || w[0].Segments[0].FC1 == 0 || w[1].Done != nil {
			t.Errorf("helper %d's dynamic work %+v: want its chunks for others (marked done), then its own", s.Rank, w)
		}
	}
	owner := dl.Ranks[0]
	y, bytes := owner.ExpertY, device.Addr(2*owner.Rows()*c.Hidden)
	back := 0
	for _, b := range lg.Batches {
		if b.Dst >= y && b.Dst < y+bytes {
			back++
			if b.S == owner.Stream {
				t.Errorf("the outputs back are copied on the owner's own stream, behind its own work")
			}
		}
	}
	if back == 0 {
		t.Error("no copy batch brought outputs back to the owner")
	}
}

// TestDeviceFEPLBRunRecord: a feplb run on the device pipeline records its
// rebalance and both expert phases; over an unavailable base it is
// unavailable.
func TestDeviceFEPLBRunRecord(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	c := harnesstest.FEPLBCase()
	emu := setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)}
	rec, err := Run(c, emu)
	if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.Rebalance == nil {
		t.Fatalf("run: %v, %+v", err, rec)
	}
	var names []string
	for _, p := range rec.Timing.Phases {
		names = append(names, p.Name)
	}
	if want := []string{"shared", "router", "permute", "dispatch", "experts", "rebalance", "dynamic", "combine", "unpermute",
		"unpermute-bwd", "combine-bwd", "dynamic-bwd", "rebalance-bwd", "experts-bwd", "dispatch-bwd", "permute-bwd", "router-bwd", "shared-bwd"}; !reflect.DeepEqual(names, want) {
		t.Errorf("phases %v, want %v", names, want)
	}
	rb := rec.Rebalance
	if !slices.Equal(rec.Tokens.Received, rb.TokensAfter) || rb.TokenAfter.Abs >= rb.TokenBefore.Abs || rb.Moves == 0 ||
		!strings.Contains(rb.ExposedNote, "median of") || len(rb.PerStep.ExposedMS) != c.Iters || rb.PhaseTwoSMs != "not measured: the emu device has no copy engines" || rb.CopyMethod == "" {
		t.Errorf("rebalance record %+v, tokens %v", rb, rec.Tokens.Received)
	}
	// the backward's phase 2: the gradients back, the helpers' weight
	// gradients among them, timed on the copy streams
	if wg := kernels.ExpertWGradBytes(c.Hidden, c.FFN); rb.WGradBytes < wg || rb.BackwardCopyBytes <= rb.WGradBytes || !(rb.BackwardCopyMS >= 0) {
		t.Errorf("backward phase 2: %d bytes, %d of them weight gradients (at least %d), %v ms", rb.BackwardCopyBytes, rb.WGradBytes, wg, rb.BackwardCopyMS)
	}
	harnesstest.GEMMBeforeAfter(t, rec)
	// item 12: planned with the rates measured in the run, and packed ranks said so
	if !strings.Contains(rb.Note, "rates measured in this run: expert GEMMs") || !strings.Contains(rb.Note, "copies") || !strings.Contains(rb.Note, "share one GPU") {
		t.Errorf("note %q: want the measured rates and the ranks packed on one device", rb.Note)
	}
	c.ForwardOnly = true // the placement's note is the subject
	if rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(4)}); err != nil || rec.Rebalance == nil || strings.Contains(rec.Rebalance.Note, "share one GPU") {
		t.Errorf("a device per rank: %v, record %+v", err, rec)
	}
	c.FeplbBase = "deepep"
	rec, err = Run(c, emu)
	if !dispatchers.IsUnavailable(err) || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, "base dispatcher deepep") {
		t.Errorf("feplb over deepep on the device: %v, %q", err, rec.Reason)
	}
}

func TestDeviceCheckCatchesLostCopy(t *testing.T) {
	c := harnesstest.DeviceCases()["softmax-natural"]
	// count the copies of a step, then lose one of the dispatch's
	probe := &harnesstest.DropCopy{}
	dl := deviceRun(t, c, probe)
	probe.N = 0
	if cr, err := check.CheckDevice(dl); err != nil || !cr.Passed {
		t.Fatalf("clean run: %v %+v", err, cr)
	}
	copies := probe.N
	for _, drop := range []int{copies / 3, copies - 1} {
		dev := &harnesstest.DropCopy{}
		dl := deviceRun(t, c, dev)
		dev.N, dev.Drop = 0, drop
		// a lost copy fails the check, or Emu refuses the step (counts that
		// do not add up)
		if cr, err := check.CheckDevice(dl); err == nil && cr.Passed {
			t.Errorf("copy %d of %d lost, check passed (max rel err %g)", drop, copies, cr.MaxRelErr)
		}
	}
}

func TestDeviceRunRecord(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	c := harnesstest.DeviceCases()["sigmoid-groups-skewed-shared"]
	rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
	if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
		t.Fatalf("run: %v, %+v", err, rec)
	}
	var names []string
	for _, p := range rec.Timing.Phases {
		names = append(names, p.Name)
		if len(p.Samples) != c.Iters || len(p.PerRank) != c.EP {
			t.Errorf("phase %s: %d samples, %d ranks", p.Name, len(p.Samples), len(p.PerRank))
		}
	}
	if want := []string{"shared", "router", "permute", "dispatch", "experts", "combine", "unpermute",
		"unpermute-bwd", "combine-bwd", "experts-bwd", "dispatch-bwd", "permute-bwd", "router-bwd", "shared-bwd"}; !reflect.DeepEqual(names, want) {
		t.Errorf("phases %v, want %v", names, want)
	}
	if !strings.HasPrefix(rec.SMs.Measured, "not measured: NVML") || rec.Telemetry != nil {
		t.Errorf("without NVML: sms %q, telemetry %+v", rec.SMs.Measured, rec.Telemetry)
	}
	if len(rec.Timing.Step.Samples) != c.Iters || !rec.Ranks.Emulated || rec.Correctness.Sample == "" || !strings.Contains(rec.GEMM.Method, "chosen") {
		t.Errorf("record: step %v, ranks %+v, sample %q", rec.Timing.Step.Samples, rec.Ranks, rec.Correctness.Sample)
	}
	// Emu runs each call as it is issued: issuing is the whole step
	if hi := rec.Timing.HostIssue; hi == nil || hi.P50 <= 0 || hi.P50 < 0.5*rec.Timing.Step.P50 {
		t.Errorf("host issue %+v, step p50 %g", hi, rec.Timing.Step.P50)
	}
	sum := 0
	for _, n := range rec.Tokens.Received {
		sum += n
	}
	if sum != c.EP*c.Tokens*c.TopK {
		t.Errorf("rows computed %v, want %d in all", rec.Tokens.Received, c.EP*c.Tokens*c.TopK)
	}
	// without the check, the traffic is still that of the timed steps
	c.Check = false
	rec, err = Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
	if err != nil || rec.Traffic.DispatchLogical != int64(c.EP*c.Tokens*c.TopK)*int64(2*c.Hidden+4) {
		t.Errorf("--check=false: %v, traffic %+v", err, rec.Traffic)
	}
	// an implementation that cannot run here is unavailable, with the reason
	c.Dispatcher, c.Impl = "hybridep", "library"
	rec, err = Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
	if !dispatchers.IsUnavailable(err) || rec.Status != results.StatusUnavailable || rec.Timing != nil || !strings.Contains(rec.Reason, "library") {
		t.Errorf("hybridep's library implementation on Emu: %v, %+v", err, rec)
	}
}

// TestGPULayer runs the device cases on the GPU: each must pass the check
// against the float64 reference. It skips without a GPU and fails under
// MOEBENCH_REQUIRE_GPU=1 (scripts/gpu-check.sh).
func TestGPULayer(t *testing.T) {
	cases := harnesstest.DeviceCases()
	cases["feplb"] = harnesstest.FEPLBCase()
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dev := harnesstest.OpenGPU(t)
			defer dev.Close()
			dl := deviceRun(t, c, dev)
			defer dl.Dispatcher.Close()
			for i := range 2 {
				cr, err := check.CheckDevice(dl)
				if err != nil || !cr.Passed {
					t.Fatalf("step %d: %v, %+v", i, err, cr)
				}
				t.Logf("step %d: max rel err %.3g, %d routing differences, %s", i, cr.MaxRelErr, cr.RoutingDiffs, cr.Sample)
			}
			if rb := dl.Dispatcher.Capabilities().Rebalance; rb != nil {
				s := rb.Stats()
				if s.Moves == 0 || !(s.Exposed >= 0) {
					t.Errorf("rebalance %+v", s)
				}
				t.Logf("rebalance: %d moves, copies %.3f ms (%s), exposed %.3f ms", s.Moves, 1e3*s.CopySeconds, s.CopyMethod, 1e3*s.Exposed)
			}
		})
	}
}

// TestDeviceSampledCheck: beyond the reference's budget the check compares a
// seeded sample of tokens per rank, and still catches a lost copy.
func TestDeviceSampledCheck(t *testing.T) {
	defer func(b float64) { setup.RefFLOPBudget = b }(setup.RefFLOPBudget)
	setup.RefFLOPBudget = 1
	c := harnesstest.DeviceCases()["softmax-natural"]
	dl := deviceRun(t, c, &device.Emu{})
	cr, err := check.CheckDevice(dl)
	if err != nil || !cr.Passed || !strings.Contains(cr.Sample, "64 of 128 tokens (16 per rank") {
		t.Fatalf("sampled check: %v, %+v", err, cr)
	}
	dev := &harnesstest.DropCopy{}
	dl = deviceRun(t, c, dev)
	dev.N, dev.Drop = 0, 2 // the first rank's dispatch loses a source's rows
	if cr, err := check.CheckDevice(dl); err != nil || cr.Passed {
		t.Errorf("lost copy with a sampled check: %v, %+v", err, cr)
	}
}

// TestDeviceGroupedGEMMFailureLeftOut: a grouped GEMM that fails is left out
// of the comparison, with the reason, and the run goes on.
func TestDeviceGroupedGEMMFailureLeftOut(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	c := harnesstest.DeviceCases()["softmax-natural"]
	c.Iters, c.Warmup = 1, 0
	rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.OneDevice(&harnesstest.FailGrouped{})})
	if err != nil || rec.Status != results.StatusOK || !strings.Contains(rec.GEMM.Method, "failed: ") || strings.Contains(rec.GEMM.Method, "chosen: emulated") {
		t.Fatalf("run: %v, method %q", err, rec.GEMM.Method)
	}
}

// TestDeviceDump: --dump on the device pipeline writes the same files as on
// the host, byte for byte (the weights drawn again from the seed, the
// routing and output downloaded from the device), the gradients of a
// training step of the same shapes, also for feplb; a failed check still
// dumps.
func TestDeviceDump(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	for name, c := range map[string]setup.Config{"sigmoid": harnesstest.DeviceCases()["sigmoid-groups-skewed-shared"], "feplb": harnesstest.FEPLBCase()} {
		t.Run(name, func(t *testing.T) {
			read := func(dir string) map[string][]byte {
				ents, err := os.ReadDir(dir)
				if err != nil {
					t.Fatal(err)
				}
				files := map[string][]byte{}
				for _, e := range ents {
					if e.Name() != "index.json" {
						files[e.Name()], _ = os.ReadFile(filepath.Join(dir, e.Name()))
					}
				}
				return files
			}
			host, dev := filepath.Join(t.TempDir(), "host"), filepath.Join(t.TempDir(), "dev")
			c.Iters, c.Warmup = 1, 0 // the dump is the last step's
			hc := c
			hc.Device, hc.ForwardOnly = "host", setup.ForwardOnlyReason(c) != "" // the same pass as the device's
			if _, err := Run(hc, setup.Env{Version: "test", Dump: host}); err != nil {
				t.Fatal(err)
			}
			if _, err := Run(c, setup.Env{Version: "test", Dump: dev, OpenDevices: harnesstest.Emus(1)}); err != nil {
				t.Fatal(err)
			}
			hf, df := read(host), read(dev)
			if len(hf) < 7 || len(hf) != len(df) {
				t.Fatalf("%s: host dumped %d files, device %d", name, len(hf), len(df))
			}
			for f, b := range hf {
				// the gradients' float32 sums go in other orders on the
				// device (the gradient check bounds their error): the same size
				if grad := strings.HasPrefix(f, "grad_"); grad && len(b) != len(df[f]) || !grad && !bytes.Equal(b, df[f]) {
					t.Errorf("%s: %s differs between the host and the device dump", name, f)
				}
			}
		})
	}
	// a check that fails still dumps what the device computed
	c := harnesstest.DeviceCases()["sigmoid-groups-skewed-shared"]
	dir := filepath.Join(t.TempDir(), "failed")
	probe := &harnesstest.DropCopy{Drop: 2}
	rec, err := Run(c, setup.Env{Version: "test", Dump: dir, OpenDevices: harnesstest.OneDevice(probe)})
	if err == nil || rec.Status != results.StatusFailed {
		t.Fatalf("lost copy: %v, %+v", err, rec)
	}
	if _, err := os.Stat(filepath.Join(dir, "output.npy")); err != nil {
		t.Errorf("failed check, no dump: %v", err)
	}
}

// TestDeviceRanksOnSeveralDevices: with the ranks spread over devices (one
// per rank, or packed), runs time every rank on its own device's clock and
// record where each rank ran; feplb over devices that cannot reach each
// other within a domain is unavailable, with the reason.
func TestDeviceRanksOnSeveralDevices(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	for _, tc := range []struct {
		c        setup.Config
		gpus     int
		devices  []int
		emulated bool
	}{
		{harnesstest.DeviceCases()["softmax-natural"], 0, []int{0, 1, 2, 3}, false},
		{harnesstest.DeviceCases()["softmax-natural"], 2, []int{0, 0, 1, 1}, true},
		{harnesstest.FEPLBCase(), 0, []int{0, 1, 2, 3}, false},
	} {
		t.Run(fmt.Sprintf("%s-gpus%d", tc.c.Dispatcher, tc.gpus), func(t *testing.T) {
			c := tc.c
			c.GPUs, c.Iters, c.Warmup, c.ForwardOnly = tc.gpus, 2, 1, true // the placement is the subject (the backward over devices: TestDeviceFEPLB, TestDeviceLayerEqualsHostLayer)
			rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(4)})
			if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
				t.Fatalf("%s on %d devices: %v, %+v", c.Dispatcher, tc.gpus, err, rec)
			}
			if !slices.Equal(rec.Ranks.Devices, tc.devices) || rec.Ranks.Emulated != tc.emulated || !strings.Contains(rec.Ranks.Note, "peer copies") ||
				rec.Config.GPUs != tc.gpus || len(rec.Timing.Step.Samples) != c.Iters {
				t.Errorf("%s, --gpus %d: ranks %+v, config gpus %d", c.Dispatcher, tc.gpus, rec.Ranks, rec.Config.GPUs)
			}
			if rb := rec.Rebalance; rb != nil && (rb.Moves == 0 || !strings.Contains(rb.PhaseTwoSMs, "on 4 GPUs")) {
				t.Errorf("feplb on 4 devices: %+v", rb)
			}
		})
	}
	c := harnesstest.FEPLBCase()
	c.ForwardOnly = true
	islands := func(n, most int) ([]device.Device, error) {
		return []device.Device{&harnesstest.Island{}, &harnesstest.Island{}, &harnesstest.Island{}, &harnesstest.Island{}}, nil
	}
	rec, err := Run(c, setup.Env{Version: "test", OpenDevices: islands})
	if !dispatchers.IsUnavailable(err) || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, "no peer access") || rec.Timing != nil {
		t.Errorf("feplb without peer access: %v, %+v", err, rec)
	}
	c = harnesstest.DeviceCases()["softmax-natural"] // alltoall copies through host memory: available, and the note says so
	c.Iters, c.Warmup, c.ForwardOnly = 1, 0, true
	rec, err = Run(c, setup.Env{Version: "test", OpenDevices: islands})
	if err != nil || rec.Status != results.StatusOK || !strings.Contains(rec.Ranks.Note, "no peer access 0→1") {
		t.Errorf("alltoall without peer access: %v, %+v", err, rec.Ranks)
	}
}

// TestDeviceAlltoallLibrary: the library implementation (NCCL's grouped
// send/recv on GPUs; on Emus the emulated communicator) equals the host
// layer with one device per rank, and says what moved the data; with ranks
// packed onto fewer devices it is unavailable, with the reason.
func TestDeviceAlltoallLibrary(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	for _, name := range []string{"softmax-natural", "sigmoid-groups-skewed-shared", "ep1", "balanced-ep8"} {
		c := harnesstest.DeviceCases()[name]
		c.Impl = "library"
		t.Run(name, func(t *testing.T) { equalsHost(t, c, c.EP) })
	}
	c := harnesstest.DeviceCases()["softmax-natural"]
	c.Impl, c.Iters, c.Warmup = "library", 2, 1
	rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(c.EP)})
	if err != nil || rec.Status != results.StatusOK || rec.Config.Impl != "library" ||
		!strings.Contains(rec.Ranks.Note, "data moves between ranks through emulated send/recv") ||
		!strings.Contains(rec.Traffic.Formula, "; moved by emulated send/recv") ||
		strings.Contains(rec.Timing.Model, "combine is issued once per GPU") ||
		!strings.Contains(rec.Timing.Model, "issued from the GPU's own thread") ||
		!strings.Contains(rec.Memory.Method, "the library's own buffers") {
		t.Fatalf("library on one device per rank: %v, %+v", err, rec)
	}
	rec, err = Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(2)})
	if !dispatchers.IsUnavailable(err) || rec.Status != results.StatusUnavailable || rec.Timing != nil ||
		!strings.Contains(rec.Reason, "NCCL: ranks 0 and 1 share a device") {
		t.Errorf("library with ranks packed: %v, %+v", err, rec)
	}
}

// TestRoutingPerStep (Megatron's fidelity): each iteration draws its own
// routing, seeded by the step, so the ranks' loads change from step to step
// (recorded per step); --routing-fixed replays the first step's; step 0 is
// the routing the layer always drew; a trace goes on where the step before
// ended; and the device pipeline routes each step as the host does.
func TestRoutingPerStep(t *testing.T) {
	t.Setenv("MOEBENCH_NVML", "/nonexistent")
	c := harnesstest.DeviceCases()["balanced-ep8"]
	c.Warmup, c.Iters = 1, 3
	host := c
	host.Device = "host"
	perStep := func(c setup.Config, env setup.Env) [][]int {
		t.Helper()
		rec, err := Run(c, env)
		if err != nil || rec.Status != results.StatusOK || len(rec.Tokens.StragglerPerStep) != c.Iters || rec.Config.RoutingPerStep == c.RoutingFixed {
			t.Fatalf("fixed %v: %v, %+v", c.RoutingFixed, err, rec)
		}
		return rec.Tokens.ReceivedPerStep
	}
	steps := perStep(host, setup.Env{Version: "test"})
	if slices.EqualFunc(steps[:2], steps[1:], slices.Equal) {
		t.Errorf("fresh routing: the same loads every step: %v", steps)
	}
	if dev := perStep(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)}); !slices.EqualFunc(dev, steps, slices.Equal) {
		t.Errorf("device pipeline's loads per step %v, host's %v", dev, steps)
	}
	host.RoutingFixed = true
	if fixed := perStep(host, setup.Env{Version: "test"}); !slices.EqualFunc(fixed[:2], fixed[1:], slices.Equal) {
		t.Errorf("--routing-fixed: loads change: %v", fixed)
	}
	l, err := layer.NewLayer(c)
	if err != nil {
		t.Fatal(err)
	}
	first := slices.Clone(l.Override[1])
	if l.SetRouting(2); slices.Equal(l.Override[1], first) {
		t.Error("step 2's logits are step 0's")
	}
	if l.SetRouting(0); !slices.Equal(l.Override[1], first) || !slices.Equal(first, c.Routing.Logits(c.Seed, 1, c.Tokens, c.Experts)) {
		t.Error("step 0's logits are not the layer's first draw")
	}
	tc := c
	tc.Routing = setup.Routing{Kind: setup.RoutingTrace, File: harnesstest.WriteTrace(t, "0 1 2 3\n4 5 6 7\n8 9 10 11\n")}
	tl, err := layer.NewLayer(tc)
	if err != nil {
		t.Fatal(err)
	}
	tl.SetRouting(1) // rank 0's token 0 is the trace's token EP·T (mod 3 lines)
	if idx, _ := tl.TraceToken(0, 0); int(idx[0]) != 4*((tc.EP*tc.Tokens)%3) {
		t.Errorf("step 1 starts at trace line %v", idx)
	}
}

// TestAlltoallEP1MovesNothing: at EP 1 the native alltoall, as Megatron's
// dispatcher, runs no all-to-all copies and no chunk sorts; the output still
// passes the check.
func TestAlltoallEP1MovesNothing(t *testing.T) {
	c := harnesstest.DeviceCases()["ep1"]
	dev := &harnesstest.CountingEmu{}
	rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.OneDevice(dev)})
	if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
		t.Fatalf("%v; %+v", err, rec)
	}
	if dev.Sorts != 0 || dev.PeerCopies != 0 {
		t.Errorf("EP 1: %d chunk sorts, %d copies between ranks; want none", dev.Sorts, dev.PeerCopies)
	}
}

// TestAlltoallCountExchange: the counts reach the host through
// asynchronous copies into page-locked memory, one per rank and step,
// queued by the permute (no blocking download in a step: the layer's only
// ones are the check's), and the host's wait for them is
// reported on its own: the dispatch phase, timed from its own first GPU
// operation, does not hold it.
func TestAlltoallCountExchange(t *testing.T) {
	c := harnesstest.DeviceCases()["balanced-ep8"]
	c.EP, c.Warmup, c.Iters, c.RoutingFixed = 4, 1, 3, true
	dev := &harnesstest.WaitingEmu{WaitFor: 10 * time.Millisecond}
	rec, err := Run(c, setup.Env{Version: "test", OpenDevices: harnesstest.OneDevice(dev)})
	if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
		t.Fatalf("%v; %+v", err, rec)
	}
	ways := len(layer.GroupedSideStreams)
	if _, ok := dev.GroupedGEMMName(); ok {
		ways++
	}
	steps := 1 + 3*ways + c.Warmup + c.Iters // the check's, the GEMM choice's, the loop's
	// the check's: per rank routing, probabilities and output, and its
	// input, probability and router weight gradients; per expert its two
	// weight gradients
	checks := 6*c.EP + 2*c.Experts
	if c.SharedExperts > 0 { // and the shared expert's two weight gradients per rank
		checks += 2 * c.EP
	}
	if dev.Downloads != checks || dev.Async != steps*c.EP {
		t.Errorf("%d blocking downloads (want the check's %d), %d asynchronous (want %d: one per rank and step)", dev.Downloads, checks, dev.Async, steps*c.EP)
	}
	hw := rec.Timing.HostWait
	if hw == nil || hw.P50 < float64(c.EP)*10 {
		t.Fatalf("host wait %+v: want at least %d ms (a 10 ms wait per rank)", hw, c.EP*10)
	}
	for _, p := range rec.Timing.Phases {
		if p.Name == "dispatch" && p.P50 > 5 {
			t.Errorf("dispatch p50 %.1f ms: it holds the host's wait for the counts", p.P50)
		}
	}
}
