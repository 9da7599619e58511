package bench

import (
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/device"
)

// flushWatch is Emu noting, at each record of the first two events made
// (the bench's start and end events), whether the last thing queued before
// it was a copy of flush bytes.
type flushWatch struct {
	device.Emu
	flush     int64
	lastFlush bool
	timing    []device.Event
	records   []bool
}

func (f *flushWatch) NewEvent() (device.Event, error) {
	e, err := f.Emu.NewEvent()
	if len(f.timing) < 2 {
		f.timing = append(f.timing, e)
	}
	return e, err
}

func (f *flushWatch) Copy(dst, src device.Addr, bytes int64, s device.Stream) error {
	f.lastFlush = bytes == f.flush
	return f.Emu.Copy(dst, src, bytes, s)
}

func (f *flushWatch) Record(e device.Event, s device.Stream) error {
	if slices.Contains(f.timing, e) {
		f.records = append(f.records, f.lastFlush)
	}
	f.lastFlush = false
	return f.Emu.Record(e, s)
}

// TestBenchKernelsOnEmu runs the kernel benchmark's code path on Emu (its
// rates mean nothing there): every kernel gets a row with a positive rate and
// a ratio to its ceiling (the expert GEMMs three ways: Emu has a grouped
// GEMM; memory-bound rows against the SM copy kernel and the copy
// engines' copy both), and targets are where the issue sets them. Every timed call's start
// event follows the L2 flush, and no end event does.
func TestBenchKernelsOnEmu(t *testing.T) {
	c := sigmoidCase()
	c.Iters, c.Warmup = 2, 1
	watch := &flushWatch{flush: 3 << 19}
	kb, err := Kernels(c, setup.Env{Version: "test", OpenDevices: func(n, most int) ([]device.Device, error) { return []device.Device{watch}, nil }},
		Sizes{CopyBytes: 1 << 20, GEMMDim: 64, FlushBytes: 3 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(watch.records); n != 2*c.Iters*len(kb.Rows) || !strings.Contains(kb.Timing, "1 MiB device copy") {
		t.Errorf("%d events for %d rows of %d calls; %q", n, len(kb.Rows), c.Iters, kb.Timing)
	}
	for i, flushed := range watch.records {
		if flushed != (i%2 == 0) {
			t.Fatalf("event %d: after the flush %v", i, flushed)
		}
	}
	targets := map[string]float64{}
	for _, r := range kb.Rows {
		if !(r.Rate > 0) || !(r.P50us > 0) || (r.Ceiling == "" && !strings.Contains(r.Kernel, "ceiling")) {
			t.Errorf("row %+v", r)
		}
		targets[r.Kernel] = r.Target
		if te := c.Tokens * c.EP; r.Kernel == "router top-k (all ranks' tokens)" && r.Work != float64(4*te*c.Experts+8*te*c.TopK) {
			t.Errorf("router row on every rank's tokens: %v bytes", r.Work)
		}
	}
	perm := kb.Rows[slices.IndexFunc(kb.Rows, func(r Row) bool { return r.Kernel == "permute" })]
	if kb.Rows[1].Kernel != "SM copy kernel (ceiling)" || kb.Rows[1].Ceiling != "CE copy" || !strings.HasPrefix(perm.Ceiling, "SM copy (") ||
		!(perm.Ratio > 0) || !(perm.CopyEngineRatio > 0) {
		t.Errorf("the memory rows' two ceilings: %+v; %+v", kb.Rows[1], perm)
	}
	if len(kb.Rows) != 14 || targets["permute"] != 0.8 || targets["unpermute (sum of k)"] != 0.8 || targets["router top-k"] != 0.6 ||
		targets["router top-k (all ranks' tokens)"] != 0.6 ||
		!strings.Contains(kb.Peer, "one GPU") {
		t.Errorf("%d rows, targets %v, %q", len(kb.Rows), targets, kb.Peer)
	}
	// two devices: the peer-copy ceiling, and rank 0's dispatch against it
	kb, err = Kernels(c, setup.Env{Version: "test", OpenDevices: harnesstest.Emus(2)}, Sizes{CopyBytes: 1 << 20, GEMMDim: 64})
	if err != nil {
		t.Fatal(err)
	}
	if len(kb.Rows) != 16 || kb.Peer != "peer rows: GPU 0 → GPU 1, queued on GPU 0" {
		t.Fatalf("%d rows, %q", len(kb.Rows), kb.Peer)
	}
	ceil, disp := kb.Rows[14], kb.Rows[15]
	n, h := c.Tokens*c.TopK, c.Hidden
	per := n / c.EP
	if ceil.Kernel != "peer copy (ceiling)" || ceil.Work != 1<<20 || !(ceil.Rate > 0) ||
		disp.Ceiling != "peer copy" || disp.Work != float64((c.EP-1)*(2*per*h+4*per+4*c.Experts/c.EP)) || !(disp.Ratio > 0) {
		t.Errorf("peer rows %+v, %+v", ceil, disp)
	}
}

// TestBenchKernelsOnHostSim: the kernel benchmark's rows on the host
// simulation (the fake driver's two GPUs, the kernels compiled for the
// CPU), with small ceilings (the fake GEMM is a plain loop), and peer rows
// over the two GPUs.
func TestBenchKernelsOnHostSim(t *testing.T) {
	comp := hostsim.Setup(t)
	old := device.NewCompiler
	device.NewCompiler = func() (device.Compiler, error) { return comp, nil }
	t.Cleanup(func() { device.NewCompiler = old })
	c := harnesstest.Small()
	c.Device = "cuda"
	kb, err := Kernels(c, setup.Env{Version: "test"}, Sizes{CopyBytes: 1 << 20, GEMMDim: 64})
	if err != nil || len(kb.Rows) < 10 || !strings.HasPrefix(kb.Peer, "peer rows") {
		t.Fatalf("bench: %v; %+v", err, kb)
	}
}
