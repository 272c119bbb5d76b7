#!/usr/bin/env bash
# bench/convergence/tune.sh: NVLAMB vs K-FAC with PipeFisher, each tuned with the same budget
# (issue 14), then several seeds of each best setting, and the paper's Figure 7 picture.
#
#   bench/convergence/tune.sh [build-dir] [out-dir]   # defaults: build/, bench/convergence/tuned/
#
# Every run: `pipefisher train` on configs/$MODEL.toml under scripts/pfrun, $RANKS ranks (one
# stage each, schedule $SCHEDULE, 1 thread per rank), $MB x $MBS sequences of $SEQ tokens per step,
# $STEPS steps, validation every $EVAL_EVERY steps ($EVAL_BATCHES batches), train.on_nonfinite =
# stop; BERT with next-sentence prediction when NSP=true (the corpus's document index).
#   nvlamb  NVLAMB
#   kfac    K-FAC (damping $DAMPING) then NVLAMB on the preconditioned gradients, placement bubbles
#           (PipeFisher) planned from ONE recorded profile (kfac.plan_profile: a $PROFILE_STEPS-step
#           run made first), so every K-FAC run refreshes the same way whatever the machine's load.
#   soap    SOAP (optim.name = soap, its defaults) with its eigenbasis refreshes in the bubbles;
#           with RANKS=1 it follows a real SOAP bubbles run's refresh record, as K-FAC does
#           (out-dir/soap_refresh.json). OPTIMIZERS="soap" runs its grid alone into an out-dir
#           whose NVLAMB records are kept (issue 48's probe beside the 16,384 study's records).
#   RANKS=1: every run is one process with $THREADS threads (train.threads); K-FAC follows the
#           refresh record of a short real PipeFisher run ($RECORD_STEPS steps, $RECORD_RANKS ranks x
#           1F1B, made first: kfac.placement = replay, docs/kfac.md), which trains what that
#           pipeline would train, at one process's speed.
# 1. Grid, seed 1, the same for both: peak learning rate in $LRS x warm-up ratio in $WARMUP_RATIOS
#    (the paper's: 2000 and 600 of 7038 steps), warm-up steps = round(ratio x STEPS) for both the
#    learning rate and K-FAC. A run diverged if it stopped on a non-finite loss or its final
#    validation loss is not below its first training loss.
# 2. Best setting of each optimizer by final validation loss; then seeds $SEEDS of it
#    (train.seed = data.seed = seed: initialisation and data order).
# 3. Target of each K-FAC seed = the tuned NVLAMB's final loss in its run of the same seed (the
#    seed draws the validation batches' masks too): its smoothed training loss (the paper's
#    filter, `pipefisher report`) and its validation loss. For each K-FAC seed, the step and the
#    time at which it first reaches the target, as fractions of NVLAMB's steps and of its
#    training time (cumulative step_time_s, evaluations excluded).
# Writes to out-dir: grid.csv, seeds.csv, summary.md (the tables), summary.json (tokens_per_step,
# K-FAC's steps_fraction and time_fraction to NVLAMB's final validation loss), figure7.svg (+ .png with
# rsvg-convert; `pipefisher report` of every seed run with the target), runs/ (each run's
# directory), kfac_profile.json (the recorded PipeFisher profile).
# Environment: MODEL STEPS SEQ MB MBS RANKS THREADS RECORD_RANKS RECORD_STEPS RECORD_ONLY SCHEDULE LRS WARMUP_RATIOS SEEDS NSP DAMPING EVAL_EVERY
# EVAL_BATCHES PROFILE_STEPS TRAIN_FILE VALID_FILE (token files; default: the config's corpus);
# KFAC_EVAL_EVERY (K-FAC's runs validate this often: the crossing's resolution; default EVAL_EVERY);
# STEP_TIMES (bench/pipefisher.sh's CSV, its median round, or a direct run's out-dir, its mean step
# times: time = steps x the step ratio at this shape; see study.py);
# BUDGET_FRACTION (f: K-FAC's best also runs once per seed with its whole schedule shortened to
# round(f x STEPS) steps and round(f x warm-up), named ...-fF-sSEED);
# DAMPINGS (K-FAC's grid also over these dampings; default DAMPING alone) and OPTIMIZERS (the
# grid's optimizers, default "nvlamb kfac"; with one of them the script stops after its grid, so
# NVLAMB's grid can run before K-FAC's runs are ready and both resume into the same out-dir).
# GRID_FROM_RECORDS=1: the grid is the settings that have a record (a cross-shaped grid run in
# parts, each with its own LRS and WARMUP_RATIOS): LRS x WARMUP_RATIOS x DAMPINGS name the axes,
# settings without a record are left out instead of run, then the seeds and the summary.
# SEED_OPTIMIZERS (one of nvlamb, kfac): only that optimizer's seeds, then stop (the two run as
# separate processes, one per core; a last run without it writes the summary).
# Resumable: a run whose directory holds exit status 0 and the same arguments (file `args`) is
# kept, and one stopped part-way resumes from its last checkpoint (every CHECKPOINT_EVERY steps,
# default EVAL_EVERY; not part of the arguments), so an interrupted tuning goes on where it
# stopped; delete out-dir/runs to start over. Each finished run also leaves its small record in
# out-dir/records/NAME.json (bench/convergence/record.py: arguments, losses and step times a step,
# the final weights' language-model loss), which the repository keeps instead of the run: a run
# with a record of the same arguments is restored from it and kept, on any machine (delete the
# record too to run it again). The timing columns compare runs of one machine
# only: re-run the seeds elsewhere rather than mixing.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
out=${2:-$root/bench/convergence/tuned}
bin=$build/pipefisher
model=${MODEL:-bert-mini}
steps=${STEPS:-1000}
seq=${SEQ:-128}
mb=${MB:-4}
mbs=${MBS:-8}
ranks=${RANKS:-2}
threads=${THREADS:-1}
schedule=${SCHEDULE:-1f1b}
lrs=${LRS:-1e-3 2e-3 5e-3 1e-2}
ratios=${WARMUP_RATIOS:-0.2843 0.0853}
seeds=${SEEDS:-1 2 3}
damping=${DAMPING:-1e-3}
dampings=${DAMPINGS:-$damping}
optimizers=${OPTIMIZERS:-nvlamb kfac}
eval_every=${EVAL_EVERY:-$(( steps / 10 > 0 ? steps / 10 : 1 ))}
eval_batches=${EVAL_BATCHES:-8}
kfac_eval_every=${KFAC_EVAL_EVERY:-$eval_every}
checkpoint_every=${CHECKPOINT_EVERY:-$eval_every}
profile_steps=${PROFILE_STEPS:-4}
arch=bert
[[ $model == gpt* ]] && arch=gpt
nsp=${NSP:-$([[ $arch == bert ]] && echo true || echo false)}

[[ -x $bin ]] || { echo "tune.sh: no $bin (build the pipefisher target)" >&2; exit 2; }
[[ -f $root/configs/$model.toml ]] || { echo "tune.sh: no configs/$model.toml" >&2; exit 2; }
cd "$root"
source "$root/bench/lib.sh"
mkdir -p "$out/runs"
pf_machine "$bin" "$threads" | tee "$out/machine.txt"

common=(--config "configs/$model.toml" --set train.steps="$steps" --set model.seq_len="$seq"
        --set parallel.micro_batches="$mb" --set parallel.micro_batch_size="$mbs"
        --set parallel.stages="$ranks" --set parallel.schedule="$schedule" --set train.threads="$threads"
        --set train.eval_every="$eval_every" --set train.eval_batches="$eval_batches"
        --set train.log_every=1000000 --set train.on_nonfinite=stop)
[[ $arch == bert ]] && common+=(--set data.nsp="$nsp")
[[ -n ${TRAIN_FILE:-} ]] && common+=(--set data.train_file="$TRAIN_FILE")
[[ -n ${VALID_FILE:-} ]] && common+=(--set data.valid_file="$VALID_FILE")
if ((ranks > 1)); then
  kfac=(--set kfac.enabled=true --set kfac.placement=bubbles
        --set kfac.plan_profile="$out/kfac_profile.json" --set train.eval_every="$kfac_eval_every")
  soap=(--set optim.name=soap --set kfac.placement=bubbles --set train.eval_every="$kfac_eval_every")
else  # one process following a real pipeline run's refresh record
  kfac=(--set kfac.enabled=true --set kfac.placement=replay
        --set kfac.refresh_record="$out/kfac_refresh.json" --set train.eval_every="$kfac_eval_every")
  soap=(--set optim.name=soap --set kfac.placement=replay
        --set kfac.refresh_record="$out/soap_refresh.json" --set train.eval_every="$kfac_eval_every")
fi

train() {  # run-name, args...: trains into $out/runs/run-name; its exit status is kept in run-name/status
  local name=$1
  shift
  local args="${common[*]} $*"
  args=${args//$out/OUT}
  local dir=$out/runs/$name resume=() record=$out/records/$name.json
  if [[ $(cat "$dir/status" 2>/dev/null) == 0 && $(cat "$dir/args" 2>/dev/null) == "$args" ]]; then
    echo "  $name: kept (an earlier run of tune.sh with the same arguments)"
    return 0
  fi
  if [[ -f $record ]] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(not (r["status"] == 0 and r["args"] == sys.argv[2]))' "$record" "$args"; then
    rm -rf "$dir" "$dir.out" "$dir.args"
    python3 "$root/bench/convergence/record.py" restore "$record" "$dir"
    echo "  $name: kept (its record, records/$name.json)"
    return 0
  fi
  # A run an interrupted session left part-way goes on from its last checkpoint (the same bits as
  # one uninterrupted run); anything else starts over.
  if [[ ! -f $dir/status && $(cat "$dir.args" 2>/dev/null) == "$args" ]] && compgen -G "$dir/checkpoints/step-*" > /dev/null; then
    resume=(--resume "$dir/checkpoints")
    echo "  $name: resuming from its last checkpoint"
  else
    rm -rf "$dir" "$dir.out"
    echo "$args" > "$dir.args"
  fi
  local status=0
  local launch=(scripts/pfrun -np "$ranks")
  ((ranks > 1)) || launch=()
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=1 "${launch[@]}" "$bin" train "${common[@]}" "$@" \
    --set train.out_dir="$dir" --set train.checkpoint_dir="$dir/checkpoints" \
    --set train.checkpoint_every="$checkpoint_every" "${resume[@]}" >> "$dir.out" 2>&1 || status=$?
  mkdir -p "$dir"
  echo "$status" > "$dir/status"
  mv "$dir.args" "$dir/args"
  mv "$dir.out" "$dir/stdout.txt"
  echo "  $name: exit $status, $(grep -h '^summary' "$dir/stdout.txt" || echo 'no summary')"
  if [[ $status == 0 && $name != profile ]]; then
    mkdir -p "$out/records"
    python3 "$root/bench/convergence/record.py" save "$dir" "$record" "$bin"
  fi
}
# The arguments of one run of the grid or the seeds: optimizer, lr, warm-up steps, seed[, damping].
optim_args() {
  args=(--set optim.lr="$2" --set optim.warmup_steps="$3" --set train.seed="$4" --set data.seed="$4")
  [[ $1 == kfac ]] && args+=("${kfac[@]}" --set kfac.damping="${5:-$damping}")
  [[ $1 == soap ]] && args+=("${soap[@]}")
  return 0
}
# One setting of the grid, seed 1: trained, or with GRID_FROM_RECORDS only restored from its record.
grid_run() {
  local name=$1
  shift
  if [[ -n ${GRID_FROM_RECORDS:-} && ! -f $out/records/$name.json ]]; then
    echo "  $name: no record, left out of the grid (GRID_FROM_RECORDS)"
    return 0
  fi
  train "$name" "$@"
}
# Its directory's name; K-FAC's names the damping only when the grid has several.
run_name() {
  local name="$1-lr$2-w$3"
  [[ $1 == kfac && $dampings != "$damping" ]] && name+="-d${5:-$damping}"
  echo "$name-s$4"
}

# RANKS=1: the pattern every K-FAC run follows is the refresh record of a short real PipeFisher
# run, $RECORD_RANKS ranks x 1F1B (one stage each, 1 thread per rank) at the study's shape, planned
# from its own profile; kept as out-dir/kfac_refresh.json and never replaced (delete it with
# out-dir/runs to start over). Its plan comes from the machine's timings: record it on a quiet one.
record_refresh() {  # kfac | soap: out-dir/$1_refresh.json
  local what=$1 recorder=(--set kfac.enabled=true --set kfac.damping="$damping")
  [[ $what == soap ]] && recorder=(--set optim.name=soap)
  [[ -f $out/${what}_refresh.json ]] && return 0
  local dir=$out/runs/record-$what rr=${RECORD_RANKS:-2}
  echo "== recording $what's refresh pattern (${RECORD_STEPS:-12} steps, $rr ranks x 1F1B)"
  rm -rf "$dir"
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 scripts/pfrun -np "$rr" "$bin" train "${common[@]}" \
    --set parallel.stages="$rr" --set parallel.schedule=1f1b --set train.threads=1 \
    --set train.steps="${RECORD_STEPS:-12}" "${recorder[@]}" --set kfac.placement=bubbles \
    --set kfac.replan_on_drift=false --set train.out_dir="$dir" > "$dir.out" 2>&1 \
    || { echo "tune.sh: the record run failed (see $dir.out)" >&2; exit 1; }
  grep -hE '^(pipefisher|soap): planned' "$dir.out" | tee "$out/${what}_refresh.plan.txt"
  cp "$dir/${what}_refresh.json" "$out/${what}_refresh.json"
}
if ((ranks == 1)); then
  for what in kfac soap; do
    if [[ $optimizers == *$what* ]]; then record_refresh "$what"; fi
  done
  [[ -n ${RECORD_ONLY:-} ]] && { echo "tune.sh: refresh records kept in $out (RECORD_ONLY)"; exit 0; }
elif [[ $optimizers == *kfac* ]]; then
echo "== recording the PipeFisher profile ($profile_steps steps)"
train profile --set train.steps="$profile_steps" --set kfac.enabled=true --set kfac.placement=bubbles \
  --set kfac.damping="$damping" --set kfac.replan_on_drift=false
[[ -f $out/runs/profile/kfac_profile.json ]] || { echo "tune.sh: the profile run wrote no kfac_profile.json" >&2; exit 1; }
# The recorded profile is the plan of every K-FAC run: never replaced once written (kept runs
# were planned from it). Delete out-dir/kfac_profile.json with out-dir/runs to start over.
[[ -f $out/kfac_profile.json ]] || cp "$out/runs/profile/kfac_profile.json" "$out/kfac_profile.json"
fi

echo "== grid: learning rates {$lrs} x warm-up ratios {$ratios}, seed 1 (K-FAC also x dampings {$dampings})"
for opt in $optimizers; do
  for lr in $lrs; do
    for ratio in $ratios; do
      w=$(python3 -c "print(round($ratio * $steps))")
      if [[ $opt == kfac ]]; then
        for d in $dampings; do
          optim_args kfac "$lr" "$w" 1 "$d"
          grid_run "$(run_name kfac "$lr" "$w" 1 "$d")" "${args[@]}"
        done
      else
        optim_args "$opt" "$lr" "$w" 1
        grid_run "$(run_name "$opt" "$lr" "$w" 1)" "${args[@]}"
      fi
    done
  done
done
[[ $optimizers == *nvlamb* && ($optimizers == *kfac* || $optimizers == *soap*) ]] ||
  { echo "tune.sh: grid of $optimizers done (OPTIMIZERS); run NVLAMB and K-FAC or SOAP for the rest"; exit 0; }

# The table of the grid and the best setting per optimizer (grid.csv, best.json).
python3 "$root/bench/convergence/study.py" grid "$out" "$steps" "$lrs" "$ratios" "$dampings" "$damping" "$optimizers"

echo "== seeds {$seeds} of each best setting"
best_of() {  # optimizer -> "lr warm-up damping" of its best setting
  python3 -c "import json,sys; b=json.load(open(sys.argv[1]))[sys.argv[2]]; print(b['lr'], b['warmup_steps'], b['damping'] or '$damping')" "$out/best.json" "$1"
}
for opt in ${SEED_OPTIMIZERS:-$optimizers}; do
  read -r lr w d < <(best_of "$opt")
  for s in $seeds; do
    [[ $s == 1 ]] && continue  # the grid ran seed 1
    optim_args "$opt" "$lr" "$w" "$s" "$d"
    train "$(run_name "$opt" "$lr" "$w" "$s" "$d")" "${args[@]}"
  done
done
# Budget-matched K-FAC: the best's whole schedule shortened to BUDGET_FRACTION of the steps (its
# warm-up and decay with it), once per seed, read against NVLAMB's full run of the same seed.
if [[ -n ${BUDGET_FRACTION:-} && $optimizers == *kfac* && ${SEED_OPTIMIZERS:-kfac} == *kfac* ]]; then
  read -r lr w d < <(best_of kfac)
  bsteps=$(python3 -c "print(round($BUDGET_FRACTION * $steps))")
  bw=$(python3 -c "print(round($BUDGET_FRACTION * $w))")
  echo "== budget-matched K-FAC: $bsteps of $steps steps, warm-up $bw, seeds {$seeds}"
  for s in $seeds; do
    [[ $s == 1 ]] && continue
    optim_args kfac "$lr" "$bw" "$s" "$d"
    name=$(run_name kfac "$lr" "$bw" "$s" "$d")
    train "${name%-s"$s"}-f$BUDGET_FRACTION-s$s" "${args[@]}" --set train.steps="$bsteps"
  done
fi
[[ -z ${SEED_OPTIMIZERS:-} ]] || { echo "tune.sh: seeds of $SEED_OPTIMIZERS done (SEED_OPTIMIZERS); run without it for the summary"; exit 0; }
[[ $optimizers != *soap* ]] || { echo "tune.sh: SOAP's seeds done; its analysis: study.py analysis OUT SEEDS \"\" soap nvlamb (or kfac)"; exit 0; }

# Targets, crossings, tables, Figure 7, summary.json.
vocab=bert vocab_size=30522; [[ $arch == gpt ]] && vocab=gpt2 vocab_size=50257
python3 "$root/bench/convergence/study.py" summary "$out" "$steps" "$seeds" "$bin" "$model" $((mb * mbs * seq)) \
  "${VALID_FILE:-data/corpus/valid.$vocab.bin}" "${TRAIN_FILE:-data/corpus/train.$vocab.bin}" "$vocab_size" \
  "${STEP_TIMES:-}"
rm -f "$out/.scratch.svg" "$out/.scratch.png"
echo "outputs: $out/{summary.md, summary.json, grid.csv, seeds.csv, figure7.svg, kfac_profile.json, runs/}"
