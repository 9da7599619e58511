// Package kernels holds the compute steps of the MoE layer — router, permute,
// expert GEMMs, SwiGLU×prob, unpermute — as host (Go) implementations. They
// define each step's semantics, run the layer on the host device and serve as
// the correctness oracle for device implementations. The backward of each
// step (backward.go, routerbwd.go) comes with a float64 gradient reference
// (gradref.go) and FLOP/byte counts (work.go); BACKWARD.md maps it onto the
// dispatchers. The Device interface runs them on a GPU (CUDA) or on Emu;
// resident.go and signals.go hold the machinery of SM-driven dispatchers
// (co-resident collective launches with Go twins for Emu, peer-pointer
// tables, host-mapped signals with timed waits), proven by commtest.go.
//
// Tensors are row-major []float32 (or []float64 for the reference). Activations
// stored between steps are bf16 values widened to float32 (see RoundBF16), as a
// GPU layer would store them.
//
// The layer: docs/concepts.md; the design: docs/design.md.
package kernels
