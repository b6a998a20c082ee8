#!/usr/bin/env bash
# The GPU run of record (device machine, nvidia-h200): GPU correctness tests, then the benchmark
# table of issue 4. Reproduce with the device tool, carrying .whl (and .fi_cache if present):
#   bash scripts/device_run.sh [quick|full|long]
# Everything it prints also lands in $OUT (gpu_tests.log, bench.txt, long.txt) and the JIT-compiled
# FlashInfer kernels are copied to $OUT/*.so so a later call can skip compiling (put each one at
# .fi_aot/<name>/<name>.so and carry .fi_aot).
set -uo pipefail
MODE=${1:-full}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. scripts/device_env.sh
BENCH=(python3 -m lingbot_map_ros.tools.bench --model-preset full --device cuda --dtype bfloat16
       --height 378 --width 518 --scale-frames 8 --sliding-window 64 --camera-iterations 4)
if [ "$MODE" != long ]; then
  timeout 200 python3 -m pytest test/test_gpu.py -q -s -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
fi
if [ "$MODE" = quick ]; then
  "${BENCH[@]}" --frames 120 --variants flashinfer+graph,sdpa+graph --heads depth+camera 2>&1 | tee "$OUT/bench.txt"
elif [ "$MODE" = second ]; then
  "${BENCH[@]}" --frames 208 --variants flashinfer:fa3+graph,flashinfer:fa3+graph-bf16,sdpa+graph,sdpa+graph-bf16 \
      --heads depth+camera --profile 2>&1 | tee "$OUT/bench2.txt"
  "${BENCH[@]}" --frames 1000 --variants flashinfer:fa3+graph,sdpa+graph --heads depth+camera 2>&1 | tee "$OUT/growth.txt"
elif [ "$MODE" = full ]; then
  "${BENCH[@]}" --frames 208 --variants flashinfer:fa3+graph,flashinfer:fa2+graph,sdpa+graph,flashinfer:fa2+eager,sdpa+eager \
      --heads depth+camera,camera --profile 2>&1 | tee "$OUT/bench.txt"
else
  # the long-run policy over 10,000 frames
  timeout 540 "${BENCH[@]}" --frames 10000 --long-run-policy window --max-stored-frames 320 --variants flashinfer:fa3+graph \
      --heads camera --report-every 1000 2>&1 | tee "$OUT/long.txt"
fi
# ship newly compiled kernels back (each under 16 MB)
find "${FLASHINFER_WORKSPACE_BASE}" -name '*.so' | head -5 | while read -r so; do cp "$so" "$OUT/"; done
ls -la "$OUT"
