#!/usr/bin/env bash
# On the GPU machine (after `source .gpu/activate.sh`): GPU tests, then benchmarks; logs under
# $OUT. Prints short summaries last. BENCH="w4 w1 w5" picks workloads; REF=1 adds transformers.
# TESTS=all runs every GPU test of the suite instead: the GPU machine lacks the API's and the
# GGUF converter's packages, whose test modules hold no GPU test, so modules that fail to import
# are passed over, not fatal. On a fresh machine Triton compiles every kernel cold and the whole
# suite ran past its 560 s (H100, 2026-12-06: 85 of about 94 tests in 560 s, none failed): give
# TEST_PATHS=tests/compute/layers in one call and TEST_PATHS=rest (GPU_REST) in another.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
out="${OUT:-/tmp}"
# every GPU test outside tests/compute/layers
GPU_REST="tests/compute/sampling tests/compute/step tests/compute/test_gpu.py tests/compute/test_gpu_guided.py tests/compute/test_gpu_quantization.py tests/compute/test_host_kv.py tests/test_host_kv_tier.py"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
if [ "${TESTS:-1}" = all ]; then
  paths="${TEST_PATHS:-tests}"; [ "$paths" = rest ] && paths="$GPU_REST"
  timeout 560 python3 -m pytest -q -m gpu -p no:cacheprovider -o addopts="" \
    --continue-on-collection-errors $paths > "$out/gpu_tests.log" 2>&1
  [ $? = 124 ] && echo "TIMED OUT after 560 s: the tests above ran, the rest did not" >> "$out/gpu_tests.log"
elif [ "${TESTS:-1}" = 1 ]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/compute/test_triton_decode.py tests/compute/test_fused.py > "$out/kernel_tests.log" 2>&1
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/compute/test_gpu.py > "$out/gpu_tests.log" 2>&1
fi
ref="--no-reference"; [ "${REF:-0}" = 1 ] && ref=""
for w in ${BENCH:-w4}; do
  timeout "${BENCH_TIMEOUT:-300}" python3 -m aioworker.cli.main bench --workload "$w" $ref --record "$out/bench.md" > "$out/bench_$w.log" 2>&1
done
[ -n "${PROFILE:-}" ] && timeout 120 python3 tools/profile_step.py $PROFILE > "$out/profile.log" 2>&1
if [ "${TESTS:-1}" != 0 ]; then
  [ -f "$out/kernel_tests.log" ] && { echo "== kernel tests"; tail -2 "$out/kernel_tests.log"; }
  echo "== gpu tests"; grep -E "passed|failed|^E  |TIMED OUT" "$out/gpu_tests.log" | tail -20
fi
for w in ${BENCH:-w4}; do echo "== $w"; grep -vE "^\s*$|Warning|warn" "$out/bench_$w.log" | tail -12; done
[ -n "${PROFILE:-}" ] && head -3 "$out/profile.log"
exit 0
