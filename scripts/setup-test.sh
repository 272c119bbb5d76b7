#!/usr/bin/env bash
# Set-up command 2: installs everything, builds, fetches the data, and runs the whole test suite.
# Idempotent; quick when all is present. `.ci/run` calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
bash scripts/prepare-data.sh build/pipefisher
cd build
ctest --output-on-failure -j 2 "$@"
