#!/usr/bin/env bash
# Checks that two builds behave alike, for a redesign that must change nothing:
#   29 `pipefisher plan` commands (every schedule, --kfac with the published profiles, sweeps,
#   refusals): stdout, stderr, exit status and written files byte for byte;
#   6 training runs on 2 or 4 ranks whose plan comes from one recorded profile (1F1B, Chimera,
#   1F1B x 2 replicas, and 1F1B adaptive: its units move into measured waits, its bits do not) or
#   that need none (inline and skip K-FAC over 2 replicas): every step's loss and gradient norm,
#   and the final weights, bit for bit.
# Usage: scripts/same-behaviour.sh OLD_BINARY NEW_BINARY [WORK_DIR]   (exit 1 if anything differs)
set -euo pipefail
old=$(realpath "$1") new=$(realpath "$2")
root=$(cd "$(dirname "$0")/.." && pwd)
work=${3:-$(mktemp -d)}
mkdir -p "$work"
profiles=$root/data/profiles
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

plans() {
  cat <<EOF
--schedule 1f1b --stages 4 --micro-batches 8 --tf 1 --tb 2
--schedule gpipe --stages 4 --micro-batches 8 --tf 1 --tb 2 --json
--schedule naive --stages 3 --micro-batches 4
--schedule interleaved --stages 4 --micro-batches 8 --virtual-stages 2
--schedule chimera --stages 4 --micro-batches 8 --json
--schedule zb-h1 --stages 4 --micro-batches 8 --tf 1 --tb 2 --tw 1
--schedule zb-h2 --stages 4 --micro-batches 8
--schedule zb-auto --stages 4 --micro-batches 8 --zb-memory 1.5
--schedule zb-v --stages 4 --micro-batches 8 --csv OUT/zbv.csv --csv-format torch
--schedule 1f1b --stages 4 --micro-batches 8 --svg OUT/1f1b.svg
--kfac --schedule 1f1b --stages 8 --micro-batches 8 --tf 31.17 --tb 48.84 --tcurv 82.35 --tinv 242.55 --tprec 26.7 --model bert-large --layers-per-stage 3
--kfac --schedule chimera --stages 8 --micro-batches 8 --model bert-large --profile $profiles/bert-large_p100.csv --micro-batch-size 8 --layers-per-stage 3
--kfac --schedule chimera --stages 4 --micro-batches 4 --model bert-base --profile $profiles/bert-base_v100.csv --micro-batch-size 8 --layers-per-stage 3 --json
--kfac --schedule 1f1b --stages 4 --micro-batches 8 --model bert-base --profile $profiles/bert-base_rtx3090.csv --micro-batch-size 8 --layers-per-stage 3 --data-parallel 2
--kfac --schedule interleaved --stages 4 --micro-batches 8 --model bert-base --profile $profiles/bert-base_p100.csv --micro-batch-size 8 --layers-per-stage 1
--kfac --schedule gpipe --stages 4 --micro-batches 4 --model opt-125m --profile $profiles/opt-125m_v100.csv --micro-batch-size 8 --layers-per-stage 3
--kfac --schedule zb-h1 --stages 4 --micro-batches 8 --model bert-base --profile $profiles/bert-base_p100.csv --micro-batch-size 8 --layers-per-stage 3
--kfac --schedule zb-v --stages 4 --micro-batches 8 --model bert-base --profile $profiles/bert-base_p100.csv --micro-batch-size 8 --layers-per-stage 3
--kfac --schedule 1f1b --stages 4 --micro-batches 4 --model bert-base --profile $profiles/bert-base_p100.csv --micro-batch-size 8 --layers-per-stage 3 --split-to-shorten --margin 0.1
--kfac --schedule chimera --stages 4 --micro-batches 4 --model bert-base --profile $profiles/bert-base_p100.csv --micro-batch-size 8 --layers-per-stage 3 --data-parallel 2 --bcast-alpha 1 --bcast-beta 0.001
--kfac --schedule 1f1b --stages 4 --micro-batches 8 --model bert-base --profile $profiles/bert-base_p100.csv --micro-batch-size 8 --layers-per-stage 3 --trace OUT/t.json
--sweep --schedule 1f1b --tf 1 --tb 2 --tcurv 1.5 --tinv 6 --tprec 0.5 --sweep-stages 2,4,8
--sweep --schedule chimera --sweep-stages 4 --json --profile $profiles/bert-base_p100.csv --micro-batch-size 8
--sweep --schedule interleaved --sweep-stages 2,4 --profile $profiles/bert-large_v100.csv --micro-batch-size 8 --csv OUT/sw.csv
--schedule-file $work/zbv.csv --kfac --model bert-base --layers-per-stage 3 --profile $profiles/bert-base_p100.csv --micro-batch-size 8
--schedule 1f1b --stages 2 --micro-batches 4 --profile $work/profile-1f1b.json
--kfac --schedule 1f1b --stages 2 --micro-batches 4 --profile $work/profile-1f1b.json
--kfac --schedule chimera --stages 2 --micro-batches 4 --profile $work/profile-chimera.json
--schedule nosuch --stages 2 --micro-batches 4
EOF
}

config=$work/tiny.toml
cat > "$config" <<EOF
[model]
arch = "bert"
layers = 4
hidden = 32
heads = 2
ffn = 64
seq_len = 16
max_position = 16
[data]
vocab = "bert"
train_file = "$root/data/sample/moby-dick-1-20.bert.bin"
valid_file = "$root/data/sample/moby-dick-1-20.bert.bin"
[optim]
name = "nvlamb"
lr = 5e-3
warmup_steps = 1
[train]
steps = 40
threads = 1
eval_every = 10
eval_batches = 2
[parallel]
micro_batches = 4
micro_batch_size = 2
[kfac]
enabled = true
damping = 3e-2
EOF

train() {  # train BINARY OUT_DIR RANKS SETTINGS...
  local bin=$1 out=$2 ranks=$3
  shift 3
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  "$root/scripts/pfrun" -np "$ranks" "$bin" train --config "$config" --set train.out_dir="$out" "${sets[@]}" > "$out.out" 2>&1
}

# The recorded profiles the planned runs use: measured once, by the old build.
train "$old" "$work/profile-run-1f1b" 2 parallel.stages=2 parallel.schedule=1f1b
train "$old" "$work/profile-run-chimera" 2 parallel.stages=2 parallel.schedule=chimera
train "$old" "$work/profile-run-2x2" 4 parallel.stages=2 parallel.data_parallel=2 parallel.schedule=1f1b
for p in 1f1b chimera 2x2; do cp "$work/profile-run-$p/kfac_profile.json" "$work/profile-$p.json"; done
"$old" plan --schedule zb-v --stages 4 --micro-batches 8 --csv "$work/zbv.csv" --csv-format torch > /dev/null

differ=0
for tag in old new; do
  bin=$old
  [[ $tag == new ]] && bin=$new
  i=0
  while IFS= read -r line; do
    i=$((i + 1))
    d=$work/$tag/plan-$i
    mkdir -p "$d"
    read -ra args <<< "${line//OUT/$d}"
    set +e
    "$bin" plan "${args[@]}" > "$d/stdout" 2> "$d/stderr"
    echo $? > "$d/status"
    set -e
    sed -i "s#$d#OUT#g" "$d/stdout" "$d/stderr"
  done < <(plans)
  train "$bin" "$work/$tag/1f1b" 2 parallel.stages=2 parallel.schedule=1f1b kfac.plan_profile="$work/profile-1f1b.json"
  train "$bin" "$work/$tag/chimera" 2 parallel.stages=2 parallel.schedule=chimera kfac.plan_profile="$work/profile-chimera.json"
  train "$bin" "$work/$tag/2x2" 4 parallel.stages=2 parallel.data_parallel=2 parallel.schedule=1f1b \
    kfac.plan_profile="$work/profile-2x2.json"
  train "$bin" "$work/$tag/adaptive" 2 parallel.stages=2 parallel.schedule=1f1b kfac.placement=adaptive \
    kfac.plan_profile="$work/profile-1f1b.json"
  train "$bin" "$work/$tag/inline-dp" 2 parallel.data_parallel=2
  train "$bin" "$work/$tag/skip-dp" 2 parallel.data_parallel=2 kfac.placement=skip kfac.inverse_every=3
done

for i in $(seq 1 "$(plans | wc -l)"); do
  if diff -r "$work/old/plan-$i" "$work/new/plan-$i" > /dev/null; then echo "plan $i: identical"
  else echo "plan $i: DIFFERS ($(plans | sed -n "${i}p"))"; differ=1; fi
done
losses() { jq -c '[.step, .loss, .grad_norm, .precond_grad_norm, .valid_loss]' "$1/log.jsonl"; }
for run in 1f1b chimera 2x2 adaptive inline-dp skip-dp; do
  if cmp -s <(losses "$work/old/$run") <(losses "$work/new/$run") &&
     cmp -s "$work/old/$run/model.safetensors" "$work/new/$run/model.safetensors"; then
    echo "training $run: losses and weights identical"
  else
    echo "training $run: DIFFERS"; differ=1
  fi
done
exit $differ
