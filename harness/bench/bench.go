// Package bench is moebench's benchmarks of parts of the layer alone:
// 'moebench bench kernels' (Kernels: each kernel of one rank's step timed
// on the device against ceilings measured in the same run) and 'moebench
// bench dispatch' (Dispatch: dispatch and combine alone per dispatcher,
// SM budget and precision, each point checked by the exact round trip of
// harness/roundtrip). It builds its layers and devices through package
// harness, as a run does, and its statistics with harness/summary; its
// results are versioned JSON (KernelSchema, DispatchSchema) that cmd
// writes and tables.
package bench

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/moebench/moebench/harness"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// KernelSchema names the kernel benchmark's output version.
const KernelSchema = "moebench.bench/v1"

// KernelBench is `moebench bench kernels`: each kernel of one rank's layer
// step timed alone on the device (CUDA events, median), with its achieved
// rate and the ratio to a ceiling measured in the same run — for
// memory-bound kernels a large copy by an SM kernel (their target is
// against it) and, beside it, a large device-to-device copy by the copy
// engines (an SM kernel may beat it on one GPU's memory: a ratio above 1),
// a large dense bf16 GEMM for GEMMs, and with a second GPU a large peer
// copy (the NVLink or PCIe rate one way) for copies between GPUs.
type KernelBench struct {
	Schema  string         `json:"schema"`
	Time    string         `json:"time"`
	Config  results.Config `json:"config"`
	Stack   results.Stack  `json:"stack"`
	Iters   int            `json:"iters"`
	Rows    []Row          `json:"rows"`
	Routing string         `json:"routing_note"`
	Timing  string         `json:"timing_note"` // what each timed call follows (the L2 flush)
	Peer    string         `json:"peer_note"`   // which GPUs the peer rows copy between, or why there are none
}

// Row is one kernel's measurement.
type Row struct {
	Kernel  string  `json:"kernel"`
	Shape   string  `json:"shape"`
	P50us   float64 `json:"p50_us"`
	Work    float64 `json:"work"` // bytes or FLOPs per call
	Rate    float64 `json:"rate"` // GB/s or TFLOP/s
	Unit    string  `json:"unit"`
	Ceiling string  `json:"ceiling,omitempty"` // which ceiling Ratio is against
	Ratio   float64 `json:"ratio,omitempty"`
	// memory-bound rows: the ratio to the copy engines' device copy too
	// (Ratio is against the SM copy kernel)
	CopyEngineRatio float64 `json:"copy_engine_ratio,omitempty"`
	Target          float64 `json:"target,omitempty"` // the ratio it should reach, where one is set
	Formula         string  `json:"formula"`
}

// Verdict says whether a row meets its target.
func (r Row) Verdict() string {
	switch {
	case r.Target == 0:
		return ""
	case r.Ratio >= r.Target:
		return "meets"
	}
	return "below"
}

// Sizes are the ceilings' sizes (the copy's bytes and the dense GEMM's
// m = n = k) and the L2 flush's: before each timed call the stream copies
// FlushBytes/2 bytes to another FlushBytes/2, so that no call finds its
// inputs in the L2 left there by the call before (the ceilings are far
// larger than any L2, so the kernels' rates compare with them), and the GPU
// is still busy with the flush while the host queues the call and its
// events, so that the time holds no launch gap. 0: no flush.
type Sizes struct {
	CopyBytes  int64
	GEMMDim    int
	FlushBytes int64
}

// DefaultSizes are large enough to reach a GPU's steady rates; the
// flush is over twice the L2 of an H100 or H200 (50 MB) and a B200 (126 MB).
var DefaultSizes = Sizes{CopyBytes: 1 << 30, GEMMDim: 8192, FlushBytes: 256 << 20}

// Kernels times the kernels of rank 0 of cfg's layer on the device with
// balanced routing (each local expert gets tokens·topk/local rows). Inputs
// are random and never zero; the kernels' correctness is the GPU tests'
// business (kernels/comm/cuda_test.go).
func Kernels(cfg setup.Config, env setup.Env, sizes Sizes) (*KernelBench, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	devs, err := layer.OpenDevices(env, 0, 2, nil)
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", cfg.Device, err)
	}
	defer layer.CloseDevices(devs)
	dev := devs[0]
	layer.SetGEMMTuning(devs, true) // each call's shape is timed in its warm-up
	rec := harness.NewRecord(cfg, env)
	kb := &KernelBench{Schema: KernelSchema, Time: rec.Time, Config: rec.Config, Stack: rec.Stack, Iters: cfg.Iters,
		Routing: "balanced: each of rank 0's local experts computes tokens·topk/local rows; permute indices uniform at random"}
	b := &bencher{dev: dev, iters: cfg.Iters, warmup: max(cfg.Warmup, 1), rng: rand.New(rand.NewPCG(cfg.Seed, 0xbe7c4))}
	if b.s, err = dev.NewStream(); err != nil {
		return nil, err
	}
	kb.Timing = "no L2 flush: a call may find its inputs in the L2"
	if half := sizes.FlushBytes / 2; half > 0 {
		b.flushSrc, b.flushDst, b.flushBytes = b.raw(int(half)), b.raw(int(half)), half
		if b.err != nil {
			return nil, fmt.Errorf("the L2 flush's buffers: %w", b.err)
		}
		defer dev.Free(b.flushSrc)
		defer dev.Free(b.flushDst)
		kb.Timing = fmt.Sprintf("each timed call follows a %d MiB device copy on its stream: an L2 flush, and no launch gap", half>>20)
	}
	if b.e0, err = dev.NewEvent(); err != nil {
		return nil, err
	}
	if b.e1, err = dev.NewEvent(); err != nil {
		return nil, err
	}
	rows, err := b.run(cfg, sizes)
	kb.Rows = rows
	if err != nil {
		return kb, err
	}
	if len(devs) < 2 {
		kb.Peer = "no peer rows: one GPU (the peer-copy ceiling needs two)"
		return kb, nil
	}
	kb.Peer = "peer rows: GPU 0 → GPU 1, queued on GPU 0"
	if !dev.Reaches(devs[1]) {
		kb.Peer += " (no peer access: through host memory)"
	}
	rows, err = b.peerRows(devs[1], cfg, sizes)
	kb.Rows = append(kb.Rows, rows...)
	return kb, err
}

// peerRows times copies from the bench's device to peer: the ceiling (one
// large peer copy) and rank 0's share of an alltoall dispatch with balanced
// routing, as the native alltoall sends it when every other rank is on peer:
// per destination rank a copy of its rows, one of their probabilities and
// one of the counts.
func (b *bencher) peerRows(peer device.Device, cfg setup.Config, sizes Sizes) ([]Row, error) {
	var rows []Row
	cb := sizes.CopyBytes
	src := b.buf(int(cb / 2))
	if b.err != nil {
		return nil, b.err
	}
	defer b.dev.Free(src)
	dst, err := peer.Alloc(cb)
	if err != nil {
		return nil, err
	}
	defer peer.Free(dst)
	r, err := b.row(Row{Kernel: "peer copy (ceiling)", Shape: fmt.Sprintf("%d MiB", cb>>20), Work: float64(cb), Unit: "GB/s",
		Formula: "bytes sent one way"}, 1e3, "", 0,
		func() error { return b.dev.CopyPeer(device.CopyOp{Dst: dst, Src: src, Bytes: cb, DstDev: peer}, b.s) })
	if err != nil {
		return rows, err
	}
	rows = append(rows, r)
	ceiling := r.Rate
	n, h, L := int64(cfg.Tokens*cfg.TopK), int64(cfg.Hidden), int64(cfg.Experts/cfg.EP)
	if need := 2*n*h + 4*n + 4*int64(cfg.Experts); need > cb {
		return rows, fmt.Errorf("peer rows: rank 0's dispatch (%d bytes) does not fit the %d-byte ceiling buffers", need, cb)
	}
	if cfg.EP == 1 {
		return rows, nil // nothing leaves the rank
	}
	per := n / int64(cfg.EP)
	var ops []device.CopyOp
	var bytes int64
	for d := int64(1); d < int64(cfg.EP); d++ { // destination rank d's chunk, laid out as in a [source] receive buffer
		for _, c := range [][3]int64{{2 * d * per * h, 2 * per * h}, {2*n*h + 4*d*per, 4 * per}, {2*n*h + 4*n + 4*d*L, 4 * L}} {
			ops = append(ops, device.CopyOp{Dst: dst + device.Addr(c[0]), Src: src + device.Addr(c[0]), Bytes: c[1], DstDev: peer})
			bytes += c[1]
		}
	}
	r, err = b.row(Row{Kernel: "alltoall dispatch (peer copies)", Shape: fmt.Sprintf("%d chunks × %d rows × %d", cfg.EP-1, per, h), Work: float64(bytes),
		Unit: "GB/s", Formula: "rank 0's off-rank rows (bf16), probabilities (fp32) and counts, one copy each per destination"}, 1e3, "peer copy", ceiling,
		func() error {
			for _, op := range ops {
				if err := b.dev.CopyPeer(op, b.s); err != nil {
					return err
				}
			}
			return nil
		})
	if err != nil {
		return rows, err
	}
	return append(rows, r), nil
}

type bencher struct {
	dev                device.Device
	s                  device.Stream
	e0, e1             device.Event
	iters, warmup      int
	rng                *rand.Rand
	flushSrc, flushDst device.Addr // the L2 flush (Sizes): flushBytes copied before each timed call
	flushBytes         int64
	copyGBs, smCopyGBs float64 // ceilings, once measured: the copy engines' device copy, the SM copy kernel
	gemmTFLOPS         float64
	err                error // the first allocation error
}

// raw allocates bytes, keeping the first error in b.err (later calls then
// do nothing and return 0).
func (b *bencher) raw(bytes int) device.Addr {
	if b.err != nil {
		return 0
	}
	p, err := b.dev.Alloc(int64(bytes))
	b.err = err
	return p
}

// buf allocates words 16-bit words of random non-zero bf16 values (a random
// block tiled over the buffer), keeping the first error in b.err.
func (b *bencher) buf(words int) device.Addr {
	if b.err != nil {
		return 0
	}
	p, err := b.fill(int64(words))
	b.err = err
	return p
}

func (b *bencher) fill(words int64) (device.Addr, error) {
	p, err := b.dev.Alloc(2 * words)
	if err != nil {
		return 0, err
	}
	block := min(words, 1<<20)
	v := make([]float32, block)
	for i := range v {
		for v[i] == 0 {
			v[i] = float32(b.rng.NormFloat64())
		}
	}
	if err := b.dev.Upload(p, kernels.BF16Bits(v), b.s); err != nil {
		return 0, err
	}
	for done := block; done < words; done *= 2 { // double the filled prefix
		n := min(done, words-done)
		if err := b.dev.Copy(p+device.Addr(2*done), p, 2*n, b.s); err != nil {
			return 0, err
		}
	}
	return p, nil
}

// time is the median of iters calls of fn between two events, in µs, each
// after the L2 flush.
func (b *bencher) time(fn func() error) (float64, error) {
	for range b.warmup {
		if err := fn(); err != nil {
			return 0, err
		}
	}
	var us []float64
	for range b.iters {
		if b.flushBytes > 0 {
			if err := b.dev.Copy(b.flushDst, b.flushSrc, b.flushBytes, b.s); err != nil {
				return 0, err
			}
		}
		if err := b.dev.Record(b.e0, b.s); err != nil {
			return 0, err
		}
		if err := fn(); err != nil {
			return 0, err
		}
		if err := b.dev.Record(b.e1, b.s); err != nil {
			return 0, err
		}
		if err := b.dev.SyncStream(b.s); err != nil {
			return 0, err
		}
		ms, err := b.dev.Elapsed(b.e0, b.e1)
		if err != nil {
			return 0, err
		}
		us = append(us, 1e3*ms)
	}
	slices.Sort(us)
	return us[len(us)/2], nil
}

// memRow times a memory-bound kernel moving bytes per call, against the
// SM copy kernel's ceiling (once measured), and the copy engines'.
func (b *bencher) memRow(kernel, shape string, bytes, target float64, formula string, fn func() error) (Row, error) {
	r, err := b.row(Row{Kernel: kernel, Shape: shape, Work: bytes, Unit: "GB/s", Target: target, Formula: formula}, 1e3, "SM copy", b.smCopyGBs, fn)
	if b.copyGBs > 0 {
		r.CopyEngineRatio = r.Rate / b.copyGBs
		if r.Ceiling != "" {
			r.Ceiling = fmt.Sprintf("SM copy (%.2f of the CE copy)", r.CopyEngineRatio)
		} else {
			r.Ceiling, r.Ratio = "CE copy", r.CopyEngineRatio
		}
	}
	return r, err
}

// gemmRow times GEMM work of flops per call, against the dense GEMM ceiling.
func (b *bencher) gemmRow(kernel, shape string, flops, target float64, formula string, fn func() error) (Row, error) {
	return b.row(Row{Kernel: kernel, Shape: shape, Work: flops, Unit: "TFLOP/s", Target: target, Formula: formula}, 1e6, "dense GEMM", b.gemmTFLOPS, fn)
}

// row times fn and fills r's time, its rate (work per µs / scale) and the
// ratio to ceiling (once measured).
func (b *bencher) row(r Row, scale float64, ceilingName string, ceiling float64, fn func() error) (Row, error) {
	us, err := b.time(fn)
	r.P50us = us
	if us > 0 {
		r.Rate = r.Work / us / scale
	}
	if ceiling > 0 {
		r.Ceiling, r.Ratio = ceilingName, r.Rate/ceiling
	}
	return r, err
}

// rowList collects the rows a benchmark timed.
type rowList []Row

// add keeps r when it timed (err is nil) and returns err.
func (l *rowList) add(r Row, err error) error {
	if err == nil {
		*l = append(*l, r)
	}
	return err
}

// run times the ceilings, then the kernels of one rank's step; on an
// error it returns the rows timed before it.
func (b *bencher) run(cfg setup.Config, sizes Sizes) ([]Row, error) {
	var rows rowList
	if err := b.ceilings(&rows, sizes); err != nil {
		return rows, err
	}
	st, err := b.stepBuffers(cfg)
	if err != nil {
		return rows, err
	}
	for _, part := range []func(*rowList, *stepBufs) error{b.routerRows, b.permuteRows, b.expertRows, b.unpermuteRows} {
		if err := part(&rows, st); err != nil {
			return rows, err
		}
	}
	return rows, nil
}

// ceilings times the device copy, the SM copy kernel and a dense GEMM, the
// ceilings the other rows are held against.
func (b *bencher) ceilings(rows *rowList, sizes Sizes) error {
	dev, s := b.dev, b.s
	// ceilings
	cb := sizes.CopyBytes / 2 * 2
	src, dst := b.buf(int(cb/2)), b.buf(int(cb/2))
	if b.err != nil {
		return b.err
	}
	r, err := b.memRow("CE copy (ceiling)", fmt.Sprintf("%d MiB", cb>>20), 2*float64(cb), 0, "bytes read + written, cuMemcpyDtoDAsync",
		func() error { return dev.Copy(dst, src, cb, s) })
	if err := rows.add(r, err); err != nil {
		return err
	}
	b.copyGBs = r.Rate
	r, err = b.memRow("SM copy kernel (ceiling)", fmt.Sprintf("%d MiB", cb>>20), 2*float64(cb), 0, "bytes read + written, 16-byte vectors",
		func() error { return dev.CopySM(dst, src, cb, s) })
	if err := rows.add(r, err); err != nil {
		return err
	}
	b.smCopyGBs = r.Rate
	dev.Free(src)
	dev.Free(dst)
	g := sizes.GEMMDim
	ga, gc := b.buf(g*g), b.buf(g*g)
	if b.err != nil {
		return b.err
	}
	r, err = b.gemmRow("dense bf16 GEMM (ceiling)", fmt.Sprintf("%d×%d×%d", g, g, g), 2*float64(g)*float64(g)*float64(g), 0, "2·m·n·k",
		func() error { return dev.GEMM(gc, ga, ga, g, g, g, false, s) })
	if err := rows.add(r, err); err != nil {
		return err
	}
	b.gemmTFLOPS = r.Rate
	dev.Free(ga)
	dev.Free(gc)

	return nil
}

// stepBufs are the buffers of one rank's step (balanced routing), with
// its sizes: T tokens, h hidden, f ffn, E experts, k top-k, L local
// experts, n = T·k copies.
type stepBufs struct {
	cfg                                    setup.Config
	T, h, f, E, k, L, n                    int
	x, wr, logits, idx, probs              device.Addr
	order, pos, counts, px, pp, cc, ex, ep device.Addr
	fc1, fc2, h1, act, ey, y, bias, shared device.Addr
	rc                                     kernels.RouterConfig
}

// stepBuffers allocates the step's buffers, in the order (and so with the
// random values) the bench has always drawn them.
func (b *bencher) stepBuffers(cfg setup.Config) (*stepBufs, error) {
	T, h, f, E, k := cfg.Tokens, cfg.Hidden, cfg.FFN, cfg.Experts, cfg.TopK
	L, n := cfg.Experts/cfg.EP, cfg.Tokens*cfg.TopK
	st := &stepBufs{cfg: cfg, T: T, h: h, f: f, E: E, k: k, L: L, n: n}
	st.x, st.wr, st.logits = b.buf(T*h), b.buf(E*h), b.buf(2*T*E) // logits: fp32
	st.idx, st.probs = b.raw(4*n), b.buf(2*n)
	st.order, st.pos, st.counts = b.raw(4*n), b.raw(4*n), b.raw(4*E)
	st.px, st.pp, st.cc = b.raw(2*n*h), b.raw(4*n), b.raw(4*cfg.EP*L)
	st.ex, st.ep = b.raw(2*n*h), b.raw(4*n)
	st.fc1, st.fc2 = b.buf(L*2*f*h), b.buf(L*h*f)
	st.h1, st.act, st.ey, st.y = b.raw(2*n*2*f), b.raw(2*n*f), b.raw(2*n*h), b.raw(2*T*h)
	st.rc = cfg.RouterConfig(nil)
	if st.rc.Score == kernels.ScoreSigmoid {
		st.bias = b.buf(2 * E)
	}
	if cfg.SharedExperts > 0 {
		st.shared = b.buf(T * h)
	}
	if b.err != nil {
		return nil, b.err
	}
	return st, nil
}

// routerRows times the router's logits GEMM and its top-k (also on every
// rank's tokens at once).
func (b *bencher) routerRows(rows *rowList, st *stepBufs) error {
	cfg, dev, s := st.cfg, b.dev, b.s
	T, h, E, k, n := st.T, st.h, st.E, st.k, st.n
	x, wr, logits, idx, probs, bias, rc := st.x, st.wr, st.logits, st.idx, st.probs, st.bias, st.rc
	r, err := b.gemmRow("router logits GEMM", fmt.Sprintf("%d×%d×%d → fp32", T, E, h), 2*float64(T*E*h), 0, "2·tokens·experts·hidden",
		func() error { return dev.GEMM(logits, x, wr, T, E, h, true, s) })
	if err := rows.add(r, err); err != nil {
		return err
	}
	r, err = b.memRow("router top-k", fmt.Sprintf("%d tokens × %d experts, k=%d", T, E, k), float64(4*T*E+8*n), 0.6,
		"fp32 logits read + (int32 index, fp32 prob) per copy written",
		func() error { return dev.RouterTopK(rc, logits, bias, T, idx, probs, s) })
	if err := rows.add(r, err); err != nil {
		return err
	}
	if cfg.EP > 1 {
		// one rank's logits may be too few bytes for a bandwidth rate (a
		// launch and a memory latency): the same kernel on every rank's
		// tokens at once shows whether the kernel or the size is the limit
		TE := T * cfg.EP
		lg, ix, pr := b.buf(2*TE*E), b.raw(4*TE*k), b.raw(4*TE*k)
		if b.err != nil {
			return b.err
		}
		r, err = b.memRow("router top-k (all ranks' tokens)", fmt.Sprintf("%d tokens (%d ranks') × %d experts, k=%d", TE, cfg.EP, E, k),
			float64(4*TE*E+8*TE*k), 0.6, "fp32 logits read + (int32 index, fp32 prob) per copy written",
			func() error { return dev.RouterTopK(rc, lg, bias, TE, ix, pr, s) })
		if err := rows.add(r, err); err != nil {
			return err
		}
		device.Free(dev, &lg, &ix, &pr)
	}
	return nil
}

// permuteRows times the permutation of uniformly random routing and the
// alltoall's chunk sort of balanced chunks.
func (b *bencher) permuteRows(rows *rowList, st *stepBufs) error {
	cfg, dev, s := st.cfg, b.dev, b.s
	h, E, k, L, n := st.h, st.E, st.k, st.L, st.n
	idx, probs, x, order, pos, counts := st.idx, st.probs, st.x, st.order, st.pos, st.counts
	px, pp, cc, ex, ep := st.px, st.pp, st.cc, st.ex, st.ep
	// permute with uniformly random experts
	ri := make([]int32, n)
	for i := range ri {
		ri[i] = int32(b.rng.IntN(E))
	}
	if err := dev.Upload(idx, ri, s); err != nil {
		return err
	}
	r, err := b.memRow("permute order", fmt.Sprintf("%d copies, %d experts", n, E), float64(12*n+4*E), 0,
		"int32 expert per copy read + (row, position) per copy written + counts",
		func() error { return dev.PermuteOrder(idx, n, E, order, pos, counts, s) })
	if err := rows.add(r, err); err != nil {
		return err
	}
	r, err = b.memRow("permute", fmt.Sprintf("%d copies × %d", n, h), float64(4*n*h+12*n), 0.8,
		"bf16 row read + written per copy, + row index and fp32 prob",
		func() error {
			if err := dev.GatherRows(px, x, order, k, n, h, s); err != nil {
				return err
			}
			return dev.GatherF32(pp, probs, order, 1, n, s)
		})
	if err := rows.add(r, err); err != nil {
		return err
	}
	// balanced chunks for the alltoall sort: [source][local]
	cnt := make([]int32, cfg.EP*L)
	for i := range cnt {
		cnt[i] = int32(n / len(cnt))
	}
	for i := range n % len(cnt) {
		cnt[i]++
	}
	if err := dev.Upload(cc, cnt, s); err != nil {
		return err
	}
	r, err = b.memRow("alltoall chunk sort", fmt.Sprintf("%d rows × %d, %d×%d chunks", n, h, cfg.EP, L), float64(4*n*h+8*n), 0,
		"bf16 row + fp32 prob read and written",
		func() error { return dev.SortChunks(ex, ep, px, pp, cc, n, cfg.EP, L, h, false, s) })
	if err := rows.add(r, err); err != nil {
		return err
	}
	return nil
}

// expertRows times the experts' GEMMs, each grouped GEMM the device has,
// with balanced rows per local expert.
func (b *bencher) expertRows(rows *rowList, st *stepBufs) error {
	dev, s := b.dev, b.s
	h, f, L, n := st.h, st.f, st.L, st.n
	h1, ex, fc1, ey, act, fc2 := st.h1, st.ex, st.fc1, st.ey, st.act, st.fc2
	// experts: balanced rows per local expert
	per := make([]int, L)
	for i := range per {
		per[i] = n / L
		if i < n%L {
			per[i]++
		}
	}
	groups := func(out, in, w device.Addr, outCols, inCols int) []device.Group {
		var gs []device.Group
		at := 0
		for l, m := range per {
			gs = append(gs, device.Group{C: out + device.Addr(2*at*outCols), A: in + device.Addr(2*at*inCols), W: w + device.Addr(2*l*outCols*inCols), M: m})
			at += m
		}
		return gs
	}
	g1, g2 := groups(h1, ex, fc1, 2*f, h), groups(ey, act, fc2, h, f)
	ways := []*device.Grouped{}
	for _, side := range layer.GroupedSides() {
		gr, err := device.NewGrouped(dev, side)
		if err != nil {
			return err
		}
		ways = append(ways, gr)
	}
	if gr, err := device.NewBatched(dev); err == nil { // where the device has a grouped GEMM
		ways = append(ways, gr)
	}
	for _, gr := range ways {
		r, err := b.gemmRow("expert GEMMs ("+gr.Name()+")", fmt.Sprintf("%d experts × %d rows, fc1 %d→%d, fc2 %d→%d", L, n/L, h, 2*f, f, h),
			6*float64(n)*float64(h)*float64(f), 0.7, "6·hidden·ffn per row (fc1 and fc2)",
			func() error {
				if err := gr.Run(dev, g1, 2*f, h, s); err != nil {
					return err
				}
				return gr.Run(dev, g2, h, f, s)
			})
		if err := rows.add(r, err); err != nil {
			return err
		}
	}
	return nil
}

// unpermuteRows times SwiGLU and the unpermute (the sum of k) of a random
// assignment of rows to token slots.
func (b *bencher) unpermuteRows(rows *rowList, st *stepBufs) error {
	dev, s := b.dev, b.s
	T, h, f, k, n := st.T, st.h, st.f, st.k, st.n
	act, h1, ep, pos, y, ey, shared := st.act, st.h1, st.ep, st.pos, st.y, st.ey, st.shared
	r, err := b.memRow("SwiGLU × prob", fmt.Sprintf("%d rows × %d", n, f), float64(6*n*f+4*n), 0,
		"bf16 gate and up read, bf16 activation written, fp32 prob",
		func() error { return dev.SwiGLU(act, h1, ep, n, f, s) })
	if err := rows.add(r, err); err != nil {
		return err
	}
	// unpermute: a random assignment of rows to token slots
	perm := make([]int32, n)
	for i, v := range b.rng.Perm(n) {
		perm[i] = int32(v)
	}
	if err := dev.Upload(pos, perm, s); err != nil {
		return err
	}
	bytes := float64(2*n*h + 2*T*h + 4*n)
	if shared != 0 {
		bytes += float64(2 * T * h)
	}
	r, err = b.memRow("unpermute (sum of k)", fmt.Sprintf("%d tokens × %d, k=%d", T, h, k), bytes, 0.8,
		"bf16 row read per copy + bf16 output row written (+ shared-expert row read) + int32 positions",
		func() error { return dev.UnpermuteSum(y, ey, pos, shared, T, k, h, s) })
	return rows.add(r, err)
}
