package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/abi
#include <stdlib.h>
#include <string.h>
#include "abi.h"

// ep_arg is a tensor as moebench passes it: device address, ncclDataType_t
// and up to three dimensions (ndim 0: absent).
typedef struct { unsigned long long data; int dtype, ndim; size_t dims[3]; } ep_arg;

// ep_tensor fills t from a (its sizes point into a) and returns it, or 0
// for an absent tensor.
static mb_ep_tensor *ep_tensor(mb_ep_tensor *t, ep_arg *a) {
	if (!a || a->ndim == 0) return 0;
	memset(t, 0, sizeof *t);
	t->size = MB_NCCL_EP_TENSOR_V1_SIZE;
	t->magic = MB_NCCL_EP_TENSOR_MAGIC;
	t->ndim = a->ndim;
	t->datatype = a->dtype;
	t->data = (void *)a->data;
	t->sizes = a->dims;
	return t;
}

static int ep_create_group(void *f, void **g, void *comm, int algo, unsigned experts, unsigned tokens, unsigned recv,
                           unsigned tokenBytes, unsigned sms, unsigned long long timeoutNS) {
	mb_ep_group_config c;
	memset(&c, 0, sizeof c);
	c.size = MB_NCCL_EP_GROUP_CONFIG_V1_SIZE;
	c.magic = MB_NCCL_EP_MAGIC;
	c.version = 1; // the feature set of the V1 fields sent, not the header's NCCL_EP_API_VERSION
	c.algorithm = algo;
	c.num_experts = experts;
	c.max_dispatch_tokens_per_rank = tokens;
	c.max_recv_tokens_per_rank = recv;
	c.max_token_bytes = tokenBytes;
	c.max_num_sms = sms;
	c.timeout_ns = timeoutNS;
	return mbcall_ncclEpCreateGroup(f, g, comm, &c);
}

static int ep_init_handle(void *f, void **h, void *g, int topk) {
	mb_ep_handle_config c;
	memset(&c, 0, sizeof c);
	c.size = MB_NCCL_EP_HANDLE_CONFIG_V1_SIZE;
	c.magic = MB_NCCL_EP_MAGIC;
	c.dispatch_output_per_expert_alignment = 1; // no padding between experts' rows
	return mbcall_ncclEpInitHandle(f, h, g, MB_NCCL_EP_LAYOUT_EXPERT_MAJOR, &c, topk, 0);
}

static mb_ep_layout_info *ep_layout(mb_ep_layout_info *li, mb_ep_tensor *counters, mb_ep_tensor *total) {
	if (!counters && !total) return 0;
	memset(li, 0, sizeof *li);
	li->size = MB_NCCL_EP_LAYOUT_INFO_V1_SIZE;
	li->magic = MB_NCCL_EP_MAGIC;
	li->expert_counters = counters;
	li->recv_total_counter = total;
	return li;
}

static int ep_update(void *f, void *h, ep_arg *idx, ep_arg *counters, ep_arg *total, void *stream) {
	mb_ep_tensor ti, tc, tt;
	mb_ep_layout_info li;
	return mbcall_ncclEpUpdateHandle(f, h, ep_tensor(&ti, idx), ep_layout(&li, ep_tensor(&tc, counters), ep_tensor(&tt, total)), stream);
}

static int ep_dispatch(void *f, void *h, ep_arg *x, ep_arg *xs, ep_arg *w, ep_arg *out, ep_arg *outS, ep_arg *outW, ep_arg *counters,
                       int bwd, int quant, void *stream) {
	mb_ep_tensor tx, txs, tw, to, tos, tow, tc;
	mb_ep_dispatch_inputs in;
	mb_ep_dispatch_outputs o;
	mb_ep_dispatch_config c;
	mb_ep_layout_info li;
	memset(&in, 0, sizeof in);
	memset(&o, 0, sizeof o);
	memset(&c, 0, sizeof c);
	in.size = MB_NCCL_EP_DISPATCH_INPUTS_V1_SIZE, in.magic = MB_NCCL_EP_MAGIC;
	in.tokens = ep_tensor(&tx, x), in.topk_weights = ep_tensor(&tw, w), in.scales = ep_tensor(&txs, xs);
	o.size = MB_NCCL_EP_DISPATCH_OUTPUTS_V1_SIZE, o.magic = MB_NCCL_EP_MAGIC;
	o.tokens = ep_tensor(&to, out), o.topk_weights = ep_tensor(&tow, outW), o.scales = ep_tensor(&tos, outS);
	c.size = MB_NCCL_EP_DISPATCH_CONFIG_V1_SIZE, c.magic = MB_NCCL_EP_MAGIC; // not staged
	c.pass_direction = bwd; // NCCL_EP_FWD_PASS 0, NCCL_EP_BWD_PASS 1
	if (quant != MB_NCCL_EP_DISP_QUANT_NONE) { // a recipe: the V2 config (quant_recipe); round_scales 0
		c.size = MB_NCCL_EP_DISPATCH_CONFIG_V2_SIZE;
		c.quant_recipe = quant;
	}
	return mbcall_ncclEpDispatch(f, h, &in, &o, ep_layout(&li, ep_tensor(&tc, counters), 0), &c, stream);
}

static int ep_combine(void *f, void *h, ep_arg *x, ep_arg *w, ep_arg *out, ep_arg *outW, int bwd, void *stream) {
	mb_ep_tensor tx, tw, to, tow;
	mb_ep_combine_inputs in;
	mb_ep_combine_outputs o;
	mb_ep_combine_config c;
	memset(&in, 0, sizeof in);
	memset(&o, 0, sizeof o);
	memset(&c, 0, sizeof c);
	in.size = MB_NCCL_EP_COMBINE_INPUTS_V1_SIZE, in.magic = MB_NCCL_EP_MAGIC;
	in.tokens = ep_tensor(&tx, x), in.topk_weights = ep_tensor(&tw, w);
	o.size = MB_NCCL_EP_COMBINE_OUTPUTS_V1_SIZE, o.magic = MB_NCCL_EP_MAGIC;
	o.tokens = ep_tensor(&to, out), o.topk_weights = ep_tensor(&tow, outW);
	c.size = MB_NCCL_EP_COMBINE_CONFIG_V1_SIZE, c.magic = MB_NCCL_EP_MAGIC;
	c.pass_direction = bwd;
	return mbcall_ncclEpCombine(f, h, &in, &o, &c, stream);
}
*/
import "C"

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
	"unsafe"
)

// NCCLEP is NCCL EP's C API (libnccl_ep.so.0, NVIDIA/nccl-extensions'
// nccl_ep), opened with dlopen over NCCL: expert-parallel dispatch and
// combine in two modes, high-throughput (HybridEP's kernels) and low
// latency (DeepEP's low-latency design). Its structs are versioned (a size
// and a magic number first, append-only): the library answers only its
// release (ncclEpGetVersion), no API version, so moebench checks that it
// has this API's entry points (ncclEpInitHandle and ncclEpUpdateHandle,
// which the API-1 contrib/nccl_ep, of exact struct sizes, lacks) and sends
// every struct at its frozen V1 size with the group's version field 1,
// which every library of this API accepts and reads field for field (a
// newer one reads only what a struct's size covers) — except an fp8
// dispatch's config, sent at its V2 size for its quant_recipe
// (DispatchForward). Group creation, the
// high-throughput handle update, dispatch and combine are collective:
// every rank calls them, each from its own thread.
//
// Proven here only against a fake libnccl_ep written from the header
// (internal/hostsim/fakes/fakencclep.c); not yet run against the real one.
type NCCLEP struct {
	Path    string
	Version string // e.g. "0.1.0"
	NCCL    *NCCL  // the libnccl.so.2 it was loaded over
	fn      map[string]unsafe.Pointer
}

// NCCLEPEnv names NCCL EP's file outright.
const NCCLEPEnv = "MOEBENCH_NCCL_EP"

// ncclEPSymbols are the entry points moebench uses: an older libnccl_ep
// (the tagged-tensor API of NCCL's contrib/nccl_ep) lacks ncclEpInitHandle
// and ncclEpUpdateHandle.
var ncclEPSymbols = []string{"ncclEpGetVersion", "ncclEpCreateGroup", "ncclEpGroupDestroy", "ncclEpInitHandle",
	"ncclEpUpdateHandle", "ncclEpHandleDestroy", "ncclEpDispatch", "ncclEpCombine"}

// Modes and data types moebench passes (abi.h's values, which
// TestABIHeaders checks against nccl_ep.h and nccl.h).
const (
	EPLowLatency     = C.MB_NCCL_EP_ALGO_LOW_LATENCY
	EPHighThroughput = C.MB_NCCL_EP_ALGO_HIGH_THROUGHPUT
	NCCLInt32        = C.MB_ncclInt32
	NCCLFloat32      = C.MB_ncclFloat32
	NCCLBfloat16     = C.MB_ncclBfloat16
	NCCLFloat8e4m3   = C.MB_ncclFloat8e4m3
	// EPQuantForward is NCCL_EP_DISP_QUANT_FWD: the dispatch forwards the
	// caller's quantized tokens and their scales as they are.
	EPQuantForward = C.MB_NCCL_EP_DISP_QUANT_FWD
	// EPAPIVersion is the API version of the header moebench's prototypes
	// follow (nccl-extensions' nccl_ep.h at 44d2de0d); EPStructVersion the
	// version of the structs it sends (their V1 fields, V1 sizes).
	EPAPIVersion    = C.MB_NCCL_EP_API_VERSION
	EPStructVersion = 1
)

// OpenNCCLEP loads NCCL first (OpenNCCL: libnccl.so.2, its symbols global,
// which libnccl_ep.so.0 needs: it has no RUNPATH), then NCCL EP
// (MOEBENCH_NCCL_EP overrides; else as the other libraries are found, the
// nccl-extensions and nccl4py wheels' nccl/ep/lib folders included), and
// asks it its version.
func OpenNCCLEP() (*NCCLEP, error) {
	n, err := OpenNCCL()
	if err != nil {
		return nil, fmt.Errorf("NCCL EP loads over NCCL, which is missing: %w", err)
	}
	lib, err := openLibrary(NCCLEPEnv, "libnccl_ep.so.0", "libnccl_ep.so")
	if err != nil {
		return nil, err
	}
	e := &NCCLEP{Path: lib.path, NCCL: n, fn: map[string]unsafe.Pointer{}}
	for _, s := range ncclEPSymbols {
		if e.fn[s], err = lib.sym(s); err != nil {
			return nil, fmt.Errorf("%w: not the API moebench speaks (nccl-extensions' nccl_ep, structs with sizes and magic numbers; NCCL's older contrib/nccl_ep has no ncclEpUpdateHandle)", err)
		}
	}
	var v C.int
	if err := e.check("ncclEpGetVersion", C.mbcall_ncclEpGetVersion(e.fn["ncclEpGetVersion"], &v)); err != nil {
		return nil, err
	}
	e.Version = fmt.Sprintf("%d.%d.%d", v/10000, v%10000/100, v%100)
	return e, nil
}

// DeviceAPI says whether NCCL has the Device API NCCL EP builds on
// (2.29 or later, with device communicators and memory windows), and if
// not, why.
func (n *NCCL) DeviceAPI() (bool, string) {
	major, minor, _ := ncclVersionOf(n.Version)
	if major < 2 || major == 2 && minor < 29 {
		return false, fmt.Sprintf("NCCL %s has no Device API (NCCL EP needs 2.29 or later; 2.30.7 is the one validated on B200)", n.Version)
	}
	for _, s := range []string{"ncclDevCommCreate", "ncclCommWindowRegister"} {
		if _, err := n.lib.sym(s); err != nil {
			return false, fmt.Sprintf("NCCL %s lacks %s of the Device API NCCL EP needs", n.Version, s)
		}
	}
	return true, ""
}

// ncclVersionOf splits "major.minor.patch".
func ncclVersionOf(v string) (major, minor, patch int) {
	fmt.Sscanf(v, "%d.%d.%d", &major, &minor, &patch)
	return
}

// check turns a result into an error naming the call (NCCL's result names
// and messages).
func (e *NCCLEP) check(call string, r C.int) error { return e.NCCL.check(call, nil, r) }

// EPGroup and EPHandle are NCCL EP's group (a communicator's ranks in one
// mode) and handle (a layout's routing state).
type (
	EPGroup  unsafe.Pointer
	EPHandle unsafe.Pointer
)

// EPGroupConfig is what moebench sets of a group (the rest is NCCL EP's
// default).
type EPGroupConfig struct {
	Algorithm  int // EPLowLatency or EPHighThroughput
	Experts    int
	MaxTokens  int // tokens a rank dispatches, at most
	MaxRecv    int // slots a rank receives, at most (high throughput; 0: the library's bound)
	TokenBytes int // bytes of a token's row (a multiple of 16)
	MaxSMs     int // SMs of its kernels, at most (0: the library's default)
	Timeout    time.Duration
}

// CreateGroup makes rank comm's group (ncclEpCreateGroup): collective,
// every rank of comm calls it from its thread.
func (e *NCCLEP) CreateGroup(comm Comm, c EPGroupConfig) (EPGroup, error) {
	var g unsafe.Pointer
	err := e.check("ncclEpCreateGroup", C.ep_create_group(e.fn["ncclEpCreateGroup"], &g, unsafe.Pointer(comm), C.int(c.Algorithm),
		C.uint(c.Experts), C.uint(c.MaxTokens), C.uint(c.MaxRecv), C.uint(c.TokenBytes), C.uint(c.MaxSMs), C.ulonglong(c.Timeout.Nanoseconds())))
	return EPGroup(g), err
}

// DestroyGroup destroys g (ncclEpGroupDestroy).
func (e *NCCLEP) DestroyGroup(g EPGroup) error {
	return e.check("ncclEpGroupDestroy", C.mbcall_ncclEpGroupDestroy(e.fn["ncclEpGroupDestroy"], unsafe.Pointer(g)))
}

// InitHandle makes g's expert-major handle for top-k routing, with no
// padding between the experts' rows (ncclEpInitHandle; in low-latency mode
// it may allocate collectively).
func (e *NCCLEP) InitHandle(g EPGroup, topk int) (EPHandle, error) {
	var h unsafe.Pointer
	err := e.check("ncclEpInitHandle", C.ep_init_handle(e.fn["ncclEpInitHandle"], &h, unsafe.Pointer(g), C.int(topk)))
	return EPHandle(h), err
}

// DestroyHandle destroys h (ncclEpHandleDestroy).
func (e *NCCLEP) DestroyHandle(h EPHandle) error {
	return e.check("ncclEpHandleDestroy", C.mbcall_ncclEpHandleDestroy(e.fn["ncclEpHandleDestroy"], unsafe.Pointer(h)))
}

// EPTensor is device memory as NCCL EP sees it: a data type and up to
// three dimensions; the zero value is an absent tensor.
type EPTensor struct {
	Data DevicePtr
	Type int
	Dims []int
}

func (t EPTensor) arg() *C.ep_arg {
	a := &C.ep_arg{}
	if len(t.Dims) == 0 {
		return a
	}
	a.data, a.dtype, a.ndim = C.ulonglong(t.Data), C.int(t.Type), C.int(len(t.Dims))
	for i, d := range t.Dims {
		a.dims[i] = C.size_t(d)
	}
	return a
}

// UpdateHandle gives h this step's routing, idx [tokens, topk] int32
// (ncclEpUpdateHandle); in high-throughput mode it is collective, and
// writes each local expert's received rows into counters [L] and their
// total into total [1] (int32; absent tensors in low-latency mode).
func (e *NCCLEP) UpdateHandle(h EPHandle, idx, counters, total EPTensor, s Stream) error {
	return e.check("ncclEpUpdateHandle", C.ep_update(e.fn["ncclEpUpdateHandle"], unsafe.Pointer(h), idx.arg(), counters.arg(), total.arg(), unsafe.Pointer(s)))
}

// Dispatch sends x (with its routing weights w, high throughput) to the
// experts' ranks into out (with outW); in low-latency mode counters [L]
// receives each local expert's rows (ncclEpDispatch, forward, collective).
func (e *NCCLEP) Dispatch(h EPHandle, x, w, out, outW, counters EPTensor, s Stream) error {
	return e.check("ncclEpDispatch", C.ep_dispatch(e.fn["ncclEpDispatch"], unsafe.Pointer(h), x.arg(), EPTensor{}.arg(), w.arg(), out.arg(), EPTensor{}.arg(),
		outW.arg(), counters.arg(), 0, C.MB_NCCL_EP_DISP_QUANT_NONE, unsafe.Pointer(s)))
}

// DispatchForward is Dispatch of quantized tokens x with their scales xs
// [tokens, ·] into out and outS (ncclEpDispatch with quant_recipe
// NCCL_EP_DISP_QUANT_FWD, the dispatch config sent at its V2 size: NCCL EP
// forwards the tokens' and scales' bytes unconverted; the outputs' types
// and row widths are the inputs', rows 16-byte aligned; round_scales 0).
func (e *NCCLEP) DispatchForward(h EPHandle, x, xs, w, out, outS, outW, counters EPTensor, s Stream) error {
	return e.check("ncclEpDispatch", C.ep_dispatch(e.fn["ncclEpDispatch"], unsafe.Pointer(h), x.arg(), xs.arg(), w.arg(), out.arg(), outS.arg(),
		outW.arg(), counters.arg(), 0, C.MB_NCCL_EP_DISP_QUANT_FWD, unsafe.Pointer(s)))
}

// DispatchBackward sends x [tokens, hidden] (the output gradients) to the
// slots the forward's dispatch filled, over h's routing, into out (high
// throughput only: ncclEpDispatch with pass_direction NCCL_EP_BWD_PASS,
// no routing weights in or out; collective).
func (e *NCCLEP) DispatchBackward(h EPHandle, x, out EPTensor, s Stream) error {
	return e.check("ncclEpDispatch", C.ep_dispatch(e.fn["ncclEpDispatch"], unsafe.Pointer(h), x.arg(), EPTensor{}.arg(), EPTensor{}.arg(), out.arg(), EPTensor{}.arg(),
		EPTensor{}.arg(), EPTensor{}.arg(), 1, C.MB_NCCL_EP_DISP_QUANT_NONE, unsafe.Pointer(s)))
}

// Combine returns the expert outputs x to their tokens' ranks, summed per
// token into out (in low-latency mode weighted by outW [tokens, topk])
// (ncclEpCombine, forward, collective).
func (e *NCCLEP) Combine(h EPHandle, x, out, outW EPTensor, s Stream) error {
	return e.check("ncclEpCombine", C.ep_combine(e.fn["ncclEpCombine"], unsafe.Pointer(h), x.arg(), EPTensor{}.arg(), out.arg(), outW.arg(), 0, unsafe.Pointer(s)))
}

// CombineBackward returns the slots' input gradients x [rows, hidden] and
// their weight gradients w (expert-major: [rows], one a slot) to their
// tokens' ranks: each token's rows summed into out [tokens, hidden], its
// k weight gradients into outW [tokens, topk] in the forward's k order
// (high throughput only: ncclEpCombine with pass_direction
// NCCL_EP_BWD_PASS; collective).
func (e *NCCLEP) CombineBackward(h EPHandle, x, w, out, outW EPTensor, s Stream) error {
	return e.check("ncclEpCombine", C.ep_combine(e.fn["ncclEpCombine"], unsafe.Pointer(h), x.arg(), w.arg(), out.arg(), outW.arg(), 1, unsafe.Pointer(s)))
}

// EPRuntime is where NCCL EP's run-time compile finds its tools, as the
// library looks for them: nvcc (NCCL_EP_JIT_NVCC, NVCC, $CUDA_HOME or
// $CUDA_PATH/bin/nvcc, the path), its kernel headers
// (NCCL_EP_JIT_SOURCE_DIR, $NCCL_EP_HOME/include/nccl_ep, else
// /usr/include/nccl_ep), NCCL's device headers (NCCL_EP_JIT_BUILD_INCLUDE_DIR,
// $NCCL_HOME/include, else /usr/include: nccl_device.h) and CUDA's
// (NCCL_EP_JIT_CUDA_INCLUDE_DIR, $CUDA_HOME or $CUDA_PATH/include).
type EPRuntime struct {
	NVCC, Source, NCCLInclude, CUDAInclude string
	Missing                                []string // what is not found, and where it was looked for
}

// FindEPRuntime resolves EPRuntime. NCCL_EP_HOME and NCCL_HOME left unset
// are first set (as nccl4py does) to the wheels' folders next to the
// libraries: nccl/ep of NCCL EP's, nvidia/nccl of NCCL's.
func FindEPRuntime(e *NCCLEP) EPRuntime {
	setHome := func(env, lib string, up int, want string) {
		if os.Getenv(env) != "" || lib == "" {
			return
		}
		d := filepath.Dir(lib)
		for range up {
			d = filepath.Dir(d)
		}
		if _, err := os.Stat(filepath.Join(d, want)); err == nil {
			os.Setenv(env, d)
		}
	}
	if e != nil {
		setHome("NCCL_EP_HOME", e.Path, 1, "include/nccl_ep") // …/nccl/ep/lib/libnccl_ep.so
		setHome("NCCL_HOME", e.NCCL.Path, 1, "include")       // …/nvidia/nccl/lib/libnccl.so.2
	}
	var r EPRuntime
	first := func(cands ...string) string {
		for _, c := range cands {
			if c != "" {
				return c
			}
		}
		return ""
	}
	cudaHome := first(os.Getenv("CUDA_HOME"), os.Getenv("CUDA_PATH"))
	r.NVCC = first(os.Getenv("NCCL_EP_JIT_NVCC"), os.Getenv("NVCC"))
	if r.NVCC == "" && cudaHome != "" {
		if _, err := os.Stat(filepath.Join(cudaHome, "bin", "nvcc")); err == nil {
			r.NVCC = filepath.Join(cudaHome, "bin", "nvcc")
		}
	}
	if r.NVCC == "" {
		r.NVCC = "nvcc"
	}
	if p, err := exec.LookPath(r.NVCC); err != nil {
		r.Missing = append(r.Missing, fmt.Sprintf("nvcc (%s: %v; NCCL_EP_JIT_NVCC, NVCC or CUDA_HOME name it)", r.NVCC, err))
	} else {
		r.NVCC = p
	}
	r.Source = os.Getenv("NCCL_EP_JIT_SOURCE_DIR")
	if h := os.Getenv("NCCL_EP_HOME"); r.Source == "" && h != "" {
		r.Source = filepath.Join(h, "include", "nccl_ep")
	}
	r.Source = first(r.Source, "/usr/include/nccl_ep")
	r.NCCLInclude = os.Getenv("NCCL_EP_JIT_BUILD_INCLUDE_DIR")
	if h := os.Getenv("NCCL_HOME"); r.NCCLInclude == "" && h != "" {
		r.NCCLInclude = filepath.Join(h, "include")
	}
	r.NCCLInclude = first(r.NCCLInclude, "/usr/include")
	r.CUDAInclude = os.Getenv("NCCL_EP_JIT_CUDA_INCLUDE_DIR")
	if r.CUDAInclude == "" && cudaHome != "" {
		r.CUDAInclude = filepath.Join(cudaHome, "include")
	}
	for _, c := range []struct{ dir, file, what string }{
		{r.Source, "device/ht_ep.cuh", "NCCL EP's kernel headers (NCCL_EP_JIT_SOURCE_DIR or NCCL_EP_HOME)"},
		{r.NCCLInclude, "nccl_device.h", "NCCL's device headers (NCCL_EP_JIT_BUILD_INCLUDE_DIR or NCCL_HOME)"},
		{r.CUDAInclude, "cuda_runtime.h", "CUDA's headers (NCCL_EP_JIT_CUDA_INCLUDE_DIR or CUDA_HOME)"},
	} {
		if c.dir == "" {
			r.Missing = append(r.Missing, c.what+": no folder named")
		} else if _, err := os.Stat(filepath.Join(c.dir, c.file)); err != nil {
			r.Missing = append(r.Missing, fmt.Sprintf("%s: no %s in %s", c.what, c.file, c.dir))
		}
	}
	return r
}
