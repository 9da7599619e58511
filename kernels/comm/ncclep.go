package comm

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels/device"
)

// EP is NCCL EP (cuda.NCCLEP) over the ranks of a run, one GPU per rank:
// every rank's NCCL communicator (ncclCommInitRank, one unique id), its
// NCCL EP group and its expert-major handle, each made, used and
// destroyed from the rank's GPU thread (Threads) — NCCL EP's group
// creation, high-throughput handle update, dispatch and combine are
// collective: every rank calls them at once, each from its own thread.
// In a run that spans processes the communicators are the run's (World
// EP): each process creates its own ranks' groups over them, and the
// groups span every process's ranks. Its slices are indexed by rank of
// the run (nil for another process's).
type EP struct {
	Lib      *cuda.NCCLEP
	Config   cuda.EPGroupConfig
	th       *device.Threads
	rankOf   []int // each thread's rank (−1: none)
	gpus     []*device.CUDA
	streams  []device.Stream
	comms    []cuda.Comm
	ownComms bool // made by OpenEP (else the run's, which its owner closes)
	groups   []cuda.EPGroup
	handles  []cuda.EPHandle
}

// EPProcessRanks places a process's ranks in a run that spans processes: they
// are ranks First… of Ranks, each with its communicator in Comm (the run's
// communicator over every rank, NCCL's: NCCLComms), which NCCL EP's
// groups are created over. The zero EPProcessRanks is a run of one process.
type EPProcessRanks struct {
	Ranks, First int
	Comm         Comm
}

// EPProbe says why NCCL EP cannot run here, without GPUs: its library (and
// NCCL's, loaded first), NCCL's Device API, a CUDA 13 driver, and what its
// run-time compile needs (nvcc and headers). Lib is nil when the library
// did not load.
func EPProbe() (lib *cuda.NCCLEP, why []string) {
	lib, err := cuda.OpenNCCLEP()
	if err != nil {
		why = append(why, err.Error())
	} else if ok, no := lib.NCCL.DeviceAPI(); !ok {
		why = append(why, no)
	}
	switch v, _, err := cuda.Probe(); {
	case err != nil:
		why = append(why, "no CUDA driver: "+err.Error())
	case v < 13000:
		why = append(why, fmt.Sprintf("the CUDA driver supports CUDA %d.%d, and NCCL EP needs CUDA 13", v/1000, v%1000/10))
	}
	if lib != nil {
		for _, m := range cuda.FindEPRuntime(lib).Missing {
			why = append(why, "its run-time compile needs "+m)
		}
	}
	return lib, why
}

// EPMinCC is the oldest compute capability (×10) NCCL EP runs on: its
// kernels use Hopper's bulk copies.
const EPMinCC = 90

// EPMaxRanks is the most ranks of one node NCCL EP supports, EPMaxWorld
// the most of a run (its RELEASE.md: 8 nodes, 64 GPUs).
const (
	EPMaxRanks = 8
	EPMaxWorld = 64
)

// EPUnavailable says why NCCL EP cannot run on these devices (an
// environment limitation).
type EPUnavailable struct{ Reason string }

func (e *EPUnavailable) Error() string { return e.Reason }

// OpenEP makes rank r's communicator, group (c) and handle (top-k routing)
// on devs[r], its work on streams[r], each rank from its thread of th. In
// a run that spans processes (w not zero) devs and streams are this
// process's ranks', w.First… of w.Ranks, and their communicators w.Comm's.
func OpenEP(th *device.Threads, lib *cuda.NCCLEP, devs []device.Device, streams []device.Stream, c cuda.EPGroupConfig, topk int, w EPProcessRanks) (*EP, error) {
	var why []string
	if w.Ranks == 0 {
		w = EPProcessRanks{Ranks: len(devs)}
	}
	if w.First < 0 || w.First+len(devs) > w.Ranks || len(streams) != len(devs) {
		return nil, fmt.Errorf("NCCL EP over ranks %d… of %d with %d devices and %d streams", w.First, w.Ranks, len(devs), len(streams))
	}
	gpus := make([]*device.CUDA, w.Ranks)
	for i, d := range devs {
		r := w.First + i
		g, ok := d.(*device.CUDA)
		if !ok {
			return nil, &EPUnavailable{fmt.Sprintf("rank %d's device is %s: NCCL EP runs on GPUs", r, d.Name())}
		}
		gpus[r] = g
		if cc := g.CC(); cc < EPMinCC {
			why = append(why, fmt.Sprintf("GPU %d is sm_%d and NCCL EP needs sm_%d or later (Hopper's bulk copies)", g.Ordinal, cc, EPMinCC))
		}
		if q := slices.Index(devs, d); q < i && slices.Index(devs[q+1:], d)+q+1 == i { // r is the GPU's second rank
			why = append(why, fmt.Sprintf("ranks %d and %d share GPU %d: NCCL EP needs one GPU per rank (NCCL refuses a GPU twice; emulated EP cannot run it)", w.First+q, r, g.Ordinal))
		}
		if c.MaxSMs > g.SMs {
			why = append(why, fmt.Sprintf("--sms %d exceeds GPU %d's %d SMs (NCCL EP's max_num_sms must not)", c.MaxSMs, g.Ordinal, g.SMs))
		}
	}
	if len(devs) > EPMaxRanks {
		why = append(why, fmt.Sprintf("%d ranks on one node: NCCL EP supports at most %d per node", len(devs), EPMaxRanks))
	}
	if w.Ranks > EPMaxWorld {
		why = append(why, fmt.Sprintf("%d ranks: NCCL EP supports at most %d (8 nodes of 8 GPUs)", w.Ranks, EPMaxWorld))
	}
	var world NCCLComms
	if w.Comm != nil {
		var ok bool
		if world, ok = w.Comm.(NCCLComms); !ok {
			why = append(why, fmt.Sprintf("the run's communicator is %s, and NCCL EP's groups are created over NCCL's", w.Comm.Name()))
		}
	} else if w.Ranks != len(devs) {
		return nil, fmt.Errorf("NCCL EP over ranks %d… of %d: a run that spans processes gives the run's communicator", w.First, w.Ranks)
	}
	if why != nil {
		return nil, &EPUnavailable{strings.Join(dedupe(why), "; ")}
	}
	rankOf, err := threadRanks(th, devs)
	if err != nil {
		return nil, err
	}
	for i, r := range rankOf {
		if r >= 0 {
			rankOf[i] = w.First + r
		}
	}
	all := make([]device.Stream, w.Ranks)
	copy(all[w.First:], streams)
	e := &EP{Lib: lib, Config: c, th: th, rankOf: rankOf, gpus: gpus, streams: all, comms: make([]cuda.Comm, w.Ranks), ownComms: world == nil,
		groups: make([]cuda.EPGroup, w.Ranks), handles: make([]cuda.EPHandle, w.Ranks)}
	var id cuda.UniqueID
	if world == nil {
		if id, err = lib.NCCL.UniqueID(); err != nil {
			return nil, err
		}
	}
	err = e.each(func(r int, g *device.CUDA) error {
		if world != nil { // the run's communicator: NCCL EP's group spans every process's ranks
			if e.comms[r] = world.NCCLComm(r); e.comms[r] == nil {
				return fmt.Errorf("the run's communicator has no rank %d in this process", r)
			}
		} else {
			var err error
			if e.comms[r], err = lib.NCCL.InitRank(w.Ranks, id, r); err != nil {
				return err
			}
		}
		g.Drv.ContextChanged()
		if err := g.MakeCurrent(); err != nil {
			return err
		}
		var err error
		if e.groups[r], err = lib.CreateGroup(e.comms[r], c); err != nil {
			return err
		}
		g.Drv.ContextChanged()
		if err := g.MakeCurrent(); err != nil {
			return err
		}
		e.handles[r], err = lib.InitHandle(e.groups[r], topk)
		return err
	})
	if err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// dedupe keeps the first of equal reasons.
func dedupe(s []string) []string {
	var out []string
	for _, x := range s {
		dup := false
		for _, y := range out {
			dup = dup || x == y
		}
		if !dup {
			out = append(out, x)
		}
	}
	return out
}

// each runs f(rank, its GPU) on every rank's thread, the GPU's context
// current.
func (e *EP) each(f func(r int, g *device.CUDA) error) error {
	return e.th.Each(func(dev int) error {
		r := e.rankOf[dev]
		if r < 0 {
			return nil
		}
		if err := e.gpus[r].MakeCurrent(); err != nil {
			return err
		}
		if err := f(r, e.gpus[r]); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		return nil
	})
}

// call runs one library call of rank r (on its thread: the caller's
// error names the rank), in its GPU's context, which the library may
// change (it sets the communicator's device).
func (e *EP) call(r int, f func() error) error {
	g := e.gpus[r]
	if err := g.MakeCurrent(); err != nil {
		return err
	}
	err := f()
	g.Drv.ContextChanged()
	return err
}

// Tensors of a rank's buffers.
func epBF16(p device.Addr, dims ...int) cuda.EPTensor {
	return cuda.EPTensor{Data: p, Type: cuda.NCCLBfloat16, Dims: dims}
}
func epF32(p device.Addr, dims ...int) cuda.EPTensor {
	return cuda.EPTensor{Data: p, Type: cuda.NCCLFloat32, Dims: dims}
}
func epI32(p device.Addr, dims ...int) cuda.EPTensor {
	return cuda.EPTensor{Data: p, Type: cuda.NCCLInt32, Dims: dims}
}

// Update gives rank r's handle this step's routing idx [tokens, topk]
// (ncclEpUpdateHandle): in high-throughput mode a collective that writes
// r's received rows per local expert into counts [local] and their total
// into counts[local] (int32); in low-latency mode a host call.
func (e *EP) Update(r int, idx device.Addr, tokens, topk int, counts device.Addr, local int) error {
	var c, t cuda.EPTensor
	if e.Config.Algorithm == cuda.EPHighThroughput {
		c, t = epI32(counts, local), epI32(counts+device.Addr(4*local), 1)
	}
	return e.call(r, func() error {
		return e.Lib.UpdateHandle(e.handles[r], epI32(idx, tokens, topk), c, t, e.streams[r])
	})
}

// DispatchHT sends rank r's tokens x [tokens, hidden] and their routing
// weights w [tokens, topk] into the ranks' expert-major rows: r's own into
// out [rows, hidden] with their weights outW [rows] (high throughput).
func (e *EP) DispatchHT(r int, x, w device.Addr, tokens, hidden, topk int, out, outW device.Addr, rows int) error {
	return e.call(r, func() error {
		return e.Lib.Dispatch(e.handles[r], epBF16(x, tokens, hidden), epF32(w, tokens, topk), epBF16(out, rows, hidden), epF32(outW, rows), cuda.EPTensor{}, e.streams[r])
	})
}

// DispatchLL sends rank r's tokens x [tokens, hidden] into the ranks'
// expert zones: r's own into out [local, slots, hidden], each local
// expert's count into counts [local] (low latency).
func (e *EP) DispatchLL(r int, x device.Addr, tokens, hidden int, out device.Addr, local, slots int, counts device.Addr) error {
	return e.call(r, func() error {
		return e.Lib.Dispatch(e.handles[r], epBF16(x, tokens, hidden), cuda.EPTensor{}, epBF16(out, local, slots, hidden), cuda.EPTensor{}, epI32(counts, local), e.streams[r])
	})
}

// FP8 dispatch (--precision fp8) through NCCL EP's NCCL_EP_DISP_QUANT_FWD
// recipe: the tokens are e4m3 [tokens, hidden] (ncclFloat8e4m3), their
// scales fp32 [tokens, hidden/128], each forwarded as its bytes into the
// slots the bf16 dispatch fills.
func epE4M3(p device.Addr, dims ...int) cuda.EPTensor {
	return cuda.EPTensor{Data: p, Type: cuda.NCCLFloat8e4m3, Dims: dims}
}

// DispatchHTFP8 is DispatchHT of e4m3 tokens xq [tokens, hidden] with
// their scales xs [tokens, scales] into outQ [rows, hidden] and outS
// [rows, scales].
func (e *EP) DispatchHTFP8(r int, xq, xs, w device.Addr, tokens, hidden, scales, topk int, outQ, outS, outW device.Addr, rows int) error {
	return e.call(r, func() error {
		return e.Lib.DispatchForward(e.handles[r], epE4M3(xq, tokens, hidden), epF32(xs, tokens, scales), epF32(w, tokens, topk),
			epE4M3(outQ, rows, hidden), epF32(outS, rows, scales), epF32(outW, rows), cuda.EPTensor{}, e.streams[r])
	})
}

// DispatchLLFP8 is DispatchLL of e4m3 tokens xq [tokens, hidden] with
// their scales xs [tokens, scales] into outQ [local, slots, hidden] and
// outS [local, slots, scales].
func (e *EP) DispatchLLFP8(r int, xq, xs device.Addr, tokens, hidden, scales int, outQ, outS device.Addr, local, slots int, counts device.Addr) error {
	return e.call(r, func() error {
		return e.Lib.DispatchForward(e.handles[r], epE4M3(xq, tokens, hidden), epF32(xs, tokens, scales), cuda.EPTensor{},
			epE4M3(outQ, local, slots, hidden), epF32(outS, local, slots, scales), cuda.EPTensor{}, epI32(counts, local), e.streams[r])
	})
}

// CombineHT returns rank r's expert outputs y [rows, hidden] to their
// tokens' ranks and sums r's tokens' into out [tokens, hidden] (high
// throughput: the outputs carry their routing weights already).
func (e *EP) CombineHT(r int, y device.Addr, rows, hidden int, out device.Addr, tokens int) error {
	return e.call(r, func() error {
		return e.Lib.Combine(e.handles[r], epBF16(y, rows, hidden), epBF16(out, tokens, hidden), cuda.EPTensor{}, e.streams[r])
	})
}

// CombineLL returns rank r's expert outputs y [local, slots, hidden] and
// sums r's tokens' weighted by their routing weights w [tokens, topk]
// into out [tokens, hidden] (low latency).
func (e *EP) CombineLL(r int, y device.Addr, local, slots, hidden int, out, w device.Addr, tokens, topk int) error {
	return e.call(r, func() error {
		return e.Lib.Combine(e.handles[r], epBF16(y, local, slots, hidden), epBF16(out, tokens, hidden), epF32(w, tokens, topk), e.streams[r])
	})
}

// DispatchHTBackward sends rank r's output gradients dy [tokens, hidden]
// into the slots the forward's dispatch filled over the handle's routing:
// r's own into out [rows, hidden] (high throughput's backward dispatch).
func (e *EP) DispatchHTBackward(r int, dy device.Addr, tokens, hidden int, out device.Addr, rows int) error {
	return e.call(r, func() error {
		return e.Lib.DispatchBackward(e.handles[r], epBF16(dy, tokens, hidden), epBF16(out, rows, hidden), e.streams[r])
	})
}

// CombineHTBackward returns rank r's slots' input gradients dx [rows,
// hidden] and probability gradients dp [rows] to their tokens' ranks: r's
// tokens' summed into out [tokens, hidden], their k probability gradients
// into outP [tokens, topk] (high throughput's backward combine).
func (e *EP) CombineHTBackward(r int, dx, dp device.Addr, rows, hidden int, out, outP device.Addr, tokens, topk int) error {
	return e.call(r, func() error {
		return e.Lib.CombineBackward(e.handles[r], epBF16(dx, rows, hidden), epF32(dp, rows), epBF16(out, tokens, hidden), epF32(outP, tokens, topk), e.streams[r])
	})
}

// Close destroys every rank's handle, group and communicator (the run's
// communicators are left to their owner) on its thread.
func (e *EP) Close() error {
	return e.each(func(r int, g *device.CUDA) error {
		var first error
		keep := func(err error) {
			if first == nil {
				first = err
			}
		}
		if e.handles[r] != nil {
			keep(e.Lib.DestroyHandle(e.handles[r]))
			e.handles[r] = nil
		}
		if e.groups[r] != nil {
			keep(e.Lib.DestroyGroup(e.groups[r]))
			e.groups[r] = nil
		}
		if e.comms[r] != nil && e.ownComms {
			keep(e.Lib.NCCL.Destroy(e.comms[r]))
		}
		e.comms[r] = nil
		g.Drv.ContextChanged()
		return first
	})
}

// Timeout is the bound NCCL EP's waits are given.
func (e *EP) Timeout() time.Duration { return e.Config.Timeout }
