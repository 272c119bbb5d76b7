#!/usr/bin/env bash
# bench/zero_bubble_sim.sh: which use of a bubble the simulator prefers on the paper's BERT-Large
# profile: W (zero-bubble schedules), K-FAC (PipeFisher on 1F1B), or both (PipeFisher on ZB-H1/H2).
#
#   bench/zero_bubble_sim.sh [build-dir] [svg-dir]
#   env: PROFILE=data/profiles/bert-large_p100.csv BS=32 STAGES="8 16 32" SCHEDULES="1f1b zb-h1 zb-h2 zb-auto"
#        PICTURES="1f1b zb-h1"
#
# `pipefisher plan` on one transformer block per stage (the paper's performance model), N = D and
# N = 2D micro-batches, the CSV's backward split into I and W by flops (--model bert-large), with
# and without --kfac. Prints per (D, N, schedule): the step without K-FAC, PipeFisher's step
# (precondition included) and its ratio to 1F1B without K-FAC, the refresh period (steps per
# device: the largest and the mean) and K-FAC's utilization over it. With svg-dir, draws
# D = 8, N = 8 with PipeFisher for each of PICTURES (SCHEDULE-d8.svg: K-FAC work and W where
# the planner put them, per device).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
svg=${2:-}
bin=$build/pipefisher
profile=${PROFILE:-$root/data/profiles/bert-large_p100.csv}
bs=${BS:-32}
stages=${STAGES:-8 16 32}
schedules=${SCHEDULES:-1f1b zb-h1 zb-h2 zb-auto}
pictures=${PICTURES:-1f1b zb-h1}
[[ -x $bin ]] || { echo "zero_bubble_sim.sh: no $bin (build the pipefisher target)" >&2; exit 2; }
[[ -f $profile ]] || { echo "zero_bubble_sim.sh: no profile $profile" >&2; exit 2; }
if [[ -n $svg ]]; then mkdir -p "$svg"; fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--profile "$profile" --micro-batch-size "$bs" --layers-per-stage 1 --model bert-large --json)
for d in $stages; do
  for n in "$d" "$((2 * d))"; do
    for s in $schedules; do
      "$bin" plan "${common[@]}" --schedule "$s" --stages "$d" --micro-batches "$n" > "$out/$d-$n-$s.json"
      "$bin" plan "${common[@]}" --schedule "$s" --stages "$d" --micro-batches "$n" --kfac > "$out/$d-$n-$s-kfac.json"
    done
  done
done
if [[ -n $svg ]]; then
  for s in $pictures; do
    "$bin" plan "${common[@]}" --schedule "$s" --stages 8 --micro-batches 8 --kfac --steps 2 \
      --svg "$svg/$s-d8.svg" > /dev/null
  done
fi
echo "profile $(basename "$profile"), micro-batch size $bs, one block per stage, W by flops (bert-large)"
python3 - "$out" "$stages" "$schedules" <<'PY'
import json, statistics, sys
out, stages, schedules = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
print(f"{'D':>3} {'N':>3} {'schedule':8} {'step':>9} {'PipeFisher':>10} {'/1f1b':>6} {'refresh max':>11} "
      f"{'mean':>5} {'K-FAC util.':>11}")
for d in stages:
    for n in (int(d), 2 * int(d)):
        base = None
        for s in schedules:
            plain = json.load(open(f"{out}/{d}-{n}-{s}.json"))
            k = json.load(open(f"{out}/{d}-{n}-{s}-kfac.json"))["kfac"]
            if s == "1f1b":
                base = plain["step_time"]
            ratio = f"{k['step_time'] / base:6.3f}" if base else ""
            r = k["refresh_steps"]
            print(f"{d:>3} {n:>3} {s:8} {plain['step_time']:9.1f} {k['step_time']:10.1f} {ratio:>6} {max(r):>11} "
                  f"{statistics.mean(r):5.2f} {100 * k['utilization']:10.1f}%")
PY
