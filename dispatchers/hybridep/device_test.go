package hybridep

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/moebench/moebench/dispatchers"
	dt "github.com/moebench/moebench/dispatchers/dispatchtest"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/comm"
	"github.com/moebench/moebench/kernels/device"
)

// The device design (hybridep.cu's kernels, or their twins on Emu) against
// the host design on the same ranks: the expert rows and probabilities and
// the output, bit for bit; and the backward on random gradients (never
// zero): the expert rows' output gradients, the input gradients and the
// probability gradients, bit for bit (the same placements, the same sums
// in the same order, the same roundings). Every output buffer is poisoned
// (NaN) before the steps.

// grads draws a step's gradients on rank r: n random values (bf16 when
// round), never zero, the same on the host and the device for the same
// rank and kind.
func grads(r, kind, n int, round bool) []float32 {
	rng := rand.New(rand.NewPCG(uint64(r)+100, uint64(kind)))
	v := make([]float32, n)
	for i := range v {
		x := float32(rng.NormFloat64())
		if x == 0 {
			x = 0.5
		}
		if round {
			x = kernels.RoundBF16(x)
		}
		v[i] = x
	}
	return v
}

const (
	gradDY = iota
	gradExpertDX
	gradExpertDP
)

// stepResult is what a run gave on each rank: expert rows and
// probabilities, output, and the backward's ExpertDY, DX and DProbs.
type stepResult struct {
	expertX, expertP, y, expertDY, dx, dprobs [][]float32
	err                                       error
}

// sharedOf is a shared expert's output for every token of every rank
// (random bf16).
func sharedOf(sh dispatchers.Shape) [][]float32 {
	out := make([][]float32, sh.EP)
	for r := range out {
		out[r] = grads(r, 9, sh.Tokens*sh.Hidden, true)
	}
	return out
}

// hostDesign runs the host design on tagged ranks (two forward steps with
// dt.Expert, then the backward with grads' gradients).
func hostDesign(t *testing.T, cfg Config, sh dispatchers.Shape, shared [][]float32, prob func(int) float32) (stepResult, []*dispatchers.Rank) {
	t.Helper()
	h := WithConfig(cfg)
	y, ranks := dt.Outputs(t, h, sh, 5, prob)
	var res stepResult
	for r, rk := range ranks {
		kernels.RoundBF16Slice(y[r])
		if shared != nil { // as the kernel adds it
			for i := range y[r] {
				y[r][i] = kernels.RoundBF16(y[r][i] + shared[r][i])
			}
		}
		res.expertX, res.expertP, res.y = append(res.expertX, slices.Clone(rk.ExpertX)), append(res.expertP, slices.Clone(rk.ExpertProbs)), append(res.y, y[r])
		rk.DY = grads(r, gradDY, sh.Tokens*sh.Hidden, true)
	}
	for r := range ranks {
		if err := h.CombineBackward(r); err != nil {
			t.Fatal(err)
		}
	}
	for r, rk := range ranks {
		n := len(rk.ExpertProbs)
		rk.ExpertDX, rk.ExpertDProbs = grads(r, gradExpertDX, n*sh.Hidden, true), grads(r, gradExpertDP, n, false)
	}
	for r, rk := range ranks {
		if err := h.DispatchBackward(r); err != nil {
			t.Fatal(err)
		}
		res.expertDY = append(res.expertDY, slices.Clone(rk.ExpertDY[:len(rk.ExpertProbs)*sh.Hidden]))
		res.dx, res.dprobs = append(res.dx, slices.Clone(rk.DX)), append(res.dprobs, slices.Clone(rk.DProbs))
	}
	return res, ranks
}

// runDevice binds d to ranks' inputs on devs (contiguous blocks of ranks),
// runs steps steps with dt.Expert computed on the host from the downloaded
// rows and, when train, the backward with grads' gradients; it returns the
// last step's results.
func runDevice(t *testing.T, d *Device, sh dispatchers.Shape, devs []device.Device, ranks []*dispatchers.Rank, shared [][]float32, steps int, train bool) stepResult {
	t.Helper()
	T, k, hd := sh.Tokens, sh.TopK, sh.Hidden
	w := sh.DispatchWidth() // X's and ExpertX's rows (narrower at fp8: rows of w in X's first T·w elements)
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	drs := make([]*dispatchers.DeviceRank, sh.EP)
	for r, rk := range ranks {
		dev := devs[r*len(devs)/sh.EP]
		dr := &dispatchers.DeviceRank{ID: r, Dev: dev}
		var err error
		dr.Stream, err = dev.NewStream()
		ok(err)
		_, err = device.Resize(dev, 1, device.RowBuffer{P: &dr.X, PerRow: int64(2 * T * hd)}, device.RowBuffer{P: &dr.Idx, PerRow: int64(4 * T * k)},
			device.RowBuffer{P: &dr.Probs, PerRow: int64(4 * T * k)}, device.RowBuffer{P: &dr.Y, PerRow: int64(2 * T * hd)})
		ok(err)
		ok(dev.Upload(dr.X, kernels.BF16Bits(rk.X), dr.Stream))
		ok(dev.Upload(dr.Idx, rk.Idx, dr.Stream))
		ok(dev.Upload(dr.Probs, rk.Probs, dr.Stream))
		ok(dev.Fill16(dr.Y, 0x7fc0, int64(T*hd), dr.Stream)) // NaN: every value must be written
		if shared != nil {
			dr.Shared, err = dev.Alloc(int64(2 * T * hd))
			ok(err)
			ok(dev.Upload(dr.Shared, kernels.BF16Bits(shared[r]), dr.Stream))
		}
		if train {
			dr.DY, err = dev.Alloc(int64(2 * T * hd))
			ok(err)
			ok(dev.Upload(dr.DY, kernels.BF16Bits(grads(r, gradDY, T*hd, true)), dr.Stream))
		}
		drs[r] = dr
		t.Cleanup(func() {
			device.Free(dev, &dr.X, &dr.Idx, &dr.Probs, &dr.Y, &dr.ExpertY, &dr.Shared, &dr.DY, &dr.ExpertDX, &dr.ExpertDProbs)
		})
	}
	th := dt.Threads(t, drs)
	if err := d.Bind(sh, drs); err != nil {
		return stepResult{err: err}
	}
	t.Cleanup(func() { d.Close() })
	res := stepResult{expertX: make([][]float32, sh.EP), expertP: make([][]float32, sh.EP)}
	outs, dgrads := make([]device.RowCapacity, sh.EP), make([]device.RowCapacity, sh.EP)
	experts := func(r int) error {
		dr := drs[r]
		n := dr.Rows()
		x, p := make([]uint16, n*w), make([]float32, n)
		if n > 0 {
			if err := dr.Dev.Download(x, dr.ExpertX, dr.Stream); err != nil {
				return err
			}
			if err := dr.Dev.Download(p, dr.ExpertProbs, dr.Stream); err != nil {
				return err
			}
		}
		xf := kernels.FromBF16Bits(x)
		res.expertX[r], res.expertP[r] = xf, p // each rank from its device's thread
		y := make([]float32, n*hd)
		for i := range y { // (a narrow dispatch: each output row repeats its input row)
			y[i] = dt.Expert(xf[i/hd*w+i%hd%w], p[i/hd])
		}
		if err := outs[r].Ensure(dr.Dev, dr.Stream, n, device.RowBuffer{P: &dr.ExpertY, PerRow: int64(2 * hd)}); err != nil || n == 0 {
			return err
		}
		return dr.Dev.Upload(dr.ExpertY, kernels.BF16Bits(y), dr.Stream)
	}
	expertsBwd := func(r int) error { // the layer's: ExpertDX and ExpertDProbs of every row
		dr := drs[r]
		n := dr.Rows()
		if err := dgrads[r].Ensure(dr.Dev, dr.Stream, n, device.RowBuffer{P: &dr.ExpertDX, PerRow: int64(2 * hd)}, device.RowBuffer{P: &dr.ExpertDProbs, PerRow: 4}); err != nil || n == 0 {
			return err
		}
		if err := dr.Dev.Upload(dr.ExpertDX, kernels.BF16Bits(grads(r, gradExpertDX, n*hd, true)), dr.Stream); err != nil {
			return err
		}
		return dr.Dev.Upload(dr.ExpertDProbs, grads(r, gradExpertDP, n, false), dr.Stream)
	}
	for step := range steps {
		phases := d.Forward(experts)
		if train {
			if step > 0 { // the backward's outputs poisoned (NaN) once its first combine-bwd has sized them
				for _, dr := range drs {
					ok(dr.Dev.Fill16(dr.DX, 0x7fc0, int64(T*hd), dr.Stream))
					ok(dr.Dev.Fill16(dr.DProbs, 0x7fc0, int64(2*T*k), dr.Stream))
					if n := dr.Rows(); n > 0 {
						ok(dr.Dev.Fill16(dr.ExpertDY, 0x7fc0, int64(n*hd), dr.Stream))
					}
				}
			}
			phases = append(phases, d.Backward(expertsBwd)...)
		}
		if err := dt.IssuePhases(th, d, drs, phases); err != nil {
			return stepResult{err: err}
		}
		for _, dr := range drs {
			ok(dr.Dev.SyncStream(dr.Stream))
		}
		if err := d.CheckStep(); err != nil {
			return stepResult{err: err}
		}
	}
	for _, dr := range drs {
		y := make([]uint16, T*hd)
		ok(dr.Dev.Download(y, dr.Y, dr.Stream))
		res.y = append(res.y, kernels.FromBF16Bits(y))
		if !train {
			continue
		}
		edy, dx, dp := make([]uint16, dr.Rows()*hd), make([]uint16, T*hd), make([]float32, T*k)
		if len(edy) > 0 {
			ok(dr.Dev.Download(edy, dr.ExpertDY, dr.Stream))
		}
		ok(dr.Dev.Download(dx, dr.DX, dr.Stream))
		ok(dr.Dev.Download(dp, dr.DProbs, dr.Stream))
		res.expertDY, res.dx, res.dprobs = append(res.expertDY, kernels.FromBF16Bits(edy)), append(res.dx, kernels.FromBF16Bits(dx)), append(res.dprobs, dp)
	}
	return res
}

// deviceCases are the layouts of the device tests: EP 2, 4 and 8, one
// domain and several, ranks on one device and on several (across domains
// on Emu one device per rank: the emulated NCCL needs it), expert counts
// that are multiples of 16, 8 and only 4.
var deviceCases = []struct {
	name   string
	sh     dispatchers.Shape
	domain int
	ndev   int
	shared bool
	prob   func(int) float32
}{
	{"ep2-one-device", dispatchers.Shape{Tokens: 37, Hidden: 16, Experts: 16, TopK: 6, EP: 2}, 0, 1, false, dt.Cancelling},
	{"ep2-two-domains", dispatchers.Shape{Tokens: 37, Hidden: 16, Experts: 16, TopK: 6, EP: 2}, 1, 2, true, dt.Mild},
	// 12 experts: the all-gather stores the map's rows 4 bytes at a time
	{"ep2-twelve-experts", dispatchers.Shape{Tokens: 19, Hidden: 8, Experts: 12, TopK: 3, EP: 2}, 0, 1, false, dt.Mild},
	{"ep4-two-devices-shared", dispatchers.Shape{Tokens: 29, Hidden: 24, Experts: 16, TopK: 5, EP: 4}, 0, 2, true, dt.Mild},
	{"ep4-two-domains", dispatchers.Shape{Tokens: 29, Hidden: 8, Experts: 8, TopK: 3, EP: 4}, 2, 4, false, dt.Cancelling},
	{"ep8-one-device", dispatchers.Shape{Tokens: 23, Hidden: 8, Experts: 16, TopK: 3, EP: 8}, 0, 1, false, dt.Mild},
	{"ep8-two-devices", dispatchers.Shape{Tokens: 23, Hidden: 16, Experts: 32, TopK: 4, EP: 8}, 0, 2, false, dt.Cancelling},
	{"ep8-four-domains", dispatchers.Shape{Tokens: 23, Hidden: 8, Experts: 16, TopK: 4, EP: 8}, 2, 8, false, dt.Mild},
	{"ep8-two-domains", dispatchers.Shape{Tokens: 23, Hidden: 8, Experts: 16, TopK: 6, EP: 8}, 4, 8, true, dt.Cancelling},
}

// checkDevices runs the device design against the host design for the
// cases whose devices devs(n) gives (nil: skipped), or only the named
// ones; noBulk compiles the kernels' 16-byte path.
func checkDevices(t *testing.T, devs func(n int) []device.Device, noBulk bool, only ...string) {
	for _, tc := range deviceCases {
		if len(only) > 0 && !slices.Contains(only, tc.name) {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			ds := devs(tc.ndev)
			if ds == nil {
				t.Skipf("no %d devices here", tc.ndev)
			}
			if _, emu := ds[0].(*device.Emu); !emu && tc.name != "ep2-one-device" && tc.name != "ep2-two-domains" {
				hostsim.SkipIfShort(t, "ep2-one-device and ep2-two-domains")
			}
			start := time.Now()
			cfg := Config{SMs: 2, Domain: tc.domain, Chunk: 4}
			var shared [][]float32
			if tc.shared {
				shared = sharedOf(tc.sh)
			}
			want, ranks := hostDesign(t, cfg, tc.sh, shared, tc.prob)
			var got stepResult
			hostsim.WithinNamed(t, 2*time.Minute, "hybridep's forward and backward on the fake GPUs", func() {
				got = runDevice(t, &Device{cfg: cfg, timeout: 10 * time.Second, noBulk: noBulk}, tc.sh, ds, ranks, shared, 2, true)
			})
			if got.err != nil {
				t.Fatal(got.err)
			}
			compare(t, got, want)
			t.Logf("%.2f s", time.Since(start).Seconds())
		})
	}
}

// compare wants got to equal want bit for bit, rank by rank.
func compare(t *testing.T, got, want stepResult) {
	t.Helper()
	for r := range want.y {
		for _, g := range []struct {
			name      string
			got, want []float32
		}{{"ExpertX", got.expertX[r], want.expertX[r]}, {"ExpertProbs", got.expertP[r], want.expertP[r]}, {"Y", got.y[r], want.y[r]},
			{"ExpertDY", got.expertDY[r], want.expertDY[r]}, {"DX", got.dx[r], want.dx[r]}, {"DProbs", got.dprobs[r], want.dprobs[r]}} {
			if i := slices.IndexFunc(g.got, func(v float32) bool { return v != v }); len(g.got) != len(g.want) || i >= 0 {
				t.Fatalf("rank %d %s: %d values, NaN at %d; the host design's %d", r, g.name, len(g.got), i, len(g.want))
			}
			for i, v := range g.got {
				if v != g.want[i] {
					t.Fatalf("rank %d %s value %d: %v, the host design's %v", r, g.name, i, v, g.want[i])
				}
			}
		}
	}
}

// emuDevs are n Emus.
func emuDevs(n int) []device.Device {
	devs := make([]device.Device, n)
	for i := range devs {
		devs[i] = &device.Emu{SMs: 16}
	}
	return devs
}

// TestDeviceOnEmu: the device pipeline, forward and backward, through the
// kernels' twins (Emu's stream-order check, its emulated NCCL across
// domains).
func TestDeviceOnEmu(t *testing.T) { checkDevices(t, emuDevs, false) }

// fakeGPUs opens two GPUs of the host simulation with the fake NCCL (the
// inter-domain path) and 16 SMs each: EP 8 on one GPU at 2 SMs a rank
// holds 16 (the combine's block, 192 threads, takes an SM's registers).
func fakeGPUs(t *testing.T) []device.Device {
	nccl, err := hostsim.BuildFake("fakenccl", t.TempDir(), "libnccl.so.2")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOEBENCH_NCCL", nccl)
	t.Setenv("FAKECUDA_SMS", "16") // a block holds an SM: 8 ranks × 2 blocks on one
	return dt.FakeGPUs(t, 2)
}

// TestDeviceOnHostSim: hybridep.cu's kernels, forward and backward, on the
// host simulation's two GPUs: ranks on one GPU and on both, one domain,
// and two domains of one rank each (the inter-domain path through the fake
// NCCL).
func TestDeviceOnHostSim(t *testing.T) {
	gs := fakeGPUs(t)
	checkDevices(t, func(n int) []device.Device {
		if n > len(gs) {
			return nil
		}
		return gs[:n]
	}, false)
}

// TestDeviceNarrowDispatch: a dispatch row narrower than the combine's
// (Shape.DispatchHidden, the packed fp8 rows; hybridep.cu's MB_HE_DHIDDEN):
// the forward's pack, dispatch, inter-domain path and permute move rows of
// 8 elements while combine and the backward move 16. The bulk path on the
// host simulation, its 16-byte path and the twins on Emu give the same
// expert rows, outputs and gradients bit for bit (harness's fp8 tests hold
// the bulk path and the twins to the host layer; this holds the 16-byte
// path to them), in one domain and in two.
func TestDeviceNarrowDispatch(t *testing.T) {
	gs := fakeGPUs(t)
	sh := dispatchers.Shape{Tokens: 37, Hidden: 16, DispatchHidden: 8, Experts: 16, TopK: 6, EP: 2}
	for _, domain := range []int{1, 2} {
		cfg := Config{SMs: 2, Domain: domain, Chunk: 4}
		_, ranks := hostDesign(t, cfg, sh, nil, dt.Mild)
		run := func(devs []device.Device, noBulk bool) stepResult {
			var got stepResult
			hostsim.WithinNamed(t, 2*time.Minute, "hybridep's narrow dispatch", func() {
				got = runDevice(t, &Device{cfg: cfg, timeout: 10 * time.Second, noBulk: noBulk}, sh, devs, ranks, nil, 2, true)
			})
			if got.err != nil {
				t.Fatal(got.err)
			}
			return got
		}
		ndev := 1
		if domain == 1 { // two domains of one rank each
			ndev = 2
		}
		bulk := run(gs[:ndev], false)
		if len(bulk.expertX[0])+len(bulk.expertX[1]) == 0 {
			t.Fatal("no rows dispatched")
		}
		compare(t, run(gs[:ndev], true), bulk)
		compare(t, run(emuDevs(2), false), bulk)
	}
}

// TestDeviceOnHostSim16Byte: the kernels' 16-byte path (sm_80's, or
// NVRTC 11.8's) on the host simulation, where the bulk-copy path is
// compiled otherwise: one domain on one GPU and on two (a shared expert),
// and two domains.
func TestDeviceOnHostSim16Byte(t *testing.T) {
	gs := fakeGPUs(t)
	checkDevices(t, func(n int) []device.Device { return gs[:n] }, true, "ep2-one-device", "ep2-two-domains", "ep4-two-devices-shared")
}

// TestDeviceWideRowsOnHostSim: rows of 2,560 bytes (hidden 1280), wide
// enough that a FIFO loader's lane fills a slot with all 4 of the 16-byte
// loads it keeps in flight on the 16-byte path (mb_fifo_put's
// MB_FIFO_UNROLL: a group of 4 × 512 bytes a warp, then a partial one),
// which the other cases' rows of at most 48 bytes never reach: both paths
// on the host simulation equal the host design bit for bit, forward and
// backward, in one domain (a shared expert) and in two.
func TestDeviceWideRowsOnHostSim(t *testing.T) {
	gs := fakeGPUs(t)
	sh := dispatchers.Shape{Tokens: 13, Hidden: 1280, Experts: 16, TopK: 4, EP: 2}
	for _, c := range []struct {
		domain, ndev int
		shared       bool
	}{{0, 1, true}, {1, 2, false}} {
		for _, noBulk := range []bool{true, false} {
			t.Run(fmt.Sprintf("domain%d-noBulk=%v", c.domain, noBulk), func(t *testing.T) {
				cfg := Config{SMs: 2, Domain: c.domain, Chunk: 4}
				var shared [][]float32
				if c.shared {
					shared = sharedOf(sh)
				}
				want, ranks := hostDesign(t, cfg, sh, shared, dt.Mild)
				var got stepResult
				hostsim.WithinNamed(t, 3*time.Minute, "hybridep's wide rows on the fake GPUs", func() {
					got = runDevice(t, &Device{cfg: cfg, timeout: 20 * time.Second, noBulk: noBulk}, sh, gs[:c.ndev], ranks, shared, 1, true)
				})
				if got.err != nil {
					t.Fatal(got.err)
				}
				compare(t, got, want)
			})
		}
	}
}

// TestBrokenBackwardTimesOut: a backward whose combine kernel (the
// dispatch's backward) has a rank that never meets the others at its
// barrier ends by the kernels' timeout, naming the rank, the backward's
// phase and the wait; the forward and the combine's backward ran (ranks
// on the host simulation's two GPUs).
func TestBrokenBackwardTimesOut(t *testing.T) {
	hostsim.SkipIfShort(t, "deepep's TestBrokenProtocolTimesOut (a kernel's timeout named)")
	gs := fakeGPUs(t)
	sh := dispatchers.Shape{Tokens: 16, Hidden: 8, Experts: 8, TopK: 2, EP: 2}
	cfg := Config{SMs: 1, Chunk: 4}
	_, ranks := hostDesign(t, cfg, sh, nil, dt.Mild)
	d := &Device{cfg: cfg, timeout: 1500 * time.Millisecond} // long enough for every good wait on a loaded machine
	d.Break(BugBwdNoBarrier, 1)
	start := time.Now()
	var got stepResult
	hostsim.WithinNamed(t, time.Minute, "the broken backward to end by a timeout", func() { got = runDevice(t, d, sh, gs, ranks, nil, 1, true) })
	var ce *comm.CommError
	if !errors.As(got.err, &ce) || !ce.Records[0].TimedOut || ce.Records[0].Waited < d.timeout {
		t.Fatalf("%v: want the kernels' timeout", got.err)
	}
	if want := "rank 0 timed out in phase dispatch-bwd (the combine kernel) at wait barrier flag of rank 1"; !strings.Contains(got.err.Error(), want) {
		t.Fatalf("%v: want %q", got.err, want)
	}
	t.Logf("%v (%.2f s)", got.err, time.Since(start).Seconds())
}

// TestGPUHybridEPDevice: the kernels on the GPUs (up to two; cases that
// need more devices are skipped) against the host design bit for bit,
// forward and backward (the bulk-copy path where the GPU is sm_90 and its
// NVRTC ≥ 12).
func TestGPUHybridEPDevice(t *testing.T) {
	devs := dt.GPUs(t, 2)
	checkDevices(t, func(n int) []device.Device {
		if n > len(devs) {
			return nil
		}
		return devs[:n]
	}, false)
}

// TestPreprocessOnHostSim: hybridep.cu's preprocessing (its two launches,
// several blocks a rank, maps of several tiles: tiles of 256 tokens, and
// of 128 with more than 256 experts) gives every rank the host design's
// metadata exactly: sparse_to_dense, dense_to_expert, counts, chunk
// layout, attn_to_rdma and the inter-domain slots.
func TestPreprocessOnHostSim(t *testing.T) {
	gs := fakeGPUs(t)
	for _, tc := range []struct {
		name                string
		sh                  dispatchers.Shape
		domain, ndev, preSM int
	}{
		{"ep4-five-tiles", dispatchers.Shape{Tokens: 300, Hidden: 8, Experts: 16, TopK: 3, EP: 4}, 0, 1, 2},
		{"ep2-two-domains", dispatchers.Shape{Tokens: 300, Hidden: 8, Experts: 16, TopK: 5, EP: 2}, 1, 2, 2},
		{"ep2-320-experts", dispatchers.Shape{Tokens: 200, Hidden: 8, Experts: 320, TopK: 6, EP: 2}, 0, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sh, T := tc.sh, tc.sh.Tokens
			ranks := dt.Tagged(sh, 11)
			d := &Device{cfg: Config{SMs: 1, Domain: tc.domain, Chunk: 64, PreprocessSMs: tc.preSM}, timeout: 10 * time.Second}
			drs := make([]*dispatchers.DeviceRank, sh.EP)
			for r, rk := range ranks {
				dev := gs[r*tc.ndev/sh.EP]
				dr := &dispatchers.DeviceRank{ID: r, Dev: dev}
				var err error
				if dr.Stream, err = dev.NewStream(); err != nil {
					t.Fatal(err)
				}
				if _, err = device.Resize(dev, 1, device.RowBuffer{P: &dr.X, PerRow: int64(2 * T * sh.Hidden)}, device.RowBuffer{P: &dr.Idx, PerRow: int64(4 * T * sh.TopK)},
					device.RowBuffer{P: &dr.Probs, PerRow: int64(4 * T * sh.TopK)}, device.RowBuffer{P: &dr.Y, PerRow: int64(2 * T * sh.Hidden)}); err != nil {
					t.Fatal(err)
				}
				if err := errors.Join(dev.Upload(dr.Idx, rk.Idx, dr.Stream), dev.Upload(dr.Probs, rk.Probs, dr.Stream)); err != nil {
					t.Fatal(err)
				}
				drs[r] = dr
				t.Cleanup(func() { device.Free(dev, &dr.X, &dr.Idx, &dr.Probs, &dr.Y) })
			}
			th := dt.Threads(t, drs)
			if err := d.Bind(sh, drs); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })
			if d.preSMs != tc.preSM || d.g.preTiles() < 2 {
				t.Fatalf("%d preprocessing blocks a rank, %d tiles: want %d blocks and several tiles", d.preSMs, d.g.preTiles(), tc.preSM)
			}
			hostsim.WithinNamed(t, 2*time.Minute, "hybridep's all-gather and preprocessing", func() {
				if err := dt.IssuePhases(th, d, drs, d.Forward(nil)[:2]); err != nil {
					t.Fatal(err)
				}
			})
			g := d.g
			gmap := make([]bool, g.N*T*g.E)
			for src, rk := range ranks {
				for x, e := range rk.Idx {
					gmap[(src*T+x/sh.TopK)*g.E+int(e)] = true
				}
			}
			_, _, _, _, _, _, total := g.metaInts()
			for r, dr := range drs {
				ints, todom := make([]int32, total), make([]uint16, T*g.M/2) // (T·M even here)
				if err := errors.Join(dr.Dev.Download(ints, d.st[r].meta, dr.Stream), dr.Dev.Download(todom, d.st[r].todom, dr.Stream)); err != nil {
					t.Fatal(err)
				}
				got, want := g.metaOf(ints, unsafe.Slice((*byte)(unsafe.Pointer(&todom[0])), 2*len(todom))), g.newMeta()
				g.preprocess(r, gmap, &want)
				want.d2e, got.d2e = want.d2e[:want.recv*g.L], got.d2e[:want.recv*g.L]
				want.cnt, got.cnt = nil, nil
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("rank %d: the kernels' metadata\n%+v\nthe host design's\n%+v", r, got, want)
				}
			}
		})
	}
}

// TestSharedMemoryLimit: at hidden 7168 the FIFOs HybridEP's stages ask
// for (184–196 KiB a block) exceed an A100's 163 KiB opt-in limit: the
// stages shrink to fit it (every kernel's dynamic shared memory and the
// bound of its static below the limit); a limit that even the fewest
// stages exceed makes the design unavailable before any launch, naming
// the bytes and the limit. A GPU's limit is the driver's opt-in
// attribute (the fake driver gives $FAKECUDA_SMEM_OPTIN).
func TestSharedMemoryLimit(t *testing.T) {
	sh := dispatchers.Shape{Tokens: 8, Hidden: 7168, Experts: 16, TopK: 2, EP: 2}
	bind := func(dev device.Device) (*Device, error) {
		d := &Device{cfg: Config{SMs: 2, Chunk: 4}, timeout: time.Second}
		drs := make([]*dispatchers.DeviceRank, sh.EP)
		for r := range drs {
			s, err := dev.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			drs[r] = &dispatchers.DeviceRank{ID: r, Dev: dev, Stream: s}
		}
		err := d.Bind(sh, drs)
		if err == nil {
			t.Cleanup(func() { d.Close() })
		}
		return d, err
	}
	const a100 = 166912
	d, err := bind(&device.Emu{SMs: 16, Shared: a100})
	if err != nil {
		t.Fatal(err)
	}
	for k, c := range d.progs.col {
		if c.Prog.Shared+staticShared > a100 {
			t.Errorf("%s: %d B of dynamic shared memory (and up to %d static) above the limit, %d B", k, c.Prog.Shared, staticShared, a100)
		}
	}
	if _, err := bind(&device.Emu{SMs: 16, Shared: 100000}); !dispatchers.IsUnavailable(err) ||
		!strings.Contains(err.Error(), "he_combine needs 118848 B of shared memory a block") || !strings.Contains(err.Error(), "the 100000 B a block of") {
		t.Errorf("a limit of 100000 B: %v; want unavailable, naming he_combine's 118848 B and the limit", err)
	}
	t.Setenv("FAKECUDA_SMEM_OPTIN", fmt.Sprint(a100))
	g := dt.FakeGPUs(t, 1)[0]
	if s, ok := g.(interface{ SharedPerBlock() int }); !ok || s.SharedPerBlock() != a100 {
		t.Fatalf("the fake GPU's opt-in limit: %v, want %d (the driver's attribute)", s, a100)
	}
}
