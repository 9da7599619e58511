#!/usr/bin/env bash
# Builds, on a machine with Go, what scripts/gpu-check.sh runs on a GPU node:
# bin/moebench and a test binary for each package with GPU tests (with
# argument quick: those that gpu-check.sh quick runs alone), stripped
# (-ldflags='-s -w': no symbol table, no DWARF; a panic still prints its
# stack with function names, files and lines). Copy the checkout with bin/
# (git-ignored) to the node.
#
# It prints each file's size and the total, and fails (exit 1) when they
# come to more than MAX_MIB MiB (default 48): a lent GPU node takes at most
# 64 MiB of files, the checkout's own included. BIN_DIR (default bin) is
# where they go.
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_MIB=${MAX_MIB:-48}
BIN_DIR=${BIN_DIR:-bin}
case $MAX_MIB in '' | *[!0-9]*)
  echo "build-gpu-bins.sh: MAX_MIB=$MAX_MIB: must be a whole number of MiB" >&2
  exit 2
  ;;
esac
pkgs="internal/cuda kernels/comm dispatchers/deepep dispatchers/hybridep harness"
case ${1:-} in
'') ;;
quick) pkgs="kernels/comm dispatchers/deepep dispatchers/hybridep" ;;
*)
  echo "build-gpu-bins.sh: unknown argument '$1' (known: quick)" >&2
  exit 2
  ;;
esac
mkdir -p "$BIN_DIR"
rm -f "$BIN_DIR/moebench" "$BIN_DIR"/*.test # a package no longer built leaves no stale binary behind
# -buildvcs=auto: the binaries carry the commit they were built from (a
# GOFLAGS of -buildvcs=false would leave moebench to read the node's checkout)
go build -buildvcs=auto -ldflags='-s -w' -o "$BIN_DIR/moebench" ./cmd/moebench
for pkg in $pkgs; do
  go test -c -buildvcs=auto -ldflags='-s -w' -o "$BIN_DIR/$(echo "$pkg" | tr / _).test" "./$pkg"
done
total=0
for f in "$BIN_DIR/moebench" "$BIN_DIR"/*.test; do
  size=$(stat -c %s "$f")
  total=$((total + size))
  awk -v b="$size" -v f="$f" 'BEGIN { printf "%10d B  %6.1f MiB  %s\n", b, b / 1048576, f }'
done
awk -v b="$total" -v d="$BIN_DIR" -v m="$MAX_MIB" 'BEGIN { printf "%10d B  %6.1f MiB  %s in all (limit %d MiB)\n", b, b / 1048576, d, m }'
if [ "$total" -gt $((MAX_MIB * 1024 * 1024)) ]; then
  echo "build-gpu-bins.sh: $BIN_DIR holds $total B of binaries, above the limit of MAX_MIB=$MAX_MIB MiB: a GPU node takes at most 64 MiB of files, the checkout's included" >&2
  exit 1
fi
