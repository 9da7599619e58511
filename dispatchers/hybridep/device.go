package hybridep

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels/comm"
	"github.com/moebench/moebench/kernels/device"
)

// The cuda implementation: the design's kernels (kernels/cuda/hybridep.cu)
// as co-resident launches, one per device covering its ranks, each of the
// dispatcher's phases issued for the device's ranks from the call of its
// last rank, on the device's thread (Capabilities.Grouped): the devices'
// launches go out at once. Every cross-rank wait of the kernels has the
// run's --comm-timeout; a wait that gives up is reported after the step
// (StepError) with the rank, phase and wait.
//
// In a run that spans processes (DeviceRank.Comm set, another process's
// ranks without a Dev) every NVLink domain lies inside one process: its
// ranks keep storing into each other's memory, and between domains the
// inter-domain path goes over the run's NCCL communicator. The routing map
// is all-gathered in two parts: the kernel's peer stores into this
// process's ranks, then NCCL send/recv of each rank's rows with every rank
// of the other processes, so that each rank's preprocessing — and the
// sizes of its inter-domain transfers, its own receive counts among them
// — comes from the whole map without reading another process's memory.
// Nothing is allocated, launched or read for another process's ranks: in
// the he_rank and barrier-flag tables their entries name this device's
// first rank's buffers (the kernels' stores for them land where that
// rank's own stores already put the same bytes), and each rank's barrier
// flags for them are set passed once (they meet through NCCL's order on
// the streams instead).

// NewDevice returns the cuda implementation.
func NewDevice(impl string, env dispatchers.Env) (dispatchers.DeviceDispatcher, error) {
	if impl != dispatchers.ImplNative {
		return nil, &dispatchers.UnavailableError{Name: Name, Impl: impl,
			Reason: "no library implementation registered in this build (dispatchers/ncclep registers NCCL EP's high-throughput mode, HybridEP's kernels)"}
	}
	timeout := env.CommTimeout
	if timeout == 0 {
		timeout = dispatchers.DefaultCommTimeout
	}
	sms := env.SMs
	if sms == 0 {
		sms = DefaultSMs
	}
	cfg := Config{SMs: sms, Domain: env.Domain, Chunk: DefaultChunk, PreprocessSMs: env.PreprocessSMs, PermuteSMs: env.PermuteSMs}
	return &Device{cfg: cfg, timeout: timeout, fp8: env.IsFP8()}, nil
}

// LaunchBudgets are the blocks per rank of the preprocessing's and the
// permute's launches (Config's, or their defaults, fitted in Bind).
func (d *Device) LaunchBudgets() (preprocess, permute int) { return d.preSMs, d.permuteSMs }

// Device is hybridep on device ranks.
type Device struct {
	cfg     Config
	timeout time.Duration
	fp8     bool // --precision fp8: the forward dispatch moves packed e4m3 rows with their scales (Shape.DispatchHidden)
	shape   dispatchers.Shape
	ranks   []*dispatchers.DeviceRank
	g       geom
	parts   []part // one per device, its ranks contiguous
	st      []devRank
	sig     *comm.Signals
	comm    comm.Comm // the inter-domain path (several domains)
	// world: the run spans processes; comm is the run's communicator (not
	// closed here) and ranks without a Dev are another process's
	world bool
	progs programs
	bug   int32 // tests: breaks the kernels' protocol (hybridep.cu's BUG_*)
	// noBulk (tests): the kernels' 16-byte path where the bulk-copy path
	// would be compiled (MB_NO_BULK; hostsim compiles the bulk path)
	noBulk bool
	moved  moved // the last step's, from the routing map
	// preSMs, permuteSMs: the blocks of each rank's preprocessing and
	// permute launches (Config's, fitted in Bind)
	preSMs, permuteSMs int
	// backward: the last step ran the backward (Traffic counts its bytes);
	// set by the first part's thread, reset in its allgather
	backward bool
}

// part is one device's share: its ranks [first, first+count), the
// stream its launches go on (its first rank's) and its he_rank table.
type part struct {
	dev          device.Device
	first, count int
	stream       device.Stream
	table        device.Addr
	flags        device.Addr // every rank's barrier flags (hybridep.cu's flags)
	uploaded     []uint64
	epoch        int32 // device barriers passed (every part counts alike)
	sends, recvs []comm.PeerTransfer
}

// devRank is one rank's buffers (device memory of its device).
type devRank struct {
	gmap, dprobs, meta, todom, recvX, recvP, idX, idP, sendX, sendP, sync, flags device.Addr
	counts                                                                       []int32 // META_COUNTS, read after the preprocessing
	out                                                                          device.RowCapacity
	fixed                                                                        int64
	grads                                                                        device.RowCapacity // the backward's ExpertDY
	gradsFixed                                                                   int64              // DX and DProbs
	ready, done                                                                  device.Event       // its stream before a launch; the launch, for its stream
}

func (d *Device) Name() string { return Name }
func (d *Device) Impl() string { return dispatchers.ImplNative }

// ldp is the probabilities a token carries for its domain, padded to 16
// bytes (bulk copies move 16-byte multiples).
func (g geom) ldp() int { return (g.L*g.D + 3) / 4 * 4 }

// metaInts are the offsets of hybridep.cu's meta (META_*).
func (g geom) metaInts() (s2d, d2e, counts, chunkAt, send, recv, total int) {
	s2d = 0
	d2e = s2d + g.M*g.T*g.D
	counts = d2e + g.N*g.T*g.L
	chunkAt = counts + g.L + 1 + 2*g.M
	send = chunkAt + g.N*g.chunks + 1
	recv = send + g.M*g.T
	return s2d, d2e, counts, chunkAt, send, recv, recv + g.M*g.T
}

// Bind checks that the run can be had (the design's limits, peer access in
// each domain and for the map's all-gather, NCCL across domains, the SM
// budget on each device), allocates the worst-case buffers and compiles
// nothing yet (the kernels compile at their first launch).
func (d *Device) Bind(shape dispatchers.Shape, ranks []*dispatchers.DeviceRank) error {
	if len(ranks) != shape.EP {
		return fmt.Errorf("hybridep: %d ranks, shape says EP = %d", len(ranks), shape.EP)
	}
	if err := d.cfg.check(shape); err != nil {
		return err
	}
	d.shape, d.ranks = shape, ranks
	D := d.cfg.domain(shape.EP)
	d.g = geom{N: shape.EP, T: shape.Tokens, E: shape.Experts, L: shape.LocalExperts(), D: D, M: shape.EP / D,
		chunk: d.cfg.Chunk, chunks: (shape.Tokens + d.cfg.Chunk - 1) / d.cfg.Chunk}
	unavailable := func(format string, a ...any) error {
		return &dispatchers.UnavailableError{Name: Name, Impl: dispatchers.ImplNative, Reason: fmt.Sprintf(format, a...)}
	}
	devs := make([]device.Device, len(ranks)) // nil: another process's rank
	var local []device.Device                 // this process's ranks', in rank order
	var streams []device.Stream
	for r, rk := range ranks {
		if rk.Dev == nil {
			d.world = true
			continue
		}
		devs[r] = rk.Dev
		local, streams = append(local, rk.Dev), append(streams, rk.Stream)
		if len(d.parts) > 0 && d.parts[len(d.parts)-1].first+d.parts[len(d.parts)-1].count != r {
			return fmt.Errorf("hybridep: this process's ranks must be contiguous (rank %d)", r)
		}
		if r > 0 && rk.Dev != ranks[r-1].Dev {
			for _, p := range d.parts {
				if p.dev == rk.Dev {
					return fmt.Errorf("hybridep: the ranks of a device must be contiguous (rank %d)", r)
				}
			}
		}
		if len(d.parts) == 0 || d.parts[len(d.parts)-1].dev != rk.Dev {
			d.parts = append(d.parts, part{dev: rk.Dev, first: r, stream: rk.Stream})
		}
		d.parts[len(d.parts)-1].count++
	}
	if len(d.parts) == 0 {
		return fmt.Errorf("hybridep: none of the %d ranks is this process's", len(ranks))
	}
	for a := range ranks {
		for b := range ranks {
			switch {
			case a/D != b/D:
			case devs[a] != nil && devs[b] == nil:
				return unavailable("ranks %d and %d share an NVLink domain (--domain %d) but rank %d is this process's and rank %d another process's: "+
					"a domain's ranks store into each other's memory, so a domain must lie inside one process; give a --domain that divides the %d ranks each process drives",
					min(a, b), max(a, b), D, a, b, len(local))
			case devs[a] == nil:
			case devs[a] != nil && !devs[a].Reaches(devs[b]):
				return unavailable("ranks %d and %d share an NVLink domain (--domain %d) but rank %d's GPU has no peer access to rank %d's: their stores could not reach it", a, b, D, a, b)
			}
		}
	}
	fit := dispatchers.MaxSMBudget // the fewest SMs a rank has to itself (its GPU's ÷ its ranks there)
	for _, p := range d.parts {
		if sms := p.dev.SMCount(); d.cfg.SMs > sms {
			return unavailable("--sms %d: a rank's budget above the %d SMs of %s", d.cfg.SMs, sms, p.dev.Name())
		}
		fit = min(fit, max(1, p.dev.SMCount()/p.count))
	}
	d.preSMs, d.permuteSMs = min(DefaultPreprocessSMs, fit), fit
	for _, b := range []struct {
		flag string
		n    int
		to   *int
	}{{"--preprocess-sms", d.cfg.PreprocessSMs, &d.preSMs}, {"--permute-sms", d.cfg.PermuteSMs, &d.permuteSMs}} {
		switch {
		case b.n > fit:
			return unavailable("%s %d: above the %d SMs a rank has to itself here (its GPU's SMs ÷ its ranks there)", b.flag, b.n, fit)
		case b.n > 0:
			*b.to = b.n
		}
	}
	if d.world { // the run's communicator, over every process's ranks
		if d.comm = ranks[d.parts[0].first].Comm; d.comm == nil {
			return fmt.Errorf("hybridep: rank %d of a run that spans processes has no communicator", d.parts[0].first)
		}
	} else if d.g.M > 1 {
		var err error
		var no *comm.NoCommError
		if d.comm, err = comm.OpenComm(ranks[0].Threads, local, streams); errors.As(err, &no) {
			return unavailable("the inter-domain path (NCCL send/recv between the same local ranks of different domains, --domain %d of EP %d): %s", D, shape.EP, no.Reason)
		} else if err != nil {
			return err
		}
	}
	if err := d.alloc(local, streams); err != nil {
		d.Close()
		return err
	}
	limit := 0 // the least shared memory a block of a device may have
	for _, p := range d.parts {
		if s, ok := p.dev.(interface{ SharedPerBlock() int }); ok && s.SharedPerBlock() > 0 && (limit == 0 || s.SharedPerBlock() < limit) {
			limit = s.SharedPerBlock()
		}
	}
	d.progs = d.g.programs(shape, limit, d)
	if err := d.fits(limit); err != nil {
		d.Close()
		return err
	}
	if err := d.resident(); err != nil {
		d.Close()
		return err
	}
	for _, rk := range ranks {
		rk.ExpertRows = make([]int, d.g.L)
	}
	return nil
}

// alloc allocates every rank's fixed buffers (worst case), events, flag
// tables and signals, and the devices' he_rank tables: this process's
// ranks' (devs, in rank order, and their streams).
func (d *Device) alloc(devs []device.Device, streams []device.Stream) error {
	g, h := d.g, int64(d.shape.Hidden)
	N, T, M := int64(g.N), int64(g.T), int64(g.M)
	ldp := int64(g.ldp())
	_, _, counts, _, _, _, metaInts := g.metaInts()
	metaInts += g.preScratch() // the preprocessing's scratch after it
	other := max(M-1, 1)
	d.st = make([]devRank, g.N)
	// each rank's barrier flags: zero, and passed for another process's
	// ranks (mb_barrier waits for each rank's flag ≥ the epoch)
	flags0 := make([]int32, N)
	for r, rk := range d.ranks {
		if rk.Dev == nil {
			flags0[r] = math.MaxInt32
		}
	}
	for r, rk := range d.ranks {
		if rk.Dev == nil {
			continue
		}
		s := &d.st[r]
		var err error
		// the map in whole 16-byte units (Traffic reads it back as 16-bit words)
		bufs := []device.RowBuffer{{P: &s.gmap, PerRow: (N*T*int64(g.E) + 15) / 16 * 16}, {P: &s.dprobs, PerRow: 4 * T * M * ldp},
			{P: &s.meta, PerRow: 4 * int64(metaInts)}, {P: &s.todom, PerRow: T * M},
			{P: &s.recvX, PerRow: 2 * N * T * h}, {P: &s.recvP, PerRow: 4 * N * T * ldp},
			{P: &s.idX, PerRow: 2 * other * T * h}, {P: &s.idP, PerRow: 4 * other * T * ldp},
			{P: &s.sendX, PerRow: 2 * other * T * h}, {P: &s.sendP, PerRow: 4 * other * T * ldp},
			{P: &s.sync, PerRow: 8}, {P: &s.flags, PerRow: 4 * N}}
		if s.fixed, err = device.Resize(rk.Dev, 1, bufs...); err != nil {
			return err
		}
		// the barriers count from zero; the metadata starts defined
		if err := rk.Dev.Fill16(s.sync, 0, 4, rk.Stream); err != nil {
			return err
		}
		if err := rk.Dev.Upload(s.flags, flags0, rk.Stream); err != nil {
			return err
		}
		if err := rk.Dev.Fill16(s.meta, 0, 2*int64(metaInts), rk.Stream); err != nil {
			return err
		}
		s.counts = make([]int32, metaInts-counts)[:g.L+1+2*g.M]
		if s.ready, err = rk.Dev.NewEvent(); err != nil {
			return err
		}
		if s.done, err = rk.Dev.NewEvent(); err != nil {
			return err
		}
	}
	for a, rk := range d.ranks {
		for b, rb := range d.ranks {
			if rk.Dev != nil && rb.Dev != nil && !rk.Dev.Reaches(rb.Dev) {
				return &dispatchers.UnavailableError{Name: Name, Impl: dispatchers.ImplNative, Reason: fmt.Sprintf(
					"the routing map's all-gather and the device barriers store into the memory of every rank of this process: %v", &device.NoPeerError{From: a, To: b})}
			}
		}
	}
	var err error
	if d.sig, err = comm.NewSignals(devs, streams, 0); err != nil {
		return err
	}
	d.sig.Names = phaseNames
	for i := range d.parts {
		p := &d.parts[i]
		if p.table, err = p.dev.Alloc(8 * heRankFields * N); err != nil {
			return err
		}
		if p.flags, err = p.dev.Alloc(8 * N); err != nil {
			return err
		}
		t := make([]uint64, N)
		for r, rk := range d.ranks {
			t[r] = uint64(d.st[r].flags)
			if rk.Dev == nil {
				t[r] = uint64(d.st[p.first].flags)
			}
		}
		if err := p.dev.Upload(p.flags, t, p.stream); err != nil {
			return err
		}
	}
	return nil
}

// heRankFields is the pointers of hybridep.cu's he_rank.
const heRankFields = 25

// he_rank's fields that a kernel reads of another rank: the global map
// (the all-gather's stores) and the receive buffer (dispatch's stores,
// combine's partial sums).
const (
	fieldGmap  = 3
	fieldRecvX = 7
	fieldRecvP = 8
)

// table is part p's he_rank table, as hybridep.cu lays it out: every
// pointer of p's own ranks, and of the other ranks only the buffers the
// kernels reach across ranks (allocated in Bind, never changed), so that
// it reads nothing another device's thread may be sizing (the layer's and
// the backward's buffers).
func (d *Device) table(p *part) []uint64 {
	t := make([]uint64, heRankFields*len(d.ranks))
	for r, rk := range d.ranks {
		s, f := &d.st[r], t[r*heRankFields:(r+1)*heRankFields]
		if rk.Dev == nil { // another process's: the all-gather's stores land in p's first rank's map, where they already go
			f[fieldGmap] = uint64(d.st[p.first].gmap)
			continue
		}
		if r < p.first || r >= p.first+p.count {
			f[fieldGmap], f[fieldRecvX], f[fieldRecvP] = uint64(s.gmap), uint64(s.recvX), uint64(s.recvP)
			continue
		}
		for i, ptr := range [heRankFields]device.Addr{rk.X, rk.Idx, rk.Probs, s.gmap, s.dprobs, s.meta, s.todom, s.recvX, s.recvP,
			s.idX, s.idP, s.sendX, s.sendP, rk.ExpertX, rk.ExpertProbs, rk.ExpertY, rk.Y, rk.Shared, s.sync,
			rk.DY, rk.ExpertDY, rk.ExpertDX, rk.ExpertDProbs, rk.DX, rk.DProbs} {
			f[i] = uint64(ptr)
		}
	}
	return t
}

// upload gives part p's device its current table, unless it has it.
func (d *Device) upload(p *part) error {
	t := d.table(p)
	if equalU64(t, p.uploaded) {
		return nil
	}
	if err := p.dev.Upload(p.table, t, p.stream); err != nil {
		return err
	}
	p.uploaded = t
	return nil
}

func equalU64(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// last runs f for the part whose last rank is r (nothing for other ranks).
func (d *Device) last(f func(p *part) error) func(int) error {
	return func(r int) error {
		for i := range d.parts {
			if p := &d.parts[i]; r == p.first+p.count-1 {
				return f(p)
			}
		}
		return nil
	}
}

// Forward: HybridEP's, every one but the experts issued once per device
// (Grouped), by the call of its last rank.
func (d *Device) Forward(experts func(rank int) error) []dispatchers.Step {
	last := d.last
	return []dispatchers.Step{{Name: "allgather", Run: last(d.allgather)}, {Name: "preprocess", Run: last(d.preprocess)},
		{Name: "dispatch", Run: last(d.dispatch)}, {Name: dispatchers.ExpertPhases[0], Run: experts}, {Name: "combine", Run: last(d.combine)}}
}

// Grouped: the collective phases, forward and backward.
func (d *Device) Grouped(phase string) bool {
	return phase != dispatchers.ExpertPhases[0] && phase != dispatchers.ExpertBackwardPhases[0]
}

// launch queues p's part of kernel k (after its ranks' streams' work, its
// ranks' streams after it), grid blocks with args; with table, p's device
// gets every rank's current buffers first (upload: a phase after the one
// that changed them).
func (d *Device) launch(p *part, k string, table bool, grid int, args ...any) error {
	for r := p.first + 1; r < p.first+p.count; r++ {
		rk := d.ranks[r]
		if err := rk.Dev.Record(d.st[r].ready, rk.Stream); err != nil {
			return err
		}
		if err := p.dev.Wait(p.stream, d.st[r].ready); err != nil {
			return err
		}
	}
	if table {
		if err := d.upload(p); err != nil {
			return err
		}
	}
	err := p.dev.LaunchResident(d.progs.col[k], grid, p.stream, args...)
	var re *device.ResidencyError
	if errors.As(err, &re) {
		return &dispatchers.UnavailableError{Name: Name, Impl: dispatchers.ImplNative, Reason: re.Error()}
	}
	if err != nil {
		return err
	}
	if p.count > 1 {
		if err := p.dev.Record(d.st[p.first].done, p.stream); err != nil {
			return err
		}
		for r := p.first + 1; r < p.first+p.count; r++ {
			if err := p.dev.Wait(d.ranks[r].Stream, d.st[p.first].done); err != nil {
				return err
			}
		}
	}
	return nil
}

func (d *Device) budget(p *part) int { return p.count * d.cfg.SMs }

// resident says why a device cannot hold its ranks' blocks of a kernel all
// at once (cuOccupancyMaxActiveBlocksPerMultiprocessor × SMs on a GPU,
// which compiles the kernels now; one block per SM on Emu).
func (d *Device) resident() error {
	type residency interface {
		Residency(p *device.Program) (int, error)
	}
	for i := range d.parts {
		p := &d.parts[i]
		for _, k := range []string{"allgather", "preprocess-count", "preprocess", "dispatch", "permute", "combine", "dispatch-bwd", "permute-bwd", "combine-bwd"} {
			prog, grid, flag, budget := d.progs.col[k].Prog, d.budget(p), "--sms", d.cfg.SMs
			switch k {
			case "preprocess-count", "preprocess":
				grid, flag, budget = p.count*d.preSMs, "--preprocess-sms", d.preSMs
			case "permute", "permute-bwd":
				grid, flag, budget = p.count*d.permuteSMs, "--permute-sms", d.permuteSMs
			}
			per := 1
			if r, ok := p.dev.(residency); ok {
				var err error
				if per, err = r.Residency(prog); err != nil {
					return err
				}
			}
			if grid > per*p.dev.SMCount() {
				return &dispatchers.UnavailableError{Name: Name, Impl: dispatchers.ImplNative, Reason: fmt.Sprintf(
					"%s %d for each of %d ranks on %s: %s", flag, budget, p.count, p.dev.Name(),
					(&device.ResidencyError{Kernel: prog.Kernel, Device: p.dev.Name(), Grid: grid, Block: prog.Block, Shared: prog.Shared, PerSM: per, SMs: p.dev.SMCount()}).Error())}
			}
		}
	}
	return nil
}

// fits says why a kernel cannot run where a block may have limit bytes of
// shared memory (0: none known), before anything is launched: its FIFOs at
// their fewest stages and a bound of its static shared memory above it.
func (d *Device) fits(limit int) error {
	if limit <= 0 {
		return nil
	}
	for _, k := range slices.Sorted(maps.Keys(d.progs.col)) {
		if p := d.progs.col[k].Prog; p.Shared+staticShared > limit {
			return &dispatchers.UnavailableError{Name: Name, Impl: dispatchers.ImplNative, Reason: fmt.Sprintf(
				"hidden %d: %s needs %d B of shared memory a block (%d B of FIFOs at their fewest stages, and up to %d B static), above the %d B a block of %s may have (its opt-in limit)",
				d.shape.Hidden, p.Kernel, p.Shared+staticShared, p.Shared, staticShared, limit, d.parts[0].dev.Name())}
		}
	}
	return nil
}

// collective is the argument list of the kernels with device barriers.
func (d *Device) collective(p *part, epoch int32, extra ...any) []any {
	return append([]any{d.sig.Comm(p.dev, d.timeout), int32(p.first), int32(d.cfg.SMs), epoch, p.table, p.flags}, extra...)
}

func (d *Device) allgather(p *part) error {
	if p == &d.parts[0] {
		d.backward = false
	}
	err := d.launch(p, "allgather", true, d.budget(p), d.collective(p, p.epoch+1)...)
	p.epoch++
	if err != nil || !d.world {
		return err
	}
	return d.gatherMap(p)
}

// gatherMap, in a run that spans processes, completes the all-gather of
// the routing map for p's ranks over the run's communicator: each sends
// its own rows (T·E bytes, stored by the kernel) to every rank of the
// other processes and receives theirs into its map, on its stream after
// the kernel.
func (d *Device) gatherMap(p *part) error {
	rows := int64(d.g.T * d.g.E)
	for x := p.first; x < p.first+p.count; x++ {
		gmap := d.st[x].gmap
		p.sends, p.recvs = p.sends[:0], p.recvs[:0]
		for y, ry := range d.ranks {
			if ry.Dev != nil {
				continue
			}
			p.sends = append(p.sends, comm.PeerTransfer{Peer: y, Buf: gmap + device.Addr(int64(x)*rows), Bytes: rows})
			p.recvs = append(p.recvs, comm.PeerTransfer{Peer: y, Buf: gmap + device.Addr(int64(y)*rows), Bytes: rows})
		}
		if err := d.comm.Exchange(x, p.sends, p.recvs); err != nil {
			return err
		}
	}
	return nil
}

// preprocess runs the scan on p's ranks (its two launches, their own
// budget) and reads their counts (HybridEP's blocking mode: the host sizes
// the expert-major rows). Its table is the all-gather's: the rows it sizes
// are other devices' too, in this phase.
func (d *Device) preprocess(p *part) error {
	for _, k := range []string{"preprocess-count", "preprocess"} {
		if err := d.launch(p, k, false, p.count*d.preSMs, int32(p.first), int32(d.preSMs), p.table); err != nil {
			return err
		}
	}
	_, _, counts, _, _, _, _ := d.g.metaInts()
	for r := p.first; r < p.first+p.count; r++ {
		s, rk := &d.st[r], d.ranks[r]
		if err := rk.Dev.Download(s.counts, s.meta+device.Addr(4*counts), rk.Stream); err != nil {
			return err
		}
	}
	if err := d.sig.Recorded(); err != nil { // the all-gather's barrier (other devices' kernels may still run)
		return err
	}
	w := int64(d.shape.DispatchWidth()) // ExpertX's rows: as dispatched (packed fp8 rows at fp8)
	for r := p.first; r < p.first+p.count; r++ {
		s, rk, rows := &d.st[r], d.ranks[r], 0
		for e := range d.g.L {
			rk.ExpertRows[e] = int(s.counts[e])
			rows += int(s.counts[e])
		}
		if err := s.out.Ensure(rk.Dev, rk.Stream, rows, device.RowBuffer{P: &rk.ExpertX, PerRow: 2 * w}, device.RowBuffer{P: &rk.ExpertProbs, PerRow: 4}); err != nil {
			return err
		}
	}
	return nil
}

// exchange is the inter-domain path for p's ranks: each rank's rows for
// the same local rank of every other domain, with NCCL (combine: the
// pre-reduced sums, the other way), each rank's side from p's thread. In
// the backward (bwd) the dispatch direction moves rows alone (the output
// gradients) and the combine direction rows and their probability
// gradients.
func (d *Device) exchange(p *part, combine, bwd bool) error {
	g, h := d.g, int64(d.shape.Hidden)
	if !combine && !bwd { // the forward dispatch's rows (packed fp8 rows at fp8)
		h = int64(d.shape.DispatchWidth())
	}
	T, ldp := int64(g.T), int64(g.ldp())
	for x := p.first; x < p.first+p.count; x++ {
		s, nx := &d.st[x], x/g.D
		p.sends, p.recvs = p.sends[:0], p.recvs[:0]
		for y := range d.ranks {
			ny := y / g.D
			if x%g.D != y%g.D || nx == ny {
				continue
			}
			// x's tile of domain ny, in its send and its receive buffers;
			// out: x's tokens domain ny needs, in: y's tokens domain nx
			// needs — both from x's own preprocessing of the whole map
			// (its sends to ny, its receives from ny: y's sends to nx), so
			// that y may be another process's rank
			at := int64(tile(ny, nx)) * T
			out, in := int64(s.counts[g.L+1+ny]), int64(s.counts[g.L+1+g.M+ny])
			// probabilities with the dispatch's rows in the forward, with the
			// combine's in the backward
			probs := combine == bwd
			if !combine { // x's tokens to y, y's to x
				p.sends = append(p.sends, comm.PeerTransfer{Peer: y, Buf: s.sendX + device.Addr(at*2*h), Bytes: out * 2 * h})
				p.recvs = append(p.recvs, comm.PeerTransfer{Peer: y, Buf: s.idX + device.Addr(at*2*h), Bytes: in * 2 * h})
				if probs {
					p.sends = append(p.sends, comm.PeerTransfer{Peer: y, Buf: s.sendP + device.Addr(at*4*ldp), Bytes: out * 4 * ldp})
					p.recvs = append(p.recvs, comm.PeerTransfer{Peer: y, Buf: s.idP + device.Addr(at*4*ldp), Bytes: in * 4 * ldp})
				}
			} else { // the pre-reduced sums back: of y's tokens to y, of x's from y
				p.sends = append(p.sends, comm.PeerTransfer{Peer: y, Buf: s.sendX + device.Addr(at*2*h), Bytes: in * 2 * h})
				p.recvs = append(p.recvs, comm.PeerTransfer{Peer: y, Buf: s.idX + device.Addr(at*2*h), Bytes: out * 2 * h})
				if probs {
					p.sends = append(p.sends, comm.PeerTransfer{Peer: y, Buf: s.sendP + device.Addr(at*4*ldp), Bytes: in * 4 * ldp})
					p.recvs = append(p.recvs, comm.PeerTransfer{Peer: y, Buf: s.idP + device.Addr(at*4*ldp), Bytes: out * 4 * ldp})
				}
			}
		}
		if err := d.comm.Exchange(x, p.sends, p.recvs); err != nil {
			return err
		}
	}
	return nil
}

func (d *Device) dispatch(p *part) error { return d.dispatchOf(p, false) }

// dispatchOf is the dispatch (bwd: of the output gradients, the combine's
// backward): the inter-domain path first, then the fan-out, then the
// permute (its own kernel and budget, --permute-sms).
func (d *Device) dispatchOf(p *part, bwd bool) error {
	pack, dispatch := "pack", "dispatch"
	if bwd {
		pack, dispatch = "pack-bwd", "dispatch-bwd"
	}
	if d.g.M > 1 {
		if err := d.launch(p, pack, true, d.budget(p), int32(p.first), int32(d.cfg.SMs), p.table); err != nil {
			return err
		}
		if err := d.exchange(p, false, bwd); err != nil {
			return err
		}
	}
	err := d.launch(p, dispatch, true, d.budget(p), d.collective(p, p.epoch+1, d.bug)...)
	p.epoch += 2
	if err != nil {
		return err
	}
	permute := "permute"
	if bwd {
		permute = "permute-bwd"
	}
	return d.launch(p, permute, false, p.count*d.permuteSMs, int32(p.first), int32(d.permuteSMs), p.table)
}

func (d *Device) combine(p *part) error { return d.combineOf(p, false) }

// combineOf is the combine (bwd: of the input and probability gradients,
// the dispatch's backward): stage 1, the inter-domain path, stage 2.
func (d *Device) combineOf(p *part, bwd bool) error {
	k := "combine"
	args := func(epoch, stage int32) []any { return d.collective(p, epoch, stage) }
	if bwd {
		k = "combine-bwd"
		args = func(epoch, stage int32) []any { return d.collective(p, epoch, stage, d.bug) }
	}
	stage := int32(0)
	if d.g.M > 1 {
		stage = 1
	}
	if err := d.launch(p, k, true, d.budget(p), args(p.epoch+1, stage)...); err != nil {
		return err
	}
	if d.g.M > 1 {
		if err := d.exchange(p, true, bwd); err != nil {
			return err
		}
		if err := d.launch(p, k, true, d.budget(p), args(p.epoch+2, 2)...); err != nil {
			return err
		}
	}
	p.epoch += 2
	return nil
}

// Traffic counts as the host implementation does, from the last step's
// routing map (this process's first rank's copy, read back: the whole
// map, every process's ranks' rows, so every process counts the run's).
func (d *Device) Traffic() dispatchers.Traffic {
	g := d.g
	b := make([]uint16, (g.N*g.T*g.E+1)/2)
	first := d.parts[0].first
	rk := d.ranks[first]
	if err := rk.Dev.Download(b, d.st[first].gmap, rk.Stream); err != nil {
		return dispatchers.Traffic{Formula: "not counted: " + err.Error()}
	}
	gmap := make([]bool, g.N*g.T*g.E)
	for i := range gmap {
		gmap[i] = b[i/2]>>(8*(i%2))&0xff != 0
	}
	mv := g.countMoves(gmap)
	t := mv.traffic(d.shape, g.D, d.fp8)
	if d.backward { // the backward moves the forward's rows (moved.backwardTraffic)
		mv.backwardTraffic(&t, d.shape, g.D)
	}
	if d.comm != nil {
		t.Formula += "; inter-domain path moved by " + d.comm.Name()
	}
	if d.world {
		t.Formula += "; the run spans processes: each rank's routing-map rows (tokens × experts bytes) also go over it to every rank of the other processes, not counted above"
	}
	return t
}

// CheckStep reports the kernels' cross-rank waits that gave up in the step
// (the layer calls it once the step's streams are synchronized).
func (d *Device) CheckStep() error { return d.sig.Err() }

// Transport names NCCL when the inter-domain path uses it.
func (d *Device) Transport() string {
	if d.comm == nil {
		return ""
	}
	return d.comm.Name() + " between domains"
}

// Footprint is the bytes of rank r's buffers, the expert-major rows
// included.
func (d *Device) Footprint(r int) int64 {
	s := &d.st[r]
	return s.fixed + s.out.Bytes + s.grads.Bytes + s.gradsFixed
}

// Close frees every buffer.
func (d *Device) Close() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	for r := range d.st {
		s, rk := &d.st[r], d.ranks[r]
		if rk.Dev == nil { // another process's
			continue
		}
		keep(device.Free(rk.Dev, &s.gmap, &s.dprobs, &s.meta, &s.todom, &s.recvX, &s.recvP, &s.idX, &s.idP, &s.sendX, &s.sendP,
			&s.sync, &s.flags, &rk.ExpertX, &rk.ExpertProbs, &rk.ExpertDY, &rk.DX, &rk.DProbs))
		s.fixed, s.out, s.grads, s.gradsFixed = 0, device.RowCapacity{}, device.RowCapacity{}, 0
	}
	for i := range d.parts {
		keep(device.Free(d.parts[i].dev, &d.parts[i].table, &d.parts[i].flags))
	}
	if d.sig != nil {
		keep(d.sig.Free())
		d.sig = nil
	}
	if d.comm != nil && !d.world { // the run's is the layer's
		keep(d.comm.Close())
	}
	d.comm = nil
	return first
}

// phaseNames names hybridep.cu's phases and waits.
var phaseNames = comm.PhaseNames(map[int]string{1: "allgather", 2: "dispatch", 3: "combine",
	4: "combine-bwd (the dispatch kernel)", 5: "dispatch-bwd (the combine kernel)"},
	map[int]string{1: "its blocks' barrier", 2: "FIFO slot empty", 3: "FIFO slot full"}, "barrier flag")

// Protocol bugs the tests inject (hybridep.cu's BUG_*).
const (
	BugNoArrive     = 1 // the rank's dispatch loader never arrives for its first item
	BugNoBarrier    = 2 // the rank never reaches dispatch's second barrier
	BugBwdNoBarrier = 3 // the rank's backward combine (dispatch-bwd) ends before its first barrier
)

// Break makes the next steps' kernels break their protocol on purpose
// (kind, one of the Bug constants, on rank): for the tests, which see
// the kernels' timeouts name the rank, phase and wait.
func (d *Device) Break(kind, rank int) { d.bug = int32(kind | rank<<8) }

// Buffers are rank r's buffers as the dispatcher allocated them: the
// preallocated ones at HybridEP's worst case, the expert-major rows at the
// last step's size.
func (d *Device) Buffers(r int) []dispatchers.Buffer {
	g, s := d.g, &d.st[r]
	N, T, E, M := int64(g.N), int64(g.T), int64(g.E), int64(g.M)
	row, ldp := 2*int64(d.shape.Hidden), int64(g.ldp())
	_, _, _, _, _, _, meta := g.metaInts()
	meta += g.preScratch()
	b := []dispatchers.Buffer{
		{Name: "receive", Bytes: T * N * row, About: "worst case, every rank's every token (tokens per rank × ranks, HybridEP's preallocation): the rows dispatch stores, then combine's partial sums (one shared buffer)"},
		{Name: "receive-probs", Bytes: T * N * ldp * 4, About: "worst case: each received token's fp32 probabilities for the L·D experts of the domain, padded to 16-byte rows"},
	}
	if M > 1 {
		b = append(b, dispatchers.Buffer{Name: "inter-domain", Bytes: 2 * T * (M - 1) * (row + 4*ldp),
			About: "tokens per rank × the other domains, in and out (the NCCL transfers' buffers): rows and probabilities (dispatch), pre-reduced sums (combine)"})
	}
	return append(b,
		dispatchers.Buffer{Name: "routing-map", Bytes: N*T*E + T*M*ldp*4, About: "the all-gathered global routing map (bool [N·T, E]) and the rank's fp32 probabilities per domain [T, M, L·D padded]"},
		dispatchers.Buffer{Name: "metadata", Bytes: 4*int64(meta) + T*M + 8 + 4*N, About: "sparse_to_dense, dense_to_expert (worst case), counts, chunk layout and inter-domain slots (int32), the preprocessing's scratch (each map tile's column counts and bits), attn_to_rdma (bool [T, M]), the barrier's counters and flags"},
		dispatchers.Buffer{Name: "permute", Bytes: s.out.Bytes, About: "the expert-major rows and probabilities the grouped GEMM reads (sized by the preprocessing's count; grown only)"},
	)
}
