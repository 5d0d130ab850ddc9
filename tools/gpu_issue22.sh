#!/usr/bin/env bash
# On the GPU machine, issues 22 and 23 in three calls (each under the 10-minute limit); logs and
# the tuned table under $OUT, a short table last.
#   tools/gpu_issue22.sh tune     the kernels' GPU tests, then the tile sweep (writes the table)
#   tools/gpu_issue22.sh bench    W4 bf16 and fp8 with the kernels off and on (recorded), a profile
#   tools/gpu_issue22.sh bench23  W4 wint8 and wint4 likewise (issue 23)
# TABLE=path: a table from an earlier `tune`, put in place before a bench.
set -uo pipefail
export PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
w4() {  # W4 for the formats given, recorded in docs/benchmarks.md (copied to $OUT)
  [ -f "${TABLE:-}" ] && cp "$TABLE" aioworker/compute/layers/gemv/tuned_tiles.json
  timeout "$2" python3 -c 'import sys;sys.argv=["aioworker","bench",*sys.argv[1:]];from aioworker.cli.main import main;sys.exit(main())' \
    --workload w4 --w4-formats "$1" --no-reference --record docs/benchmarks.md > "$out/w4.log" 2>&1
  cp docs/benchmarks.md "$out/"
}
case "${1:-}" in
  tune)
    timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/compute/layers/gemv \
      > "$out/gemv_tests.log" 2>&1
    timeout 360 python3 tools/gemv_tune.py --json "$out/gemv_tune.json" --budget-s 330 \
      --write-table > "$out/gemv_tune.log" 2>&1
    cp aioworker/compute/layers/gemv/tuned_tiles.json "$out/" 2>/dev/null
    echo "== tests"; grep -E "passed|failed|^FAILED|^E  " "$out/gemv_tests.log" | tail -12
    echo "== sweep"; tail -24 "$out/gemv_tune.log"
    ;;
  bench)
    w4 none,fp8 480
    timeout 90 python3 tools/profile_step.py --model llama-3.1-8b --small-batch-kernels \
      > "$out/profile.log" 2>&1
    echo "== profile"; head -22 "$out/profile.log"
    echo "== w4"; tail -12 "$out/w4.log"
    ;;
  bench23)
    w4 wint8,wint4 560
    echo "== w4"; tail -12 "$out/w4.log"
    ;;
  *) echo "usage: $0 tune|bench|bench23" >&2; exit 2 ;;
esac
exit 0
