// Package check is the layer's correctness check: the output against a
// float64 reference (Check, Reference, CheckDevice, on a sample of tokens
// where the reference is too costly) and the gradients (the backward's
// against kernels' float64 gradient reference), also across processes. It
// imports harness/layer and harness/setup (docs/correctness.md,
// docs/design.md, Packages).
package check
