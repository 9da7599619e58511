package device

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"unsafe"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
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
	Blas    *cuda.CuBLAS // cublasGemmGroupedBatchedEx, or nil (BlasErr says why)
	BlasErr error
	// BatchErr is why the driver refused a batch copy, after which
	// CopyBatch copies one by one (BatchMethod says so); nil otherwise
	BatchErr error
	Ordinal  int
	Ctx      cuda.Context // the GPU's primary context
	Arch     string       // sm_XY
	SMs      int
	// the SM's shared memory for blocks, the most a block may opt in to,
	// and the driver's reserve per block (holdSM)
	SMShared, optinShared, ReservedShared int
	cc                                    int          // compute capability ×10
	Peers                                 map[int]bool // GPUs (ordinals) whose memory this one reaches

	fns   map[kernelKey]cuda.Function
	progs map[string]cuda.Function // Programs' kernels (resident.go), by Program.key
	held  map[heldKey]int          // a resident launch's dynamic shared memory (holdSM)
	mods  map[string]cuda.Module   // by file and constants
	Plans map[gemmKey]*cuda.GEMM
	// TuneGEMMs lets a GEMM of a shape not seen before time each of the
	// heuristic's algorithms once and keep the fastest (it waits for the
	// stream: never set it while a timed step or a capture is issued);
	// Tuned and Untuned count the shapes that were and were not timed.
	TuneGEMMs bool
	// Tuned counts the shapes timed, Untuned those not, and Matched those of
	// them that took a timed shape's choice
	Tuned, Untuned, Matched int
	tuned                   map[gemmKey]bool
	tune                    [2]cuda.Event
	ws                      map[Stream]Addr // cuBLASLt workspace of each stream
	fp8pad                  map[Stream]*fp8Pad
	streams                 []Stream
	events                  []Event
	Allocs                  map[Addr]bool

	batchD, batchS []Addr // CopyBatch's scratch
	batchN         []int64
	pairs          [][2]*CUDA     // CopyBatch's (source, destination) GPUs
	opPair         []int          // index in pairs of each copy (−1: no bytes)
	PtrSlots       []ptrSlot      // GroupedGEMM's device pointer arrays (ptrslots.go)
	PtrIndex       map[string]int // the slot holding each content
	ptrNext        int            // the next slot to fill
	groupPtrs      []uint64       // scratch
	groupMs        []int
}

// kernelKey names a compiled kernel: its source file, its name and the
// values of its constants (which ones depends on the file). Launches look
// kernels up by it without building the -D map; the map is built on a miss.
type kernelKey struct {
	file, name string
	c          [5]int
	scale      float64
}

type gemmKey struct {
	Op    cuda.MatMul
	align cuda.Align
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
	return openGPU(drv, ordinal, cacheDir)
}

// ProbeCUDA opens GPU 0 as a run would — the driver, NVRTC, cuBLASLt and
// its handle — and closes it: nil when the cuda device can run here, else
// why not (e.g. a cuBLASLt newer than the driver).
func ProbeCUDA() error {
	errc := make(chan error)
	go func() { // OpenCUDA locks its OS thread: a goroutine of its own
		c, err := OpenCUDA(0, "")
		if err == nil {
			err = c.Close()
		}
		errc <- err
	}()
	return <-errc
}

// OpenGPUs opens GPUs 0 to n−1 (n = 0: every GPU the driver reports, at
// most most) on one driver, as OpenCUDA does each, and enables peer access
// between every pair whose hardware has it (see Reaches). The devices are
// used from one goroutine; each call makes its GPU's context current.
func OpenGPUs(n, most int, cacheDir string) ([]*CUDA, error) {
	return OpenGPUsFrom(0, n, most, cacheDir)
}

// OpenGPUsFrom is OpenGPUs from GPU ordinal first on (a process of a run
// over several that shares its node with others: its own GPUs).
func OpenGPUsFrom(first, n, most int, cacheDir string) ([]*CUDA, error) {
	drv, err := cuda.OpenDriver()
	if err != nil {
		return nil, err
	}
	count, _ := drv.DeviceCount()
	if n == 0 {
		n = min(count, most)
	}
	if n < 1 || first+n > count {
		if first > 0 {
			return nil, fmt.Errorf("GPUs %d…%d wanted (this process's ranks on its node): the driver reports %d", first, first+n-1, count)
		}
		return nil, fmt.Errorf("%d GPUs wanted: the driver reports %d", n, count)
	}
	var gs []*CUDA
	fail := func(err error) ([]*CUDA, error) {
		for _, g := range gs {
			g.Close()
		}
		return nil, err
	}
	for i := range n {
		g, err := openGPU(drv, first+i, cacheDir)
		if err != nil {
			return fail(err)
		}
		gs = append(gs, g)
	}
	if err := EnablePeers(gs); err != nil {
		return fail(err)
	}
	return gs, nil
}

// EnablePeers enables peer access from each of gs to each other where the
// hardware has it (an access already enabled is kept).
func EnablePeers(gs []*CUDA) error {
	for _, a := range gs {
		for _, b := range gs {
			if a == b {
				continue
			}
			ok, err := a.Drv.CanAccessPeer(a.Ordinal, b.Ordinal)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			if err := a.MakeCurrent(); err != nil {
				return err
			}
			var ce *cuda.Error
			if err := a.Drv.EnablePeerAccess(b.Ctx); err != nil && !(errors.As(err, &ce) && ce.Name == "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED") {
				return fmt.Errorf("peer access from GPU %d to GPU %d: %w", a.Ordinal, b.Ordinal, err)
			}
			a.Peers[b.Ordinal] = true
		}
	}
	return nil
}

// openGPU opens GPU ordinal on drv (see OpenCUDA).
func openGPU(drv *cuda.Driver, ordinal int, cacheDir string) (*CUDA, error) {
	n, _ := drv.DeviceCount()
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("GPU %d: the driver reports %d GPUs", ordinal, n)
	}
	ctx, err := drv.PrimaryContext(ordinal)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok { // give the context back when a library is missing
			drv.ReleasePrimaryContext(ordinal)
		}
	}()
	c := &CUDA{Drv: drv, Ordinal: ordinal, Ctx: ctx, fns: map[kernelKey]cuda.Function{}, progs: map[string]cuda.Function{}, held: map[heldKey]int{}, mods: map[string]cuda.Module{}, Plans: map[gemmKey]*cuda.GEMM{},
		ws: map[Stream]Addr{}, Allocs: map[Addr]bool{}, Peers: map[int]bool{}}
	major, err := drv.Attribute(ordinal, cuda.AttrComputeCapabilityMajor)
	if err != nil {
		return nil, err
	}
	minor, err := drv.Attribute(ordinal, cuda.AttrComputeCapabilityMinor)
	if err != nil {
		return nil, err
	}
	if c.cc = 10*major + minor; c.cc < minCC {
		return nil, fmt.Errorf("GPU %d has compute capability %d.%d: moebench's kernels need %d.%d or later (bf16 conversions, redux.sync)",
			ordinal, major, minor, minCC/10, minCC%10)
	}
	if c.SMs, err = drv.Attribute(ordinal, cuda.AttrMultiprocessorCount); err != nil {
		return nil, err
	}
	for _, a := range []struct {
		v    *int
		attr int
	}{{&c.SMShared, cuda.AttrMaxSharedPerSM}, {&c.optinShared, cuda.AttrMaxSharedPerBlockOptin}, {&c.ReservedShared, cuda.AttrReservedSharedPerBlock}} {
		if *a.v, err = drv.Attribute(ordinal, a.attr); err != nil {
			return nil, err
		}
	}
	comp, err := NewCompiler()
	if err != nil {
		return nil, err
	}
	var archs []int
	if l, ok := comp.(interface{ SupportedArchs() ([]int, error) }); ok {
		if archs, err = l.SupportedArchs(); err != nil {
			archs = nil // an NVRTC before 11.2: compile for the GPU's own and see
		}
	}
	if c.Arch, err = ChooseArch(10*major+minor, archs); err != nil {
		return nil, fmt.Errorf("GPU %d: %w", ordinal, err)
	}
	if cacheDir == "" {
		cacheDir = os.Getenv("MOEBENCH_CACHE")
	}
	if cacheDir == "" {
		if d, err := os.UserCacheDir(); err == nil {
			cacheDir = filepath.Join(d, "moebench", "kernels")
		}
	}
	c.JIT = &JIT{Compiler: comp, CacheDir: cacheDir}
	if c.Lt, err = cuda.OpenCuBLASLt(); err != nil {
		return nil, err
	}
	if err := c.Lt.Init(); err != nil {
		return nil, err
	}
	if c.Blas, c.BlasErr = cuda.OpenCuBLAS(); c.BlasErr == nil {
		if c.BlasErr = c.Blas.Init(); c.BlasErr != nil {
			c.Blas = nil
		}
	}
	c.PtrIndex, c.tuned = map[string]int{}, map[gemmKey]bool{}
	ok = true
	return c, nil
}

// minCC is the oldest compute capability (×10) moebench's kernels run on:
// their bf16 conversions and redux.sync need sm_80.
const minCC = 80

// ChooseArch is what the kernels are compiled for on a GPU of compute
// capability cc (×10) by a compiler that supports archs (nil: unknown):
// the GPU's own (sm_XY, a cubin) where the compiler has it, else PTX of
// the newest architecture it has below the GPU's (compute_XY), which the
// driver compiles for the GPU when the module is loaded (an NVRTC before
// 12.8 has no Blackwell, sm_100 or sm_120).
func ChooseArch(cc int, archs []int) (string, error) {
	if archs == nil || slices.Contains(archs, cc) {
		return fmt.Sprintf("sm_%d", cc), nil
	}
	best := 0
	for _, a := range archs {
		if a <= cc && a >= minCC {
			best = max(best, a)
		}
	}
	if best == 0 {
		return "", fmt.Errorf("the compiler supports architectures %v, none of them from %d to the GPU's %d", archs, minCC, cc)
	}
	return fmt.Sprintf("compute_%d", best), nil
}

func (c *CUDA) Name() string { return "cuda" }

// CC is the GPU's compute capability ×10 (90: sm_90).
func (c *CUDA) CC() int { return c.cc }

// MakeCurrent makes c's context current (a no-op when it is; see
// cuda.Driver.SetCurrent). Every call that queues work or makes an object
// calls it first, so that devices opened together can be used in turn.
func (c *CUDA) MakeCurrent() error {
	if c.Ctx == nil {
		return nil
	}
	return c.Drv.SetCurrent(c.Ctx)
}

// Reaches: c and peer are one GPU, or peer access from c to peer is enabled.
func (c *CUDA) Reaches(peer Device) bool {
	g, ok := peer.(*CUDA)
	return ok && (g.Ctx == c.Ctx || c.Peers[g.Ordinal])
}

// launch runs kernel k on a 1-D grid, compiling and loading it the first
// time (its constants come from k: see defines). Nothing is allocated or
// formatted unless it fails: it runs for every kernel of every step.
func (c *CUDA) launch(k kernelKey, grid, block int, s Stream, args ...cuda.Arg) error {
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	f, ok := c.fns[k]
	if !ok {
		var err error
		if f, err = c.load(k.file, k.name, k.defines()); err != nil {
			return err
		}
		c.fns[k] = f
	}
	if err := c.Drv.LaunchArgs(f, [3]uint32{uint32(grid), 1, 1}, [3]uint32{uint32(block), 1, 1}, 0, s, args...); err != nil {
		return fmt.Errorf("%s (grid %d, block %d): %w", k.name, grid, block, err)
	}
	return nil
}

// defines are k's -D constants: the values of k.c in the order
// CUDAKernels lists its file's constants (router.cu's: routerDefines).
func (k kernelKey) defines() map[string]string {
	if k.file == "router.cu" {
		return k.routerDefines()
	}
	m := map[string]string{}
	for i, n := range CUDAKernels[k.file] {
		if n == "MB_SCALE" {
			m[n] = fmt.Sprintf("%#gf", k.scale)
		} else {
			m[n] = fmt.Sprint(k.c[i])
		}
	}
	return m
}

// load returns kernel name of file compiled with defs, compiling and
// loading the module (one per file and constants) on first use.
func (c *CUDA) load(file, name string, defs map[string]string) (cuda.Function, error) {
	return c.loadSource(file, "", name, defs)
}

// loadSource is load for file's source src ("": kernels/cuda's file).
func (c *CUDA) loadSource(file, src, name string, defs map[string]string) (cuda.Function, error) {
	keys := make([]string, 0, len(defs))
	for k, v := range defs {
		keys = append(keys, k+"="+v)
	}
	sort.Strings(keys)
	mkey := file + "|" + strings.Join(keys, ",")
	m, ok := c.mods[mkey]
	if !ok {
		var cubin []byte
		var err error
		if src == "" {
			cubin, err = c.JIT.Compile(file, c.Arch, defs)
		} else {
			cubin, err = c.JIT.CompileSource(file, src, c.Arch, defs)
		}
		if err != nil {
			return nil, err
		}
		if m, err = c.Drv.LoadModule(cubin); err != nil {
			return nil, err
		}
		c.mods[mkey] = m
	}
	return c.Drv.Function(m, name)
}

// Launch block sizes (threads). TestKernelsCompile checks, with the CUDA
// toolkit's cuobjdump, that each kernel's registers fit the largest block it
// is launched with.
const (
	RouterWarps = 4   // router_topk: one token per warp
	OrderBlock  = 512 // permute_order
	FlatBlock   = 256 // gather_f32, swiglu_prob, copy_u4
	RowBlockMax = 256 // permute_rows, sort_chunks, unpermute_sum (rowGrid)
)

// rowGrid is the grid of a kernel with one block per row (grid-stride), and
// the block size for rows of hidden bf16 copied in 16-byte vectors.
func (c *CUDA) rowGrid(rows, hidden int) (grid, block int) {
	grid = min(rows, 32*c.SMs)
	block = min(RowBlockMax, (hidden/8+31)/32*32)
	return max(grid, 1), max(block, 32)
}

func (c *CUDA) Alloc(bytes int64) (Addr, error) {
	if err := c.MakeCurrent(); err != nil {
		return 0, err
	}
	p, err := c.Drv.Alloc(max(bytes, 1))
	if err == nil {
		c.Allocs[p] = true
	}
	return p, err
}

func (c *CUDA) Free(p Addr) error {
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	delete(c.Allocs, p)
	return c.Drv.Free(p)
}

func (c *CUDA) Upload(dst Addr, src any, s Stream) error {
	h, err := HostBytes(src)
	if err != nil {
		return err
	}
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	return cuda.CopyToDevice(c.Drv, dst, h, s)
}

func (c *CUDA) Download(dst any, src Addr, s Stream) error {
	h, err := HostBytes(dst)
	if err != nil {
		return err
	}
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	if err := cuda.CopyFromDevice(c.Drv, h, src, s); err != nil {
		return err
	}
	return c.Drv.SyncStream(s)
}

// CopySM: copy.cu's copy_u4, 16 blocks per SM.
func (c *CUDA) CopySM(dst, src Addr, bytes int64, s Stream) error {
	if bytes == 0 {
		return nil
	}
	if bytes%16 != 0 || dst%16 != 0 || src%16 != 0 {
		return fmt.Errorf("SM copy of %d bytes from %#x to %#x: bytes and addresses must be multiples of 16", bytes, uint64(src), uint64(dst))
	}
	n := bytes / 16
	grid := int(min((n+FlatBlock-1)/FlatBlock, int64(16*c.SMs)))
	return c.launch(kernelKey{file: "copy.cu", name: "copy_u4"}, grid, FlatBlock, s, cuda.P(src), cuda.I64(n), cuda.P(dst))
}

// copyRows32: copy.cu's copy_rows_u32, rows of width 32-bit words from
// src (rows spitch words apart) to dst (dpitch apart), in one launch.
func (c *CUDA) copyRows32(dst Addr, dpitch int, src Addr, spitch, width, rows int, s Stream) error {
	n := int64(width) * int64(rows)
	if width < 0 || rows < 0 || spitch < width || dpitch < width || n > 1<<30 || spitch > math.MaxInt32 || dpitch > math.MaxInt32 {
		return fmt.Errorf("2-D copy of %d rows of %d words (pitches %d and %d): rows·width must be at most 2³⁰, each pitch at least the width and below 2³¹", rows, width, spitch, dpitch)
	}
	if n == 0 {
		return nil
	}
	grid := int(min((n+FlatBlock-1)/FlatBlock, int64(16*c.SMs)))
	return c.launch(kernelKey{file: "copy.cu", name: "copy_rows_u32"}, grid, FlatBlock, s,
		cuda.P(src), cuda.I32(int32(spitch)), cuda.P(dst), cuda.I32(int32(dpitch)), cuda.I32(int32(width)), cuda.I32(int32(n)))
}

// DownloadAsync: cuMemcpyDtoHAsync into page-locked memory, which does
// not wait for the stream (into pageable memory it would).
func (c *CUDA) DownloadAsync(dst MappedHost, src Addr, bytes int64, s Stream) error {
	if bytes > dst.Bytes {
		return fmt.Errorf("download of %d bytes into %d bytes of mapped memory", bytes, dst.Bytes)
	}
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	return cuda.CopyFromDevice(c.Drv, unsafe.Slice((*byte)(dst.Host), bytes), src, s)
}

func (c *CUDA) Copy(dst, src Addr, bytes int64, s Stream) error {
	if bytes == 0 {
		return nil
	}
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	return c.Drv.CopyDevice(dst, src, bytes, s)
}

// CopyPeer copies within a GPU with cuMemcpyDtoDAsync, between GPUs with
// cuMemcpyPeerAsync (which goes through host memory where the GPUs have no
// peer access).
func (c *CUDA) CopyPeer(op CopyOp, s Stream) error {
	dst, src, err := c.ends(op)
	if err != nil || op.Bytes == 0 {
		return err
	}
	if dst.Ctx == src.Ctx {
		return c.Copy(op.Dst, op.Src, op.Bytes, s)
	}
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	return c.Drv.CopyPeer(op.Dst, dst.Ctx, op.Src, src.Ctx, op.Bytes, s)
}

// ends are the GPUs of op's destination and source.
func (c *CUDA) ends(op CopyOp) (dst, src *CUDA, err error) {
	gpu := func(d Device) (*CUDA, error) {
		if d == nil {
			return c, nil
		}
		if g, ok := d.(*CUDA); ok {
			return g, nil
		}
		return nil, fmt.Errorf("a copy between the cuda device and %s", d.Name())
	}
	if dst, err = gpu(op.DstDev); err != nil {
		return nil, nil, err
	}
	src, err = gpu(op.SrcDev)
	return dst, src, err
}

// CopyBatch submits ops as one cuMemcpyBatchAsync with the
// prefer-overlap-with-compute hint when the driver has it, else copies them
// one by one. A batch the driver refuses as invalid or unsupported is
// copied one by one, and so is every batch after it (BatchErr, BatchMethod
// say why; the GPU test fails on it). Unproven on a GPU: which engine runs
// the copies is measured by the feplb run (see harness), not assumed.
func (c *CUDA) CopyBatch(ops []CopyOp, s Stream) error {
	if c.Drv.BatchCopy() != "" && c.BatchErr == nil {
		err := c.batch(ops, s)
		var ce *cuda.Error
		if err == nil || !errors.As(err, &ce) || (ce.Name != "CUDA_ERROR_INVALID_VALUE" && ce.Name != "CUDA_ERROR_NOT_SUPPORTED") {
			return err
		}
		c.BatchErr = err
	}
	for _, o := range ops {
		if err := c.CopyPeer(o, s); err != nil {
			return err
		}
	}
	return nil
}

// batch submits ops as one cuMemcpyBatchAsync per (source, destination)
// pair of GPUs, each with its location hints.
func (c *CUDA) batch(ops []CopyOp, s Stream) error {
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	c.pairs, c.opPair = c.pairs[:0], c.opPair[:0]
	for _, o := range ops {
		dst, src, err := c.ends(o)
		if err != nil {
			return err
		}
		i := -1
		if o.Bytes > 0 {
			if i = slices.Index(c.pairs, [2]*CUDA{src, dst}); i < 0 {
				i, c.pairs = len(c.pairs), append(c.pairs, [2]*CUDA{src, dst})
			}
		}
		c.opPair = append(c.opPair, i)
	}
	for i, p := range c.pairs {
		c.batchD, c.batchS, c.batchN = c.batchD[:0], c.batchS[:0], c.batchN[:0]
		for j, o := range ops {
			if c.opPair[j] == i {
				c.batchD, c.batchS, c.batchN = append(c.batchD, o.Dst), append(c.batchS, o.Src), append(c.batchN, o.Bytes)
			}
		}
		if err := c.Drv.CopyBatch(c.batchD, c.batchS, c.batchN, p[0].Ordinal, p[1].Ordinal, true, s); err != nil {
			return err
		}
	}
	return nil
}

func (c *CUDA) BatchMethod() string {
	n := c.Drv.BatchCopy()
	switch {
	case n == "":
		return "one copy each, cuMemcpyDtoDAsync or between GPUs cuMemcpyPeerAsync (the driver has no cuMemcpyBatchAsync)"
	case c.BatchErr != nil:
		return "one copy each, cuMemcpyDtoDAsync or between GPUs cuMemcpyPeerAsync (the driver refused the batch copy: " + c.BatchErr.Error() + ")"
	}
	return n + " per pair of GPUs, with CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE (a hint)"
}

// GroupedGEMM runs the groups as one cublasGemmGroupedBatchedEx call. Its
// device array of operand addresses is kept in one of a fixed set of slots,
// uploaded asynchronously from page-locked memory when the groups change
// (ptrslots.go): no allocation and no wait in a step.
func (c *CUDA) GroupedGEMM(groups []Group, n, k int, s Stream) error {
	if c.Blas == nil {
		return fmt.Errorf("grouped GEMM: %v", c.BlasErr)
	}
	if len(groups) == 0 {
		return nil
	}
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	g := len(groups)
	c.groupPtrs, c.groupMs = kernels.Reslice(c.groupPtrs, 3*g), kernels.Reslice(c.groupMs, g)
	for i, gr := range groups {
		c.groupPtrs[i], c.groupPtrs[g+i], c.groupPtrs[2*g+i], c.groupMs[i] = uint64(gr.W), uint64(gr.A), uint64(gr.C), gr.M
	}
	p, slot, err := c.ptrArray(c.groupPtrs[:3*g], s)
	if err != nil {
		return err
	}
	ws, err := c.workspace(s)
	if err != nil {
		return err
	}
	if err := c.Blas.GroupedGEMM(c.groupMs[:g], n, k, p, ws, GEMMWorkspace, s); err != nil {
		return err
	}
	return c.ptrDone(slot, s)

}

func (c *CUDA) GroupedGEMMName() (string, bool) {
	if c.Blas == nil {
		return fmt.Sprint(c.BlasErr), false
	}
	return fmt.Sprintf("one cublasGemmGroupedBatchedEx call (cuBLAS %d)", c.Blas.Version), true
}

func (c *CUDA) Fill16(p Addr, v uint16, n int64, s Stream) error {
	if n == 0 {
		return nil
	}
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	return c.Drv.Fill16(p, v, n, s)
}

func (c *CUDA) NewStream() (Stream, error) {
	if err := c.MakeCurrent(); err != nil {
		return nil, err
	}
	s, err := c.Drv.NewStream(0)
	if err == nil {
		c.streams = append(c.streams, s)
	}
	return s, err
}

func (c *CUDA) NewEvent() (Event, error) {
	if err := c.MakeCurrent(); err != nil {
		return nil, err
	}
	e, err := c.Drv.NewEvent()
	if err == nil {
		c.events = append(c.events, e)
	}
	return e, err
}

func (c *CUDA) Record(e Event, s Stream) error {
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	return c.Drv.Record(e, s)
}

// Wait: e may be another GPU's event.
func (c *CUDA) Wait(s Stream, e Event) error {
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	return c.Drv.WaitEvent(s, e)
}

func (c *CUDA) SyncStream(s Stream) error { return c.Drv.SyncStream(s) }
func (c *CUDA) Elapsed(a, b Event) (float64, error) {
	ms, err := c.Drv.Elapsed(a, b)
	return float64(ms), err
}

func (c *CUDA) GEMM(out, a, w Addr, m, n, k int, f32Out bool, s Stream) error {
	return c.MatMul(MatMul{C: out, A: a, B: w, MatMul: cuda.MatMul{M: m, N: n, K: k, TransB: true, F32Out: f32Out}}, s)
}

// MatMul runs mm through cuBLASLt, planned once per shape, transposes,
// types and alignments (see tuneGEMM for the algorithm).
func (c *CUDA) MatMul(mm MatMul, s Stream) error {
	if err := mm.check(); err != nil || mm.M == 0 {
		return err
	}
	if mm.FP8 == cuda.FP8Block && mm.M%cuda.BlockScalingRows != 0 {
		return c.padFP8Rows(mm, s)
	}
	if err := c.MakeCurrent(); err != nil {
		return err
	}
	key := gemmKey{mm.MatMul, cuda.Align{A: cuda.AlignOf(mm.A), W: cuda.AlignOf(mm.B), C: cuda.AlignOf(mm.C)}}
	g, ok := c.Plans[key]
	ws, err := c.workspace(s)
	if err != nil {
		return err
	}
	if !ok {
		if g, err = c.Lt.PlanScaled(mm.MatMul, key.align, GEMMWorkspace, mm.AScale, mm.BScale); err != nil {
			return err
		}
		c.Plans[key] = g
		if err := c.tuneGEMM(key, g, mm, ws, s); err != nil {
			return err
		}
	}
	return c.ltRun(g, mm.C, mm, ws, s)
}

// fp8Pad is a stream's scratch for padFP8Rows: a's rows, a's multipliers
// and c's rows, for up to rows rows of k and n.
type fp8Pad struct {
	a, scale, c Addr
	aBytes      int64
	sBytes      int64
	cBytes      int64
}

// padFP8Rows runs a block-scaled FP8 mm whose m is not a multiple of
// cuda.BlockScalingRows (cuBLASLt refuses it: see cuda.Plan) as one of m
// rounded up, on s's scratch: a's m rows and its multipliers (VEC128's
// m-contiguous blocks, re-strided to the padded m by one 2-D copy) are
// copied in, the product of the padded m runs into scratch, and its first
// m rows are copied to mm.C. An output row depends only on its own row of a and its
// own multipliers, so the padding rows (never cleared) touch none of the
// rows kept.
func (c *CUDA) padFP8Rows(mm MatMul, s Stream) error {
	m := mm.M
	m4 := (m + cuda.BlockScalingRows - 1) / cuda.BlockScalingRows * cuda.BlockScalingRows
	kb := (mm.K + kernels.FP8Block - 1) / kernels.FP8Block
	out := int64(2)
	if mm.F32Out {
		out = 4
	}
	need := fp8Pad{aBytes: int64(m4) * int64(mm.K), sBytes: 4 * int64(m4) * int64(kb), cBytes: out * int64(m4) * int64(mm.N)}
	if c.fp8pad == nil {
		c.fp8pad = map[Stream]*fp8Pad{}
	}
	p := c.fp8pad[s]
	if p == nil {
		p = &fp8Pad{}
		c.fp8pad[s] = p
	}
	// a buffer too small is replaced by one of at least twice its size, so
	// that m growing a few rows at a time (an expert's, from step to step)
	// allocates O(log m) times; the smaller one stays allocated (Close
	// frees it: freeing would wait for the work queued on it), under the
	// size of the largest
	for _, b := range []struct {
		dst  *Addr
		have *int64
		need int64
	}{{&p.a, &p.aBytes, need.aBytes}, {&p.scale, &p.sBytes, need.sBytes}, {&p.c, &p.cBytes, need.cBytes}} {
		if *b.have >= b.need {
			continue
		}
		bytes := max(b.need, 2**b.have)
		a, err := c.Alloc(bytes)
		if err != nil && bytes > b.need { // memory nearly full: the exact size may still fit
			bytes = b.need
			a, err = c.Alloc(bytes)
		}
		if err != nil {
			return err
		}
		*b.dst, *b.have = a, bytes
	}
	if err := c.Copy(p.a, mm.A, int64(m)*int64(mm.K), s); err != nil {
		return err
	}
	if err := c.copyRows32(p.scale, m4, mm.AScale, m, m, kb, s); err != nil {
		return err
	}
	pad := mm
	pad.M, pad.A, pad.AScale, pad.C = m4, p.a, p.scale, p.c
	if err := c.MatMul(pad, s); err != nil {
		return err
	}
	return c.Copy(mm.C, p.c, out*int64(m)*int64(mm.N), s)
}

// tuneGEMM times each of g's algorithms once on the call's own operands
// (each run writes its output, an accumulating product a scratch buffer
// instead of the main_grad it adds to; the chosen one runs after) and
// keeps the fastest, when TuneGEMMs allows; else g takes the fastest
// algorithm of the timed shape of the same n, k and operation nearest in
// m, where the heuristic offers it for g too, else the heuristic's first.
func (c *CUDA) tuneGEMM(key gemmKey, g *cuda.GEMM, mm MatMul, ws Addr, s Stream) error {
	if g.Algorithms() < 2 {
		return nil
	}
	if !c.TuneGEMMs {
		c.Untuned++
		var near *cuda.GEMM
		for k, t := range c.Plans {
			same := k.Op
			same.M = key.Op.M
			if c.tuned[k] && same == key.Op && k.align == key.align && (near == nil || abs(k.Op.M-key.Op.M) < abs(near.M-key.Op.M)) {
				near = t
			}
		}
		if near != nil {
			want := near.Algorithm(near.Chosen())
			for i := range g.Algorithms() {
				if g.Algorithm(i) == want {
					g.Choose(i)
					c.Matched++
					break
				}
			}
		}
		return nil
	}
	for i := range c.tune {
		if c.tune[i] == nil {
			var err error
			if c.tune[i], err = c.NewEvent(); err != nil {
				return err
			}
		}
	}
	out := mm.C
	if mm.Add { // a scratch output of the same alignment: the timed runs must not add to main_grad
		_, _, cb := mm.bytes()
		scratch, err := c.Alloc(cb + 256)
		if err != nil {
			return err
		}
		defer c.Free(scratch) // after the timed runs: SyncEvent below waited for them
		out = scratch + Addr(uint64(mm.C)%256)
	}
	best, bestMS := 0, math.Inf(1)
	for i := range g.Algorithms() {
		g.Choose(i)
		if err := c.Drv.Record(c.tune[0], s); err != nil {
			return err
		}
		if err := c.ltRun(g, out, mm, ws, s); err != nil {
			continue // an algorithm that refuses these operands is not a candidate
		}
		if err := c.Drv.Record(c.tune[1], s); err != nil {
			return err
		}
		if err := c.Drv.SyncEvent(c.tune[1]); err != nil {
			return err
		}
		ms, err := c.Drv.Elapsed(c.tune[0], c.tune[1])
		if err != nil {
			return err
		}
		if float64(ms) < bestMS {
			best, bestMS = i, float64(ms)
		}
	}
	g.Choose(best)
	c.Tuned++
	c.tuned[key] = true
	return nil
}

func abs(x int) int { return max(x, -x) }

// GEMMAlgorithms says how the GEMMs' algorithms were chosen, for records.
func (c *CUDA) GEMMAlgorithms() string {
	return fmt.Sprintf("cuBLASLt algorithm per shape: of the heuristic's (up to %d), each timed once and the fastest kept for %d shapes; "+
		"of %d shapes first seen while a timed step was issued, %d took the fastest of the nearest timed shape (same n and k), the others the heuristic's first",
		cuda.MaxAlgorithms, c.Tuned, c.Untuned, c.Matched)
}

// workspace is s's GEMM workspace (GEMMWorkspace bytes), allocated on first
// use: cuBLASLt and cuBLAS calls on s share it, calls on other streams never.
func (c *CUDA) workspace(s Stream) (Addr, error) {
	ws, ok := c.ws[s]
	if !ok {
		var err error
		if ws, err = c.Alloc(GEMMWorkspace); err != nil {
			return 0, err
		}
		c.ws[s] = ws
	}
	return ws, nil
}

// routerKey is router.cu's kernel for rc: experts, top-k, the score (0
// softmax, 1 sigmoid, 2 pre-softmax), groups and group top-k (0 when off),
// and the scale.
func routerKey(rc kernels.RouterConfig) kernelKey {
	k := kernelKey{file: "router.cu", name: "router_topk", c: [5]int{rc.Experts, rc.TopK}, scale: rc.Scale}
	switch {
	case rc.Score == kernels.ScoreSigmoid:
		k.c[2] = 1
	case rc.UsesPreSoftmax():
		k.c[2] = 2
	}
	if rc.Groups > 1 {
		k.c[3], k.c[4] = rc.Groups, rc.GroupTopK
	}
	if k.scale == 0 {
		k.scale = 1
	}
	return k
}

// RouterDefs are router.cu's constants for rc.
func RouterDefs(rc kernels.RouterConfig) map[string]string { return routerKey(rc).routerDefines() }

// routerDefines are router.cu's constants for its key (see routerKey).
func (k kernelKey) routerDefines() map[string]string {
	return map[string]string{"MB_EXPERTS": fmt.Sprint(k.c[0]), "MB_TOPK": fmt.Sprint(k.c[1]),
		"MB_SIGMOID": b2i(k.c[2] == 1), "MB_PRE_SOFTMAX": b2i(k.c[2] == 2),
		"MB_GROUPS": fmt.Sprint(k.c[3]), "MB_GROUP_TOPK": fmt.Sprint(k.c[4]), "MB_SCALE": fmt.Sprintf("%#gf", k.scale)}
}

func b2i(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func (c *CUDA) RouterTopK(rc kernels.RouterConfig, logits, bias Addr, tokens int, idx, probs Addr, s Stream) error {
	if tokens == 0 {
		return nil
	}
	return c.launch(routerKey(rc), (tokens+RouterWarps-1)/RouterWarps, 32*RouterWarps, s,
		cuda.P(logits), cuda.P(bias), cuda.I32(int32(tokens)), cuda.P(idx), cuda.P(probs))
}

func (c *CUDA) PermuteOrder(idx Addr, n, experts int, rows, pos, counts Addr, s Stream) error {
	return c.launch(kernelKey{file: "permute.cu", name: "permute_order", c: [5]int{8}}, experts, OrderBlock, s,
		cuda.P(idx), cuda.I32(int32(n)), cuda.P(rows), cuda.P(pos), cuda.P(counts))
}

func (c *CUDA) GatherRows(dst, src, rows Addr, div, n, hidden int, s Stream) error {
	if n == 0 {
		return nil
	}
	grid, block := c.rowGrid(n, hidden)
	return c.launch(kernelKey{file: "permute.cu", name: "permute_rows", c: [5]int{hidden}}, grid, block, s,
		cuda.P(src), cuda.P(rows), cuda.I32(int32(div)), cuda.I32(int32(n)), cuda.P(dst))
}

func (c *CUDA) GatherF32(dst, src, rows Addr, div, n int, s Stream) error {
	if n == 0 {
		return nil
	}
	return c.launch(kernelKey{file: "permute.cu", name: "gather_f32", c: [5]int{8}}, min((n+FlatBlock-1)/FlatBlock, 8*c.SMs), FlatBlock, s,
		cuda.P(src), cuda.P(rows), cuda.I32(int32(div)), cuda.I32(int32(n)), cuda.P(dst))
}

func (c *CUDA) SortChunks(dst, probsOut, src, probsIn, counts Addr, rows, ep, local, hidden int, inverse bool, s Stream) error {
	if rows == 0 {
		return nil
	}
	inv := int32(0)
	if inverse {
		inv = 1
	}
	grid, block := c.rowGrid(rows, hidden)
	return c.launch(kernelKey{file: "sortchunks.cu", name: "sort_chunks", c: [5]int{hidden, ep, local}},
		grid, block, s, cuda.P(src), cuda.P(probsIn), cuda.P(counts), cuda.I32(int32(rows)), cuda.I32(inv), cuda.P(dst), cuda.P(probsOut))
}

func (c *CUDA) SwiGLU(act, h1, prob Addr, n, ffn int, s Stream) error {
	if n == 0 {
		return nil
	}
	items := n * ffn // threads' work items: 8 columns each when ffn allows 16-byte vectors (swiglu.cu)
	if ffn%8 == 0 {
		items /= 8
	}
	grid := min((items+FlatBlock-1)/FlatBlock, 16*c.SMs)
	return c.launch(kernelKey{file: "swiglu.cu", name: "swiglu_prob", c: [5]int{ffn}}, grid, FlatBlock, s, cuda.P(h1), cuda.P(prob), cuda.I32(int32(n)), cuda.P(act))
}

func (c *CUDA) UnpermuteSum(out, src, pos, shared Addr, tokens, topk, hidden int, s Stream) error {
	if tokens == 0 {
		return nil
	}
	grid, block := c.rowGrid(tokens, hidden)
	return c.launch(kernelKey{file: "unpermute.cu", name: "unpermute_sum", c: [5]int{hidden, topk}},
		grid, block, s, cuda.P(src), cuda.P(pos), cuda.P(shared), cuda.I32(int32(tokens)), cuda.P(out))
}

// Close frees what the device still holds and releases the context.
func (c *CUDA) Close() error {
	var first error
	keep := func(err error) {
		if first == nil && err != nil {
			first = err
		}
	}
	keep(c.MakeCurrent())
	keep(c.Drv.Synchronize())
	c.freePtrSlots() // their device memory is among allocs
	for _, g := range c.Plans {
		c.Lt.Free(g)
	}
	if c.Blas != nil {
		keep(c.Blas.Close())
	}
	for p := range c.Allocs {
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
	*c = CUDA{Drv: c.Drv, Ordinal: c.Ordinal, Ctx: c.Ctx}
	return first
}

var _ Device = (*CUDA)(nil)
