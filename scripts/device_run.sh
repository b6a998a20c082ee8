#!/usr/bin/env bash
# GPU work on the lent machine (device tool, nvidia-h200), in five modes:
#
#   bash scripts/device_run.sh tests [PYTEST ARGS...]   # the GPU tests (default: every GPU test file)
#   bash scripts/device_run.sh record [NAME STEP...]    # a run of record: $OUT/NAME.json (docs/perf/runs shape)
#   bash scripts/device_run.sh official WxH...          # the official code alone, per geometry
#   bash scripts/device_run.sh profile WxH [VARIANT]    # the default's GPU kernel time by category
#                                                       # (CAMERAS=N [PROFILE_WINDOW=16]: one stream beside N batched,
#                                                       # also as rows in $OUT/profile_cameras_N_WINDOW.json)
#   bash scripts/device_run.sh attention [ARGS...]      # attention per layer (bench/attention_bench.py)
#
# record's steps, in the order given (W x H is the model input, e.g. 518x392 for a 640x480 camera; none named:
# every step below at the three camera geometries, which takes two or three calls: name a part per call and
# merge their files with bench/record.py):
#   tests            the GPU tests (GPU_TESTS_K: a pytest -k expression to run a part), FlashInfer's skipped
#   tests-fi         the GPU tests of the FlashInfer backend, with the carried wheels importable (its JIT builds)
#   first:WxH        time to first pose with the kernel cache emptied (cold), then kept (warm), the model read
#                    from a checkpoint file as a robot reads it (FIRST_CKPT, default a float32 .safetensors of the
#                    preset's random weights in /tmp, written once by an untimed step of its own)
#   grid:WxH         the default and the portable path, depth + camera and camera only (GRID_VARIANTS,
#                    GRID_HEADS: other bench variants and heads, e.g. auto,auto+wholerows for an A/B)
#   load:WxH         the default with half of the host's cores busy
#   long:WxH         1,000 frames of the default (memory growth)
#   official:WxH     the official code (FlashInfer, its torch.compile recipe)
#   streams:WxH      several cameras on one model: 2 at window 64 (beside 2 processes), 2 and 4 at window 16
#                    (STREAMS_CASES: the cameras x window cases to run, default "2x64 2x16 4x16"; a short call: 2x64)
# Each step has its own time limit within the call's (RECORD_S, default 570 s); a step that would not fit
# is skipped and says so; RESUME=1 in a later call on the same warm machine runs only the steps not finished.
# Rows go to /tmp/parts_NAME and are merged by bench/record.py into $OUT/NAME.json;
# the log is $OUT/NAME.log. LINGBOT_COMMIT (the code's short hash) and OFFICIAL_COMMIT name what ran; give
# LINGBOT_COMMIT as a literal taken where the tree was committed (the lent machine's copy of .git can name an
# older commit than the files it runs).
#
# Carry: .whl_fi (flashinfer-python, apache-tvm-ffi wheels: scripts/device_env.sh says how to fetch them),
# .official (the official code, git-ignored, made on a machine with network access:
#   git clone https://github.com/Robbyant/lingbot-map /tmp/lingbot-map && git -C /tmp/lingbot-map checkout 4cd9860 &&
#   mkdir -p .official && cp -r /tmp/lingbot-map/lingbot_map /tmp/lingbot-map/gct_profile.py .official/ ),
# and .inductor_cache to reuse the kernel cache of an earlier call (kept in .inductor_cache/kc on a warm machine).
set -uo pipefail
MODE=${1:-tests}; shift || true
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. scripts/device_env.sh
export LINGBOT_MAP_CACHE_DIR=${LINGBOT_MAP_CACHE_DIR:-$PWD/.inductor_cache/kc}
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR   # the package's kernel cache decides (core/kernel_cache.py)
geometry() { W=${1%x*}; H=${1#*x}; }   # "518x392" -> W=518 H=392 (width x height, as the tables name it)
# DRY=1: every step on the CPU with the tiny preset and a short window (a check of this script, seconds)
if [ -n "${DRY:-}" ]; then export PRESET=tiny DEVICE=cpu DTYPE=float32 SCALE=2 WINDOW=3
else export PRESET=full DEVICE=cuda DTYPE=bfloat16 SCALE=8 WINDOW=64; fi
bench() {  # bench GEOMETRY ARGS...: lingbot_map_bench at the run-of-record settings
  geometry "$1"
  python3 -m lingbot_map_ros.tools.bench --model-preset "$PRESET" --device "$DEVICE" --dtype "$DTYPE" \
    --scale-frames "$SCALE" --sliding-window "$WINDOW" --height "$H" --width "$W" --camera-iterations 4 "${@:2}"
}
export FIRST_CKPT=${FIRST_CKPT:-/tmp/first_pose_ckpt/${PRESET}_float32.safetensors}
first_pose_checkpoint() {  # the checkpoint file the first-pose runs read (written once, untimed)
  if [ -f "$FIRST_CKPT" ]; then echo "checkpoint $FIRST_CKPT: there already"; return; fi
  python3 bench/first_pose.py --write-checkpoint "$FIRST_CKPT" --preset "$PRESET" --device "$DEVICE" --dtype float32
}
first_pose() {  # first_pose GEOMETRY ARGS...: timed, the model loaded from $FIRST_CKPT
  geometry "$1"
  python3 bench/first_pose.py --device "$DEVICE" --preset "$PRESET" --scale-frames "$SCALE" --sliding-window "$WINDOW" \
    --height "$H" --width "$W" --checkpoint "$FIRST_CKPT" "${@:2}"
}
with_flashinfer() {  # with_flashinfer COMMAND...: the command with FlashInfer importable (the official code needs it)
  if [ ! -d /tmp/site_fi ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_fi .whl_fi/*.whl >/dev/null
  fi
  PYTHONPATH="/tmp/site_fi:$PYTHONPATH" "$@"
}
official() {  # official GEOMETRY [LABEL] [JSON]
  geometry "$1"
  with_flashinfer python3 bench/official_bench.py --official .official --frames 208 --height "$H" --width "$W" \
    ${2:+--label "$2"} ${3:+--json "$3"}
}
gpu_tests() {
  python3 -m pytest test/test_gpu.py test/test_gpu_faults.py test/test_gpu_sessions.py test/test_gpu_streams.py \
    test/test_config_runtime.py test/test_readback.py test/test_batched_graph.py -q -s -p no:cacheprovider -rfE "$@"
}
streams() {  # streams GEOMETRY CAMERAS WINDOW ARGS...: lingbot_map_bench --cameras at the run-of-record settings
  geometry "$1"
  local window=$3; [ -z "${DRY:-}" ] || window=$WINDOW   # the dry run's short window
  python3 -m lingbot_map_ros.tools.bench --cameras "$2" --model-preset "$PRESET" --device "$DEVICE" --dtype "$DTYPE" \
    --scale-frames "$SCALE" --sliding-window "$window" --height "$H" --width "$W" \
    --camera-iterations 4 ${DRY:+--frames 12} "${@:4}"   # the dry run: a few frames past its short window
}

case "$MODE" in
tests)
  gpu_tests "$@" 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|FAILED|ERROR|float64|rel diff|max \|diff"
  ;;
official)
  for g in "$@"; do official "$g" 2>&1 | grep -E "^\||official_bench|rror" | tee -a "$OUT/official.txt"; done
  ;;
profile)
  if [ -n "${CAMERAS:-}" ]; then
    # rows of tables streams and step_profile: merge with bench/record.py into a run file
    streams "$1" "$CAMERAS" "${PROFILE_WINDOW:-16}" --frames 100 --profile \
      --json "$OUT/profile_cameras_${CAMERAS}_${PROFILE_WINDOW:-16}.json" 2>&1 \
      | grep -E "^\||rror|GPU kernel|Matrix products|Kernels by|batched step" | tee "$OUT/profile_cameras_${CAMERAS}_${PROFILE_WINDOW:-16}.txt"
  else
    bench "$1" --frames 100 --heads depth+camera,camera --variants "${2:-auto}" --profile 2>&1 \
      | grep -E "^\||rror|GPU kernel" | tee "$OUT/profile.txt"
  fi
  ;;
attention)
  with_flashinfer python3 bench/attention_bench.py "$@" 2>&1 | grep -E "^\||keys" | tee "$OUT/attention.txt"
  ;;
record)
  NAME=${1:-record}; shift || true
  # no steps named: the whole run of record, more than one call holds (10 minutes): name a part per call
  [ $# -gt 0 ] || set -- first:518x378 grid:518x378 grid:518x392 grid:518x294 official:518x378 official:518x392 \
    official:518x294 load:518x378 long:518x378 tests
  # RESUME=1 (a later call on the same warm machine): keep the parts, skip the steps that finished before
  PARTS=/tmp/parts_$NAME; [ -n "${RESUME:-}" ] || rm -rf "$PARTS"; mkdir -p "$PARTS"
  export -f geometry bench first_pose_checkpoint first_pose with_flashinfer official gpu_tests streams
  LOG="$OUT/$NAME.log"
  END=$(( SECONDS + ${RECORD_S:-570} ))
  step() {  # step SECONDS NAME COMMAND...: run under min(SECONDS, what is left), or skip
    local want=$1 name=$2 left=$(( END - SECONDS - 10 ))
    shift 2
    if [ "$left" -lt 25 ]; then echo "SKIPPED $name: ${left}s left in the call" | tee -a "$LOG"; CUT=1; return; fi
    local limit=$(( want < left ? want : left )) t0=$SECONDS
    echo "== $name (limit ${limit}s)" | tee -a "$LOG"
    timeout "$limit" bash -c '"$@"' _ "$@" 2>&1 | grep -vE "^\s*$|Warning|warn\(" | tee -a "$LOG" | grep -E "^\||time to first|^wrote|^checkpoint|passed|failed|FAILED|rror|official_bench|frames [0-9]+:"
    echo "== $name: rc ${PIPESTATUS[0]}, $(( SECONDS - t0 ))s" | tee -a "$LOG"
  }
  for s in "$@"; do
    kind=${s%%:*}; g=${s#*:}; CUT=""; done_mark="$PARTS/.done_${s/:/_}"
    [ "$kind" != streams ] || done_mark="${done_mark}_${STREAMS_CASES:-all}"; done_mark=${done_mark// /_}   # per set of cases
    if [ -n "${RESUME:-}" ] && [ -e "$done_mark" ]; then echo "== $s: finished in an earlier call" | tee -a "$LOG"; continue; fi
    case "$kind" in
    tests) step "${TESTS_S:-200}" tests gpu_tests ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} ;;
    tests-fi) step "${TESTS_FI_S:-200}" "tests with FlashInfer" with_flashinfer gpu_tests -k "flashinfer or FlashInfer" ;;
    first)
      step 120 "first pose checkpoint" first_pose_checkpoint
      geometry "$g"; rm -rf "$LINGBOT_MAP_CACHE_DIR"
      step "${FIRST_S:-240}" "first pose cold $g" first_pose "$g" --caches cold --json "$PARTS/first_cold_$g.json"
      step 120 "first pose warm $g" first_pose "$g" --caches warm --json "$PARTS/first_warm_$g.json" ;;
    grid) step "${GRID_S:-180}" "grid $g" bench "$g" --frames 208 --heads "${GRID_HEADS:-depth+camera,camera}" \
            --variants "${GRID_VARIANTS:-auto,portable}" --json "$PARTS/grid_$g.json" ;;
    load)
      BUSY=$(( $(nproc) / 2 )); PIDS=()
      for _ in $(seq "$BUSY"); do timeout 200 python3 -c 'while True: pass' & PIDS+=($!); done
      echo "host load: $BUSY busy processes of $(nproc) cores" | tee -a "$LOG"
      step 100 "host load $g" bench "$g" --frames 208 --heads depth+camera,camera --variants auto --load "host load" --json "$PARTS/load_$g.json"
      kill "${PIDS[@]}" 2>/dev/null; wait "${PIDS[@]}" 2>/dev/null ;;
    long) step 100 "1000 frames $g" bench "$g" --frames 1000 --heads depth+camera --variants auto --report-every 200 --json "$PARTS/long_$g.json" ;;
    official) step "${OFFICIAL_S:-200}" "official $g" official "$g" "" "$PARTS/official_$g.json" ;;
    streams)
      for case in ${STREAMS_CASES:-2x64 2x16 4x16}; do
        n=${case%x*}; w=${case#*x}; extra=""; limit=150
        # two cameras at window 64 also run as two processes: the users' way without batching
        if [ "$case" = 2x64 ]; then extra=--processes; limit=${STREAMS_S:-240}; fi
        step "$limit" "$n cameras, window $w $g" streams "$g" "$n" "$w" $extra --json "$PARTS/streams_${n}_${w}_$g.json"
      done ;;
    *) echo "unknown step $s" | tee -a "$LOG"; CUT=1 ;;
    esac
    [ -n "$CUT" ] || touch "$done_mark"
  done
  python3 bench/record.py --run "$NAME" --commit "${LINGBOT_COMMIT:-unknown}" --out "$OUT/$NAME.json" "$PARTS"/*.json 2>&1 | tee -a "$LOG"
  ;;
*)
  echo "unknown mode $MODE: tests | record | official | profile | attention" >&2; exit 2 ;;
esac
