#!/usr/bin/env bash
# The GPU check, run on the GPU machine (see ../shared/GPU.md) after
# scripts/build-gpu-bins.sh built bin/ here:
#   scripts/gpu-check.sh            (writes logs and records under $OUT)
# It finds the CUDA libraries (toolkit folders, the Python wheels' nvidia/*/lib
# folders), runs every GPU test with MOEBENCH_REQUIRE_GPU=1 so that a missing
# GPU or library fails instead of skipping, runs the layer on the cuda device
# for several presets and EP sizes (recording what happens: in this build the
# cuda layer is not implemented, so those records say unavailable), and prints
# a short table last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
[ -x bin/moebench ] || { echo "bin/moebench missing: run scripts/build-gpu-bins.sh here and carry bin/" >&2; exit 2; }

libdirs=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/local/lib/python3*/dist-packages/nvidia/*/lib \
  /usr/lib/python3/dist-packages/nvidia/*/lib /usr/local/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH="${libdirs}${LD_LIBRARY_PATH:-}"
export MOEBENCH_REQUIRE_GPU=1 MOEBENCH_CACHE="$OUT/kernel-cache"

declare -A result
bin/moebench doctor 2>&1 | tee "$OUT/doctor.txt"
for t in bin/*.test; do
  name=$(basename "$t" .test)
  if "$t" -test.v > "$OUT/test-$name.log" 2>&1; then result[$name]=pass; else result[$name]=FAIL; fi
  tail -n 3 "$OUT/test-$name.log"
done

records="$OUT/records.jsonl"
for preset in qwen3-30b-a3b deepseek-v3; do
  for ep in 1 8; do
    bin/moebench --device cuda --preset "$preset" --ep "$ep" --out "$records" > /dev/null 2>> "$OUT/layer.log"
    result["layer-$preset-ep$ep"]="exit $?"
  done
done
bin/moebench report "$records" > "$OUT/report.txt" 2>&1

echo
echo "== gpu-check summary =="
for k in $(printf '%s\n' "${!result[@]}" | sort); do printf '  %-32s %s\n' "$k" "${result[$k]}"; done
grep -h -E '^(driver|NVRTC|cuBLASLt|NCCL|NVML)' "$OUT/doctor.txt"
status=0
for k in "${!result[@]}"; do [ "${result[$k]}" = FAIL ] && status=1; done
exit $status
