package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/moebench/moebench/internal/cuda/abi"
)

// TestABIHeaders compiles, with a C++ compiler, a program that checks every
// prototype of abi.h (argument count; each argument's and the result's
// size and kind, and the size of what a pointer points to), every value
// moebench passes, and the size and offsets of every struct it builds,
// against the real headers: CUDA 11.8's cuda.h, nvrtc.h, cublasLt.h and
// cublas_api.h (Debian's non-free nvidia-cuda-dev; .ci/run unpacks them
// and names the folder in MOEBENCH_CUDA_INCLUDE). NVML has no prototype
// here: it goes through go-nvml.
// What 11.8 lacks is checked against declarations transcribed from newer
// headers (newerDecls, each with its source). NCCL EP's and NCCL's are
// checked against their real headers where a node has them (an installed
// nccl_ep/nccl_ep.h: MOEBENCH_NCCL_EP_INCLUDE, $NCCL_EP_HOME/include or
// beside libnccl_ep; nccl.h: MOEBENCH_NCCL_INCLUDE, $NCCL_HOME/include,
// the system's, else its transcription), and against their transcriptions
// otherwise (CI: neither is packaged where it can reach). Without the CUDA
// headers it skips; under MOEBENCH_REQUIRE_NVRTC=1 (CI) it fails instead.
func TestABIHeaders(t *testing.T) {
	inc := cudaInclude()
	cxx := os.Getenv("CXX")
	if cxx == "" {
		cxx = "c++"
	}
	_, errCXX := exec.LookPath(cxx)
	if inc == "" || errCXX != nil {
		msg := fmt.Sprintf("no CUDA 11.8 headers (cuda.h, nvrtc.h, cublasLt.h, cublas_api.h; MOEBENCH_CUDA_INCLUDE names their folder) or no C++ compiler (%v)", errCXX)
		if os.Getenv("MOEBENCH_REQUIRE_NVRTC") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	epInc, ncclInc := headerDir(ncclEPIncludes(), "nccl_ep/nccl_ep.h", "nccl_ep/ep_enums.h"), headerDir(ncclIncludes(), "nccl.h")
	src, err := abiCheckSource(epInc != "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{"check.cc": src, "abi.h": abi.Header}
	switch {
	case epInc == "":
		t.Log("NCCL and NCCL EP checked against transcriptions of their headers: no nccl_ep/nccl_ep.h found (MOEBENCH_NCCL_EP_INCLUDE, $NCCL_EP_HOME/include or beside libnccl_ep names its folder)")
	case ncclInc == "":
		files["nccl.h"] = ncclStandIn() // NCCL's, transcribed
		t.Logf("NCCL EP checked against the real nccl_ep.h in %s (NCCL's types transcribed: no nccl.h found)", epInc)
	default:
		t.Logf("NCCL EP and NCCL checked against the real nccl_ep.h in %s and nccl.h in %s", epInc, ncclInc)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"-std=c++17", "-fsyntax-only", "-Werror", "-I", dir, "-I", inc}
	for _, d := range []string{epInc, ncclInc} {
		if d != "" {
			args = append(args, "-I", d)
		}
	}
	out, err := exec.Command(cxx, append(args, filepath.Join(dir, "check.cc"))...).CombinedOutput()
	if err != nil {
		var msgs []string // the static assertions that failed, by name
		for _, m := range regexp.MustCompile(`static assertion failed: ([^\n]*)`).FindAllStringSubmatch(string(out), -1) {
			msgs = append(msgs, m[1])
		}
		t.Fatalf("moebench's declarations differ from the headers in %s:\n  %s\n\ncompiler output:\n%s", inc, strings.Join(msgs, "\n  "), out)
	}
}

// headerDir is the first of dirs holding every file, or "".
func headerDir(dirs []string, files ...string) string {
	for _, d := range dirs {
		ok := d != ""
		for _, f := range files {
			if _, err := os.Stat(filepath.Join(d, f)); err != nil {
				ok = false
			}
		}
		if ok {
			return d
		}
	}
	return ""
}

// ncclEPIncludes are where a real nccl_ep/nccl_ep.h may be: named by
// MOEBENCH_NCCL_EP_INCLUDE, under $NCCL_EP_HOME, or beside the library
// (the wheel's nccl/ep/lib and nccl/ep/include).
func ncclEPIncludes() []string {
	dirs := []string{os.Getenv("MOEBENCH_NCCL_EP_INCLUDE")}
	if h := os.Getenv("NCCL_EP_HOME"); h != "" {
		dirs = append(dirs, filepath.Join(h, "include"))
	}
	if e, err := OpenNCCLEP(); err == nil && filepath.IsAbs(e.Path) {
		dirs = append(dirs, filepath.Join(filepath.Dir(filepath.Dir(e.Path)), "include"))
	}
	return dirs
}

// ncclStandIn is an nccl.h of the transcribed types and declarations
// (NCCL EP's header includes nccl.h).
func ncclStandIn() string {
	var b strings.Builder
	b.WriteString("#pragma once\n#include <cuda_runtime.h>\n" + ncclTypes)
	for name, d := range newerDecls {
		if strings.HasPrefix(name, "nccl") && !strings.HasPrefix(name, "ncclEp") {
			b.WriteString(d + "\n")
		}
	}
	return b.String()
}

// ncclIncludes are where a real nccl.h may be: MOEBENCH_NCCL_INCLUDE,
// $NCCL_HOME/include, beside the library (the wheel's nvidia/nccl/lib and
// nvidia/nccl/include), the system's.
func ncclIncludes() []string {
	dirs := []string{os.Getenv("MOEBENCH_NCCL_INCLUDE")}
	if h := os.Getenv("NCCL_HOME"); h != "" {
		dirs = append(dirs, filepath.Join(h, "include"))
	}
	if n, err := OpenNCCL(); err == nil && filepath.IsAbs(n.Path) {
		dirs = append(dirs, filepath.Join(filepath.Dir(filepath.Dir(n.Path)), "include"))
	}
	return append(dirs, "/usr/include", "/usr/local/include")
}

// cudaInclude is the folder holding the CUDA 11.8 headers, or "".
func cudaInclude() string {
	dirs := filepath.SplitList(os.Getenv("MOEBENCH_CUDA_INCLUDE"))
	dirs = append(dirs, "/usr/include", "/usr/local/cuda/include")
	for _, d := range dirs {
		ok := d != ""
		for _, h := range []string{"cuda.h", "nvrtc.h", "cublasLt.h", "cublas_api.h"} {
			if _, err := os.Stat(filepath.Join(d, h)); err != nil {
				ok = false
			}
		}
		if ok {
			return d
		}
	}
	return ""
}

// newerDecls are the entry points abi.h declares that CUDA 11.8's headers
// lack, as the newer headers declare them (in 11.8's types), each with its
// source; NCCL's come from nccl.h.
var newerDecls = map[string]string{
	// CUDA 12.8's cuda.h (NVIDIA/cuda-python's cydriver bindings of it;
	// docs/references.md, CUDA bindings): failIdx until 12.9
	"cuMemcpyBatchAsync": "CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, " +
		"CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, CUstream hStream);",
	// CUDA 13.0's cuda.h maps cuMemcpyBatchAsync to _v2, without failIdx
	"cuMemcpyBatchAsync_v2": "CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, " +
		"CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, CUstream hStream);",
	// CUDA 12.8+/13.0's cuda.h (NVIDIA/cuda-python cydriver: _cuEventElapsedTime_v2)
	"cuEventElapsedTime_v2": "CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd);",
	// cuBLAS 12.5's cublas_api.h (NVIDIA's cuBLAS 12.5 documentation;
	// docs/references.md, CUDA bindings)
	"cublasGemmGroupedBatchedEx": "cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t handle, const cublasOperation_t transa_array[], " +
		"const cublasOperation_t transb_array[], const int m_array[], const int n_array[], const int k_array[], const void *alpha_array, " +
		"const void *const Aarray[], cudaDataType_t Atype, const int lda_array[], const void *const Barray[], cudaDataType_t Btype, " +
		"const int ldb_array[], const void *beta_array, void *const Carray[], cudaDataType_t Ctype, const int ldc_array[], " +
		"int group_count, const int group_size[], cublasComputeType_t computeType);",
	// NCCL's src/nccl.h.in (NVIDIA/nccl, commit 021e8045, 2.30)
	"ncclGetVersion":     "ncclResult_t ncclGetVersion(int *version);",
	"ncclGetUniqueId":    "ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);",
	"ncclCommInitRank":   "ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);",
	"ncclCommDestroy":    "ncclResult_t ncclCommDestroy(ncclComm_t comm);",
	"ncclGroupStart":     "ncclResult_t ncclGroupStart(void);",
	"ncclGroupEnd":       "ncclResult_t ncclGroupEnd(void);",
	"ncclSend":           "ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream);",
	"ncclRecv":           "ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream);",
	"ncclGetErrorString": "const char *ncclGetErrorString(ncclResult_t result);",
	"ncclGetLastError":   "const char *ncclGetLastError(ncclComm_t comm);",
	// NCCL EP's nccl_ep/include/nccl_ep.h (NVIDIA/nccl-extensions, commit
	// 44d2de0d, 2026-08-21; NCCL EP 0.1.0, API version 2)
	"ncclEpGetVersion":   "ncclResult_t ncclEpGetVersion(int *version);",
	"ncclEpCreateGroup":  "ncclResult_t ncclEpCreateGroup(ncclEpGroup_t *ep_group, ncclComm_t comm, const ncclEpGroupConfig_t *config);",
	"ncclEpGroupDestroy": "ncclResult_t ncclEpGroupDestroy(ncclEpGroup_t ep_group);",
	"ncclEpInitHandle": "ncclResult_t ncclEpInitHandle(ncclEpHandle_t *handle, ncclEpGroup_t ep_group, ncclEpLayout_t layout, " +
		"const ncclEpHandleConfig_t *config, int num_topk, const ncclEpTensor_t *handle_mem);",
	"ncclEpUpdateHandle": "ncclResult_t ncclEpUpdateHandle(ncclEpHandle_t handle, const ncclEpTensor_t *topk_idx, " +
		"const ncclEpLayoutInfo_t *layout_info, cudaStream_t stream);",
	"ncclEpHandleDestroy": "ncclResult_t ncclEpHandleDestroy(ncclEpHandle_t handle);",
	"ncclEpDispatch": "ncclResult_t ncclEpDispatch(ncclEpHandle_t handle, const ncclEpDispatchInputs_t *inputs, " +
		"const ncclEpDispatchOutputs_t *outputs, const ncclEpLayoutInfo_t *layout_info, const ncclEpDispatchConfig_t *config, cudaStream_t stream);",
	"ncclEpCombine": "ncclResult_t ncclEpCombine(ncclEpHandle_t handle, const ncclEpCombineInputs_t *inputs, " +
		"const ncclEpCombineOutputs_t *outputs, const ncclEpCombineConfig_t *config, cudaStream_t stream);",
}

// newerTypes are the types newerDecls use that 11.8 lacks, with their
// sources: CUDA 12.8's CUmemcpyAttributes (NVIDIA/cuda-python cydriver;
// docs/references.md, CUDA bindings: 24 bytes), nccl.h's handles and enums
// (ncclTypes) and NCCL EP's (ncclEPTypes).
const newerTypes = cuNewerTypes + ncclTypes + ncclEPTypes

const cuNewerTypes = `
typedef struct { int srcAccessOrder; CUmemLocation srcLocHint, dstLocHint; unsigned int flags; } CUmemcpyAttributes;
enum { CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1, CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE = 1 };
` + ltNewerTypes

// ltNewerTypes are cublasLt.h's FP8 scale modes (12.8+; VEC128_32F and
// BLK128x128_32F usable from 12.9), which 11.8 lacks: the attribute ids of
// cublasLtMatmulDescAttributes_t as modular/modular's Mojo bindings of the
// header (max/kernels/src/_cublas/cublaslt.mojo, docstrings carried from
// the header) give them, and cublasLtMatmulMatrixScale_t's values as
// NVIDIA's nvmath-python bindings (nvmath.bindings.cublasLt.MatmulMatrixScale,
// generated from the header) list them.
const ltNewerTypes = `
enum { CUBLASLT_MATMUL_DESC_A_SCALE_MODE = 31, CUBLASLT_MATMUL_DESC_B_SCALE_MODE = 32 };
typedef enum { CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F = 0, CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 = 1,
	CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 = 2, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F = 3,
	CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F = 4, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F = 5,
	CUBLASLT_MATMUL_MATRIX_SCALE_PER_BATCH_SCALAR_32F = 6 } cublasLtMatmulMatrixScale_t;
`

// ncclTypes are nccl.h's handles and enums (NVIDIA/nccl src/nccl.h.in at
// 021e8045).
const ncclTypes = `
typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId; // NCCL_UNIQUE_ID_BYTES
typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
	ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7, ncclTimeout = 8,
	ncclNumResults = 9 } ncclResult_t;
typedef enum { ncclInt8 = 0, ncclChar = 0, ncclUint8 = 1, ncclInt32 = 2, ncclInt = 2, ncclUint32 = 3, ncclInt64 = 4,
	ncclUint64 = 5, ncclFloat16 = 6, ncclHalf = 6, ncclFloat32 = 7, ncclFloat = 7, ncclFloat64 = 8, ncclDouble = 8,
	ncclBfloat16 = 9, ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11 } ncclDataType_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
`

// ncclEPTypes are NCCL EP's types and values, transcribed from
// NVIDIA/nccl-extensions at 44d2de0d (2026-08-21): nccl_ep/include/ep_enums.h
// and nccl_ep/include/nccl_ep.h (the CUDA runtime's stream and error types
// in the driver's terms).
const ncclEPTypes = `
typedef CUstream cudaStream_t;
typedef int cudaError_t;
#define NCCL_EP_AUTO 0
typedef enum { NCCL_EP_ALGO_LOW_LATENCY = 0, NCCL_EP_ALGO_HIGH_THROUGHPUT = 1 } ncclEpAlgorithm_t;
typedef enum { NCCL_EP_OVERFLOW_AUTO = NCCL_EP_AUTO, NCCL_EP_OVERFLOW_TRAP, NCCL_EP_OVERFLOW_DROP } ncclEpOverflowPolicy_t;
typedef enum { NCCL_EP_LAYOUT_UNSET = NCCL_EP_AUTO, NCCL_EP_LAYOUT_EXPERT_MAJOR, NCCL_EP_LAYOUT_RANK_MAJOR, NCCL_EP_LAYOUT_FLAT } ncclEpLayout_t;
typedef enum { NCCL_EP_FWD_PASS = 0, NCCL_EP_BWD_PASS = 1 } ncclEpPassDir_t;
typedef enum { NCCL_EP_ZERO_COPY_AUTO = NCCL_EP_AUTO, NCCL_EP_ZERO_COPY_OFF, NCCL_EP_ZERO_COPY_ON } ncclEpZeroCopyMode_t;
typedef enum { NCCL_EP_EXPERT_ID_AUTO = NCCL_EP_AUTO, NCCL_EP_EXPERT_ID_LOCAL = 1, NCCL_EP_EXPERT_ID_GLOBAL = 2 } ncclEpExpertIdKind_t;
#define NCCL_EP_API_VERSION 2
#define NCCL_EP_MAGIC 0xC00FFFEEu
#define NCCL_EP_TENSOR_MAGIC 0xCAFECAFE
typedef struct ncclEpTensor {
	unsigned int size; unsigned int magic; unsigned int ndim; ncclDataType_t datatype; void *data;
	ncclWindow_t win_hdl; uint64_t win_offset; size_t *sizes;
} ncclEpTensor_t;
#define NCCL_EP_TENSOR_V1_SIZE 48u
typedef cudaError_t (*ncclEpAllocFn_t)(void **ptr, size_t size, void *context);
typedef cudaError_t (*ncclEpFreeFn_t)(void *ptr, void *context);
typedef struct { ncclEpAllocFn_t alloc_fn; ncclEpFreeFn_t free_fn; void *context; } ncclEpAllocConfig_t;
typedef struct {
	unsigned int size; unsigned int magic; unsigned int version; ncclEpAlgorithm_t algorithm; unsigned int num_experts;
	unsigned int max_dispatch_tokens_per_rank; unsigned int max_recv_tokens_per_rank; unsigned int max_token_bytes;
	unsigned long int rdma_buffer_size; unsigned int num_qp_per_rank; unsigned int num_channels; unsigned int max_num_sms;
	ncclEpAllocConfig_t alloc; unsigned int enable_mask; uint64_t timeout_ns; ncclEpZeroCopyMode_t zero_copy;
	ncclEpOverflowPolicy_t overflow_policy; unsigned int num_topk; unsigned char padding_v2[4];
} ncclEpGroupConfig_t;
#define NCCL_EP_GROUP_CONFIG_V1_SIZE 96u
typedef struct ncclEpGroup *ncclEpGroup_t;
typedef struct {
	unsigned int size; unsigned int magic; ncclEpTensor_t *expert_counters; ncclEpTensor_t *src_rank_counters;
	ncclEpTensor_t *expert_offsets; ncclEpTensor_t *recv_total_counter; ncclEpExpertIdKind_t recv_topk_idx_kind;
	unsigned char padding_v2[4];
} ncclEpLayoutInfo_t;
#define NCCL_EP_LAYOUT_INFO_V1_SIZE 40u
typedef struct { unsigned int size; unsigned int magic; ncclEpTensor_t *tokens; ncclEpTensor_t *topk_weights; ncclEpTensor_t *scales; } ncclEpDispatchInputs_t;
#define NCCL_EP_DISPATCH_INPUTS_V1_SIZE 32u
typedef struct {
	unsigned int size; unsigned int magic; ncclEpTensor_t *tokens; ncclEpTensor_t *topk_weights; ncclEpTensor_t *scales; ncclEpTensor_t *topk_idx;
} ncclEpDispatchOutputs_t;
#define NCCL_EP_DISPATCH_OUTPUTS_V1_SIZE 40u
typedef struct { unsigned int size; unsigned int magic; ncclEpTensor_t *tokens; ncclEpTensor_t *topk_weights; ncclEpTensor_t *scales; } ncclEpCombineInputs_t;
#define NCCL_EP_COMBINE_INPUTS_V1_SIZE 24u
typedef struct { unsigned int size; unsigned int magic; ncclEpTensor_t *tokens; ncclEpTensor_t *topk_weights; } ncclEpCombineOutputs_t;
#define NCCL_EP_COMBINE_OUTPUTS_V1_SIZE 24u
typedef struct ncclEpHandle *ncclEpHandle_t;
typedef struct { unsigned int size; unsigned int magic; size_t dispatch_output_per_expert_alignment; } ncclEpHandleConfig_t;
#define NCCL_EP_HANDLE_CONFIG_V1_SIZE 16u
typedef enum { NCCL_EP_DISP_QUANT_NONE = 0, NCCL_EP_DISP_QUANT_FWD = 1, NCCL_EP_DISP_QUANT_DS_FP8E3M4 = 2 } ncclEpDispQuant_t;
typedef enum { NCCL_EP_COMB_QUANT_NONE = 0, NCCL_EP_COMB_QUANT_NVFP4 = 1 } ncclEpCombQuant_t;
typedef struct {
	unsigned int size; unsigned int magic; unsigned int send_only; unsigned int round_scales; ncclEpPassDir_t pass_direction;
	ncclEpDispQuant_t quant_recipe;
} ncclEpDispatchConfig_t;
#define NCCL_EP_DISPATCH_CONFIG_V1_SIZE 20u
#define NCCL_EP_DISPATCH_CONFIG_V2_SIZE 24u
typedef struct {
	unsigned int size; unsigned int magic; unsigned int send_only; ncclEpPassDir_t pass_direction; ncclEpCombQuant_t quant_recipe;
} ncclEpCombineConfig_t;
#define NCCL_EP_COMBINE_CONFIG_V1_SIZE 16u
`

// abiValues are the values moebench passes or compares, by the headers'
// names (or abi.h's own macros, compared with the headers' names).
func abiValues() map[string]int {
	v := map[string]int{
		"CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": AttrMaxSharedPerBlockOptin,
		"CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT":              AttrMultiprocessorCount,
		"CU_DEVICE_ATTRIBUTE_CLOCK_RATE":                        AttrClockRateKHz,
		"CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE":                 AttrMemoryClockRateKHz,
		"CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT":                AttrAsyncEngineCount,
		"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR":          AttrComputeCapabilityMajor,
		"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR":          AttrComputeCapabilityMinor,
		"CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK":               FuncAttrMaxThreadsPerBlock,
		"CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES":                   FuncAttrSharedBytes,
		"CU_FUNC_ATTRIBUTE_NUM_REGS":                            FuncAttrNumRegs,
		"CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES":       FuncAttrMaxDynamicShared,
		"CU_MEMHOSTALLOC_PORTABLE":                              HostAllocPortable,
		"CU_MEMHOSTALLOC_DEVICEMAP":                             HostAllocDeviceMap,
		"CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE":               ErrCooperativeTooLarge,
		"CU_STREAM_NON_BLOCKING":                                streamNonBlocking,
		"CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE":            memcpyPreferOverlap,
		"CU_STREAM_CAPTURE_MODE_THREAD_LOCAL":                   captureModeThreadLocal,
		"CU_EVENT_RECORD_EXTERNAL":                              eventRecordExternal,
		"CU_LAUNCH_ATTRIBUTE_COOPERATIVE":                       -1, // abi.h's MB_ macro of the same name
		"CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION":                 -1,
		"CU_MEMCPY_SRC_ACCESS_ORDER_STREAM":                     -1,
		"CU_MEM_LOCATION_TYPE_DEVICE":                           -1,
		"CUDA_R_32F":                                            dataR32F,
		"CUDA_R_16BF":                                           dataR16BF,
		"CUBLAS_COMPUTE_32F":                                    compute32F,
		"CUBLASLT_MATMUL_DESC_TRANSA":                           descTransA,
		"CUBLASLT_MATMUL_DESC_TRANSB":                           descTransB,
		"CUBLAS_OP_N":                                           opN,
		"CUBLAS_OP_T":                                           opT,
		"CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES":              prefMaxWorkspaceBytes,
		"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES":            prefMinAlignA,
		"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES":            prefMinAlignA + 3, // preference() sets A, B, C, D in a row
		"CUDA_R_8F_E4M3":                                        dataR8FE4M3,
		"CUBLASLT_MATMUL_DESC_A_SCALE_POINTER":                  descAScalePointer,
		"CUBLASLT_MATMUL_DESC_B_SCALE_POINTER":                  descBScalePointer,
		"CUBLASLT_MATMUL_DESC_A_SCALE_MODE":                     descAScaleMode, // transcribed (ltNewerTypes)
		"CUBLASLT_MATMUL_DESC_B_SCALE_MODE":                     descBScaleMode,
		"CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F":               scaleScalar32F,
		"CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F":               scaleVec128F32,
		"CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F":           scaleBlk128F32,

		"CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": AttrMaxSharedPerSM,
		"CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK":     AttrReservedSharedPerBlock,

		"ncclUint8":                        ncclUint8,
		"ncclInt32":                        -1, // abi.h's MB_ macros of the same names
		"ncclFloat32":                      -1,
		"ncclBfloat16":                     -1,
		"ncclFloat8e4m3":                   -1,
		"NCCL_EP_DISP_QUANT_NONE":          -1,
		"NCCL_EP_DISP_QUANT_FWD":           -1,
		"NCCL_EP_DISP_QUANT_DS_FP8E3M4":    -1,
		"NCCL_EP_DISPATCH_CONFIG_V2_SIZE":  -1,
		"NCCL_EP_MAGIC":                    -1,
		"NCCL_EP_TENSOR_MAGIC":             -1,
		"NCCL_EP_API_VERSION":              -1,
		"NCCL_EP_AUTO":                     -1,
		"NCCL_EP_ALGO_LOW_LATENCY":         -1,
		"NCCL_EP_ALGO_HIGH_THROUGHPUT":     -1,
		"NCCL_EP_LAYOUT_EXPERT_MAJOR":      -1,
		"NCCL_EP_GROUP_CONFIG_V1_SIZE":     -1,
		"NCCL_EP_LAYOUT_INFO_V1_SIZE":      -1,
		"NCCL_EP_TENSOR_V1_SIZE":           -1,
		"NCCL_EP_HANDLE_CONFIG_V1_SIZE":    -1,
		"NCCL_EP_DISPATCH_INPUTS_V1_SIZE":  -1,
		"NCCL_EP_DISPATCH_OUTPUTS_V1_SIZE": -1,
		"NCCL_EP_DISPATCH_CONFIG_V1_SIZE":  -1,
		"NCCL_EP_COMBINE_INPUTS_V1_SIZE":   -1,
		"NCCL_EP_COMBINE_OUTPUTS_V1_SIZE":  -1,
		"NCCL_EP_COMBINE_CONFIG_V1_SIZE":   -1,
	}
	for i, n := range ncclResultNames {
		v[n] = i
	}
	v["ncclNumResults"] = len(ncclResultNames) // every result has a name
	return v
}

// abiEntry matches abi.h's list entries: F(R, name, (params), ...) and F0(R, name).
var abiEntry = regexp.MustCompile(`\bF(0?)\(([^,]+), (\w+)(?:, \(([^()]*(?:\([^()]*\)[^()]*)*)\))?`)

// abiCheckSource is the C++ check program.
// With realEP, NCCL's and NCCL EP's declarations are the real headers'
// (nccl.h and nccl_ep/nccl_ep.h on the include path) instead of the
// transcriptions.
func abiCheckSource(realEP bool) (string, error) {
	var b strings.Builder
	b.WriteString(`#include <cstddef>
#include <tuple>
#include <type_traits>
#include <cuda.h>
#include <nvrtc.h>
#include <cublasLt.h>
#include <cublas_api.h>
`)
	transcribed := newerTypes
	if realEP {
		b.WriteString("#include <nccl.h>\n#include <nccl_ep/nccl_ep.h>\n")
		transcribed = cuNewerTypes
	}
	b.WriteString(`#include "abi.h"
namespace newer {
` + transcribed)
	for name, d := range newerDecls {
		if !realEP || !strings.HasPrefix(name, "nccl") {
			b.WriteString(d + "\n")
		}
	}
	b.WriteString(`}
using namespace newer;
// complete: sizeof works (an opaque handle's struct does not)
template <class T, class = void> struct complete : std::false_type {};
template <class T> struct complete<T, decltype(void(sizeof(T)))> : std::true_type {};
template <class T> using bare = std::remove_cv_t<std::decay_t<T>>;
// same: moebench's type B passes what the header's type A does
template <class A, class B> constexpr bool same() {
	using a = bare<A>;
	using b = bare<B>;
	if constexpr (std::is_pointer_v<a> != std::is_pointer_v<b>) {
		return false;
	} else if constexpr (std::is_pointer_v<a>) {
		using pa = std::remove_cv_t<std::remove_pointer_t<a>>;
		using pb = std::remove_cv_t<std::remove_pointer_t<b>>;
		if constexpr (std::is_void_v<pb>) // ours void *: a handle (a struct, opaque or not) or untyped bytes
			return std::is_void_v<pa> || !complete<pa>::value || std::is_class_v<pa>;
		else if constexpr (std::is_void_v<pa> || !complete<pa>::value)
			return false;
		else
			return same<pa, pb>();
	} else if constexpr (std::is_class_v<a> || std::is_class_v<b>) {
		return sizeof(a) == sizeof(b) && alignof(a) == alignof(b);
	} else {
		return sizeof(a) == sizeof(b) && std::is_floating_point_v<a> == std::is_floating_point_v<b> &&
		       std::is_void_v<a> == std::is_void_v<b>;
	}
}
template <class F> struct sig;
template <class R, class... A> struct sig<R (*)(A...)> {
	using ret = R;
	static constexpr std::size_t n = sizeof...(A);
	template <std::size_t I> using arg = std::tuple_element_t<I, std::tuple<A...>>;
};
template <class Real, class Ours, std::size_t I> constexpr bool arg_ok() {
	if constexpr (I >= sig<Real>::n || I >= sig<Ours>::n) return false;
	else return same<typename sig<Real>::template arg<I>, typename sig<Ours>::template arg<I>>();
}
`)
	seen := 0
	for _, m := range abiEntry.FindAllStringSubmatch(abi.Header, -1) {
		name, params := m[3], m[4]
		if name == "name" { // the header's comment on the format
			continue
		}
		real := "::" + name
		if _, ok := newerDecls[name]; ok && !(realEP && strings.HasPrefix(name, "nccl")) {
			real = "newer::" + name
		}
		seen++
		n := 0
		if m[1] == "" && strings.TrimSpace(params) != "" {
			n = topLevelCommas(params) + 1
		}
		fmt.Fprintf(&b, "using real_%s = decltype(&%s);\n", name, real)
		fmt.Fprintf(&b, "static_assert(sig<real_%s>::n == %d, \"%s: the header's argument count differs from abi.h's\");\n", name, n, name)
		fmt.Fprintf(&b, "static_assert(same<sig<real_%s>::ret, sig<mb_%s>::ret>(), \"%s: result type\");\n", name, name, name)
		for i := range n {
			fmt.Fprintf(&b, "static_assert(arg_ok<real_%s, mb_%s, %d>(), \"%s: argument %d\");\n", name, name, i, name, i+1)
		}
	}
	if seen < 80 {
		return "", fmt.Errorf("only %d entry points found in abi.h: the list format changed", seen)
	}
	for name, v := range abiValues() {
		if v < 0 {
			fmt.Fprintf(&b, "static_assert(MB_%s == %s, \"%s: abi.h's value differs\");\n", strings.TrimPrefix(name, "CU_"), name, name)
			continue
		}
		fmt.Fprintf(&b, "static_assert(%s == %d, \"%s: moebench's value %d differs\");\n", name, v, name, v)
	}
	// structs: moebench's layouts against the headers' (CUmemcpyAttributes: newer's)
	b.WriteString(`#define SAME_LAYOUT(ours, real) static_assert(sizeof(ours) == sizeof(real) && alignof(ours) == alignof(real), #ours ": size or alignment differs from " #real)
#define SAME_FIELD(ours, of, real, rf) static_assert(offsetof(ours, of) == offsetof(real, rf), #ours "." #of ": offset differs from " #real "." #rf)
SAME_LAYOUT(mb_launch_attr, CUlaunchAttribute);
SAME_FIELD(mb_launch_attr, value, CUlaunchAttribute, value);
SAME_FIELD(mb_launch_attr, value.cooperative, CUlaunchAttribute, value.cooperative);
SAME_FIELD(mb_launch_attr, value.cluster.x, CUlaunchAttribute, value.clusterDim.x);
SAME_FIELD(mb_launch_attr, value.cluster.z, CUlaunchAttribute, value.clusterDim.z);
SAME_LAYOUT(mb_launch_config, CUlaunchConfig);
SAME_FIELD(mb_launch_config, gridX, CUlaunchConfig, gridDimX);
SAME_FIELD(mb_launch_config, sharedBytes, CUlaunchConfig, sharedMemBytes);
SAME_FIELD(mb_launch_config, stream, CUlaunchConfig, hStream);
SAME_FIELD(mb_launch_config, attrs, CUlaunchConfig, attrs);
SAME_FIELD(mb_launch_config, numAttrs, CUlaunchConfig, numAttrs);
SAME_LAYOUT(mb_mem_location, CUmemLocation);
SAME_FIELD(mb_mem_location, id, CUmemLocation, id);
SAME_LAYOUT(mb_memcpy_attrs, newer::CUmemcpyAttributes);
static_assert(sizeof(mb_memcpy_attrs) == 24, "mb_memcpy_attrs: CUmemcpyAttributes is 24 bytes");
SAME_FIELD(mb_memcpy_attrs, srcLocHint, newer::CUmemcpyAttributes, srcLocHint);
SAME_FIELD(mb_memcpy_attrs, dstLocHint, newer::CUmemcpyAttributes, dstLocHint);
SAME_FIELD(mb_memcpy_attrs, flags, newer::CUmemcpyAttributes, flags);
SAME_LAYOUT(mb_nccl_id, ncclUniqueId);
// NCCL EP: each struct whole, each field, and each V1 boundary at the end of
// the struct's last V1 field (what moebench sends)
#define EP_V1_END(ours, last, v1) static_assert(offsetof(ours, last) + sizeof(((ours *)0)->last) == v1, #ours ": the V1 boundary is not after " #last)
SAME_LAYOUT(mb_ep_tensor, ncclEpTensor_t);
SAME_FIELD(mb_ep_tensor, ndim, ncclEpTensor_t, ndim);
SAME_FIELD(mb_ep_tensor, datatype, ncclEpTensor_t, datatype);
SAME_FIELD(mb_ep_tensor, data, ncclEpTensor_t, data);
SAME_FIELD(mb_ep_tensor, win, ncclEpTensor_t, win_hdl);
SAME_FIELD(mb_ep_tensor, win_offset, ncclEpTensor_t, win_offset);
SAME_FIELD(mb_ep_tensor, sizes, ncclEpTensor_t, sizes);
EP_V1_END(mb_ep_tensor, sizes, MB_NCCL_EP_TENSOR_V1_SIZE);
SAME_LAYOUT(mb_ep_group_config, ncclEpGroupConfig_t);
SAME_FIELD(mb_ep_group_config, magic, ncclEpGroupConfig_t, magic);
SAME_FIELD(mb_ep_group_config, version, ncclEpGroupConfig_t, version);
SAME_FIELD(mb_ep_group_config, algorithm, ncclEpGroupConfig_t, algorithm);
SAME_FIELD(mb_ep_group_config, num_experts, ncclEpGroupConfig_t, num_experts);
SAME_FIELD(mb_ep_group_config, max_dispatch_tokens_per_rank, ncclEpGroupConfig_t, max_dispatch_tokens_per_rank);
SAME_FIELD(mb_ep_group_config, max_recv_tokens_per_rank, ncclEpGroupConfig_t, max_recv_tokens_per_rank);
SAME_FIELD(mb_ep_group_config, max_token_bytes, ncclEpGroupConfig_t, max_token_bytes);
SAME_FIELD(mb_ep_group_config, rdma_buffer_size, ncclEpGroupConfig_t, rdma_buffer_size);
SAME_FIELD(mb_ep_group_config, num_channels, ncclEpGroupConfig_t, num_channels);
SAME_FIELD(mb_ep_group_config, max_num_sms, ncclEpGroupConfig_t, max_num_sms);
SAME_FIELD(mb_ep_group_config, alloc, ncclEpGroupConfig_t, alloc);
SAME_FIELD(mb_ep_group_config, enable_mask, ncclEpGroupConfig_t, enable_mask);
SAME_FIELD(mb_ep_group_config, timeout_ns, ncclEpGroupConfig_t, timeout_ns);
SAME_FIELD(mb_ep_group_config, zero_copy, ncclEpGroupConfig_t, zero_copy);
SAME_FIELD(mb_ep_group_config, num_topk, ncclEpGroupConfig_t, num_topk);
EP_V1_END(mb_ep_group_config, timeout_ns, MB_NCCL_EP_GROUP_CONFIG_V1_SIZE);
SAME_LAYOUT(mb_ep_layout_info, ncclEpLayoutInfo_t);
SAME_FIELD(mb_ep_layout_info, expert_counters, ncclEpLayoutInfo_t, expert_counters);
SAME_FIELD(mb_ep_layout_info, src_rank_counters, ncclEpLayoutInfo_t, src_rank_counters);
SAME_FIELD(mb_ep_layout_info, expert_offsets, ncclEpLayoutInfo_t, expert_offsets);
SAME_FIELD(mb_ep_layout_info, recv_total_counter, ncclEpLayoutInfo_t, recv_total_counter);
SAME_FIELD(mb_ep_layout_info, recv_topk_idx_kind, ncclEpLayoutInfo_t, recv_topk_idx_kind);
EP_V1_END(mb_ep_layout_info, recv_total_counter, MB_NCCL_EP_LAYOUT_INFO_V1_SIZE);
SAME_LAYOUT(mb_ep_handle_config, ncclEpHandleConfig_t);
SAME_FIELD(mb_ep_handle_config, dispatch_output_per_expert_alignment, ncclEpHandleConfig_t, dispatch_output_per_expert_alignment);
EP_V1_END(mb_ep_handle_config, dispatch_output_per_expert_alignment, MB_NCCL_EP_HANDLE_CONFIG_V1_SIZE);
SAME_LAYOUT(mb_ep_dispatch_inputs, ncclEpDispatchInputs_t);
SAME_FIELD(mb_ep_dispatch_inputs, tokens, ncclEpDispatchInputs_t, tokens);
SAME_FIELD(mb_ep_dispatch_inputs, topk_weights, ncclEpDispatchInputs_t, topk_weights);
SAME_FIELD(mb_ep_dispatch_inputs, scales, ncclEpDispatchInputs_t, scales);
EP_V1_END(mb_ep_dispatch_inputs, scales, MB_NCCL_EP_DISPATCH_INPUTS_V1_SIZE);
SAME_LAYOUT(mb_ep_dispatch_outputs, ncclEpDispatchOutputs_t);
SAME_FIELD(mb_ep_dispatch_outputs, tokens, ncclEpDispatchOutputs_t, tokens);
SAME_FIELD(mb_ep_dispatch_outputs, topk_weights, ncclEpDispatchOutputs_t, topk_weights);
SAME_FIELD(mb_ep_dispatch_outputs, scales, ncclEpDispatchOutputs_t, scales);
SAME_FIELD(mb_ep_dispatch_outputs, topk_idx, ncclEpDispatchOutputs_t, topk_idx);
EP_V1_END(mb_ep_dispatch_outputs, topk_idx, MB_NCCL_EP_DISPATCH_OUTPUTS_V1_SIZE);
SAME_LAYOUT(mb_ep_dispatch_config, ncclEpDispatchConfig_t);
SAME_FIELD(mb_ep_dispatch_config, send_only, ncclEpDispatchConfig_t, send_only);
SAME_FIELD(mb_ep_dispatch_config, round_scales, ncclEpDispatchConfig_t, round_scales);
SAME_FIELD(mb_ep_dispatch_config, pass_direction, ncclEpDispatchConfig_t, pass_direction);
SAME_FIELD(mb_ep_dispatch_config, quant_recipe, ncclEpDispatchConfig_t, quant_recipe);
EP_V1_END(mb_ep_dispatch_config, pass_direction, MB_NCCL_EP_DISPATCH_CONFIG_V1_SIZE);
EP_V1_END(mb_ep_dispatch_config, quant_recipe, MB_NCCL_EP_DISPATCH_CONFIG_V2_SIZE); // the V2 boundary: what an fp8 dispatch sends
static_assert(sizeof(ncclEpDispQuant_t) == sizeof(int), "ncclEpDispQuant_t: abi.h passes an int");
SAME_LAYOUT(mb_ep_combine_inputs, ncclEpCombineInputs_t);
SAME_FIELD(mb_ep_combine_inputs, tokens, ncclEpCombineInputs_t, tokens);
SAME_FIELD(mb_ep_combine_inputs, topk_weights, ncclEpCombineInputs_t, topk_weights);
EP_V1_END(mb_ep_combine_inputs, topk_weights, MB_NCCL_EP_COMBINE_INPUTS_V1_SIZE);
SAME_LAYOUT(mb_ep_combine_outputs, ncclEpCombineOutputs_t);
SAME_FIELD(mb_ep_combine_outputs, tokens, ncclEpCombineOutputs_t, tokens);
SAME_FIELD(mb_ep_combine_outputs, topk_weights, ncclEpCombineOutputs_t, topk_weights);
EP_V1_END(mb_ep_combine_outputs, topk_weights, MB_NCCL_EP_COMBINE_OUTPUTS_V1_SIZE);
SAME_LAYOUT(mb_ep_combine_config, ncclEpCombineConfig_t);
SAME_FIELD(mb_ep_combine_config, send_only, ncclEpCombineConfig_t, send_only);
SAME_FIELD(mb_ep_combine_config, pass_direction, ncclEpCombineConfig_t, pass_direction);
EP_V1_END(mb_ep_combine_config, pass_direction, MB_NCCL_EP_COMBINE_CONFIG_V1_SIZE);
SAME_LAYOUT(mb_lt_algo, cublasLtMatmulAlgo_t);
SAME_LAYOUT(mb_lt_heuristic, cublasLtMatmulHeuristicResult_t);
SAME_FIELD(mb_lt_heuristic, workspaceSize, cublasLtMatmulHeuristicResult_t, workspaceSize);
SAME_FIELD(mb_lt_heuristic, state, cublasLtMatmulHeuristicResult_t, state);
SAME_FIELD(mb_lt_heuristic, wavesCount, cublasLtMatmulHeuristicResult_t, wavesCount);
`)
	return b.String(), nil
}

// topLevelCommas counts the commas of s outside parentheses.
func topLevelCommas(s string) int {
	n, depth := 0, 0
	for _, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				n++
			}
		}
	}
	return n
}
