// moebench.cuh: shared definitions for moebench's kernels. No toolkit headers:
// bf16 values are 16-bit integers converted with inline PTX, so the sources
// compile with any NVRTC ≥ 11.8 for sm_80 and newer. Shape constants come as
// -D options (MB_*) so that loops have fixed trip counts.
#pragma once
typedef unsigned short bf16;
typedef int int32;

__device__ __forceinline__ float bf2f(bf16 h) { return __uint_as_float(((unsigned int)h) << 16); }

// round to nearest even, as kernels.RoundBF16 on the host
__device__ __forceinline__ bf16 f2bf(float f) {
#ifdef MB_HOST // the tests' CPU build (internal/hostsim/mbhost.h): no PTX
    return mbhost_f2bf(f);
#else
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
#endif
}

#define MB_FULL_MASK 0xffffffffu

// uint4 = 8 bf16; element 2i is the low half of word i (little-endian)
__device__ __forceinline__ void unpack8(uint4 v, float f[8]) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint4 pack8(const bf16 y[8]) {
    uint4 o;
    o.x = y[0] | ((unsigned)y[1] << 16);
    o.y = y[2] | ((unsigned)y[3] << 16);
    o.z = y[4] | ((unsigned)y[5] << 16);
    o.w = y[6] | ((unsigned)y[7] << 16);
    return o;
}
