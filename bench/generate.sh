#!/usr/bin/env bash
# bench/generate.sh: `generate`'s tokens per second with the KV cache against the whole context
# recomputed for every token (--no-kv-cache), at 256 new tokens.
#
#   bench/generate.sh [build-dir]   # default build/; MODEL=gpt2-mini, NEW=256, ROUNDS=3, THREADS=1
#
# A model of MODEL's shape is trained for one step (its weights only matter as numbers), then each
# round generates NEW tokens greedily from a one-token prompt both ways, in turn; model.seq_len is
# NEW + 1, so the cache holds the whole text. Prints each round's new tokens per second (the
# generation alone, as `generate --json` times it) and the median ratio of the rounds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/pipefisher
source "$root/bench/lib.sh"
model=${MODEL:-gpt2-mini}
new=${NEW:-256}
rounds=${ROUNDS:-3}
threads=${THREADS:-1}
[[ -x $bin ]] || { echo "generate.sh: no $bin (build the pipefisher target)" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cd "$root"
pf_machine "$bin" "$threads"
"$bin" train --config configs/gpt2-tiny.toml --set model.preset="$model" --set model.seq_len=64 --steps 1 \
  --set train.eval_every=0 --set train.checkpoint_every=0 --set train.threads="$threads" \
  --set train.out_dir="$out/run" > "$out/train.log"

rate() {  # new tokens per second of one generation
  "$bin" generate --init "$out/run" --set model.seq_len=$((new + 1)) --set train.threads="$threads" \
    --prompt "" --max-new-tokens "$new" --temperature 0 --json "$@" > "$out/gen.json"
  python3 -c "import json; print(f\"{json.load(open('$out/gen.json'))['timings']['new_tokens_per_s']:.1f}\")"
}

printf '%-6s %14s %14s %8s\n' round "cache tok/s" "no cache tok/s" "ratio"
ratios=()
for r in $(seq 1 "$rounds"); do
  cached=$(rate)
  cp "$out/gen.json" "$out/cached.json"
  full=$(rate --no-kv-cache)
  ratio=$(python3 -c "print(f'{$cached / $full:.2f}')")
  ratios+=("$ratio")
  printf '%-6s %14s %14s %8s\n' "$r" "$cached" "$full" "$ratio"
done
same=$(python3 -c "import json,sys; a=json.load(open('$out/cached.json'))['ids']; b=json.load(open('$out/gen.json'))['ids']; print(sum(x==y for x,y in zip(a,b)), 'of', len(a))")
median=$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}')
echo "$model, $new new tokens: the KV cache is ${median}x faster than recomputing (median of $rounds rounds); greedy tokens equal: $same"
