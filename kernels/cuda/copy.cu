// copy.cu: copy_u4 copies n 16-byte vectors from src to dst, grid-stride:
// a copy by the SMs, the ceiling the kernel benchmark measures the row
// kernels against besides the copy engines' device copy (an SM kernel can
// beat a copy engine on one GPU's memory).
#include "moebench.cuh"

extern "C" __global__ void copy_u4(const uint4 *__restrict__ src, long n, uint4 *__restrict__ dst) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) dst[i] = src[i];
}
