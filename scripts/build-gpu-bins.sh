#!/usr/bin/env bash
# Builds, on a machine with Go, what scripts/gpu-check.sh runs on a GPU node:
# bin/moebench and a test binary for each package with GPU tests. Copy the
# checkout with bin/ (git-ignored) to the node.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bin
go build -o bin/moebench ./cmd/moebench
for pkg in internal/cuda kernels dispatchers/deepep dispatchers/hybridep harness; do
  go test -c -o "bin/$(echo "$pkg" | tr / _).test" "./$pkg"
done
ls -l bin
