package device

import (
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
)

// The backward's kernels on CUDA (devbackward.go says what each computes):
// swiglu.cu's swiglu_prob_bwd, router.cu's score_backward, gradadd.cu's
// input_grad and add_f32. MatMul is gpu.go's.

// SwiGLUBackward: swiglu_prob_bwd, one warp per row.
func (c *CUDA) SwiGLUBackward(dh1, dprob, dact, h1, prob Addr, n, ffn int, s Stream) error {
	if n == 0 {
		return nil
	}
	const warps = FlatBlock / 32
	grid := min((n+warps-1)/warps, 16*c.SMs)
	return c.launch(kernelKey{file: "swiglu.cu", name: "swiglu_prob_bwd", c: [5]int{ffn}}, grid, FlatBlock, s,
		cuda.P(h1), cuda.P(prob), cuda.P(dact), cuda.I32(int32(n)), cuda.P(dh1), cuda.P(dprob))
}

// ScoreBackward: score_backward with router_topk's constants, one warp per
// token.
func (c *CUDA) ScoreBackward(rc kernels.RouterConfig, dlogits, logits, dprobs, idx Addr, tokens int, s Stream) error {
	if tokens == 0 {
		return nil
	}
	k := routerKey(rc)
	k.name = "score_backward"
	return c.launch(k, (tokens+RouterWarps-1)/RouterWarps, 32*RouterWarps, s,
		cuda.P(logits), cuda.P(dprobs), cuda.P(idx), cuda.I32(int32(tokens)), cuda.P(dlogits))
}

// flatGrid is the grid of a grid-stride kernel over items work items of
// flatBlock threads, at most 16 blocks per SM.
func (c *CUDA) flatGrid(items int) int { return max(1, min((items+FlatBlock-1)/FlatBlock, 16*c.SMs)) }

// InputGrad: gradadd.cu's input_grad, 8 values a work item.
func (c *CUDA) InputGrad(dx, dperm, drouter, dshared Addr, n int, s Stream) error {
	if n == 0 {
		return nil
	}
	return c.launch(kernelKey{file: "gradadd.cu", name: "input_grad"}, c.flatGrid((n+7)/8), FlatBlock, s,
		cuda.P(dperm), cuda.P(drouter), cuda.P(dshared), cuda.I64(int64(n)), cuda.P(dx))
}

// AddF32: gradadd.cu's add_f32, 4 values a work item.
func (c *CUDA) AddF32(dst, src Addr, n int, round bool, s Stream) error {
	if n == 0 {
		return nil
	}
	r := int32(0)
	if round {
		r = 1
	}
	return c.launch(kernelKey{file: "gradadd.cu", name: "add_f32"}, c.flatGrid((n+3)/4), FlatBlock, s,
		cuda.P(dst), cuda.P(src), cuda.I64(int64(n)), cuda.I32(r))
}
