#!/usr/bin/env bash
# Set up the environment, start a worker on the embedded SmolLM2 model (CPU), send it a chat
# prompt through the client, stream the answer, and shut the worker down cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
. .venv/bin/activate

name="demo-$$"
deployment=(--set "runtime.name=\"$name\"")
aioworker serve "${deployment[@]}" &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null || true' EXIT

echo "waiting for the worker (the first run also converts the embedded model)..." >&2
aioworker admin wait-ready "${deployment[@]}" --timeout 600 >/dev/null

aioworker generate --connect "${deployment[@]}" --chat --max-tokens 128 \
  --prompt "${1:-What is the capital of France?}"

aioworker admin shutdown "${deployment[@]}" >/dev/null
wait "$serve_pid"
trap - EXIT
echo "worker stopped cleanly (exit $?)" >&2
