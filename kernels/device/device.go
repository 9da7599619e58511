package device

import (
	"fmt"
	"unsafe"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
)

// Device is where the layer's device pipeline runs: a GPU (CUDA) or Emu,
// which keeps "device" memory on the host and runs this package's host
// functions so that the pipeline's bookkeeping (offsets, copies, orders,
// events) is tested without a GPU. Tensors are row-major; bf16 tensors hold
// 16-bit words. All work is queued on a stream; Download waits for it.
type Device interface {
	Name() string
	Alloc(bytes int64) (Addr, error)
	Free(p Addr) error
	// Upload copies a []uint16, []float32, []int32 or []uint64 to dst on s; src may be
	// reused when it returns.
	Upload(dst Addr, src any, s Stream) error
	// Download copies src into a []uint16, []float32 or []int32 after the
	// work queued on s.
	Download(dst any, src Addr, s Stream) error
	Copy(dst, src Addr, bytes int64, s Stream) error
	// CopySM copies as Copy does, with a kernel (16-byte vectors: bytes
	// and both addresses multiples of 16) rather than the copy engines.
	CopySM(dst, src Addr, bytes int64, s Stream) error
	// DownloadAsync queues a copy of bytes from src into mapped host
	// memory dst (AllocMapped) on s and returns at once; the host may read
	// dst once it has waited for s (SyncStream).
	DownloadAsync(dst MappedHost, src Addr, bytes int64, s Stream) error
	// CopyPeer queues op, whose sides may be on other devices (peer GPUs),
	// on s, a stream of this device.
	CopyPeer(op CopyOp, s Stream) error
	// CopyBatch queues copies on s, in no set order among themselves, the
	// way most likely to leave the SMs to concurrent kernels: on CUDA one
	// batch per pair of GPUs with the hint to prefer the copy engines where
	// the driver has it (see BatchMethod), else one copy each.
	CopyBatch(ops []CopyOp, s Stream) error
	// Reaches reports whether this device can access peer's memory
	// directly (peer access between GPUs; a device reaches itself). Copies
	// between devices that do not reach each other still work, through
	// host memory.
	Reaches(peer Device) bool
	// BatchMethod says how CopyBatch copies, for records.
	BatchMethod() string
	Fill16(p Addr, v uint16, n int64, s Stream) error

	NewStream() (Stream, error)
	NewEvent() (Event, error)
	Record(e Event, s Stream) error
	Wait(s Stream, e Event) error // s waits for e's work
	SyncStream(s Stream) error
	Elapsed(start, end Event) (ms float64, err error) // both recorded and complete

	// GEMM: c[m,n] = a[m,k] · w[n,k]ᵀ, bf16 a and w, fp32 accumulation; c is
	// bf16, or fp32 when f32Out.
	GEMM(c, a, w Addr, m, n, k int, f32Out bool, s Stream) error
	// GroupedGEMM runs the groups' GEMMs (bf16 out, the same n and k) as
	// one grouped call; GroupedGEMMName names it, or says why the device has
	// none (then GroupedGEMM fails).
	GroupedGEMM(groups []Group, n, k int, s Stream) error
	GroupedGEMMName() (name string, ok bool)
	// RouterTopK: idx [T,k] int32 and probs [T,k] fp32 from fp32 logits
	// [T,E] and the selection bias (0: none), as Route.
	RouterTopK(rc kernels.RouterConfig, logits, bias Addr, tokens int, idx, probs Addr, s Stream) error
	// PermuteOrder: rows [n] (permuted row → slot), pos [n] (slot → row) and
	// counts [experts] int32 of idx [n], as the host PermuteOrder.
	PermuteOrder(idx Addr, n, experts int, rows, pos, counts Addr, s Stream) error
	// GatherRows: dst[i,:] = src[rows[i]/div,:] for i < n, bf16 rows of hidden.
	GatherRows(dst, src, rows Addr, div, n, hidden int, s Stream) error
	// GatherF32: dst[i] = src[rows[i]/div] for i < n.
	GatherF32(dst, src, rows Addr, div, n int, s Stream) error
	// SortChunks reorders rows of hidden bf16 (and their fp32 probs when
	// probsIn is not 0) from [source][local] chunk order to [local][source],
	// or back when inverse; counts [ep·local] int32 are in [source][local]
	// order.
	SortChunks(dst, probsOut, src, probsIn, counts Addr, rows, ep, local, hidden int, inverse bool, s Stream) error
	// SwiGLU: act [n,ffn] = silu(gate)·up·prob of h1 [n,2·ffn]; prob 0 means 1.
	SwiGLU(act, h1, prob Addr, n, ffn int, s Stream) error
	// UnpermuteSum: out[t,:] = bf16(sum of src[pos[t·k+j],:] in row order),
	// then bf16(out + shared[t,:]) when shared is not 0.
	UnpermuteSum(out, src, pos, shared Addr, tokens, topk, hidden int, s Stream) error

	// The backward's (devbackward.go). MatMul: the product mm (dgrad,
	// wgrad into fp32 main_grad, the fp32 router's).
	MatMul(mm MatMul, s Stream) error
	// SwiGLUBackward: dh1 [n,2·ffn] bf16 and dprob [n] fp32 from dact
	// [n,ffn] bf16, h1 [n,2·ffn] bf16 and prob [n] fp32, as
	// SwiGLUProbBackward; prob 0 means 1 and dprob is not written.
	SwiGLUBackward(dh1, dprob, dact, h1, prob Addr, n, ffn int, s Stream) error
	// ScoreBackward: dlogits [T,E] fp32 from the logits [T,E], dprobs
	// [T,k] fp32 and idx [T,k] int32, as the host ScoreBackward.
	ScoreBackward(rc kernels.RouterConfig, dlogits, logits, dprobs, idx Addr, tokens int, s Stream) error
	// InputGrad: dx = bf16(bf16(dperm + bf16(drouter)) + dshared), n
	// values: dperm, dshared and dx bf16, drouter fp32; drouter or dshared
	// 0 is left out.
	InputGrad(dx, dperm, drouter, dshared Addr, n int, s Stream) error
	// AddF32: dst[i] += src[i], n fp32 values, each rounded to bf16 first
	// when round.
	AddF32(dst, src Addr, n int, round bool, s Stream) error

	// The machinery of SM-driven dispatchers (resident.go, signals.go).
	// AllocMapped allocates host memory that kernels of every device read
	// and write at its device address, and the host at its host address
	// (page-locked, mapped): signals the host polls.
	AllocMapped(bytes int64) (MappedHost, error)
	FreeMapped(m MappedHost) error
	// SMCount is the device's SM count, the ceiling of an SM budget.
	SMCount() int
	// LaunchResident queues this device's part of collective c on s: grid
	// blocks of c.Prog that are all resident at once, each holding one SM
	// alone (so that an SM budget counts SMs), or a *ResidencyError when
	// they cannot be (see Collective).
	LaunchResident(c *Collective, grid int, s Stream, args ...any) error
	// Residency is how many blocks of a resident launch of p one SM holds
	// at once: one (each holds an SM), or 0 when none fits.
	Residency(p *Program) (int, error)
	// LaunchProgram queues a plain launch of grid blocks of p on s, for
	// kernels that wait on no other block (Emu runs p.Twin with this one
	// part at once).
	LaunchProgram(p *Program, grid int, s Stream, args ...any) error

	Close() error
}

// Device handles: addresses, streams and events (the cuda package's types;
// Emu makes its own values of them).
type (
	Addr   = cuda.DevicePtr
	Stream = cuda.Stream
	Event  = cuda.Event
)

// CopyOp is one copy: Bytes from Src on SrcDev to Dst on DstDev; a nil
// device is the one the copy is queued on.
type CopyOp struct {
	Dst, Src       Addr
	Bytes          int64
	DstDev, SrcDev Device
}

// RowBuffer is a device buffer sized by a row count: where its address is kept and
// its bytes per row (a fixed-size buffer is one row).
type RowBuffer struct {
	P      *Addr
	PerRow int64
}

// Resize frees those of bufs that are allocated and allocates each for rows
// rows (at least one); it returns the bytes they now hold. The caller makes
// sure no queued work still uses the old memory.
func Resize(dev Device, rows int, bufs ...RowBuffer) (int64, error) {
	rows = max(rows, 1)
	for _, b := range bufs {
		if *b.P != 0 {
			if err := dev.Free(*b.P); err != nil {
				return 0, err
			}
			*b.P = 0
		}
	}
	var held int64
	for _, b := range bufs {
		p, err := dev.Alloc(int64(rows) * b.PerRow)
		if err != nil {
			return held, err
		}
		*b.P, held = p, held+int64(rows)*b.PerRow
	}
	return held, nil
}

// RowCapacity tracks device buffers sized by a row count that only grows (a run's
// routing is fixed, so they grow in its first step only).
type RowCapacity struct {
	Rows  int   // rows the buffers hold
	Bytes int64 // bytes they hold
}

// Ensure makes bufs hold at least rows rows. Growing waits for the work
// queued on s, which may still use the old buffers, and does not keep their
// contents.
func (z *RowCapacity) Ensure(dev Device, s Stream, rows int, bufs ...RowBuffer) error {
	if rows <= z.Rows && *bufs[0].P != 0 {
		return nil
	}
	if err := dev.SyncStream(s); err != nil {
		return err
	}
	var err error
	z.Bytes, err = Resize(dev, rows, bufs...)
	z.Rows = max(rows, 1)
	return err
}

// Free frees the allocated buffers among ps and zeroes their addresses; it
// returns the first error.
func Free(dev Device, ps ...*Addr) error {
	var first error
	for _, p := range ps {
		if *p != 0 {
			if err := dev.Free(*p); err != nil && first == nil {
				first = err
			}
			*p = 0
		}
	}
	return first
}

// Hardware reports whether d runs its kernels on a GPU: a CUDA device
// whose compiler's images run on one (NVRTC, or a wrapper of it). Emu, and
// a CUDA device on a fake driver whose kernels are compiled for the CPU
// (internal/hostsim), simulate one: their kernels take the host's CPUs.
func Hardware(d Device) bool {
	c, ok := d.(*CUDA)
	return ok && c.JIT != nil && c.JIT.Compiler != nil && c.JIT.Compiler.GPU()
}

// HostBytes is the memory of a host slice Upload and Download accept
// ([]uint16, []float32, []int32 or []uint64 addresses), as bytes.
func HostBytes(v any) ([]byte, error) {
	view := func(p unsafe.Pointer, n int) []byte {
		if n == 0 {
			return nil
		}
		return unsafe.Slice((*byte)(p), n)
	}
	switch s := v.(type) {
	case []uint16:
		return view(unsafe.Pointer(unsafe.SliceData(s)), 2*len(s)), nil
	case []float32:
		return view(unsafe.Pointer(unsafe.SliceData(s)), 4*len(s)), nil
	case []int32:
		return view(unsafe.Pointer(unsafe.SliceData(s)), 4*len(s)), nil
	case []uint64:
		return view(unsafe.Pointer(unsafe.SliceData(s)), 8*len(s)), nil
	}
	return nil, fmt.Errorf("host buffer of type %T: want []uint16, []float32, []int32 or []uint64", v)
}
