#!/usr/bin/env bash
# bench/pipefisher.sh: PipeFisher's step time in the runtime against the same schedule with NVLAMB
# alone (K-FAC off), bert-mini on 2 ranks, 1 thread per rank, at several tokens per step.
#
#   bench/pipefisher.sh [build-dir] [csv-out]
#   env: TOKENS="1024 4096 16384" SEQ=128 MB=4 STEPS=12 REPEAT=3 SCHEDULE=1f1b
#
# Tokens per step are the configuration's own: parallel.micro_batches (MB) x
# parallel.micro_batch_size x model.seq_len (SEQ); the micro-batch size is TOKENS / (MB x SEQ).
# For each shape, REPEAT rounds of three runs side by side (the machine may be shared, so each is
# timed in every round and both the best and the median round are kept):
#   nvlamb     kfac.enabled = false
#   pipefisher kfac.enabled = true, kfac.placement = bubbles (steps 1-2 profile K-FAC inline,
#              then the planner's static schedule runs)
#   skip       kfac.placement = skip with kfac.inverse_every = the longest PipeFisher refresh
#              interval of that round ("K-FAC + skip" at PipeFisher's refresh frequency)
# A run's step time is its mean step_time_s over steps 5.. (after planning). Prints one line per
# shape and run (best, median, max, ratio of best to nvlamb's best) and the plan's refresh; with
# csv-out, writes the same table as CSV (tokens_per_step,run,best_ms,median_ms,max_ms,ratio,refresh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
csv=${2:-}
bin=$build/pipefisher
source "$root/bench/lib.sh"
tokens=${TOKENS:-1024 4096 16384}
seq=${SEQ:-128}
mb=${MB:-4}
steps=${STEPS:-12}
schedule=${SCHEDULE:-1f1b}
repeat=${REPEAT:-3}
[[ -x $bin ]] || { echo "pipefisher.sh: no $bin (build the pipefisher target)" >&2; exit 2; }
((steps >= 6)) || { echo "pipefisher.sh: STEPS must be at least 6 (steps 5.. are timed)" >&2; exit 2; }
for t in $tokens; do
  ((t % (mb * seq) == 0)) || { echo "pipefisher.sh: TOKENS $t is not a multiple of MB x SEQ = $((mb * seq))" >&2; exit 2; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cd "$root"
pf_machine "$bin" 1  # the ranks run 1 thread each
run() { pf_two_ranks "$1" "$schedule" "${@:2}"; }  # dir, extra args...
for t in $tokens; do
  mbs=$((t / (mb * seq)))
  for ((k = 1; k <= repeat; ++k)); do
    d=$out/$t/$k
    echo "== $t tokens per step ($mb x $mbs x $seq), round $k: nvlamb, pipefisher, skip"
    run "$d/nvlamb" > /dev/null
    run "$d/pipefisher" --set kfac.enabled=true --set kfac.placement=bubbles |
      grep -E "^pipefisher: planned" > "$d/plan.txt" || true
    every=$(sed -nE 's/.*refresh every ([0-9 ]+) steps.*/\1/p' "$d/plan.txt" | tr ' ' '\n' | sort -n | tail -1)
    [[ -n $every ]] || { echo "pipefisher.sh: the PipeFisher run printed no plan" >&2; exit 1; }
    run "$d/skip" --set kfac.enabled=true --set kfac.placement=skip --set kfac.inverse_every="$every" > /dev/null
  done
done

python3 - "$out" "$repeat" "$csv" $tokens <<'PY'
import csv, json, re, statistics, sys
out, repeat, csv_path, tokens = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
def mean_step(path):
    t = [r["step_time_s"] for r in map(json.loads, open(path)) if r["step"] >= 5]
    return 1000 * sum(t) / len(t)
rows = []
for tok in tokens:
    times = {run: [mean_step(f"{out}/{tok}/{k}/{run}/log.jsonl") for k in range(1, repeat + 1)]
             for run in ("nvlamb", "pipefisher", "skip")}
    plans = {open(f"{out}/{tok}/{k}/plan.txt").read().strip() for k in range(1, repeat + 1)}
    refresh = "; ".join(sorted(re.sub(r".*refresh every ([0-9 ]+) steps.*", r"\1", p) for p in plans))
    base = min(times["nvlamb"])
    for run, ts in times.items():
        rows.append({"tokens_per_step": tok, "run": run, "best_ms": round(min(ts), 1),
                     "median_ms": round(statistics.median(ts), 1), "max_ms": round(max(ts), 1),
                     "ratio": round(min(ts) / base, 3), "refresh": refresh if run != "nvlamb" else ""})
print(f"{'tokens/step':>11} {'run':10} {'best ms':>9} {'median ms':>9} {'max ms':>9} {'best/nvlamb':>11}  refresh (steps per device)")
for r in rows:
    print(f"{r['tokens_per_step']:>11} {r['run']:10} {r['best_ms']:9.1f} {r['median_ms']:9.1f} {r['max_ms']:9.1f} "
          f"{r['ratio']:10.3f}x  {r['refresh']}")
if csv_path:
    with open(csv_path + ".tmp", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    import os
    os.replace(csv_path + ".tmp", csv_path)
PY
