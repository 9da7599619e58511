package device

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/moebench/moebench/kernels"
)

// Emu is a Device on host memory that runs this package's host functions,
// one call at a time, in the order queued (streams run their work at once;
// events record the wall clock). It proves the device pipeline's
// bookkeeping — buffer sizes, offsets, copies between ranks, chunk orders,
// the rounding points — against the reference without a GPU, and checks
// that the streams' work is ordered as a GPU needs it (see order.go). Its
// timings mean nothing and it is never offered as a device to users.
//
// Several Emus stand for several GPUs: each has its own address range, and
// its streams and events belong to it, so that using one rank's buffer,
// stream or event on another rank's device fails as it would on GPUs.
// Each Emu may be used from its own thread (Threads), as GPUs are: a
// peer's copy may look its memory up while it allocates.
type Emu struct {
	// SMs is the SM count it reports (SMCount; 0: 132, an H100's), the
	// most blocks of a resident launch (resident.go).
	SMs int
	// Shared is the shared memory a block may have (SharedPerBlock; 0:
	// none known), as a GPU's opt-in limit bounds it.
	Shared int
	mu     sync.Mutex // next and allocs
	next   Addr
	allocs []*emuAlloc // sorted by base
}

type emuAlloc struct {
	base Addr
	mem  []byte
	acc  []access // accesses the host may not have waited for (order.go)
}

type emuEvent struct {
	t      time.Time
	owner  *Emu
	stream int32       // the stream of its last Record
	clock  VectorClock // that stream's clock at the Record
}
type emuStream struct {
	owner   *Emu
	id      int32
	clock   VectorClock
	pending string // a collective launch queued on it that waits for its other parts (resident.go)
}

// emuSpaces hands each Emu its own 2⁴⁰-byte address range.
var emuSpaces atomic.Uint64

// EmuBacked is a device whose memory is an Emu's (Emu, and test devices that
// embed it).
type EmuBacked interface{ BackingEmu() *Emu }

func (e *Emu) BackingEmu() *Emu { return e }

// of is the Emu holding d's memory (e when d is nil).
func (e *Emu) of(d Device) (*Emu, error) {
	if d == nil {
		return e, nil
	}
	if b, ok := d.(EmuBacked); ok {
		return b.BackingEmu(), nil
	}
	return nil, fmt.Errorf("emu: a copy with a %s device", d.Name())
}

// TakeStream checks that s is one of e's streams (nil passes: internal copies)
// and takes work: it waits until no collective launch on it waits for its
// other parts (queued from other devices' threads), at most
// collectiveWait.
func (e *Emu) TakeStream(s Stream) error {
	if s == nil {
		return nil
	}
	st := (*emuStream)(unsafe.Pointer(s))
	if st.owner != e {
		return fmt.Errorf("emu: a stream of another device")
	}
	if kernel := waitPending(st); kernel != "" {
		return fmt.Errorf("emu: work on a stream whose collective launch of %s still waits for its other parts after %v (Emu runs it when the last is queued: every part must be queued, each from its device's thread)", kernel, CollectiveWait)
	}
	return nil
}

func (e *Emu) Name() string { return "emu" }

func (e *Emu) Alloc(bytes int64) (Addr, error) {
	if bytes < 0 {
		return 0, fmt.Errorf("emu: allocation of %d bytes", bytes)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.next == 0 {
		e.newSpace()
	}
	base := e.next
	e.next += Addr(bytes+256+255) &^ 255 // a gap after each allocation: overruns do not land in a neighbour
	mem := make([]byte, bytes)
	Poison(mem)
	e.allocs = append(e.allocs, &emuAlloc{base: base, mem: mem})
	return base, nil
}

// Poison16 is the 16-bit word every simulated allocation (Emu's, and the fake
// libcuda's cuMemAlloc and cuMemHostAlloc) starts filled with. cuMemAlloc's
// memory is not cleared — a GPU hands back what a freed buffer held — so
// code that reads memory it never wrote must fail on the CPU too: bf16, fp16,
// fp32 and fp8 read it as NaN, an int32 counter, flag or epoch as 2147450879,
// an int64 as a huge count, a pointer as a non-canonical address. What must
// start at zero is zeroed on its stream (Fill16) before its first use.
const Poison16 uint16 = 0x7FFF

// Poison fills b with Poison16 (little-endian; an odd last byte gets its low
// half).
func Poison(b []byte) {
	for i := range b {
		b[i] = byte(Poison16 >> (8 * (i & 1)))
	}
}

func (e *Emu) Free(p Addr) error {
	find := func() (int, bool) {
		return slices.BinarySearchFunc(e.allocs, p, func(a *emuAlloc, p Addr) int { return cmpPtr(a.base, p) })
	}
	e.mu.Lock()
	i, ok := find()
	var a *emuAlloc
	if ok {
		a = e.allocs[i]
	}
	e.mu.Unlock()
	if !ok {
		return fmt.Errorf("emu: free of %#x, which is not an allocation", uint64(p))
	}
	if op := a.pending(); op != "" { // order's lock, not e.mu's: queue takes e.mu under it
		return fmt.Errorf("emu: stream order: free of %#x, which %s may still use (the host has not waited for it)", uint64(p), op)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if i, ok = find(); ok {
		e.allocs = slices.Delete(e.allocs, i, i+1)
	}
	return nil
}

func cmpPtr(a, b Addr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// alloc is the allocation holding [p, p+n).
func (e *Emu) alloc(p Addr, n int64) (*emuAlloc, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	i := sort.Search(len(e.allocs), func(i int) bool { return e.allocs[i].base > p }) - 1
	if i < 0 || n < 0 || p+Addr(n) > e.allocs[i].base+Addr(len(e.allocs[i].mem)) {
		return nil, fmt.Errorf("emu: [%#x, +%d bytes) is outside every allocation", uint64(p), n)
	}
	return e.allocs[i], nil
}

// BytesAt is the memory [p, p+n) within one allocation.
func (e *Emu) BytesAt(p Addr, n int64) ([]byte, error) {
	a, err := e.alloc(p, n)
	if err != nil {
		return nil, err
	}
	off := p - a.base
	return a.mem[off : off+Addr(n)], nil
}

// view is n elements of T at p.
func view[T uint16 | float32 | int32](e *Emu, p Addr, n int) ([]T, error) {
	var z T
	b, err := e.BytesAt(p, int64(n)*int64(unsafe.Sizeof(z)))
	if err != nil || n == 0 {
		return nil, err
	}
	if uintptr(unsafe.Pointer(&b[0]))%unsafe.Alignof(z) != 0 {
		return nil, fmt.Errorf("emu: %#x is not aligned for %T", uint64(p), z)
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n), nil
}

func (e *Emu) Upload(dst Addr, src any, s Stream) error {
	h, err := HostBytes(src)
	if err != nil {
		return err
	}
	if err := e.Enqueue("Upload", s, e.WriteSpan(dst, int64(len(h)))); err != nil {
		return err
	}
	b, err := e.BytesAt(dst, int64(len(h)))
	copy(b, h)
	return err
}

func (e *Emu) Download(dst any, src Addr, s Stream) error {
	h, err := HostBytes(dst)
	if err != nil {
		return err
	}
	if err := e.Enqueue("Download", s, e.ReadSpan(src, int64(len(h)))); err != nil {
		return err
	}
	b, err := e.BytesAt(src, int64(len(h)))
	copy(h, b)
	hostWaited(s)
	return err
}

// CopySM is Copy, with CUDA's conditions.
func (e *Emu) CopySM(dst, src Addr, bytes int64, s Stream) error {
	if bytes%16 != 0 || dst%16 != 0 || src%16 != 0 {
		return fmt.Errorf("emu: SM copy of %d bytes from %#x to %#x: bytes and addresses must be multiples of 16", bytes, uint64(src), uint64(dst))
	}
	return e.Copy(dst, src, bytes, s)
}

// DownloadAsync: a copy into the mapped memory's Emu bytes.
func (e *Emu) DownloadAsync(dst MappedHost, src Addr, bytes int64, s Stream) error {
	if bytes > dst.Bytes {
		return fmt.Errorf("emu: download of %d bytes into %d bytes of mapped memory", bytes, dst.Bytes)
	}
	return e.Copy(dst.Dev, src, bytes, s)
}

func (e *Emu) Copy(dst, src Addr, bytes int64, s Stream) error {
	return e.CopyPeer(CopyOp{Dst: dst, Src: src, Bytes: bytes}, s)
}

func (e *Emu) CopyPeer(op CopyOp, s Stream) error {
	de, err := e.of(op.DstDev)
	if err != nil {
		return err
	}
	se, err := e.of(op.SrcDev)
	if err != nil {
		return err
	}
	d, err := de.BytesAt(op.Dst, op.Bytes)
	if err != nil {
		return err
	}
	b, err := se.BytesAt(op.Src, op.Bytes)
	if err != nil {
		return err
	}
	if err := e.Enqueue("Copy", s, se.ReadSpan(op.Src, op.Bytes), de.WriteSpan(op.Dst, op.Bytes)); err != nil {
		return err
	}
	copy(d, b)
	return nil
}

func (e *Emu) CopyBatch(ops []CopyOp, s Stream) error {
	for _, o := range ops {
		if err := e.CopyPeer(o, s); err != nil {
			return err
		}
	}
	return nil
}

// Reaches: emulated devices share the host's memory.
func (e *Emu) Reaches(Device) bool { return true }

func (e *Emu) BatchMethod() string { return "emulated: host memory copies" }

func (e *Emu) Fill16(p Addr, v uint16, n int64, s Stream) error {
	if err := e.Enqueue("Fill16", s, e.WriteSpan(p, 2*n)); err != nil {
		return err
	}
	w, err := view[uint16](e, p, int(n))
	for i := range w {
		w[i] = v
	}
	return err
}

func (e *Emu) NewStream() (Stream, error) {
	return Stream(unsafe.Pointer(&emuStream{owner: e, id: newStreamID(), clock: VectorClock{}})), nil
}
func (e *Emu) NewEvent() (Event, error) { return Event(unsafe.Pointer(&emuEvent{owner: e})), nil }

// Wait: the event may be another device's, as on CUDA.
func (e *Emu) Wait(s Stream, ev Event) error {
	if err := e.TakeStream(s); err != nil || s == nil {
		return err
	}
	OrderAfter(s, (*emuEvent)(unsafe.Pointer(ev)).clock)
	return nil
}

func (e *Emu) SyncStream(s Stream) error {
	if err := e.TakeStream(s); err != nil {
		return err
	}
	hostWaited(s)
	return nil
}

func (e *Emu) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.allocs = nil
	return nil
}

func (e *Emu) Record(ev Event, s Stream) error {
	v := (*emuEvent)(unsafe.Pointer(ev))
	if v.owner != e {
		return fmt.Errorf("emu: recording another device's event")
	}
	if err := e.TakeStream(s); err != nil {
		return err
	}
	if s == nil {
		return fmt.Errorf("emu: recording an event on no stream")
	}
	recordEvent(v, (*emuStream)(unsafe.Pointer(s)))
	v.t = time.Now()
	return nil
}

func (e *Emu) Elapsed(a, b Event) (float64, error) {
	va, vb := (*emuEvent)(unsafe.Pointer(a)), (*emuEvent)(unsafe.Pointer(b))
	if va.owner != e || vb.owner != e {
		return 0, fmt.Errorf("emu: elapsed time between events of another device")
	}
	ta, tb := va.t, vb.t
	if ta.IsZero() || tb.IsZero() {
		return 0, fmt.Errorf("emu: elapsed time of an event that was never recorded (CUDA: CUDA_ERROR_INVALID_HANDLE)")
	}
	if !eventDone(va) || !eventDone(vb) {
		return 0, fmt.Errorf("emu: stream order: elapsed time of an event the host has not waited for (CUDA: not ready)")
	}
	return float64(tb.Sub(ta).Nanoseconds()) / 1e6, nil
}

// bf16At widens n bf16 values at p.
func (e *Emu) bf16At(p Addr, n int) ([]float32, error) {
	w, err := view[uint16](e, p, n)
	return kernels.FromBF16Bits(w), err
}

// storeBF16 rounds v to bf16 and stores it at p.
func (e *Emu) storeBF16(p Addr, v []float32) error {
	w, err := view[uint16](e, p, len(v))
	if err == nil {
		copy(w, kernels.BF16Bits(v))
	}
	return err
}

func (e *Emu) GroupedGEMM(groups []Group, n, k int, s Stream) error {
	for _, g := range groups {
		if err := e.GEMM(g.C, g.A, g.W, g.M, n, k, false, s); err != nil {
			return err
		}
	}
	return nil
}

func (e *Emu) GroupedGEMMName() (string, bool) {
	return "emulated grouped GEMM (one GEMM per group)", true
}

func (e *Emu) GEMM(c, a, w Addr, m, n, k int, f32Out bool, s Stream) error {
	if m == 0 {
		return nil
	}
	cb := int64(2)
	if f32Out {
		cb = 4
	}
	if err := e.Enqueue("GEMM", s, e.ReadSpan(a, int64(2*m*k)), e.ReadSpan(w, int64(2*n*k)), e.WriteSpan(c, cb*int64(m*n))); err != nil {
		return err
	}
	av, err := e.bf16At(a, m*k)
	if err != nil {
		return err
	}
	wv, err := e.bf16At(w, n*k)
	if err != nil {
		return err
	}
	out := make([]float32, m*n)
	kernels.MatMulNT(out, av, wv, m, n, k)
	if !f32Out {
		return e.storeBF16(c, out)
	}
	cv, err := view[float32](e, c, m*n)
	copy(cv, out)
	return err
}

func (e *Emu) RouterTopK(rc kernels.RouterConfig, logits, bias Addr, tokens int, idx, probs Addr, s Stream) error {
	if err := e.Enqueue("RouterTopK", s, e.ReadSpan(logits, int64(4*tokens*rc.Experts)), e.ReadSpan(bias, int64(4*rc.Experts)),
		e.WriteSpan(idx, int64(4*tokens*rc.TopK)), e.WriteSpan(probs, int64(4*tokens*rc.TopK))); err != nil {
		return err
	}
	lg, err := view[float32](e, logits, tokens*rc.Experts)
	if err != nil {
		return err
	}
	rc.Bias = nil
	if bias != 0 {
		if rc.Bias, err = view[float32](e, bias, rc.Experts); err != nil {
			return err
		}
	}
	iv, err := view[int32](e, idx, tokens*rc.TopK)
	if err != nil {
		return err
	}
	pv, err := view[float32](e, probs, tokens*rc.TopK)
	if err != nil {
		return err
	}
	kernels.Route(rc, lg, tokens, iv, pv)
	return nil
}

func (e *Emu) PermuteOrder(idx Addr, n, experts int, rows, pos, counts Addr, s Stream) error {
	if err := e.Enqueue("PermuteOrder", s, e.ReadSpan(idx, int64(4*n)), e.WriteSpan(rows, int64(4*n)), e.WriteSpan(pos, int64(4*n)), e.WriteSpan(counts, int64(4*experts))); err != nil {
		return err
	}
	iv, err := view[int32](e, idx, n)
	if err != nil {
		return err
	}
	rv, err := view[int32](e, rows, n)
	if err != nil {
		return err
	}
	pv, err := view[int32](e, pos, n)
	if err != nil {
		return err
	}
	cv, err := view[int32](e, counts, experts)
	if err != nil {
		return err
	}
	for _, x := range iv {
		if x < 0 || int(x) >= experts {
			return fmt.Errorf("emu: permute order: expert %d of %d", x, experts)
		}
	}
	slots, cnt := kernels.PermuteOrder(iv, n, 1, experts, nil, nil)
	copy(rv, slots)
	for row, s := range slots {
		pv[s] = int32(row)
	}
	for i, c := range cnt {
		cv[i] = int32(c)
	}
	return nil
}

func (e *Emu) GatherRows(dst, src, rows Addr, div, n, hidden int, s Stream) error {
	rv, err := view[int32](e, rows, n)
	if err != nil {
		return err
	}
	lo, hi := rowRange(rv, div)
	if err := e.Enqueue("GatherRows", s, e.ReadSpan(rows, int64(4*n)), e.ReadSpan(src+Addr(2*lo*hidden), int64(2*(hi-lo)*hidden)), e.WriteSpan(dst, int64(2*n*hidden))); err != nil {
		return err
	}
	dv, err := view[uint16](e, dst, n*hidden)
	if err != nil {
		return err
	}
	for i, r := range rv {
		sv, err := view[uint16](e, src+Addr(2*(int(r)/div)*hidden), hidden)
		if err != nil {
			return err
		}
		copy(dv[i*hidden:], sv)
	}
	return nil
}

func (e *Emu) GatherF32(dst, src, rows Addr, div, n int, s Stream) error {
	rv, err := view[int32](e, rows, n)
	if err != nil {
		return err
	}
	lo, hi := rowRange(rv, div)
	if err := e.Enqueue("GatherF32", s, e.ReadSpan(rows, int64(4*n)), e.ReadSpan(src+Addr(4*lo), int64(4*(hi-lo))), e.WriteSpan(dst, int64(4*n))); err != nil {
		return err
	}
	dv, err := view[float32](e, dst, n)
	if err != nil {
		return err
	}
	for i, r := range rv {
		v, err := view[float32](e, src+Addr(4*(int(r)/div)), 1)
		if err != nil {
			return err
		}
		dv[i] = v[0]
	}
	return nil
}

// rowRange is the range [lo, hi) of rows[i]/div (0, 0 for no rows): the
// rows a gather reads, for the stream-order check.
func rowRange(rows []int32, div int) (lo, hi int) {
	if len(rows) == 0 {
		return 0, 0
	}
	lo, hi = int(rows[0])/div, int(rows[0])/div
	for _, r := range rows {
		lo, hi = min(lo, int(r)/div), max(hi, int(r)/div)
	}
	return lo, hi + 1
}

func (e *Emu) SortChunks(dst, probsOut, src, probsIn, counts Addr, rows, ep, local, hidden int, inverse bool, s Stream) error {
	pb := int64(4 * rows)
	if probsIn == 0 {
		pb = 0
	}
	if err := e.Enqueue("SortChunks", s, e.ReadSpan(counts, int64(4*ep*local)), e.ReadSpan(src, int64(2*rows*hidden)), e.ReadSpan(probsIn, pb),
		e.WriteSpan(dst, int64(2*rows*hidden)), e.WriteSpan(probsOut, pb)); err != nil {
		return err
	}
	cv, err := view[int32](e, counts, ep*local)
	if err != nil {
		return err
	}
	sl, ls := make([]int, ep*local), make([]int, ep*local) // chunk (s,l) offsets in both orders, indexed s·L+l
	a := 0
	for c, n := range cv {
		sl[c] = a
		a += int(n)
	}
	if a != rows {
		return fmt.Errorf("emu: sort chunks: counts sum to %d, rows = %d", a, rows)
	}
	a = 0
	for l := range local {
		for s := range ep {
			ls[s*local+l] = a
			a += int(cv[s*local+l])
		}
	}
	from, to := sl, ls
	if inverse {
		from, to = ls, sl
	}
	for c, n := range cv {
		if err := e.Copy(dst+Addr(2*to[c]*hidden), src+Addr(2*from[c]*hidden), int64(2*int(n)*hidden), nil); err != nil {
			return err
		}
		if probsIn != 0 {
			if err := e.Copy(probsOut+Addr(4*to[c]), probsIn+Addr(4*from[c]), int64(4*n), nil); err != nil {
				return err
			}
		}
	}
	return nil
}

func (e *Emu) SwiGLU(act, h1, prob Addr, n, ffn int, s Stream) error {
	if err := e.Enqueue("SwiGLU", s, e.ReadSpan(h1, int64(4*n*ffn)), e.ReadSpan(prob, int64(4*n)), e.WriteSpan(act, int64(2*n*ffn))); err != nil {
		return err
	}
	hv, err := e.bf16At(h1, n*2*ffn)
	if err != nil {
		return err
	}
	var pv []float32
	if prob != 0 {
		if pv, err = view[float32](e, prob, n); err != nil {
			return err
		}
	}
	out := make([]float32, n*ffn)
	kernels.SwiGLUProb(out, hv, pv, n, ffn)
	return e.storeBF16(act, out)
}

func (e *Emu) UnpermuteSum(out, src, pos, shared Addr, tokens, topk, hidden int, s Stream) error {
	pv, err := view[int32](e, pos, tokens*topk)
	if err != nil {
		return err
	}
	lo, hi := rowRange(pv, 1)
	if err := e.Enqueue("UnpermuteSum", s, e.ReadSpan(pos, int64(4*tokens*topk)), e.ReadSpan(src+Addr(2*lo*hidden), int64(2*(hi-lo)*hidden)),
		e.ReadSpan(shared, int64(2*tokens*hidden)), e.WriteSpan(out, int64(2*tokens*hidden))); err != nil {
		return err
	}
	var sh []float32
	if shared != 0 {
		if sh, err = e.bf16At(shared, tokens*hidden); err != nil {
			return err
		}
	}
	y := make([]float32, tokens*hidden)
	p := make([]int32, topk)
	for t := range tokens {
		copy(p, pv[t*topk:])
		slices.Sort(p)
		acc := y[t*hidden : (t+1)*hidden]
		for _, r := range p {
			row, err := e.bf16At(src+Addr(2*int(r)*hidden), hidden)
			if err != nil {
				return err
			}
			for j, v := range row {
				acc[j] += v
			}
		}
		for j := range acc {
			acc[j] = kernels.RoundBF16(acc[j])
			if sh != nil {
				acc[j] = kernels.RoundBF16(acc[j] + sh[t*hidden+j])
			}
		}
	}
	return e.storeBF16(out, y)
}

var _ Device = (*Emu)(nil)

// SharedPerBlock is the shared memory a block may have (Shared; 0: none
// known).
func (e *Emu) SharedPerBlock() int { return e.Shared }
