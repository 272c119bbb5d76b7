#!/usr/bin/env bash
# bench/pipefisher.sh: PipeFisher's step time in the runtime (issue 5) against the same schedule
# with NVLAMB alone (K-FAC off), bert-mini on 2 ranks x 1F1B, 1 thread per rank.
#
#   bench/pipefisher.sh [build-dir]   # default build/; STEPS=12 MB=4 MBS=8 REPEAT=2 SCHEDULE=1f1b
#
# Runs, on the fetched corpus (scripts/prepare-data.sh; configs/bert-mini.toml), alternating
# REPEAT rounds (the machine is shared: the best round of each is kept):
#   nvlamb     kfac.enabled = false
#   pipefisher kfac.enabled = true, kfac.placement = bubbles (steps 1-2 profile K-FAC inline,
#              then the planner's static schedule runs)
#   skip       kfac.placement = skip with kfac.inverse_every = the longest PipeFisher refresh
#              interval of that round ("K-FAC + skip" at PipeFisher's refresh frequency)
# and prints the mean step time over steps 5.. (after planning) and the ratios to nvlamb.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/pipefisher
source "$root/bench/lib.sh"
steps=${STEPS:-12}
mb=${MB:-4}
mbs=${MBS:-8}
schedule=${SCHEDULE:-1f1b}
repeat=${REPEAT:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

common=(--config "$root/configs/bert-mini.toml" --steps "$steps" --set train.eval_every=0 --set train.eval_batches=1
        --set parallel.micro_batches="$mb" --set parallel.micro_batch_size="$mbs" --set parallel.stages=2
        --set parallel.schedule="$schedule" --set train.threads=1)
cd "$root"
pf_machine "$bin" 1  # the ranks run 1 thread each
for ((k = 1; k <= repeat; ++k)); do
  echo "== round $k: nvlamb"
  "$root/scripts/pfrun" -np 2 "$bin" train "${common[@]}" --set train.out_dir="$out/$k/nvlamb" > /dev/null
  echo "== round $k: pipefisher"
  "$root/scripts/pfrun" -np 2 "$bin" train "${common[@]}" --set kfac.enabled=true --set kfac.placement=bubbles \
    --set train.out_dir="$out/$k/pipefisher" | grep -E "^pipefisher: planned" | tee "$out/$k/plan.txt"
  every=$(sed -E 's/.*refresh every ([0-9 ]+) steps.*/\1/' "$out/$k/plan.txt" | tr ' ' '\n' | sort -n | tail -1)
  echo "== round $k: skip (inverse_every $every)"
  "$root/scripts/pfrun" -np 2 "$bin" train "${common[@]}" --set kfac.enabled=true --set kfac.placement=skip \
    --set kfac.inverse_every="$every" --set train.out_dir="$out/$k/skip" > /dev/null
done

python3 - "$out" "$repeat" <<'PY'
import json, sys
out, repeat = sys.argv[1], int(sys.argv[2])
def mean_step(path):
    t = [json.loads(l)["step_time_s"] for l in open(path) if json.loads(l)["step"] >= 5]
    return 1000 * sum(t) / len(t)
best = {}
for k in range(1, repeat + 1):
    for run in ("nvlamb", "pipefisher", "skip"):
        ms = mean_step(f"{out}/{k}/{run}/log.jsonl")
        print(f"round {k}: {run:10s} {ms:8.1f} ms/step")
        best[run] = min(best.get(run, 1e30), ms)
print(f"best: nvlamb {best['nvlamb']:.1f} ms, pipefisher {best['pipefisher']:.1f} ms "
      f"({best['pipefisher'] / best['nvlamb']:.3f}x), skip {best['skip']:.1f} ms "
      f"({best['skip'] / best['nvlamb']:.3f}x)")
PY
