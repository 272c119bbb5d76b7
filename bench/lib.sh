# Shared by the bench/*.sh scripts (source it): the machine line and a training run's speed.
#   pf_machine BIN [THREADS]     prints "machine: CPU, BLAS kernel, threads, OMP_WAIT_POLICY, load"
#   pf_tokens_per_s LOG.jsonl    median tokens/s over steps 3.. of a run's log (steps 1-2 warm up)
#   pf_two_ranks DIR SCHEDULE [ARGS...]   bert-mini trained on 2 stages, 1 thread per rank, no
#                                validation, into DIR; reads $root $bin $steps $seq $mb $mbs

pf_machine() { "$1" machine --threads "${2:-0}"; }

pf_two_ranks() {
  local dir=$1 schedule=$2
  shift 2
  "$root/scripts/pfrun" -np 2 "$bin" train --config "$root/configs/bert-mini.toml" --steps "$steps" \
    --set train.eval_every=0 --set train.eval_batches=1 --set model.seq_len="$seq" \
    --set parallel.micro_batches="$mb" --set parallel.micro_batch_size="$mbs" --set parallel.stages=2 \
    --set parallel.schedule="$schedule" --set train.threads=1 --set train.out_dir="$dir" "$@"
}

pf_tokens_per_s() {
  python3 - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{statistics.median(r['tokens_per_s'] for r in rows if r['step'] >= 3):.0f}")
PY
}
