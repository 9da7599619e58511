// Package abi holds abi.h: moebench's own prototypes of every CUDA driver,
// NVRTC, cuBLASLt, cuBLAS, NCCL and NCCL EP entry point it calls through
// dlopen (NVML goes through go-nvml), the structs it passes, and one
// trampoline per entry point.
// internal/cuda's cgo code includes it; the fake libraries of
// internal/hostsim include it too (so a fake whose definition differs from
// moebench's prototype does not compile), and internal/cuda's ABI test
// checks every prototype and struct against the real headers.
//
// The ABI check: docs/testing.md.
package abi

import _ "embed"

// Header is abi.h's text, for the fake libraries' builds.
//
//go:embed abi.h
var Header string
