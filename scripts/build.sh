#!/usr/bin/env bash
# Configures (once) and builds pipefisher with the release preset into build/.
# Usage: scripts/build.sh [extra cmake --build args, e.g. --target pipefisher]
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -f build/build.ninja ]]; then
  cmake --preset release >/dev/null
fi
cmake --build build -j "$(nproc)" "$@"
