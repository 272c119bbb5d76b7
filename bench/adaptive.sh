#!/usr/bin/env bash
# bench/adaptive.sh: PipeFisher's placements under noise. bert-mini on 2 ranks x 1F1B, 1 thread
# per rank, at several tokens per step; for each noise, REPEAT rounds of three runs side by side:
#   nvlamb    kfac.enabled = false
#   bubbles   PipeFisher's static plan (kfac.placement = bubbles)
#   adaptive  the same plan (kfac.plan_profile = the bubbles run's kfac_profile.json), its units
#             placed at run time into the waits (kfac.placement = adaptive)
#   adapting  kfac.placement = adaptive from its own profile: its units placed at run time, and
#             its refresh cycles re-planned from the steps as run (from step 8 on; a recorded
#             plan profile, as `adaptive`'s, keeps the record's cycles), none longer than
#             $ADAPT_MAX steps (kfac.max_refresh_steps; 0 = its profile's plan's)
# Noises (the benchmarks' seam, docs/training.md): quiet; slow = world rank 1's compute 1.5x as
# long in steps 6-11 ($SLOW); jitter = every compute action up to 20% longer ($JITTER).
#
#   bench/adaptive.sh [build-dir] [csv-out]
#   env: TOKENS="4096 16384" SEQ=128 MB=4 STEPS=14 REPEAT=3 NOISES="quiet slow jitter" REPLAN=false
#        ADAPT_MAX=0
#
# REPLAN is kfac.replan_on_drift for both PipeFisher runs: false keeps each run's first plan
# throughout, so that the placements alone differ (a 1.5x slow rank is a drift that would
# otherwise re-profile both, K-FAC inline, in the middle of the timed steps).
#
# A run's step time is its mean step_time_s over steps 5.. (after planning). Prints per shape,
# noise and run: best, median and max over the rounds, best over nvlamb's best under the same
# noise, adaptive's and adapting's best over bubbles', the refresh periods of each round's plans
# (a drift re-plan and adapted cycles add their own, after a |; re-plans not taken in brackets),
# and where the adaptive runs' units ran (in waits / at their deadlines).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
csv=${2:-}
bin=$build/pipefisher
source "$root/bench/lib.sh"
tokens=${TOKENS:-4096 16384}
seq=${SEQ:-128}
mb=${MB:-4}
steps=${STEPS:-14}
repeat=${REPEAT:-3}
noises=${NOISES:-quiet slow jitter}
slow=${SLOW:-1:1.5@6-11}
jitter=${JITTER:-0.2}
replan=${REPLAN:-false}
adapt_max=${ADAPT_MAX:-0}
[[ -x $bin ]] || { echo "adaptive.sh: no $bin (build the pipefisher target)" >&2; exit 2; }
((steps >= 6)) || { echo "adaptive.sh: STEPS must be at least 6 (steps 5.. are timed)" >&2; exit 2; }
for t in $tokens; do
  ((t % (mb * seq) == 0)) || { echo "adaptive.sh: TOKENS $t is not a multiple of MB x SEQ = $((mb * seq))" >&2; exit 2; }
done
noise_flags() {
  case $1 in
    quiet) ;;
    slow) echo "--bench-slow $slow" ;;
    jitter) echo "--bench-jitter $jitter" ;;
    *) echo "adaptive.sh: unknown noise '$1' (quiet, slow, jitter)" >&2; exit 2 ;;
  esac
}
for n in $noises; do noise_flags "$n" > /dev/null; done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cd "$root"
pf_machine "$bin" 1  # the ranks run 1 thread each
run() { pf_two_ranks "$1" 1f1b "${@:2}" > "$1.out"; }  # dir, extra args...
for t in $tokens; do
  mbs=$((t / (mb * seq)))
  for n in $noises; do
    read -ra flags <<< "$(noise_flags "$n")"
    for ((k = 1; k <= repeat; ++k)); do
      d=$out/$t/$n/$k
      mkdir -p "$d"
      echo "== $t tokens per step ($mb x $mbs x $seq), noise $n, round $k: nvlamb, bubbles, adaptive, adapting"
      run "$d/nvlamb" "${flags[@]}"
      run "$d/bubbles" "${flags[@]}" --set kfac.enabled=true --set kfac.placement=bubbles \
        --set kfac.replan_on_drift="$replan"
      run "$d/adaptive" "${flags[@]}" --set kfac.enabled=true --set kfac.placement=adaptive \
        --set kfac.replan_on_drift="$replan" --set kfac.plan_profile="$d/bubbles/kfac_profile.json"
      run "$d/adapting" "${flags[@]}" --set kfac.enabled=true --set kfac.placement=adaptive \
        --set kfac.replan_on_drift="$replan" --set kfac.max_refresh_steps="$adapt_max"
    done
  done
done

python3 - "$out" "$repeat" "$csv" "$noises" $tokens <<'PY'
import csv, json, os, re, statistics, sys
out, repeat, csv_path, noises, tokens = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split(), sys.argv[5:]
def mean_step(path):
    t = [r["step_time_s"] for r in map(json.loads, open(path)) if r["step"] >= 5]
    return 1000 * sum(t) / len(t)
def refresh(text):  # every plan the run made (a drift re-plan or an adapted cycle adds one), re-plans not taken
    plans = "|".join(re.findall(r"^pipefisher: planned .*?refresh every ([0-9 ]+) steps", text, re.M))
    wanted = re.findall(r"^pipefisher: re-planned .*?refresh every ([0-9 ]+) steps, not taken", text, re.M)
    return plans + (f" (not taken: {', '.join(wanted)})" if wanted else "")
def filled(text):
    m = re.search(r"^pipefisher: adaptive: (\d+) units ran in (\d+) waits, (\d+) at their deadlines", text, re.M)
    return f"{m.group(1)} in waits / {m.group(3)} at deadline" if m else ""
rows = []
for tok in tokens:
    for noise in noises:
        d = [f"{out}/{tok}/{noise}/{k}" for k in range(1, repeat + 1)]
        times = {run: [mean_step(f"{x}/{run}/log.jsonl") for x in d] for run in ("nvlamb", "bubbles", "adaptive", "adapting")}
        base = min(times["nvlamb"])
        for run, ts in times.items():
            texts = [open(f"{x}/{run}.out").read() for x in d]
            rows.append({"tokens_per_step": tok, "noise": noise, "run": run, "best_ms": round(min(ts), 1),
                         "median_ms": round(statistics.median(ts), 1), "max_ms": round(max(ts), 1),
                         "ratio": round(min(ts) / base, 3),
                         "vs_bubbles": round(min(ts) / min(times["bubbles"]), 3) if run.startswith("adapt") else "",
                         "refresh": "; ".join(refresh(x) for x in texts) if run != "nvlamb" else "",
                         "units": "; ".join(filled(x) for x in texts) if run.startswith("adapt") else ""})
print(f"{'tokens':>6} {'noise':6} {'run':8} {'best ms':>8} {'median':>8} {'max':>8} {'/nvlamb':>8} {'/bubbles':>8}  "
      "refresh per round (steps per device)  adaptive's units per round")
for r in rows:
    vb = f"{r['vs_bubbles']:7.3f}x" if r["vs_bubbles"] != "" else " " * 8
    print(f"{r['tokens_per_step']:>6} {r['noise']:6} {r['run']:8} {r['best_ms']:8.1f} {r['median_ms']:8.1f} "
          f"{r['max_ms']:8.1f} {r['ratio']:7.3f}x {vb}  {r['refresh']}  {r['units']}")
if csv_path:
    with open(csv_path + ".tmp", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    os.replace(csv_path + ".tmp", csv_path)
PY
