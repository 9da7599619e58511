// Package ncclep is the library implementation (--impl library) of two
// dispatcher designs through NVIDIA's NCCL EP (libnccl_ep.so.0, from
// NVIDIA/nccl-extensions), a C API over expert-parallel kernels:
//
//   - hybridep: NCCL EP's high-throughput mode, HybridEP's kernels re-hosted
//     on NCCL's Device API (the routing map all-gathered in the handle's
//     update, bulk copies into peers' memory);
//   - deepep-ll: NCCL EP's low-latency mode, DeepEP's low-latency design
//     (not DeepEP's normal mode, deepep, which no C API carries), labelled
//     so. Records written before the name deepep-ll called it deepep
//     --impl library; results reads them as deepep-ll, with a note.
//
// Every rank has its own NCCL communicator and NCCL EP group, made and
// driven from its GPU's thread: NCCL EP's calls are collective, each rank
// calls from its own thread. In a run that spans processes the
// communicators are the run's, over every rank (DeviceRank.Comm): each
// process creates its own ranks' groups over them, as NCCL EP's own tests
// do with one process per GPU, and the groups span every process's ranks.
// Both use the expert-major layout without padding, so that a rank's
// received rows are grouped by local expert as moebench's experts compute
// them. The high-throughput mode has a backward, the library's own
// (backward.go); the low-latency mode has none and runs
// forward-only (its noBackward). --sms is the group's max_num_sms (0:
// the library's default); the environment overrides NCCL EP reads are
// recorded with the run's NCCL_* variables.
//
// The design notes: docs/dispatchers/ncclep.md.
package ncclep

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/comm"
	"github.com/moebench/moebench/kernels/device"
)

func init() {
	for _, m := range []mode{highThroughput, lowLatency} {
		dispatchers.RegisterLibrary(m.dispatcher, func(env dispatchers.Env) (dispatchers.DeviceDispatcher, error) { return newDevice(m, env) })
		dispatchers.RegisterLibrarySMBudget(m.dispatcher, dispatchers.SMBudget{Default: 0,
			About: "NCCL EP's max_num_sms; 0 is the library's default (" + m.defaultSMs + ")"})
	}
}

// mode is one of NCCL EP's modes as the design it carries.
type mode struct {
	dispatcher, design string
	algorithm          int
	phases             []string // the dispatcher's own, the experts' excluded
	defaultSMs         string   // what max_num_sms AUTO means
	maxTokens          int      // tokens per rank the mode takes, at most (0: no limit stated)
	noBackward         string   // why its training step's backward does not run through it ("": it has one, backward.go)
}

var (
	highThroughput = mode{dispatcher: "hybridep", design: "HybridEP's design via NCCL EP (its high-throughput mode: HybridEP's kernels)",
		algorithm: cuda.EPHighThroughput, phases: []string{"update", "dispatch", "combine"},
		defaultSMs: "16 SMs for the communication kernels, every SM for the scan and the permute", maxTokens: 8192}
	lowLatency = mode{dispatcher: "deepep-ll", design: "DeepEP low-latency design via NCCL EP (its low-latency mode; not DeepEP's normal mode)",
		algorithm: cuda.EPLowLatency, phases: []string{"dispatch", "combine"}, defaultSMs: "every SM",
		noBackward: "NCCL EP's low-latency mode has no backward pass (pass_direction is high-throughput only), and its combine applies the routing weights, " +
			"whose gradient it does not return, so the step times the forward alone"}
)

// smEnv are the environment variables NCCL EP reads that override its SM
// counts (its communication, permute and scan kernels).
var smEnv = []string{"NCCL_EP_COMM_SMS", "NCCL_EP_SHUFFLE_SMS", "NCCL_EP_PREPROCESS_NUM_SMS"}

// newDevice is the library implementation of m, or why it is unavailable
// here: what can be known without the GPUs (the library, NCCL's Device
// API, a CUDA 13 driver, NCCL EP's run-time compile; on the host device,
// that it needs the cuda device), then the shape's limits.
func newDevice(m mode, env dispatchers.Env) (dispatchers.DeviceDispatcher, error) {
	lib, why := comm.EPProbe()
	if env.Device == "host" {
		why = append([]string{"it runs on GPUs, and this run is on the host device"}, why...)
	}
	if env.NodeRanks > comm.EPMaxRanks {
		why = append(why, fmt.Sprintf("%d ranks on this process's node: NCCL EP supports at most %d per node", env.NodeRanks, comm.EPMaxRanks))
	}
	if why != nil {
		return nil, unavailable(m, "NCCL EP cannot run here: %s", strings.Join(why, "; "))
	}
	timeout := env.LibraryTimeout
	if timeout <= 0 {
		timeout = dispatchers.DefaultCommTimeout
	}
	return &Device{m: m, lib: lib, sms: env.SMs, timeout: timeout, fp8: env.IsFP8()}, nil
}

func unavailable(m mode, format string, a ...any) error {
	return &dispatchers.UnavailableError{Name: m.dispatcher, Impl: dispatchers.ImplLibrary, Reason: fmt.Sprintf(format, a...)}
}

// Device is NCCL EP on device ranks, in one of its modes.
type Device struct {
	m       mode
	lib     *cuda.NCCLEP
	sms     int
	timeout time.Duration
	fp8     bool // --precision fp8: the dispatch forwards e4m3 rows and their scales (QUANT_FWD; fp8.go)
	shape   dispatchers.Shape
	ranks   []*dispatchers.DeviceRank
	ep      *comm.EP
	st      []devRank
	slots   int // low latency: rows of each expert's zone (EP × tokens)
	rows    int // high throughput: rows a rank may receive, at most
	// in a run that spans processes: the run's communicator, and this
	// process's ranks first… first+local−1 (the others' have no Dev)
	world        comm.Comm
	first, local int
}

// devRank is one rank's buffers and the last step's host calls.
type devRank struct {
	counts    device.Addr       // int32 [L+1]: rows per local expert (and, high throughput, their total)
	mapped    device.MappedHost // the counts on the host
	host      []int32
	recvX     device.Addr // the received rows: HT [rows, h]; LL [L, slots, h]
	recvW     device.Addr // HT: their routing weights [rows] fp32
	recvY     device.Addr // LL: the experts' outputs [L, slots, h]
	sum       device.Addr // combine's output before the shared expert is added [T, h] (0: combine writes Y)
	identity  device.Addr // [T] int32 0…T−1: the shared expert's add as an unpermute of one row a token
	work      []dispatchers.DeviceWork
	callMS    map[string]float64 // the last step's library calls, wall time per phase
	last      string             // the last library call (for errors)
	bytes     int64
	backward  bool  // the last step ran the backward (high throughput)
	gradBytes int64 // the backward's buffers: DX, DProbs, ExpertDY
	// fp8 (fp8.go): the split send rows, the received scales (recvX holds
	// the received e4m3 values) and the packed rows the experts read
	xq, xs, recvS, pk device.Addr
	ops               []device.CopyOp
}

// ht says whether d is the high-throughput mode.
func (d *Device) ht() bool { return d.m.algorithm == cuda.EPHighThroughput }

func (d *Device) Name() string { return d.m.dispatcher }
func (d *Device) Impl() string { return dispatchers.ImplLibrary }

// Capabilities: the mode's reason where it has no backward, a host wait
// for the counts, what the library ran and how long its calls took, and
// its transport; at fp8, QUANT_FWD's constraint (fp8.go).
func (d *Device) Capabilities() dispatchers.Capabilities {
	return dispatchers.Capabilities{
		NoBackward: d.m.noBackward,
		FP8:        d.FP8Unavailable,
		HostWait:   &dispatchers.HostWait{Before: d.WaitsBefore, Wait: d.HostWait},
		Library:    &dispatchers.Library{Info: d.Library, HostCallMS: d.HostCallMS},
		Transport:  d.Transport,
	}
}

// Bind checks the shape against NCCL EP's limits, then makes every rank's
// communicator, group and handle on its GPU's thread and its buffers.
func (d *Device) Bind(shape dispatchers.Shape, ranks []*dispatchers.DeviceRank) error {
	if len(ranks) != shape.EP {
		return fmt.Errorf("%s: %d ranks, shape says EP = %d", d.m.dispatcher, len(ranks), shape.EP)
	}
	if why := d.limits(shape); why != nil {
		return unavailable(d.m, "NCCL EP's %s mode cannot take this layer: %s", modeName(d.m), strings.Join(why, "; "))
	}
	d.shape, d.ranks = shape, ranks
	L, T, h, k := shape.LocalExperts(), shape.Tokens, shape.Hidden, shape.TopK
	d.slots, d.rows = shape.EP*T, shape.EP*T*min(k, L)
	cfg := cuda.EPGroupConfig{Algorithm: d.m.algorithm, Experts: shape.Experts, MaxTokens: T, TokenBytes: 2 * h, MaxSMs: d.sms, Timeout: d.timeout}
	if d.m.algorithm == cuda.EPHighThroughput {
		cfg.MaxRecv = d.rows // a fixed budget: every (token, local expert) slot of every rank
	}
	var devs []device.Device
	var streams []device.Stream
	d.first = -1
	for r, rk := range ranks {
		if rk.Dev == nil { // another process's rank
			continue
		}
		if d.first < 0 {
			d.first = r
		}
		if rk.Comm != nil {
			d.world = rk.Comm
		}
		devs, streams = append(devs, rk.Dev), append(streams, rk.Stream)
	}
	if d.local = len(devs); d.first < 0 || d.first+d.local > shape.EP || ranks[d.first+d.local-1].Dev == nil {
		return fmt.Errorf("%s: this process's ranks are not one block of the %d (first %d, %d of them)", d.m.dispatcher, shape.EP, d.first, d.local)
	}
	var w comm.EPProcessRanks
	if d.world != nil {
		w = comm.EPProcessRanks{Ranks: shape.EP, First: d.first, Comm: d.world}
	}
	var err error
	var no *comm.EPUnavailable
	if d.ep, err = comm.OpenEP(ranks[0].Threads, d.lib, devs, streams, cfg, k, w); errors.As(err, &no) {
		return unavailable(d.m, "%s", no.Reason)
	} else if err != nil {
		return err
	}
	d.st = make([]devRank, shape.EP)
	for r, rk := range ranks {
		s, dev := &d.st[r], rk.Dev
		if dev == nil {
			continue
		}
		bufs := []device.RowBuffer{{P: &s.counts, PerRow: 4 * int64(L+1)}}
		switch {
		case d.fp8 && d.ht():
			bufs = append(append(bufs, d.fp8Buffers(s, d.rows)...), device.RowBuffer{P: &s.recvW, PerRow: 4 * int64(d.rows)})
		case d.fp8:
			bufs = append(append(bufs, d.fp8Buffers(s, L*d.slots)...), device.RowBuffer{P: &s.recvY, PerRow: 2 * int64(L*d.slots) * int64(h)})
		case d.ht():
			bufs = append(bufs, device.RowBuffer{P: &s.recvX, PerRow: 2 * int64(d.rows) * int64(h)}, device.RowBuffer{P: &s.recvW, PerRow: 4 * int64(d.rows)})
		default:
			bufs = append(bufs, device.RowBuffer{P: &s.recvX, PerRow: 2 * int64(L*d.slots) * int64(h)}, device.RowBuffer{P: &s.recvY, PerRow: 2 * int64(L*d.slots) * int64(h)})
		}
		if rk.Shared != 0 {
			bufs = append(bufs, device.RowBuffer{P: &s.sum, PerRow: 2 * int64(T) * int64(h)}, device.RowBuffer{P: &s.identity, PerRow: 4 * int64(T)})
		}
		if s.bytes, err = device.Resize(dev, 1, bufs...); err != nil {
			return err
		}
		if s.identity != 0 {
			id := make([]int32, T)
			for t := range id {
				id[t] = int32(t)
			}
			if err := dev.Upload(s.identity, id, rk.Stream); err != nil {
				return err
			}
		}
		if s.mapped, err = dev.AllocMapped(4 * int64(L+1)); err != nil {
			return err
		}
		s.host = make([]int32, L+1)
		s.callMS = map[string]float64{}
		rk.ExpertRows = make([]int, L)
		x := s.recvX
		if d.fp8 { // the experts dequantize packed rows
			x = s.pk
		}
		if d.m.algorithm == cuda.EPHighThroughput {
			rk.ExpertX, rk.ExpertProbs = x, s.recvW
		} else {
			rk.ExpertX = x
		}
	}
	return nil
}

func modeName(m mode) string {
	if m.algorithm == cuda.EPHighThroughput {
		return "high-throughput"
	}
	return "low-latency"
}

// limits says what of shape NCCL EP's mode cannot take (its header's and
// library's limits), or nil.
func (d *Device) limits(sh dispatchers.Shape) []string {
	var why []string
	L := sh.LocalExperts()
	if d.m.maxTokens > 0 && sh.Tokens > d.m.maxTokens {
		why = append(why, fmt.Sprintf("%d tokens per rank, above its %d (MAX_SUPPORTED_TOKENS_PER_RANK)", sh.Tokens, d.m.maxTokens))
	}
	if sh.TopK > 32 {
		why = append(why, fmt.Sprintf("top-%d, above its 32", sh.TopK))
	}
	if sh.Hidden > 16384 {
		why = append(why, fmt.Sprintf("hidden %d, above its 16384", sh.Hidden))
	}
	if d.m.algorithm == cuda.EPHighThroughput {
		if L > 64 {
			why = append(why, fmt.Sprintf("%d local experts, above its 64", L))
		}
		if sh.Experts%4 != 0 {
			why = append(why, fmt.Sprintf("%d experts on a node: its routing-map bulk copies need a multiple of 4", sh.Experts))
		}
	} else {
		if sh.Hidden%128 != 0 {
			why = append(why, fmt.Sprintf("hidden %d: its low-latency combine needs a multiple of 128", sh.Hidden))
		}
		if need := (sh.Experts + 13) / 14; d.sms > 0 && d.sms < need {
			why = append(why, fmt.Sprintf("--sms %d: %d experts need at least %d SMs (at most 14 warp groups per SM)", d.sms, sh.Experts, need))
		}
	}
	return why
}

// Forward: the mode's calls, the experts between dispatch and combine.
func (d *Device) Forward(experts func(rank int) error) []dispatchers.Step {
	var s []dispatchers.Step
	if d.m.algorithm == cuda.EPHighThroughput {
		s = append(s, dispatchers.Step{Name: "update", Run: d.update})
	}
	if d.fp8 { // the received slots' values and scales rejoined into packed rows first (fp8.go)
		compute := experts
		experts = func(r int) error {
			if err := d.join(r); err != nil {
				return err
			}
			return compute(r)
		}
	}
	return append(s, dispatchers.Step{Name: "dispatch", Run: d.dispatch}, dispatchers.Step{Name: dispatchers.ExpertPhases[0], Run: experts},
		dispatchers.Step{Name: "combine", Run: d.combine})
}

// timed runs a library call of rank r in phase, adding its wall time to
// the phase's host-call time.
func (d *Device) timed(r int, phase, call string, f func() error) error {
	s := &d.st[r]
	s.last = call
	t := time.Now()
	err := f()
	s.callMS[phase] += float64(time.Since(t).Nanoseconds()) / 1e6
	return err
}

// update (high throughput): ncclEpUpdateHandle — the routing map's
// all-gather and the scan, which count each local expert's received rows —
// and the counts' copy to the host.
func (d *Device) update(r int) error {
	s, rk, sh := &d.st[r], d.ranks[r], d.shape
	clear(s.callMS)
	s.backward = false
	L := sh.LocalExperts()
	if err := d.timed(r, "update", "ncclEpUpdateHandle", func() error {
		return d.ep.Update(r, rk.Idx, sh.Tokens, sh.TopK, s.counts, L)
	}); err != nil {
		return err
	}
	return rk.Dev.DownloadAsync(s.mapped, s.counts, 4*int64(L+1), rk.Stream)
}

// WaitsBefore: high throughput before dispatch (for the update's counts),
// low latency before the experts (for the dispatch's).
func (d *Device) WaitsBefore(phase string) bool {
	if d.m.algorithm == cuda.EPHighThroughput {
		return phase == "dispatch"
	}
	return phase == dispatchers.ExpertPhases[0]
}

// HostWait is rank r's wait for its counts (see WaitsBefore), which size
// its experts' work.
func (d *Device) HostWait(phase string, r int) error {
	ht := d.m.algorithm == cuda.EPHighThroughput
	if !d.WaitsBefore(phase) {
		return nil
	}
	s, rk := &d.st[r], d.ranks[r]
	if err := rk.Dev.SyncStream(rk.Stream); err != nil {
		return fmt.Errorf("the GPU failed after NCCL EP's %s (a collective that waits past --ncclep-timeout %v traps its kernels): %w", s.last, d.timeout, err)
	}
	L := d.shape.LocalExperts()
	copy(s.host, unsafe.Slice((*int32)(s.mapped.Host), L+1))
	total := 0
	for l := range L {
		n := int(s.host[l])
		if n < 0 || ht && n > d.rows || !ht && n > d.slots {
			return fmt.Errorf("NCCL EP counted %d rows for local expert %d (at most %d)", n, l, max(d.rows, d.slots))
		}
		rk.ExpertRows[l] = n
		total += n
	}
	if ht {
		if int(s.host[L]) != total {
			return fmt.Errorf("NCCL EP's received total %d differs from its experts' counts' sum %d", s.host[L], total)
		}
		return nil
	}
	// low latency: each expert's rows lie in its own zone of the receive
	// buffer; the expert applies no routing weight (the combine does)
	h := int64(d.shape.Hidden)
	x, xRow := s.recvX, 2*h
	if d.fp8 { // the packed rows join fills
		x, xRow = s.pk, int64(kernels.FP8RowPitch(d.shape.Hidden))
	}
	s.work = s.work[:0]
	for l, n := range rk.ExpertRows {
		if n == 0 {
			continue
		}
		at := device.Addr(2 * int64(l*d.slots) * h)
		s.work = append(s.work, dispatchers.DeviceWork{X: x + device.Addr(int64(l*d.slots)*xRow), Y: s.recvY + at,
			Segments: []dispatchers.DeviceSegment{{Expert: r*L + l, Start: 0, Len: n}}})
	}
	rk.Work = s.work
	return nil
}

// dispatch: ncclEpDispatch (low latency: first the handle's routing, a
// host call; then the counts' copy to the host).
func (d *Device) dispatch(r int) error {
	s, rk, sh := &d.st[r], d.ranks[r], d.shape
	T, h, k, L := sh.Tokens, sh.Hidden, sh.TopK, sh.LocalExperts()
	S := h / dispatchers.FP8Block
	if d.fp8 { // the packed rows into the library's two tensors (fp8.go)
		if err := d.split(r); err != nil {
			return err
		}
	}
	if d.m.algorithm == cuda.EPHighThroughput {
		return d.timed(r, "dispatch", "ncclEpDispatch", func() error {
			if d.fp8 {
				return d.ep.DispatchHTFP8(r, s.xq, s.xs, rk.Probs, T, h, S, k, s.recvX, s.recvS, s.recvW, d.rows)
			}
			return d.ep.DispatchHT(r, rk.X, rk.Probs, T, h, k, s.recvX, s.recvW, d.rows)
		})
	}
	clear(s.callMS)
	if err := d.timed(r, "dispatch", "ncclEpUpdateHandle", func() error { return d.ep.Update(r, rk.Idx, T, k, 0, L) }); err != nil {
		return err
	}
	if err := d.timed(r, "dispatch", "ncclEpDispatch", func() error {
		if d.fp8 {
			return d.ep.DispatchLLFP8(r, s.xq, s.xs, T, h, S, s.recvX, s.recvS, L, d.slots, s.counts)
		}
		return d.ep.DispatchLL(r, rk.X, T, h, s.recvX, L, d.slots, s.counts)
	}); err != nil {
		return err
	}
	return rk.Dev.DownloadAsync(s.mapped, s.counts, 4*int64(L), rk.Stream)
}

// combine: ncclEpCombine into Y (the tokens' sums: high throughput of
// their weighted outputs, low latency of their outputs weighted by their
// routing probabilities), then the shared expert's output added in bf16.
func (d *Device) combine(r int) error {
	s, rk, sh := &d.st[r], d.ranks[r], d.shape
	T, h, k, L := sh.Tokens, sh.Hidden, sh.TopK, sh.LocalExperts()
	out := rk.Y
	if s.sum != 0 {
		out = s.sum
	}
	err := d.timed(r, "combine", "ncclEpCombine", func() error {
		if d.m.algorithm == cuda.EPHighThroughput {
			return d.ep.CombineHT(r, rk.ExpertY, rk.Rows(), h, out, T)
		}
		return d.ep.CombineLL(r, s.recvY, L, d.slots, h, out, rk.Probs, T, k)
	})
	if err != nil || s.sum == 0 {
		return err
	}
	return rk.Dev.UnpermuteSum(rk.Y, s.sum, s.identity, rk.Shared, T, 1, h, rk.Stream)
}

// HostCallMS is the wall time of rank r's library calls in the last
// step's phase (their internal synchronizations included).
func (d *Device) HostCallMS(phase string, r int) (float64, bool) {
	ms, ok := d.st[r].callMS[phase]
	return ms, ok
}

// Library says what ran: the design, NCCL EP's version and where it was
// found, its mode and layout, NCCL's version, and how it spent SMs.
func (d *Device) Library() dispatchers.LibraryInfo {
	sms := fmt.Sprintf("--sms %d: max_num_sms %d, which caps its communication, permute and scan kernels", d.sms, d.sms)
	if d.sms == 0 {
		sms = "--sms 0: max_num_sms AUTO, the library's default: " + d.m.defaultSMs
	}
	var set []string
	for _, e := range smEnv {
		if v := os.Getenv(e); v != "" {
			set = append(set, e+"="+v)
		}
	}
	if set != nil {
		sms += "; overridden by " + strings.Join(set, ", ")
	}
	waits := fmt.Sprintf("timeout_ns = --ncclep-timeout %v", d.timeout)
	if v := os.Getenv(timeoutEnv); v != "" && v != "0" {
		waits = fmt.Sprintf("%s=%s, which overrides --ncclep-timeout %v (timeout_ns)", timeoutEnv, v, d.timeout)
	}
	comms := "each with its own NCCL communicator"
	if d.world != nil {
		comms = fmt.Sprintf("over %d processes (%d each), every rank's group created over the run's NCCL communicator by its own process", d.shape.EP/d.local, d.local)
	}
	detail := fmt.Sprintf("%s mode, expert-major layout without padding, %d ranks one per GPU %s; over NCCL %s (%s); waits bounded by %s",
		modeName(d.m), d.shape.EP, comms, d.lib.NCCL.Version, d.lib.NCCL.Path, waits)
	if d.m.algorithm == cuda.EPHighThroughput {
		detail += fmt.Sprintf("; max_recv_tokens_per_rank %d (every token's slot for each local expert)", d.rows)
	} else {
		detail += "; the routing weights are applied in the combine, not before the expert's second GEMM (DeepEP's low-latency contract)"
	}
	if d.fp8 {
		detail += "; " + fp8Detail
	}
	if d.m.noBackward != "" {
		detail += "; forward only: " + d.m.noBackward
	} else {
		detail += "; " + backwardDetail
	}
	return dispatchers.LibraryInfo{Design: d.m.design, Name: "NCCL EP", Version: d.lib.Version, Path: d.lib.Path, Detail: detail, SMs: sms}
}

// timeoutEnv is NCCL EP's own timeout, which overrides the group's
// timeout_ns when set above 0.
const timeoutEnv = "NCCL_EP_TIMEOUT_MS"

// TimeoutFromEnv is the timeout NCCL_EP_TIMEOUT_MS sets when it is a
// number of milliseconds above 0 (NCCL EP then waits that long instead of
// the group's timeout_ns), else 0.
func TimeoutFromEnv() time.Duration {
	ms, err := strconv.ParseInt(os.Getenv(timeoutEnv), 10, 64)
	if err != nil || ms <= 0 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// Transport names what moves the data.
func (d *Device) Transport() string {
	return fmt.Sprintf("NCCL EP %s (%s mode) over NCCL %s", d.lib.Version, modeName(d.m), d.lib.NCCL.Version)
}

// Traffic counts the last step's copies — one row per (token, expert)
// pair, as the expert-major layout receives them — from every rank's
// routing, read back: dispatch moves the row and (high throughput) its
// fp32 routing weight, combine the output row. In a run that spans
// processes each process counts its own ranks' and the counts are summed
// over the run's communicator: every process calls Traffic after its
// steps, as the layer does.
func (d *Device) Traffic() dispatchers.Traffic {
	sh := d.shape
	var off, all int64
	idx := make([]int32, sh.Tokens*sh.TopK)
	for r, rk := range d.ranks {
		if rk.Dev == nil {
			continue
		}
		if err := rk.Dev.Download(idx, rk.Idx, rk.Stream); err != nil {
			return dispatchers.Traffic{Formula: "not counted: " + err.Error()}
		}
		for _, e := range idx {
			all++
			if sh.Owner(e) != r {
				off++
			}
		}
	}
	if d.world != nil {
		var err error
		if off, all, err = d.sumOverProcesses(off, all); err != nil {
			return dispatchers.Traffic{Formula: "not counted: summing every process's copies: " + err.Error()}
		}
	}
	row, w := 2*int64(sh.Hidden), int64(0)
	drow := dispatchers.RowBytes(dispatchers.PrecisionOf(d.fp8), sh.Hidden) // the dispatch's row: bf16, or e4m3 values and their fp32 scales
	if d.m.algorithm == cuda.EPHighThroughput {
		w = 4
	}
	tr := dispatchers.Traffic{DispatchOffRank: off * (drow + w), DispatchLogical: all * (drow + w), CombineOffRank: off * row, CombineLogical: all * row,
		Formula: fmt.Sprintf("dispatch = copies × (%s%s); combine = copies × hidden×2 B; a copy is one (token, expert) pair "+
			"(the expert-major layout's slot); off-rank excludes copies to the token's own rank%s; moved by %s", dispatchers.RowFormula(dispatchers.PrecisionOf(d.fp8)),
			map[bool]string{true: " + 4 B fp32 routing weight", false: ""}[w > 0],
			map[bool]string{true: "; every process counts its own ranks' copies, summed over the run's communicator", false: ""}[d.world != nil], d.Transport()),
		DispatchAlgorithm: all * drow, CombineAlgorithm: all * row,
		AlgorithmFormula: "rows received × hidden × 2 B, a rank's rows to itself included (DeepEP's convention; ep_bench counts the low-latency mode so)"}
	if d.fp8 {
		tr.AlgorithmFormula = "dispatch: rows received × (hidden × 1 B e4m3 + hidden/128 × 4 B fp32 scales); combine: rows received × hidden × 2 B; " +
			"a rank's rows to itself included (DeepEP's convention)"
	}
	if d.ranBackward() { // the same copies the other way
		tr.CombineBackwardOffRank, tr.CombineBackwardLogical = off*row, all*row
		tr.DispatchBackwardOffRank, tr.DispatchBackwardLogical = off*(row+4), all*(row+4)
		tr.BackwardFormula = "as the forward's copies: combine-bwd (ncclEpDispatch, pass_direction BWD) = copies × hidden×2 B bf16 output gradient; " +
			"dispatch-bwd (ncclEpCombine, pass_direction BWD) = copies × (hidden×2 B bf16 input gradient + 4 B fp32 probability gradient)"
	}
	return tr
}

// sumOverProcesses sums this process's counts with every other's: its
// first rank sends them to each process's first rank (the processes hold
// equal blocks of ranks) and receives theirs, over the run's communicator,
// from its GPU's thread.
func (d *Device) sumOverProcesses(off, all int64) (int64, int64, error) {
	rk := d.ranks[d.first]
	procs := d.shape.EP / d.local
	var sum [2]int64
	err := rk.Threads.Each(func(dev int) error {
		if dev != rk.Threads.Of(rk.Dev) {
			return nil
		}
		src, err := rk.Dev.Alloc(16)
		if err != nil {
			return err
		}
		defer rk.Dev.Free(src)
		dst, err := rk.Dev.Alloc(16 * int64(procs))
		if err != nil {
			return err
		}
		defer rk.Dev.Free(dst)
		if err := rk.Dev.Upload(src, []uint64{uint64(off), uint64(all)}, rk.Stream); err != nil {
			return err
		}
		var sends, recvs []comm.PeerTransfer
		for p := range procs {
			sends = append(sends, comm.PeerTransfer{Peer: p * d.local, Buf: src, Bytes: 16})
			recvs = append(recvs, comm.PeerTransfer{Peer: p * d.local, Buf: dst + device.Addr(16*p), Bytes: 16})
		}
		if err := d.world.Exchange(d.first, sends, recvs); err != nil {
			return err
		}
		got := make([]uint64, 2*procs)
		if err := rk.Dev.Download(got, dst, rk.Stream); err != nil {
			return err
		}
		for p := range procs {
			sum[0] += int64(got[2*p])
			sum[1] += int64(got[2*p+1])
		}
		return nil
	})
	return sum[0], sum[1], err
}

// Footprint is the bytes of rank r's buffers (not the library's own).
func (d *Device) Footprint(r int) int64 { return d.st[r].bytes + d.st[r].gradBytes }

// Close destroys the handles, groups and communicators, then frees the
// buffers.
func (d *Device) Close() error {
	var first error
	keep := func(err error) {
		if first == nil && err != nil {
			first = err
		}
	}
	if d.ep != nil {
		keep(d.ep.Close())
		d.ep = nil
	}
	for r := range d.st {
		s, rk := &d.st[r], d.ranks[r]
		if rk.Dev == nil {
			continue
		}
		if rk.ExpertX == s.recvX || d.fp8 && rk.ExpertX == s.pk {
			rk.ExpertX, rk.ExpertProbs = 0, 0
		}
		rk.Work = nil
		keep(device.Free(rk.Dev, &s.counts, &s.recvX, &s.recvW, &s.recvY, &s.sum, &s.identity, &s.xq, &s.xs, &s.recvS, &s.pk))
		if s.gradBytes > 0 { // the backward's, made by combineBackward
			keep(device.Free(rk.Dev, &rk.DX, &rk.DProbs, &rk.ExpertDY))
			s.gradBytes = 0
		}
		if s.mapped.Host != nil {
			keep(rk.Dev.FreeMapped(s.mapped))
			s.mapped = device.MappedHost{}
		}
	}
	return first
}
