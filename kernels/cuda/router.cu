// router.cu: the router's top-k on fp32 logits [T, MB_EXPERTS] (the output of
// the logits GEMM). One warp per token; lane l holds experts l, l+32, …
// Semantics are kernels.RouterConfig's (host): softmax routers select on the
// logits and take the softmax over the k chosen; sigmoid routers select on
// sigmoid(logit) + bias and take the chosen unbiased sigmoids, renormalised
// when k > 1; group-limited routing keeps the MB_GROUP_TOPK groups whose top
// MB_TOPK/MB_GROUP_TOPK scores sum highest. With MB_PRE_SOFTMAX (softmax
// routers; Megatron's pre_softmax) the softmax over all experts comes first:
// the selection scores are its values and each choice keeps its value, not
// renormalised. Probabilities are scaled by MB_SCALE. Ties go to the lower expert index (and the lower group). Outputs
// idx [T, K] int32 (in descending selection score) and probs [T, K] fp32.
//
// Each pick is a warp-wide argmax of 32-bit keys that order as the scores
// do: two warp reductions (redux.sync, sm_80 and later) — the largest key,
// then the lowest expert holding it — instead of a chain of shuffles, since
// a token's k picks run one after another. All per-lane arrays are indexed
// by unrolled loops, so they stay in registers.
//
// Lane k keeps the k-th choice (MB_TOPK ≤ 32), so the probabilities are
// computed and stored by the first MB_TOPK lanes at once.
//
// -D: MB_EXPERTS, MB_TOPK, MB_SIGMOID (0/1), MB_PRE_SOFTMAX (0/1),
//     MB_GROUPS (0 or 1 = off), MB_GROUP_TOPK, MB_SCALE (float literal)
#include "moebench.cuh"

#define MB_PER_LANE ((MB_EXPERTS + 31) / 32)
#if MB_TOPK > 32
#error "router_topk keeps one choice per lane: MB_TOPK must be at most 32"
#endif
#define MB_NONE 0u // the key of no candidate: below every score's key

// key orders as f does (−0 as +0; scores are never NaN): positive floats
// above negative ones, negative ones in reverse bit order.
__device__ __forceinline__ unsigned score_key(float f) {
    unsigned u = __float_as_uint(f);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_score(unsigned k) { return __uint_as_float((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k); }

// warp_pick returns the expert with the largest key of the lanes' candidates
// (key, e), the lowest expert among equal keys, and sets best to its key;
// lanes without a candidate pass MB_NONE.
__device__ __forceinline__ int warp_pick(unsigned key, int e, unsigned &best) {
    best = __reduce_max_sync(MB_FULL_MASK, key);
    return (int)__reduce_min_sync(MB_FULL_MASK, key == best && key != MB_NONE ? (unsigned)e : 0xffffffffu);
}

// softmax_stats sets mx to the largest of the warp's row of logits (lane l
// holds z of experts l, l + 32, …) and den to the softmax's denominator
// Σ exp(z − mx), in every lane.
__device__ __forceinline__ void softmax_stats(const float (&z)[MB_PER_LANE], int lane, float &mx, float &den) {
    mx = -3.402823466e38f, den = 0.f;
#pragma unroll
    for (int i = 0; i < MB_PER_LANE; i++)
        if (lane + 32 * i < MB_EXPERTS) mx = fmaxf(mx, z[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(MB_FULL_MASK, mx, o));
#pragma unroll
    for (int i = 0; i < MB_PER_LANE; i++)
        if (lane + 32 * i < MB_EXPERTS) den += expf(z[i] - mx);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(MB_FULL_MASK, den, o);
}

extern "C" __global__ void router_topk(const float *logits, const float *bias, int tokens,
                                       int32 *idx, float *probs) {
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= tokens) return; // whole warps exit together: blockDim is a multiple of 32
    const float *row = logits + (long)t * MB_EXPERTS;
    float logit[MB_PER_LANE];
    unsigned key[MB_PER_LANE]; // the selection score's key; MB_NONE once chosen or ineligible
#pragma unroll
    for (int i = 0; i < MB_PER_LANE; i++) {
        const int e = lane + 32 * i;
        logit[i] = 0.f;
        key[i] = MB_NONE;
        if (e < MB_EXPERTS) {
            logit[i] = row[e];
#if MB_SIGMOID
            float s = 1.f / (1.f + expf(-logit[i]));
            if (bias != 0) s += bias[e];
#else
            float s = logit[i];
#endif
            key[i] = score_key(s);
        }
    }
#if MB_PRE_SOFTMAX
    float mx, den;
    softmax_stats(logit, lane, mx, den);
#pragma unroll
    for (int i = 0; i < MB_PER_LANE; i++)
        if (lane + 32 * i < MB_EXPERTS) key[i] = score_key(expf(logit[i] - mx) / den);
#endif
#if MB_GROUPS > 1
    {
        const int per = MB_EXPERTS / MB_GROUPS;
        float gscore[MB_GROUPS];
#pragma unroll
        for (int g = 0; g < MB_GROUPS; g++) {
            unsigned gk[MB_PER_LANE]; // group g's keys; the ones taken are cleared
#pragma unroll
            for (int i = 0; i < MB_PER_LANE; i++) gk[i] = (lane + 32 * i) / per == g ? key[i] : MB_NONE;
            gscore[g] = 0.f;
            for (int j = 0; j < MB_TOPK / MB_GROUP_TOPK; j++) {
                unsigned v = MB_NONE, best;
                int e = -1;
#pragma unroll
                for (int i = 0; i < MB_PER_LANE; i++)
                    if (gk[i] > v) { v = gk[i]; e = lane + 32 * i; }
                const int w = warp_pick(v, e, best);
                gscore[g] += key_score(best);
#pragma unroll
                for (int i = 0; i < MB_PER_LANE; i++)
                    if (lane + 32 * i == w) gk[i] = MB_NONE;
            }
        }
        bool kept[MB_PER_LANE]; // whether the slot's group is among the chosen
#pragma unroll
        for (int i = 0; i < MB_PER_LANE; i++) kept[i] = false;
        bool taken[MB_GROUPS];
#pragma unroll
        for (int g = 0; g < MB_GROUPS; g++) taken[g] = false;
        for (int j = 0; j < MB_GROUP_TOPK; j++) {
            int top = -1; // the best group not yet taken
            float ts = 0.f;
#pragma unroll
            for (int g = 0; g < MB_GROUPS; g++)
                if (!taken[g] && (top < 0 || gscore[g] > ts)) { top = g; ts = gscore[g]; }
#pragma unroll
            for (int g = 0; g < MB_GROUPS; g++) taken[g] = taken[g] || g == top;
#pragma unroll
            for (int i = 0; i < MB_PER_LANE; i++) kept[i] = kept[i] || (lane + 32 * i) / per == top;
        }
#pragma unroll
        for (int i = 0; i < MB_PER_LANE; i++)
            if (!kept[i]) key[i] = MB_NONE;
    }
#endif
    // lane k < MB_TOPK keeps the k-th choice and its logit
    int mine = -1;
    float myLogit = 0.f;
    for (int k = 0; k < MB_TOPK; k++) {
        unsigned v = MB_NONE, best;
        int e = -1;
        float lg = 0.f;
#pragma unroll
        for (int i = 0; i < MB_PER_LANE; i++)
            if (key[i] > v) { v = key[i]; e = lane + 32 * i; lg = logit[i]; }
        const int w = warp_pick(v, e, best);
#pragma unroll
        for (int i = 0; i < MB_PER_LANE; i++)
            if (lane + 32 * i == w) key[i] = MB_NONE;
        lg = __shfl_sync(MB_FULL_MASK, lg, w & 31); // lane w % 32 proposed w: its lg is w's logit
        if (lane == k) { mine = w; myLogit = lg; }
    }
    const bool chooser = lane < MB_TOPK;
#if MB_SIGMOID
    float p = chooser ? 1.f / (1.f + expf(-myLogit)) : 0.f;
#elif MB_PRE_SOFTMAX
    float p = chooser ? expf(myLogit - mx) / den : 0.f;
#else
    const float first = __shfl_sync(MB_FULL_MASK, myLogit, 0); // every lane: the first choice's, the largest logit
    float p = chooser ? expf(myLogit - first) : 0.f;
#endif
    float sum = p;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(MB_FULL_MASK, sum, o);
    if ((MB_SIGMOID && MB_TOPK == 1) || MB_PRE_SOFTMAX) sum = 1.f; // not renormalised
    if (chooser) {
        idx[(long)t * MB_TOPK + lane] = mine;
        probs[(long)t * MB_TOPK + lane] = p / sum * (float)(MB_SCALE);
    }
}

// score_backward: the backward of the probabilities router_topk computes
// (kernels.ScoreBackward): from their gradient dprobs [T, K] (in idx's
// order) and the fp32 logits [T, MB_EXPERTS] the forward scored, the
// logits' gradient dlogits [T, MB_EXPERTS], recomputing the scores as the
// forward does. g_i = MB_SCALE · dprob_i; softmax over the K chosen:
// dz_i = q_i (g_i − Σ_j q_j g_j); sigmoid: s_i = σ(z_i), with K > 1
// dz_i = (g_i − Σ_j g_j s_j / S) / S · s_i (1 − s_i), S = Σ_j s_j, with
// K = 1 dz = g s (1 − s); pre-softmax: P = softmax over all experts, G the
// g scattered to the chosen, dz_e = P_e (G_e − Σ_i P_sel_i g_i) for every e.
// Other logits get 0 (selection, group limits and the bias only select).
// One warp per token: lane i < K holds choice i; lane l holds experts l,
// l + 32, … of the row (pre-softmax). Sums are the warp's butterflies:
// another order than the host's, so results agree to fp32 rounding.
extern "C" __global__ void score_backward(const float *logits, const float *dprobs, const int32 *idx, int tokens, float *dlogits) {
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= tokens) return; // whole warps exit together: blockDim is a multiple of 32
    const float *row = logits + (long)t * MB_EXPERTS;
    float *drow = dlogits + (long)t * MB_EXPERTS;
    const bool chooser = lane < MB_TOPK;
    int sel = chooser ? idx[(long)t * MB_TOPK + lane] : -1;
    if ((unsigned)sel >= MB_EXPERTS) sel = -1; // never read or write outside the row
    const float g = chooser ? (float)(MB_SCALE)*dprobs[(long)t * MB_TOPK + lane] : 0.f;
#if MB_PRE_SOFTMAX
    float z[MB_PER_LANE];
#pragma unroll
    for (int i = 0; i < MB_PER_LANE; i++) z[i] = lane + 32 * i < MB_EXPERTS ? row[lane + 32 * i] : 0.f;
    float mx, den;
    softmax_stats(z, lane, mx, den);
    float dot = sel >= 0 ? expf(row[sel] - mx) / den * g : 0.f; // P_sel_i · g_i
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(MB_FULL_MASK, dot, o);
    float ge[MB_PER_LANE]; // G of the lane's experts
#pragma unroll
    for (int i = 0; i < MB_PER_LANE; i++) ge[i] = 0.f;
    for (int j = 0; j < MB_TOPK; j++) {
        const int sj = __shfl_sync(MB_FULL_MASK, sel, j);
        const float gj = __shfl_sync(MB_FULL_MASK, g, j);
#pragma unroll
        for (int i = 0; i < MB_PER_LANE; i++)
            if (lane + 32 * i == sj) ge[i] = gj;
    }
#pragma unroll
    for (int i = 0; i < MB_PER_LANE; i++)
        if (lane + 32 * i < MB_EXPERTS) drow[lane + 32 * i] = expf(z[i] - mx) / den * (ge[i] - dot);
#else
    for (int e = lane; e < MB_EXPERTS; e += 32) drow[e] = 0.f;
    __syncwarp(); // the zeros before the chosen's values
    const float z = sel >= 0 ? row[sel] : 0.f;
#if MB_SIGMOID
    const float s = sel >= 0 ? 1.f / (1.f + expf(-z)) : 0.f;
    float sum = s, dot = g * s;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        sum += __shfl_xor_sync(MB_FULL_MASK, sum, o);
        dot += __shfl_xor_sync(MB_FULL_MASK, dot, o);
    }
    const float ds = MB_TOPK > 1 ? (g - dot / sum) / sum : g;
    if (sel >= 0) drow[sel] = ds * s * (1.f - s);
#else
    float mx = sel >= 0 ? z : -3.402823466e38f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(MB_FULL_MASK, mx, o));
    const float e = sel >= 0 ? expf(z - mx) : 0.f;
    float sum = e;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(MB_FULL_MASK, sum, o);
    const float q = e / sum;
    float dot = q * g;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(MB_FULL_MASK, dot, o);
    if (sel >= 0) drow[sel] = q * (g - dot);
#endif
#endif
}
