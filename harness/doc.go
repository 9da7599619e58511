// Package harness builds and runs one MoE layer: configuration and presets,
// routing generators, the layer pipeline on EP ranks, the run loop with
// per-phase timing, the correctness check against a float64 reference, and the
// result record it produces. Below it, harness/summary turns samples into
// the record's statistics and harness/roundtrip checks a dispatcher alone;
// above it, harness/bench holds the benchmarks (docs/design.md, Packages).
//
// What a run does and what it times: docs/concepts.md; the check:
// docs/correctness.md; the design: docs/design.md.
package harness
