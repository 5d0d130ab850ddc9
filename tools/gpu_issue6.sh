#!/usr/bin/env bash
# On the GPU machine: the GPU tests, then the weights-update benchmark; logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
out="${OUT:-/tmp}"
timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/compute/test_gpu.py > "$out/gpu_tests.log" 2>&1
timeout 420 python3 tools/bench_weights_update.py > "$out/weights_bench.log" 2>&1
echo "== gpu tests"; grep -E "passed|failed|^E  " "$out/gpu_tests.log" | tail -20
echo "== weights bench"; tail -12 "$out/weights_bench.log"
exit 0
