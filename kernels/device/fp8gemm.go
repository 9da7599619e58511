package device

import (
	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
)

// FP8GEMMPath is the finest FP8 GEMM this GPU's cuBLASLt offers
// (FP8GEMMPathFor with the library's version and the GPU's compute
// capability).
func (c *CUDA) FP8GEMMPath() (kernels.FP8GEMMPath, string) {
	if c.Lt == nil {
		return kernels.FP8GEMMDequant, "no cuBLASLt"
	}
	return kernels.FP8GEMMPathFor(c.Lt.Version, c.cc)
}

// ltRun runs plan g of mm into out (RunFP8 with mm's multipliers at FP8).
func (c *CUDA) ltRun(g *cuda.GEMM, out Addr, mm MatMul, ws Addr, s Stream) error {
	if mm.FP8 != cuda.FP8None {
		return c.Lt.RunFP8(g, out, mm.A, mm.AScale, mm.B, mm.BScale, ws, s)
	}
	return c.Lt.Run(g, out, mm.A, mm.B, ws, s)
}
