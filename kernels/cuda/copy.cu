// copy.cu: copy_u4 copies n 16-byte vectors from src to dst, grid-stride:
// a copy by the SMs, the ceiling the kernel benchmark measures the row
// kernels against besides the copy engines' device copy (an SM kernel can
// beat a copy engine on one GPU's memory). copy_rows_u32 is a 2-D copy of
// 32-bit words.
#include "moebench.cuh"

extern "C" __global__ void copy_u4(const uint4 *__restrict__ src, long n, uint4 *__restrict__ dst) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) dst[i] = src[i];
}

// copy_rows_u32 copies rows of width 32-bit words, row r from src + r·spitch
// to dst + r·dpitch (pitches in words; n = rows·width < 2³¹), grid-stride:
// a 2-D copy in one launch where one copy a row would queue rows copies
// (the padded FP8 GEMM's multipliers, re-strided to the padded m).
extern "C" __global__ void copy_rows_u32(const unsigned *__restrict__ src, int spitch, unsigned *__restrict__ dst, int dpitch, int width, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const int r = i / width, w = i - r * width;
        dst[(long)r * dpitch + w] = src[(long)r * spitch + w];
    }
}
