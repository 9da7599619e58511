// Package comm is communication between the devices of kernels/device:
//   - Comm: NCCL's grouped send/recv between GPUs (OpenComm, over the
//     ranks of one process or, with ProcessRanks, of a run that spans
//     processes), or an emulated one over Emu devices for the tests;
//     PeerTransfer is one side of a transfer;
//   - EP: NCCL EP's ranks (ncclep.go; EPProcessRanks for a run that spans
//     processes);
//   - Signals: host-mapped counters, claim words and an error record that
//     SM-driven dispatchers' kernels share, with timed waits that name the
//     rank, phase and block that hung;
//   - the proofs of that machinery on devices: commtest.go (rings of
//     co-resident blocks across ranks) and fifotest.go (the shared-memory
//     FIFO), and inflight.go (bytes in flight of the dispatchers' kernels,
//     from their machine code: inflight.json).
//
// It imports kernels/device and kernels, never the dispatchers. Its tests
// also hold the device runtime's tests that run the CUDA C sources on the
// CPU (hostsim), through NVRTC or on a GPU: they share their helpers with
// the communication tests, and test code cannot be imported. The design:
// docs/design.md (The kernels packages).
package comm
