// router.cu: the router's top-k on fp32 logits [T, MB_EXPERTS] (the output of
// the logits GEMM). One warp per token; lane l holds experts l, l+32, …
// Semantics are kernels.RouterConfig's (host): softmax routers select on the
// logits and take the softmax over the k chosen; sigmoid routers select on
// sigmoid(logit) + bias and take the chosen unbiased sigmoids, renormalised
// when k > 1; group-limited routing keeps the MB_GROUP_TOPK groups whose top
// MB_TOPK/MB_GROUP_TOPK scores sum highest. Probabilities are scaled by
// MB_SCALE. Ties go to the lower expert index. Outputs idx [T, K] int32 (in
// descending selection score) and probs [T, K] fp32.
//
// -D: MB_EXPERTS, MB_TOPK, MB_SIGMOID (0/1), MB_GROUPS (0 or 1 = off),
//     MB_GROUP_TOPK, MB_SCALE (float literal)
#include "moebench.cuh"

#define MB_PER_LANE ((MB_EXPERTS + 31) / 32)
#define MB_NEG_INF (-__int_as_float(0x7f800000))

// warp argmax of (v, e): the larger value, then the lower index
__device__ __forceinline__ void warp_argmax(float &v, int &e) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(MB_FULL_MASK, v, o);
        int oe = __shfl_xor_sync(MB_FULL_MASK, e, o);
        if (ov > v || (ov == v && oe < e && oe >= 0) || e < 0) { v = ov; e = oe; }
    }
}

extern "C" __global__ void router_topk(const float *logits, const float *bias, int tokens,
                                       int32 *idx, float *probs) {
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= tokens) return; // whole warps exit together: blockDim is a multiple of 32
    const float *row = logits + (long)t * MB_EXPERTS;
    float logit[MB_PER_LANE], sel[MB_PER_LANE];
    bool eligible[MB_PER_LANE];
#pragma unroll
    for (int i = 0; i < MB_PER_LANE; i++) {
        int e = lane + 32 * i;
        eligible[i] = e < MB_EXPERTS;
        logit[i] = eligible[i] ? row[e] : 0.f;
#if MB_SIGMOID
        sel[i] = 1.f / (1.f + expf(-logit[i]));
        if (bias != 0 && eligible[i]) sel[i] += bias[e];
#else
        sel[i] = logit[i];
#endif
    }
#if MB_GROUPS > 1
    {
        const int per = MB_EXPERTS / MB_GROUPS;
        float gscore[MB_GROUPS];
        bool taken[MB_PER_LANE];
#pragma unroll
        for (int i = 0; i < MB_PER_LANE; i++) taken[i] = false;
        for (int g = 0; g < MB_GROUPS; g++) {
            gscore[g] = 0.f;
            for (int j = 0; j < MB_TOPK / MB_GROUP_TOPK; j++) {
                float v = MB_NEG_INF; int e = -1;
#pragma unroll
                for (int i = 0; i < MB_PER_LANE; i++) {
                    int x = lane + 32 * i;
                    if (eligible[i] && !taken[i] && x / per == g && (e < 0 || sel[i] > v)) { v = sel[i]; e = x; }
                }
                warp_argmax(v, e);
                gscore[g] += v;
#pragma unroll
                for (int i = 0; i < MB_PER_LANE; i++)
                    if (lane + 32 * i == e) taken[i] = true;
            }
        }
        bool keep[MB_GROUPS];
        for (int g = 0; g < MB_GROUPS; g++) keep[g] = false;
        for (int j = 0; j < MB_GROUP_TOPK; j++) {
            int best = -1;
            for (int g = 0; g < MB_GROUPS; g++)
                if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
            keep[best] = true;
        }
#pragma unroll
        for (int i = 0; i < MB_PER_LANE; i++) {
            int x = lane + 32 * i;
            if (eligible[i] && !keep[x / per]) eligible[i] = false;
        }
    }
#endif
    int chosen[MB_TOPK];
    float chosenLogit[MB_TOPK];
    for (int k = 0; k < MB_TOPK; k++) {
        float v = MB_NEG_INF; int e = -1; float lg = 0.f;
#pragma unroll
        for (int i = 0; i < MB_PER_LANE; i++)
            if (eligible[i] && (e < 0 || sel[i] > v)) { v = sel[i]; e = lane + 32 * i; }
        warp_argmax(v, e);
#pragma unroll
        for (int i = 0; i < MB_PER_LANE; i++)
            if (lane + 32 * i == e) { eligible[i] = false; lg = logit[i]; }
        // the owner lane of e broadcasts its logit
        chosenLogit[k] = __shfl_sync(MB_FULL_MASK, lg, e & 31);
        chosen[k] = e;
    }
    if (lane != 0) return;
    float p[MB_TOPK], sum = 0.f;
#if MB_SIGMOID
    for (int k = 0; k < MB_TOPK; k++) { p[k] = 1.f / (1.f + expf(-chosenLogit[k])); sum += p[k]; }
    if (MB_TOPK == 1) sum = 1.f;
#else
    float m = chosenLogit[0];
    for (int k = 1; k < MB_TOPK; k++) m = fmaxf(m, chosenLogit[k]);
    for (int k = 0; k < MB_TOPK; k++) { p[k] = expf(chosenLogit[k] - m); sum += p[k]; }
#endif
    for (int k = 0; k < MB_TOPK; k++) {
        idx[(long)t * MB_TOPK + k] = chosen[k];
        probs[(long)t * MB_TOPK + k] = p[k] / sum * (float)(MB_SCALE);
    }
}
