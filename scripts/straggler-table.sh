#!/usr/bin/env bash
# Regenerates results/straggler/README.md: FEPLB's policies and their
# baselines against the FEPLB paper's claims, entirely from `moebench
# straggler` runs (every moebench number below comes from a run here; the
# paper's numbers are quoted constants, with their source).
#   scripts/straggler-table.sh [OUT]     (default: results/straggler/README.md)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/straggler/README.md}
bin=${MOEBENCH_BIN:-}
if [ -z "$bin" ]; then
  bin=$(mktemp -d)/moebench
  go build -o "$bin" ./cmd/moebench
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The paper's per-layer figures at PP/EP 4/2, 4/4, 2/8 (arXiv 2604.19654 §7.4
# as quoted by the third-party review cited in docs/references.md):
# token straggler before / FasterMoE / FEPLB, GEMM straggler in ms likewise.
paper_ep=(2 4 8)
paper_tok=("2278 1014 1107" "4649 2471 1697" "6666 4036 2021")
paper_gemm=("0.316 0.170 0.157" "0.652 0.380 0.247" "1.110 0.625 0.352")

# the layer: GLM-5's MoE shape (preset glm-5) with the paper's 128 experts.
# Every number is a mean over seeds 1-10 (one seed is not decision-grade:
# seed 1 is unusually skewed), with [min, max] over them. 200 steps per seed
# keep the script (and TestStragglerTableInSync, which runs it) to a few
# minutes on a loaded 2-core machine; the EP 8 means with 500 steps differ
# from these by under 2%.
seeds=10 steps=200
layer=(--preset glm-5 --experts 128 --tokens 4096 --drift 0.3 --steps $steps --seed 1 --seeds $seeds --sched-us 50 --counts-us 10)
run() { "$bin" straggler --format markdown "${layer[@]}" "$@"; }

# val FILE POLICY COLUMN: one cell of a markdown table (without %)
val() {
  awk -F'|' -v p="$2" -v c="$3" '
    /^\| policy/ { for (i = 2; i <= NF; i++) { h = $i; gsub(/ /, "", h); if (h == c) col = i } }
    { q = $2; gsub(/ /, "", q); if (q == p && col) { v = $col; gsub(/[ %]/, "", v); print v; exit } }' "$1"
}
comma() { awk -v x="$1" 'BEGIN { s = sprintf("%.0f", x); n = length(s); o = ""
  for (i = 1; i <= n; i++) { o = o substr(s, i, 1); if ((n - i) % 3 == 0 && i < n) o = o "," }; print o }'; }
# span FILE POLICY COLUMN: a [min, max] cell (e.g. token_straggler_range) as "[1,234, 2,345]"
span() {
  local v; v=$(val "$1" "$2" "$3" | tr -d '[]')
  echo "[$(comma "${v%,*}"), $(comma "${v#*,}")]"
}
# seedspan FILE POLICY: the per-seed range of fastermoe ÷ POLICY (token straggler) from the table's note
seedspan() { grep -o "fastermoe ÷ $2: token straggler [0-9.]* (ratio of the means; per seed \[[0-9.]*, [0-9.]*\]" "$1" | sed 's/.*per seed //'; }
# first FILE: the policy ranked first in a markdown table
first() { awk -F'|' '/^\|---/ { getline; gsub(/ /, "", $2); print $2; exit }' "$1"; }

# Calibration 1: one Zipf exponent for EP 2, 4 and 8 (one domain each, as in
# the paper) whose `none` token straggler is closest to the paper's "before"
# (least squared relative error).
calib=$tmp/calib.txt
: > "$calib"
for a in 0.20 0.22 0.24 0.26 0.28 0.30 0.32 0.34 0.36 0.38 0.40 0.42 0.44; do
  line="$a" spans=""
  for i in 0 1 2; do
    ep=${paper_ep[$i]}
    run --ep "$ep" --domain "$ep" --routing "skewed:$a" --policies none > "$tmp/c.md"
    line="$line $(val "$tmp/c.md" none token_straggler)"
    spans="$spans|$(span "$tmp/c.md" none token_straggler_range)"
  done
  echo "$line $spans" >> "$calib"
done
read -r before2 before4 before8 <<< "$(for i in 0 1 2; do set -- ${paper_tok[$i]}; echo -n "$1 "; done)"
alpha=$(awk -v b2="$before2" -v b4="$before4" -v b8="$before8" '
  { e = ($2/b2-1)^2 + ($3/b4-1)^2 + ($4/b8-1)^2; if (NR == 1 || e < best) { best = e; a = $1 } }
  END { print a }' "$calib")
# Calibration 2: the GEMM rate at which the paper's EP 8 "before" GEMM
# straggler is its token straggler's GEMM time: 6·hidden·ffn FLOPs per token.
set -- ${paper_gemm[2]}
tflops=$(awk -v t="$before8" -v g="$1" 'BEGIN { printf "%.0f", 6*6144*2048*t/(g*1e-3)/1e12 }')
cal=(--routing "skewed:$alpha" --gemm-tflops "$tflops")

for i in 0 1 2; do
  ep=${paper_ep[$i]}
  run --ep "$ep" --domain "$ep" "${cal[@]}" > "$tmp/ep$ep.md"
  # the strict reading of the scheduler: only the busiest dynamic expert
  run --ep "$ep" --domain "$ep" "${cal[@]}" --feplb-fallback stop --policies none,fastermoe,feplb > "$tmp/strict$ep.md"
done
run --ep 8 --domain 8 "${cal[@]}" --backward > "$tmp/bwd.md"
run --ep 8 --domain 8 "${cal[@]}" --nvlink-ce-share 0.5 > "$tmp/share.md"
run --ep 8 --domain 8 --routing balanced --gemm-tflops "$tflops" > "$tmp/balanced.md"
for a in 0.8 1.2; do
  run --ep 8 --domain 8 --routing "skewed:$a" --gemm-tflops "$tflops" > "$tmp/ep8-$a.md"
done
run --ep 8 --domain 8 --routing skewed:0.8 --gemm-tflops "$tflops" --sched-us 200 > "$tmp/sched200.md"
run --ep 16 --domain 8 "${cal[@]}" > "$tmp/ep16.md"
run --ep 16 --domain 8 --routing skewed:0.8 --gemm-tflops "$tflops" > "$tmp/ep16-0.8.md"

pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f%%", 100*(1-a/b) }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a/b }'; }
# pick A B TEXT-IF-A<B TEXT-ELSE
pick() { if awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; then echo "$3"; else echo "$4"; fi; }
ms() { awk -v x="$1" 'BEGIN { printf "%.3f", x/1000 }'; }

{
cat <<'EOF'
# FEPLB and its baselines against the paper's claims (simulated)

Generated by `scripts/straggler-table.sh` from `moebench straggler` runs; do not
edit by hand. The paper's numbers are quoted, each with its source.

## The claim

The abstract of arXiv 2604.19654 (FEPLB) ends:

> "On GLM-5's MoE layers (128 experts, no auxiliary loss, up to 16 H100 GPUs),
> FEPLB reduces the token straggler by 51-70% and the GEMM straggler by 50-68%
> with no measurable EP communication overhead. Its advantage grows with the EP
> degree: at EP=8, it achieves 2x lower token straggler than FasterMoE."

Its per-layer figures (PP/EP 4/2, 4/4 and 2/8: the EP group is always inside one
8-GPU NVLink domain, and "up to 16 GPUs" counts pipeline stages too) are quoted
from a third-party review of the paper's text (`docs/references.md`,
FEPLB); the paper itself has no public code, and its PDF was not read here.
GLM-5 has 256 routed experts in its published config (preset `glm-5`); the paper
ran a 128-expert variant, as here (`--experts 128`).

## What is simulated

`moebench straggler` (package `balance`) plays many steps of one MoE layer out
in a model: each rank's expert GEMMs take 6·hidden·ffn FLOPs per token copy at a
fixed rate (at least one read of the expert's weights), copy engines move 380
GB/s per direction, NVLink 450 GB/s, the network 50 GB/s. Routing is Zipf(α)
expert popularity with a mean-reverting step-to-step drift (0.3), or balanced
(i.i.d. each step, like Megatron's force-balancing). Every policy sees the same
steps and every plan is checked (each token copy computed once, by a rank
holding the expert's weights). A per-step plan (FasterMoE's, FEPLB's) is known
10 µs (the counts' arrival on the CPU, assumed) + 50 µs (the CPU scheduler, the
paper's figure) after phase 1; its copies and broadcasts start then.

Policies:

- `none`: every expert on its owner.
- `eplb`: DeepSeek EPLB's global policy (deepseek-ai/EPLB `eplb.py`): replicas of
  the heaviest experts in one redundant slot per rank, packed onto the least
  loaded ranks, from the load history, every 50 steps — adopted only when a
  placement made from the older half of the history saves more, step by step on
  the newer half (less two standard errors), than its weight moves take before
  the step (they are charged to that step).
- `fastermoe`: FasterMoE's shadowing, ported from fastmoe (laekov/fastmoe@ee3c561,
  `fmoe/fastermoe/shadow_policy.py` for the policy and its latency model
  3·comp·B + 4·send·B + shadows·bcast, `cuda/fastermoe/smart_schedule.h` for the
  order of work): each round shadows the busiest rank's hottest expert while the
  model's latency falls (with one expert per rank, as in fastmoe, that is its
  hottest-first walk); broadcasts run on copy engines inside a domain, as the
  paper's FasterMoE baseline did, the network across; each rank computes its
  other experts first, then each shadowed expert once its weights are there.
  fastmoe's code sums its gathered counts per sending worker rather than per
  expert; moebench uses per-expert counts, as the paper and the docstring say.
- `feplb`: the paper's policy as the review describes its text: each rank's 4
  most loaded experts are dynamic (the paper's default `dyn`), the rest static;
  a greedy CPU scheduler takes the domain's most loaded rank, moves its busiest
  dynamic expert — weights and all its tokens, never split — to the least loaded
  rank with a free slot in its buffer of 8 experts' weights (`max_num_dyn`),
  skips experts under τ = 32 tokens, and repeats until no move is useful.
  Inferred: when the busiest dynamic expert cannot move usefully, the
  scheduler tries the rank's next dynamic expert, busiest first
  (`--feplb-fallback next`, the default); the strict reading
  (`--feplb-fallback stop`) stops there. Both readings' numbers are below.
  Inferred, as the review leaves it open: "load" is each rank's modelled finish
  (static GEMMs; the experts it helps with, once their copies have landed; its
  own dynamic experts; the wait for its outputs to come back), a move is useful
  when it lowers the busiest rank's finish and leaves no rank above it, and
  which experts are dynamic is decided per step from the counts.
- `feplb-split`: moebench's own variant: the same scheduler, but a chunk of the
  expert sized to even out the two ranks (halved while not useful, down to τ), so
  a hot expert can be spread over several helpers.
- `feplb+place`: `feplb` plus a load-aware placement of experts across domains
  from history (the paper's "Router Predictor" at the macro level), re-made under
  the same rule as `eplb`'s.

What holds of "no policy is worse than `none`": `feplb` and `feplb-split`
keep a domain's plan only when the domain finishes earlier with it in the model
they are judged by, so they are never worse than `none` (a test checks it on
balanced, skewed, drifting and trace routing, and small experts across two
domains). The others decide by something else and can be worse: `fastermoe` by
fastmoe's own latency model of a training step (with small experts across two
NVLink domains it is far worse than `none`; tested), `eplb` and
`feplb+place` from the load history, which the next steps may not follow.
Each table below names any policy worse than `none` beyond the tie rule. Tie
rule: a policy within 0.5% of `none`'s effective straggler prints "= none"
and ranks with `none`, in the order given, not by the difference.

Columns (means over steps, then over seeds 1–10; `*_range` columns give
[min, max] over the seeds): `eff_straggler` is what the step really loses: the
slowest rank's finish — its GEMMs, its waits for copies, its outputs' way back,
FasterMoE's broadcasts, EPLB's re-placement traffic — minus the mean GEMM time
with every expert home; tables are ranked by it. `token_straggler` (copies on
the busiest rank − mean) and `gemm_straggler` (busiest rank's GEMM time −
mean) are the paper's metrics; `exposed` is what a policy's own costs add to
its GEMM straggler; `back_exposed` the part of the outputs' way back that lands
after the slowest rank's GEMMs; `ep_overhead_%` the bytes the policy puts on the
busiest rank's NVLink direction as a share of the EP dispatch and combine bytes
there (what EP traffic sharing the link with the copies would wait for);
`bwd_*` (with `--backward`) the backward pass, where each (expert, helper) sends
the expert's weight gradient (6·hidden·ffn bytes in bf16) back to its owner.
EOF

printf '\n## Calibration to the paper\n\n'
cat <<EOF
The paper's routing is real (no auxiliary loss) and its micro-batch is not
given; here every rank has 4096 tokens. One Zipf exponent is chosen for all
three EP sizes: the one whose \`none\` token straggler (mean over seeds 1–$seeds,
[min, max] over them) comes closest to the paper's "before" figures (least
squared relative error of the means over EP 2, 4 and 8):

| α | EP 2 | EP 4 | EP 8 |
|---:|---:|---:|---:|
EOF
while read -r a m2 m4 m8 spans; do
  IFS='|' read -r _ s2 s4 s8 <<< "$spans"
  printf '| %s | %s %s | %s %s | %s %s |\n' "$a" "$(comma "$m2")" "$s2" "$(comma "$m4")" "$s4" "$(comma "$m8")" "$s8"
done < "$calib"
printf '| paper | %s | %s | %s |\n' "$(comma "$before2")" "$(comma "$before4")" "$(comma "$before8")"
cat <<EOF

Chosen: **α = $alpha**. The GEMM rate is set so that the paper's EP 8 "before"
GEMM straggler is the GEMM time of its token straggler: 6·6144·2048 FLOPs ×
6,666 tokens / 1.110 ms = **$tflops TFLOP/s** (\`--gemm-tflops $tflops\`), near
half the H100's dense BF16 peak. Drift, scheduler and copy rates are not
calibrated (the paper gives none of them).

## The paper's figures beside moebench's

Per EP size: the paper's token and GEMM stragglers (before → FasterMoE / FEPLB),
and moebench's (\`none\` → \`fastermoe\` / \`feplb\`, with \`feplb-split\` and the
effective straggler, which the paper does not report): means over seeds
1–$seeds, the token stragglers' [min, max] over seeds, and FasterMoE ÷ FEPLB
as the ratio of the means with its [min, max] over seeds. "moebench, strict" is
the strict reading of FEPLB's scheduler (\`--feplb-fallback stop\`: only the
busiest rank's busiest dynamic expert is tried; see below).

| EP | source | token straggler: before → FasterMoE / FEPLB | GEMM straggler ms: before → FasterMoE / FEPLB | FasterMoE ÷ FEPLB (token) | feplb-split (token) | effective straggler ms: none → fastermoe / feplb |
|---:|---|---|---|---:|---:|---|
EOF
for i in 0 1 2; do
  ep=${paper_ep[$i]}
  set -- ${paper_tok[$i]}; tb=$1 tf=$2 te=$3
  set -- ${paper_gemm[$i]}; gb=$1 gf=$2 ge=$3
  printf '| %s | paper | %s → %s / %s (−%s) | %s → %s / %s (−%s) | %s | — | — |\n' "$ep" \
    "$(comma "$tb")" "$(comma "$tf")" "$(comma "$te")" "$(pct "$te" "$tb" | tr -d -)" \
    "$gb" "$gf" "$ge" "$(pct "$ge" "$gb" | tr -d -)" "$(ratio "$tf" "$te")"
  f=$tmp/ep$ep.md
  nb=$(val "$f" none token_straggler) nf=$(val "$f" fastermoe token_straggler) ne=$(val "$f" feplb token_straggler) ns=$(val "$f" feplb-split token_straggler)
  mb=$(val "$f" none gemm_straggler_us) mf=$(val "$f" fastermoe gemm_straggler_us) me=$(val "$f" feplb gemm_straggler_us)
  eb=$(val "$f" none eff_straggler_us) ef=$(val "$f" fastermoe eff_straggler_us) ee=$(val "$f" feplb eff_straggler_us)
  tr=token_straggler_range
  printf '| %s | moebench | %s %s → %s %s / %s %s (−%s) | %s → %s / %s (−%s) | %s %s | %s (−%s) | %s → %s / %s |\n' "$ep" \
    "$(comma "$nb")" "$(span "$f" none $tr)" "$(comma "$nf")" "$(span "$f" fastermoe $tr)" "$(comma "$ne")" "$(span "$f" feplb $tr)" "$(pct "$ne" "$nb")" \
    "$(ms "$mb")" "$(ms "$mf")" "$(ms "$me")" "$(pct "$me" "$mb")" "$(ratio "$nf" "$ne")" "$(seedspan "$f" feplb)" "$(comma "$ns")" "$(pct "$ns" "$nb")" \
    "$(ms "$eb")" "$(ms "$ef")" "$(ms "$ee")"
  f=$tmp/strict$ep.md
  ne=$(val "$f" feplb token_straggler) me=$(val "$f" feplb gemm_straggler_us) ee=$(val "$f" feplb eff_straggler_us)
  printf '| %s | moebench, strict | %s → %s / %s %s (−%s) | %s → %s / %s (−%s) | %s %s | — | %s → %s / %s |\n' "$ep" \
    "$(comma "$nb")" "$(comma "$nf")" "$(comma "$ne")" "$(span "$f" feplb $tr)" "$(pct "$ne" "$nb")" \
    "$(ms "$mb")" "$(ms "$mf")" "$(ms "$me")" "$(pct "$me" "$mb")" "$(ratio "$nf" "$ne")" "$(seedspan "$f" feplb)" \
    "$(ms "$eb")" "$(ms "$ef")" "$(ms "$ee")"
done

f8=$tmp/ep8.md
for ep in 2 4 8; do
  f=$tmp/ep$ep.md
  declare "red$ep=$(val "$f" feplb token_reduction)"
  declare "fr$ep=$(ratio "$(val "$f" fastermoe token_straggler)" "$(val "$f" feplb token_straggler)")"
  declare "frs$ep=$(seedspan "$f" feplb)"
  f=$tmp/strict$ep.md
  declare "st$ep=$(ratio "$(val "$f" fastermoe token_straggler)" "$(val "$f" feplb token_straggler)")"
  declare "sts$ep=$(seedspan "$f" feplb)"
  declare "sred$ep=$(val "$f" feplb token_reduction)"
done
grows=$(awk -v a="$fr2" -v b="$fr4" -v c="$fr8" 'BEGIN { print (a < b && b < c) ? "yes" : "no" }')
cat <<EOF

## The claims, one by one

**"reduces the token straggler by 51-70% and the GEMM straggler by 50-68%".**
moebench's \`feplb\` cuts the token straggler by $red2%, $red4% and $red8% at EP 2,
4 and 8 (paper: 51%, 63%, 70%; the GEMM straggler follows it, as GEMM time is
proportional to tokens in the model). $(pick "$red8" 70 "moebench cuts less than the paper at EP 8." "moebench cuts more than the paper: the model is kind to FEPLB where a GPU is not.") A GEMM's time here
is exactly proportional to its tokens (no loss for the odd group sizes a move
leaves), copies run at the full copy-engine rate and never slow a GEMM, and the
scheduler sees each step's exact counts. The effective straggler charges what
the paper does not report — copy stalls, the outputs' way back, the
scheduler's 60 µs: at EP 8 it adds $(val "$f8" feplb exposed_us) µs to \`feplb\`'s GEMM straggler of
$(val "$f8" feplb gemm_straggler_us) µs, as the static experts hide the copies and each helper's own dynamic
experts hide the way back. \`feplb-split\`, which may cut an expert, cuts the
token straggler by $(val "$f8" feplb-split token_reduction)% at EP 8: not splitting tokens, the paper's choice for
grouped-GEMM efficiency and a plan every rank can derive alone, is what leaves
\`feplb\` the rest.

**"Its advantage grows with the EP degree".** FasterMoE ÷ FEPLB (token
straggler) is $fr2, $fr4 and $fr8 at EP 2, 4 and 8 in moebench ($st2, $st4 and $st8
under the strict reading; paper: $(ratio 1014 1107), $(ratio 2471 1697) and $(ratio 4036 2021)). $(if [ "$grows" = yes ]; then echo "moebench agrees inside one NVLink domain, the only case the paper measured."; else echo "moebench disagrees: the ratio does not grow with EP here."; fi)
With few ranks the imbalance is small against one expert's load, so a
whole-expert move overshoots, while FasterMoE's shadows spread a hot expert
over every rank; with more ranks the busiest rank's excess is several experts,
which \`feplb\` moves whole without broadcasting weights to every rank. Across
NVLink domains (EP 16 below, beyond the paper) copy engines cannot move load:
FasterMoE ÷ FEPLB there is $(ratio "$(val "$tmp/ep16.md" fastermoe token_straggler)" "$(val "$tmp/ep16.md" feplb token_straggler)") at the calibrated skew and
$(ratio "$(val "$tmp/ep16-0.8.md" fastermoe token_straggler)" "$(val "$tmp/ep16-0.8.md" feplb token_straggler)") at α = 0.8, where \`$(first "$tmp/ep16-0.8.md")\` ranks first.

**"at EP=8, it achieves 2x lower token straggler than FasterMoE".** moebench:
$fr8× (per seed $frs8). $(pick "$fr8" 2 "moebench finds less than the paper's 2×." "moebench finds at least the paper's 2×.") FasterMoE is given its best honest chance here (see
Policies): a port that only tried the globally hottest expert would shadow
nothing whenever that expert is not on the busiest rank.
Whether this is reproduced depends on one inferred choice of FEPLB's
scheduler (see Policies): when the busiest rank's busiest dynamic expert
cannot move usefully, moebench's \`feplb\` tries that rank's next dynamic
expert (\`--feplb-fallback next\`, the default). Under the strict reading of
the review's words — "pick its busiest dynamic expert" and stop when it
cannot move (\`--feplb-fallback stop\`) — FasterMoE ÷ FEPLB is $st2, $st4 and
$st8 at EP 2, 4 and 8 (per seed at EP 8: $sts8), and \`feplb\` cuts the token
straggler by $sred2%, $sred4% and $sred8%. $(pick "$st8" 2 "$(pick "$fr8" 2 "Neither reading reaches the paper's 2× at EP 8." "The paper's 2× at EP 8 is reproduced only under the lenient reading.")" "$(pick "$fr8" 2 "Only the strict reading reaches the paper's 2× at EP 8." "Both readings reach the paper's 2× at EP 8.")")
The review leaves the choice open, and the paper has no public code.

**"with no measurable EP communication overhead".** A model with no EP traffic
beside the copies cannot confirm it, so moebench reports what it depends on: at
EP 8 \`feplb\` puts $(val "$f8" feplb ep_overhead_%)% of the EP dispatch and combine bytes of the busiest
rank's NVLink direction on that direction itself ($(val "$f8" feplb ce_MB/step) MB per step over copy
engines in all). If another micro-batch's dispatch or combine ran beside the
copies (as in schedules that overlap EP communication with expert compute), it
would wait for those bytes; the claim holds only where nothing else uses
NVLink while the copies run (phase 1 done, the combine not begun). Sharing
the link slows the copies too: with half of NVLink (\`--nvlink-ce-share 0.5\`)
\`feplb\`'s effective straggler goes from $(val "$f8" feplb eff_straggler_us) µs to $(val "$tmp/share.md" feplb eff_straggler_us) µs.

**What the paper does not measure.** The backward pass (\`--backward\`): each
(expert, helper) fetches the weights again and returns the expert's weight
gradient; at EP 8 \`feplb\` moves $(val "$tmp/bwd.md" feplb bwd_MB/step) MB per step in the backward pass, $(val "$tmp/bwd.md" feplb bwd_exposed_us) µs
of it exposed after the backward GEMMs. The scheduler's time: at α = 0.8
\`feplb\` cuts the effective straggler by $(val "$tmp/ep8-0.8.md" feplb eff_reduction)% with a 50 µs scheduler and by
$(val "$tmp/sched200.md" feplb eff_reduction)% with a 200 µs one. Heavy skew: at α = 1.2 one expert outweighs the
gap, and moving it whole only moves the straggler (\`feplb\` $(val "$tmp/ep8-1.2.md" feplb eff_reduction)%, \`eplb\`
$(val "$tmp/ep8-1.2.md" eplb eff_reduction)% of the effective straggler). Balanced routing: $(val "$tmp/balanced.md" feplb moved/step) moves per step;
moving work would cost more than the noise it evens out, and a warning under
the table says that FEPLB equals \`none\` there.

**Worse than \`none\`?** $(w=$(grep -l "^- worse than none" "$tmp"/ep*.md "$tmp"/strict*.md "$tmp"/bwd.md "$tmp"/share.md "$tmp"/balanced.md "$tmp"/sched200.md 2>/dev/null | wc -l)
if [ "$w" = 0 ]; then echo "In the tables below no policy's mean effective straggler is above \`none\`'s beyond the tie rule (0.5%);"; else echo "$w of the tables below name a policy worse than \`none\` (under the table);"; fi)
the tables where a policy ties with \`none\` say so under the table (\`= none\`).
Across a wider sweep (not in this file) \`fastermoe\`, \`eplb\` and \`feplb+place\`
can be worse; \`feplb\` and \`feplb-split\` cannot (see Policies).

## Tables
EOF

section() { printf '\n### %s\n\n' "$1"; cat "$2"; }
section "EP 2, calibrated" "$tmp/ep2.md"
section "EP 4, calibrated" "$tmp/ep4.md"
section "EP 8, calibrated" "$f8"
section "EP 8, calibrated, the strict reading of the scheduler (--feplb-fallback stop)" "$tmp/strict8.md"
section "EP 8, calibrated, with the backward pass" "$tmp/bwd.md"
section "EP 8, calibrated, copies with half of NVLink (EP traffic beside them)" "$tmp/share.md"
section "EP 8, balanced routing" "$tmp/balanced.md"
section "EP 8, α = 0.8" "$tmp/ep8-0.8.md"
section "EP 8, α = 0.8, a 200 µs scheduler" "$tmp/sched200.md"
section "EP 8, α = 1.2" "$tmp/ep8-1.2.md"
section "EP 16 (two NVLink domains, beyond the paper), calibrated" "$tmp/ep16.md"
section "EP 16 (two NVLink domains), α = 0.8" "$tmp/ep16-0.8.md"
} > "$tmp/README.md"
mv "$tmp/README.md" "$out"
