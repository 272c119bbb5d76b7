#!/usr/bin/env bash
# bench/contention.sh: threads under contention (issue 11). `pipefisher train` with
# train.threads = 1 and 2, on the machine as it is and beside one busy competing process that
# this script starts (a shell loop spinning on one core). Goal: beside the competitor, 2 threads
# >= 0.8x 1 thread; idle, 2 threads within 10% of BASELINE (an older pipefisher binary, run with
# the same BLAS kernel, so that only the threading differs), when BASELINE is given.
#
#   bench/contention.sh [build-dir]   # STEPS=10 REPEAT=2 BASELINE=/path/to/old/pipefisher
#
# The default job (bert-mini) without evaluation; tokens/s = median over steps 3..; rounds
# alternate the variants, the best round of each is kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/lib.sh"
bin=${1:-$root/build}/pipefisher
steps=${STEPS:-10} repeat=${REPEAT:-2} baseline=${BASELINE:-}
out=$(mktemp -d)
spinner=""
trap '[[ -n $spinner ]] && kill $spinner 2>/dev/null; rm -rf "$out"' EXIT

run() {  # run NAME BINARY THREADS [VAR=VALUE...]: prints tokens/s
  local name=$1 b=$2 t=$3; shift 3
  env "$@" "$b" train --steps "$steps" --set train.threads="$t" --set train.eval_every=0 \
    --set train.eval_batches=1 --set train.out_dir="$out/$name" > "$out/$name.txt"
  pf_tokens_per_s "$out/$name/log.jsonl"
}
kernel=$("$bin" machine | sed -E 's/.* kernel ([A-Za-z0-9]+) .*/\1/')

cd "$root"
pf_machine "$bin" 2
declare -A best
report() {  # report ROUND NAME TOKENS_PER_S
  printf 'round %d: %-14s %6d tokens/s   (load %s)\n' "$1" "$2" "$3" "$(cut -d' ' -f1 /proc/loadavg)"
  (( $3 > ${best[$2]:-0} )) && best[$2]=$3
  return 0
}
for ((k = 1; k <= repeat; ++k)); do
  for t in 1 2; do report "$k" "idle-$t" "$(run "idle-$t" "$bin" "$t")"; done
  if [[ -n $baseline ]]; then
    report "$k" "baseline-idle-2" "$(run baseline "$baseline" 2 OPENBLAS_CORETYPE="$kernel")"
  fi
  sh -c 'while :; do :; done' & spinner=$!
  sleep 1
  for t in 1 2; do report "$k" "busy-$t" "$(run "busy-$t" "$bin" "$t")"; done
  kill $spinner; wait $spinner 2>/dev/null || true; spinner=""
done
echo "best: idle 1 thread ${best[idle-1]}, 2 threads ${best[idle-2]} tokens/s ($(python3 -c "print(f'{${best[idle-2]}/${best[idle-1]}:.2f}')")x)"
echo "best: beside a busy process, 1 thread ${best[busy-1]}, 2 threads ${best[busy-2]} tokens/s: 2/1 = $(python3 -c "print(f'{${best[busy-2]}/${best[busy-1]}:.2f}')")"
if [[ -n $baseline ]]; then
  echo "best: idle 2 threads vs baseline ${best[baseline-idle-2]} tokens/s: $(python3 -c "print(f'{${best[idle-2]}/${best[baseline-idle-2]}:.3f}')")"
fi
