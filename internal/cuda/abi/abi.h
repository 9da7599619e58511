// abi.h: moebench's prototypes of the CUDA driver, NVRTC, cuBLASLt, cuBLAS,
// NCCL and NCCL EP entry points it opens with dlopen — no CUDA header is needed
// to build moebench. Handles are void *, CUdevice and enums int, CUdeviceptr
// unsigned long long (mb_dptr); every result is an int.
//
// Each list entry is F(return type, name, (parameters), (arguments)), or
// F0(return type, name) for an entry point without parameters. This header
// makes, per entry point NAME:
//   - typedef R (*mb_NAME)(parameters): the pointer type it is called through;
//   - static inline R mbcall_NAME(void *f, parameters): the call through f
//     (what cgo code calls: Go cannot call a C function pointer);
//   - with MB_ABI_DECLARE defined, the declaration R NAME(parameters), so that
//     a fake library (internal/hostsim/fakes) whose definition differs does
//     not compile.
// internal/cuda's TestABIHeaders compiles every mb_NAME against the real
// headers (CUDA 11.8's cuda.h, nvrtc.h, cublasLt.h, cublas_api.h; for what
// 11.8 lacks, NCCL's and NCCL EP's, declarations of newer headers
// transcribed with their source) and fails on any difference in argument
// count, size or kind, and on any struct below whose size or offsets differ.
#ifndef MOEBENCH_ABI_H
#define MOEBENCH_ABI_H
#include <stddef.h>
#include <stdint.h>

typedef unsigned long long mb_dptr; // CUdeviceptr

// Values the C code below and internal/cuda pass (checked like the rest).
#define MB_LAUNCH_ATTRIBUTE_COOPERATIVE 2       // CU_LAUNCH_ATTRIBUTE_COOPERATIVE
#define MB_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION 4 // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
#define MB_MEMCPY_SRC_ACCESS_ORDER_STREAM 1     // CU_MEMCPY_SRC_ACCESS_ORDER_STREAM (12.8)
#define MB_MEM_LOCATION_TYPE_DEVICE 1           // CU_MEM_LOCATION_TYPE_DEVICE

// CUlaunchAttribute (CUDA 11.8+): an id, padding to 8 bytes, a 64-byte value
// union whose members include pointers (CUaccessPolicyWindow, CUevent), so
// 8-byte aligned; ids 2 (cooperative) and 4 (cluster dimension) are used.
typedef struct {
    int id;
    char pad[4];
    union {
        char pad[64];
        void *align; // the union's pointer members make it 8-byte aligned
        int cooperative;
        struct { unsigned x, y, z; } cluster;
    } value;
} mb_launch_attr;

// CUlaunchConfig (CUDA 11.8+).
typedef struct {
    unsigned gridX, gridY, gridZ, blockX, blockY, blockZ, sharedBytes;
    void *stream;
    mb_launch_attr *attrs;
    unsigned numAttrs;
} mb_launch_config;

// CUmemLocation and CUmemcpyAttributes (CUDA 12.8+).
typedef struct { int type, id; } mb_mem_location;
typedef struct {
    int srcAccessOrder;
    mb_mem_location srcLocHint, dstLocHint;
    unsigned flags;
} mb_memcpy_attrs;

// cublasLtMatmulAlgo_t and cublasLtMatmulHeuristicResult_t.
typedef struct { uint64_t data[8]; } mb_lt_algo;
typedef struct {
    mb_lt_algo algo;
    size_t workspaceSize;
    int state;
    float wavesCount;
    int reserved[4];
} mb_lt_heuristic;

// The CUDA driver (libcuda.so.1).
#define MB_DRIVER_API(F, F0) \
    F(int, cuInit, (unsigned flags), (flags)) \
    F(int, cuDriverGetVersion, (int *version), (version)) \
    F(int, cuDeviceGetCount, (int *count), (count)) \
    F(int, cuDeviceGet, (int *device, int ordinal), (device, ordinal)) \
    F(int, cuDeviceGetName, (char *name, int len, int device), (name, len, device)) \
    F(int, cuDeviceGetPCIBusId, (char *id, int len, int device), (id, len, device)) \
    F(int, cuDeviceGetAttribute, (int *value, int attr, int device), (value, attr, device)) \
    F(int, cuDeviceTotalMem_v2, (size_t *bytes, int device), (bytes, device)) \
    F(int, cuDeviceCanAccessPeer, (int *can, int device, int peer), (can, device, peer)) \
    F(int, cuDevicePrimaryCtxRetain, (void **ctx, int device), (ctx, device)) \
    F(int, cuDevicePrimaryCtxRelease_v2, (int device), (device)) \
    F(int, cuCtxSetCurrent, (void *ctx), (ctx)) \
    F0(int, cuCtxSynchronize) \
    F(int, cuCtxEnablePeerAccess, (void *peer, unsigned flags), (peer, flags)) \
    F(int, cuCtxGetStreamPriorityRange, (int *least, int *greatest), (least, greatest)) \
    F(int, cuStreamCreateWithPriority, (void **stream, unsigned flags, int priority), (stream, flags, priority)) \
    F(int, cuStreamDestroy_v2, (void *stream), (stream)) \
    F(int, cuStreamSynchronize, (void *stream), (stream)) \
    F(int, cuStreamWaitEvent, (void *stream, void *event, unsigned flags), (stream, event, flags)) \
    F(int, cuEventCreate, (void **event, unsigned flags), (event, flags)) \
    F(int, cuEventDestroy_v2, (void *event), (event)) \
    F(int, cuEventRecord, (void *event, void *stream), (event, stream)) \
    F(int, cuEventSynchronize, (void *event), (event)) \
    F(int, cuEventElapsedTime, (float *ms, void *start, void *end), (ms, start, end)) \
    F(int, cuEventElapsedTime_v2, (float *ms, void *start, void *end), (ms, start, end)) \
    F(int, cuMemAlloc_v2, (mb_dptr *ptr, size_t bytes), (ptr, bytes)) \
    F(int, cuMemFree_v2, (mb_dptr ptr), (ptr)) \
    F(int, cuMemGetInfo_v2, (size_t *free, size_t *total), (free, total)) \
    F(int, cuMemHostAlloc, (void **ptr, size_t bytes, unsigned flags), (ptr, bytes, flags)) \
    F(int, cuMemHostGetDevicePointer_v2, (mb_dptr *dptr, void *ptr, unsigned flags), (dptr, ptr, flags)) \
    F(int, cuMemFreeHost, (void *ptr), (ptr)) \
    F(int, cuMemcpyHtoDAsync_v2, (mb_dptr dst, const void *src, size_t bytes, void *stream), (dst, src, bytes, stream)) \
    F(int, cuMemcpyDtoHAsync_v2, (void *dst, mb_dptr src, size_t bytes, void *stream), (dst, src, bytes, stream)) \
    F(int, cuMemcpyDtoDAsync_v2, (mb_dptr dst, mb_dptr src, size_t bytes, void *stream), (dst, src, bytes, stream)) \
    F(int, cuMemcpyPeerAsync, (mb_dptr dst, void *dstCtx, mb_dptr src, void *srcCtx, size_t bytes, void *stream), \
      (dst, dstCtx, src, srcCtx, bytes, stream)) \
    F(int, cuMemcpyBatchAsync, (mb_dptr *dsts, mb_dptr *srcs, size_t *sizes, size_t count, mb_memcpy_attrs *attrs, \
      size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, void *stream), \
      (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, stream)) \
    F(int, cuMemcpyBatchAsync_v2, (mb_dptr *dsts, mb_dptr *srcs, size_t *sizes, size_t count, mb_memcpy_attrs *attrs, \
      size_t *attrsIdxs, size_t numAttrs, void *stream), (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, stream)) \
    F(int, cuMemsetD16Async, (mb_dptr dst, unsigned short value, size_t count, void *stream), (dst, value, count, stream)) \
    F(int, cuModuleLoadData, (void **module, const void *image), (module, image)) \
    F(int, cuModuleUnload, (void *module), (module)) \
    F(int, cuModuleGetFunction, (void **fn, void *module, const char *name), (fn, module, name)) \
    F(int, cuFuncSetAttribute, (void *fn, int attr, int value), (fn, attr, value)) \
    F(int, cuFuncGetAttribute, (int *value, int attr, void *fn), (value, attr, fn)) \
    F(int, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, (int *blocks, void *fn, int blockSize, size_t dynSmem, \
      unsigned flags), (blocks, fn, blockSize, dynSmem, flags)) \
    F(int, cuLaunchKernel, (void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
      unsigned smem, void *stream, void **params, void **extra), (fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra)) \
    F(int, cuLaunchCooperativeKernel, (void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
      unsigned bz, unsigned smem, void *stream, void **params), (fn, gx, gy, gz, bx, by, bz, smem, stream, params)) \
    F(int, cuLaunchKernelEx, (const mb_launch_config *config, void *fn, void **params, void **extra), \
      (config, fn, params, extra)) \
    F(int, cuStreamBeginCapture_v2, (void *stream, int mode), (stream, mode)) \
    F(int, cuStreamEndCapture, (void *stream, void **graph), (stream, graph)) \
    F(int, cuGraphInstantiateWithFlags, (void **exec, void *graph, unsigned long long flags), (exec, graph, flags)) \
    F(int, cuGraphLaunch, (void *exec, void *stream), (exec, stream)) \
    F(int, cuGraphExecDestroy, (void *exec), (exec)) \
    F(int, cuGraphDestroy, (void *graph), (graph)) \
    F(int, cuEventRecordWithFlags, (void *event, void *stream, unsigned flags), (event, stream, flags)) \
    F(int, cuGetErrorName, (int error, const char **name), (error, name))

// NVRTC (libnvrtc.so.*).
#define MB_NVRTC_API(F, F0) \
    F(int, nvrtcVersion, (int *major, int *minor), (major, minor)) \
    F(int, nvrtcGetNumSupportedArchs, (int *count), (count)) \
    F(int, nvrtcGetSupportedArchs, (int *archs), (archs)) \
    F(int, nvrtcCreateProgram, (void **prog, const char *src, const char *name, int numHeaders, \
      const char *const *headers, const char *const *includeNames), (prog, src, name, numHeaders, headers, includeNames)) \
    F(int, nvrtcCompileProgram, (void *prog, int numOptions, const char *const *options), (prog, numOptions, options)) \
    F(int, nvrtcGetProgramLogSize, (void *prog, size_t *size), (prog, size)) \
    F(int, nvrtcGetProgramLog, (void *prog, char *log), (prog, log)) \
    F(int, nvrtcGetCUBINSize, (void *prog, size_t *size), (prog, size)) \
    F(int, nvrtcGetCUBIN, (void *prog, char *cubin), (prog, cubin)) \
    F(int, nvrtcGetPTXSize, (void *prog, size_t *size), (prog, size)) \
    F(int, nvrtcGetPTX, (void *prog, char *ptx), (prog, ptx)) \
    F(int, nvrtcDestroyProgram, (void **prog), (prog)) \
    F(const char *, nvrtcGetErrorString, (int result), (result))

// cuBLASLt (libcublasLt.so.*).
#define MB_CUBLASLT_API(F, F0) \
    F(int, cublasLtCreate, (void **handle), (handle)) \
    F(int, cublasLtDestroy, (void *handle), (handle)) \
    F0(size_t, cublasLtGetVersion) \
    F(int, cublasLtMatmulDescCreate, (void **desc, int computeType, int scaleType), (desc, computeType, scaleType)) \
    F(int, cublasLtMatmulDescDestroy, (void *desc), (desc)) \
    F(int, cublasLtMatmulDescSetAttribute, (void *desc, int attr, const void *buf, size_t size), (desc, attr, buf, size)) \
    F(int, cublasLtMatrixLayoutCreate, (void **layout, int type, uint64_t rows, uint64_t cols, int64_t ld), \
      (layout, type, rows, cols, ld)) \
    F(int, cublasLtMatrixLayoutDestroy, (void *layout), (layout)) \
    F(int, cublasLtMatmulPreferenceCreate, (void **pref), (pref)) \
    F(int, cublasLtMatmulPreferenceDestroy, (void *pref), (pref)) \
    F(int, cublasLtMatmulPreferenceSetAttribute, (void *pref, int attr, const void *buf, size_t size), (pref, attr, buf, size)) \
    F(int, cublasLtMatmulAlgoGetHeuristic, (void *handle, void *op, void *a, void *b, void *c, void *d, void *pref, \
      int requested, mb_lt_heuristic *results, int *returned), (handle, op, a, b, c, d, pref, requested, results, returned)) \
    F(int, cublasLtMatmul, (void *handle, void *desc, const void *alpha, const void *A, void *Adesc, const void *B, \
      void *Bdesc, const void *beta, const void *C, void *Cdesc, void *D, void *Ddesc, const mb_lt_algo *algo, \
      void *workspace, size_t workspaceSize, void *stream), \
      (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, workspaceSize, stream))

// cuBLAS (libcublas.so.*): the grouped GEMM (12.5+) and what it needs.
#define MB_CUBLAS_API(F, F0) \
    F(int, cublasCreate_v2, (void **handle), (handle)) \
    F(int, cublasDestroy_v2, (void *handle), (handle)) \
    F(int, cublasGetVersion_v2, (void *handle, int *version), (handle, version)) \
    F(int, cublasSetStream_v2, (void *handle, void *stream), (handle, stream)) \
    F(int, cublasSetWorkspace_v2, (void *handle, void *workspace, size_t bytes), (handle, workspace, bytes)) \
    F(int, cublasGemmGroupedBatchedEx, (void *handle, const int *transa, const int *transb, const int *m, const int *n, \
      const int *k, const void *alpha, const void *const *A, int Atype, const int *lda, const void *const *B, int Btype, \
      const int *ldb, const void *beta, void *const *C, int Ctype, const int *ldc, int groups, const int *groupSize, \
      int computeType), (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, \
      groups, groupSize, computeType))

// ncclUniqueId: the 128 bytes that name a communicator's ranks.
typedef struct { char internal[128]; } mb_nccl_id;

// NCCL (libnccl.so.2).
#define MB_NCCL_API(F, F0) \
    F(int, ncclGetVersion, (int *version), (version)) \
    F(int, ncclGetUniqueId, (mb_nccl_id *id), (id)) \
    F(int, ncclCommInitRank, (void **comm, int nranks, mb_nccl_id id, int rank), (comm, nranks, id, rank)) \
    F(int, ncclCommDestroy, (void *comm), (comm)) \
    F0(int, ncclGroupStart) \
    F0(int, ncclGroupEnd) \
    F(int, ncclSend, (const void *buf, size_t count, int type, int peer, void *comm, void *stream), \
      (buf, count, type, peer, comm, stream)) \
    F(int, ncclRecv, (void *buf, size_t count, int type, int peer, void *comm, void *stream), \
      (buf, count, type, peer, comm, stream)) \
    F(const char *, ncclGetErrorString, (int result), (result)) \
    F(const char *, ncclGetLastError, (void *comm), (comm))

// NCCL EP (libnccl_ep.so.0, NVIDIA/nccl-extensions' nccl_ep): every struct
// starts with its size and a magic number, and is append-only: a library
// reads only the bytes a struct's size covers, and accepts any size from
// the frozen V1 boundary on. moebench lays the structs out whole (the ABI
// check compares them with the header's) and sends the V1 sizes, which
// every library of this API accepts, except the dispatch config of an fp8
// dispatch, sent at its V2 size for its quant_recipe.
#define MB_NCCL_EP_MAGIC 0xC00FFFEEu
#define MB_NCCL_EP_TENSOR_MAGIC 0xCAFECAFEu
#define MB_NCCL_EP_API_VERSION 2
#define MB_NCCL_EP_GROUP_CONFIG_V1_SIZE 96u
#define MB_NCCL_EP_LAYOUT_INFO_V1_SIZE 40u
#define MB_NCCL_EP_TENSOR_V1_SIZE 48u
#define MB_NCCL_EP_HANDLE_CONFIG_V1_SIZE 16u
#define MB_NCCL_EP_DISPATCH_INPUTS_V1_SIZE 32u
#define MB_NCCL_EP_DISPATCH_OUTPUTS_V1_SIZE 40u
#define MB_NCCL_EP_DISPATCH_CONFIG_V1_SIZE 20u
#define MB_NCCL_EP_DISPATCH_CONFIG_V2_SIZE 24u // with quant_recipe: sent only with a recipe
#define MB_NCCL_EP_COMBINE_INPUTS_V1_SIZE 24u
#define MB_NCCL_EP_COMBINE_OUTPUTS_V1_SIZE 24u
#define MB_NCCL_EP_COMBINE_CONFIG_V1_SIZE 16u
#define MB_NCCL_EP_ALGO_LOW_LATENCY 0
#define MB_NCCL_EP_ALGO_HIGH_THROUGHPUT 1
#define MB_NCCL_EP_LAYOUT_EXPERT_MAJOR 1
#define MB_NCCL_EP_AUTO 0
// ncclEpDispQuant_t (the dispatch config's quant_recipe, API version 2)
#define MB_NCCL_EP_DISP_QUANT_NONE 0
#define MB_NCCL_EP_DISP_QUANT_FWD 1
#define MB_NCCL_EP_DISP_QUANT_DS_FP8E3M4 2
// ncclDataType_t values moebench passes (nccl.h)
#define MB_ncclInt32 2
#define MB_ncclFloat32 7
#define MB_ncclBfloat16 9
#define MB_ncclFloat8e4m3 10

// ncclEpTensor_t: a descriptor of caller-owned device memory (sizes too).
typedef struct {
    unsigned size, magic, ndim;
    int datatype;
    void *data;
    void *win;           // ncclWindow_t: none
    uint64_t win_offset;
    size_t *sizes;
} mb_ep_tensor;

// ncclEpGroupConfig_t (V1: up to timeout_ns; V2 adds the rest).
typedef struct {
    unsigned size, magic, version;
    int algorithm;
    unsigned num_experts, max_dispatch_tokens_per_rank, max_recv_tokens_per_rank, max_token_bytes;
    unsigned long rdma_buffer_size;
    unsigned num_qp_per_rank, num_channels, max_num_sms;
    struct { void *alloc_fn, *free_fn, *context; } alloc;
    unsigned enable_mask;
    uint64_t timeout_ns;
    int zero_copy, overflow_policy;
    unsigned num_topk;
    unsigned char padding_v2[4];
} mb_ep_group_config;

// ncclEpLayoutInfo_t (V1: up to recv_total_counter).
typedef struct {
    unsigned size, magic;
    mb_ep_tensor *expert_counters, *src_rank_counters, *expert_offsets, *recv_total_counter;
    int recv_topk_idx_kind;
    unsigned char padding_v2[4];
} mb_ep_layout_info;

// ncclEpHandleConfig_t.
typedef struct { unsigned size, magic; size_t dispatch_output_per_expert_alignment; } mb_ep_handle_config;

// ncclEpDispatchInputs_t, ncclEpDispatchOutputs_t.
typedef struct { unsigned size, magic; mb_ep_tensor *tokens, *topk_weights, *scales; } mb_ep_dispatch_inputs;
typedef struct { unsigned size, magic; mb_ep_tensor *tokens, *topk_weights, *scales, *topk_idx; } mb_ep_dispatch_outputs;

// ncclEpDispatchConfig_t (V1: up to pass_direction; V2: quant_recipe).
typedef struct { unsigned size, magic, send_only, round_scales; int pass_direction, quant_recipe; } mb_ep_dispatch_config;

// ncclEpCombineInputs_t (V1: up to topk_weights), ncclEpCombineOutputs_t.
typedef struct { unsigned size, magic; mb_ep_tensor *tokens, *topk_weights, *scales; } mb_ep_combine_inputs;
typedef struct { unsigned size, magic; mb_ep_tensor *tokens, *topk_weights; } mb_ep_combine_outputs;

// ncclEpCombineConfig_t (V1: up to pass_direction).
typedef struct { unsigned size, magic, send_only; int pass_direction, quant_recipe; } mb_ep_combine_config;

#define MB_NCCL_EP_API(F, F0) \
    F(int, ncclEpGetVersion, (int *version), (version)) \
    F(int, ncclEpCreateGroup, (void **group, void *comm, const mb_ep_group_config *config), (group, comm, config)) \
    F(int, ncclEpGroupDestroy, (void *group), (group)) \
    F(int, ncclEpInitHandle, (void **handle, void *group, int layout, const mb_ep_handle_config *config, int num_topk, \
      const mb_ep_tensor *handle_mem), (handle, group, layout, config, num_topk, handle_mem)) \
    F(int, ncclEpUpdateHandle, (void *handle, const mb_ep_tensor *topk_idx, const mb_ep_layout_info *layout_info, void *stream), \
      (handle, topk_idx, layout_info, stream)) \
    F(int, ncclEpHandleDestroy, (void *handle), (handle)) \
    F(int, ncclEpDispatch, (void *handle, const mb_ep_dispatch_inputs *inputs, const mb_ep_dispatch_outputs *outputs, \
      const mb_ep_layout_info *layout_info, const mb_ep_dispatch_config *config, void *stream), \
      (handle, inputs, outputs, layout_info, config, stream)) \
    F(int, ncclEpCombine, (void *handle, const mb_ep_combine_inputs *inputs, const mb_ep_combine_outputs *outputs, \
      const mb_ep_combine_config *config, void *stream), (handle, inputs, outputs, config, stream))

#define MB_ALL_APIS(F, F0) \
    MB_DRIVER_API(F, F0) MB_NVRTC_API(F, F0) MB_CUBLASLT_API(F, F0) MB_CUBLAS_API(F, F0) MB_NCCL_API(F, F0) \
    MB_NCCL_EP_API(F, F0)

#define MB_UNPAREN(...) __VA_ARGS__
#define MB_TYPEDEF(R, name, params, args) typedef R (*mb_##name) params;
#define MB_TYPEDEF0(R, name) typedef R (*mb_##name)(void);
MB_ALL_APIS(MB_TYPEDEF, MB_TYPEDEF0)

#ifdef MB_ABI_DECLARE
#define MB_DECLARE(R, name, params, args) R name params;
#define MB_DECLARE0(R, name) R name(void);
MB_ALL_APIS(MB_DECLARE, MB_DECLARE0)
#else
#define MB_CALL(R, name, params, args) \
    static inline R mbcall_##name(void *mb_f, MB_UNPAREN params) { return ((mb_##name)mb_f) args; }
#define MB_CALL0(R, name) \
    static inline R mbcall_##name(void *mb_f) { return ((mb_##name)mb_f)(); }
MB_ALL_APIS(MB_CALL, MB_CALL0)
#endif

#endif
