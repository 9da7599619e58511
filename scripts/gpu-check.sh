#!/usr/bin/env bash
# moebench's GPU check: everything the project cannot prove without a GPU,
# in one run on a GPU node.
#
#   scripts/gpu-check.sh quick [OUTDIR]      the short check (at most 6 minutes)
#   scripts/gpu-check.sh [OUTDIR]            the whole check (about 12 minutes)
#   scripts/gpu-check.sh sanitize [OUTDIR]   only the compute-sanitizer steps
#   scripts/gpu-check.sh twoproc [OUTDIR]    only the run over two processes
#     (TWOPROC_FLAGS: its layer's flags, default --preset qwen3-30b-a3b;
#     MOEBENCH_BIN: the moebench binary, default bin/moebench; BIN_DIR: the
#     folder of the binaries, default bin)
#
# Before: build the binaries on a machine with Go (the node needs no Go):
#   scripts/build-gpu-bins.sh        (bin/moebench and bin/*.test, stripped;
#                                     it says their size, at most 48 MiB)
# and copy the checkout with bin/ to the node. The node needs an NVIDIA
# driver and the CUDA libraries (NVRTC, cuBLASLt; cuBLAS, NCCL and NVML when
# present) from a CUDA toolkit or the Python wheels (nvidia-*-cu12/13); the
# toolkit's cuobjdump and compute-sanitizer are used when found.
#
# quick: for a node lent for about 15 minutes (one command of at most 10).
# doctor; the GPU tests of moebench's own kernels (kernels' TestGPU* but
# NCCL's, deepep's TestGPUDeepEP, hybridep's TestGPUHybridEPDevice); one
# layer per dispatcher (alltoall, deepep, feplb, hybridep) at qwen3-30b-a3b,
# EP 8 packed on one GPU, a training step checked against the float64
# reference, and alltoall's again replayed from CUDA graphs (--cuda-graph
# --routing-fixed); bench dispatch (alltoall, deepep, hybridep at 2 SM budgets,
# 8 and 16: EP 8 on one GPU holds at most 16 SMs a rank); bench kernels (the kernels' ratios to the ceilings measured in
# the same run: the copy engines' device copy, an SM copy kernel, a dense
# GEMM); hybridep's layer at --precision fp8 (issue 34's command). Each step has its own time limit (the sum, with each step's 3 s to
# be killed, is 350 s); a step that would end past QUICK_BUDGET seconds
# (default 360) runs shorter or is skipped, and says so. A failed or timed
# out step is recorded and the next one runs. OUTDIR receives two files:
# gpu-check-quick.tgz (every log, doctor.txt, records.jsonl,
# bench-*.json, report.txt and summary.txt), rewritten after each step so
# that a check cut short still leaves what it did, and summary.txt.
# Shorter settings for a try elsewhere: QUICK_SHAPE (the shape and EP
# flags, default --preset qwen3-30b-a3b --ep 8), QUICK_SMS (bench
# dispatch's budgets), QUICK_LAYER_SMS (the deepep and hybridep layers'
# --sms; default theirs), QUICK_WARMUP and QUICK_ITERS (2 and 10),
# QUICK_GPUS (the layers' and bench dispatch's --gpus, default 1); QUICK_FP8
# (flags after the shape for the fp8 layer, default none);
# LIMIT_<step> (its name's dashes as _) changes a step's limit in any mode.
#
# The whole check, in this order: the layer at the reference configuration
# (qwen3-30b-a3b at EP 8), every GPU test (each CUDA kernel against its host
# function, the library bindings) with MOEBENCH_REQUIRE_GPU=1 so that a
# missing GPU or library fails instead of skipping, the kernel benchmark
# (ratios to ceilings measured in the same run: the copy engines' device
# copy, an SM copy kernel, a dense GEMM), deepep's layer and dispatch
# benchmark (its SM budgets side by side with alltoall), the layer for
# several presets, EP sizes, routings and dispatchers (alltoall natively and
# through NCCL, FEPLB, deepep, hybridep and a sweep of SM budgets; with and
# without --cuda-graph; hybridep and deepep-ll through NCCL EP), on a node with
# 2 GPUs or more a run over two processes (MOEBENCH_RANK/MOEBENCH_WORLD, as
# srun or mpirun launch one per node: alltoall --impl library at EP = the GPU
# count, each process driving half the GPUs, NCCL's communicator made through
# --rendezvous in a temporary folder, a training step, forward and backward,
# rank 0 writing the one record; hybridep natively, each process one NVLink
# domain (--domain = half the GPUs), its inter-domain path over NCCL; and
# hybridep and deepep-ll through NCCL EP the same way where it is installed,
# forward only), and
# last compute-sanitizer over the kernels' tests
# (the cross-rank kernels included).
#
# How long: about 12 minutes. Each step has its own time limit, and a step
# that would start after BUDGET seconds (default 720) is skipped and reported
# as such; BUDGET=1200 gives the sanitizer time to finish.
#
# What it writes: OUTDIR (default $OUT, else a new temporary folder, printed
# at the start) holds each step's log (the two-process run's: one per
# process too, NAME.p0.log and NAME.p1.log), doctor.txt (what was found where),
# records.jsonl (one moebench record per layer run), bench-*.json and
# report.txt; a summary table is printed last, each step's status and
# seconds (a step cut by its limit: FAIL (timed out after N s)). Exit status
# 0 when every step passed, 1 otherwise.
#
# What to send back: the whole OUTDIR (tar czf gpu-check.tgz -C OUTDIR .);
# quick's gpu-check-quick.tgz.
# The records are published as they came: results/published/ in the
# repository, never edited by hand.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=all
case ${1:-} in
sanitize | twoproc | quick)
  mode=$1
  shift
  ;;
esac
OUTDIR=${1:-${OUT:-$(mktemp -d)}}
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
BIN_DIR=$(cd "${BIN_DIR:-bin}" 2>/dev/null && pwd) || BIN_DIR=${BIN_DIR:-bin}
mb=${MOEBENCH_BIN:-$BIN_DIR/moebench}
[ -x "$mb" ] || { echo "$mb missing: run scripts/build-gpu-bins.sh on a machine with Go and copy bin/ here" >&2; exit 2; }
if [ "$mode" = quick ]; then
  # the logs in a folder of their own; OUTDIR receives the archive and the
  # summary alone (a lent node sends back at most 8 files)
  OUT=$(mktemp -d)
  archive="$OUTDIR/gpu-check-quick.tgz"
  echo "gpu-check quick: writing $archive and $OUTDIR/summary.txt (the logs in $OUT until then)"
else
  OUT=$OUTDIR
  echo "gpu-check: writing to $OUT"
fi

# (moebench itself also searches these and the wheels of the python3 on the
# path; the loader's path serves the libraries' own dependencies)
libdirs=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/local/lib/python3*/dist-packages/nvidia/*/lib \
  /usr/lib/python3/dist-packages/nvidia/*/lib /usr/local/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH="${libdirs}${LD_LIBRARY_PATH:-}"
# the toolkit's cuobjdump and nvdisasm, where present, let the kernels' compile
# test audit the machine code of the GPU's own NVRTC (kernels/comm/sass_test.go)
export PATH="/usr/local/cuda/bin:$PATH"
# (a kernel cache named by the caller is kept: its images are keyed by the
# compiler and the source)
export MOEBENCH_REQUIRE_GPU=1 MOEBENCH_CACHE="${MOEBENCH_CACHE:-$OUT/kernel-cache}"

BUDGET=${BUDGET:-720}
QUICK_BUDGET=${QUICK_BUDGET:-360}
# quick: a step may start while it can end, killed 3 s after its limit at
# the latest, with 10 s left for the report and the archive
quick_end=$((QUICK_BUDGET - 10))
grace=3
declare -A result
order=()
# note NAME TEXT: a line of the summary (in the order first noted)
note() {
  [ -n "${result[$1]+set}" ] || order+=("$1")
  result[$1]=$2
}
# limit_of NAME LIMIT: LIMIT_<NAME> (NAME's dashes as _) when set, else LIMIT
limit_of() {
  local var=LIMIT_${1//[^A-Za-z0-9_]/_}
  echo "${!var:-$2}"
}
# step NAME LIMIT CMD...: runs CMD under a time limit (see limit_of), its
# output in $OUT/NAME.log, unless the budget is spent; quick rewrites its
# archive after each step
step() {
  local name=$1 limit; shift
  limit=$(limit_of "$name" "$1"); shift
  if [ "$mode" = quick ]; then
    local left=$((quick_end - grace - SECONDS))
    if [ "$left" -lt 5 ]; then
      note "$name" "skipped (the quick check's ${QUICK_BUDGET}s would be spent)"
      return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  else
    if [ "$SECONDS" -ge "$BUDGET" ]; then note "$name" "skipped (budget of ${BUDGET}s spent)"; return; fi
    local left=$((BUDGET + 50 - SECONDS)) # the last step may run a little past the budget, not much more
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  local start=$SECONDS
  timeout -k "$grace" "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$? took=$((SECONDS - start))
  if [ $rc -eq 0 ]; then
    note "$name" "exit 0 (${took}s)"
  elif { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && [ "$took" -ge "$limit" ]; then
    note "$name" "FAIL (timed out after ${limit}s)"
  elif grep -q '^panic: test timed out after' "$OUT/$name.log"; then
    note "$name" "FAIL (timed out after ${took}s: the test binary's -test.timeout; the log names the test)"
  else
    note "$name" "FAIL (exit $rc after ${took}s)"
  fi
  tail -n 4 "$OUT/$name.log"
  [ "$mode" != quick ] || pack
}
# pack: quick's archive of everything so far (the kernel cache left out),
# replaced whole
pack() {
  tar czf "$archive.part" -C "$OUT" --exclude=./kernel-cache . && mv -f "$archive.part" "$archive"
}
records="$OUT/records.jsonl"
layer() { # name, then moebench flags
  local name=$1; shift
  step "layer-$name" 120 "$mb" --device cuda "$@" --out "$records"
}
# gputest NAME BINARY LIMIT [ARGS]: a package's GPU tests (its test binary
# from BIN_DIR), the test binary's own timeout 3 s inside the step's, so
# that it names the test that was running
gputest() {
  local name=$1 bin=$BIN_DIR/$2 limit; limit=$(limit_of "$1" "$3"); shift 3
  if [ ! -x "$bin" ]; then
    note "$name" "FAIL ($bin missing: scripts/build-gpu-bins.sh builds it)"
    return
  fi
  step "$name" "$limit" "$bin" -test.v -test.timeout "$((limit > 4 ? limit - 3 : 1))s" "$@"
}

if [ "$mode" = quick ]; then
  # The limits (seconds) are estimates for an H100 on a fresh node, whose
  # NVRTC compiles each kernel on first use (the disk cache starts empty):
  # NVRTC 12.4 compiled every kernel file for sm_90 in 16 s on a loaded
  # 2-core CPU (hybridep.cu 9.1 s, deepep.cu 3.2 s, each other file 0.2 to
  # 0.7 s). test-deepep compiles deepep.cu for each of its cases (a broken
  # one also waits out a 1.5 s timeout), test-hybridep hybridep.cu twice,
  # the layers' weights are drawn on every CPU and checked on a sample of
  # tokens, and a step of the layer takes milliseconds on the GPU.
  # shellcheck disable=SC2206 # QUICK_SHAPE is a list of flags
  shape=(${QUICK_SHAPE:---preset qwen3-30b-a3b --ep 8})
  iters=(--warmup "${QUICK_WARMUP:-2}" --iters "${QUICK_ITERS:-10}")
  step doctor 10 "$mb" doctor
  cp "$OUT/doctor.log" "$OUT/doctor.txt" 2>/dev/null
  # moebench's own kernels against their host functions, each test compiling
  # its kernels with the node's NVRTC (NCCL's binding test left to the whole
  # check)
  gputest test-kernels kernels_comm.test 50 -test.run '^TestGPU' -test.skip '^TestGPUNCCL$'
  gputest test-deepep dispatchers_deepep.test 30 -test.run '^TestGPUDeepEP$'
  gputest test-hybridep dispatchers_hybridep.test 25 -test.run '^TestGPUHybridEPDevice$'
  # a training step per dispatcher, checked, every rank on GPU 0 (--gpus 1
  # on any node); the first compiles the shared kernels (the disk cache
  # serves the rest), deepep and hybridep their own
  for d in alltoall deepep feplb hybridep; do
    sms=()
    if [ -n "${QUICK_LAYER_SMS:-}" ] && { [ $d = deepep ] || [ $d = hybridep ]; }; then sms=(--sms "$QUICK_LAYER_SMS"); fi
    step "layer-$d" 24 "$mb" --device cuda --gpus "${QUICK_GPUS:-1}" "${shape[@]}" --dispatcher "$d" "${sms[@]}" "${iters[@]}" --max-seconds 8 --out "$records"
  done
  # the same alltoall layer replayed from CUDA graphs (fixed routing, so
  # that every captured part is replayed), its phases timed inside them
  step layer-alltoall-graph 24 "$mb" --device cuda --gpus "${QUICK_GPUS:-1}" "${shape[@]}" --dispatcher alltoall --cuda-graph --routing-fixed \
    "${iters[@]}" --max-seconds 8 --out "$records"
  step bench-dispatch 34 "$mb" bench dispatch --device cuda --gpus "${QUICK_GPUS:-1}" "${shape[@]}" --dispatcher alltoall,deepep,hybridep \
    --sms "${QUICK_SMS:-8,16}" "${iters[@]}" --out "$OUT/bench-dispatch.json"
  step bench-kernels 22 "$mb" bench kernels "${shape[@]}" "${iters[@]}" --out "$OUT/bench-kernels.json"
  # the FP8 layer (issue 34's command, at the quick shape): hybridep's fp8
  # dispatch and the expert GEMMs through cuBLASLt's FP8 path, checked
  # (QUICK_FP8: flags after the shape, e.g. a --hidden that HybridEP's fp8
  # takes, a multiple of 512)
  # shellcheck disable=SC2206 # QUICK_FP8 is a list of flags
  fp8=(${QUICK_FP8:-})
  step layer-hybridep-fp8 23 "$mb" --device cuda --gpus "${QUICK_GPUS:-1}" "${shape[@]}" "${fp8[@]}" --dispatcher hybridep \
    --sms "${QUICK_LAYER_SMS:-16}" --precision fp8 "${iters[@]}" --max-seconds 8 --out "$records"
  [ -e "$records" ] && timeout -k 1 5 "$mb" report "$records" > "$OUT/report.txt" 2>&1
  {
    echo "== gpu-check quick summary =="
    for k in "${order[@]}"; do printf '  %-36s %s\n' "$k" "${result[$k]}"; done
    failed=()
    for k in "${order[@]}"; do case "${result[$k]}" in FAIL* | skipped*) failed+=("$k") ;; esac; done
    if [ ${#failed[@]} -eq 0 ]; then echo "  every step passed"; else echo "  failed, timed out or skipped: ${failed[*]}"; fi
    grep -h -E '^(driver|NVRTC|cuBLASLt|NCCL|NVML)' "$OUT/doctor.txt" 2>/dev/null
    echo "  (${SECONDS}s in all; the quick check's budget ${QUICK_BUDGET}s)"
  } > "$OUT/summary.txt"
  cp "$OUT/summary.txt" "$OUTDIR/summary.txt"
  pack
  cat "$OUT/report.txt" "$OUT/bench-dispatch.log" "$OUT/bench-kernels.log" 2>/dev/null
  echo
  cat "$OUT/summary.txt"
  echo "  archive: $archive"
  rm -rf "$OUT"
  [ ${#failed[@]} -eq 0 ]
  exit
fi

"$mb" doctor 2>&1 | tee "$OUT/doctor.txt"
if [ "$mode" = all ]; then
layer qwen3-30b-ep8 --preset qwen3-30b-a3b --ep 8
for t in "$BIN_DIR"/*.test; do
  step "test-$(basename "$t" .test)" 200 "$t" -test.v
done
for preset in qwen3-30b-a3b deepseek-v3; do
  step "bench-$preset" 150 "$mb" bench kernels --preset "$preset" --ep 8 --out "$OUT/bench-$preset.json"
  cat "$OUT/bench-$preset.log" 2>/dev/null
done
# DeepEP's design (moebench's kernels): the reference layer at 16 SMs per rank
# (8 ranks packed on one GPU, a block holding an SM: 128 of its SMs held at
# once; more per rank does not fit), then dispatch and combine alone per
# budget, each point checked, next to alltoall: EP 8 packed at 4, 8 and 16
# SMs per rank and EP 2 packed at 8, 16, 24 and 32
layer deepep-qwen3-30b-ep8 --preset qwen3-30b-a3b --ep 8 --dispatcher deepep --sms 16
step bench-dispatch 150 "$mb" bench dispatch --device cuda --preset qwen3-30b-a3b --ep 8 \
  --dispatcher alltoall,deepep,hybridep --sms 4,8,16 --out "$OUT/bench-dispatch.json"
cat "$OUT/bench-dispatch.log" 2>/dev/null
step bench-dispatch-ep2 150 "$mb" bench dispatch --device cuda --preset qwen3-30b-a3b --ep 2 \
  --dispatcher alltoall,deepep,hybridep --sms 8,16,24,32 --out "$OUT/bench-dispatch-ep2.json"
cat "$OUT/bench-dispatch-ep2.log" 2>/dev/null
# FP8 (issue 34): dispatch at bf16 and fp8 side by side, and each design's
# fp8 layer (the dispatch in e4m3 with 1×128 scales, the expert GEMMs in
# cuBLASLt's FP8 path where the library has it; the record says which)
step bench-dispatch-fp8 150 "$mb" bench dispatch --device cuda --preset qwen3-30b-a3b --ep 8 \
  --dispatcher alltoall,deepep,hybridep --sms 16 --precision bf16,fp8 --out "$OUT/bench-dispatch-fp8.json"
cat "$OUT/bench-dispatch-fp8.log" 2>/dev/null
layer fp8-qwen3-30b-ep8 --preset qwen3-30b-a3b --ep 8 --precision fp8
layer deepep-fp8-qwen3-30b-ep8 --preset qwen3-30b-a3b --ep 8 --dispatcher deepep --sms 16 --precision fp8
layer hybridep-fp8-qwen3-30b-ep8 --preset qwen3-30b-a3b --ep 8 --dispatcher hybridep --sms 16 --precision fp8
layer feplb-fp8-qwen3-30b-ep8-skewed --preset qwen3-30b-a3b --ep 8 --routing skewed:1.2 --dispatcher feplb --precision fp8
layer tiny-ep8 --preset tiny --ep 8
# --cuda-graph against the same layers without (host issue/step, host wait,
# step): fixed routing, so that each captured part is replayed every step,
# and routing per step, where the part after the count exchange is captured
# again when the counts change (or issued plainly when a buffer must grow)
layer tiny-ep8-fixed --preset tiny --ep 8 --routing-fixed
layer tiny-ep8-fixed-graph --preset tiny --ep 8 --routing-fixed --cuda-graph
layer qwen3-30b-ep8-fixed --preset qwen3-30b-a3b --ep 8 --routing-fixed
layer qwen3-30b-ep8-fixed-graph --preset qwen3-30b-a3b --ep 8 --routing-fixed --cuda-graph
layer qwen3-30b-ep8-graph --preset qwen3-30b-a3b --ep 8 --cuda-graph
layer qwen3-30b-ep1 --preset qwen3-30b-a3b --ep 1
# the same layer with alltoall's library implementation: NCCL send/recv
# (one rank per GPU, so EP 1 on one GPU)
layer qwen3-30b-ep1-nccl --preset qwen3-30b-a3b --ep 1 --impl library
layer qwen3-30b-ep8-skewed --preset qwen3-30b-a3b --ep 8 --routing skewed:1.2
layer qwen3-30b-ep8-natural --preset qwen3-30b-a3b --ep 8 --routing natural
layer deepseek-v3-ep8 --preset deepseek-v3 --ep 8
layer deepep-qwen3-30b-ep8-skewed --preset qwen3-30b-a3b --ep 8 --routing skewed:1.2 --dispatcher deepep --sms 16
# FEPLB over alltoall on skewed routing: the same layer as qwen3-30b-ep8-skewed,
# so the two records compare side by side (one NVLink domain of 8, then 2 of 4)
layer feplb-qwen3-30b-ep8-skewed --preset qwen3-30b-a3b --ep 8 --routing skewed:1.2 --dispatcher feplb
layer feplb-qwen3-30b-ep8-skewed-d4 --preset qwen3-30b-a3b --ep 8 --routing skewed:1.2 --dispatcher feplb --domain 4
# hybridep's CUDA kernels (bulk copies on sm_90 where the GPU's NVRTC is ≥ 12):
# the command users type first (--sms 32) at EP 8 on one GPU is
# unavailable (16 SMs per rank fit), so the reference layer runs at 16; its
# budgets 8 and 16 beside alltoall and deepep in one sweep (one table in the
# report). Two domains need one GPU per rank (the inter-domain path is NCCL):
# on a one-GPU node that run is recorded unavailable, with the reason.
layer hybridep-qwen3-30b-ep8-sms32 --preset qwen3-30b-a3b --ep 8 --dispatcher hybridep --sms 32
layer hybridep-qwen3-30b-ep8-sms16 --preset qwen3-30b-a3b --ep 8 --dispatcher hybridep --sms 16
layer hybridep-qwen3-30b-ep8-d4 --preset qwen3-30b-a3b --ep 8 --dispatcher hybridep --sms 16 --domain 4
step sweep-hybridep 300 "$mb" sweep --device cuda --preset qwen3-30b-a3b --ep 8 \
  --dispatcher alltoall,deepep,hybridep --sms 8,16 --out "$records"
# NCCL EP (--impl library): hybridep through its high-throughput mode, deepep-ll
# (DeepEP's low-latency design) through its low-latency mode (128 tokens, its regime), one rank per GPU: on
# a one-GPU node EP 1 (a single rank, untested upstream). Where the library,
# NCCL's Device API, nvcc or its headers are missing the runs are recorded
# unavailable, with the reason (doctor.txt says what was found where).
# hybridep's is a training step: its backward is the library's own
# (pass_direction BWD), its gradients checked; deepep-ll's times the forward.
layer ncclep-ht-qwen3-30b-ep1 --preset qwen3-30b-a3b --ep 1 --dispatcher hybridep --impl library
layer ncclep-ll-qwen3-30b-ep1 --preset qwen3-30b-a3b --ep 1 --dispatcher deepep-ll --impl library --tokens 128
fi
if [ "$mode" != sanitize ]; then
# a run over two processes on this node, as a launcher starts one per node
# (docs/multinode.md): alltoall through NCCL at EP = the GPU
# count (even), each process driving half the GPUs from its MOEBENCH_LOCAL_RANK
# on, NCCL's unique id through --rendezvous in a temporary folder, a training
# step (the backward's gradients exchanged over NCCL too); rank 0 appends
# the run's one record, the other process writes none; then hybridep's
# native kernels with each process one NVLink domain (its peer stores inside
# it, the inter-domain path and the routing map's rows over NCCL; extra
# flags in TWOPROC_HYBRIDEP_FLAGS, e.g. an --sms the GPUs hold)
# (NCCL EP's two modes likewise where doctor found the library: its groups
# over the run's communicator, each process creating its own ranks')
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$gpus" -ge 2 ]; then
  ep=$((gpus - gpus % 2))
  twoproc() { # name, then moebench flags
    local name=$1 rv
    shift
    rv=$(mktemp -d)
    step "$name" 180 bash -c '
      mb=$1 out=$2 name=$3 rv=$4 rec=$5; shift 5
      for r in 0 1; do
        MOEBENCH_RANK=$r MOEBENCH_WORLD=2 MOEBENCH_LOCAL_RANK=$r timeout 170 "$mb" --device cuda "$@" \
          --rendezvous "$rv/id" --out "$rec" > "$out/$name.p$r.log" 2>&1 &
        pid[r]=$!
      done
      rc=0
      for r in 0 1; do wait "${pid[r]}" || rc=1; done
      for r in 0 1; do echo "== process $r"; tail -n 20 "$out/$name.p$r.log"; done
      exit $rc' _ "$mb" "$OUT" "$name" "$rv" "$records" "$@"
    rm -rf "$rv"
  }
  # shellcheck disable=SC2086 # TWOPROC_FLAGS is a list of flags
  twoproc "twoproc-alltoall-nccl-ep$ep" ${TWOPROC_FLAGS:---preset qwen3-30b-a3b} --ep "$ep" --dispatcher alltoall --impl library
  # shellcheck disable=SC2086 # TWOPROC_HYBRIDEP_FLAGS too
  twoproc "twoproc-hybridep-ep$ep-d$((ep / 2))" ${TWOPROC_FLAGS:---preset qwen3-30b-a3b} ${TWOPROC_HYBRIDEP_FLAGS:-} --ep "$ep" \
    --dispatcher hybridep --domain $((ep / 2))
  if grep -q '^NCCL EP  *found' "$OUT/doctor.txt"; then
    # shellcheck disable=SC2086
    twoproc "twoproc-ncclep-ht-ep$ep" ${TWOPROC_FLAGS:---preset qwen3-30b-a3b} --ep "$ep" --dispatcher hybridep --impl library
    # shellcheck disable=SC2086
    twoproc "twoproc-ncclep-ll-ep$ep" ${TWOPROC_FLAGS:---preset qwen3-30b-a3b --tokens 128} --ep "$ep" --dispatcher deepep-ll --impl library
  else
    note "twoproc-ncclep" "n/a (NCCL EP not found: doctor.txt says why)"
  fi
else
  note "twoproc" "n/a (nvidia-smi lists $gpus GPU(s): a run over two processes needs one GPU per rank, at least 2)"
fi
fi
# last, as the budget allows: compute-sanitizer over the GPU tests of
# moebench's own kernels (not cuBLAS's): memcheck (out-of-bounds and
# misaligned accesses), racecheck (shared-memory races), synccheck (barriers
# and warp-wide calls in divergent code), initcheck (reads of memory never
# written). It refuses some machines' GPUs ("device not supported").
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ "$mode" = twoproc ]; then
  :
elif [ -n "$san" ]; then
  for tool in memcheck racecheck synccheck initcheck; do
    step "sanitize-$tool" 150 "$san" --tool "$tool" --error-exitcode 3 \
      "$BIN_DIR/kernels_comm.test" -test.v -test.run '^TestGPU(Router|Permute|SortChunks|SwiGLUAndUnpermute|FP8|FP8Lt|FP8Tensor)$'
    if grep -q -i "device not supported" "$OUT/sanitize-$tool.log" 2>/dev/null; then
      note "sanitize-$tool" "n/a (compute-sanitizer: device not supported)"
    fi
  done
  # deepep's kernels: queues in peers' memory, named barriers (synccheck),
  # host-mapped counters
  for tool in memcheck synccheck; do
    step "sanitize-deepep-$tool" 150 "$san" --tool "$tool" --error-exitcode 3 \
      "$BIN_DIR/dispatchers_deepep.test" -test.v -test.run '^TestGPUDeepEP$'
    if grep -q -i "device not supported" "$OUT/sanitize-deepep-$tool.log" 2>/dev/null; then
      note "sanitize-deepep-$tool" "n/a (compute-sanitizer: device not supported)"
    fi
  done
else
  note "sanitize" "n/a (no compute-sanitizer)"
fi
[ -e "$records" ] && "$mb" report "$records" > "$OUT/report.txt" 2>&1
cat "$OUT/report.txt" 2>/dev/null

echo
echo "== gpu-check summary =="
for k in "${order[@]}"; do printf '  %-36s %s\n' "$k" "${result[$k]}"; done
grep -h -E '^(driver|NVRTC|cuBLASLt|NCCL|NVML)' "$OUT/doctor.txt"
echo "  (${SECONDS}s in all)"
status=0
for k in "${!result[@]}"; do case "${result[$k]}" in FAIL*|skipped*) status=1 ;; esac; done
exit $status
