package deepep

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/dispatchers"
	dt "github.com/moebench/moebench/dispatchers/dispatchtest"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/comm"
	"github.com/moebench/moebench/kernels/device"
	"math/rand/v2"
)

// The device design (deepep.cu's kernels, or their twins on Emu) against
// the host design on the same ranks: the permuted rows and probabilities,
// and the output, bit for bit; and the backward on random gradients (never
// zero): the expert rows' output gradients, the input gradients and the
// probability gradients, bit for bit (the same sums in the same order).

// devCase is one run: ranks spread over devs in contiguous blocks; with
// shared, each rank's output adds a shared expert's (random bf16 values).
type devCase struct {
	sh     dispatchers.Shape
	cfg    Config
	devs   []device.Device
	shared [][]float32
}

// sharedOutputs are random bf16 rows for every token of every rank.
func sharedOutputs(sh dispatchers.Shape) [][]float32 {
	out := make([][]float32, sh.EP)
	for r := range out {
		out[r] = make([]float32, sh.Tokens*sh.Hidden)
		for i := range out[r] {
			out[r][i] = kernels.RoundBF16(float32(i%13) - 6.25 + float32(r)/3)
		}
	}
	return out
}

// devResult is what a device run gave: each rank's expert rows and
// probabilities (as the experts saw them), output and receive buffer, or
// the error.
type devResult struct {
	expertX, expertP, y [][]float32
	recv                []received
	// the backward's (training steps): each rank's ExpertDY, DX (bf16)
	// and DProbs, from the gradients of grads
	expertDY, dx, dprobs [][]float32
	err                  error
}

// grads draws a step's gradients on rank r: n random values (bf16 when
// round), never zero, the same on the host and the device for the same
// rank and kind (the output gradients DY, the expert rows' input gradients
// ExpertDX, their probability gradients ExpertDProbs).
func grads(r, kind, n int, round bool) []float32 {
	rng := rand.New(rand.NewPCG(uint64(r), uint64(kind)))
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

// received is a rank's receive buffer and send_head.
type received struct {
	x, w     []float32
	src, idx []int32
	sendHead []int
	tokens   int
}

// recvOf is rank r's receive buffer in the host design.
func recvOf(h *Host, r int) received {
	s, sh := &h.st[r], h.shape
	return received{x: s.recvX[:s.recv*sh.Hidden], w: s.recvW[:s.recv*sh.TopK], src: s.recvSrc[:s.recv], idx: s.recvIdx[:s.recv*sh.TopK],
		sendHead: s.sendHead, tokens: s.recv}
}

// download is rank r's receive buffer on the device.
func (d *Device) download(t *testing.T, r int) received {
	s, rk, sh := &d.st[r], d.ranks[r], d.shape
	n, k := s.tokens, sh.TopK
	x, src, idx, w, sendHead := make([]uint16, n*sh.Hidden), make([]int32, n), make([]int32, n*k), make([]float32, n*k), make([]int32, sh.Tokens*sh.EP)
	for _, c := range []struct {
		to any
		p  device.Addr
	}{{x, s.recvX}, {src, s.recvSrc}, {idx, s.recvIdx}, {w, s.recvW}, {sendHead, s.fixed + device.Addr(d.lay.sendHead)}} {
		if err := rk.Dev.Download(c.to, c.p, rk.Stream); err != nil {
			t.Fatal(err)
		}
	}
	rc := received{x: kernels.FromBF16Bits(x), w: w, src: src, idx: idx, tokens: n}
	for _, v := range sendHead {
		rc.sendHead = append(rc.sendHead, int(v))
	}
	return rc
}

// runDevice binds d to c's ranks (the inputs of tagged ranks, probabilities
// mild), runs steps steps with expert computed on the host from the
// downloaded rows (and, when train, the backward with grads' gradients),
// and returns the last step's results.
func runDevice(t *testing.T, d *Device, c devCase, ranks []*dispatchers.Rank, steps int, train bool) devResult {
	t.Helper()
	sh := c.sh
	T, k, hd := sh.Tokens, sh.TopK, sh.Hidden
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	drs := make([]*dispatchers.DeviceRank, sh.EP)
	for r, rk := range ranks {
		dev := c.devs[r*len(c.devs)/sh.EP]
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
		if c.shared != nil {
			dr.Shared, err = dev.Alloc(int64(2 * T * hd))
			ok(err)
			ok(dev.Upload(dr.Shared, kernels.BF16Bits(c.shared[r]), dr.Stream))
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
		return devResult{err: err}
	}
	t.Cleanup(func() { d.Close() })
	var res devResult
	outs := make([]device.RowCapacity, sh.EP)
	experts := func(r int) error {
		dr := drs[r]
		n := dr.Rows()
		x, p := make([]uint16, n*hd), make([]float32, n)
		if err := dr.Dev.Download(x, dr.ExpertX, dr.Stream); err != nil {
			return err
		}
		if err := dr.Dev.Download(p, dr.ExpertProbs, dr.Stream); err != nil {
			return err
		}
		xf := kernels.FromBF16Bits(x)
		res.expertX[r], res.expertP[r] = xf, p // each rank from its device's thread
		y := make([]float32, n*hd)
		for i, v := range xf {
			y[i] = dt.Expert(v, p[i/hd])
		}
		if err := outs[r].Ensure(dr.Dev, dr.Stream, n, device.RowBuffer{P: &dr.ExpertY, PerRow: int64(2 * hd)}); err != nil {
			return err
		}
		return dr.Dev.Upload(dr.ExpertY, kernels.BF16Bits(y), dr.Stream)
	}
	dgrads := make([]device.RowCapacity, sh.EP)
	expertsBwd := func(r int) error { // the layer's: ExpertDX and ExpertDProbs of every row
		dr := drs[r]
		n := dr.Rows()
		if err := dgrads[r].Ensure(dr.Dev, dr.Stream, n, device.RowBuffer{P: &dr.ExpertDX, PerRow: int64(2 * hd)}, device.RowBuffer{P: &dr.ExpertDProbs, PerRow: 4}); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if err := dr.Dev.Upload(dr.ExpertDX, kernels.BF16Bits(grads(r, gradExpertDX, n*hd, true)), dr.Stream); err != nil {
			return err
		}
		return dr.Dev.Upload(dr.ExpertDProbs, grads(r, gradExpertDP, n, false), dr.Stream)
	}
	for range steps {
		res.expertX, res.expertP = make([][]float32, sh.EP), make([][]float32, sh.EP)
		phases := d.Forward(experts)
		if train {
			phases = append(phases, d.Backward(expertsBwd)...)
		}
		if err := dt.IssuePhases(th, d, drs, phases); err != nil {
			return devResult{err: err}
		}
		for _, dr := range drs {
			ok(dr.Dev.SyncStream(dr.Stream))
		}
		if err := d.CheckStep(); err != nil {
			return devResult{err: err}
		}
	}
	for r, dr := range drs {
		y := make([]uint16, T*hd)
		ok(dr.Dev.Download(y, dr.Y, dr.Stream))
		res.y = append(res.y, kernels.FromBF16Bits(y))
		res.recv = append(res.recv, d.download(t, r))
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

// hostBackward is the host design's backward after h's forward on ranks,
// with grads' gradients: each rank's ExpertDY, DX and DProbs.
func hostBackward(t *testing.T, h *Host, ranks []*dispatchers.Rank, res *devResult) {
	t.Helper()
	sh := h.shape
	for r, rk := range ranks {
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
		res.expertDY = append(res.expertDY, rk.ExpertDY[:len(rk.ExpertProbs)*sh.Hidden])
		res.dx, res.dprobs = append(res.dx, rk.DX), append(res.dprobs, rk.DProbs)
	}
}

// hostRun is the host design on tagged ranks with probabilities prob(slot):
// expert rows, probabilities, output (rounded to bf16, as the layer stores
// it) and receive buffers.
func hostRun(t *testing.T, c devCase, seed uint64, prob func(int) float32) (devResult, []*dispatchers.Rank) {
	t.Helper()
	h := WithConfig(c.cfg)
	y, ranks := dt.Outputs(t, h, c.sh, seed, prob)
	var res devResult
	for r, rk := range ranks {
		kernels.RoundBF16Slice(y[r])
		for i := range y[r] {
			if c.shared != nil { // as the layer adds it
				y[r][i] = kernels.RoundBF16(y[r][i] + c.shared[r][i])
			}
		}
		res.expertX, res.expertP, res.y = append(res.expertX, rk.ExpertX), append(res.expertP, rk.ExpertProbs), append(res.y, y[r])
		res.recv = append(res.recv, recvOf(h, r))
	}
	hostBackward(t, h, ranks, &res) // its receive rows then hold the output gradients, as the device's
	return res, ranks
}

// checkDevices runs the device design against the host design, ranks on
// the first of devs or on both.
func checkDevices(t *testing.T, devs []device.Device) { checkDevicesPath(t, devs, false) }

// checkDevicesPath is checkDevices, with noBulk the dispatch's receivers
// on the 16-byte path where the bulk path would be compiled (MB_NO_BULK).
func checkDevicesPath(t *testing.T, devs []device.Device, noBulk bool) {
	for _, tc := range []struct {
		name   string
		sh     dispatchers.Shape
		warps  int // per peer
		ndev   int
		sms    int
		shared bool
		prob   func(int) float32
		cring  int // the combine ring's slots (0: the warps and 2)
	}{
		{"ep2-one-device", dispatchers.Shape{Tokens: 37, Hidden: 16, Experts: 16, TopK: 6, EP: 2}, 2, 1, 4, false, dt.Cancelling, 0}, // the order of each rank's sum matters
		{"ep4-two-devices-shared", dispatchers.Shape{Tokens: 37, Hidden: 16, Experts: 16, TopK: 5, EP: 4}, 1, 2, 4, true, dt.Mild, 0},
		{"ep8-one-device", dispatchers.Shape{Tokens: 29, Hidden: 8, Experts: 16, TopK: 3, EP: 8}, 1, 1, 2, false, dt.Mild, 0},
		{"ep8-two-devices", dispatchers.Shape{Tokens: 29, Hidden: 24, Experts: 8, TopK: 4, EP: 8}, 1, 2, 4, false, dt.Cancelling, 0},
		// one token: an empty channel, and ranks that receive nothing
		{"ep2-one-token", dispatchers.Shape{Tokens: 1, Hidden: 8, Experts: 8, TopK: 2, EP: 2}, 1, 2, 4, false, dt.Mild, 0},
		// rows of 296 vectors: the kernels' unrolled row loops (8 vectors
		// a lane, 256 a round) run a whole round and then a partial one
		{"ep2-wide-rows", dispatchers.Shape{Tokens: 5, Hidden: 2368, Experts: 4, TopK: 2, EP: 2}, 1, 2, 2, false, dt.Cancelling, 0},
		// a combine ring of 4 slots under 8 warps: the receiving block's
		// reducers free slots as each finishes its token, not a round of
		// the block's warps at a time
		{"ep2-small-combine-ring", dispatchers.Shape{Tokens: 37, Hidden: 16, Experts: 8, TopK: 3, EP: 2}, 4, 1, 2, false, dt.Mild, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.ndev > len(devs) {
				t.Skipf("needs %d devices", tc.ndev)
			}
			if _, emu := devs[0].(*device.Emu); !emu && tc.name != "ep2-one-token" && tc.name != "ep4-two-devices-shared" {
				hostsim.SkipIfShort(t, "ep2-one-token and ep4-two-devices-shared")
			}
			start := time.Now()
			cfg := Config{SMs: tc.sms, Dispatch: Queue{Chunk: 2, Ring: 5}, Combine: Queue{Chunk: 3, Ring: tc.warps*tc.sh.EP + 2},
				Warps: tc.warps * tc.sh.EP, MinBlocks: 4}
			if tc.cring > 0 {
				cfg.Combine.Ring = tc.cring
			}
			c := devCase{sh: tc.sh, cfg: cfg, devs: devs[:tc.ndev]}
			if tc.shared {
				c.shared = sharedOutputs(tc.sh)
			}
			want, ranks := hostRun(t, c, 7, tc.prob)
			var got devResult
			hostsim.WithinNamed(t, time.Minute, "deepep's forward and backward on the fake GPUs", func() {
				d := WithDeviceConfig(cfg)
				d.noBulk = noBulk
				got = runDevice(t, d, c, ranks, 2, true)
			})
			if got.err != nil {
				t.Fatal(got.err)
			}
			for r := range ranks {
				if !reflect.DeepEqual(got.recv[r], want.recv[r]) {
					t.Fatalf("rank %d: the receive buffer or send_head differs from the host design's:\n%+v\n%+v", r, got.recv[r], want.recv[r])
				}
				if !slices.Equal(got.expertX[r], want.expertX[r]) || !slices.Equal(got.expertP[r], want.expertP[r]) {
					t.Fatalf("rank %d: the expert rows or probabilities differ from the host design's", r)
				}
				for i, v := range got.y[r] {
					if v != want.y[r][i] {
						t.Fatalf("rank %d value %d: %v, the host design's %v", r, i, v, want.y[r][i])
					}
				}
				// the backward, bit for bit: the same sums in the same order
				for _, g := range []struct {
					name      string
					got, want []float32
				}{{"ExpertDY", got.expertDY[r], want.expertDY[r]}, {"DX", got.dx[r], want.dx[r]}, {"DProbs", got.dprobs[r], want.dprobs[r]}} {
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
			t.Logf("%.2f s", time.Since(start).Seconds())
		})
	}
}

func emus(n int) []device.Device {
	devs := make([]device.Device, n)
	for i := range devs {
		devs[i] = &device.Emu{SMs: 16}
	}
	return devs
}

// TestDeviceOnEmu: the device pipeline through the kernels' twins.
func TestDeviceOnEmu(t *testing.T) { checkDevices(t, emus(2)) }

// TestDeviceOnHostSim: deepep.cu's kernels on the host simulation, ranks
// on one fake GPU and on two.
func TestDeviceOnHostSim(t *testing.T) { checkDevices(t, dt.FakeGPUs(t, 2)) }

// TestBrokenProtocolTimesOut: a dispatch whose senders never publish their
// tail, and a notify barrier one rank never reaches, end by the kernels'
// timeout with the rank, phase and wait named; a counter the host waits for
// and no kernel writes ends by the host's deadline, naming it; none hangs
// (ranks on two fake GPUs).
func TestBrokenProtocolTimesOut(t *testing.T) { checkBroken(t, dt.FakeGPUs(t, 2)) }

// checkBroken breaks the protocol on purpose (deepep.cu's MB_DE_BUG) with
// two ranks on devs.
func checkBroken(t *testing.T, devs []device.Device) {
	sh := dispatchers.Shape{Tokens: 16, Hidden: 8, Experts: 8, TopK: 2, EP: 2}
	cfg := Config{SMs: 2, Dispatch: Queue{Chunk: 2, Ring: 4}, Combine: Queue{Chunk: 2, Ring: 4}, Warps: 2, MinBlocks: 4}
	for _, tc := range []struct {
		bug  int
		want []string
	}{
		{1, []string{"timed out in phase dispatch at wait "}}, // the receivers' tail or the senders' head: whichever gives up first
		{2, []string{"rank 0 timed out in phase notify at wait flag of rank 1 (a barrier)", "read 0, waiting for 1"}},
		// the kernels end, but a counter is never written: the host's own deadline
		{3, []string{"the host's wait for rank 1's received-token count (notify)", "it read -1"}},
		// the backward's combine: the forward and combine-bwd run, then it ends by the timeout, named
		{4, []string{"timed out in phase dispatch-bwd (the combine kernel) at wait "}},
	} {
		t.Run(fmt.Sprint("bug", tc.bug), func(t *testing.T) {
			if tc.bug == 1 || tc.bug == 4 {
				hostsim.SkipIfShort(t, "bug2 (a kernel's timeout) and bug3 (the host's)")
			}
			c := devCase{sh: sh, cfg: cfg, devs: devs}
			_, ranks := hostRun(t, c, 8, dt.Mild)
			d := WithDeviceConfig(cfg)
			d.bug, d.timeout = tc.bug, 1500*time.Millisecond // long enough for every good wait on a loaded machine
			start := time.Now()
			var got devResult
			hostsim.WithinNamed(t, time.Minute, "the broken step to end by a timeout", func() { got = runDevice(t, d, c, ranks, 1, tc.bug == 4) })
			var ce *comm.CommError
			var he *comm.HostWaitError
			switch {
			case tc.bug == 3:
				if !errors.As(got.err, &he) || he.Waited < d.timeout {
					t.Fatalf("%v: want the host's timeout", got.err)
				}
			case !errors.As(got.err, &ce) || !ce.Records[0].TimedOut || ce.Records[0].Waited < d.timeout:
				t.Fatalf("%v: want the kernels' timeout", got.err)
			}
			for _, w := range tc.want {
				if !strings.Contains(got.err.Error(), w) {
					t.Errorf("%v: want %q in it", got.err, w)
				}
			}
			t.Logf("%v (%.2f s)", got.err, time.Since(start).Seconds())
		})
	}
}

// TestGPUDeepEP: the kernels on the GPUs (cases of two devices need two)
// against the host design bit for bit, at bf16 and with the fp8 dispatch
// (fp8dev_test.go), broken protocols ending by the timeout, and a budget
// above the GPU's SMs unavailable.
func TestGPUDeepEP(t *testing.T) {
	devs := dt.GPUs(t, 2)
	checkDevices(t, devs)
	checkFP8(t, devs)
	checkBroken(t, devs)
	sh := dispatchers.Shape{Tokens: 16, Hidden: 8, Experts: 16, TopK: 2, EP: 2}
	cfg := DefaultConfig(sh.EP, devs[0].SMCount()/2*2+2)
	got := runDevice(t, WithDeviceConfig(cfg), devCase{sh: sh, cfg: cfg, devs: devs[:1]}, dt.Tagged(sh, 9), 1, false)
	if !dispatchers.IsUnavailable(got.err) || !strings.Contains(got.err.Error(), "exceeds device 0's") {
		t.Errorf("--sms %d: %v; want unavailable", cfg.SMs, got.err)
	}
}

// TestDeviceBudgetUnavailable: a budget above the GPU's SMs, or more
// blocks than the GPU holds at once for its ranks, is unavailable with the
// reason (the fake GPUs have 16 SMs, a block holding one).
func TestDeviceBudgetUnavailable(t *testing.T) {
	sh := dispatchers.Shape{Tokens: 16, Hidden: 8, Experts: 16, TopK: 2, EP: 8}
	devs := dt.FakeGPUs(t, 1)
	for _, tc := range []struct {
		sms  int
		want string
	}{
		{18, "an SM budget of 18 blocks per rank exceeds device 0's 16 SMs"},
		{4, "8 rank(s) on device 0 × 4 blocks: deepep_dispatch: 32 blocks of 256 threads cannot all be resident at once"},
	} {
		cfg := DefaultConfig(sh.EP, tc.sms)
		cfg.Warps, cfg.MinBlocks = 8, 4
		c := devCase{sh: sh, cfg: cfg, devs: devs}
		got := runDevice(t, WithDeviceConfig(cfg), c, dt.Tagged(sh, 9), 1, false)
		if !dispatchers.IsUnavailable(got.err) || !strings.Contains(got.err.Error(), tc.want) {
			t.Errorf("--sms %d: %v; want unavailable: %q", tc.sms, got.err, tc.want)
		}
	}
}
