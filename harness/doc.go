// Package harness builds and runs one MoE layer: configuration and presets,
// routing generators, the layer pipeline on EP ranks, the run loop with
// per-phase timing, the correctness check against a float64 reference, and the
// result record it produces.
//
// What a run does and what it times: docs/concepts.md; the check:
// docs/correctness.md; the design: docs/design.md.
package harness
