package layer

// A run that spans processes (launched by srun, mpirun, torchrun or with
// MOEBENCH_RANK/MOEBENCH_WORLD; internal/launch): each process drives the
// GPUs of its block of EP ranks, one thread each, and NCCL — one
// communicator over every rank, made with NCCL's own bootstrap — moves the
// data between them. Every process builds the same host twin from the seed
// and checks its own ranks' outputs; the check's verdict and, after the
// timed steps, every rank's samples are all-gathered over the same
// communicator, so that rank 0 writes one record for the run.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/internal/launch"
	"github.com/moebench/moebench/kernels/comm"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// Distributed is this process's share of a distributed run.
type Distributed struct {
	Rendezvous        *launch.Rendezvous
	watch             *launch.Watch
	first, PerProcess int // its ranks: first … first+per−1, one GPU each
	firstGPU          int // the GPU ordinal of its first rank on its node
	comm              comm.Comm
	description       string           // its ranks, process and node, as messages name them
	agreed            bool             // the processes agreed that every one is ready (or not) to meet
	prog              *setup.Progress  // the run's progress line, which says whom an agreement waits for
	Settings          []launch.Setting // what every process must share (settingsOf)
	// the agreement on whether to stop (agreeStop): on its first rank's
	// GPU, this process's code then every process's (one word each), and
	// the work of the GPU's thread, made once
	stopBuf           device.Addr
	stopMine, stopAll []uint64
	stopWork          func(dev int) error
}

// MeetProcesses is the meeting of a run's processes before any builds its
// layer: each gives the others every setting of the run (settingsOf) and
// the run goes on only where all are the same; else it is refused on every
// process as a usage error naming each setting that differs with each
// process's value. A process that never arrives is named within
// --rendezvous-timeout. Without a rendezvous file (NCCL_COMM_ID alone)
// the same settings, which it returns, are compared over NCCL once the
// processes met there (agreeSettings).
func MeetProcesses(cfg setup.Config, env setup.Env) ([]launch.Setting, error) {
	s := setup.SettingsOf(cfg, env.Version)
	return s, setup.AsSettingsError(env.Rendezvous.Meet(s, env.Progress))
}

// agreeSettings compares every process's settings over the communicator
// where the processes had no files to meet through (NCCL_COMM_ID alone),
// right after they met in NCCL and before the dispatcher binds to it: a
// usage error on every process where one differs, as meetProcesses's.
func (dl *DeviceLayer) agreeSettings() error {
	d := dl.Distributed
	if d == nil || d.Rendezvous.File != "" { // compared at the rendezvous already
		return nil
	}
	all, err := gatherJSON(dl, d.Settings, "settings")
	if err != nil {
		return err
	}
	return setup.AsSettingsError(launch.Compare(all))
}

// SetProgress gives d the run's progress line.
func (d *Distributed) SetProgress(p *setup.Progress) {
	if d != nil {
		d.prog = p
	}
}

// NewDistributed checks that cfg can run over rv's processes and places this one.
func NewDistributed(cfg setup.Config, rv *launch.Rendezvous) (*Distributed, error) {
	l := rv.L
	switch {
	// the library implementations: alltoall's (NCCL), hybridep's and
	// deepep-ll's (NCCL EP); hybridep's native one when each NVLink domain
	// lies inside one process (its inter-domain path is NCCL's)
	case cfg.Impl != dispatchers.ImplLibrary && !hybridepAcross(cfg, l.World):
		return nil, &dispatchers.UnavailableError{Name: cfg.Dispatcher, Impl: cfg.Impl, Reason: fmt.Sprintf(
			"this run spans %d processes (%s): %s; across processes run alltoall --impl library (NCCL's send/recv over every process's ranks), "+
				"hybridep or deepep-ll --impl library (NCCL EP's group over every process's ranks), or hybridep --impl native with a --domain that divides the ranks each process drives",
			l.World, l.Via, notAcross(cfg, l.World))}
	case cfg.EP%l.World != 0:
		return nil, &setup.ConfigError{Flag: "ep", Value: cfg.EP, Allowed: fmt.Sprintf("must be a multiple of the %d processes of the run (%s): each process drives as many ranks, one GPU each", l.World, l.Via)}
	case cfg.CUDAGraph:
		return nil, &setup.ConfigError{Flag: "cuda-graph", Value: true, Allowed: "does not apply to a run that spans processes (the implementations that cross them are not captured)"}
	case cfg.MaxSeconds > 0:
		return nil, &setup.ConfigError{Flag: "max-seconds", Value: cfg.MaxSeconds, Allowed: "does not apply to a run that spans processes: every rank must run the same steps (use --iters)"}
	}
	per := cfg.EP / l.World
	if cfg.GPUs > 0 && cfg.GPUs != per {
		return nil, &setup.ConfigError{Flag: "gpus", Value: cfg.GPUs, Allowed: fmt.Sprintf("each of the %d processes drives %d GPUs (--ep %d over %d processes, one GPU per rank)", l.World, per, cfg.EP, l.World)}
	}
	d := &Distributed{Rendezvous: rv, first: l.Rank * per, PerProcess: per, firstGPU: l.Local * per}
	d.description = launch.Describe(d.first, d.first+per-1, l.Rank, l.World, l.Host)
	return d, nil
}

// agree tells every process how this one's set-up ended (err; nil: ready
// to meet in NCCL) and learns theirs: all go on, or none does — a process
// that cannot run the point (unavailable here, or failed) makes the others
// leave it too, with the same status, naming it; none waits in NCCL for
// it. The error is this process's own, or the first other process's.
func (d *Distributed) agree(err error, cfg setup.Config) error {
	if d == nil || d.agreed {
		return err
	}
	d.agreed = true
	mine := launch.Verdict{}
	if err != nil {
		mine.Status = results.StatusFailed
		if dispatchers.IsUnavailable(err) || DeviceStatus(err) == results.StatusUnavailable {
			mine.Status = results.StatusUnavailable
		}
		mine.Reason = d.description + " cannot run it: " + strings.TrimPrefix(err.Error(), fmt.Sprintf("%s (%s): %s: ", cfg.Dispatcher, cfg.Impl, mine.Status))
	}
	all, aerr := d.Rendezvous.Agree(mine, func(s string) {
		if s == "" {
			s = "meeting the other processes in NCCL (the communicator's setup)"
		}
		d.prog.Set(s)
	})
	if err != nil {
		return err
	}
	if aerr != nil {
		return aerr
	}
	for _, v := range all {
		switch v.Status {
		case "":
		case results.StatusUnavailable:
			return &dispatchers.UnavailableError{Name: cfg.Dispatcher, Impl: cfg.Impl, Reason: v.Reason}
		default:
			return errors.New(v.Reason)
		}
	}
	return nil
}

// hybridepAcross: cfg is hybridep's native implementation with every
// NVLink domain (--domain ranks) inside one of world processes (EP/world
// ranks each).
func hybridepAcross(cfg setup.Config, world int) bool {
	return cfg.Dispatcher == "hybridep" && cfg.Impl == dispatchers.ImplNative && cfg.EP%world == 0 && cfg.Domain > 0 && (cfg.EP/world)%cfg.Domain == 0
}

// notAcross says why cfg's dispatcher does not run over world processes
// in this build.
func notAcross(cfg setup.Config, world int) string {
	switch {
	case cfg.Dispatcher == "hybridep":
		if cfg.EP%world != 0 {
			return fmt.Sprintf("hybridep's NVLink domains must each lie inside one process, and --ep %d does not split into %d processes' equal blocks", cfg.EP, world)
		}
		domain := fmt.Sprintf("--domain %d", cfg.Domain)
		if cfg.Domain == 0 {
			domain = fmt.Sprintf("--domain 0 (one domain of all %d ranks)", cfg.EP)
		}
		return fmt.Sprintf("hybridep's intra-domain path moves data through peer memory, so an NVLink domain's ranks must be in one process, "+
			"and %s puts a domain over several of the %d processes, which drive %d ranks each (--ep %d); its inter-domain path goes over NCCL: "+
			"a --domain that divides %d runs", domain, world, cfg.EP/world, cfg.EP, cfg.EP/world)
	case cfg.Dispatcher == "deepep":
		return "DeepEP's intranode design moves data through peer memory, which stays inside one process (its NVLink domain); " +
			"its internode mode (NVSHMEM) is not modelled"
	case cfg.Dispatcher == "feplb":
		return "FEPLB's phase 2 copies experts' weights and rows between the ranks of a domain through peer memory, inside one process"
	}
	return "its native implementation moves data through peer memory (device copies between the ranks' buffers), inside one process"
}

// open makes the communicator over every rank (this process's on devs
// with their streams) and starts the watch, once every process is ready
// (NCCL loaded: the last of what a process decides alone).
func (d *Distributed) open(th *device.Threads, devs []device.Device, streams []device.Stream, cfg setup.Config) error {
	var id cuda.UniqueID
	w := comm.ProcessRanks{Ranks: d.PerProcess * d.Rendezvous.L.World, First: d.first, ID: func(newID func() (cuda.UniqueID, error)) (cuda.UniqueID, error) {
		if err := d.agree(nil, cfg); err != nil {
			return id, err
		}
		var err error
		id, err = d.Rendezvous.ID(func() ([128]byte, error) { return newID() })
		if err == nil {
			d.watch = d.Rendezvous.Watch(id, d.description, d.PerProcess)
			d.watch.Meeting("NCCL's communicator setup (ncclCommInitRank)")
		}
		return id, err
	}}
	var err error
	d.comm, err = comm.OpenWorldComm(th, devs, streams, w)
	var no *comm.NoCommError
	if errors.As(err, &no) {
		return &dispatchers.UnavailableError{Name: "alltoall", Impl: dispatchers.ImplLibrary, Reason: "NCCL: " + no.Reason}
	}
	if err != nil && d.watch != nil { // NCCL's setup gave up (its own bootstrap timeout): what is known of the others
		if why := d.watch.Unmet(); why != "" {
			err = fmt.Errorf("%s: %w; %s", d.description, err, why)
		}
	}
	if err == nil { // every process's ranks met: the meeting is over
		d.Local("binding the dispatcher to the communicator")
	}
	return err
}

// stage tells the watch what this process is about to wait in (warm: a
// step has run, its kernels are compiled).
func (d *Distributed) stage(s string, warm bool) {
	if d != nil && d.watch != nil {
		if !warm {
			d.watch.StageFor(s+" (the first step, which compiles the kernels)", firstStepWait)
			return
		}
		d.watch.Stage(s)
	}
}

// Local says that this process does work of its own (no waiting on
// others) until its next stage.
func (d *Distributed) Local(s string) {
	if d != nil && d.watch != nil {
		d.watch.Local(s)
	}
}

// AnnounceFailure tells the other processes that this one failed: before they met,
// at their agreement; after, in its watch's note.
func (d *Distributed) AnnounceFailure(err error, cfg setup.Config) {
	switch {
	case d == nil || err == nil:
	case !d.agreed:
		d.agree(err, cfg)
	case d.watch != nil:
		d.watch.Fail(err)
	}
}

// Close ends the communicator and the watch.
func (d *Distributed) Close() {
	if d.comm != nil {
		d.comm.Close()
	}
	if d.watch != nil {
		d.watch.Stop()
	}
}

// rep is the rank that speaks for process p in the gathers: its first.
func (d *Distributed) rep(p int) int { return p * d.PerProcess }

// allGather gives every process every process's data (in process order),
// over the communicator: sizes first, then the bytes, between each
// process's first rank (on its first GPU, from that GPU's thread).
func (dl *DeviceLayer) allGather(data []byte) ([][]byte, error) {
	d := dl.Distributed
	d.stage("gathering every process's results", dl.warm)
	W := d.Rendezvous.L.World
	rk := dl.Ranks[d.first]
	words := func(n int) int { return (n + 7) / 8 }
	var out [][]byte
	err := dl.th.Each(func(dev int) error {
		if dev != 0 {
			return nil
		}
		sizes := make([]uint64, W)
		sizes[d.Rendezvous.L.Rank] = uint64(len(data))
		got, err := dl.exchange(rk, sizes[d.Rendezvous.L.Rank:d.Rendezvous.L.Rank+1], func(int) int { return 1 })
		if err != nil {
			return err
		}
		mine := make([]uint64, words(len(data)))
		copy(unsafeBytes(mine), data)
		all, err := dl.exchange(rk, mine, func(p int) int { return words(int(got[p][0])) })
		if err != nil {
			return err
		}
		for p := range W {
			out = append(out, unsafeBytes(all[p])[:got[p][0]])
		}
		return nil
	})
	return out, err
}

// exchange sends mine to every process's first rank and receives each
// one's (n(p) words) on rk's GPU.
func (dl *DeviceLayer) exchange(rk *dispatchers.DeviceRank, mine []uint64, n func(p int) int) ([][]uint64, error) {
	d := dl.Distributed
	W := d.Rendezvous.L.World
	total := 0
	for p := range W {
		total += n(p)
	}
	var src, dst device.Addr
	var err error
	if src, err = rk.Dev.Alloc(8 * int64(max(len(mine), 1))); err != nil {
		return nil, err
	}
	defer rk.Dev.Free(src)
	if dst, err = rk.Dev.Alloc(8 * int64(max(total, 1))); err != nil {
		return nil, err
	}
	defer rk.Dev.Free(dst)
	if len(mine) > 0 {
		if err := rk.Dev.Upload(src, mine, rk.Stream); err != nil {
			return nil, err
		}
	}
	var sends, recvs []comm.PeerTransfer
	at := 0
	for p := range W {
		sends = append(sends, comm.PeerTransfer{Peer: d.rep(p), Buf: src, Bytes: 8 * int64(len(mine))})
		recvs = append(recvs, comm.PeerTransfer{Peer: d.rep(p), Buf: dst + device.Addr(8*at), Bytes: 8 * int64(n(p))})
		at += n(p)
	}
	if err := d.comm.Exchange(d.first, sends, recvs); err != nil {
		return nil, err
	}
	host := make([]uint64, max(total, 1))
	if err := rk.Dev.Download(host, dst, rk.Stream); err != nil {
		return nil, err
	}
	out := make([][]uint64, W)
	at = 0
	for p := range W {
		out[p] = host[at : at+n(p)]
		at += n(p)
	}
	return out, nil
}

// ProcessContribution is what one process contributes to the record: its ranks' samples
// and counts (indexed by its ranks, in order), its process-wide times, its
// stack and where its ranks ran.
type ProcessContribution struct {
	Process, First int
	Host           string
	GPUs           []int
	Stack          results.Stack
	Correct        *results.Correctness   `json:",omitempty"`
	Samples        map[string][][]float64 `json:",omitempty"`
	HostCall       map[string][][]float64 `json:",omitempty"`
	Step           [][]float64            `json:",omitempty"`
	Recv           []int                  `json:",omitempty"`
	RecvSteps      [][]int                `json:",omitempty"`
	Mem            []int64                `json:",omitempty"`
	Issue, Wait    []float64              `json:",omitempty"`
	Pairs          [][]int64              `json:",omitempty"` // [its rank][destination rank] the last step's (token, rank) pairs
	Buffers        [][]int64              `json:",omitempty"` // [buffer][its rank] the dispatcher's buffers, as its Buffers lists them
	// its gradient check's maxima: [gradient] max|g − ref| (−1: infinite)
	// and max|ref| over what it compared
	GradAcc map[string][2]float64 `json:",omitempty"`
}

// GatherContributions all-gathers every process's part.
func (dl *DeviceLayer) GatherContributions(p ProcessContribution) ([]ProcessContribution, error) {
	return gatherJSON(dl, p, "results")
}

// gatherJSON all-gathers every process's v (what it is, for errors), as
// JSON.
func gatherJSON[T any](dl *DeviceLayer, v T, what string) ([]T, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	all, err := dl.allGather(b)
	if err != nil {
		return nil, err
	}
	out := make([]T, len(all))
	for i, b := range all {
		if err := json.Unmarshal(b, &out[i]); err != nil {
			return nil, fmt.Errorf("process %d's %s: %w", i, what, err)
		}
	}
	return out, nil
}

// MergeProcessMaxima adds a process's gradient maxima (max|g − ref|, −1 for an
// infinite one; max|ref|) to a.
func MergeProcessMaxima(a MaxErrAccumulator, v [2]float64) MaxErrAccumulator {
	d := v[0]
	if d < 0 {
		d = math.Inf(1)
	}
	a.Merge(MaxErrAccumulator{Diff: d, Ref: v[1]})
	return a
}

// EncodeInfiniteErrs is c as JSON carries it: an infinite error (a NaN output or
// gradient) as −1, which no error is; DecodeInfiniteErrs undoes it.
func EncodeInfiniteErrs(c *results.Correctness) *results.Correctness {
	return mapErrs(c, func(e float64) float64 {
		if math.IsInf(e, 0) || math.IsNaN(e) {
			return -1
		}
		return e
	})
}

func DecodeInfiniteErrs(c *results.Correctness) *results.Correctness {
	return mapErrs(c, func(e float64) float64 {
		if e < 0 {
			return math.Inf(1)
		}
		return e
	})
}

// mapErrs is a copy of c with f applied to its errors.
func mapErrs(c *results.Correctness, f func(float64) float64) *results.Correctness {
	out := *c
	out.MaxRelErr = f(c.MaxRelErr)
	if c.Grads != nil {
		g := *c.Grads
		g.MaxRelErr, g.PerTensor = f(g.MaxRelErr), map[string]float64{}
		for n, e := range c.Grads.PerTensor {
			g.PerTensor[n] = f(e)
		}
		out.Grads = &g
	}
	return &out
}

// GatherRouting gives the host twin every other process's ranks' routing
// of the last step (their experts and probabilities), which the gradient
// reference of this process's experts needs: an expert's weight gradients
// sum over every rank's tokens that chose it. This process's ranks'
// routing is the host twin's already (download).
func (dl *DeviceLayer) GatherRouting() error {
	d, c := dl.Distributed, dl.Layer.Cfg
	n := c.Tokens * c.TopK
	mine := make([]byte, 0, 8*n*d.PerProcess)
	for r := d.first; r < d.first+d.PerProcess; r++ {
		hr := dl.Layer.Ranks[r]
		idx, _ := device.HostBytes(hr.Idx)
		probs, _ := device.HostBytes(hr.Probs)
		mine = append(append(mine, idx...), probs...)
	}
	all, err := dl.allGather(mine)
	if err != nil {
		return err
	}
	for p, b := range all {
		if len(b) != 8*n*d.PerProcess {
			return fmt.Errorf("process %d sent %d bytes of routing, want %d (%d ranks × %d tokens × top-%d, experts and probabilities)", p, len(b), 8*n*d.PerProcess, d.PerProcess, c.Tokens, c.TopK)
		}
		if p == d.Rendezvous.L.Rank {
			continue
		}
		for i := range d.PerProcess {
			hr := dl.Layer.Ranks[d.rep(p)+i]
			at := b[8*n*i:]
			idx, _ := device.HostBytes(hr.Idx)
			probs, _ := device.HostBytes(hr.Probs)
			copy(idx, at[:4*n])
			copy(probs, at[4*n:8*n])
		}
	}
	return nil
}

// sumOverProcesses replaces v, this process's sum over its ranks, by the
// sum over every process's (a data-parallel all-reduce, over NCCL): the
// processes' values added in process order in float32, the same on every
// process. It gathers a chunk at a time, at most sumChunk bytes in all.
func (dl *DeviceLayer) sumOverProcesses(v []float32) error {
	W := dl.Distributed.Rendezvous.L.World
	per := max(1, setup.SumChunk/4/W)
	for lo := 0; lo < len(v); lo += per {
		chunk := v[lo:min(lo+per, len(v))]
		b, _ := device.HostBytes(chunk)
		all, err := dl.allGather(b) // copies b
		if err != nil {
			return err
		}
		clear(chunk)
		for p, pb := range all {
			if len(pb) != len(b) {
				return fmt.Errorf("process %d sent %d bytes of a gradient sum, want %d", p, len(pb), len(b))
			}
			theirs := make([]float32, len(chunk))
			tb, _ := device.HostBytes(theirs)
			copy(tb, pb)
			for i, x := range theirs {
				chunk[i] += x
			}
		}
	}
	return nil
}

// Pairs counts each of this process's ranks' last-step (token, rank) pairs
// by destination rank, from its routing on the device.
func (dl *DeviceLayer) Pairs() ([][]int64, error) {
	d, c := dl.Distributed, dl.Layer.Cfg
	idx := make([]int32, c.Tokens*c.TopK)
	var out [][]int64
	for r := d.first; r < d.first+d.PerProcess; r++ {
		rk := dl.Ranks[r]
		if err := rk.Dev.Download(idx, rk.Idx, rk.Stream); err != nil {
			return nil, err
		}
		out = append(out, tokenRankPairs(idx, c.TopK, dl.Layer.Shape.LocalExperts(), c.EP))
	}
	return out, nil
}

// tokenRankPairs counts a rank's (token, rank) pairs by destination rank:
// idx holds each token's k experts, L per rank; a token goes to a rank
// once however many of its experts the rank holds.
func tokenRankPairs(idx []int32, k, L, ep int) []int64 {
	n := make([]int64, ep)
	last := make([]int, ep) // the token (+1) that last counted the rank
	for t := range len(idx) / k {
		for _, e := range idx[t*k : (t+1)*k] {
			if d := int(e) / L; d >= 0 && d < ep && last[d] != t+1 {
				last[d] = t + 1
				n[d]++
			}
		}
	}
	return n
}

// nodeBytes splits the processes' off-rank (token, rank) pairs by where
// they go (a rank's node is its process's host): to another node, or to
// another rank of the same node; each pair is a bf16 row of hidden.
func nodeBytes(parts []ProcessContribution, hidden int) (inter, intra int64) {
	host := map[int]string{} // rank → node
	for _, p := range parts {
		for i := range p.Pairs {
			host[p.First+i] = p.Host
		}
	}
	for _, p := range parts {
		for i, row := range p.Pairs {
			for dst, n := range row {
				switch src := p.First + i; {
				case dst == src:
				case host[dst] != p.Host:
					inter += n
				default:
					intra += n
				}
			}
		}
	}
	return inter * int64(hidden) * 2, intra * int64(hidden) * 2
}

// OwnContribution is this process's part of m after the timed steps (m's per-rank
// entries of other processes' ranks are empty).
func (dl *DeviceLayer) OwnContribution(m *Measurements, stack results.Stack) ProcessContribution {
	d := dl.Distributed
	ranks := func(v [][]float64) [][]float64 { return v[d.first : d.first+d.PerProcess] }
	p := ProcessContribution{Process: d.Rendezvous.L.Rank, First: d.first, Host: d.Rendezvous.L.Host, Stack: stack, Samples: map[string][][]float64{},
		Step: ranks(m.Step), Recv: m.Recv[d.first : d.first+d.PerProcess], Mem: m.Mem.PerRankBytes[d.first : d.first+d.PerProcess],
		Issue: m.Issue, Wait: m.HostWait}
	for i := range d.PerProcess {
		p.GPUs = append(p.GPUs, d.firstGPU+i)
	}
	for ph, v := range m.Samples {
		p.Samples[ph] = ranks(v)
	}
	if m.HostCall != nil {
		p.HostCall = map[string][][]float64{}
		for ph, v := range m.HostCall {
			p.HostCall[ph] = ranks(v)
		}
	}
	for _, rows := range m.RecvSteps {
		p.RecvSteps = append(p.RecvSteps, rows[d.first:d.first+d.PerProcess])
	}
	for _, b := range m.Buffers {
		p.Buffers = append(p.Buffers, b.PerRankBytes[d.first:d.first+d.PerProcess])
	}
	return p
}

// MergeContributions fills m's per-rank entries from every process's part and describes
// the processes in rec (the rank → node and GPU map, each node's stack
// against rank 0's). Process-wide times are the slowest process's per step.
func (dl *DeviceLayer) MergeContributions(m *Measurements, parts []ProcessContribution, rec *results.Record) {
	d := dl.Distributed
	rec.Ranks.Devices = make([]int, d.PerProcess*len(parts))
	var differ []string
	for _, p := range parts {
		at := func(i int) int { return p.First + i }
		for ph, v := range p.Samples {
			for i, s := range v {
				m.Samples[ph][at(i)] = s
			}
		}
		for ph, v := range p.HostCall {
			if m.HostCall == nil {
				m.HostCall = map[string][][]float64{}
			}
			if m.HostCall[ph] == nil {
				m.HostCall[ph] = make([][]float64, len(rec.Ranks.Devices))
			}
			for i, s := range v {
				m.HostCall[ph][at(i)] = s
			}
		}
		for i := range p.Step {
			m.Step[at(i)] = p.Step[i]
			m.Recv[at(i)] = p.Recv[i]
			m.Mem.PerRankBytes[at(i)] = p.Mem[i]
			rec.Ranks.Devices[at(i)] = p.GPUs[i]
		}
		for s, rows := range p.RecvSteps {
			copy(m.RecvSteps[s][p.First:], rows)
		}
		for i, b := range p.Buffers { // each process sizes its own ranks' (another's, such as the rows sized each step, it does not know)
			if i < len(m.Buffers) {
				copy(m.Buffers[i].PerRankBytes[p.First:], b)
			}
		}
		for s := range p.Issue {
			m.Issue[s] = max(m.Issue[s], p.Issue[s])
		}
		for s := range p.Wait {
			m.HostWait[s] = max(m.HostWait[s], p.Wait[s])
		}
		ranks := make([]int, len(p.GPUs))
		for i := range ranks {
			ranks[i] = at(i)
		}
		pr := results.Process{Process: p.Process, Host: p.Host, Ranks: ranks, GPUs: p.GPUs}
		pr.StackDiffers, _ = results.StackDiff(rec.Stack, p.Stack)
		if len(pr.StackDiffers) > 0 {
			differ = append(differ, fmt.Sprintf("process %d (%s)", p.Process, p.Host))
		}
		rec.Ranks.Processes = append(rec.Ranks.Processes, pr)
	}
	rec.Ranks.Launch = d.Rendezvous.L.Via
	m.InterNode, m.IntraNode = nodeBytes(parts, dl.Layer.Cfg.Hidden)
	m.Nodes = true
	if differ != nil {
		rec.Stack.Note = strings.TrimPrefix(rec.Stack.Note+"; ", "; ") + "the stacks of " + strings.Join(differ, ", ") +
			" differ from rank 0's (ranks.processes[].stack_differs says how): the processes' numbers may not be comparable"
	}
	hosts := map[string]bool{}
	for _, p := range parts {
		hosts[p.Host] = true
	}
	rec.Ranks.Note = fmt.Sprintf("%d EP ranks over %d processes on %d node(s) (%s), %d rank(s) per process, one GPU each; data moves between ranks through %s",
		len(rec.Ranks.Devices), len(parts), len(hosts), d.Rendezvous.L.Via, d.PerProcess, dl.Dispatcher.Capabilities().Transport())
}

// agreeBatched: the batched grouped GEMM (name) is compared only where
// every process's GPUs have it (ok), or the processes would run different
// numbers of steps.
func (dl *DeviceLayer) agreeBatched(ok bool, name string) (bool, string, error) {
	mine := 0.0
	if ok {
		mine = 1
	}
	all, err := gatherJSON(dl, []float64{mine}, "grouped GEMM")
	if err != nil {
		return false, "", err
	}
	var without []string
	for p, v := range all {
		if len(v) != 1 || v[0] != 1 {
			without = append(without, fmt.Sprint(p))
		}
	}
	if ok && without != nil {
		return false, fmt.Sprintf("%s (process(es) %s of %d have none: every process compares the same ways)", name, strings.Join(without, ", "), len(all)), nil
	}
	return ok, name, nil
}

// slowestProcess is, for each of the grouped GEMM's ways, the slowest
// process's median (+Inf where one left it out): a way chosen by it is
// the same on every process.
func (dl *DeviceLayer) slowestProcess(meds []float64) ([]float64, error) {
	for i, m := range meds { // JSON has no infinity
		if math.IsInf(m, 1) {
			meds[i] = -1
		}
	}
	all, err := gatherJSON(dl, meds, "grouped GEMM times")
	if err != nil {
		return nil, err
	}
	return slowestOf(all, len(meds))
}

// slowestOf is each of n ways' largest time over the processes' (all,
// −1: left out), +Inf where one left it out.
func slowestOf(all [][]float64, n int) ([]float64, error) {
	out := make([]float64, n)
	for p, v := range all {
		if len(v) != n {
			return nil, fmt.Errorf("process %d compared %d ways of the grouped GEMM, process 0 %d: the processes cannot agree on one", p, len(v), n)
		}
		for i, m := range v {
			if m < 0 || out[i] < 0 {
				out[i] = -1
			} else {
				out[i] = max(out[i], m)
			}
		}
	}
	for i, m := range out {
		if m < 0 {
			out[i] = math.Inf(1)
		}
	}
	return out, nil
}

// unsafeBytes views words as bytes.
func unsafeBytes(w []uint64) []byte {
	b, _ := device.HostBytes(w)
	return b
}

// AgreeHook, when set (tests), is called at each agreement on whether to
// stop, before its exchange: a slow network, which no step's times may
// hold. nil in the program.
var AgreeHook func()

// agreeingStop is the watch's stage while the processes agree on whether
// to stop.
const agreeingStop = "agreeing with the other processes on whether to stop (an interrupt)"

// newStops makes the agreement's buffer on rank d.first's GPU (dev) and
// its work, before the first step: the agreement allocates nothing.
func (dl *DeviceLayer) newStops(dev device.Device) error {
	d := dl.Distributed
	W := d.Rendezvous.L.World
	var err error
	if d.stopBuf, err = dev.Alloc(8 * int64(1+W)); err != nil {
		return err
	}
	d.stopMine, d.stopAll = make([]uint64, 1), make([]uint64, W)
	rk := dl.Ranks[d.first]
	sends, recvs := make([]comm.PeerTransfer, W), make([]comm.PeerTransfer, W)
	for p := range W {
		sends[p] = comm.PeerTransfer{Peer: d.rep(p), Buf: d.stopBuf, Bytes: 8}
		recvs[p] = comm.PeerTransfer{Peer: d.rep(p), Buf: d.stopBuf + device.Addr(8*(1+p)), Bytes: 8}
	}
	d.stopWork = func(dev int) error {
		if dev != 0 {
			return nil
		}
		if AgreeHook != nil {
			AgreeHook()
		}
		if err := rk.Dev.Upload(d.stopBuf, d.stopMine, rk.Stream); err != nil {
			return err
		}
		if err := d.comm.Exchange(d.first, sends, recvs); err != nil {
			return err
		}
		return rk.Dev.Download(d.stopAll, d.stopBuf+8, rk.Stream)
	}
	return nil
}

// agreeStop is the interrupt of a run over several processes, agreed by
// all: every process gives every other whether its interrupt fired, and
// why, between its first ranks over the communicator (one word each);
// each process ends with the same answer, so that all stop at the same
// point — a step none of them starts. "" while no process's fired. The
// points where the processes agree are where each would stop alone: the
// layer built, the check done, before each warm-up and timed step; a
// signal that comes at another time is acted on at the next. The
// agreement comes between steps, after the last step's streams ended and
// before the next one's start events: no step's times hold it. It waits
// as a gather does, under the watch (--comm-timeout).
func (dl *DeviceLayer) agreeStop(intr *setup.Interrupt) (string, error) {
	d := dl.Distributed
	d.stage(agreeingStop, dl.warm)
	dl.doing(agreeingStop)
	d.stopMine[0] = setup.InterruptCode(intr.Why())
	if err := dl.th.Each(d.stopWork); err != nil {
		return "", err
	}
	if d.stopAll[d.Rendezvous.L.Rank] != d.stopMine[0] {
		return "", fmt.Errorf("the agreement on whether to stop: this process's own code came back as %d, sent %d", d.stopAll[d.Rendezvous.L.Rank], d.stopMine[0])
	}
	return setup.DescribeInterrupts(d.stopAll), nil
}

// InterruptedAt is the run's interrupt (nil: none) at a point every
// process reaches, while doing while (e.g. "while building the layer"):
// an *InterruptedError once it fired — in a run over several processes,
// once any process's fired (agreeStop) —; another error where the
// processes could not agree.
func (dl *DeviceLayer) InterruptedAt(intr *setup.Interrupt, while string) error {
	if dl.Distributed == nil || intr == nil {
		return intr.Interrupted(while)
	}
	why, err := dl.agreeStop(intr)
	if err != nil || why == "" {
		return err
	}
	return &setup.InterruptedError{Why: why, While: while}
}

// BeforeStep is interrupted before step i of cfg's loop (kind: "" or
// "the paused "), as interruptedAt: its stage is named only once the
// interrupt fired, and a run of one process agrees with none.
func (dl *DeviceLayer) BeforeStep(intr *setup.Interrupt, kind string, step int, cfg setup.Config) error {
	if dl.Distributed == nil || intr == nil {
		return intr.BeforeStep(kind, step, cfg)
	}
	why, err := dl.agreeStop(intr)
	if err != nil || why == "" {
		return err
	}
	return &setup.InterruptedError{Why: why, While: "before " + kind + setup.StepStage(step, cfg)}
}
