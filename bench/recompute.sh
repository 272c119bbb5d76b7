#!/usr/bin/env bash
# bench/recompute.sh: activation recomputation (parallel.recompute) on bert-mini, 2 ranks, tokens/s
# and the activation memory held, recompute off against on.
#
#   bench/recompute.sh [build-dir]   # default build/; STEPS=4 MB=8 MBS=4 REPEAT=2 SCHEDULE=1f1b
#
# Runs scripts/pfrun -np 2 over 2 stages, 1 thread per rank, on the fetched corpus
# (scripts/prepare-data.sh; configs/bert-mini.toml), off and on alternated REPEAT times (the machine
# is shared: the best round of each is kept). Prints tokens/s over steps 2.. (step 1 pays
# first-touch allocation), their ratio, and each rank's peak bytes held from activations.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/pipefisher
source "$root/bench/lib.sh"
steps=${STEPS:-4}
mb=${MB:-8}
mbs=${MBS:-4}
schedule=${SCHEDULE:-1f1b}
repeat=${REPEAT:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

common=(--config "$root/configs/bert-mini.toml" --steps "$steps" --set train.eval_every=0 --set train.eval_batches=1
        --set optim.warmup_steps=1
        --set parallel.micro_batches="$mb" --set parallel.micro_batch_size="$mbs" --set parallel.stages=2
        --set parallel.schedule="$schedule" --set train.threads=1)
cd "$root"
pf_machine "$bin" 1  # the ranks run 1 thread each
for ((k = 1; k <= repeat; ++k)); do
  for r in false true; do
    echo "== round $k: 2 ranks x $schedule, parallel.recompute = $r"
    "$root/scripts/pfrun" -np 2 "$bin" train "${common[@]}" --set parallel.recompute="$r" \
      --set train.out_dir="$out/$k/$r" > /dev/null
  done
done

python3 - "$out" "$repeat" "$schedule" <<'PY'
import json, sys
out, repeat, schedule = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def tps(k, run):
    rows = [json.loads(l) for l in open(f"{out}/{k}/{run}/log.jsonl")][1:]
    return sum(r["tokens"] for r in rows) / sum(r["step_time_s"] for r in rows)
best = {r: max(range(1, repeat + 1), key=lambda k: tps(k, r)) for r in ("false", "true")}
t = {r: tps(best[r], r) for r in best}
print(f"tokens/s (steps 2.., best of {repeat}), 2 ranks x {schedule}: recompute off {t['false']:.0f}, "
      f"on {t['true']:.0f} (on/off {t['true'] / t['false']:.2f})")
for r in ("false", "true"):
    a = json.load(open(f"{out}/{best[r]}/{r}/activations.json"))
    held = ", ".join(f"rank {i} {x['peak_bytes'] / 1e6:.1f} MB (state {x['stages'][0]['state_bytes'] / 1e6:.1f} MB)"
                     for i, x in enumerate(a["ranks"]))
    print(f"  recompute {'on ' if r == 'true' else 'off'}: peak activation memory held {held}")
PY
