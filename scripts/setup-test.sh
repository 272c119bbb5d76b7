#!/usr/bin/env bash
# Set-up command 2: installs everything, builds, fetches the data, and runs the whole test suite.
# Idempotent; quick when all is present. `.ci/run` calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
bash scripts/prepare-data.sh build/pipefisher
cd build
# Multi-rank tests share the 2 cores with each other (-j 2); PipeFisher's plans come from timings
# measured in the run, so a test that lost a race for a core gets one more try. A real failure
# fails twice.
ctest --output-on-failure -j 2 --repeat until-pass:2 "$@"
