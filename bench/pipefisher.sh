#!/usr/bin/env bash
# bench/pipefisher.sh: PipeFisher's step time in the runtime against the same schedule with NVLAMB
# alone (K-FAC off), bert-mini on 2 ranks, 1 thread per rank, at several tokens per step.
#
#   bench/pipefisher.sh [build-dir] [csv-out]
#   env: TOKENS="1024 4096 16384" SEQ=128 MB=4 STEPS=34 REPEAT=5 SCHEDULE=1f1b SOAP=0 SKIP=1
#
# Tokens per step are the configuration's own: parallel.micro_batches (MB) x
# parallel.micro_batch_size x model.seq_len (SEQ); the micro-batch size is TOKENS / (MB x SEQ).
# For each shape, REPEAT rounds of three runs one after another, in an order that rotates per round
# (the machine may be shared or drift, so each is timed in every round):
#   nvlamb     kfac.enabled = false
#   pipefisher kfac.enabled = true, kfac.placement = bubbles (steps 1-2 profile K-FAC inline,
#              then the planner's static schedule runs), kfac.replan_on_drift = false (a re-profile
#              on a shared machine's noise would put inline steps among the timed ones)
#   skip       kfac.placement = skip with kfac.inverse_every = the longest PipeFisher refresh
#              interval of that round ("K-FAC + skip" at PipeFisher's refresh frequency);
#              SKIP=0 leaves it out (a study's step ratio needs only the first two)
# and with SOAP=1 (issue 48) two more:
#   soap         optim.name = soap, its eigenbasis refreshes inline in the optimizer step
#   soap-bubbles optim.name = soap, kfac.placement = bubbles (the refreshes in the bubbles)
# A run's step time is its mean step_time_s over steps 5.. (after planning): STEPS=34 times 30
# steps. The defaults (5 rounds of 30 timed steps) are what issue 52 asks of a number the studies
# use. Per shape and run it prints the median round, the spread of the rounds (min, quartiles,
# max), the best round, and the ratio of medians to nvlamb's (the headline) beside the ratio of
# bests; and the plan's refresh. With csv-out, writes the same table as CSV:
#   tokens_per_step,run,rounds,steps,median_ms,min_ms,q1_ms,q3_ms,max_ms,best_ms,ratio,best_ratio,refresh
# `ratio` is the ratio of medians (before issue 52 it was of bests: `best_ratio` now);
# bench/convergence/study.py reads tokens_per_step, run and median_ms.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
csv=${2:-}
bin=$build/pipefisher
source "$root/bench/lib.sh"
tokens=${TOKENS:-1024 4096 16384}
seq=${SEQ:-128}
mb=${MB:-4}
steps=${STEPS:-34}
schedule=${SCHEDULE:-1f1b}
repeat=${REPEAT:-5}
[[ -x $bin ]] || { echo "pipefisher.sh: no $bin (build the pipefisher target)" >&2; exit 2; }
((steps >= 6)) || { echo "pipefisher.sh: STEPS must be at least 6 (steps 5.. are timed)" >&2; exit 2; }
for t in $tokens; do
  ((t % (mb * seq) == 0)) || { echo "pipefisher.sh: TOKENS $t is not a multiple of MB x SEQ = $((mb * seq))" >&2; exit 2; }
done
[[ ${SKIP:-1} == 1 || ${SOAP:-0} == 0 ]] ||
  { echo "pipefisher.sh: SKIP=0 with SOAP=1 is not built (SOAP's orders include skip)" >&2; exit 2; }
((repeat >= 5 && steps >= 34)) ||
  echo "pipefisher.sh: note: REPEAT=$repeat rounds of $((steps - 4)) timed steps, fewer than the 5 of 30 the studies use" >&2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cd "$root"
pf_machine "$bin" 1  # the ranks run 1 thread each
run() { pf_two_ranks "$1" "$schedule" "${@:2}"; }  # dir, extra args...
run_nvlamb() { run "$1/nvlamb" > /dev/null; }
run_pipefisher() {
  run "$1/pipefisher" --set kfac.enabled=true --set kfac.placement=bubbles --set kfac.replan_on_drift=false |
    grep -E "^pipefisher: planned" > "$1/plan.txt" || true
}
run_soap() { run "$1/soap" --set optim.name=soap > /dev/null; }
run_soap-bubbles() { run "$1/soap-bubbles" --set optim.name=soap --set kfac.placement=bubbles > /dev/null; }
run_skip() {  # after the round's PipeFisher run: its longest refresh interval
  local every
  every=$(sed -nE 's/.*refresh every ([0-9 ]+) steps.*/\1/p' "$1/plan.txt" | tr ' ' '\n' | sort -n | tail -1)
  [[ -n $every ]] || { echo "pipefisher.sh: the PipeFisher run printed no plan" >&2; exit 1; }
  run "$1/skip" --set kfac.enabled=true --set kfac.placement=skip --set kfac.inverse_every="$every" > /dev/null
}
# The order rotates per round, so that a machine that drifts within a round favours no run: NVLAMB
# first, second and last once in every 3 rounds (skip needs the round's PipeFisher plan).
orders=("nvlamb pipefisher skip" "pipefisher skip nvlamb" "pipefisher nvlamb skip")
runs="nvlamb pipefisher skip"
if [[ ${SKIP:-1} == 0 ]]; then
  runs="nvlamb pipefisher"
  orders=("nvlamb pipefisher" "pipefisher nvlamb")
fi
# SOAP's two runs go first, between or last in turn (their own order alternating).
if [[ ${SOAP:-0} == 1 ]]; then
  runs+=" soap soap-bubbles"
  orders=("soap nvlamb pipefisher skip soap-bubbles" "pipefisher skip soap-bubbles nvlamb soap"
          "pipefisher nvlamb soap skip soap-bubbles" "soap-bubbles nvlamb pipefisher skip soap"
          "pipefisher skip soap nvlamb soap-bubbles" "pipefisher soap-bubbles nvlamb skip soap")
fi
for t in $tokens; do
  mbs=$((t / (mb * seq)))
  for ((k = 1; k <= repeat; ++k)); do
    d=$out/$t/$k
    order=${orders[$(((k - 1) % ${#orders[@]}))]}
    mkdir -p "$d"
    echo "== $t tokens per step ($mb x $mbs x $seq), round $k: ${order// /, }"
    for r in $order; do "run_$r" "$d"; done
  done
done

python3 - "$out" "$repeat" "$steps" "$csv" "$runs" $tokens <<'PY'
import csv, json, os, re, statistics, sys
out, repeat, steps, csv_path, runs, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5].split(), sys.argv[6:]
def mean_step(path):
    t = [r["step_time_s"] for r in map(json.loads, open(path)) if r["step"] >= 5]
    return 1000 * sum(t) / len(t)
def quartiles(ts):  # the rounds' first and third quartiles (one round: itself)
    if len(ts) < 2:
        return ts[0], ts[0]
    q = statistics.quantiles(ts, n=4, method="inclusive")
    return q[0], q[2]
rows = []
for tok in tokens:
    times = {run: [mean_step(f"{out}/{tok}/{k}/{run}/log.jsonl") for k in range(1, repeat + 1)]
             for run in runs}
    plans = {open(f"{out}/{tok}/{k}/plan.txt").read().strip() for k in range(1, repeat + 1)}
    refresh = "; ".join(sorted(re.sub(r".*refresh every ([0-9 ]+) steps.*", r"\1", p) for p in plans))
    base_median, base_best = statistics.median(times["nvlamb"]), min(times["nvlamb"])
    for run, ts in times.items():
        q1, q3 = quartiles(ts)
        rows.append({"tokens_per_step": tok, "run": run, "rounds": len(ts), "steps": steps - 4,
                     "median_ms": round(statistics.median(ts), 1), "min_ms": round(min(ts), 1),
                     "q1_ms": round(q1, 1), "q3_ms": round(q3, 1), "max_ms": round(max(ts), 1),
                     "best_ms": round(min(ts), 1), "ratio": round(statistics.median(ts) / base_median, 3),
                     "best_ratio": round(min(ts) / base_best, 3),
                     "refresh": refresh if run in ("pipefisher", "skip") else ""})
print(f"{'tokens/step':>11} {'run':12} {'median ms':>9} {'spread: min / q1 / q3 / max ms':>31} {'best ms':>8} "
      f"{'median ratio':>12} {'best ratio':>10}  refresh (steps per device)")
for r in rows:
    spread = f"{r['min_ms']:.1f} / {r['q1_ms']:.1f} / {r['q3_ms']:.1f} / {r['max_ms']:.1f}"
    print(f"{r['tokens_per_step']:>11} {r['run']:12} {r['median_ms']:9.1f} {spread:>31} {r['best_ms']:8.1f} "
          f"{r['ratio']:11.3f}x {r['best_ratio']:9.3f}x  {r['refresh']}")
for tok in tokens:
    pf = next(r for r in rows if r["tokens_per_step"] == tok and r["run"] == "pipefisher")
    skip = next((r for r in rows if r["tokens_per_step"] == tok and r["run"] == "skip"), None)
    print(f"{tok} tokens per step: PipeFisher {pf['ratio']:.3f}x NVLAMB's step"
          + (f", K-FAC + skip {skip['ratio']:.3f}x" if skip else "")
          + f" (ratios of the medians of {pf['rounds']} rounds of {pf['steps']} timed steps)")
    if "soap" in runs:
        soap, soap_b = (next(r for r in rows if r["tokens_per_step"] == tok and r["run"] == x) for x in ("soap", "soap-bubbles"))
        print(f"{tok} tokens per step: SOAP inline {soap['ratio']:.3f}x NVLAMB's step, SOAP in the bubbles {soap_b['ratio']:.3f}x")
if csv_path:
    with open(csv_path + ".tmp", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    os.replace(csv_path + ".tmp", csv_path)
PY
