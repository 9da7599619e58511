#!/usr/bin/env bash
# A/A false alarms of 'moebench compare': runs the same layer 2×PAIRS times
# with one binary, compares each run with the next (pairs 1–2, 3–4, …) and
# counts the verdicts. Every regression it reports is a false alarm.
#
#   scripts/aa-compare.sh [PAIRS] [-- RUN FLAGS...]
#     PAIRS       number of pairs (default 100)
#     RUN FLAGS   flags of 'moebench run' (default: --iters 20, the default layer)
#
# Environment: MOEBENCH_BIN, the binary (default: built from this checkout);
# MOEBENCH_COMPARE_ARGS, extra flags for 'moebench compare'.
# It prints one line per verdict with its count, then the false-alarm rate;
# exit status 0, or 1 when a run or a comparison failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pairs=${1:-100}
shift $(($# > 0 ? 1 : 0))
[ "${1:-}" = "--" ] && shift
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(--iters 20)
case $pairs in '' | *[!0-9]* | 0) echo "aa-compare: PAIRS must be a positive integer, got '$pairs'" >&2; exit 2 ;; esac

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bin=${MOEBENCH_BIN:-}
if [ -z "$bin" ]; then
  bin=$dir/moebench
  (cd "$root" && go build -o "$bin" ./cmd/moebench 2>/dev/null) || { echo "aa-compare: build failed" >&2; exit 1; }
fi
for i in $(seq 1 $((2 * pairs))); do
  "$bin" run "${flags[@]}" --out "$dir/run-$i.jsonl" >/dev/null 2>&1 || { echo "aa-compare: run $i failed" >&2; exit 1; }
done
for i in $(seq 1 2 $((2 * pairs))); do
  # shellcheck disable=SC2086 # MOEBENCH_COMPARE_ARGS is a list of flags
  "$bin" compare ${MOEBENCH_COMPARE_ARGS:-} "$dir/run-$i.jsonl" "$dir/run-$((i + 1)).jsonl" >"$dir/cmp" 2>/dev/null
  rc=$?
  [ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] || { echo "aa-compare: compare of runs $i and $((i + 1)) exited $rc" >&2; exit 1; }
  grep -E '^  ' "$dir/cmp" | sed -E 's/^  (REGRESSION|same|faster|noisy|host timing|no decision).*/\1/' >>"$dir/verdicts"
  # the estimated change in percent: the number before the interval a…b
  grep -E '^  ' "$dir/cmp" | grep -oE '[-+][0-9.]+ +[-+][0-9.]+…' | awk '{print $1}' >>"$dir/shifts"
done
sort "$dir/verdicts" | uniq -c | tee "$dir/tally"
alarms=$(awk '$2 == "REGRESSION" {print $1}' "$dir/tally")
echo "false alarms: ${alarms:-0} of $pairs A/A pairs ($(awk -v a="${alarms:-0}" -v n="$pairs" 'BEGIN {printf "%.1f", 100 * a / n}')%)"
sort -g "$dir/shifts" | awk '{v[NR] = $1} END {if (NR) printf "estimated change between identical runs: median %+.1f%%, from %+.1f%% to %+.1f%%\n", v[int((NR + 1) / 2)], v[1], v[NR]}'
