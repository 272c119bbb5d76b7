#!/usr/bin/env bash
# Runs test programs again with OPENBLAS_CORETYPE forced to each BLAS kernel family this CPU can
# run (Prescott everywhere, Haswell with AVX2 + FMA, SkylakeX with AVX-512): other kernels round
# differently, so a test that pinned a CPU-dependent bit fails here. Forcing a family the CPU
# lacks would crash with an illegal instruction, so only those it has are tried.
#   scripts/test-kernels.sh [ctest args]     # default: the test programs below, by family
# Run after scripts/setup-test.sh (the build and data exist). `.ci/run` calls it.
set -euo pipefail
cd "$(dirname "$0")/../build"
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }
families=(Prescott)
has avx2 && has fma && families+=(Haswell)
has avx512f && has avx512bw && has avx512vl && has avx512dq && families+=(SkylakeX)
args=("$@")
# Every program whose results go through BLAS: single process, pipelines (runtime), K-FAC,
# checkpoints, data-parallel K-FAC; less the suites whose tests compare two runs of the same code
# on the same kernel bit for bit (a resumed run with an uninterrupted one, recomputation on and
# off) or check refusals, files and logs: no kernel can make them pass on one CPU and fail on
# another, and they are half of these programs' time (the whole suite runs them once).
# The numeric programs run under every family; the multi-process ones (train, runtime,
# checkpoint), which compare a pipeline with one process on the same kernel, under the first
# only: one other rounding is enough to show a test pins no CPU's bits, and they are most of the time.
skip='^(Resume|AutoResume|Recompute|Rotation|RunDir|RunLog|RuntimeMisuse|WeightsFit)\.'
for i in "${!families[@]}"; do
  f=${families[$i]}
  run=("${args[@]}")
  if ((${#args[@]} == 0)); then
    labels='core|nn|optim|kfac|dkfac'
    ((i == 0)) && labels+='|train|runtime|checkpoint'
    run=(-L "^($labels)\$" -E "$skip")
  fi
  echo "test-kernels: OPENBLAS_CORETYPE=$f (${run[*]})"
  OPENBLAS_CORETYPE=$f ctest --output-on-failure -j 2 --repeat until-pass:2 "${run[@]}"
done
