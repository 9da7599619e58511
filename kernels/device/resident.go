package device

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/moebench/moebench/internal/cuda"
)

// The machinery of SM-driven dispatchers (DeepEP's and HybridEP's designs):
// persistent kernels whose blocks wait on each other across ranks through
// queues and flags in each other's memory. Such blocks must all be resident
// at once — a block waiting for one that cannot start waits forever — so
// they are launched as a Collective: one cooperative launch per device
// (covering all of the device's ranks), refused with a *ResidencyError when
// its blocks cannot all be resident. Every wait has a timeout (moebench.cuh's
// mb_wait and Signals).

// Program is one kernel of an SM-driven design: its CUDA C source, launch
// shape, and the Go function Emu runs in its place.
type Program struct {
	File   string            // the source's name; one of kernels/cuda's (CUDAKernels) when Source is ""
	Source string            // CUDA C including moebench.cuh, for kernels kept elsewhere
	Kernel string            // its extern "C" __global__ function
	Defs   map[string]string // -D constants
	Block  int               // threads per block
	Shared int               // dynamic shared memory per block, bytes
	// Twin is what the kernel does, in Go, for Emu: it runs once every part
	// of a collective launch is queued, with all of them (see TwinPart).
	Twin func(parts []TwinPart) error
}

// key names p's compiled kernel.
func (p *Program) key() string {
	defs := slices.Sorted(maps.Keys(p.Defs))
	for i, k := range defs {
		defs[i] = k + "=" + p.Defs[k]
	}
	return p.File + "|" + p.Kernel + "|" + strings.Join(defs, ",")
}

// Collective is one step of an SM-driven design: a launch of Prog on each
// of Parts devices, whose blocks wait on each other. Each device's launch
// covers all of its ranks (its kernel finds its ranks from its block
// index), each device's thread launches its part: a device's n-th launch
// is its part of the collective's n-th round, which is complete once all
// Parts devices have launched theirs, each always on one stream (two
// streams of one device would be two launches whose blocks are not
// guaranteed to be resident together). A Collective is used round after
// round (a step may launch it more than once).
type Collective struct {
	Prog   *Program
	Parts  int
	mu     sync.Mutex        // parts come from every device's thread
	n      map[Device]int    // launches per device
	stream map[Device]Stream // the stream of each device's launches
	got    map[int]int       // parts launched per round not yet complete
	emu    map[int][]TwinPart
}

// NewCollective makes the collective of parts launches of p.
func NewCollective(p *Program, parts int) *Collective { return &Collective{Prog: p, Parts: parts} }

// join adds a part on dev's stream s to its round; done reports that it
// completed the round. c.mu is held.
func (c *Collective) join(dev Device, s Stream) (round int, done bool, err error) {
	if c.Parts < 1 {
		return 0, false, fmt.Errorf("%s: a collective of %d parts", c.Prog.Kernel, c.Parts)
	}
	if c.n == nil {
		c.n, c.stream, c.got, c.emu = map[Device]int{}, map[Device]Stream{}, map[int]int{}, map[int][]TwinPart{}
	}
	if first, ok := c.stream[dev]; ok && first != s || !ok && len(c.n) == c.Parts {
		return 0, false, fmt.Errorf("%s: a second launch on one device, on another stream, or a part on a device beyond the collective's %d: two launches' blocks are not guaranteed to be resident together (cover the device's ranks with one launch)",
			c.Prog.Kernel, c.Parts)
	}
	c.stream[dev] = s
	round = c.n[dev]
	c.n[dev]++
	if c.got[round]++; c.got[round] < c.Parts {
		return round, false, nil
	}
	delete(c.got, round)
	return round, true, nil
}

// ResidencyError is a launch whose blocks cannot all be resident at once:
// an environment limit (callers report the design unavailable), not a
// failure.
type ResidencyError struct {
	Kernel, Device      string
	Grid, Block, Shared int // the launch: blocks, threads per block, dynamic shared bytes
	PerSM, SMs          int // blocks an SM holds at once, SMs
	Regs, Static        int // registers per thread and static shared bytes (0: not known)
}

func (e *ResidencyError) Error() string {
	res := ""
	if e.Regs > 0 {
		res = fmt.Sprintf(" (%d registers/thread, %d B shared/block)", e.Regs, e.Static+e.Shared)
	}
	return fmt.Sprintf("%s: %d blocks of %d threads cannot all be resident at once on %s: it holds %d per SM%s × %d SMs = %d",
		e.Kernel, e.Grid, e.Block, e.Device, e.PerSM, res, e.SMs, e.PerSM*e.SMs)
}

// NoPeerError says that a rank's device cannot reach another rank's memory
// (no peer access between their GPUs): a kernel could not write there.
type NoPeerError struct{ From, To int }

func (e *NoPeerError) Error() string {
	return fmt.Sprintf("rank %d's device cannot access rank %d's memory (no peer access between their GPUs)", e.From, e.To)
}

// PeerTables uploads, on the device of every rank, the table of every
// rank's buffer address (bufs[r] on devs[r]; 64-bit, indexed by rank) that
// its kernels use to write to the others. Ranks on one device share a
// table; free releases them. It fails with a *NoPeerError when a rank's
// device does not reach another's.
func PeerTables(devs []Device, bufs []Addr, streams []Stream) (tables []Addr, free func() error, err error) {
	if len(bufs) != len(devs) || len(streams) != len(devs) {
		return nil, nil, fmt.Errorf("peer tables: %d devices, %d buffers, %d streams", len(devs), len(bufs), len(streams))
	}
	for a, da := range devs {
		for b, db := range devs {
			if !da.Reaches(db) {
				return nil, nil, &NoPeerError{From: a, To: b}
			}
		}
	}
	addrs := make([]uint64, len(bufs))
	for r, p := range bufs {
		addrs[r] = uint64(p)
	}
	made := map[Device]Addr{}
	free = func() error {
		var first error
		for d, p := range made {
			if err := d.Free(p); err != nil && first == nil {
				first = err
			}
		}
		clear(made)
		return first
	}
	for r, d := range devs {
		p, ok := made[d]
		if !ok {
			if p, err = d.Alloc(int64(8 * len(addrs))); err != nil {
				free()
				return nil, nil, err
			}
			made[d] = p
			if err = d.Upload(p, addrs, streams[r]); err != nil {
				free()
				return nil, nil, err
			}
		}
		tables = append(tables, p)
	}
	return tables, free, nil
}

// LaunchResident queues c's part on c: grid blocks of c.Prog, all resident
// at once (cuLaunchCooperativeKernel), each holding one SM (holdSM), after
// checking that they can be (one block per SM × SMs; else a
// *ResidencyError).
func (c *CUDA) LaunchResident(col *Collective, grid int, s Stream, args ...any) error {
	p := col.Prog
	f, err := c.Program(p)
	if err != nil {
		return err
	}
	shared, per, err := c.HoldSM(p, f)
	if err != nil {
		return err
	}
	if grid < 1 || grid > per*c.SMs {
		return c.residency(p, f, grid, per, shared)
	}
	col.mu.Lock()
	_, _, err = col.join(c, s)
	col.mu.Unlock()
	if err != nil {
		return err
	}
	err = c.Drv.LaunchCooperative(f, [3]uint32{uint32(grid), 1, 1}, [3]uint32{uint32(p.Block), 1, 1}, uint32(shared), s, args...)
	if ce, ok := err.(*cuda.Error); ok && ce.Code == cuda.ErrCooperativeTooLarge {
		return c.residency(p, f, grid, per, shared)
	}
	if err != nil {
		return fmt.Errorf("%s (grid %d, block %d, %d B shared): %w", p.Kernel, grid, p.Block, shared, err)
	}
	return nil
}

// heldKey names a program's resident launch shape: its loaded function
// (one per kernel and compile), threads and own dynamic shared memory.
type heldKey struct {
	f             cuda.Function
	block, shared int
}

// HoldSM is the dynamic shared memory of a resident launch of p, and the
// blocks of it an SM then holds (1, or 0 when none fits). A block of an
// SM-driven design holds one SM, as DeepEP's 768-thread blocks with their
// large shared memory do, so that --sms counts SMs: p.Shared (its own
// dynamic shared memory, which counts towards it) is raised until two
// blocks' shared memory — dynamic, static and the driver's reserve per
// block — exceeds the SM's, and cuOccupancyMaxActiveBlocksPerMultiprocessor
// must then say 1.
func (c *CUDA) HoldSM(p *Program, f cuda.Function) (shared, per int, err error) {
	k := heldKey{f, p.Block, p.Shared} // not p.key(): program(p) built it already, every launch
	if s, ok := c.held[k]; ok {
		return s, 1, nil
	}
	static, err := c.Drv.FuncAttribute(f, cuda.FuncAttrSharedBytes)
	if err != nil {
		return 0, 0, err
	}
	shared = max(p.Shared, c.SMShared/2+1-static-c.ReservedShared)
	if shared+static > c.optinShared {
		return 0, 0, fmt.Errorf("%s: %d B of dynamic shared memory (so that one block holds an SM) and %d B static exceed the %d B a block of GPU %d may have",
			p.Kernel, shared, static, c.optinShared, c.Ordinal)
	}
	if shared > 48<<10 {
		if err := c.Drv.SetMaxDynamicShared(f, shared); err != nil {
			return 0, 0, fmt.Errorf("%s: %d B of dynamic shared memory: %w", p.Kernel, shared, err)
		}
	}
	if per, err = c.Drv.Occupancy(f, p.Block, shared); err != nil {
		return 0, 0, err
	}
	if per > 1 {
		return 0, 0, fmt.Errorf("%s: %d blocks of %d threads with %d B of dynamic shared memory share an SM of GPU %d: a block must hold one SM", p.Kernel, per, p.Block, shared, c.Ordinal)
	}
	if per == 1 {
		c.held[k] = shared
	}
	return shared, per, nil
}

// LaunchProgram: cuLaunchKernel of p (compiled on first use).
func (c *CUDA) LaunchProgram(p *Program, grid int, s Stream, args ...any) error {
	f, err := c.Program(p)
	if err != nil {
		return err
	}
	if err := c.Drv.Launch(f, [3]uint32{uint32(grid), 1, 1}, [3]uint32{uint32(p.Block), 1, 1}, uint32(p.Shared), s, args...); err != nil {
		return fmt.Errorf("%s (grid %d, block %d, %d B shared): %w", p.Kernel, grid, p.Block, p.Shared, err)
	}
	return nil
}

// residency makes the *ResidencyError of a resident launch of f.
func (c *CUDA) residency(p *Program, f cuda.Function, grid, per, shared int) error {
	e := &ResidencyError{Kernel: p.Kernel, Device: fmt.Sprintf("GPU %d", c.Ordinal), Grid: grid, Block: p.Block, Shared: shared, PerSM: per, SMs: c.SMs}
	e.Regs, _ = c.Drv.FuncAttribute(f, cuda.FuncAttrNumRegs)
	e.Static, _ = c.Drv.FuncAttribute(f, cuda.FuncAttrSharedBytes)
	return e
}

// Residency is how many blocks of a resident launch of p one SM of c
// holds at once: 1 (each holds an SM, holdSM), or 0 when none fits.
func (c *CUDA) Residency(p *Program) (int, error) {
	f, err := c.Program(p)
	if err != nil {
		return 0, err
	}
	_, per, err := c.HoldSM(p, f)
	return per, err
}

// Program compiles and loads p (once), letting it use its dynamic shared
// memory beyond the default 48 KiB.
func (c *CUDA) Program(p *Program) (cuda.Function, error) {
	if err := c.MakeCurrent(); err != nil {
		return nil, err
	}
	k := p.key()
	if f, ok := c.progs[k]; ok {
		return f, nil
	}
	f, err := c.loadSource(p.File, p.Source, p.Kernel, p.Defs)
	if err != nil {
		return nil, err
	}
	if p.Shared > 48<<10 {
		if err := c.Drv.SetMaxDynamicShared(f, p.Shared); err != nil {
			return nil, fmt.Errorf("%s: %d B of dynamic shared memory: %w", p.Kernel, p.Shared, err)
		}
	}
	c.progs[k] = f
	return f, nil
}

func (c *CUDA) SMCount() int { return c.SMs }

// AllocMapped: cuMemHostAlloc, portable and mapped (every context's
// kernels may use it), at its device address.
func (c *CUDA) AllocMapped(bytes int64) (MappedHost, error) {
	if err := c.MakeCurrent(); err != nil {
		return MappedHost{}, err
	}
	h, err := c.Drv.HostAlloc(max(bytes, 1), cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	if err != nil {
		return MappedHost{}, err
	}
	d, err := c.Drv.HostDevicePtr(h)
	if err != nil {
		c.Drv.FreeHost(h)
		return MappedHost{}, err
	}
	return MappedHost{Dev: d, Host: h, Bytes: bytes}, nil
}

func (c *CUDA) FreeMapped(m MappedHost) error {
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	return c.Drv.FreeHost(m.Host)
}

// TwinPart is one part of a collective launch as Emu's twin sees it: the
// device and stream it was queued on, its grid and its arguments (as
// given to LaunchResident). Its Read and Write give the twin memory of any
// Emu (peer buffers too) and record the access on the part's stream for
// the stream-order check.
type TwinPart struct {
	Dev    *Emu
	Stream Stream
	Grid   int
	Args   []any
	name   string
}

// Read is n bytes at p (on any Emu), which the part reads.
func (t TwinPart) Read(p Addr, n int64) ([]byte, error) { return t.access(p, n, false) }

// Write is n bytes at p (on any Emu), which the part writes.
func (t TwinPart) Write(p Addr, n int64) ([]byte, error) { return t.access(p, n, true) }

func (t TwinPart) access(p Addr, n int64, write bool) ([]byte, error) {
	e := emuAt(p)
	if e == nil {
		return nil, fmt.Errorf("emu: %s: %#x is no device's memory", t.name, uint64(p))
	}
	if err := t.Dev.record(t.name, t.Stream, span{e, p, n, write}); err != nil { // t.Stream's pending launch is this one
		return nil, err
	}
	return e.BytesAt(p, n)
}

// Signal is n bytes at p (on any Emu) that the kernels' protocol orders
// itself — flags, counters, error records, written and read with the
// memory primitives — and the stream-order check leaves out.
func (t TwinPart) Signal(p Addr, n int64) ([]byte, error) {
	e := emuAt(p)
	if e == nil {
		return nil, fmt.Errorf("emu: %s: %#x is no device's memory", t.name, uint64(p))
	}
	return e.BytesAt(p, n)
}

// Ptrs reads a table of n device addresses at p (PeerTables').
func (t TwinPart) Ptrs(p Addr, n int) ([]Addr, error) {
	b, err := t.Read(p, int64(8*n))
	if err != nil {
		return nil, err
	}
	out := make([]Addr, n)
	for i := range out {
		out[i] = *(*Addr)(unsafe.Pointer(&b[8*i]))
	}
	return out, nil
}

// emuSMs is the SM count of an Emu that sets none: an H100's.
const emuSMs = 132

// SMCount: e.SMs, or 132.
func (e *Emu) SMCount() int {
	if e.SMs > 0 {
		return e.SMs
	}
	return emuSMs
}

// LaunchResident queues a part of col on e. Emu models one resident block
// per SM (SM-driven kernels take a whole SM each): a grid above SMCount is
// refused with a *ResidencyError. Once every part is queued, the parts'
// streams are ordered after each other's earlier work (the kernels'
// opening barrier), Prog.Twin runs with all parts, and they are ordered
// after each other again (each kernel ends after receiving what the others
// sent). Until then, more work on a part's stream waits (Emu runs work when
// it is queued, so it would run before the collective): each device's
// thread queues its part, and the last part's thread runs the twin.
func (e *Emu) LaunchResident(col *Collective, grid int, s Stream, args ...any) error {
	p := col.Prog
	if err := e.TakeStream(s); err != nil || s == nil {
		return fmt.Errorf("emu: %s: a stream of another device, or none", p.Kernel)
	}
	if grid < 1 || grid > e.SMCount() {
		return &ResidencyError{Kernel: p.Kernel, Device: "emu", Grid: grid, Block: p.Block, Shared: p.Shared, PerSM: 1, SMs: e.SMCount()}
	}
	if p.Twin == nil {
		return fmt.Errorf("emu: %s has no twin", p.Kernel)
	}
	col.mu.Lock()
	round, done, err := col.join(e, s)
	if err != nil {
		col.mu.Unlock()
		return err
	}
	parts := append(col.emu[round], TwinPart{Dev: e, Stream: s, Grid: grid, Args: args, name: p.Kernel})
	col.emu[round] = parts
	if !done { // marked while the lock is held: the round's last part clears it after
		setPending((*emuStream)(unsafe.Pointer(s)), p.Kernel)
		col.mu.Unlock()
		return nil
	}
	delete(col.emu, round)
	col.mu.Unlock()
	defer func() { // the parts' streams take work again
		for _, t := range parts {
			setPending((*emuStream)(unsafe.Pointer(t.Stream)), "")
		}
	}()
	meet := func() {
		clocks := make([]VectorClock, len(parts))
		for i, t := range parts {
			clocks[i] = maps.Clone((*emuStream)(unsafe.Pointer(t.Stream)).clock)
		}
		for _, t := range parts {
			for _, c := range clocks {
				OrderAfter(t.Stream, c)
			}
		}
	}
	meet()
	if err := p.Twin(parts); err != nil {
		return fmt.Errorf("emu: %s: %w", p.Kernel, err)
	}
	meet()
	return nil
}

// Residency: Emu holds one block of any program per SM.
func (e *Emu) Residency(*Program) (int, error) { return 1, nil }

// LaunchProgram runs p.Twin at once with one part: the launch on s.
func (e *Emu) LaunchProgram(p *Program, grid int, s Stream, args ...any) error {
	if err := e.TakeStream(s); err != nil || s == nil {
		return fmt.Errorf("emu: %s: no stream, or %v", p.Kernel, err)
	}
	if p.Twin == nil {
		return fmt.Errorf("emu: %s has no twin", p.Kernel)
	}
	if err := p.Twin([]TwinPart{{Dev: e, Stream: s, Grid: grid, Args: args, name: p.Kernel}}); err != nil {
		return fmt.Errorf("emu: %s: %w", p.Kernel, err)
	}
	return nil
}

// AllocMapped: Emu memory, whose bytes are the host's.
func (e *Emu) AllocMapped(bytes int64) (MappedHost, error) {
	p, err := e.Alloc(max(bytes, 1))
	if err != nil {
		return MappedHost{}, err
	}
	b, err := e.BytesAt(p, max(bytes, 1))
	if err != nil {
		return MappedHost{}, err
	}
	return MappedHost{Dev: p, Host: unsafe.Pointer(&b[0]), Bytes: bytes}, nil
}

func (e *Emu) FreeMapped(m MappedHost) error { return e.Free(m.Dev) }

// pending is the collective launch each stream waits for (Emu's streams'
// pending field), guarded by pendingMu; waiters wake on pendingCond.
var (
	pendingMu   sync.Mutex
	pendingCond = sync.NewCond(&pendingMu)
)

// CollectiveWait bounds how long work on a stream waits for the other
// parts of its collective launch.
const CollectiveWait = 60 * time.Second

// setPending marks st as waiting for the collective launch of kernel ("":
// none) and wakes its waiters.
func setPending(st *emuStream, kernel string) {
	pendingMu.Lock()
	st.pending = kernel
	pendingCond.Broadcast()
	pendingMu.Unlock()
}

// waitPending waits until st waits for no collective launch, at most
// collectiveWait; it returns the launch still pending then, or "".
func waitPending(st *emuStream) string {
	pendingMu.Lock()
	defer pendingMu.Unlock()
	if st.pending == "" {
		return ""
	}
	expired := false
	t := time.AfterFunc(CollectiveWait, func() {
		pendingMu.Lock()
		expired = true
		pendingCond.Broadcast()
		pendingMu.Unlock()
	})
	defer t.Stop()
	for st.pending != "" && !expired {
		pendingCond.Wait()
	}
	return st.pending
}

// emus maps each Emu's address range (its 2⁴⁰-byte space number) to it,
// so that a twin reaches peers' memory by address.
var emus = struct {
	sync.Mutex
	m map[uint64]*Emu
}{m: map[uint64]*Emu{}}

// emuAt is the Emu whose memory holds p, or nil.
func emuAt(p Addr) *Emu {
	emus.Lock()
	defer emus.Unlock()
	return emus.m[uint64(p)>>40]
}

// newSpace gives e its address range (e.mu held).
func (e *Emu) newSpace() {
	space := emuSpaces.Add(1)
	emus.Lock()
	emus.m[space] = e
	emus.Unlock()
	e.next = Addr(space<<40 + 1<<20)
}

// SharedPerBlock is the shared memory, static and dynamic, a block of c
// may have: the device's opt-in limit
// (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN; an A100's 163
// KiB, an H100's 227 KiB).
func (c *CUDA) SharedPerBlock() int { return c.optinShared }
