#!/usr/bin/env bash
# The benchmark through Ray on the GPUs of one machine against one GPU (README: "Many recordings on many
# GPUs"): 8 synthetic sequences of 300 frames in two dataset layouts (TUM RGB-D, TartanAir), the `full`
# preset, random weights, bf16, the default kernels. Each run starts a local Ray head with the
# machine's GPUs (`--ray`) and stops it at its end (Ray's own shutdown); the first uses one worker per
# GPU, the second one worker. Prints one JSON line: both wall times, the speed-up, whether every
# sequence's metrics are identical, and each worker's start-up (process, model) and first-sequence time
# against its later ones (the warm-up that keeping the model across sequences hides).
#
#   bash scripts/ray_two_gpus.sh OUT_DIR [WORKERS (default 2)] [FRAMES (default 300)]
# LINGBOT_ARGS replaces the model options (a CPU smoke run: "--model-preset tiny --device cpu --ray-gpus 0");
# LINGBOT_HW the synthetic images' size (default 480x640).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$(realpath -m "${1:?usage: $0 OUT_DIR [WORKERS] [FRAMES]}")
read -r -a MODEL <<<"${LINGBOT_ARGS:---model-preset full --dtype bfloat16 --device cuda}"
cd "$ROOT"
WORKERS=${2:-2}
FRAMES=${3:-300}
HW=${LINGBOT_HW:-480x640}  # the images' height x width: TUM's 640x480 (the model then runs at its official size)
PY=${PYTHON:-$ROOT/.venv/bin/python}
BIN=$(dirname "$PY")
mkdir -p "$OUT"
"$PY" - "$OUT/data" "$FRAMES" "$HW" <<'PY'
import sys
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path.cwd() / "test"))
from benchmark_layouts import write_tartanair, write_tum  # the test suite's synthetic layouts

root, frames = Path(sys.argv[1]), int(sys.argv[2])
hw = tuple(int(v) for v in sys.argv[3].split("x"))


def write(job: tuple[str, int]) -> None:
    layout, k = job
    if layout == "tum" and not (root / "tum" / f"rgbd_dataset_freiburg1_s{k}").is_dir():
        write_tum(root / "tum", f"rgbd_dataset_freiburg1_s{k}", n=frames, seed=k, hw=hw)
    if layout == "tartanair" and not (root / "tartanair" / f"office/Easy/P00{k}").is_dir():
        write_tartanair(root / "tartanair", f"office/Easy/P00{k}", n=frames, hw=hw)


with Pool(8) as pool:  # the images' PNG encoding, a sequence a process
    pool.map(write, [(layout, k) for layout in ("tum", "tartanair") for k in range(4)])
PY
run() {  # $1 = workers, $2 = output folder
  local start end
  start=$(date +%s.%N)
  "$BIN/lingbot_map_benchmark" --dataset tum "$OUT/data/tum" --dataset tartanair "$OUT/data/tartanair" \
    --out "$2" --force "${MODEL[@]}" --ray --ray-workers "$1" >"$2.table" \
    2>"$2.log" || { tail -20 "$2.log"; exit 1; }
  end=$(date +%s.%N)
  echo "$start $end" >"$2.wall"
}
run "$WORKERS" "$OUT/workers$WORKERS"
run 1 "$OUT/workers1"
"$PY" - "$OUT" "$WORKERS" <<'PY'
import json
import sys
from pathlib import Path

out, n = Path(sys.argv[1]), int(sys.argv[2])
keys = ("frames", "evaluated", "ate", "rpe_trans", "rpe_rot", "auc", "sim3_scale")


def metrics(folder: Path) -> dict:
    return {str(p.relative_to(folder)): {k: json.loads(p.read_text())[k] for k in keys}
            for p in sorted(folder.glob("*/**/metrics.json"))}


def wall(folder: Path) -> float:
    start, end = (float(v) for v in Path(f"{folder}.wall").read_text().split())
    return end - start


def workers(folder: Path) -> list:
    doc = json.loads((folder / "ray_workers.json").read_text())
    rows = []
    for w in doc["workers"]:
        secs = [i["seconds"] for i in w["items"]]
        later = sorted(secs[1:])
        rows.append({"gpus": w["gpus"], "process_s": w["ready_seconds"], "model_s": w["model_seconds"],
                     "first_item_s": secs[0] if secs else None,
                     "later_item_median_s": later[len(later) // 2] if later else None, "items": len(secs)})
    return rows


many, one = out / f"workers{n}", out / "workers1"
a, b = metrics(many), metrics(one)
print(json.dumps({"workers": n, "sequences": len(a), "identical": a == b and len(a) == 8,
                  "wall_s": {str(n): wall(many), "1": wall(one)}, "speedup": wall(one) / wall(many),
                  "start_up": {str(n): workers(many), "1": workers(one)}}))
PY
