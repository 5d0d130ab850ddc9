#!/usr/bin/env bash
# Set up the environment, then ask the embedded SmolLM2 model a question (streamed answer).
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
. .venv/bin/activate
aioworker generate --chat --prompt "${1:-What is the capital of France?}" --max-tokens 128
