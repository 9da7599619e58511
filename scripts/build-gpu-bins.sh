#!/usr/bin/env bash
# Builds, on this machine, what scripts/gpu-check.sh runs on the GPU machine:
# bin/moebench and a test binary for each package with GPU tests. bin/ is
# git-ignored: name it in the device call's carry.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bin
go build -o bin/moebench ./cmd/moebench
for pkg in internal/cuda kernels harness; do
  go test -c -o "bin/$(echo "$pkg" | tr / _).test" "./$pkg"
done
ls -l bin
