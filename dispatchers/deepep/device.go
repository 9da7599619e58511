package deepep

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels/comm"
	"github.com/moebench/moebench/kernels/device"
)

// The design on devices: kernels/cuda/deepep.cu's kernels, with the same
// data movement and rounding as the host design (docs/dispatchers/deepep.md), so
// that the outputs are the host's bit for bit. Phases:
//
//	layout    per rank, deepep_layout on its stream
//	notify    one collective launch per GPU covering its ranks, then the
//	          host waits for every rank's received-token and per-expert
//	          counters (host-mapped, --comm-timeout) and sizes the receive
//	          and expert buffers: DeepEP's one CPU sync
//	dispatch  one collective launch per GPU: --sms blocks per rank
//	permute   per rank, deepep_permute then the row and probability gathers
//	experts   the layer's
//	combine   one collective launch per GPU, the same blocks; it writes Y
//
// A collective launch is queued on the stream of the GPU's first rank
// after that GPU's other ranks' streams (events), and they wait for it;
// each GPU's is issued from its thread by its last rank's call
// (Capabilities.Grouped), so the GPUs' launches go out at once.
// Its blocks are all resident (device.Collective): ranks packed on one
// GPU need budget × ranks blocks at once, and Bind reports the design
// unavailable, with the reason, when they do not fit, or when the budget
// exceeds the GPU's SMs. A cross-rank wait that times out (or a wrong
// value in a queue) ends the kernels; the host's wait returns it at once,
// and CheckStep after the step's synchronization (comm.CommError names
// rank, phase and wait).

// Descriptor slots (deepep.cu's DE_*): a rank's buffer addresses.
const (
	slotX = iota
	slotIdx
	slotProbs
	slotY
	slotShared
	slotExpertY
	slotFixed
	slotQueues
	slotRecvX
	slotRecvSrc
	slotRecvIdx
	slotRecvW
	slotPermRow
	slotDY
	slotExpertDX
	slotExpertDP
	slotDX
	slotDProbs
	slots
)

// Kernel phases and waits (deepep.cu's DE_PH_* and DE_W_*).
const (
	phaseNotify, phaseDispatch, phaseCombine = 1, 2, 3
	phaseCombineBwd, phaseDispatchBwd        = 4, 5
	waitFlag                                 = 16
)

// names names the kernels' phases and waits for errors.
func names(phase, wait int) (string, string) {
	p := map[int]string{phaseNotify: "notify", phaseDispatch: "dispatch", phaseCombine: "combine",
		phaseCombineBwd: "combine-bwd (the dispatch kernel)", phaseDispatchBwd: "dispatch-bwd (the combine kernel)"}[phase]
	w := map[int]string{1: "head (room in a queue)", 2: "tail (tokens in a queue)", 3: "channel offsets (of a queue)",
		4: "start (the combine's barrier)", 5: "token (of a combine row)"}[wait]
	if wait >= waitFlag {
		w = fmt.Sprintf("flag of rank %d (a barrier)", wait-waitFlag)
	}
	if p == "" {
		p = fmt.Sprint(phase)
	}
	if w == "" {
		w = fmt.Sprint(wait)
	}
	return p, w
}

// Device is the design on device ranks.
type Device struct {
	cfg     Config
	sms     int
	fixed   bool // cfg was given (WithDeviceConfig)
	bug     int  // tests: deepep.cu's MB_DE_BUG
	noBulk  bool // tests: MB_NO_BULK=1, the dispatch's 16-byte receivers where the bulk path would compile
	timeout time.Duration
	shape   dispatchers.Shape
	ranks   []*dispatchers.DeviceRank
	lay     layout
	groups  []group
	st      []devRank
	sig     *comm.Signals
	prog    struct{ layout, notify, dispatch, permute, combine, combineBwd *device.Program }
	col     struct{ notify, dispatch, combine, combineBwd *device.Collective }
	tw      *twin // Emu's
	// backward: the last step ran the backward (Traffic counts its bytes)
	backward bool
}

// group is one device and its ranks [first, first+n).
type group struct {
	dev      device.Device
	first, n int
	desc     device.Addr // the descriptor table on dev: slots per rank
	sent     []uint64    // its content as last uploaded
	done     device.Event
	epoch    int32 // the next barrier use (every group counts alike)
}

// devRank is one rank's buffers.
type devRank struct {
	queues, fixed                  device.Addr
	recvX, recvSrc, recvIdx, recvW device.Addr // the receive buffer
	permRow, order                 device.Addr // [R·k] slot → row, row → slot
	recv, expert                   device.RowCapacity
	grads                          device.RowCapacity // ExpertDY's rows
	gradsFixed                     int64              // DX and DProbs
	tokens                         int                // received in the last notify
	ready                          device.Event
}

// WithDeviceConfig returns the device implementation with cfg instead of
// DeepEP's recommended configuration (tests use small rings and blocks).
func WithDeviceConfig(cfg Config) *Device {
	return &Device{cfg: cfg, sms: cfg.SMs, fixed: true, timeout: dispatchers.DefaultCommTimeout}
}

// NewDevice returns the cuda implementation (moebench's kernels).
func NewDevice(impl string, env dispatchers.Env) (dispatchers.DeviceDispatcher, error) {
	if impl != dispatchers.ImplNative {
		return nil, &dispatchers.UnavailableError{Name: Name, Impl: impl,
			Reason: NoLibrary}
	}
	d := &Device{sms: env.SMs, timeout: env.CommTimeout}
	if d.timeout <= 0 {
		d.timeout = dispatchers.DefaultCommTimeout
	}
	return d, nil
}

func (d *Device) Name() string { return Name }
func (d *Device) Impl() string { return dispatchers.ImplNative }

func (d *Device) unavailable(format string, a ...any) error {
	return &dispatchers.UnavailableError{Name: Name, Impl: dispatchers.ImplNative, Reason: fmt.Sprintf(format, a...)}
}

// checkDevice says what the device kernels cannot run of c for shape.
func (c Config) checkDevice(sh dispatchers.Shape) error {
	switch {
	case c.Warps < sh.EP || c.Warps%sh.EP != 0 || c.Warps > 32:
		return fmt.Errorf("%d warps per block: must be a multiple of the %d ranks, at most 32", c.Warps, sh.EP)
	case c.MinBlocks < 1:
		return fmt.Errorf("%d blocks per SM", c.MinBlocks)
	case sh.Hidden%8 != 0:
		return fmt.Errorf("hidden %d: the kernels copy rows in 16-byte vectors, so it must be a multiple of 8", sh.Hidden)
	case sh.DispatchWidth()%8 != 0 || sh.DispatchWidth() > sh.Hidden:
		return fmt.Errorf("dispatch rows of %d bf16-sized elements: the kernels copy them in 16-byte vectors in the bf16 rows' buffers, "+
			"so it must be a multiple of 8 and at most hidden %d", sh.DispatchWidth(), sh.Hidden)
	case sh.TopK > 32:
		return fmt.Errorf("top-%d: the kernels hold a token's experts in one warp's lanes (at most 32)", sh.TopK)
	}
	return nil
}

// Bind checks the design can run on the ranks' devices (else it is
// unavailable, with the reason), compiles its kernels, and allocates each
// rank's buffers and the signals.
func (d *Device) Bind(shape dispatchers.Shape, ranks []*dispatchers.DeviceRank) error {
	if len(ranks) != shape.EP {
		return fmt.Errorf("deepep: %d ranks, shape says EP = %d", len(ranks), shape.EP)
	}
	if !d.fixed {
		d.cfg = DefaultConfig(shape.EP, d.sms)
	}
	if err := d.cfg.check(shape.EP); err != nil {
		return d.unavailable("%v", err)
	}
	if err := d.cfg.checkDevice(shape); err != nil {
		return d.unavailable("%v", err)
	}
	d.shape, d.ranks, d.lay = shape, ranks, newLayout(shape, d.cfg)
	for r, rk := range ranks {
		if r > 0 && rk.Dev == ranks[r-1].Dev {
			d.groups[len(d.groups)-1].n++
			continue
		}
		if slices.ContainsFunc(d.groups, func(g group) bool { return g.dev == rk.Dev }) {
			return fmt.Errorf("deepep: rank %d's device also runs ranks before %d but not rank %d: a device's ranks must be contiguous", r, r-1, r-1)
		}
		d.groups = append(d.groups, group{dev: rk.Dev, first: r, n: 1, epoch: 1})
	}
	for a, ra := range ranks {
		for b, rb := range ranks {
			if !ra.Dev.Reaches(rb.Dev) {
				return d.unavailable("its kernels write into peers' memory: %v", &device.NoPeerError{From: a, To: b})
			}
		}
	}
	d.tw = &twin{d: d}
	defs := defines(shape, d.cfg, d.lay, d.bug)
	if d.noBulk {
		defs["MB_NO_BULK"] = "1"
	}
	prog := func(kernel string, block int, tw func([]device.TwinPart) error) *device.Program {
		return &device.Program{File: "deepep.cu", Kernel: kernel, Defs: defs, Block: block, Twin: d.tw.locked(tw)}
	}
	d.prog.layout, d.prog.notify = prog("deepep_layout", layoutBlock, d.tw.layout), prog("deepep_notify", 128, d.tw.notify)
	d.prog.dispatch = prog("deepep_dispatch", 32*d.cfg.Warps, d.tw.dispatch)
	d.prog.dispatch.Shared = dispatchShared(d.cfg.Warps)
	d.prog.permute, d.prog.combine = prog("deepep_permute", 512, d.tw.permute), prog("deepep_combine", 32*d.cfg.Warps, d.tw.combine)
	d.prog.combineBwd = prog("deepep_combine_bwd", 32*d.cfg.Warps, d.tw.combineBwd)
	if err := d.fits(); err != nil {
		return err
	}
	n := len(d.groups)
	d.col.notify, d.col.dispatch, d.col.combine = device.NewCollective(d.prog.notify, n), device.NewCollective(d.prog.dispatch, n), device.NewCollective(d.prog.combine, n)
	d.col.combineBwd = device.NewCollective(d.prog.combineBwd, n)
	devs, streams := make([]device.Device, len(ranks)), make([]device.Stream, len(ranks))
	for r, rk := range ranks {
		devs[r], streams[r] = rk.Dev, rk.Stream
	}
	var err error
	if d.sig, err = comm.NewSignals(devs, streams, shape.EP*(1+shape.LocalExperts())); err != nil {
		return err
	}
	d.sig.Names = names
	d.st = make([]devRank, shape.EP)
	for r, rk := range ranks {
		s := &d.st[r]
		if _, err := device.Resize(rk.Dev, 1, device.RowBuffer{P: &s.queues, PerRow: d.lay.queues}, device.RowBuffer{P: &s.fixed, PerRow: d.lay.fixed}); err != nil {
			return err
		}
		if err := rk.Dev.Fill16(s.queues, 0, d.lay.queues/2, rk.Stream); err != nil { // counts, flags, metadata: zero
			return err
		}
		if s.ready, err = rk.Dev.NewEvent(); err != nil {
			return err
		}
		rk.ExpertRows = make([]int, shape.LocalExperts())
	}
	for i := range d.groups {
		g := &d.groups[i]
		if g.desc, err = g.dev.Alloc(8 * slots * int64(shape.EP)); err != nil {
			return err
		}
		if g.done, err = g.dev.NewEvent(); err != nil {
			return err
		}
	}
	for i := range d.groups {
		if err := d.describe(&d.groups[i]); err != nil {
			return err
		}
	}
	for _, rk := range ranks { // the zeroed queues before any kernel
		if err := rk.Dev.SyncStream(rk.Stream); err != nil {
			return err
		}
	}
	return nil
}

// layoutBlock is deepep_layout's block (one thread per token).
const layoutBlock = 256

// fits checks the budget against each device: at most its SMs per rank,
// and all of its ranks' blocks resident at once.
func (d *Device) fits() error {
	for i, g := range d.groups {
		if sms := g.dev.SMCount(); d.cfg.SMs > sms {
			return d.unavailable("an SM budget of %d blocks per rank exceeds device %d's %d SMs", d.cfg.SMs, i, sms)
		}
		for _, c := range []struct {
			p    *device.Program
			grid int
		}{{d.prog.notify, g.n}, {d.prog.dispatch, g.n * d.cfg.SMs}, {d.prog.combine, g.n * d.cfg.SMs}, {d.prog.combineBwd, g.n * d.cfg.SMs}} {
			per, err := g.dev.Residency(c.p)
			if err != nil {
				return err
			}
			if c.grid > per*g.dev.SMCount() {
				return d.unavailable("%d rank(s) on device %d × %d blocks: %v", g.n, i, c.grid/g.n, &device.ResidencyError{Kernel: c.p.Kernel,
					Device: fmt.Sprintf("device %d (%s)", i, g.dev.Name()), Grid: c.grid, Block: c.p.Block, PerSM: per, SMs: g.dev.SMCount()})
			}
		}
	}
	return nil
}

// describe uploads g's descriptor table if it changed (the receive buffers
// grow in notify, the layer's ExpertY before combine, the gradients'
// buffers in combine-bwd), on the stream of its first rank, where the
// collective launches go. The kernels reach other ranks' queue buffers
// alone, so g's table holds its own ranks' buffers and every rank's queue
// buffer (allocated in Bind): describe reads nothing another device's
// thread may be changing.
func (d *Device) describe(g *group) error {
	tab := make([]uint64, slots*len(d.ranks))
	for r, rk := range d.ranks {
		s := &d.st[r]
		if r < g.first || r >= g.first+g.n {
			tab[r*slots+slotQueues] = uint64(s.queues)
			continue
		}
		for i, p := range [slots]device.Addr{rk.X, rk.Idx, rk.Probs, rk.Y, rk.Shared, rk.ExpertY, s.fixed, s.queues,
			s.recvX, s.recvSrc, s.recvIdx, s.recvW, s.permRow, rk.DY, rk.ExpertDX, rk.ExpertDProbs, rk.DX, rk.DProbs} {
			tab[r*slots+i] = uint64(p)
		}
	}
	if slices.Equal(g.sent, tab) {
		return nil
	}
	if err := g.dev.Upload(g.desc, tab, d.ranks[g.first].Stream); err != nil {
		return err
	}
	g.sent = tab
	return nil
}

// collective queues g's part of c's launch (grid blocks, args) on its
// first rank's stream after its other ranks' work, and makes those ranks'
// streams wait for it.
func (d *Device) collective(g *group, c *device.Collective, grid int, args ...any) error {
	first := d.ranks[g.first]
	for r := g.first + 1; r < g.first+g.n; r++ {
		if err := d.ranks[r].Dev.Record(d.st[r].ready, d.ranks[r].Stream); err != nil {
			return err
		}
		if err := g.dev.Wait(first.Stream, d.st[r].ready); err != nil {
			return err
		}
	}
	err := g.dev.LaunchResident(c, grid, first.Stream, args...)
	var re *device.ResidencyError
	if errors.As(err, &re) {
		return d.unavailable("%v", re)
	}
	if err != nil {
		return err
	}
	if err := g.dev.Record(g.done, first.Stream); err != nil {
		return err
	}
	for r := g.first + 1; r < g.first+g.n; r++ {
		if err := d.ranks[r].Dev.Wait(d.ranks[r].Stream, g.done); err != nil {
			return err
		}
	}
	return nil
}

// lastOf is the group whose last rank r is, or nil: a grouped phase's
// work is issued by the call of its device's last rank.
func (d *Device) lastOf(r int) *group {
	if g := d.groupOf(r); r == g.first+g.n-1 {
		return g
	}
	return nil
}

// Forward is the host design's.
func (d *Device) Forward(experts func(rank int) error) []dispatchers.Step {
	return []dispatchers.Step{{Name: "layout", Run: d.Layout}, {Name: "notify", Run: d.Notify},
		{Name: "dispatch", Run: d.Dispatch}, {Name: "permute", Run: d.Permute},
		{Name: dispatchers.ExpertPhases[0], Run: experts}, {Name: "combine", Run: d.Combine}}
}

// Grouped: notify, dispatch and combine are one launch per device, issued
// by the call of the device's last rank.
func (d *Device) Grouped(phase string) bool {
	switch phase {
	case "notify", "dispatch", "combine", dispatchers.BackwardName("combine"), dispatchers.BackwardName("dispatch"):
		return true
	}
	return false
}

// Layout is rank r's layout kernel, after zeroing its counts; its
// host-mapped counters are unset (−1) for notify's wait.
func (d *Device) Layout(r int) error {
	s, rk, sh := &d.st[r], d.ranks[r], d.shape
	if r == 0 {
		d.backward = false
	}
	for i := range 1 + sh.LocalExperts() {
		d.sig.SetCounter(d.counter(r, i), -1)
	}
	if err := rk.Dev.Fill16(s.fixed+device.Addr(d.lay.perRank), 0, (d.lay.chanEnd-d.lay.perRank)/2, rk.Stream); err != nil {
		return err
	}
	return rk.Dev.LaunchProgram(d.prog.layout, (sh.Tokens+layoutBlock-1)/layoutBlock, rk.Stream, rk.Idx, s.fixed)
}

// counter is the index of rank r's host-mapped counter i: 0 its received
// tokens, 1 + l its copies for local expert l.
func (d *Device) counter(r, i int) int { return r*(1+d.shape.LocalExperts()) + i }

// Notify, in the call of each device's last rank: the device's notify
// kernels, the host's wait for its ranks' counts, and their buffers sized
// for them.
func (d *Device) Notify(r int) error {
	g := d.lastOf(r)
	if g == nil {
		return nil
	}
	L, k, h := d.shape.LocalExperts(), d.shape.TopK, int64(d.shape.Hidden)
	epoch := g.epoch
	g.epoch += 3
	if err := d.collective(g, d.col.notify, g.n, d.sig.Comm(g.dev, d.timeout), int32(g.first), epoch, int32(0), g.desc); err != nil {
		return err
	}
	ready := func(v int32) bool { return v >= 0 }
	wait := d.timeout + time.Second // the kernels' own timeout, which names the wait, comes first
	for r := g.first; r < g.first+g.n; r++ {
		s, rk := &d.st[r], d.ranks[r]
		v, err := d.sig.WaitCounter(d.counter(r, 0), fmt.Sprintf("rank %d's received-token count (notify)", r), ready, wait)
		if err != nil {
			return err
		}
		s.tokens = int(v)
		rows := 0
		for l := range L {
			v, err := d.sig.WaitCounter(d.counter(r, 1+l), fmt.Sprintf("rank %d's copies for local expert %d (notify)", r, l), ready, wait)
			if err != nil {
				return err
			}
			rk.ExpertRows[l] = int(v)
			rows += int(v)
		}
		grown := s.recv.Rows
		if err := s.recv.Ensure(rk.Dev, rk.Stream, s.tokens, device.RowBuffer{P: &s.recvX, PerRow: 2 * h}, device.RowBuffer{P: &s.recvSrc, PerRow: 4},
			device.RowBuffer{P: &s.recvIdx, PerRow: 4 * int64(k)}, device.RowBuffer{P: &s.recvW, PerRow: 4 * int64(k)},
			device.RowBuffer{P: &s.permRow, PerRow: 4 * int64(k)}, device.RowBuffer{P: &s.order, PerRow: 4 * int64(k)}); err != nil {
			return err
		}
		if s.recv.Rows != grown { // a fresh order: rows a failed dispatch leaves unordered stay in the buffer
			if err := rk.Dev.Fill16(s.order, 0, 2*int64(s.recv.Rows*k), rk.Stream); err != nil {
				return err
			}
		}
		// ExpertX's rows as dispatched (the packed fp8 rows at fp8); the
		// receive rows keep the bf16 width, which the backward's dispatch
		// of the output gradients needs
		dw := int64(d.shape.DispatchWidth())
		if err := s.expert.Ensure(rk.Dev, rk.Stream, rows, device.RowBuffer{P: &rk.ExpertX, PerRow: 2 * dw}, device.RowBuffer{P: &rk.ExpertProbs, PerRow: 4}); err != nil {
			return err
		}
		// no local expert until the dispatch says so: a failed dispatch
		// leaves nothing for the permute to follow
		if err := rk.Dev.Fill16(s.recvIdx, 0xffff, 2*int64(s.tokens*k), rk.Stream); err != nil {
			return err
		}
	}
	return nil
}

// Dispatch, in the call of each device's last rank: the device's
// descriptors (every rank's receive buffers, sized in notify) and its
// dispatch kernels.
func (d *Device) Dispatch(r int) error {
	g := d.lastOf(r)
	if g == nil {
		return nil
	}
	if err := d.describe(g); err != nil {
		return err
	}
	return d.collective(g, d.col.dispatch, g.n*d.cfg.SMs, d.sig.Comm(g.dev, d.timeout), int32(g.first), int32(0), g.desc)
}

// Permute is rank r's order kernel and the gathers of its rows and
// probabilities into ExpertX and ExpertProbs.
func (d *Device) Permute(r int) error {
	s, rk, sh := &d.st[r], d.ranks[r], d.shape
	k, rows := sh.TopK, rk.Rows()
	if s.tokens == 0 {
		return nil
	}
	if err := rk.Dev.LaunchProgram(d.prog.permute, sh.LocalExperts(), rk.Stream, s.recvIdx, int32(s.tokens*k), s.order, s.permRow); err != nil {
		return err
	}
	if err := rk.Dev.GatherRows(rk.ExpertX, s.recvX, s.order, k, rows, sh.DispatchWidth(), rk.Stream); err != nil {
		return err
	}
	return rk.Dev.GatherF32(rk.ExpertProbs, s.recvW, s.order, 1, rows, rk.Stream)
}

// Combine, in the call of each device's last rank: the device's
// descriptors (the layer's ExpertY) and its combine kernels, which write Y
// (the shared expert's output added).
func (d *Device) Combine(r int) error { return d.combine(r, d.col.combine) }

// combine is Combine, or with col.combineBwd its backward form
// (DispatchBackward).
func (d *Device) combine(r int, col *device.Collective) error {
	g := d.lastOf(r)
	if g == nil {
		return nil
	}
	if err := d.describe(g); err != nil {
		return err
	}
	epoch := g.epoch
	g.epoch++
	return d.collective(g, col, g.n*d.cfg.SMs, d.sig.Comm(g.dev, d.timeout), int32(g.first), epoch, g.desc)
}

// CheckStep returns what the kernels recorded in the step: a
// *comm.CommError naming the ranks, phases and waits that gave up.
func (d *Device) CheckStep() error { return d.sig.Err() }

// Traffic counts the last step's tokens, as the host's: each rank's tokens
// to each rank, read from its layout buffer.
func (d *Device) Traffic() dispatchers.Traffic {
	per := make([][]int, len(d.ranks))
	buf := make([]int32, d.shape.EP)
	for r, rk := range d.ranks {
		if err := rk.Dev.Download(buf, d.st[r].fixed+device.Addr(d.lay.perRank), rk.Stream); err != nil {
			return dispatchers.Traffic{Formula: "not counted: " + err.Error()}
		}
		for _, n := range buf {
			per[r] = append(per[r], int(n))
		}
	}
	return traffic(d.shape, per, d.backward, d.fp8())
}

// Buffers are rank r's buffers as allocated.
func (d *Device) Buffers(r int) []dispatchers.Buffer {
	s := &d.st[r]
	return []dispatchers.Buffer{
		{Name: "queues", Bytes: d.lay.queues, About: "the peer-written buffer: the count matrices, barrier flags, per (channel, source) queue offsets, head and tail for dispatch and combine, " +
			"and the rings (dispatch's and combine's over the same bytes: rows with their source index, and in dispatch top-k indices and probabilities)"},
		{Name: "receive", Bytes: s.recv.Bytes, About: "the received tokens (rows, source indices, top-k indices and probabilities) and the permute's slot ↔ row maps, sized by notify's count (grown, never shrunk)"},
		{Name: "permute", Bytes: s.expert.Bytes, About: "the expert-major rows and probabilities the grouped GEMM reads"},
		{Name: "layout", Bytes: d.lay.fixed, About: "is_token_in_rank, counts, channel and rank prefix matrices, received channel offsets and send_head"},
	}
}

// Footprint is the bytes of rank r's buffers and its share of its
// device's descriptor table.
func (d *Device) Footprint(r int) int64 {
	s := &d.st[r]
	return d.lay.queues + d.lay.fixed + s.recv.Bytes + s.expert.Bytes + s.grads.Bytes + s.gradsFixed + 8*slots*int64(d.shape.EP)/int64(d.groupOf(r).n)
}

// fp8 says whether the forward dispatch moves packed fp8 rows (the
// device layer's Shape.DispatchHidden at --precision fp8).
func (d *Device) fp8() bool { return d.shape.DispatchWidth() != d.shape.Hidden }

func (d *Device) groupOf(r int) *group {
	for i := range d.groups {
		if g := &d.groups[i]; r >= g.first && r < g.first+g.n {
			return g
		}
	}
	panic(fmt.Sprintf("deepep: rank %d in no group", r))
}

// Close frees every buffer and the signals.
func (d *Device) Close() error {
	var first error
	keep := func(err error) {
		if first == nil && err != nil {
			first = err
		}
	}
	for r := range d.st {
		s, rk := &d.st[r], d.ranks[r]
		keep(device.Free(rk.Dev, &s.queues, &s.fixed, &s.recvX, &s.recvSrc, &s.recvIdx, &s.recvW, &s.permRow, &s.order, &rk.ExpertX, &rk.ExpertProbs,
			&rk.ExpertDY, &rk.DX, &rk.DProbs))
		s.recv, s.expert, s.grads, s.gradsFixed = device.RowCapacity{}, device.RowCapacity{}, device.RowCapacity{}, 0
	}
	for i := range d.groups {
		keep(device.Free(d.groups[i].dev, &d.groups[i].desc))
	}
	if d.sig != nil {
		keep(d.sig.Free())
		d.sig = nil
	}
	return first
}

// dispatchStage is deepep.cu's DE_STAGE: the bytes of shared memory each
// warp of a receiving dispatch block stages its rows' bulk copies through
// (two halves, one piece coming in while the other goes out).
const dispatchStage = 4096

// dispatchShared is the dispatch's dynamic shared memory for blocks of
// warps warps: each warp's two mbarriers (16 bytes) and its stage. The
// 16-byte path (sm_80, NVRTC 11.8) leaves it unused.
func dispatchShared(warps int) int { return warps * (16 + dispatchStage) }
