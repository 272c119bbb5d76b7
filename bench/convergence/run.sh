#!/usr/bin/env bash
# bench/convergence/run.sh: BERT pretraining on the fetched corpus, NVLAMB vs K-FAC (issue 5).
#
#   bench/convergence/run.sh [build-dir] [out-dir]     # defaults: build/, bench/convergence/out/
#
# Two runs of `pipefisher train` on configs/$MODEL.toml (data/corpus/*.bert.bin, made by
# scripts/prepare-data.sh), the same batch, step budget, peak LR and decay, and the same pipeline:
# $RANKS MPI ranks (scripts/pfrun), one stage each, schedule $SCHEDULE, 1 thread per rank
# (RANKS=1: one process, $THREADS threads):
#   nvlamb  NVLAMB, warm-up $WARMUP steps
#   kfac    K-FAC then NVLAMB on the preconditioned gradients, warm-up $KFAC_WARMUP steps (the paper
#           shortens K-FAC's), damping $DAMPING, placement $PLACEMENT: `bubbles` is PipeFisher (the
#           first steps profile K-FAC's work, then the planner's multi-step schedule puts it in the
#           pipeline's bubbles and each inverse is refreshed as often as the bubbles allow);
#           `inline` runs all of it every $EVERY steps on the critical path
# Writes to out-dir: nvlamb.csv and kfac.csv (step, time_s = cumulative training time without
# evaluations, loss, valid_loss where evaluated), convergence.svg (loss vs step and vs time) and
# summary.txt: each run's final losses and the step and time at which K-FAC first reaches
# NVLAMB's final loss (validation loss, and training loss smoothed over $SMOOTH steps).
# Override with the environment: MODEL STEPS SEQ MB MBS LR WARMUP KFAC_WARMUP RANKS SCHEDULE
# PLACEMENT EVERY DAMPING SPLIT (kfac.split_inversions) EVAL_EVERY EVAL_BATCHES SMOOTH THREADS.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
out=${2:-$root/bench/convergence/out}
bin=$build/pipefisher
model=${MODEL:-bert-mini}
steps=${STEPS:-300}
seq=${SEQ:-128}
mb=${MB:-4}
mbs=${MBS:-8}
lr=${LR:-5e-3}
warmup=${WARMUP:-30}
kfac_warmup=${KFAC_WARMUP:-10}
ranks=${RANKS:-2}
schedule=${SCHEDULE:-1f1b}
placement=${PLACEMENT:-bubbles}
split=${SPLIT:-true}
every=${EVERY:-1}
damping=${DAMPING:-1e-3}
eval_every=${EVAL_EVERY:-25}
eval_batches=${EVAL_BATCHES:-8}
smooth=${SMOOTH:-10}
threads=${THREADS:-1}

[[ -x $bin ]] || { echo "run.sh: no $bin (build the pipefisher target)" >&2; exit 2; }
[[ -f $root/data/corpus/train.bert.bin ]] || { echo "run.sh: no corpus (scripts/prepare-data.sh $build)" >&2; exit 2; }
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

common=(--config "$root/configs/$model.toml" --steps "$steps" --set model.seq_len="$seq"
        --set parallel.micro_batches="$mb" --set parallel.micro_batch_size="$mbs" --set optim.lr="$lr"
        --set optim.warmup_steps="$warmup" --set train.eval_every="$eval_every"
        --set train.eval_batches="$eval_batches" --set train.log_every=50)
if ((ranks > 1)); then
  threads=1
  launch=("$root/scripts/pfrun" -np "$ranks")
  common+=(--set parallel.stages="$ranks" --set parallel.schedule="$schedule")
else
  launch=()
fi
common+=(--set train.threads="$threads")
cd "$root"
run() {  # name, extra args...
  local name=$1
  shift
  echo "== $name"
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=1 "${launch[@]}" "$bin" train "${common[@]}" "$@" \
    --set train.out_dir="$tmp/$name" | grep -E "^(pipefisher: |summary|outputs)" || true
  # JSON lines -> CSV (keys of the run log: step, loss, step_time_s, valid_loss when evaluated).
  awk 'function num(key,   m) {
         if (!match($0, "\"" key "\":[-+0-9.eE]+")) return ""
         m = substr($0, RSTART, RLENGTH); sub(/^[^:]*:/, "", m); return m }
       BEGIN { print "step,time_s,loss,valid_loss" }
       { t += num("step_time_s"); printf "%s,%.3f,%s,%s\n", num("step"), t, num("loss"), num("valid_loss") }' \
    "$tmp/$name/log.jsonl" > "$tmp/$name.csv"
  mv "$tmp/$name.csv" "$out/$name.csv"
}
run nvlamb
run kfac --set kfac.enabled=true --set kfac.placement="$placement" --set kfac.inverse_every="$every" \
  --set kfac.damping="$damping" --set kfac.warmup_steps="$kfac_warmup" --set kfac.split_inversions="$split"

# --- summary: where K-FAC first reaches NVLAMB's final loss ---
summarize() {  # column (3 = train loss smoothed, 4 = valid loss)
  awk -F, -v col="$1" -v k="$smooth" '
    FNR == 1 { run++; n = 0; next }
    $col == "" { next }
    { n++; if (col == 3) { buf[run, n] = $3; s = 0; c = 0
                           for (i = n; i > n - k && i > 0; i--) { s += buf[run, i]; c++ }
                           v = s / c } else v = $4
      if (run == 1) { final = v; fstep = $1; ftime = $2 }
      else if (!found && v <= final) { found = 1; kstep = $1; ktime = $2 }
      if (run == 2) { klast = v; kls = $1; klt = $2 } }
    END {
      name = col == 3 ? "train loss (mean of last " k " steps)" : "validation loss"
      printf "%s: nvlamb final %.4f at step %d (%.1f s); kfac final %.4f at step %d (%.1f s)\n", name, final, fstep, ftime, klast, kls, klt
      if (found) printf "  kfac reaches %.4f at step %d (%.1f%% of the steps), %.1f s (%.1f%% of the time)\n", final, kstep, 100 * kstep / fstep, ktime, 100 * ktime / ftime
      else printf "  kfac does not reach %.4f within the budget\n", final }' "$out/nvlamb.csv" "$out/kfac.csv"
}
{
  echo "model $model, seq $seq, $mb x $mbs sequences/step, $steps steps, lr $lr; nvlamb warm-up $warmup;" \
       "kfac $placement (every $every if inline), damping $damping, warm-up $kfac_warmup, split inversions $split;" \
       "$ranks rank(s), schedule $schedule, $threads thread(s) per rank"
  summarize 4
  summarize 3
} | tee "$out/summary.txt.tmp"
mv "$out/summary.txt.tmp" "$out/summary.txt"

# --- chart: loss vs step (left) and vs time (right); lines = train loss smoothed, dots = valid ---
awk -F, -v k="$smooth" -v title="$model: NVLAMB vs K-FAC" '
  FNR == 1 { run++; n[run] = 0; next }
  { i = ++n[run]; st[run, i] = $1; tm[run, i] = $2; buf[run, i] = $3; va[run, i] = $4
    s = 0; c = 0; for (j = i; j > i - k && j > 0; j--) { s += buf[run, j]; c++ }; sm[run, i] = s / c
    if (sm[run, i] > ymax) ymax = sm[run, i]; if (ymin == "" || sm[run, i] < ymin) ymin = sm[run, i]
    if ($4 != "" && $4 < ymin) ymin = $4
    if ($1 > xs) xs = $1; if ($2 > xt) xt = $2 }
  function px(x, xmax, left) { return left + 60 + x / xmax * 360 }
  function py(y) { return 40 + (ymax - y) / (ymax - ymin) * 300 }
  END {
    ymin = int(ymin * 2) / 2; ymax = int(ymax * 2 + 1) / 2
    col[1] = "#1f77b4"; col[2] = "#d62728"; name[1] = "NVLAMB"; name[2] = "K-FAC"
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"960\" height=\"400\" font-family=\"sans-serif\" font-size=\"12\">\n"
    printf "<rect width=\"960\" height=\"400\" fill=\"white\"/>\n<text x=\"480\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">%s (lines: train loss, mean of %d steps; dots: validation)</text>\n", title, k
    for (p = 0; p < 2; p++) {
      left = p * 480; xmax = p ? xt : xs
      printf "<rect x=\"%d\" y=\"40\" width=\"360\" height=\"300\" fill=\"none\" stroke=\"#888\"/>\n", left + 60
      printf "<text x=\"%d\" y=\"375\" text-anchor=\"middle\">%s</text>\n", left + 240, p ? "training time (s)" : "step"
      for (t = 0; t <= 4; t++) {
        y = ymin + (ymax - ymin) * t / 4; x = xmax * t / 4
        printf "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", left + 55, py(y) + 4, y
        printf "<text x=\"%.1f\" y=\"355\" text-anchor=\"middle\">%g</text>\n", px(x, xmax, left), p ? int(x) : int(x)
      }
      for (r = 1; r <= 2; r++) {
        printf "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", col[r]
        for (i = 1; i <= n[r]; i++) printf "%.1f,%.1f ", px(p ? tm[r, i] : st[r, i], xmax, left), py(sm[r, i])
        printf "\"/>\n"
        for (i = 1; i <= n[r]; i++) if (va[r, i] != "")
          printf "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(p ? tm[r, i] : st[r, i], xmax, left), py(va[r, i]), col[r]
        printf "<text x=\"%d\" y=\"%d\" fill=\"%s\">%s</text>\n", left + 340, 40 + 16 * r, col[r], name[r]
      }
    }
    printf "</svg>\n" }' "$out/nvlamb.csv" "$out/kfac.csv" > "$out/convergence.svg.tmp"
mv "$out/convergence.svg.tmp" "$out/convergence.svg"
echo "outputs: $out/{nvlamb.csv, kfac.csv, convergence.svg, summary.txt}"
