package bench

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	_ "github.com/moebench/moebench/dispatchers/all"
	"github.com/moebench/moebench/dispatchers/alltoall"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels/device"
)

// The layers the benchmarks' tests run, and the devices they run them on
// (the same as package harness's tests').

// small is a small host layer.
func small() setup.Config {
	c := setup.DefaultConfig()
	c.Device = "host"
	c.Tokens, c.Hidden, c.FFN, c.EP, c.Warmup, c.Iters = 32, 64, 32, 4, 1, 2
	return c
}

// sigmoidCase is a cuda layer with sigmoid group-limited routing, skewed,
// and a shared expert.
func sigmoidCase() setup.Config {
	c := small()
	c.Device = "cuda"
	c.Score, c.Groups, c.GroupTopK, c.TopKScale, c.SharedExperts = "sigmoid", 4, 2, 2.5, 1
	c.Routing = setup.Routing{Kind: setup.RoutingSkewed, Alpha: 1.2}
	return c
}

// fp8Config is a small host layer at fp8 with four 1×128 blocks a row.
func fp8Config(dispatcher string) setup.Config {
	c := small()
	c.Hidden, c.Precision, c.Dispatcher, c.CheckAll = 512, setup.PrecisionFP8, dispatcher, true
	return c
}

// emus opens k Emus as a run's devices, or fewer when the run wants fewer.
func emus(k int) func(n, most int) ([]device.Device, error) {
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

// dropCopy is Emu with one device-to-device copy lost.
type dropCopy struct {
	device.Emu
	n, drop int
}

func (d *dropCopy) CopyPeer(op device.CopyOp, s device.Stream) error {
	if d.n++; d.n == d.drop {
		return nil
	}
	return d.Emu.CopyPeer(op, s)
}

// Copy and CopyBatch lose copies the way CopyPeer does.
func (d *dropCopy) Copy(dst, src device.Addr, bytes int64, s device.Stream) error {
	return d.CopyPeer(device.CopyOp{Dst: dst, Src: src, Bytes: bytes}, s)
}

func (d *dropCopy) CopyBatch(ops []device.CopyOp, s device.Stream) error {
	for _, o := range ops {
		if err := d.CopyPeer(o, s); err != nil {
			return err
		}
	}
	return nil
}

// broken wraps alltoall and swaps the first and last rows delivered to rank
// 0 (copies of different tokens): a dispatcher bug the round trip must
// catch.
type broken struct {
	*alltoall.A2A
	ranks  []*dispatchers.Rank
	hidden int
}

func (b *broken) Name() string { return "broken" }

func (b *broken) Bind(s dispatchers.Shape, ranks []*dispatchers.Rank) error {
	b.ranks, b.hidden = ranks, s.Hidden
	return b.A2A.Bind(s, ranks)
}

// Forward is alltoall's with Dispatch in place of its dispatch.
func (b *broken) Forward(experts func(rank int) error) []dispatchers.Step {
	steps := b.A2A.Forward(experts)
	for i := range steps {
		if steps[i].Name == "dispatch" {
			steps[i].Run = b.Dispatch
		}
	}
	return steps
}

func (b *broken) Dispatch(r int) error {
	if err := b.A2A.Dispatch(r); err != nil || r != 0 {
		return err
	}
	x, h := b.ranks[0].ExpertX, b.hidden
	last := len(x) - h
	for j := range h {
		x[j], x[last+j] = x[last+j], x[j]
	}
	return nil
}

func init() {
	dispatchers.Register("broken", func(impl string, env dispatchers.Env) (dispatchers.Dispatcher, error) {
		d, err := alltoall.New(impl, env)
		if err != nil {
			return nil, err
		}
		return &broken{A2A: d.(*alltoall.A2A)}, nil
	})
}
