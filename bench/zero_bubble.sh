#!/usr/bin/env bash
# bench/zero_bubble.sh: zero-bubble schedules against 1F1B in the runtime, with NVLAMB alone and
# with PipeFisher, bert-mini on 2 ranks, 1 thread per rank (issue 23).
#
#   bench/zero_bubble.sh [build-dir] [keep-dir]
#   env: TOKENS=4096 SEQ=128 MB=4 STEPS=12 REPEAT=3 SCHEDULES="1f1b zb-h1 zb-h2" KFAC=1
#
# For each of REPEAT rounds, side by side (the machine may be shared: every run is timed in every
# round, the best and the median round are kept), one run per schedule and optimizer:
#   nvlamb      kfac.enabled = false
#   pipefisher  kfac.enabled = true, kfac.placement = bubbles (KFAC=0 leaves these out)
# Every run is profiled on its last three steps (--profile-dir). A run's step time is its mean
# step_time_s over steps 5.. (after PipeFisher's planning).
# The simulator's prediction: `pipefisher plan` times every schedule from ONE profile, the NVLAMB
# zb-h1 run's of the best round (its measured F, I and W per stage; the unsplit schedules run
# B = I + W), so the predicted saving of a zero-bubble schedule over 1F1B can be set against the
# measured one. keep-dir, if given, receives that profile (zb-h1-nvlamb.json) and each PipeFisher
# run's profile of its best round (SCHEDULE-pipefisher.json: kfac.plan_profile reads it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
keep=${2:-}
bin=$build/pipefisher
source "$root/bench/lib.sh"
tokens=${TOKENS:-4096}
seq=${SEQ:-128}
mb=${MB:-4}
steps=${STEPS:-12}
repeat=${REPEAT:-3}
schedules=${SCHEDULES:-1f1b zb-h1 zb-h2}
kfac=${KFAC:-1}
[[ -x $bin ]] || { echo "zero_bubble.sh: no $bin (build the pipefisher target)" >&2; exit 2; }
((steps >= 8)) || { echo "zero_bubble.sh: STEPS must be at least 8 (steps 5.. are timed, the last 3 profiled)" >&2; exit 2; }
((tokens % (mb * seq) == 0)) || { echo "zero_bubble.sh: TOKENS $tokens is not a multiple of MB x SEQ = $((mb * seq))" >&2; exit 2; }
[[ " $schedules " == *" zb-h1 "* ]] || { echo "zero_bubble.sh: SCHEDULES must include zb-h1 (its profile drives the simulator)" >&2; exit 2; }
if [[ -n $keep ]]; then mkdir -p "$keep"; fi
mbs=$((tokens / (mb * seq)))
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
runs=(nvlamb)
((kfac)) && runs+=(pipefisher)

cd "$root"
pf_machine "$bin" 1  # the ranks run 1 thread each
run() {  # dir, schedule, extra args...
  pf_two_ranks "$1" "$2" --profile-dir "$1/profile" --profile-steps "$((steps - 2)),$((steps - 1)),$steps" "${@:3}"
}
for ((k = 1; k <= repeat; ++k)); do
  for s in $schedules; do
    d=$out/$k/$s
    echo "== $tokens tokens per step ($mb x $mbs x $seq), round $k: $s, ${runs[*]}"
    run "$d-nvlamb" "$s" > /dev/null
    if ((kfac)); then
      run "$d-pipefisher" "$s" --set kfac.enabled=true --set kfac.placement=bubbles |
        grep -E "^pipefisher: planned" > "$d-pipefisher.plan" || true
    fi
  done
done

python3 - "$out" "$repeat" "$bin" "$keep" "$mb" "${runs[*]}" $schedules <<'PY'
import json, re, shutil, statistics, subprocess, sys
out, repeat, bin_, keep, mb = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
runs, schedules = sys.argv[6].split(), sys.argv[7:]
def mean_step(k, name):
    t = [r["step_time_s"] for r in map(json.loads, open(f"{out}/{k}/{name}/log.jsonl")) if r["step"] >= 5]
    return 1000 * sum(t) / len(t)
times = {(s, r): [mean_step(k, f"{s}-{r}") for k in range(1, repeat + 1)] for s in schedules for r in runs}
best_round = {key: 1 + min(range(repeat), key=lambda i: ts[i]) for key, ts in times.items()}
# The simulator: every schedule timed from the best NVLAMB zb-h1 round's profile.
zb = f"{out}/{best_round[('zb-h1', 'nvlamb')]}/zb-h1-nvlamb/profile/profile.json"
def predicted(s):  # None where the profile's stages are not the schedule's (zb-v: 2D stages)
    r = subprocess.run([bin_, "plan", "--profile", zb, "--schedule", s, "--stages", "2",
                        "--micro-batches", mb, "--no-kfac", "--json"], capture_output=True, text=True)
    return json.loads(r.stdout)["step_time"] if r.returncode == 0 else None
pred = {s: predicted(s) for s in schedules}
base = min(times[("1f1b", "nvlamb")]) if "1f1b" in schedules else None
print(f"{'schedule':8} {'run':10} {'best ms':>8} {'median ms':>9} {'max ms':>8} {'/1f1b same run':>14} {'/1f1b nvlamb':>12}  refresh")
for (s, r), ts in times.items():
    ref = min(times[("1f1b", r)]) if "1f1b" in schedules else None
    plan = ""
    if r == "pipefisher":
        lines = {open(f"{out}/{k}/{s}-{r}.plan").read().strip() for k in range(1, repeat + 1)}
        plan = "; ".join(sorted(re.sub(r".*refresh every ([0-9 ]+) steps.*", r"\1", p) for p in lines))
    ratio = f"{min(ts) / ref:.3f}x" if ref else ""
    ratio0 = f"{min(ts) / base:.3f}x" if base else ""
    print(f"{s:8} {r:10} {min(ts):8.1f} {statistics.median(ts):9.1f} {max(ts):8.1f} {ratio:>14} {ratio0:>12}  {plan}")
print(f"simulator, every schedule from the zb-h1 NVLAMB profile of round {best_round[('zb-h1', 'nvlamb')]}:")
for s in schedules:
    p = "     n/a" if pred[s] is None else f"{pred[s]:8.1f}"
    print(f"  {s:8} predicted {p} ms, measured best {min(times[(s, 'nvlamb')]):8.1f} ms")
def own(s):  # the simulator on the run's own measured action times (its profile's "measured")
    k = best_round[(s, "nvlamb")]
    return json.load(open(f"{out}/{k}/{s}-nvlamb/profile/profile.json"))["measured"]["predicted_step_time"]
print("simulator, each NVLAMB run's best round from its own profile:")
for s in schedules:
    print(f"  {s:8} predicted {own(s):8.1f} ms")
if "1f1b" in schedules:
    for s in schedules:
        if s == "1f1b":
            continue
        m = min(times[("1f1b", "nvlamb")]) - min(times[(s, "nvlamb")])
        q = own("1f1b") - own(s)
        err2 = f"{100 * (q - m) / m:+.1f}%" if m != 0 else "n/a"
        one = "n/a"
        if pred[s] is not None:
            p = pred["1f1b"] - pred[s]
            one = f"{p:.1f} ms" + (f" ({100 * (p - m) / m:+.1f}%)" if m != 0 else "")
        print(f"  {s} saves {m:.1f} ms per step measured (best of {repeat}); predicted from one profile {one}, "
              f"from their own profiles {q:.1f} ms ({err2})")
if keep:
    shutil.copyfile(zb, f"{keep}/zb-h1-nvlamb.json")
    if "pipefisher" in runs:
        for s in schedules:
            shutil.copyfile(f"{out}/{best_round[(s, 'pipefisher')]}/{s}-pipefisher/profile/profile.json",
                            f"{keep}/{s}-pipefisher.json")
PY
