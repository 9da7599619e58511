package harnesstest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels/device"
)

// The device pipeline on device.Emu: the same bookkeeping the GPU runs
// (buffers, offsets, copies between ranks, chunk sorts, rounding points),
// executed by the host functions. It must give the host layer's output bit
// for bit, pass the check, and fail it when a copy goes wrong. This proves
// nothing about the CUDA kernels themselves (kernels/comm/cuda_test.go does,
// on a GPU).

func DeviceCases() map[string]setup.Config {
	base := Small()
	base.Device = "cuda"
	sig := base
	sig.Score, sig.Groups, sig.GroupTopK, sig.TopKScale, sig.SharedExperts = "sigmoid", 4, 2, 2.5, 1
	sig.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.2}
	one := base
	one.EP, one.SharedExperts = 1, 0
	bal := base
	bal.Routing, bal.EP = setup.Routing{Kind: setup.RoutingBalanced}, 8
	pre := base
	pre.TopK, pre.PreSoftmax = 1, true
	return map[string]setup.Config{"softmax-natural": base, "sigmoid-groups-skewed-shared": sig, "ep1": one, "balanced-ep8": bal, "pre-softmax-top1": pre}
}

// Emus opens k Emus as a run's devices, or fewer when the run wants fewer.
func Emus(k int) func(n, most int) ([]device.Device, error) {
	return func(n, most int) ([]device.Device, error) {
		if n == 0 {
			n = min(k, most)
		}
		if n > k {
			return nil, fmt.Errorf("%d devices wanted, %d emulated", n, k)
		}
		devs := make([]device.Device, n)
		for i := range devs {
			devs[i] = &device.Emu{}
		}
		return devs, nil
	}
}

// OneDevice opens dev as a run's only device.
func OneDevice(dev device.Device) func(n, most int) ([]device.Device, error) {
	return func(int, int) ([]device.Device, error) { return []device.Device{dev}, nil }
}

// DropCopy is Emu with one device-to-device copy lost, or, with garble,
// delivering all-ones bytes (NaN in bf16 and fp32) instead of its source.
type DropCopy struct {
	device.Emu
	N, Drop int
	Garble  bool
}

func (d *DropCopy) CopyPeer(op device.CopyOp, s device.Stream) error {
	d.N++
	if d.N == d.Drop {
		if d.Garble {
			return d.Fill16(op.Dst, 0xffff, op.Bytes/2, s)
		}
		return nil
	}
	return d.Emu.CopyPeer(op, s)
}

// Copy and CopyBatch lose copies the way CopyPeer does.
func (d *DropCopy) Copy(dst, src device.Addr, bytes int64, s device.Stream) error {
	return d.CopyPeer(device.CopyOp{Dst: dst, Src: src, Bytes: bytes}, s)
}

func (d *DropCopy) CopyBatch(ops []device.CopyOp, s device.Stream) error {
	for _, o := range ops {
		if err := d.CopyPeer(o, s); err != nil {
			return err
		}
	}
	return nil
}

// FEPLBCase is a skewed layer whose FEPLB plan moves work inside 2-rank
// domains. The device plans with the H100 roofline, under which a chunk's
// copy hides behind the helper's static experts only when a token costs
// less to copy than to compute (ffn above about 870) and the weights copy
// is short next to the static experts' weight reads: narrow rows, a wide
// ffn and 16 experts per rank (cheap on Emu).
func FEPLBCase() setup.Config {
	c := DeviceCases()["softmax-natural"]
	c.Dispatcher, c.Routing, c.EP, c.Domain = "feplb", setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.2}, 4, 2
	c.Experts, c.TopK, c.Tokens, c.Hidden, c.FFN = 64, 4, 32, 8, 1024
	return c
}

// SplitCase is feplb-split on a trace of top-1 routing where expert 0 takes
// half the tokens and every expert one at least (so that each helper has
// static work to hide its copies behind): its plan splits expert 0 over the
// owner and two helpers, the only expert with enough tokens to move. It
// returns the tokens routed to each expert too.
func SplitCase(t *testing.T) (setup.Config, []int) {
	c := FEPLBCase()
	c.EP, c.Domain, c.Experts, c.TopK, c.Tokens, c.FeplbPolicy = 4, 4, 128, 1, 64, "feplb-split"
	c.PreSoftmax = true // top-1 softmax routing needs it (Megatron's rule)
	counts := slices.Repeat([]int{1}, c.Experts)
	counts[0] += c.Tokens*c.EP - c.Experts
	var b strings.Builder
	for e, n := range counts {
		b.WriteString(strings.Repeat(fmt.Sprintf("%d\n", e), n))
	}
	c.Routing = setup.Routing{Kind: setup.RoutingTrace, File: filepath.Join(t.TempDir(), "hot.txt")}
	if err := os.WriteFile(c.Routing.File, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return c, counts
}

// BatchLog is Emu that logs each copy batch's stream and first destination.
type BatchLog struct {
	device.Emu
	Batches []loggedBatch
}

type loggedBatch struct {
	S   device.Stream
	Dst device.Addr
}

func (b *BatchLog) CopyBatch(ops []device.CopyOp, s device.Stream) error {
	if len(ops) > 0 {
		b.Batches = append(b.Batches, loggedBatch{s, ops[0].Dst})
	}
	return b.Emu.CopyBatch(ops, s)
}

// OpenGPU opens GPU 0, or skips (fails under MOEBENCH_REQUIRE_GPU=1).
func OpenGPU(t *testing.T) *device.CUDA {
	t.Helper()
	dev, err := device.OpenCUDA(0, "")
	if err != nil {
		if os.Getenv("MOEBENCH_REQUIRE_GPU") == "1" {
			t.Fatalf("GPU required: %v", err)
		}
		t.Skipf("no GPU: %v", err)
	}
	return dev
}

// FailGrouped is Emu whose grouped GEMM fails.
type FailGrouped struct{ device.Emu }

func (*FailGrouped) GroupedGEMM([]device.Group, int, int, device.Stream) error {
	return errors.New("grouped GEMM refused")
}

// Island is an Emu that reaches no other device (GPUs without peer access).
type Island struct{ device.Emu }

func (i *Island) Reaches(d device.Device) bool { return d == device.Device(i) }

// CountingEmu counts the chunk sorts and copies between ranks it runs.
type CountingEmu struct {
	device.Emu
	Sorts, PeerCopies int
}

func (c *CountingEmu) SortChunks(dst, probsOut, src, probsIn, counts device.Addr, rows, ep, local, hidden int, inverse bool, s device.Stream) error {
	c.Sorts++
	return c.Emu.SortChunks(dst, probsOut, src, probsIn, counts, rows, ep, local, hidden, inverse, s)
}

func (c *CountingEmu) CopyPeer(op device.CopyOp, s device.Stream) error {
	c.PeerCopies++
	return c.Emu.CopyPeer(op, s)
}

// WaitingEmu counts the host's blocking downloads and the asynchronous
// ones, and makes every wait for a stream take a while, as a GPU's would.
type WaitingEmu struct {
	device.Emu
	Downloads, Async int
	WaitFor          time.Duration
}

func (w *WaitingEmu) Download(dst any, src device.Addr, s device.Stream) error {
	w.Downloads++
	return w.Emu.Download(dst, src, s)
}

func (w *WaitingEmu) DownloadAsync(dst device.MappedHost, src device.Addr, bytes int64, s device.Stream) error {
	w.Async++
	return w.Emu.DownloadAsync(dst, src, bytes, s)
}

func (w *WaitingEmu) SyncStream(s device.Stream) error {
	time.Sleep(w.WaitFor)
	return w.Emu.SyncStream(s)
}
