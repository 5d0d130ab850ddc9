#!/usr/bin/env bash
# On the GPU machine, issues 22 and 23 in three calls (each under the 10-minute limit); logs and
# the tuned table under $OUT, a short table last.
#   tools/gpu_issue22.sh tune     the kernels' GPU tests, then the tile sweep (writes the table)
#   tools/gpu_issue22.sh bench    W4 for every format, kernels off and on (recorded), in two runs
#   tools/gpu_issue22.sh all      tune (a shorter sweep), then bench with the table it wrote
#   tools/gpu_issue22.sh final    W4 for every format, the composed GPU tests, the shape tests
#   tools/gpu_issue22.sh check    the GPU tests of compute/ and the profile of an 8B step
#   tools/gpu_issue22.sh refine [--pdl]  the kernels' GPU tests, then a sweep of the table's tiles
#                                 and their neighbours only (a8, bits, fold; with --pdl the
#                                 products launched with PDL, and prefetch), writing the table
#   tools/gpu_issue22.sh candidates  W4 (bf16, fp8) with each feature still off by default
#                                 against the defaults (the add and norm fused in the products,
#                                 rotary and the cache write in decode attention, programmatic
#                                 dependent launch), and the composed GPU tests
#   tools/gpu_issue22.sh together W4 (bf16, fp8) with all three on against the defaults, and W4
#                                 of every format with the kernels off against on
#   tools/gpu_issue22.sh pdl      W4 (bf16, fp8) with PDL against the defaults, W1 with the
#                                 defaults and with PDL, and the kernels' every-shape test
#   tools/gpu_issue22.sh retune   the kernels' tests, a short refine sweep with PDL, W4 bf16
#                                 and fp8 off against on (TESTS_S: the tests' time limit)
#   tools/gpu_issue22.sh int8     the kernels' tests, a refine sweep of wint8 with PDL (words,
#                                 wide_x; commit the table), W4 wint8
#   tools/gpu_issue22.sh quant    the kernels' tests, a refine sweep of wint8 and wint4 with PDL
#                                 (int4's blocks, int8's words; commit the table), W4 of both
#   tools/gpu_issue22.sh blocks   int4's blocks tests, a refine sweep of wint4 with PDL (`ahead` among
#                                 its candidates; commit the table; SWEEP_S: its budget), W4 wint4
#   tools/gpu_issue22.sh pipelined [FORMATS]  the stored formats' kernel tests (pipelined FMA
#                                 tiles, int4's blocks), a refine sweep with PDL of FORMATS
#                                 (default fp8,wint8,wint4; FMA tiles with and without their
#                                 loads issued ahead; commit the table), W4 wint8 and wint4
#                                 (with FORMATS given: W4 of those)
#   tools/gpu_issue22.sh sweep [FORMATS]  the stored formats' kernel tests, then a refine sweep
#                                 with PDL of FORMATS (default all four; SWEEP_S: its budget;
#                                 commit the table), no W4
#   tools/gpu_issue22.sh finish [FORMATS]  W4 of FORMATS (default wint8,wint4; W4_S: its time
#                                 limit) off against on, W1, the every-shape and composed tests
#   tools/gpu_issue22.sh verify   after a sweep: the stored formats' kernel tests, the every-shape
#                                 test and the composed tests, with a cold compiler's time limits
#   tools/gpu_issue22.sh group128 int4's blocks tests (the raw tiles' among them), a refine sweep
#                                 of wint4 in groups of 128 (raw tiles among its candidates;
#                                 int4g128 keys; commit the table), W4 wint4: groups of 128 (W4's
#                                 wint4) against 32 (the engine's default, model.int4_group=32)
#   tools/gpu_issue22.sh head     the quantized engines' GPU tests (a quantized LM head among them),
#                                 the few-rows argmax's tests, W4 fp8, wint8 and wint4: the
#                                 defaults against model.quantize_lm_head (the head read from a
#                                 quantized copy), an 8B fp8 step's profile with PDL off
#   tools/gpu_issue22.sh profile  kernels per decode step and their time with PDL off (costs, not
#                                 waits): the 8B in bf16 and fp8, the 0.6B in bf16
#   tools/gpu_issue22.sh one      for little device time: the decode and graph GPU tests, then W4 of
#                                 bf16, fp8 and wint4 with device.pdl_max_batch=8, three runs a side
#   tools/gpu_issue22.sh w1       where W1's large decode steps go: the decode kernel alone at their
#                                 batches, spread contexts against equal (4 and 8 warps; 1, 2 and
#                                 4 splits), and a 200-sequence step profiled
#   tools/gpu_issue22.sh attn     decode attention's builds (pipelining depth, keys a tile, the grid's
#                                 order, warps) at W1's large steps and the 8B's batches 8 and 64,
#                                 each timed in a CUDA graph
#   tools/gpu_issue22.sh goals    one call for an H200: W4 of every format (the goals table's
#                                 defaults) against PDL in graphs of up to 8 sequences, three
#                                 runs a side (W4_REPEATS), W1 (the defaults, their breakdown)
#                                 against no tiles of 128 keys (decode_attention_tile_128_from_programs=0)
#   tools/gpu_issue22.sh attn_w1 SETTING...  the decode builds' GPU tests, then W1 with each
#                                 SETTING (e.g. device.decode_attention_tile=128) against the
#                                 defaults (three runs a side)
#   tools/gpu_issue22.sh products  W1's large steps' products (Qwen3-0.6B, 80, 208 and 256 rows):
#                                 cuBLAS against cuBLASLt and a Triton GEMM splitting K, each
#                                 beside its roof (tools/bench_products.py)
#   tools/gpu_issue22.sh w1h200   for an H200: W1 against tile_128_from_programs=0, attention's builds at W1's
#                                 large steps, w1host, and a 200-sequence decode step profiled
#   tools/gpu_issue22.sh rope     the rotary-and-cache kernel at one token a program against 4
#                                 and 16 (tools/bench_rope_cache.py), both models' heads
#   tools/gpu_issue22.sh w1host   what the executor's host does launching W1's prefill steps (28 ms
#                                 each on an H100): cProfile over 256 prompts of 560 tokens
#   tools/gpu_issue22.sh norms    the norm split between the products around it: its GPU tests
#                                 (the kernels against the reference; greedy tokens through
#                                 graphs with PDL), then W4 of bf16, fp8 and wint4 with
#                                 device.norms_in_product_finish against the defaults (three
#                                 runs a side; W4_S: W4's time limit)
#   tools/gpu_issue22.sh h200 [MODE...]  for an H200 only (elsewhere MODE, or nothing): W1 on
#                                 the defaults, then W4 of the goal rows against
#                                 pdl_max_batch=8 (H200_S: the call's seconds)
#   tools/gpu_issue22.sh rest     every GPU test outside tests/compute/layers (graphs, warm-up,
#                                 engines; REST_S: its time limit)
#   tools/gpu_issue22.sh profile8 batch 8's step on the 0.6B, the 8B in fp8 and bf16: kernels and
#                                 their GPU time, PDL off
#   tools/gpu_issue22.sh epilogue W4 of bf16, fp8 and wint4: the defaults against
#                                 device.early_epilogue_loads (W4_S: the limit)
#   tools/gpu_issue22.sh wint4early the 8B's wint4 step profiled with PDL on, without and with
#                                 device.early_epilogue_loads (0.92x in W4 on an H100)
#   tools/gpu_issue22.sh h100     the fallback of `h200 h100`: wint4early, profile8, then the
#                                 GPU tests outside the kernels that the last call left unrun
#   tools/gpu_issue22.sh h200b [MODE...]  the second H200 call: a refine sweep of wint4 in
#                                 groups of 128 (commit the table), W4 wint4 against groups of
#                                 32, W4 wint8 against PDL (after its GPU test), then wint4early
#   tools/gpu_issue22.sh w1tile   W1 against tiles of 128 keys from W1_TILE_FROM programs (320)
#   tools/gpu_issue22.sh draws    W1 on nano-vllm's own draws against the draws it ran until
#                                 2026-12-07 (tools/w1_draws.py, three runs a side, recorded)
#   tools/gpu_issue22.sh unrun    the GPU tests left unrun since their last change: the warm-up's
#                                 and the kernels' every-shape test (EVERY_S: its time limit)
# SHAPES=llama-3.1-8b[:qkv],...: group128's sweep of those shapes only (gemv_tune.py --shapes).
# TESTS_K: group128's test selection (pytest -k). TESTS_S: the kernel tests' time limit.
# W4_REPEATS=N: each W4 side N times, alternating, medians (default 1; 3 to decide a candidate).
# TABLE=path: a table from an earlier `tune`, put in place first (default: the one `tune` left in
# /tmp, while the machine stays warm).
# After a kernel change, in this order: `refine` (commit the table it writes), `candidates`,
# then `together` or `profile`; a feature goes on by default only where W4 measured it faster.
set -uo pipefail
export PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
TABLE="${TABLE:-/tmp/tuned_tiles.json}"
[ "${1:-}" != tune ] && [ -f "$TABLE" ] && cp "$TABLE" aioworker/compute/layers/gemv/tuned_tiles.json
# a table of this GPU's own (choice.gpu_table_path) that an earlier call on this machine wrote
[ "${1:-}" != tune ] && cp /tmp/tuned_tiles.*.json aioworker/compute/layers/gemv/ 2>/dev/null
# `aioworker bench` from the checkout (the GPU machine has the package on PYTHONPATH, no script)
BENCH=(python3 -c 'import sys;sys.argv=["aioworker","bench",*sys.argv[1:]];from aioworker.cli.main import main;sys.exit(main())')
keep_table() {  # the tables a sweep wrote: back with $OUT, and in /tmp for a later call (TABLE)
  cp aioworker/compute/layers/gemv/tuned_tiles*.json "$out/" 2>/dev/null
  cp aioworker/compute/layers/gemv/tuned_tiles*.json /tmp/ 2>/dev/null
}
w4() {  # W4 for the formats given, recorded in docs/benchmarks.md (copied to $OUT); further
        # arguments go to the bench (--candidate KEY=VALUE)
  local formats="$1" limit="$2" name="$3"; shift 3
  timeout "$limit" "${BENCH[@]}" \
    --workload w4 --w4-formats "$formats" --w4-repeats "${W4_REPEATS:-1}" --no-reference --record docs/benchmarks.md "$@" \
    > "$out/w4_$name.log" 2>&1
  cp docs/benchmarks.md "$out/"
}
w1_against() {  # $1: the log's name, then KEY=VALUE...; W1, the defaults against those
                # settings, three runs a side, recorded (copied to $OUT)
  local name="$1" setting candidates=(); shift
  for setting in "$@"; do candidates+=(--candidate "$setting"); done
  timeout 200 "${BENCH[@]}" \
    --workload w1 --no-reference --record docs/benchmarks.md "${candidates[@]}" \
    > "$out/$name.log" 2>&1
  cp docs/benchmarks.md "$out/"
}
w1_tile() {  # W1, the defaults against W1_TILE_FROM (default 0: no tiles of 128 keys) as
             # device.decode_attention_tile_128_from_programs
  w1_against w1_tile "device.decode_attention_tile_128_from_programs=${W1_TILE_FROM:-0}"
}
w1_profile() {  # where a 200-sequence decode step of W1's model goes, torch's profiler
  timeout 110 python3 tools/profile_step.py --model qwen3-0.6b --batch 200 --prompt-tokens 800 \
    > "$out/w1_profile.log" 2>&1
}
sweep_g128() {  # $1: seconds; a refine sweep of wint4 in groups of 128 with PDL, further
               # arguments to gemv_tune.py (--shapes); the table kept (keep_table)
  local budget="$1"; shift
  timeout $(( budget + 50 )) python3 tools/gemv_tune.py --json "$out/gemv_tune.json" \
    --budget-s "$budget" --write-table --refine --pdl --formats wint4 --int4-group 128 "$@" \
    > "$out/gemv_tune.log" 2>&1
  keep_table
}
tune() {  # $1: the sweep's budget in seconds; further arguments go to the sweep (--refine)
  local budget="$1"; shift
  timeout "${TESTS_S:-200}" python3 -m pytest -q -p no:cacheprovider -o addopts="" \
    tests/compute/layers/gemv tests/compute/layers/test_pdl.py -k "not every_shape" \
    > "$out/gemv_tests.log" 2>&1
  timeout $(( budget + 60 )) python3 tools/gemv_tune.py --json "$out/gemv_tune.json" \
    --budget-s "$budget" --write-table "$@" > "$out/gemv_tune.log" 2>&1
}
h200_only() {  # true on an H200; elsewhere becomes mode $2 (with its arguments) if given, or
              # returns false
  local gpu; gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "GPU: $gpu"
  echo "$gpu" | grep -q H200 && return 0
  [ -n "${2:-}" ] && exec bash "$0" "${@:2}"
  return 1
}
outside_kernels() {  # $1: the time limit; then test paths run before the ones every call
                   # outside tests/compute/layers runs (samplers, guidance, the formats' engines,
                   # the host KV tier)
  local limit="$1"; shift
  timeout "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider -o addopts="" \
    --continue-on-collection-errors "$@" tests/compute/sampling tests/compute/test_gpu_guided.py \
    tests/compute/test_gpu_quantization.py tests/compute/test_host_kv.py \
    tests/test_host_kv_tier.py > "$out/gpu_rest.log" 2>&1
  [ $? = 124 ] && echo "TIMED OUT after $limit s: the tests above ran, the rest did not" >> "$out/gpu_rest.log"
  echo "== GPU tests outside the kernels"; grep -E "passed|failed|^FAILED|^E  |TIMED OUT" "$out/gpu_rest.log" | tail -12
}
every_shape() {  # the kernels against the reference at every shape of configs/models/
  timeout "$1" python3 -m pytest -q -p no:cacheprovider -o addopts="" -k every_shape \
    tests/compute/layers/gemv/test_gpu_gemv.py > "$out/every_shape.log" 2>&1
  echo "== every shape"; grep -E "passed|failed|^FAILED|^E  " "$out/every_shape.log" | tail -4
}
composed() {  # the GPU tests of features composed with the kernels
  timeout "$1" python3 -m pytest -v -p no:cacheprovider -o addopts="" -m gpu -k "not zmq and not release and not ipc and not profiled and not xformers" \
    tests/compute/test_gpu.py tests/compute/step tests/compute/test_gpu_guided.py \
    > "$out/gpu_tests.log" 2>&1
}
stored_sweep() {  # $1: formats, $2: the sweep's budget in seconds, $3: the tests' -k (default
                 # the stored formats'); the kernel tests (TESTS_S: their time limit), then a
                 # refine sweep with PDL of those formats (its table kept)
  timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider -o addopts="" \
    tests/compute/layers/gemv/test_int4_blocks.py tests/compute/layers/gemv/test_product.py \
    tests/compute/layers/gemv/test_gpu_gemv.py -k "${3:-blocks or bits or fma or int8}" \
    > "$out/gemv_tests.log" 2>&1
  timeout $(( $2 + 50 )) python3 tools/gemv_tune.py --json "$out/gemv_tune.json" --budget-s "$2" \
    --write-table --refine --pdl --formats "$1" > "$out/gemv_tune.log" 2>&1
  keep_table
  echo "== kernel tests"; grep -E "passed|failed|^FAILED|^E  " "$out/gemv_tests.log" | tail -6
  echo "== sweep"; grep -cE "WRONG" "$out/gemv_tune.log"; grep "^| llama\|^| qwen" "$out/gemv_tune.log" | tail -40
}
case "${1:-}" in
  all)
    tune 230
    keep_table
    w4 none,fp8 110 a
    w4 wint8,wint4 110 b
    echo "== tests"; grep -E "passed|failed|^FAILED|^E  |top-1" "$out/gemv_tests.log" | tail -12
    echo "== sweep"; grep WRONG "$out/gemv_tune.log" | head -5; grep "^| llama" "$out/gemv_tune.log"
    echo "== w4"; tail -11 "$out/w4_a.log"; tail -9 "$out/w4_b.log"
    ;;
  final)  # W4 for every format, the GPU tests of composed features, the kernels' shape tests
    w4 none,fp8,wint8,wint4 90 a
    composed 70
    timeout 30 python3 -m pytest -q -p no:cacheprovider -o addopts="" -k every_shape \
      tests/compute/layers/gemv/test_gpu_gemv.py > "$out/gemv_tests.log" 2>&1
    echo "== gpu tests"; grep -E "PASSED|FAILED|SKIPPED|passed|failed|^E  " "$out/gpu_tests.log" | tail -24
    echo "== gemv"; grep -E "passed|failed|PASSED|FAILED" "$out/gemv_tests.log" | tail -3
    echo "== w4"; tail -12 "$out/w4_a.log"
    ;;
  tune)
    tune 280
    keep_table
    echo "== tests"; grep -E "passed|failed|^FAILED|^E  " "$out/gemv_tests.log" | tail -12
    echo "== sweep"; grep WRONG "$out/gemv_tune.log" | head -5; tail -32 "$out/gemv_tune.log"
    ;;
  bench)
    w4 none,fp8 300 a
    w4 wint8,wint4 270 b
    echo "== w4"; tail -11 "$out/w4_a.log"; tail -9 "$out/w4_b.log"
    ;;
  check)
    timeout 420 python3 -m pytest -q -p no:cacheprovider -o addopts="" -m gpu tests/compute \
      > "$out/gpu_tests.log" 2>&1
    timeout 100 python3 tools/profile_step.py --model llama-3.1-8b --small-batch-kernels \
      > "$out/profile.log" 2>&1
    echo "== tests"; grep -E "passed|failed|^FAILED|^E  " "$out/gpu_tests.log" | tail -12
    echo "== profile"; head -24 "$out/profile.log"
    ;;
  refine)
    tune 260 --refine "${@:2}"
    keep_table
    echo "== tests"; grep -E "passed|failed|^FAILED|^E  " "$out/gemv_tests.log" | tail -12
    echo "== sweep"; grep -E "WRONG|FAILED" "$out/gemv_tune.log" | head -8; tail -30 "$out/gemv_tune.log"
    ;;
  candidates)
    w4 none,fp8 130 norm --candidate device.fused_norm_products=true
    w4 none,fp8 130 rope --candidate device.fused_rope_attention=true
    w4 none,fp8 130 pdl --candidate device.pdl=true
    composed 90
    echo "== gpu tests"; grep -E "FAILED|passed|failed|^E  " "$out/gpu_tests.log" | tail -12
    for name in norm rope pdl; do echo "== w4 $name"; tail -8 "$out/w4_$name.log"; done
    ;;
  together)
    w4 none,fp8 150 all --candidate device.fused_norm_products=true \
      --candidate device.fused_rope_attention=true --candidate device.pdl=true
    w4 none,fp8,wint8,wint4 240 kernels
    for name in all kernels; do echo "== w4 $name"; tail -10 "$out/w4_$name.log"; done
    ;;
  pdl)  # PDL (graphs of at most pdl.MAX_GRAPH_BATCH sequences) against the defaults, W1 with
        # the defaults and with PDL, the kernels' every-shape test
    w4 none,fp8 140 pdl --candidate device.pdl=true
    timeout 160 "${BENCH[@]}" \
      --workload w1 --no-reference --record docs/benchmarks.md --candidate device.pdl=true > "$out/w1_pdl.log" 2>&1
    cp docs/benchmarks.md "$out/"
    every_shape 100
    echo "== w1 pdl"; tail -8 "$out/w1_pdl.log"
    echo "== w4 pdl"; tail -8 "$out/w4_pdl.log"
    ;;
  retune)  # a shorter refine sweep with PDL (the table it writes is put in place), then W4
           # bf16 and fp8 with the kernels off against on
    tune 170 --refine --pdl
    keep_table
    w4 none,fp8 130 a
    echo "== tests"; grep -E "passed|failed|^FAILED|^E  " "$out/gemv_tests.log" | tail -8
    echo "== sweep"; grep -E "WRONG|FAILED" "$out/gemv_tune.log" | head -6; grep "^| llama\|^| qwen" "$out/gemv_tune.log" | tail -40
    echo "== w4"; tail -9 "$out/w4_a.log"
    ;;
  last)  # the composed GPU tests (PDL on by default), the kernels' tests, a short refine sweep
         # of bf16 and fp8 with PDL (its table put in place), W4 bf16 and fp8 off against on
    composed 80
    TESTS_S=90 tune 130 --refine --pdl --formats none,fp8
    keep_table
    w4 none,fp8 120 a
    echo "== gpu tests"; grep -E "FAILED|passed|failed|^E  " "$out/gpu_tests.log" | tail -6
    echo "== kernel tests"; grep -E "passed|failed|^FAILED|^E  " "$out/gemv_tests.log" | tail -6
    echo "== sweep"; grep -E "WRONG|FAILED" "$out/gemv_tune.log" | head -4; grep "^| llama\|^| qwen" "$out/gemv_tune.log" | tail -30
    echo "== w4"; tail -9 "$out/w4_a.log"
    ;;
  int8)  # the kernels' tests, a refine sweep of wint8 with PDL (words, wide_x), W4 wint8
    TESTS_S=150 tune 200 --refine --pdl --formats wint8
    keep_table
    w4 wint8 100 c
    echo "== kernel tests"; grep -E "passed|failed|^FAILED|^E  " "$out/gemv_tests.log" | tail -6
    echo "== sweep"; grep -E "WRONG|FAILED" "$out/gemv_tune.log" | head -4; grep "^| llama" "$out/gemv_tune.log" | tail -10
    echo "== w4"; tail -7 "$out/w4_c.log"
    ;;
  quant)  # the kernels' tests (int4's blocks at each shape, int8's words on both tilings), a
          # refine sweep of wint8 and wint4 with PDL (blocks, words, one stage; commit the
          # table), W4 wint8 and wint4
    timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
      tests/compute/layers/gemv/test_int4_blocks.py tests/compute/layers/gemv/test_weight_tiles.py \
      tests/compute/layers/gemv/test_gpu_gemv.py -k "blocks or bits or quantized or pairs" \
      > "$out/gemv_tests.log" 2>&1
    timeout 320 python3 tools/gemv_tune.py --json "$out/gemv_tune.json" --budget-s 270 \
      --write-table --refine --pdl --formats wint8,wint4 > "$out/gemv_tune.log" 2>&1
    keep_table
    w4 wint8,wint4 120 q
    echo "== kernel tests"; grep -E "passed|failed|^FAILED|^E  " "$out/gemv_tests.log" | tail -6
    echo "== sweep"; grep -E "WRONG|FAILED" "$out/gemv_tune.log" | head -4; grep "^| llama\|^| qwen" "$out/gemv_tune.log" | tail -24
    echo "== w4"; tail -9 "$out/w4_q.log"
    ;;
  blocks)  # int4's blocks tests (both tilings, every shape, `ahead` among them), a refine sweep
           # of wint4 with PDL (each blocks tiling with and without `ahead`), W4 wint4
    stored_sweep wint4 "${SWEEP_S:-220}" blocks
    w4 wint4 100 q
    echo "== w4"; tail -6 "$out/w4_q.log"
    ;;
  pipelined)  # the stored formats' kernel tests, a refine sweep of fp8, wint8 and wint4 with
              # PDL (pipelined FMA tiles among the neighbours), W4 wint8 and wint4
    stored_sweep "${2:-fp8,wint8,wint4}" "${SWEEP_S:-300}"
    w4 "${2:-wint8,wint4}" 110 p
    echo "== w4"; tail -6 "$out/w4_p.log"
    ;;
  sweep)  # the stored formats' kernel tests (int4's blocks with `ahead` at every shape), then a
          # refine sweep with PDL of FORMATS (default all four; every neighbour toggles `ahead`
          # and `pipelined`; commit the table), and no W4: `finish` measures it
    stored_sweep "${2:-none,fp8,wint8,wint4}" "${SWEEP_S:-340}"
    ;;
  finish)  # W4 of FORMATS (default wint8,wint4) off against on, W1, the every-shape test, the
           # composed tests (what time is left of the call)
    w4 "${2:-wint8,wint4}" "${W4_S:-120}" b
    timeout 120 "${BENCH[@]}" \
      --workload w1 --no-reference --record docs/benchmarks.md > "$out/w1.log" 2>&1
    cp docs/benchmarks.md "$out/"
    every_shape 70
    composed 90
    echo "== gpu tests"; grep -E "FAILED|passed|failed|^E  " "$out/gpu_tests.log" | tail -8
    echo "== w1"; tail -8 "$out/w1.log"
    echo "== w4"; tail -13 "$out/w4_b.log"
    ;;
  verify)  # the table a sweep wrote, proved: its kernels' tests, every shape, composed (a fresh
           # machine compiles every kernel first, so each part has minutes, not seconds)
    timeout 190 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
      tests/compute/layers/gemv/test_int4_blocks.py tests/compute/layers/gemv/test_product.py \
      tests/compute/layers/gemv/test_gpu_gemv.py -k "(blocks or bits or fma or int8) and not every_shape" \
      > "$out/gemv_tests.log" 2>&1
    every_shape 150
    composed 170
    echo "== kernel tests"; grep -E "passed|failed|^FAILED|^E  " "$out/gemv_tests.log" | tail -6
    echo "== gpu tests"; grep -E "FAILED|passed|failed|^E  " "$out/gpu_tests.log" | tail -8
    ;;
  group128)  # wint4 in groups of 128, the issue's format: tested, swept, W4 beside groups of 32
    timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider -o addopts="" \
      tests/compute/layers/gemv/test_int4_blocks.py tests/compute/layers/gemv/test_choice.py \
      tests/compute/layers/gemv/test_gpu_gemv.py -k "${TESTS_K:-128 or method or group or raw}" \
      > "$out/gemv_tests.log" 2>&1
    if [ "${SWEEP_S:-200}" -gt 0 ]; then  # SWEEP_S=0: none (the groups take 32's tiles)
      sweep_g128 "${SWEEP_S:-200}" ${SHAPES:+--shapes "$SHAPES"}
    fi
    w4 wint4 150 g --candidate model.int4_group=32  # W4 measures groups of 128
    echo "== kernel tests"; grep -E "passed|failed|^FAILED|^E  " "$out/gemv_tests.log" | tail -6
    echo "== sweep"; grep -cE "WRONG" "$out/gemv_tune.log"; grep "^| llama\|^| qwen" "$out/gemv_tune.log" | tail -16
    echo "== w4"; tail -6 "$out/w4_g.log"
    ;;
  w1)  # W1's large decode steps (docs/benchmarks.md, "Where W1's time goes"): attention alone at
       # their batches and spread contexts, then one step of 200 sequences profiled
    timeout 150 python3 tools/bench_decode_kernel.py --heads 16 --seqs 202 80 --context 811 \
      --max-model-len 2048 --spread --warps 4 8 --splits 1 2 4 > "$out/w1_kernel.log" 2>&1
    timeout 60 python3 tools/bench_decode_kernel.py --heads 16 --seqs 202 --context 811 \
      --max-model-len 2048 >> "$out/w1_kernel.log" 2>&1  # equal contexts, the same mean
    timeout 240 python3 tools/profile_step.py --model qwen3-0.6b --batch 200 --prompt-tokens 800 \
      > "$out/w1_profile.log" 2>&1
    echo "== decode kernel"; grep -E "^\||copy" "$out/w1_kernel.log"; echo "== profile"; tail -30 "$out/w1_profile.log"
    ;;
  attn)  # decode attention's builds against the default (bench_decode_kernel.py --variants)
    variants="4:-:64:seq 4:5:64:seq 4:-:128:seq 4:-:64:heads 8:-:64:seq"
    timeout 200 python3 tools/bench_decode_kernel.py --heads 16 --seqs 202 80 --context 811 \
      --max-model-len 2048 --spread --pages 16 64 --variants $variants > "$out/attn_w1.log" 2>&1
    timeout 150 python3 tools/bench_decode_kernel.py --heads 32 --seqs 8 64 --context 1088 \
      --max-model-len 4096 --pages 16 --variants $variants > "$out/attn_8b.log" 2>&1
    echo "== W1's steps"; grep -E "^\||copy" "$out/attn_w1.log"; tail -3 "$out/attn_w1.log" | grep -v "^|"
    echo "== 8B"; grep -E "^\||copy" "$out/attn_8b.log"; tail -3 "$out/attn_8b.log" | grep -v "^|"
    ;;
  goals)  # the goals table and the two pending settings, in one call (W4_S: W4's time limit)
    W4_REPEATS="${W4_REPEATS:-3}" w4 none,fp8,wint8,wint4 "${W4_S:-330}" goals \
      --candidate device.pdl_max_batch=8
    w1_tile
    echo "== w4 (defaults against pdl_max_batch=8)"; tail -12 "$out/w4_goals.log"
    echo "== w1 (defaults, tiles of 128 from 1,024 programs, against decode_attention_tile_128_from_programs=0)"; tail -7 "$out/w1_tile.log"
    ;;
  attn_w1)  # the builds' GPU tests, then W1: the defaults against each setting given
    timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/compute/test_gpu.py \
      tests/compute/test_triton_decode.py -k "decode_attention_builds or other_builds or paged_decode" \
      > "$out/gpu_tests.log" 2>&1
    echo "== gpu tests"; grep -E "FAILED|passed|failed|^E  " "$out/gpu_tests.log" | tail -6
    for setting in "${@:2}"; do
      name=$(printf %s "${setting##*.}" | tr -c 'a-z0-9_' '_')
      timeout 200 "${BENCH[@]}" \
        --workload w1 --no-reference --record docs/benchmarks.md --candidate "$setting" \
        > "$out/w1_$name.log" 2>&1
      cp docs/benchmarks.md "$out/"
      echo "== w1 $setting"; tail -7 "$out/w1_$name.log"
    done
    ;;
  w1h200)  # for an H200: W1 against no tiles of 128 keys (recorded), decode attention's builds
           # at W1's large steps (graph-timed), and the prefill steps' launches (w1host)
    w1_tile
    timeout 170 python3 tools/bench_decode_kernel.py --heads 16 --seqs 202 80 --context 811 \
      --max-model-len 2048 --spread --pages 16 --variants 4:-:64:seq 4:5:64:seq 4:-:128:seq \
      > "$out/attn_w1.log" 2>&1
    HOST_S=150 bash "$0" w1host > "$out/w1_host_summary.txt"
    w1_profile
    echo "== w1 (defaults, tiles of 128 from 1,024 programs, against decode_attention_tile_128_from_programs=0)"; tail -7 "$out/w1_tile.log"
    echo "== W1's steps"; grep -E "^\||copy" "$out/attn_w1.log"
    cat "$out/w1_host_summary.txt"
    echo "== a 200-sequence decode step"; grep -E "ms/step|GPU time per step" "$out/w1_profile.log"
    ;;
  h200)  # the first call that only an H200 spends (on another GPU: mode $2 if given, else
         # nothing, so asking for an H200 and getting an H100 costs seconds), each part's limit
         # keeping the whole under H200_S (its device time): W1 on the defaults (the goal's
         # figure, nano-vllm's draws, three runs, recorded; decode attention's tests before
         # it), then W4 of every goal row (bf16, fp8, wint4 g128: the goals' figures) against
         # PDL in graphs of up to 8 sequences (batch 8's ratio; three runs a side, recorded).
         # Then, on the same machine, `h200b`.
    h200_only "$@" || exit 0
    timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
      tests/compute/test_triton_decode.py > "$out/decode_tests.log" 2>&1
    w1_against w1  # no settings: the defaults alone
    w4_s=$(( ${H200_S:-580} - SECONDS - 15 )); [ "$w4_s" -gt 330 ] && w4_s=330
    [ "$w4_s" -ge 200 ] && W4_REPEATS=3 w4 none,fp8,wint4 "$w4_s" goals --candidate device.pdl_max_batch=8
    echo "== decode attention's tests"; grep -E "passed|failed|^FAILED|^E  " "$out/decode_tests.log" | tail -4
    echo "== w1 (defaults)"; tail -6 "$out/w1.log"
    [ -f "$out/w4_goals.log" ] && { echo "== w4 (defaults against pdl_max_batch=8)"; tail -10 "$out/w4_goals.log"; }
    ;;
  h200b)  # the second H200 call, after `h200` on the same machine, each part's limit keeping
          # the whole under H200_S: a refine sweep of wint4 in groups of 128 (8B and 0.6B; the
          # H200's table has no int4g128 keys; SWEEP_S: its budget; commit the table), W4 wint4
          # on it (three runs a side, groups of 32 beside, recorded), W4 wint8 (its goal row)
          # against PDL, then `wint4early` if the time is left
    h200_only "$@" || exit 0
    sweep_s=$(( ${H200_S:-575} - SECONDS - 200 )); [ "$sweep_s" -gt "${SWEEP_S:-150}" ] && sweep_s=${SWEEP_S:-150}
    [ "$sweep_s" -ge 60 ] && sweep_g128 "$sweep_s" --shapes llama-3.1-8b,qwen3-0.6b
    limit=$(( ${H200_S:-575} - SECONDS - 15 )); [ "$limit" -gt 160 ] && limit=160
    [ "$limit" -ge 90 ] && W4_REPEATS=3 w4 wint4 "$limit" g --candidate model.int4_group=32
    if [ -f "$out/gemv_tune.log" ]; then
      echo "== sweep (wrong candidates: $(grep -cE WRONG "$out/gemv_tune.log"))"
      grep "^| llama\|^| qwen" "$out/gemv_tune.log" | tail -16
    fi
    [ -f "$out/w4_g.log" ] && { echo "== w4 wint4 (groups of 128 against 32)"; tail -6 "$out/w4_g.log"; }
    # wint8's goal row: no H200 has measured it since PDL went off for it and the norm went into
    # the products' finish (3.006 ms, 2026-12-06 01:30). Against it, wint8 with PDL (an H100
    # measured 0.92x with it), after its GPU test (its tokens with PDL equal those without).
    limit=$(( ${H200_S:-575} - SECONDS - 15 )); [ "$limit" -gt 160 ] && limit=160
    if [ "$limit" -ge 120 ]; then
      timeout 40 python3 -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
        tests/compute/test_gpu_quantization.py -k wint8_keeps_its_tokens_with_pdl > "$out/w8_test.log" 2>&1
      echo "== wint8 with PDL, its GPU test"; grep -E "passed|failed|^E  " "$out/w8_test.log" | tail -3
      W4_REPEATS=3 w4 wint8 $(( limit - 40 )) w8 --candidate 'device.pdl_off_formats=[]'
    fi
    [ -f "$out/w4_w8.log" ] && { echo "== w4 wint8 (the defaults against PDL)"; tail -6 "$out/w4_w8.log"; }
    [ $(( ${H200_S:-575} - SECONDS )) -ge 200 ] && bash "$0" wint4early
    ;;
  wint4early)  # why early epilogue loads cost the 8B in wint4 9% at batch 1 (H100, 2026-12-07):
              # its step profiled with PDL on (as W4 runs it), without and with the setting
    for early in false true; do
      timeout 110 python3 tools/profile_step.py --model llama-3.1-8b --quantization wint4 \
        --set model.int4_group=128 --small-batch-kernels \
        --set device.early_epilogue_loads=$early > "$out/profile_wint4_early_$early.log" 2>&1
    done
    for f in "$out"/profile_wint4_early_*.log; do echo "== $f"; head -24 "$f"; done
    ;;
  epilogue)  # device.early_epilogue_loads: its tests on the GPU (equal to the default finish; and
          # the split merge's), then W4 of the goals' rows (bf16, fp8, wint4 g128), the defaults
          # against it, three runs a side (W4_S: the limit), recorded
    timeout 90 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
      tests/compute/layers/gemv/test_early_loads.py tests/compute/test_triton_decode.py \
      > "$out/early_tests.log" 2>&1
    W4_REPEATS=3 w4 none,fp8,wint4 "${W4_S:-300}" early --candidate device.early_epilogue_loads=true
    echo "== early loads' and the merge's tests"; grep -E "passed|failed|^FAILED|^E  " "$out/early_tests.log" | tail -4
    echo "== w4 (defaults against early_epilogue_loads)"; tail -10 "$out/w4_early.log"
    ;;
  w1tile)  # W1, the defaults against tiles of 128 keys from W1_TILE_FROM programs (default 320),
           # recorded: on any GPU (the fallback of `h200 w1tile`)
    W1_TILE_FROM="${W1_TILE_FROM:-320}" w1_tile
    echo "== w1 (defaults against decode_attention_tile_128_from_programs=${W1_TILE_FROM:-320})"; tail -7 "$out/w1_tile.log"
    ;;
  draws)  # W1 on nano-vllm's own draws against the draws it ran until 2026-12-07 (three runs a
          # side, alternating, one engine; recorded)
    timeout 250 python3 tools/w1_draws.py --record docs/benchmarks.md > "$out/w1_draws.log" 2>&1
    cp docs/benchmarks.md "$out/"
    echo "== w1, the two draws"; tail -6 "$out/w1_draws.log"
    ;;
  rest)  # every GPU test outside tests/compute/layers (CUDA graphs, the warm-up, the engines;
        # REST_S: its time limit): the fallback of `h200 rest` after a change to the step runner
    outside_kernels "${REST_S:-400}" tests/compute/test_gpu.py tests/compute/step
    ;;
  profile8)  # where batch 8's step goes (its ratio to batch 1 misses the goal on fp8 and the
            # 0.6B): kernels per step and their GPU time, 8 sequences of 1,024-token prompts
            # (W5's), PDL off (with it on, a kernel's time includes its wait)
    for run in "qwen3-0.6b none" "llama-3.1-8b fp8" "llama-3.1-8b none"; do
      set -- $run
      timeout 90 python3 tools/profile_step.py --model "$1" --quantization "$2" --batch 8 \
        --prompt-tokens 1024 --small-batch-kernels --set device.pdl=false \
        > "$out/profile8_$1_$2.log" 2>&1
    done
    for f in "$out"/profile8_*.log; do echo "== $f"; head -16 "$f"; done
    ;;
  h100)  # what an H100 is for when an H200 was asked for: `wint4early`, `profile8`, then the
         # GPU tests outside the kernels that 2026-12-07's call left unrun, until H100_S (570)
    bash "$0" wint4early
    bash "$0" profile8
    [ $(( ${H100_S:-570} - SECONDS )) -ge 30 ] && outside_kernels $(( ${H100_S:-570} - SECONDS )) \
      tests/compute/step/test_gpu_warm_up.py
    ;;
  unrun)  # the GPU tests no GPU has run since their last change: the warm-up's (after ce36219's
           # named default) and the kernels' every-shape test (EVERY_S: its time limit)
    timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
      tests/compute/step/test_gpu_warm_up.py > "$out/warm_up.log" 2>&1
    every_shape "${EVERY_S:-380}"
    echo "== warm-up"; grep -E "passed|failed|^FAILED|^E  " "$out/warm_up.log" | tail -4
    ;;
  rope)  # the rotary-and-cache kernel: one token a program against 4 and 16, and the bits
    for model in qwen3-0.6b llama-3.1-8b; do
      timeout 120 python3 tools/bench_rope_cache.py --model "$model" > "$out/rope_$model.log" 2>&1
      echo "== $model"; grep -E "^\||heads" "$out/rope_$model.log"
    done
    ;;
  products)  # W1's products at its large steps' rows against their roofs
    timeout "${PRODUCTS_S:-300}" python3 tools/bench_products.py > "$out/products.log" 2>&1
    echo "== products"; grep -E "^\||rows, a step|copy" "$out/products.log"
    ;;
  w1host)  # the executor thread's host work for W1-sized prefill steps, by function
    timeout "${HOST_S:-200}" python3 tools/profile_step.py --prefill-host --batch 256 \
      --prompt-tokens 560 > "$out/w1_host.log" 2>&1
    echo "== prefill launches"; head -3 "$out/w1_host.log"; grep -E "cuda[A-Z]|Self CPU time total|Self CUDA time total" "$out/w1_host.log" | head -20
    ;;
  norms)  # device.norms_in_product_finish: tests, then W4 against the defaults
    timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
      tests/compute/layers/gemv/test_norm_finish.py tests/compute/test_fused.py \
      tests/compute/layers/gemv/test_gpu_gemv.py -k "norm or greedy_tokens_with" \
      > "$out/gpu_tests.log" 2>&1
    echo "== gpu tests"; grep -E "FAILED|passed|failed|^E  " "$out/gpu_tests.log" | tail -6
    W4_REPEATS=3 w4 none,fp8,wint4 "${W4_S:-360}" norms \
      --candidate device.norms_in_product_finish=true
    echo "== w4 (defaults against norms_in_product_finish)"; tail -12 "$out/w4_norms.log"
    ;;
  one)  # one call for a session with little device time: the GPU tests of the decode kernel, 8
        # warps, the products in a graph, and graphs equal eager; W4 of bf16, fp8 and wint4 on
        # the 8B and the 0.6B with PDL in graphs of up to 8 sequences (three runs a side; wint8
        # launches without PDL: device.pdl_off_formats)
    timeout 130 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
      tests/compute/test_triton_decode.py tests/compute/test_gpu.py tests/compute/layers/gemv/test_gpu_gemv.py \
      -k "decode or graphs_equal or graph_of_the_products" > "$out/gpu_tests.log" 2>&1
    W4_REPEATS=3 w4 none,fp8,wint4 300 b --candidate device.pdl_max_batch=8
    echo "== gpu tests"; grep -E "FAILED|passed|failed|^E  " "$out/gpu_tests.log" | tail -6
    echo "== w4 b"; tail -12 "$out/w4_b.log"
    ;;
  head)  # the LM head through the format (a quantized copy), as gpt-fast's quantized modes do;
         # the few-rows argmax on the GPU and in an 8B step's profile
    timeout 200 python3 -m pytest -v -p no:cacheprovider -o addopts="" -m gpu \
      tests/compute/test_gpu_quantization.py > "$out/gpu_tests.log" 2>&1
    timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
      tests/compute/sampling/test_argmax_kernel.py > "$out/argmax_tests.log" 2>&1
    w4 fp8,wint8,wint4 240 h --candidate model.quantize_lm_head=true
    timeout 80 python3 tools/profile_step.py --model llama-3.1-8b --quantization fp8 \
      --small-batch-kernels --set device.pdl=false > "$out/profile.log" 2>&1
    echo "== gpu tests"; grep -E "FAILED|passed|failed|^E  " "$out/gpu_tests.log" | tail -8
    echo "== argmax"; tail -1 "$out/argmax_tests.log"
    echo "== profile (fp8, PDL off)"; grep -E "ms/step|per step|_chunk_maxima|_best_chunk|at::native::reduce" "$out/profile.log" | head -6
    echo "== w4"; tail -8 "$out/w4_h.log"
    ;;
  profile)  # where a batch-1 step's time goes outside the products: kernels per step and their
            # GPU time with the defaults, PDL off (with it on, a kernel's time includes its wait)
    for run in "llama-3.1-8b none" "llama-3.1-8b fp8" "qwen3-0.6b none"; do
      set -- $run
      timeout 100 python3 tools/profile_step.py --model "$1" --quantization "$2" \
        --small-batch-kernels --set device.pdl=false > "$out/profile_$1_$2.log" 2>&1
    done
    for f in "$out"/profile_*.log; do echo "== $f"; head -16 "$f"; done
    ;;
  *) echo "usage: $0 tune|refine|bench|all|final|check|candidates|together|profile|pdl|retune|last|int8|quant|blocks|pipelined|sweep|finish|verify|group128|head|one|w1|attn|attn_w1|goals|norms|h200|h200b|w1tile|draws|unrun|w1h200|rope|products|w1host|rest|profile8|h100|epilogue|wint4early" >&2; exit 2 ;;
esac
exit 0
