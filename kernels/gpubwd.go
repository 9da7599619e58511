package kernels

import "github.com/moebench/moebench/internal/cuda"

// The backward's kernels on CUDA (devbackward.go says what each computes):
// swiglu.cu's swiglu_prob_bwd, router.cu's score_backward, gradadd.cu's
// input_grad and add_f32. MatMul is gpu.go's.

// SwiGLUBackward: swiglu_prob_bwd, one warp per row.
func (c *CUDA) SwiGLUBackward(dh1, dprob, dact, h1, prob Ptr, n, ffn int, s Stream) error {
	if n == 0 {
		return nil
	}
	const warps = flatBlock / 32
	grid := min((n+warps-1)/warps, 16*c.SMs)
	return c.launch(kernelKey{file: "swiglu.cu", name: "swiglu_prob_bwd", c: [5]int{ffn}}, grid, flatBlock, s,
		cuda.P(h1), cuda.P(prob), cuda.P(dact), cuda.I32(int32(n)), cuda.P(dh1), cuda.P(dprob))
}

// ScoreBackward: score_backward with router_topk's constants, one warp per
// token.
func (c *CUDA) ScoreBackward(rc RouterConfig, dlogits, logits, dprobs, idx Ptr, tokens int, s Stream) error {
	if tokens == 0 {
		return nil
	}
	k := routerKey(rc)
	k.name = "score_backward"
	return c.launch(k, (tokens+routerWarps-1)/routerWarps, 32*routerWarps, s,
		cuda.P(logits), cuda.P(dprobs), cuda.P(idx), cuda.I32(int32(tokens)), cuda.P(dlogits))
}

// flatGrid is the grid of a grid-stride kernel over items work items of
// flatBlock threads, at most 16 blocks per SM.
func (c *CUDA) flatGrid(items int) int { return max(1, min((items+flatBlock-1)/flatBlock, 16*c.SMs)) }

// InputGrad: gradadd.cu's input_grad, 8 values a work item.
func (c *CUDA) InputGrad(dx, dperm, drouter, dshared Ptr, n int, s Stream) error {
	if n == 0 {
		return nil
	}
	return c.launch(kernelKey{file: "gradadd.cu", name: "input_grad"}, c.flatGrid((n+7)/8), flatBlock, s,
		cuda.P(dperm), cuda.P(drouter), cuda.P(dshared), cuda.I64(int64(n)), cuda.P(dx))
}

// AddF32: gradadd.cu's add_f32, 4 values a work item.
func (c *CUDA) AddF32(dst, src Ptr, n int, round bool, s Stream) error {
	if n == 0 {
		return nil
	}
	r := int32(0)
	if round {
		r = 1
	}
	return c.launch(kernelKey{file: "gradadd.cu", name: "add_f32"}, c.flatGrid((n+3)/4), flatBlock, s,
		cuda.P(dst), cuda.P(src), cuda.I64(int64(n)), cuda.I32(r))
}
