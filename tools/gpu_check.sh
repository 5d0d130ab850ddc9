#!/usr/bin/env bash
# On the GPU machine (after `source .gpu/activate.sh`): GPU tests, a quick W4 and step profiles;
# logs under $OUT. Prints short summaries last.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_triton_decode.py tests/test_fused.py > "$out/kernel_tests.log" 2>&1
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py > "$out/gpu_tests.log" 2>&1
timeout 200 python3 -m aioworker.cli.main bench --workload w4 --no-reference > "$out/w4.log" 2>&1
timeout 120 python3 tools/profile_step.py --model qwen3-0.6b --batch 1 > "$out/profile_qwen_b1.log" 2>&1
timeout 120 python3 tools/profile_step.py --model qwen3-0.6b --batch 256 > "$out/profile_qwen_b256.log" 2>&1
echo "== kernel tests"; tail -3 "$out/kernel_tests.log"
echo "== gpu tests"; grep -E "passed|failed|^E  " "$out/gpu_tests.log" | tail -20
echo "== w4"; tail -6 "$out/w4.log"
echo "== profiles"; head -2 "$out/profile_qwen_b1.log"; head -2 "$out/profile_qwen_b256.log"
