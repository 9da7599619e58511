package kernels

// FLOPsBytes is what one step of the layer computes and the bytes it must move
// through memory at the least (each operand read once, each result written
// once; a wgrad GEMM reads and writes its fp32 main_grad).
type FLOPsBytes struct {
	FLOPs float64
	Bytes float64
}

func (w FLOPsBytes) plus(o FLOPsBytes) FLOPsBytes {
	return FLOPsBytes{w.FLOPs + o.FLOPs, w.Bytes + o.Bytes}
}

// Storage sizes, bytes.
const (
	bf16Bytes = 2 // activations, weights, their dgrads
	fp32Bytes = 4 // probabilities and their gradients, main_grad
)

// ExpertWork is an expert MLP's work over rows token copies (hidden h,
// ffn f), forward and backward, step by step. FLOPs count the GEMMs' 2·m·n·k
// only (Megatron's convention: element-wise work is not counted); Bytes
// count every step's traffic, element-wise ones included.
type ExpertWork struct {
	FC1, SwiGLU, FC2                   FLOPsBytes // forward
	FC2DGrad, FC2WGrad, SwiGLUBackward FLOPsBytes // backward, in order
	FC1WGrad, FC1DGrad                 FLOPsBytes
}

// ExpertGEMMWork is the work of one expert over rows token copies (sum it
// over experts for a grouped GEMM: each expert's weights are read once).
// Forward: 2·rows·h·2f + 2·rows·f·h = 6·rows·h·f FLOPs; dgrad and wgrad
// each the same again, so the backward is twice the forward.
func ExpertGEMMWork(rows, h, f int) ExpertWork {
	n, H, F := float64(rows), float64(h), float64(f)
	act := func(cols float64) float64 { return n * cols * bf16Bytes } // rows×cols bf16
	w1, w2 := 2*F*H*bf16Bytes, H*F*bf16Bytes                          // fc1 [2f,h], fc2 [h,f]
	return ExpertWork{
		FC1:    FLOPsBytes{2 * n * H * 2 * F, act(H) + w1 + act(2*F)},
		SwiGLU: FLOPsBytes{0, act(2*F) + n*fp32Bytes + act(F)},
		FC2:    FLOPsBytes{2 * n * F * H, act(F) + w2 + act(H)},
		// dact = dy·fc2; dFC2 += dyᵀ·act
		FC2DGrad: FLOPsBytes{2 * n * H * F, act(H) + w2 + act(F)},
		FC2WGrad: FLOPsBytes{2 * n * H * F, act(H) + act(F) + 2*H*F*fp32Bytes},
		// dh1, dprob from dact, h1, prob
		SwiGLUBackward: FLOPsBytes{0, act(F) + act(2*F) + n*fp32Bytes + act(2*F) + n*fp32Bytes},
		// dFC1 += dh1ᵀ·x; dx = dh1·fc1
		FC1WGrad: FLOPsBytes{2 * n * 2 * F * H, act(2*F) + act(H) + 2*2*F*H*fp32Bytes},
		FC1DGrad: FLOPsBytes{2 * n * 2 * F * H, act(2*F) + w1 + act(H)},
	}
}

// Forward is the forward's total.
func (w ExpertWork) Forward() FLOPsBytes { return w.FC1.plus(w.SwiGLU).plus(w.FC2) }

// Backward is the backward's total.
func (w ExpertWork) Backward() FLOPsBytes {
	return w.FC2DGrad.plus(w.FC2WGrad).plus(w.SwiGLUBackward).plus(w.FC1WGrad).plus(w.FC1DGrad)
}

// DGrad and WGrad are the backward's two GEMM halves.
func (w ExpertWork) DGrad() FLOPsBytes { return w.FC2DGrad.plus(w.FC1DGrad) }
func (w ExpertWork) WGrad() FLOPsBytes { return w.FC2WGrad.plus(w.FC1WGrad) }

// LayerGEMMFLOPs is the expert GEMM work of one step of the layer, forward
// and backward, for copies routed token copies and tokens tokens (all ranks
// or one rank's, as the caller counts), hidden h, expert ffn f, and shared
// ffn fs (f × shared experts; 0 for none). forward + backward equals
// Megatron-Core's num_floating_point_operations for an MoE layer,
// 3·2·h·(f·k + fs)·3 per token with copies = tokens·k (GEMMFormula).
func LayerGEMMFLOPs(copies, tokens, h, f, fs int) (forward, backward float64) {
	routed, shared := ExpertGEMMWork(copies, h, f), ExpertGEMMWork(tokens, h, fs)
	return routed.Forward().FLOPs + shared.Forward().FLOPs, routed.Backward().FLOPs + shared.Backward().FLOPs
}

// GEMMFormula states how LayerGEMMFLOPs counts, for records.
const GEMMFormula = "expert GEMMs only, 2·m·n·k each: forward 6·hidden·ffn per routed token copy " +
	"(fc1 h→2f, fc2 f→h) + 6·hidden·ffn·shared_experts per token; backward twice that " +
	"(dgrad and wgrad of fc1 and fc2); forward + backward = Megatron-Core's 3·2·h·(f·k + f_shared)·3 " +
	"per token; the router GEMM (2·T·E·h forward, twice that backward) is not counted"

// RouterGEMMWork is the router GEMM's work over tokens tokens: the forward
// logits = x·Wrᵀ (bf16 x and Wr, fp32 logits) and its backward dgrad and
// wgrad (fp32 dlogits; bf16 results).
func RouterGEMMWork(tokens, h, experts int) (forward, backward FLOPsBytes) {
	T, H, E := float64(tokens), float64(h), float64(experts)
	x, wr, logits := T*H*bf16Bytes, E*H*bf16Bytes, T*E*fp32Bytes
	forward = FLOPsBytes{2 * T * E * H, x + wr + logits}
	backward = FLOPsBytes{4 * T * E * H, (logits + wr + x) + (logits + x + wr)}
	return forward, backward
}

// GradRowBytes is what one token copy's gradient moves between ranks in
// the backward: the combine's backward sends its output gradient (a bf16
// row), the dispatch's backward its input gradient (a bf16 row) and the
// probability's gradient (fp32), as alltoall's second all-to-all and DeepEP's
// combine of topk_weights do.
func GradRowBytes(h int) (combineBackward, dispatchBackward int64) {
	row := int64(h) * bf16Bytes
	return row, row + fp32Bytes
}

// ExpertWGradBytes is one expert's weight gradients in fp32 (fc1 [2f,h] and
// fc2 [h,f]): what a helper that computed part of another rank's expert
// (FEPLB's phase 2) returns to the owner in the backward, to be added to
// its main_grad. Twice the bf16 weight bytes the forward moved.
func ExpertWGradBytes(h, f int) int64 { return 3 * int64(h) * int64(f) * fp32Bytes }

// SavedBytes is what the forward keeps for the backward on one rank, beyond
// its input x: for each of the copies rows its experts computed, the expert
// input row (bf16 h), the fc1 output (bf16 2f), the activation (bf16 f) and
// the probability (fp32); for each of its tokens, the scores logits the
// score function's backward reads (fp32: RouterConfig.SavedScores) and the
// shared expert's fc1 output and activation (bf16 3fs). The dispatcher's
// row maps and counts are its own footprint.
func SavedBytes(copies, tokens, h, f, fs, scores int) int64 {
	perCopy := int64(h+2*f+f)*bf16Bytes + fp32Bytes
	perToken := int64(scores)*fp32Bytes + int64(3*fs)*bf16Bytes
	return int64(copies)*perCopy + int64(tokens)*perToken
}

// SavedScores is how many of a token's logits the score function's
// backward reads: its k chosen experts', or every expert's when the softmax
// over all of them comes first (PreSoftmax).
func (c RouterConfig) SavedScores() int {
	if c.UsesPreSoftmax() {
		return c.Experts
	}
	return c.TopK
}
