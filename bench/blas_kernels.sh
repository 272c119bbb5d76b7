#!/usr/bin/env bash
# bench/blas_kernels.sh: `pipefisher train` as installed (the BLAS kernel family it picks at
# start-up, src/core/machine.hpp) against the same run with OPENBLAS_CORETYPE forced to each
# family this CPU can run (issue 11: installed / fastest forced >= 0.95).
#
#   bench/blas_kernels.sh [build-dir]    # default build/; STEPS=10 THREADS=2 REPEAT=2
#
# The default job (bert-mini, 4 x 8 x 128 tokens per step) without evaluation; tokens/s is the
# median over steps 3..; rounds alternate the variants, each round starting one variant later (no
# variant always runs first), and the best round of each is kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/lib.sh"
bin=${1:-$root/build}/pipefisher
steps=${STEPS:-10} threads=${THREADS:-2} repeat=${REPEAT:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }
families=(Prescott)
has avx2 && has fma && families+=(Haswell)
has avx512f && has avx512bw && has avx512vl && has avx512dq && families+=(SkylakeX)
has avx512_bf16 && families+=(Cooperlake)

run() {  # run NAME [VAR=VALUE...]: one training run, prints its tokens/s
  local name=$1; shift
  env "$@" "$bin" train --steps "$steps" --set train.threads="$threads" --set train.eval_every=0 \
    --set train.eval_batches=1 --set train.out_dir="$out/$name" > "$out/$name.txt"
  pf_tokens_per_s "$out/$name/log.jsonl"
}

cd "$root"
pf_machine "$bin" "$threads"
declare -A best
variants=(installed "${families[@]}")
for ((k = 1; k <= repeat; ++k)); do
  n=${#variants[@]}
  for ((i = 0; i < n; ++i)); do
    v=${variants[(i + k - 1) % n]}
    if [[ $v == installed ]]; then tps=$(run "$v" -u OPENBLAS_CORETYPE)
    else tps=$(run "$v" OPENBLAS_CORETYPE="$v"); fi
    kernel=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['machine']['blas_kernel'])" "$out/$v/summary.json")
    printf 'round %d: %-10s kernel %-10s %6d tokens/s   (load %s)\n' "$k" "$v" "$kernel" "$tps" "$(cut -d' ' -f1 /proc/loadavg)"
    (( tps > ${best[$v]:-0} )) && best[$v]=$tps
  done
done
fastest=Prescott
for f in "${families[@]}"; do (( best[$f] > best[$fastest] )) && fastest=$f; done
python3 -c "
i, f, p = ${best[installed]}, ${best[$fastest]}, ${best[Prescott]}
print(f'best: installed {i} tokens/s, fastest forced ($fastest) {f}: ratio {i / f:.3f}; generic Prescott {p}: installed is {i / p:.2f}x')"
