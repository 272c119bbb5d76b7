#!/usr/bin/env bash
# bench/breakdown_kernels.sh: the kernel breakdown (bench_breakdown) of each model under each
# OpenBLAS kernel family and thread count, one summary line per run.
#
#   bench/breakdown_kernels.sh [BUILD-DIR]
#
# Environment: KERNELS (OPENBLAS_CORETYPE values, default "Zen Haswell SkylakeX"; "default" for
# OpenBLAS's own choice), THREADS (default "1 2"), ROUNDS (default 3), MODELS (default gpt2-mini,
# bert-mini at 16,384 tokens per step and llama-tiny). Each line: the run's sgemm rate, the step,
# the step's model FLOPs against that sgemm, the products' share of the step, the vocabulary head's
# products against sgemm, and softmax + loss's share. Needs the prepared corpus (scripts/prepare-data.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/bench/bench_breakdown
[[ -x $bin ]] || { echo "breakdown_kernels.sh: no $bin (build the bench_breakdown target)" >&2; exit 2; }
kernels=${KERNELS:-Zen Haswell SkylakeX}
threads=${THREADS:-1 2}
rounds=${ROUNDS:-3}
models=${MODELS:-gpt2-mini bert-mini-16384 llama-tiny}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

model_args() {  # model name -> bench_breakdown's --config/--set arguments
  case $1 in
    gpt2-mini) echo "--config $root/configs/gpt2-mini.toml" ;;
    bert-mini-16384) echo "--config $root/configs/bert-mini.toml --set parallel.micro_batch_size=32" ;;
    llama-tiny) echo "--config $root/configs/llama-tiny.toml" ;;
    *) echo "breakdown_kernels.sh: unknown model $1 in MODELS" >&2; exit 2 ;;
  esac
}

# One run's summary line from its output.
summarise() {  # kernel threads model output-file
  python3 - "$@" <<'EOF'
import re, sys
kernel, threads, model, path = sys.argv[1:]
text = open(path).read()
sgemm = float(re.search(r"sgemm \(1024\^3, this run\): ([\d.]+)", text).group(1))
def row(name):
    m = re.search(r"^" + re.escape(name) + r"\s+(-?[\d.]+)\s+(-?[\d.]+)%(?:\s+([\d.]+)\s+([\d.]+))?", text, re.M)
    return m.groups() if m else (None,) * 4
step = row("step")
products = sum(float(row(n)[1]) for n in ("products: blocks", "products: head", "products: attention"))
head = row("products: head")
loss = row("softmax + loss")
print(f"{kernel:>9} {threads:>7} {model:<16} {sgemm:9.1f} {float(step[0]):10.2f} {float(step[3]):8.2f} "
      f"{products:8.1f}% {float(head[3]):8.2f} {float(loss[1]):7.1f}%")
EOF
}

printf '%9s %7s %-16s %9s %10s %8s %9s %8s %8s\n' kernel threads model "sgemm" "step ms" "of sgemm" \
  products "head" "loss"
for k in $kernels; do
  for t in $threads; do
    for m in $models; do
      env_kernel=()
      [[ $k == default ]] || env_kernel=(OPENBLAS_CORETYPE="$k")
      # shellcheck disable=SC2046  # model_args prints separate words on purpose
      env "${env_kernel[@]}" "$bin" $(model_args "$m") --threads "$t" --rounds "$rounds" > "$tmp/out" 2>&1 \
        || { echo "breakdown_kernels.sh: $m, kernel $k, $t threads failed:" >&2; tail -3 "$tmp/out" >&2; exit 1; }
      summarise "$k" "$t" "$m" "$tmp/out"
      [[ $m != "${models%% *}" ]] || grep -h '^machine:' "$tmp/out" >> "$tmp/machines"
    done
  done
done
cat "$tmp/machines"   # the first model's run of each kernel and thread count
echo "(sgemm in GFLOP/s, this run's; of sgemm: the step's model FLOPs over its time against it; products: their"
echo " share of the step; head: the vocabulary head's products against sgemm; loss: softmax + loss's share)"
