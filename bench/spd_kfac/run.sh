#!/usr/bin/env bash
# bench/spd_kfac: data-parallel K-FAC (issue 6): iteration time of D-KFAC, MPD-KFAC and SPD-KFAC,
# the four-way ablation of SPD-KFAC's Table IV, and the share of the factor all-reduces hidden
# behind compute, with 2 and 4 ranks on one model with many K-FAC layers.
#
#   bench/spd_kfac/run.sh [build-dir]      # default build/
#   RANKS="2 4" STEPS=8 MBS=4 MB=1 REPEAT=2 PRESET=bert-mini LAYERS= INVERSE_EVERY=1 override the run
#
# Each configuration runs `pipefisher train` under scripts/pfrun (1 thread per rank on this 2-core
# machine) on the fetched corpus (scripts/prepare-data.sh), K-FAC inline every step. The run
# writes train.out_dir/dkfac.json (Executor::write_dkfac_record, src/runtime/executor.hpp): step
# time averaged over the steps after the two profile steps, the factor all-reduces' in-flight
# time (union of [post, seen done]), the time blocked waiting for them, the inversion time and
# the inverse-broadcast wait.
# hidden = 1 - wait / in-flight. REPEAT rounds alternate the configurations (the machine is shared)
# and the best step time of each is kept, with the timings of that round.
#
# Table IV: -Pipe-LBP is MPD-KFAC; +Pipe-LBP = spd-kfac with kfac.spd_balance=false;
# -Pipe+LBP = spd-kfac with kfac.spd_pipelining=false; +Pipe+LBP = spd-kfac.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
bin=$build/pipefisher
source "$root/bench/lib.sh"
steps=${STEPS:-8}
mbs=${MBS:-4}
mb=${MB:-1}
repeat=${REPEAT:-2}
preset=${PRESET:-bert-mini}
ranks_list=${RANKS:-2 4}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export PF_CACHE_DIR=${PF_CACHE_DIR:-$root/runs/.cache}

common=(--config "$root/configs/bert-mini.toml" --steps "$steps" --set model.preset="$preset"
        --set train.eval_every=0 --set train.eval_batches=1 --set train.log_every=1000
        --set parallel.micro_batches="$mb" --set parallel.micro_batch_size="$mbs"
        --set kfac.enabled=true --set kfac.placement=inline --set kfac.inverse_every="${INVERSE_EVERY:-1}")
[[ -n "${LAYERS:-}" ]] && common+=(--set model.layers="$LAYERS")

declare -A sets=(
  [d-kfac]="--set kfac.distributed=d-kfac"
  [mpd-kfac]="--set kfac.distributed=mpd-kfac"
  [spd+pipe-lbp]="--set kfac.distributed=spd-kfac --set kfac.spd_balance=false"
  [spd-pipe+lbp]="--set kfac.distributed=spd-kfac --set kfac.spd_pipelining=false"
  [spd-kfac]="--set kfac.distributed=spd-kfac"
)
names=(d-kfac mpd-kfac spd+pipe-lbp spd-pipe+lbp spd-kfac)
cd "$root"
pf_machine "$bin" 1  # the ranks run 1 thread each
for w in $ranks_list; do
  for ((k = 1; k <= repeat; ++k)); do
    for n in "${names[@]}"; do
      echo "== $w ranks, round $k: $n" >&2
      # shellcheck disable=SC2086
      "$root/scripts/pfrun" -np "$w" "$bin" train "${common[@]}" --set parallel.data_parallel="$w" ${sets[$n]} \
        --set train.out_dir="$out/$w/$k/$n" > "$out/$w-$k-$n.log" 2>&1 || { cat "$out/$w-$k-$n.log"; exit 1; }
    done
  done
done

python3 - "$out" "$repeat" "$ranks_list" "${names[@]}" <<'PY'
import json, sys
out, repeat, ranks, names = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
label = {"d-kfac": "D-KFAC", "mpd-kfac": "MPD-KFAC (-Pipe-LBP)", "spd+pipe-lbp": "SPD +Pipe-LBP",
         "spd-pipe+lbp": "SPD -Pipe+LBP", "spd-kfac": "SPD-KFAC (+Pipe+LBP)"}
for w in ranks:
    best = {}
    for n in names:
        runs = [json.load(open(f"{out}/{w}/{k}/{n}/dkfac.json")) for k in range(1, repeat + 1)]
        best[n] = min(runs, key=lambda j: j["step_time_s"])
        best[n]["all_steps"] = [round(j["step_time_s"] * 1e3, 1) for j in runs]
    d = best["d-kfac"]
    print(f"\n{w} ranks ({best['spd-kfac']['factors']} factors; spd fused into "
          f"{best['spd-kfac']['fused_messages']['A']} A + {best['spd-kfac']['fused_messages']['B']} B messages; "
          f"LBP broadcasts {best['spd-kfac']['placement']['communicated']} inverses)")
    print(f"| {'strategy':22} | step ms (rounds) | vs D-KFAC | factor all-reduce in flight ms | waited ms | hidden "
          f"| exposed vs D-KFAC's wait | inversion ms | inverse wait ms |")
    print("|" + "---|" * 9)
    for n in names:
        j = best[n]
        exposed = j["factor_wait_s"] / d["factor_wait_s"] if d["factor_wait_s"] > 0 else float("nan")
        print(f"| {label[n]:22} | {j['step_time_s']*1e3:7.1f} ({', '.join(map(str, j['all_steps']))}) "
              f"| {d['step_time_s']/j['step_time_s']:.2f}x | {j['factor_inflight_s']*1e3:.1f} "
              f"| {j['factor_wait_s']*1e3:.1f} | {j['factor_hidden_fraction']*100:.0f}% | {exposed*100:.0f}% "
              f"| {j['inversion_s']*1e3:.1f} | {j['inverse_wait_s']*1e3:.1f} |")
    pm = best["spd-kfac"]["perf_model"]
    print(f"perf model: all-reduce {pm['allreduce']['alpha']*1e6:.1f} us + {pm['allreduce']['beta']*1e9:.2f} ns/float; "
          f"broadcast {pm['broadcast']['alpha']*1e6:.1f} us + {pm['broadcast']['beta']*1e9:.2f} ns/float; "
          f"inversion {pm['inversion']['c']*1e12:.3f} ps*d^3 + {pm['inversion']['e']*1e6:.1f} us")
PY
