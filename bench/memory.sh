#!/usr/bin/env bash
# bench/memory.sh: the memory check's estimate (config/limits.hpp, an upper bound of a run's peak)
# against the peak resident memory the ranks reach, for several shapes.
#
#   bench/memory.sh [build-dir]   # default build/; STEPS=3; SHAPES="1 2 ..." picks rows of the list
#
# Each shape trains $STEPS steps (K-FAC from the first step where enabled, so its factors, inverses
# and inversion workspace are held) with 1 thread per rank on the fetched corpus
# (scripts/prepare-data.sh) and reads summary.json's memory: each rank's peak resident set (VmHWM)
# summed over the ranks, against the estimate for all of them. Prints one row per shape with
# estimate / peak (the margin: above 1 the estimate holds), and the smallest margin.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/pipefisher
source "$root/bench/lib.sh"
steps=${STEPS:-3}
[[ -x $bin ]] || { echo "memory.sh: no $bin (build the pipefisher target)" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# name | ranks | arguments
shapes=(
  "bert-tiny seq 128, 4 x 8, NVLAMB|1|--config configs/bert-tiny.toml --set model.seq_len=128 --set parallel.micro_batches=4 --set parallel.micro_batch_size=8"
  "bert-mini seq 128, 4 x 32, K-FAC|1|--config configs/bert-mini.toml --set model.seq_len=128 --set parallel.micro_batches=4 --set parallel.micro_batch_size=32 --set kfac.enabled=true --set kfac.placement=inline"
  "bert-mini seq 512, 2 x 16, K-FAC|1|--config configs/bert-mini.toml --set model.seq_len=512 --set parallel.micro_batches=2 --set parallel.micro_batch_size=16 --set kfac.enabled=true --set kfac.placement=inline"
  "gpt2-mini seq 256, 2 x 16, NVLAMB|1|--config configs/gpt2-mini.toml --set model.seq_len=256 --set parallel.micro_batches=2 --set parallel.micro_batch_size=16"
  "bert-small seq 128, 2 x 16, K-FAC|1|--config configs/bert-small.toml --set model.seq_len=128 --set parallel.micro_batches=2 --set parallel.micro_batch_size=16 --set kfac.enabled=true --set kfac.placement=inline"
  "bert-mini seq 128, 4 x 32, 2 ranks 1F1B, PipeFisher|2|--config configs/bert-mini.toml --set model.seq_len=128 --set parallel.micro_batches=4 --set parallel.micro_batch_size=32 --set parallel.stages=2 --set parallel.schedule=1f1b --set kfac.enabled=true --set kfac.placement=bubbles"
  "bert-mini seq 128, 4 x 32, 2 ranks GPipe|2|--config configs/bert-mini.toml --set model.seq_len=128 --set parallel.micro_batches=4 --set parallel.micro_batch_size=32 --set parallel.stages=2 --set parallel.schedule=gpipe"
  "bert-base seq 128, 2 x 8, 2 ranks 1F1B, K-FAC|2|--config configs/bert-base.toml --set model.seq_len=128 --set parallel.micro_batches=2 --set parallel.micro_batch_size=8 --set parallel.stages=2 --set parallel.schedule=1f1b --set kfac.enabled=true --set kfac.placement=inline"
)
pick=${SHAPES:-$(seq -s ' ' 1 ${#shapes[@]})}

cd "$root"
pf_machine "$bin" 1
printf '%-52s %12s %12s %8s\n' shape "peak" "estimate" "margin"
for i in $pick; do
  IFS='|' read -r name ranks args <<< "${shapes[$((i - 1))]}"
  dir=$out/$i
  launch=(); ((ranks > 1)) && launch=(scripts/pfrun -np "$ranks")
  # shellcheck disable=SC2086  # the shape's arguments are words
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "${launch[@]}" "$bin" train $args --set train.steps="$steps" \
    --set train.threads=1 --set optim.warmup_steps=0 --set kfac.warmup_steps=0 --set train.eval_every=0 \
    --set train.eval_batches=1 --set train.checkpoint_every=0 --set train.out_dir="$dir" > "$dir.out" 2>&1 \
    || { echo "memory.sh: '$name' failed:" >&2; tail -5 "$dir.out" >&2; exit 1; }
  python3 - "$dir/summary.json" "$name" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["memory"]
peak, est = sum(m["peak_rss_bytes"]), m["estimate_bytes"]
print(f"{sys.argv[2]:52s} {peak / 2**30:8.2f} GiB {est / 2**30:8.2f} GiB {est / peak:8.2f}")
PY
done | tee "$out/table"
awk '{print $NF}' "$out/table" | sort -g | head -1 | sed 's/^/smallest margin (estimate \/ peak): /'
