package kernels

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moebench/moebench/internal/cuda"
)

// CUDA is a Device on one GPU: the driver, the CUDA C kernels of this
// package compiled by NVRTC on first use with their shape constants (cached
// on disk, see JIT), and cuBLASLt for the GEMMs.
//
// Its kernels are compared with the host functions by cuda_test.go; those
// tests skip without a GPU, so on a machine without one nothing here is
// proven.
type CUDA struct {
	Drv     *cuda.Driver
	JIT     *JIT
	Lt      *cuda.CuBLASLt
	Ordinal int
	Arch    string // sm_XY
	SMs     int

	fns     map[string]cuda.Function // by file, constants and name
	mods    map[string]cuda.Module   // by file and constants
	plans   map[gemmKey]*cuda.GEMM
	ws      map[Stream]Ptr // cuBLASLt workspace of each stream
	streams []Stream
	events  []Event
	allocs  map[Ptr]bool
}

type gemmKey struct {
	m, n, k int
	f32     bool
	align   cuda.Align
}

// GEMMWorkspace is the cuBLASLt workspace each stream gets.
const GEMMWorkspace = 32 << 20

// OpenCUDA opens the driver, NVRTC and cuBLASLt and makes GPU ordinal's
// primary context current on this OS thread (which it locks: use the device
// from one goroutine). cacheDir holds compiled kernels; "" uses
// $MOEBENCH_CACHE, else the user cache directory.
func OpenCUDA(ordinal int, cacheDir string) (*CUDA, error) {
	drv, err := cuda.OpenDriver()
	if err != nil {
		return nil, err
	}
	n, _ := drv.DeviceCount()
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("GPU %d: the driver reports %d GPUs", ordinal, n)
	}
	if _, err := drv.PrimaryContext(ordinal); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok { // give the context back when a library is missing
			drv.ReleasePrimaryContext(ordinal)
		}
	}()
	c := &CUDA{Drv: drv, Ordinal: ordinal, fns: map[string]cuda.Function{}, mods: map[string]cuda.Module{}, plans: map[gemmKey]*cuda.GEMM{},
		ws: map[Stream]Ptr{}, allocs: map[Ptr]bool{}}
	major, err := drv.Attribute(ordinal, cuda.AttrComputeCapabilityMajor)
	if err != nil {
		return nil, err
	}
	minor, err := drv.Attribute(ordinal, cuda.AttrComputeCapabilityMinor)
	if err != nil {
		return nil, err
	}
	c.Arch = fmt.Sprintf("sm_%d%d", major, minor)
	if c.SMs, err = drv.Attribute(ordinal, cuda.AttrMultiprocessorCount); err != nil {
		return nil, err
	}
	nv, err := cuda.OpenNVRTC()
	if err != nil {
		return nil, err
	}
	if cacheDir == "" {
		cacheDir = os.Getenv("MOEBENCH_CACHE")
	}
	if cacheDir == "" {
		if d, err := os.UserCacheDir(); err == nil {
			cacheDir = filepath.Join(d, "moebench", "kernels")
		}
	}
	c.JIT = &JIT{NVRTC: nv, CacheDir: cacheDir}
	if c.Lt, err = cuda.OpenCuBLASLt(); err != nil {
		return nil, err
	}
	if err := c.Lt.Init(); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

func (c *CUDA) Name() string { return "cuda" }

// fn returns kernel name of file compiled with defs, compiling and loading
// the module on first use.
func (c *CUDA) fn(file, name string, defs map[string]string) (cuda.Function, error) {
	keys := make([]string, 0, len(defs))
	for k, v := range defs {
		keys = append(keys, k+"="+v)
	}
	sort.Strings(keys)
	mkey := file + "|" + strings.Join(keys, ",")
	if f, ok := c.fns[mkey+"|"+name]; ok {
		return f, nil
	}
	m, ok := c.mods[mkey]
	if !ok {
		cubin, err := c.JIT.Compile(file, c.Arch, defs)
		if err != nil {
			return nil, err
		}
		if m, err = c.Drv.LoadModule(cubin); err != nil {
			return nil, err
		}
		c.mods[mkey] = m
	}
	f, err := c.Drv.Function(m, name)
	if err != nil {
		return nil, err
	}
	c.fns[mkey+"|"+name] = f
	return f, nil
}

// launch runs a kernel on a 1-D grid.
func (c *CUDA) launch(file, name string, defs map[string]string, grid, block int, s Stream, args ...any) error {
	f, err := c.fn(file, name, defs)
	if err != nil {
		return err
	}
	if err := c.Drv.Launch(f, [3]uint32{uint32(grid), 1, 1}, [3]uint32{uint32(block), 1, 1}, 0, s, args...); err != nil {
		return fmt.Errorf("%s (grid %d, block %d): %w", name, grid, block, err)
	}
	return nil
}

// rowGrid is the grid of a kernel with one block per row (grid-stride), and
// the block size for rows of hidden bf16 copied in 16-byte vectors.
func (c *CUDA) rowGrid(rows, hidden int) (grid, block int) {
	grid = min(rows, 32*c.SMs)
	block = min(256, (hidden/8+31)/32*32)
	return max(grid, 1), max(block, 32)
}

func (c *CUDA) Alloc(bytes int64) (Ptr, error) {
	p, err := c.Drv.Alloc(max(bytes, 1))
	if err == nil {
		c.allocs[p] = true
	}
	return p, err
}

func (c *CUDA) Free(p Ptr) error {
	delete(c.allocs, p)
	return c.Drv.Free(p)
}

func (c *CUDA) Upload(dst Ptr, src any, s Stream) error {
	switch v := src.(type) {
	case []uint16:
		return cuda.CopyToDevice(c.Drv, dst, v, s)
	case []float32:
		return cuda.CopyToDevice(c.Drv, dst, v, s)
	case []int32:
		return cuda.CopyToDevice(c.Drv, dst, v, s)
	}
	_, _, err := ElemBytes(src)
	return err
}

func (c *CUDA) Download(dst any, src Ptr, s Stream) error {
	var err error
	switch v := dst.(type) {
	case []uint16:
		err = cuda.CopyFromDevice(c.Drv, v, src, s)
	case []float32:
		err = cuda.CopyFromDevice(c.Drv, v, src, s)
	case []int32:
		err = cuda.CopyFromDevice(c.Drv, v, src, s)
	default:
		_, _, err = ElemBytes(dst)
	}
	if err != nil {
		return err
	}
	return c.Drv.SyncStream(s)
}

func (c *CUDA) Copy(dst, src Ptr, bytes int64, s Stream) error {
	if bytes == 0 {
		return nil
	}
	return c.Drv.CopyDevice(dst, src, bytes, s)
}

func (c *CUDA) Fill16(p Ptr, v uint16, n int64, s Stream) error {
	if n == 0 {
		return nil
	}
	return c.Drv.Fill16(p, v, n, s)
}

func (c *CUDA) NewStream() (Stream, error) {
	s, err := c.Drv.NewStream(0)
	if err == nil {
		c.streams = append(c.streams, s)
	}
	return s, err
}

func (c *CUDA) NewEvent() (Event, error) {
	e, err := c.Drv.NewEvent()
	if err == nil {
		c.events = append(c.events, e)
	}
	return e, err
}

func (c *CUDA) Record(e Event, s Stream) error { return c.Drv.Record(e, s) }
func (c *CUDA) Wait(s Stream, e Event) error   { return c.Drv.WaitEvent(s, e) }
func (c *CUDA) SyncStream(s Stream) error      { return c.Drv.SyncStream(s) }
func (c *CUDA) Elapsed(a, b Event) (float64, error) {
	ms, err := c.Drv.Elapsed(a, b)
	return float64(ms), err
}

func (c *CUDA) GEMM(out, a, w Ptr, m, n, k int, f32Out bool, s Stream) error {
	if m == 0 {
		return nil
	}
	key := gemmKey{m, n, k, f32Out, cuda.Align{A: cuda.AlignOf(a), W: cuda.AlignOf(w), C: cuda.AlignOf(out)}}
	g, ok := c.plans[key]
	if !ok {
		var err error
		if g, err = c.Lt.PlanGEMM(m, n, k, f32Out, key.align, GEMMWorkspace); err != nil {
			return err
		}
		c.plans[key] = g
	}
	ws, ok := c.ws[s]
	if !ok {
		var err error
		if ws, err = c.Alloc(GEMMWorkspace); err != nil {
			return err
		}
		c.ws[s] = ws
	}
	return c.Lt.Run(g, out, a, w, ws, s)
}

// routerDefs are router.cu's constants for rc.
func routerDefs(rc RouterConfig) map[string]string {
	sig, groups, gtop := "0", rc.Groups, rc.GroupTopK
	if rc.Score == ScoreSigmoid {
		sig = "1"
	}
	if groups <= 1 {
		groups, gtop = 0, 0
	}
	scale := rc.Scale
	if scale == 0 {
		scale = 1
	}
	return map[string]string{"MB_EXPERTS": fmt.Sprint(rc.Experts), "MB_TOPK": fmt.Sprint(rc.TopK), "MB_SIGMOID": sig,
		"MB_GROUPS": fmt.Sprint(groups), "MB_GROUP_TOPK": fmt.Sprint(gtop), "MB_SCALE": fmt.Sprintf("%#gf", scale)}
}

func (c *CUDA) RouterTopK(rc RouterConfig, logits, bias Ptr, tokens int, idx, probs Ptr, s Stream) error {
	if tokens == 0 {
		return nil
	}
	const warps = 4 // one token per warp
	return c.launch("router.cu", "router_topk", routerDefs(rc), (tokens+warps-1)/warps, 32*warps, s,
		logits, bias, int32(tokens), idx, probs)
}

func (c *CUDA) PermuteOrder(idx Ptr, n, experts int, rows, pos, counts Ptr, s Stream) error {
	return c.launch("permute.cu", "permute_order", map[string]string{"MB_HIDDEN": "8"}, experts, 512, s,
		idx, int32(n), rows, pos, counts)
}

func (c *CUDA) GatherRows(dst, src, rows Ptr, div, n, hidden int, s Stream) error {
	if n == 0 {
		return nil
	}
	grid, block := c.rowGrid(n, hidden)
	return c.launch("permute.cu", "permute_rows", map[string]string{"MB_HIDDEN": fmt.Sprint(hidden)}, grid, block, s,
		src, rows, int32(div), int32(n), dst)
}

func (c *CUDA) GatherF32(dst, src, rows Ptr, div, n int, s Stream) error {
	if n == 0 {
		return nil
	}
	return c.launch("permute.cu", "gather_f32", map[string]string{"MB_HIDDEN": "8"}, min((n+255)/256, 8*c.SMs), 256, s,
		src, rows, int32(div), int32(n), dst)
}

func (c *CUDA) SortChunks(dst, probsOut, src, probsIn, counts Ptr, rows, ep, local, hidden int, inverse bool, s Stream) error {
	if rows == 0 {
		return nil
	}
	inv := int32(0)
	if inverse {
		inv = 1
	}
	grid, block := c.rowGrid(rows, hidden)
	defs := map[string]string{"MB_HIDDEN": fmt.Sprint(hidden), "MB_EP": fmt.Sprint(ep), "MB_LOCAL": fmt.Sprint(local)}
	return c.launch("sortchunks.cu", "sort_chunks", defs, grid, block, s, src, probsIn, counts, int32(rows), inv, dst, probsOut)
}

func (c *CUDA) SwiGLU(act, h1, prob Ptr, n, ffn int, s Stream) error {
	if n == 0 {
		return nil
	}
	grid := min((n*ffn+255)/256, 16*c.SMs)
	return c.launch("swiglu.cu", "swiglu_prob", map[string]string{"MB_FFN": fmt.Sprint(ffn)}, grid, 256, s, h1, prob, int32(n), act)
}

func (c *CUDA) UnpermuteSum(out, src, pos, shared Ptr, tokens, topk, hidden int, s Stream) error {
	if tokens == 0 {
		return nil
	}
	grid, _ := c.rowGrid(tokens, hidden)
	block := min(256, (hidden+31)/32*32)
	defs := map[string]string{"MB_HIDDEN": fmt.Sprint(hidden), "MB_TOPK": fmt.Sprint(topk)}
	return c.launch("unpermute.cu", "unpermute_sum", defs, grid, block, s, src, pos, shared, int32(tokens), out)
}

// Close frees what the device still holds and releases the context.
func (c *CUDA) Close() error {
	var first error
	keep := func(err error) {
		if first == nil && err != nil {
			first = err
		}
	}
	keep(c.Drv.Synchronize())
	for _, g := range c.plans {
		c.Lt.Free(g)
	}
	for p := range c.allocs {
		keep(c.Drv.Free(p))
	}
	for _, e := range c.events {
		keep(c.Drv.DestroyEvent(e))
	}
	for _, s := range c.streams {
		keep(c.Drv.DestroyStream(s))
	}
	for _, m := range c.mods {
		keep(c.Drv.UnloadModule(m))
	}
	keep(c.Drv.ReleasePrimaryContext(c.Ordinal))
	*c = CUDA{Drv: c.Drv, Ordinal: c.Ordinal}
	return first
}

var _ Device = (*CUDA)(nil)
