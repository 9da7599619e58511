// Package harness runs one MoE layer: Run (the run loop: build, check,
// warm up, time, record), the sweep, the record, dump, and the interrupted
// run's record. Below it, harness/check checks the layer, harness/layer
// is the layer itself, harness/setup is the configuration and what a run
// carries, harness/summary turns samples into the record's statistics and
// harness/roundtrip checks a dispatcher alone; above it, harness/bench
// holds the benchmarks (docs/design.md, Packages).
//
// What a run does and what it times: docs/concepts.md; the check:
// docs/correctness.md; the design: docs/design.md.
package harness
