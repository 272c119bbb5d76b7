#!/usr/bin/env bash
# Set-up command 1: installs everything, builds, fetches the data, and runs the built-in default job
# (a short BERT pretraining run on the real corpus). Idempotent; quick when all is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh --target pipefisher
bash scripts/prepare-data.sh build/pipefisher
exec build/pipefisher train "$@"
