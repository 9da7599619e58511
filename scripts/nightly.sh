#!/usr/bin/env bash
# Nightly regression run for this node: run the sweep, append it to the
# history, write the report, and compare it with the node's stored baseline.
#
#   scripts/nightly.sh [SWEEP_FILE]        (default: scripts/nightly-sweep.json)
#   (the sweep file's keys are sweep's flags: "overlap": ["none", "a2a"] makes overlap an
#   axis, each setting a point compared with the same setting's baseline; docs/overlap.md)
#
# Environment:
#   MOEBENCH_NIGHTLY_DIR   history, baselines, runs and reports (default: $HOME/moebench-nightly)
#   MOEBENCH_BIN           moebench binary to use (default: built from this checkout)
#   MOEBENCH_COMPARE_ARGS  extra flags for 'moebench compare', e.g. "--threshold-pct 3"
#                          or "--fail-on-undecided"
#   MOEBENCH_NIGHTLY_PRECISION  the precisions to sweep, comma-separated (e.g. "bf16" or
#                          "bf16,fp8"), passed as the sweep's --precision, which wins over the
#                          sweep file's "precision" axis (unset: the file's; the default file
#                          sweeps bf16 and fp8 side by side, docs/fp8.md)
#   MOEBENCH_NIGHTLY_ADVISE  flags of 'moebench advise' to run after the sweep, e.g.
#                          "--preset qwen3-30b-a3b --ep 8 --budget 20m" (unset: no advice);
#                          its answer joins the advice history, and a winner that differs
#                          from the last night's answer to the same question is reported
#
# Files under MOEBENCH_NIGHTLY_DIR:
#   runs/HOST-STAMP.jsonl            tonight's records
#   history.jsonl                    every night's records, appended
#   baseline-HOST.jsonl              what tonight is compared with; the first run
#                                    becomes it; to accept a new baseline, copy a run over it.
#                                    Points compare at their own precision: a precision the
#                                    baseline lacks (fp8 beside a bf16 baseline) gives points
#                                    "only in new", no regression and no new baseline needed
#   reports/HOST-STAMP.html          report with charts; reports/HOST-STAMP-compare.txt
#   advise/HOST-STAMP/               with MOEBENCH_NIGHTLY_ADVISE: the answer and its records;
#                                    reports/HOST-STAMP-advise.txt its output
#   advise-history.jsonl             every night's answer (moebench advise --history)
#
# Exit status: 0 no regression (or no baseline yet: this run became it),
# 3 regression, 4 the stack changed in what changes results (new GPU, driver,
# library, clocks, ...: a new baseline is needed; harmless differences such
# as the kernel's patch level only add a note) or what each iteration times
# (forward only, or forward and backward), 5 undecided points with
# --fail-on-undecided, 1 the sweep, the report or the comparison could not
# run (MOEBENCH_BIN not an executable file among the reasons) or the advice
# failed where nothing else did, 2 bad sweep file or more than one argument,
# 130 interrupted. A change of the advice's winner is reported ("nightly:
# advise: the winner changed ...") without changing the exit status.
#
# cron, every night at 02:30:
#   30 2 * * * cd /path/to/moebench && scripts/nightly.sh >> "$HOME/moebench-nightly/cron.log" 2>&1
# Slurm, on one whole node:
#   sbatch --nodes=1 --exclusive --time=01:00:00 --output=nightly-%j.log \
#          --wrap "cd /path/to/moebench && scripts/nightly.sh"
#
# Over several nodes (docs/multinode.md), start it under the
# launcher, MOEBENCH_NIGHTLY_DIR on a filesystem every node sees:
#   srun -N 2 --ntasks-per-node 1 scripts/nightly.sh
# Every process runs the sweep (--rendezvous MOEBENCH_NIGHTLY_DIR/rendezvous,
# or MOEBENCH_NIGHTLY_RENDEZVOUS); rank 0 alone writes the run, the history,
# the report and the comparison, and its exit status is the night's; the
# others exit with their sweep's. Without MOEBENCH_BIN each process builds
# its own binary (bin/moebench.HOST.RANK). The process's rank is read as
# moebench reads it (internal/launch: MOEBENCH_RANK, Open MPI's, PMI's,
# torchrun's, srun's variables, in that order).
set -uo pipefail
case ${1:-} in
  -h | --help)
    sed -n '2,/^set -uo pipefail/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
    exit 0 ;;
  -*) set -- "" "$1" ;; # no flags: report it as the unexpected argument
esac
if [ $# -gt 1 ]; then
  echo "nightly: unexpected argument \"$2\" (usage: scripts/nightly.sh [SWEEP_FILE]; compare's flags go in MOEBENCH_COMPARE_ARGS)" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
sweep=${1:-$root/scripts/nightly-sweep.json}
bin=${MOEBENCH_BIN:-}
if [ -n "$bin" ]; then
  [[ $bin == */* ]] || bin=$(type -P -- "$bin") || bin=$MOEBENCH_BIN # a name: found on PATH
  if [ ! -f "$bin" ] || [ ! -x "$bin" ]; then
    echo "nightly: MOEBENCH_BIN=$MOEBENCH_BIN: not an executable file" >&2
    exit 1
  fi
fi
dir=${MOEBENCH_NIGHTLY_DIR:-$HOME/moebench-nightly}
mkdir -p "$dir/runs" "$dir/reports" || exit 1

# this process's rank and the run's processes, as moebench reads them
rank=0 world=1
for pair in MOEBENCH_RANK:MOEBENCH_WORLD OMPI_COMM_WORLD_RANK:OMPI_COMM_WORLD_SIZE PMI_RANK:PMI_SIZE RANK:WORLD_SIZE SLURM_PROCID:SLURM_STEP_NUM_TASKS; do
  rv=${pair%%:*} wv=${pair##*:}
  if [ -n "${!rv:-}" ] && [ -n "${!wv:-}" ]; then
    rank=${!rv} world=${!wv}
    break
  fi
done
host=$(hostname -s 2>/dev/null || hostname)
distributed=()
if [ "$world" -gt 1 ]; then
  distributed=(--rendezvous "${MOEBENCH_NIGHTLY_RENDEZVOUS:-$dir/rendezvous}")
fi

if [ -z "$bin" ]; then
  bin=$dir/bin/moebench
  [ "$world" -gt 1 ] && bin=$dir/bin/moebench.$host.$rank # the processes build at once
  (cd "$root" && go build -buildvcs=true -o "$bin" ./cmd/moebench) || { echo "nightly: build failed" >&2; exit 1; }
fi
stamp=$(date -u +%Y%m%dT%H%M%SZ)
name=$host-$stamp
n=1
while [ -e "$dir/runs/$name.jsonl" ]; do # never append to an earlier run
  name=$host-$stamp-$n
  n=$((n + 1))
done
run=$dir/runs/$name.jsonl

precision=()
if [ -n "${MOEBENCH_NIGHTLY_PRECISION:-}" ]; then
  precision=(--precision "$MOEBENCH_NIGHTLY_PRECISION")
fi
"$bin" sweep --file "$sweep" --out "$run" "${precision[@]}" "${distributed[@]}"
rc=$?
if [ "$rank" != 0 ]; then # rank 0 writes the run and does the rest
  echo "nightly: process $rank of $world: sweep exit $rc; rank 0 writes the run"
  exit "$rc"
fi
# 0: all points ran; 1: some point failed (recorded, and compare will flag it)
if [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ]; then
  echo "nightly: sweep did not complete (exit $rc)" >&2
  exit "$rc"
fi
if [ ! -s "$run" ]; then
  echo "nightly: the sweep wrote no records" >&2
  exit 1
fi

# the report reads the run strictly before it joins the history
"$bin" report --format html --title "moebench nightly, $host, $stamp" "$run" > "$dir/reports/$name.html" || exit 1
"$bin" report --format table "$run"
cat "$run" >> "$dir/history.jsonl"

# the advice, kept in its history: advise says when the winner changed
advise_rc=0
if [ -n "${MOEBENCH_NIGHTLY_ADVISE:-}" ]; then
  mkdir -p "$dir/advise" || exit 1
  # shellcheck disable=SC2086 # MOEBENCH_NIGHTLY_ADVISE is a list of flags
  "$bin" advise $MOEBENCH_NIGHTLY_ADVISE --out "$dir/advise/$name" --history "$dir/advise-history.jsonl" 2>&1 | tee "$dir/reports/$name-advise.txt"
  advise_rc=${PIPESTATUS[0]}
  change=$(grep -m1 "^moebench advise: history: the winner changed" "$dir/reports/$name-advise.txt")
  if [ -n "$change" ]; then
    echo "nightly: advise: ${change#moebench advise: history: }"
  fi
  if [ "$advise_rc" -ne 0 ]; then
    echo "nightly: advise failed (exit $advise_rc); see $dir/reports/$name-advise.txt" >&2
  fi
fi
# finish exits with $1, or 1 where that is 0 and the advice failed
finish() {
  if [ "$1" -eq 0 ] && [ "$advise_rc" -ne 0 ]; then
    exit 1
  fi
  exit "$1"
}

baseline=$dir/baseline-$host.jsonl
if [ ! -f "$baseline" ]; then
  cp "$run" "$baseline"
  echo "nightly: no baseline for $host yet; this run is now $baseline"
  finish 0
fi
# shellcheck disable=SC2086 # MOEBENCH_COMPARE_ARGS is a list of flags
"$bin" compare ${MOEBENCH_COMPARE_ARGS:-} "$baseline" "$run" 2>&1 | tee "$dir/reports/$name-compare.txt"
rc=${PIPESTATUS[0]}
case $rc in
  0 | 3 | 5) finish "$rc" ;;
  4)
    echo "nightly: the stack (or what each iteration times) changed: a new baseline is needed; to accept this run as it: cp '$run' '$baseline'" >&2
    exit 4 ;;
  *)
    echo "nightly: compare failed (exit $rc)" >&2
    exit 1 ;;
esac
