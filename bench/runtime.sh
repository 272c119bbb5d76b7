#!/usr/bin/env bash
# bench/runtime.sh: the MPI runtime (issue 4) on bert-mini, 2 ranks x 1F1B against one process.
#
#   bench/runtime.sh [build-dir]   # default build/; STEPS=4 MB=8 MBS=4 REPEAT=2 override the run
#
# Runs, on the fetched corpus (scripts/prepare-data.sh; configs/bert-mini.toml):
#   single-1t   one process, 1 thread
#   single-2t   one process, 2 threads (all of this machine's cores)
#   pipe-2x1    scripts/pfrun -np 2, 1F1B over 2 stages, 1 thread per rank, profiled
# REPEAT times, alternating (the machine is shared: the best round of each is kept), and prints
# tokens/s (steps 2.. only: step 1 pays first-touch allocation), the profiled
# steps' measured utilization per rank next to what the simulator predicts from the profile
# measured in the same run, and the communication wait per rank per step.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/pipefisher
source "$root/bench/lib.sh"
steps=${STEPS:-4}
mb=${MB:-8}
mbs=${MBS:-4}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

common=(--config "$root/configs/bert-mini.toml" --steps "$steps" --set train.eval_every=0 --set train.eval_batches=1
        --set parallel.micro_batches="$mb" --set parallel.micro_batch_size="$mbs")
repeat=${REPEAT:-2}
cd "$root"
pf_machine "$bin" 1  # the ranks run 1 thread each
for ((k = 1; k <= repeat; ++k)); do
  echo "== round $k: single process, 1 thread"
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$bin" train "${common[@]}" --set train.threads=1 \
    --set train.out_dir="$out/$k/single-1t" > /dev/null
  echo "== round $k: single process, 2 threads"
  OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 "$bin" train "${common[@]}" --set train.threads=2 \
    --set train.out_dir="$out/$k/single-2t" > /dev/null
  echo "== round $k: 2 ranks x 1F1B, 1 thread each"
  "$root/scripts/pfrun" -np 2 "$bin" train "${common[@]}" --set parallel.stages=2 --set train.threads=1 \
    --set train.out_dir="$out/$k/pipe-2x1" --profile-dir "$out/$k/pipe-2x1/profile" | grep -E "^profile"
done

python3 - "$out" "$repeat" <<'PY'
import json, sys
out, repeat = sys.argv[1], int(sys.argv[2])
def tps(k, run):
    rows = [json.loads(l) for l in open(f"{out}/{k}/{run}/log.jsonl")][1:]
    return sum(r["tokens"] for r in rows) / sum(r["step_time_s"] for r in rows)
runs = ("single-1t", "single-2t", "pipe-2x1")
best = {r: max(range(1, repeat + 1), key=lambda k: tps(k, r)) for r in runs}
t = {r: tps(best[r], r) for r in runs}
print(f"tokens/s (steps 2.., best of {repeat}): single 1 thread {t['single-1t']:.0f}, single 2 threads "
      f"{t['single-2t']:.0f}, 2 ranks x 1F1B {t['pipe-2x1']:.0f} ({t['pipe-2x1'] / t['single-2t']:.2f}x single "
      f"2 threads, {t['pipe-2x1'] / t['single-1t']:.2f}x single 1 thread)")
m = json.load(open(f"{out}/{best['pipe-2x1']}/pipe-2x1/profile/profile.json"))["measured"]
print(f"that 2-rank run, profiled steps {m['steps']}: measured step {m['step_time']:.1f} ms, "
      f"predicted {m['predicted_step_time']:.1f} ms")
for r, (u, p, w) in enumerate(zip(m["utilization"], m["predicted_utilization"], m["comm_wait"])):
    print(f"  rank {r}: utilization measured {100 * u:.1f}% predicted {100 * p:.1f}%, "
          f"communication wait {w:.1f} ms/step")
PY
