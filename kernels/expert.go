package kernels

import "math"

// Expert MLP weights use a linear layer's [out,in] layout:
//   fc1 [2f, h]: rows 0..f-1 are the gate projection, rows f..2f-1 the up projection;
//   fc2 [h, f].

// SwiGLUProb computes act[i,j] = silu(g[i,j]) · u[i,j] · prob[i] for the rows
// of h1 [n, 2f] = [g | u]; prob nil means 1 (the shared expert).
func SwiGLUProb[F Float32Or64](act, h1, prob []F, n, f int) {
	for i := range n {
		p := F(1)
		if prob != nil {
			p = prob[i]
		}
		g, u, a := h1[i*2*f:i*2*f+f], h1[i*2*f+f:(i+1)*2*f], act[i*f:(i+1)*f]
		for j := range a {
			x := float64(g[j])
			a[j] = F(x/(1+math.Exp(-x))) * u[j] * p
		}
	}
}

// ExpertForward runs one expert on its n rows x [n,h] with routing
// probabilities prob [n] (nil: 1) and writes y [n,h] = fc2 · (prob ·
// SwiGLU(fc1 · x)), Megatron's order. round, if not nil, is applied to each
// stored intermediate (fc1 output, activation, output), as bf16 storage does.
// scratch must hold n·3f elements.
func ExpertForward[F Float32Or64](y, x, prob, fc1, fc2, scratch []F, n, h, f int, round func([]F)) {
	if n == 0 {
		return
	}
	h1, act := scratch[:n*2*f], scratch[n*2*f:n*3*f]
	MatMulNT(h1, x, fc1, n, 2*f, h)
	if round != nil {
		round(h1)
	}
	SwiGLUProb(act, h1, prob, n, f)
	if round != nil {
		round(act)
	}
	MatMulNT(y[:n*h], act, fc2, n, h, f)
	if round != nil {
		round(y[:n*h])
	}
}
