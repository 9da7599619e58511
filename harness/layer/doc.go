// Package layer is the MoE layer on EP ranks: the host layer (router,
// dispatch, experts, combine, and its backward; host experts held, by rank
// or drawn; FP8), the device layer (the same on kernels/device, with CUDA
// graphs, the FP8 GEMMs, the copy probe and the hang watchdog), the layer
// over several processes (Distributed), the overlap engine, the timed
// steps' samples (Measurements) and the GPU telemetry. It imports
// harness/setup; the checks and the run loop are above it
// (docs/design.md, Packages).
package layer
