#!/usr/bin/env bash
# Set up the environment, then lint and run the CPU test suite. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
. .venv/bin/activate
ruff check aioworker tests tools
ruff format --check aioworker tests tools
pytest "$@"
