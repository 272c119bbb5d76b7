#!/usr/bin/env bash
# bench/vs_torch.sh: the gpt2-mini training step (4 micro-batches of 8 x 128 tokens) in
# pipefisher (bench_breakdown) and in PyTorch eager (bench/torch_gpt_step.py, Debian's
# python3-torch on the same OpenBLAS and kernel family), one after the other with the same
# threads, and the ratio of their tokens/s.
#
#   bench/vs_torch.sh [build-dir]        env: THREADS=2 ROUNDS=5 STEPS=3
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
threads=${THREADS:-2}
rounds=${ROUNDS:-5}
steps=${STEPS:-3}
bd=$build/bench/bench_breakdown
[[ -x $bd ]] || { echo "vs_torch.sh: no $bd (configure with -DPF_BUILD_BENCH=ON, build bench_breakdown)" >&2; exit 2; }
/usr/bin/python3 -c 'import torch' 2> /dev/null || { echo "vs_torch.sh: /usr/bin/python3 has no torch (apt-get install python3-torch)" >&2; exit 2; }
source "$root/bench/lib.sh"
pf_machine "$build/pipefisher" "$threads"
# PyTorch's OpenBLAS gets the kernel family pipefisher runs with on this CPU.
core=$("$build/pipefisher" machine --threads "$threads" | sed -nE 's/.*kernel ([A-Za-z0-9]+).*/\1/p')
ours_out=$("$bd" --threads "$threads" --rounds "$rounds" --steps "$steps")
echo "$ours_out"
theirs_out=$(OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$core} /usr/bin/python3 "$root/bench/torch_gpt_step.py" "$threads" "$rounds" "$steps")
echo "$theirs_out"
ours=$(sed -nE 's/^breakdown: .*, ([0-9.]+) tokens\/s$/\1/p' <<< "$ours_out")
theirs=$(sed -nE 's/^torch: .*, ([0-9.]+) tokens\/s$/\1/p' <<< "$theirs_out")
python3 -c "import sys; o, t = map(float, sys.argv[1:]); print(f'gpt2-mini step: pipefisher {o:.1f} tokens/s, PyTorch eager {t:.1f}: {o / t:.2f}x')" "$ours" "$theirs"
