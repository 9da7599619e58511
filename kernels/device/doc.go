// Package device is the device runtime the layer's device pipeline runs
// on: the Device interface and its two implementations, CUDA (a GPU,
// through internal/cuda) and Emu (device memory kept on the host, running
// the kernels package's host functions so that the pipeline's bookkeeping —
// offsets, copies, stream order, events — is tested without a GPU).
//
// What it holds:
//   - device memory: Addr (a device address), RowBuffer and RowCapacity
//     (buffers sized by a row count), MappedHost (page-locked host memory
//     that kernels and the host both reach: signals the host polls);
//   - order.go: Emu's model of streams and events (it runs work in the
//     order a GPU may, and fails a read that no event orders after its
//     write);
//   - threads.go: Threads, one OS thread per GPU issuing its ranks' work;
//   - jit.go: the NVRTC compile of kernels/cuda's sources and its cache;
//   - graph.go: CUDA graphs (capture and replay);
//   - resident.go: Programs and co-resident Collective launches (one block
//     per SM, an SM budget counted in SMs) with the Go twins Emu runs in
//     their place; the fp8 kernels' Programs (fp8.go);
//   - the backward's device steps (devbackward.go, gpubwd.go).
//
// It imports kernels (the reference math Emu runs and the kernels are
// checked against) and internal/cuda, never kernels/comm. Communication
// between devices — Comm, NCCL EP, signals, the collectives' proofs — is
// kernels/comm, above it. The design: docs/design.md (The kernels
// packages).
package device
