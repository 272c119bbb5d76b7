#!/usr/bin/env bash
# bench/step_account.sh: where PipeFisher's step goes against NVLAMB's (issue 52). For each
# tokens-per-step, three runs of bert-mini on 2 ranks x 1F1B (1 thread per rank,
# kfac.replan_on_drift = false), each profiled at steps 5..STEPS: NVLAMB, PipeFisher, NVLAMB
# again. Then `pipefisher report --account` of PipeFisher against the first NVLAMB run (the
# critical path's parts averaged over the steps, the passes by setting, and the plan's line), and
# the control: the second NVLAMB run against the first, the same code twice, whose difference is
# what the machine alone moves a run by.
#
#   bench/step_account.sh [build-dir]
#   env: TOKENS="4096 16384" SEQ=128 MB=4 STEPS=12 SCHEDULE=1f1b FULL=0 (1: every step's table)
#
# Run it on a quiet machine: the account is of one run each, not a median.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/pipefisher
source "$root/bench/lib.sh"
tokens=${TOKENS:-4096 16384}
seq=${SEQ:-128}
mb=${MB:-4}
steps=${STEPS:-12}
schedule=${SCHEDULE:-1f1b}
[[ -x $bin ]] || { echo "step_account.sh: no $bin (build the pipefisher target)" >&2; exit 2; }
((steps >= 6)) || { echo "step_account.sh: STEPS must be at least 6 (steps 5.. are profiled)" >&2; exit 2; }
for t in $tokens; do
  ((t % (mb * seq) == 0)) || { echo "step_account.sh: TOKENS $t is not a multiple of MB x SEQ = $((mb * seq))" >&2; exit 2; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cd "$root"
pf_machine "$bin" 1
profiled=$(seq -s, 5 "$steps")
for t in $tokens; do
  mbs=$((t / (mb * seq)))
  d=$out/$t
  echo "== $t tokens per step ($mb x $mbs x $seq), steps 5-$steps profiled"
  pf_two_ranks "$d/nvlamb" "$schedule" --profile-dir "$d/nvlamb/profile" --profile-steps "$profiled" > /dev/null
  pf_two_ranks "$d/pipefisher" "$schedule" --set kfac.enabled=true --set kfac.placement=bubbles \
    --set kfac.replan_on_drift=false --profile-dir "$d/pipefisher/profile" --profile-steps "$profiled" |
    grep -E "^pipefisher: planned" || true
  pf_two_ranks "$d/nvlamb2" "$schedule" --profile-dir "$d/nvlamb2/profile" --profile-steps "$profiled" > /dev/null
  "$bin" report --account "$d/pipefisher/profile" --baseline "$d/nvlamb/profile" > "$d/account.txt"
  if [[ ${FULL:-0} == 1 ]]; then cat "$d/account.txt"; else sed -n '/^mean over/,$p' "$d/account.txt"; fi
  echo "-- control: the second NVLAMB run against the first (\"PipeFisher\" below is NVLAMB again)"
  "$bin" report --account "$d/nvlamb2/profile" --baseline "$d/nvlamb/profile" | sed -n '/^mean over/,$p'
done
