#!/usr/bin/env bash
# Installs every Debian package pipefisher needs to build, test and fetch its data.
# Idempotent: does nothing (quickly) when all packages are already present.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build git pkg-config ca-certificates
  libopenblas-dev liblapacke-dev
  libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libspdlog-dev libfmt-dev
  libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  librsvg2-bin
  jq                                            # bench/paper_figures.sh and its test
  clang libclang-rt-14-dev libomp-dev python3   # scripts/fuzz.sh: libFuzzer + sanitizers, clang's OpenMP, seeds
  iproute2                                      # tests/faults: two "hosts" in network namespaces
  python3-torch                                 # tests/apps/hf_check.py: saved models read back by PyTorch
  nodejs npm
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm may come from another nodejs build (nodesource ships npm inside nodejs).
if command -v npm >/dev/null 2>&1; then
  tmp=(); for p in "${missing[@]}"; do [[ $p == npm || $p == nodejs ]] || tmp+=("$p"); done
  missing=("${tmp[@]+"${tmp[@]}"}")
fi
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install-deps: all packages present"
