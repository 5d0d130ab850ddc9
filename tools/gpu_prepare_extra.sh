#!/usr/bin/env bash
# Stage what the GPU machine lacks beyond ../shared/gpu (run after ../shared/gpu/prepare.sh, from
# the project root): the cp312 wheels guided decoding needs (xgrammar and its dependencies), and
# the embedded model's tokenizer.json, which GPU tests and `bench --workload guided` guide with
# (the GPU machine has no embedded model, and no network).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .gpu/wheels ] || { echo "run ../shared/gpu/prepare.sh first" >&2; exit 1; }
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --no-deps \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/wheels xgrammar==0.2.9 apache-tvm-ffi pydantic pydantic-core annotated-types typing-inspection
rm -f .gpu/wheels/pydantic_core-0.0.1-*.whl  # a placeholder wheel, not the compiled one
. .venv/bin/activate
python -c "
import shutil
from aioworker.checkpoint.source import resolve_model_path
shutil.copy(resolve_model_path('embedded', progress=False) / 'tokenizer.json', '.gpu/tokenizer.json')"
echo "staged: $(ls .gpu/wheels | wc -l) wheels and .gpu/tokenizer.json"
