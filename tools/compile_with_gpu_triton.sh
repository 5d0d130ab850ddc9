#!/usr/bin/env bash
# Compile every Triton kernel variant for sm_90 with the Triton the GPU machine has (3.6, per
# ../shared/gpu/README.md), not the CPU set-up's: the two versions' frontends differ, and a
# device call that fails to compile costs GPU time. Installs that Triton (no dependencies) into
# a folder of its own, once, and puts it first on PYTHONPATH; the compile scripts need no GPU.
#   tools/compile_with_gpu_triton.sh [version]      (default 3.6.0)
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-3.6.0}"
target="${TMPDIR:-/tmp}/triton-$version"
. .venv/bin/activate
[ -d "$target/triton" ] || pip install --quiet --no-deps --target "$target" "triton==$version"
export PYTHONPATH="$target:$PWD"
env -u TRITON_INTERPRET python -c "import triton; print('triton', triton.__version__)"
env -u TRITON_INTERPRET python tests/compute/layers/gemv/hopper_compile.py | tail -3
env -u TRITON_INTERPRET python tests/compute/layers/pdl_compile.py
