// Package kernels is the host reference math of the MoE layer's compute
// steps — router, permute, expert GEMMs, SwiGLU×prob, unpermute, fp8
// quantization — as Go functions. They define each step's semantics, run
// the layer on the host device and are the correctness oracle of every
// device implementation. The backward of each step (backward.go,
// routerbwd.go) comes with a float64 gradient reference (gradref.go) and
// FLOP/byte counts (work.go: FLOPsBytes); BACKWARD.md maps it onto the
// dispatchers.
//
// It imports nothing of moebench. The CUDA C sources (cuda/*.cu) live in
// this directory with the host functions they are checked against; Sources
// embeds both and SourceHash names them in every record.
//
// Tensors are row-major []float32 (or []float64 for the reference).
// Activations stored between steps are bf16 values widened to float32 (see
// RoundBF16), as a GPU layer would store them.
//
// Above it: kernels/device (the device runtime) and kernels/comm
// (communication). The layer: docs/concepts.md; the design: docs/design.md
// (The kernels packages).
package kernels
