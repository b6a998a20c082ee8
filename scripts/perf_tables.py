#!/usr/bin/env python3
"""docs/performance.md and the README's performance table, generated from the runs of record.

    .venv/bin/python scripts/perf_tables.py           # rewrite docs/performance.md (and the README's table)
    .venv/bin/python scripts/perf_tables.py --check   # exit 1 (with a diff) when either is stale

A measurement is data: one JSON file per run of record in ``docs/perf/runs/<YYYY-MM-DD>-<name>.json``
(what ``scripts/device_run.sh record`` and ``lingbot_map_bench --json`` write), never prose. This script
is the only writer of the tables: it validates every run file, then renders one section per question
(latency, memory, attention per layer, long run and host load, time to first pose, several streams).
A table no run has rows for gets no section; a run whose code is superseded is deleted (git keeps it).

A run file::

    {"run": "record", "date": "2026-12-04", "commit": "d8dde96",
     "setup": {"gpu": ..., "host_cpus": 16, "torch": ..., "cuda": ..., "driver": ...,
               "official_commit": "4cd9860" | null, "notes": ...},
     "rows": [{"table": "latency", "geometry": "518x378", ...}, ...]}

``FIELDS`` names each table's required fields; a row may carry more (shown where a renderer knows them).
The README's region ``<!-- generated: performance -->`` is rendered here too and registered in
``scripts/readme_tables.py``, which owns the README's regions. ``test/test_perf_tables.py`` fails when
either output differs from what this script makes of the run files.
"""
from __future__ import annotations

import argparse
import datetime
import difflib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

REPO = Path(__file__).resolve().parents[1]
RUNS_DIR = REPO / "docs" / "perf" / "runs"
PERFORMANCE_MD = REPO / "docs" / "performance.md"
RUN_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}-[a-z0-9][a-z0-9-]*\.json$")

# The configuration every headline number is quoted at (the official profile's own geometry for a
# 4:3-ish camera, the node's defaults); the README's table shows these rows only.
REFERENCE = {"geometry": "518x378", "window": 64, "scale_frames": 8, "camera_iterations": 4, "streams": 1}

NUMBER = (int, float)
SETUP_FIELDS: dict[str, tuple] = {"gpu": (str,), "host_cpus": (int,), "torch": (str,), "cuda": (str,),
                                  "driver": (str,), "official_commit": (str, type(None)), "notes": (str,)}
# Each table's required fields and their types (None allowed where a run could not measure it).
FIELDS: dict[str, dict[str, tuple]] = {
    "latency": {"geometry": (str,), "heads": (str,), "path": (str,), "window": (int,), "scale_frames": (int,),
                "camera_iterations": (int,), "streams": (int,), "load": (str,), "median_ms": NUMBER,
                "p90_ms": NUMBER, "peak_gb": NUMBER + (type(None),), "frames": (int,)},
    "long_run": {"geometry": (str,), "heads": (str,), "frames": (int,), "median_ms": NUMBER, "p90_ms": NUMBER,
                 "growth_mb": NUMBER, "peak_gb": NUMBER},
    "attention": {"kernel": (str,), "window_state": (str,), "geometry": (str,), "us_per_layer": NUMBER,
                  "tflops": NUMBER + (type(None),)},
    "memory": {"geometry": (str,), "window": (int,), "heads": (str,), "streams": (int,),
               "predicted_gb": NUMBER + (type(None),), "measured_gb": NUMBER},
    "first_pose": {"caches": (str,), "seconds": NUMBER, "model_load_s": NUMBER + (type(None),),
                   "compile_s": NUMBER + (type(None),), "capture_s": NUMBER + (type(None),)},
    "streams": {"geometry": (str,), "window": (int,), "heads": (str,), "streams": (int,), "ms_per_step": NUMBER,
                "one_stream_ms": NUMBER, "fps_total": NUMBER, "sequential_fps": NUMBER + (type(None),),
                "processes_fps": NUMBER + (type(None),)},
    "step_profile": {"geometry": (str,), "window": (int,), "heads": (str,), "streams": (int,), "category": (str,),
                     "one_stream_ms": NUMBER, "batched_ms": NUMBER},
}
CHOICES = {"heads": ("depth+camera", "camera"), "load": ("idle", "host load"), "window_state": ("steady", "filling"),
           "caches": ("cold", "warm")}
PATH_NAMES = {"default": "ours, the default path", "portable": "ours, the portable path",
              "official": "official (FlashInfer + `torch.compile`)"}
HEADS_NAMES = {"depth+camera": "depth + camera", "camera": "camera only"}
RANDOM_WEIGHTS = "random (drawn in process)"  # a first_pose row without "weights" (bench/first_pose.py)


class RunFileError(ValueError):
    """A run file that cannot be a run of record, with the file and the reason."""


@dataclass(frozen=True)
class Run:
    file: str
    run: str
    date: str
    commit: str
    setup: dict
    rows: tuple


# ------------------------------------------------------------------------------------ loading


def _check_fields(where: str, data: dict, fields: dict[str, tuple]) -> None:
    for name, types in fields.items():
        if name not in data:
            raise RunFileError(f"{where}: '{name}' is missing")
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, types):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise RunFileError(f"{where}: '{name}' is {value!r}, not {wanted}")


def parse_run(name: str, data: Any) -> Run:
    """A run from the JSON of the file ``name``; RunFileError says what is wrong with it."""
    if not RUN_NAME.match(name):
        raise RunFileError(f"{name}: a run file is named <YYYY-MM-DD>-<short-name>.json (lower case)")
    if not isinstance(data, dict):
        raise RunFileError(f"{name}: not a JSON object")
    _check_fields(name, data, {"run": (str,), "date": (str,), "commit": (str,), "setup": (dict,), "rows": (list,)})
    try:
        datetime.date.fromisoformat(data["date"])
    except ValueError:
        raise RunFileError(f"{name}: date {data['date']!r} is not YYYY-MM-DD") from None
    if not name.startswith(data["date"] + "-"):
        raise RunFileError(f"{name}: the file name does not start with the run's date {data['date']}")
    if not re.fullmatch(r"[0-9a-f]{7,40}", data["commit"]):
        raise RunFileError(f"{name}: commit {data['commit']!r} is not a git hash")
    _check_fields(f"{name} setup", data["setup"], SETUP_FIELDS)
    if not data["rows"]:
        raise RunFileError(f"{name}: no rows")
    for i, row in enumerate(data["rows"]):
        where = f"{name} row {i}"
        if not isinstance(row, dict) or row.get("table") not in FIELDS:
            raise RunFileError(f"{where}: 'table' must be one of {', '.join(FIELDS)}")
        _check_fields(where, row, FIELDS[row["table"]])
        for field, allowed in CHOICES.items():
            if field in FIELDS[row["table"]] and row[field] not in allowed:
                raise RunFileError(f"{where}: '{field}' is {row[field]!r}, not one of {', '.join(allowed)}")
        if "geometry" in row and not re.fullmatch(r"\d+x\d+", row["geometry"]):
            raise RunFileError(f"{where}: geometry {row['geometry']!r} is not WIDTHxHEIGHT")
    return Run(name, data["run"], data["date"], data["commit"], data["setup"], tuple(data["rows"]))


def load_runs(folder: Path = RUNS_DIR) -> list[Run]:
    """Every run file of ``folder``, oldest first (then by name)."""
    runs = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise RunFileError(f"{path.name}: not JSON ({e})") from None
        runs.append(parse_run(path.name, data))
    return sorted(runs, key=lambda r: (r.date, r.file))


def rows_of(runs: Iterable[Run], table: str) -> list[tuple[Run, dict]]:
    return [(run, row) for run in runs for row in run.rows if row["table"] == table]


# ------------------------------------------------------------------------------------ cells


def cell(text: Any) -> str:
    """``text`` safe in a Markdown table cell (``|`` escaped, ``<`` outside code spans)."""
    parts = str(text).replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def table(header: list[str], rows: list[list[Any]], align: str) -> str:
    """A Markdown table; ``align`` has one letter a column: l(eft) or r(ight)."""
    marks = {"l": "---", "r": "---:"}
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(marks[a] for a in align) + " |"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def num(value: Optional[float], digits: int = 2) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def geometry_cell(geometry: str) -> str:
    return geometry.replace("x", "×")


def geometry_key(geometry: str) -> tuple[bool, int, int]:
    """The reference input first, then larger inputs first."""
    w, h = (int(v) for v in geometry.split("x"))
    return (geometry != REFERENCE["geometry"], -w * h, -w)


def run_cell(run: Run) -> str:
    return f"{run.date} `{run.commit}`"


def gpu_cell(run: Run) -> str:
    """The GPU's short name (``NVIDIA H100 80GB HBM3`` -> ``H100``): where a table holds runs of several
    GPUs, a ratio is read within one GPU's rows."""
    words = [w for w in run.setup["gpu"].split() if w.upper() != "NVIDIA"]
    return words[0] if words else run.setup["gpu"]


def path_cell(row: dict, attention: bool = True) -> str:
    """Whose code, and the one-frame attention path it resolved to where the run recorded it."""
    name = PATH_NAMES.get(row["path"], f"ours, `{row['path']}`")
    shown = attention and row.get("attention") and row["path"] != "official"
    return name + (f" (`{row['attention']}`)" if shown else "")


def fps_cell(row: dict) -> str:
    """The steady frames over their time where the run recorded it, else 1000 / the median."""
    return num(row["fps"] if row.get("fps") is not None else 1000.0 / row["median_ms"], 1)


def heads_order(heads: str) -> int:
    return CHOICES["heads"].index(heads)


def path_order(path: str) -> tuple[int, str]:
    known = ["default", "portable", "official"]
    return (known.index(path), "") if path in known else (len(known), path)


def settings_cell(row: dict) -> str:
    """The stream settings of a latency row where they differ from the reference."""
    diff = [f"{k} {row[k]}" for k in ("window", "scale_frames", "camera_iterations", "streams")
            if row[k] != REFERENCE[k]]
    return ", ".join(diff)


# ------------------------------------------------------------------------------------ sections


def _official_ratio(run: Run, row: dict) -> str:
    """Our median against the official code's in the same run, same geometry, heads and load."""
    if row["path"] == "official":
        return ""
    for other in run.rows:
        if (other["table"] == "latency" and other["path"] == "official"
                and all(other[k] == row[k] for k in ("geometry", "heads", "load", "window", "streams"))):
            return f"{other['median_ms'] / row['median_ms']:.2f}×"
    return ""


def section_latency(runs: list[Run]) -> str:
    found = [(run, row) for run, row in rows_of(runs, "latency") if row["load"] == "idle"]
    if not found:
        return ""
    found.sort(key=lambda rr: (geometry_key(rr[1]["geometry"]), rr[1]["window"], heads_order(rr[1]["heads"]),
                               path_order(rr[1]["path"]), rr[0].date, rr[0].file))
    rows = [[geometry_cell(row["geometry"]), HEADS_NAMES[row["heads"]], path_cell(row), settings_cell(row),
             num(row["median_ms"]), num(row["p90_ms"]), fps_cell(row), num(row["peak_gb"]),
             _official_ratio(run, row), gpu_cell(run), run_cell(run)] for run, row in found]
    header = ["input", "heads", "code", "settings", "median ms", "p90 ms", "FPS", "peak GB", "× official", "GPU",
              "run"]
    align = "llllrrrrrll"
    if not any(row[3] for row in rows):  # every row at the reference settings: no column for them
        rows, header, align = [r[:3] + r[4:] for r in rows], header[:3] + header[4:], align[:3] + align[4:]
    return ("## Latency\n\nOne camera, a frame pushed as soon as the previous one is done, idle host. "
            "Steady state: the frames after the window is full. \"settings\": where a row's stream differs "
            "from the set-up of record. \"× official\": the official code's median over ours, measured in the "
            "same run. Compare times within one GPU's rows.\n\n" + table(header, rows, align))


def section_memory(runs: list[Run]) -> str:
    found = rows_of(runs, "memory")
    streams = [(run, {**row, "measured_gb": row["peak_gb"]}) for run, row in rows_of(runs, "streams")
               if row.get("predicted_gb") is not None and row.get("peak_gb") is not None]
    if not found and not streams:
        return ""
    by_geometry = [(run, row) for run, row in found if "budget_gb" not in row] + streams
    by_card = [(run, row) for run, row in found if "budget_gb" in row]
    out = "## Memory\n\n"
    if by_geometry:
        by_geometry.sort(key=lambda rr: (geometry_key(rr[1]["geometry"]), rr[1]["window"], rr[1]["streams"],
                                         heads_order(rr[1]["heads"]), rr[0].date))
        rows = []
        for run, row in by_geometry:
            error = ("" if row["predicted_gb"] is None else
                     f"{100.0 * (row['predicted_gb'] - row['measured_gb']) / row['measured_gb']:+.1f} %")
            rows.append([geometry_cell(row["geometry"]), row["window"], HEADS_NAMES[row["heads"]], row["streams"],
                         num(row["predicted_gb"]), num(row["measured_gb"]), error, run_cell(run)])
        out += ("Peak GPU memory by input and window (`torch.cuda.max_memory_allocated` over the run) beside "
                "what `lingbot_map_bench --footprint` predicts without a GPU (docs/memory.md says how):\n\n"
                + table(["input", "window", "heads", "streams", "predicted GB", "measured GB", "prediction error",
                         "run"], rows, "lrlrrrrl"))
    if by_card:
        by_card.sort(key=lambda rr: (-rr[1]["budget_gb"], rr[0].date))
        rows = [[num(row["budget_gb"], 0), geometry_cell(row["geometry"]), row["window"], HEADS_NAMES[row["heads"]],
                 num(row["measured_gb"]), row.get("frames", ""), run_cell(run)] for run, row in by_card]
        out += ("\n" if by_geometry else "") + (
            "Small cards: `gpu_memory_budget` at the card's size with `fit_window: true`, the card's size "
            "enforced on the H200; the node picked the input width (the largest that fits) and the window:\n\n"
            + table(["card GB", "input", "window picked", "heads", "peak GB", "frames", "run"], rows, "rlrlrrl"))
    return out


def section_attention(runs: list[Run]) -> str:
    found = rows_of(runs, "attention")
    if not found:
        return ""
    found.sort(key=lambda rr: (geometry_key(rr[1]["geometry"]), CHOICES["window_state"].index(rr[1]["window_state"]),
                               rr[1]["us_per_layer"], rr[0].date))
    rows = [[geometry_cell(row["geometry"]), row["window_state"], num(row.get("keys"), 0) if "keys" in row else "",
             row["kernel"], num(row["us_per_layer"], 0), num(row["tflops"], 0), run_cell(run)] for run, row in found]
    return ("## Attention per layer\n\nOne global-attention layer of one frame step (16 heads, head size 64; "
            "the frame's queries against every visible key), replayed in a CUDA graph over rotating K/V sets "
            "so that the L2 cache never holds the keys. \"steady\": the window is full; \"filling\": 40 of its "
            "72 pages stored. TFLOP/s count the visible keys only (4 × queries × keys × heads × 64).\n\n"
            + table(["input", "window", "visible keys", "kernel", "µs a layer", "TFLOP/s", "run"], rows, "llrlrrl"))


def section_long_run_and_load(runs: list[Run]) -> str:
    long_runs = rows_of(runs, "long_run")
    loaded = [(run, row) for run, row in rows_of(runs, "latency") if row["load"] == "host load"]
    if not long_runs and not loaded:
        return ""
    out = "## Long run and host load\n\n"
    if long_runs:
        long_runs.sort(key=lambda rr: (geometry_key(rr[1]["geometry"]), heads_order(rr[1]["heads"]), rr[0].date))
        rows = [[geometry_cell(row["geometry"]), HEADS_NAMES[row["heads"]], f"{row['frames']:,}",
                 row.get("window_switches", ""), num(row["median_ms"]), num(row["p90_ms"]), num(row["peak_gb"]),
                 f"{row['growth_mb']:+.0f}", run_cell(run)] for run, row in long_runs]
        out += ("The default long-run policy (`long_run_policy: window`) over more frames than one window holds; "
                "memory growth: allocated memory at the last frame minus at frame 100.\n\n"
                + table(["input", "heads", "frames", "window switches", "median ms", "p90 ms", "peak GB",
                         "growth MB", "run"], rows, "llrrrrrrl"))
    if loaded:
        rows = []
        loaded.sort(key=lambda rr: (geometry_key(rr[1]["geometry"]), heads_order(rr[1]["heads"]),
                                    path_order(rr[1]["path"]), rr[0].date, rr[0].file))
        for run, row in loaded:
            idle = next((o for o in run.rows if o["table"] == "latency" and o["load"] == "idle"
                         and all(o[k] == row[k] for k in ("geometry", "heads", "path", "window", "streams"))), None)
            change = ("" if idle is None else
                      f"{100.0 * (row['median_ms'] - idle['median_ms']) / idle['median_ms']:+.1f} %")
            rows.append([geometry_cell(row["geometry"]), HEADS_NAMES[row["heads"]], path_cell(row),
                         "" if idle is None else f"{num(idle['median_ms'])} ({num(idle['p90_ms'])})",
                         f"{num(row['median_ms'])} ({num(row['p90_ms'])})", change, run_cell(run)])
        out += ("\n" if long_runs else "") + (
            "Host load: busy loops on half of the host's cores (started and stopped by their process ids), "
            "against the idle run of the same run of record; median ms (p90):\n\n"
            + table(["input", "heads", "code", "idle", "half the cores busy", "change", "run"], rows, "lllrrrl"))
    return out


def section_first_pose(runs: list[Run]) -> str:
    found = rows_of(runs, "first_pose")
    if not found:
        return ""
    found.sort(key=lambda rr: (geometry_key(rr[1].get("geometry", REFERENCE["geometry"])),
                               heads_order(rr[1].get("heads", "depth+camera")),
                               CHOICES["caches"].index(rr[1]["caches"]), rr[0].date))
    rows = [[geometry_cell(row.get("geometry", "")), HEADS_NAMES.get(row.get("heads"), ""), row["caches"],
             num(row["seconds"], 1), num(row.get("first_graph_pose_s"), 1), num(row["model_load_s"], 1),
             row.get("weights", RANDOM_WEIGHTS), num(row["compile_s"], 1), num(row["capture_s"], 1), gpu_cell(run),
             run_cell(run)] for run, row in found]
    return ("## Time to first pose\n\nFrom the start of the process to the first poses (the scale frames', "
            "together) and to the first frame after them (one-frame step: its kernels compiled and its CUDA "
            "graphs captured, split into the two where the run measured them); \"cold\": no compiled kernels "
            "on the machine yet (the kernel cache empty), \"warm\": a second start. \"weights\" says what the "
            "model load holds: a checkpoint file read, cast to the compute dtype and moved to the GPU (as on a "
            "robot; the file holds random weights of the official names and shapes), or random weights drawn "
            "in the process.\n\n"
            + table(["input", "heads", "caches", "first pose s", "first one-frame pose s", "model load s",
                     "weights", "compile s", "graph capture s", "GPU", "run"], rows, "lllrrrlrrll"))


def section_streams(runs: list[Run]) -> str:
    found = rows_of(runs, "streams")
    if not found:
        return ""
    found.sort(key=lambda rr: (geometry_key(rr[1]["geometry"]), rr[1]["window"], heads_order(rr[1]["heads"]),
                               rr[1]["streams"], rr[0].date))
    rows = [[geometry_cell(row["geometry"]), row["window"], HEADS_NAMES[row["heads"]], row["streams"],
             num(row["ms_per_step"]), num(row["one_stream_ms"]), num(row["fps_total"], 1),
             num(row["sequential_fps"], 1), num(row["processes_fps"], 1), clock_pair(row), energy_pair(row),
             gpu_cell(run), run_cell(run)]
            for run, row in found]
    return ("## Several streams\n\nSeveral cameras through one model: \"ms a step\" for all streams' frames "
            "together; FPS summed over the streams, beside the same streams one after another in one process "
            "and in a process each. Each row's figures come from one run on the GPU named.\n\n"
            "\"processes FPS\": the one-stream run in N processes on the one GPU, as N nodes would run; their "
            "frames/s together while all of them run (`lingbot_map_bench --cameras N --processes`: every process "
            "fills its window, then their steady phases start together). Runs dated before 2026-12-07 summed each "
            "process's rate over its own steady span, which also counts the frames it ran alone while the other "
            "compiled or after it finished: their figures can be higher than N nodes get.\n\n"
            + "\"SM MHz\": the GPU's median SM clock over the one-stream ticks and over the batched ticks "
            "(`nvidia-smi`, sampled beside the run; empty in runs that did not sample it), and the power "
            "draw of the batched ticks. A card at its power limit lowers its clock when it is kept busier: the "
            "batched step runs twice the attention back to back, so part of its ratio to the one-stream step "
            "is the card's power budget, the same for any code that does the same arithmetic. \"J a frame\": "
            "the board's power over each phase times its time a frame, one stream / batched / a process each "
            "where measured (the energy a battery gives a frame, the card's idle draw included).\n\n"
            + table(["input", "window", "heads", "streams", "ms a step", "one stream ms", "FPS total",
                     "sequential FPS", "processes FPS", "SM MHz, one / batched (W)",
                     "J a frame, one / batched / processes", "GPU", "run"], rows, "lrlrrrrrrrrll"))


def clock_pair(row: dict) -> str:
    """``1950 / 1852 (691 W, power cap)`` from a streams row's clocks; empty where the run did not sample them."""
    if row.get("sm_mhz") is None or row.get("one_stream_sm_mhz") is None:
        return ""
    return (f"{row['one_stream_sm_mhz']} / {row['sm_mhz']} ({row.get('power_w', '?')} W, "
            f"{row.get('clock_limits', '?')})")


def energy_pair(row: dict) -> str:
    """Joules a frame, one stream / batched (/ a process each, where measured): the power drawn over each
    phase's steady ticks times its time a frame (the board's whole draw, idle power included); empty where
    the run did not sample the power."""
    if row.get("power_w") is None or row.get("one_stream_power_w") is None:
        return ""
    one = row["one_stream_power_w"] * row["one_stream_ms"] / 1e3
    batched = row["power_w"] * row["ms_per_step"] / row["streams"] / 1e3
    cell = f"{one:.1f} / {batched:.1f}"
    if row.get("processes_power_w") is not None and row.get("processes_fps"):
        cell += f" / {row['processes_power_w'] / row['processes_fps']:.1f}"
    return cell


def section_step_profile(runs: list[Run]) -> str:
    """Per kernel category, GPU kernel ms of one stream's step beside the batched step of N (eager ticks:
    ``lingbot_map_bench --cameras N --profile``): which parts of the step the batch shares and which it
    only repeats (ratio N: no gain; below N: shared)."""
    found = rows_of(runs, "step_profile")
    if not found:
        return ""
    groups: dict[tuple, list[dict]] = {}
    for run, row in found:
        groups.setdefault((run.file, row["geometry"], row["window"], row["heads"], row["streams"]), []).append(row)
    runs_by_file = {run.file: run for run, _ in found}
    order = sorted(groups, key=lambda k: (geometry_key(k[1]), k[2], heads_order(k[3]), k[4], runs_by_file[k[0]].date))
    rows = []
    for file, geometry, window, heads, n in order:
        run, parts = runs_by_file[file], groups[(file, geometry, window, heads, n)]
        total = {"category": "total", "one_stream_ms": sum(r["one_stream_ms"] for r in parts),
                 "batched_ms": sum(r["batched_ms"] for r in parts)}
        for r in [*parts, total]:
            ratio = r["batched_ms"] / r["one_stream_ms"] if r["one_stream_ms"] else None
            rows.append([geometry_cell(geometry), window, HEADS_NAMES[heads], n, r["category"], num(r["one_stream_ms"]),
                         num(r["batched_ms"]), "" if ratio is None else f"{ratio:.2f}×", gpu_cell(run),
                         run_cell(run)])
    return ("## Where a batched step's time goes\n\nGPU kernel time per step by kernel category, one stream's "
            "step beside the batched step of N streams (`lingbot_map_bench --cameras N --profile`: eager steps "
            "with the compiled block bodies, so the kernels of the captured step without its launch gaps). A "
            "ratio of N is a part the batch only repeats (attention: each stream's queries against its own "
            "keys); below N, a part the streams share (the linears' weights, launches).\n\n"
            + table(["input", "window", "heads", "streams", "kernels", "one stream ms", "batched ms", "ratio",
                     "GPU", "run"], rows, "lrlrlrrrll"))


SECTIONS: tuple[Callable[[list[Run]], str], ...] = (
    section_latency, section_memory, section_attention, section_long_run_and_load, section_first_pose,
    section_streams, section_step_profile)


# ------------------------------------------------------------------------------------ the documents


def render_setup(runs: list[Run]) -> str:
    rows = []
    for run in runs:
        s = run.setup
        official = f"`{s['official_commit']}`" if s["official_commit"] else ""
        rows.append([run_cell(run), s["gpu"], s["host_cpus"], s["torch"], s["cuda"], s["driver"], official, s["notes"]])
    return ("## Set-up of record\n\nEvery run: the `full` preset (the official shapes, 1.16 B parameters) with "
            "random weights (speed does not depend on them), bf16, random frames, `keyframe_interval` 1. "
            "Unless a row says otherwise: 518×378 input (a 640×480 camera gives 518×392), `scale_frames` 8, "
            "`sliding_window` 64, 4 camera iterations, one stream, 8 + 200 frames "
            "of which the steady ones (from frame 72) are timed. \"official\": the official LingBot-Map code "
            "at the commit named, run by its own profiling recipe (FlashInfer fa2 and `torch.compile`, "
            "depth + camera heads) through `bench/official_bench.py`.\n\n"
            + table(["run", "GPU", "host CPUs", "torch", "CUDA", "driver", "official code", "notes"], rows,
                    "llrlllll"))


HOW_TO = """## How to reproduce

On a machine with an NVIDIA GPU, from the repository root (`scripts/device_run.sh` says what to carry:
the FlashInfer wheels and a checkout of github.com/Robbyant/lingbot-map as `.official`, for the
official code only):

```bash
LINGBOT_COMMIT=$(git rev-parse --short HEAD) bash scripts/device_run.sh record NAME grid:518x378 official:518x378
lingbot_map_bench --model-preset full --device cuda --dtype bfloat16 --height 378 --width 518 \\
    --frames 208 --heads depth+camera,camera --json part.json   # one configuration's rows
python3 bench/record.py --run NAME --commit HASH --out docs/perf/runs/YYYY-MM-DD-NAME.json part*.json
```

`record` with no steps named runs every table's rows at the three camera geometries (its header lists
the steps: tests, first pose, the default and portable paths, host load, 1,000 frames, the official
code); `record NAME streams:518x378` adds the several-camera rows (`lingbot_map_bench --cameras N`).
Each call has a time limit: name a part per call. `RESUME=1` in a later call on the same warm machine
runs only the steps the earlier call did not finish.
A run of record is one file `docs/perf/runs/<YYYY-MM-DD>-<name>.json`; then
`.venv/bin/python scripts/perf_tables.py` rewrites this page and the README's table, and a run whose
code is superseded is deleted from that folder (git keeps it). An A/B run of a change (a bench
variant against the default) is an experiment, not a run of record: its numbers go in the change's
commit message beside the prediction, and the run of record after it measures the default.
"""

COLUMNS = """## What the columns mean

* **median ms, p90 ms**: wall time of one frame's push (input upload, the model, the results read
  back to the host), over the steady frames. **FPS**: the steady frames over their total time (where
  a run did not record it: 1000 / median).
* **peak GB**: `torch.cuda.max_memory_allocated` over the run (weights, caches, CUDA-graph pools and
  activations).
* **code**: "the default path" is what the node's default parameters resolve to on the card (on
  Hopper: our attention kernel over the visible keys, CUDA graphs, fused blocks, our Triton kernels
  for the step's small pieces), with the attention path as the log names it; "the portable path" is
  what a GPU without Hopper's TMA and wgmma resolves (`lingbot_map_bench --variants portable`; per
  GPU: docs/hardware.md).
* **run**: the date and commit of the code measured; its set-up is in the first table.

## On a robot

* **Input size.** 518×378 (999 patches a frame) is the official profile's input; a 640×480 camera
  gives 518×392 (1036 patches), a 1280×720 one 518×294 (777). `image_width` trades patches for speed
  and memory (docs/memory.md).
* **The first frames.** The first one-frame step on a new machine compiles the kernels (seconds;
  Triton and Inductor keep them in their on-disk caches for the next start).
* **The ROS layer** adds about 8 ms of CPU per frame at 640×480 (conversion, preprocessing on its own
  thread, publishing), of which about 1.5 ms on the inference thread (docs/history.md, "Node
  overhead").
"""


def render_performance(runs: list[Run]) -> str:
    """The whole of docs/performance.md."""
    body = [section(runs) for section in SECTIONS]
    return ("# Performance\n\n<!-- generated by scripts/perf_tables.py from docs/perf/runs/*.json: edit those, "
            "not this page -->\n\nSpeed and memory of the node's model step on a GPU, from the runs of record "
            "in `docs/perf/runs/`. How memory is predicted and how to fit a card: "
            "[docs/memory.md](memory.md).\n\n"
            + render_setup(runs) + "\n" + HOW_TO + "\n" + "\n".join(b for b in body if b) + "\n" + COLUMNS)


def render_readme(runs: list[Run]) -> str:
    """The README's table: the reference configuration, idle host. Ours beside the official code from the
    newest run that measured both (a ratio across machines would mix the hosts' speeds); without such a run,
    the newest row per code and heads."""
    def reference(row: dict) -> bool:
        return row["load"] == "idle" and all(row[k] == v for k, v in REFERENCE.items())

    latency = [(run, row) for run, row in rows_of(runs, "latency") if reference(row)]
    paired = [run for run, row in latency if row["path"] == "official"]
    if paired:
        latency = [(run, row) for run, row in latency if run is paired[-1]]
    newest: dict[tuple[str, str], tuple[Run, dict]] = {}
    for run, row in latency:
        if row["path"] in ("default", "official"):
            newest[(row["path"], row["heads"])] = (run, row)  # runs are oldest first: the last one wins
    ordered = sorted(newest.values(), key=lambda rr: (path_order(rr[1]["path"]), heads_order(rr[1]["heads"])))
    rows = [[path_cell(row, attention=False), HEADS_NAMES[row["heads"]], num(row["median_ms"]), num(row["p90_ms"]),
             fps_cell(row), num(row["peak_gb"]), gpu_cell(run), run_cell(run)] for run, row in ordered]
    return table(["code", "heads", "median ms", "p90 ms", "FPS", "peak GB", "GPU", "run"], rows, "llrrrrll")


def render_readme_streams(runs: list[Run]) -> str:
    """The README's cost per camera count (Several cameras): the step of all cameras' frames beside one
    camera's, and the total frame rate beside the cameras one after another and in a process each. One row
    per configuration and GPU, from one run (its ratios are one host's): of the runs that measured it, those
    with the most columns (the processes are measured in some runs only), the newest of them. Every run's
    rows stay in docs/performance.md, "Several streams"."""
    found = rows_of(runs, "streams")
    if not found:
        return ("No run of record has measured several cameras on a GPU yet: `lingbot_map_bench --cameras N` "
                "measures the batched step, the same cameras one after another, and (`--processes`) a node "
                "process per camera.\n")
    chosen: dict[tuple, tuple[tuple[bool, int], tuple[Run, dict]]] = {}  # configuration -> (rank, its row)
    for order, (run, row) in enumerate(found):  # runs are oldest first
        key = (row["geometry"], row["window"], row["heads"], row["streams"], gpu_cell(run))
        rank = (row.get("processes_fps") is not None, order)
        held = chosen.get(key)
        if held is None or rank >= held[0]:
            chosen[key] = (rank, (run, row))
    picked = [pair for _, pair in chosen.values()]
    picked.sort(key=lambda rr: (geometry_key(rr[1]["geometry"]), rr[1]["window"], heads_order(rr[1]["heads"]),
                                rr[1]["streams"], gpu_cell(rr[0])))
    rows = []
    for run, row in picked:
        ratio = row["ms_per_step"] / row["one_stream_ms"] if row["one_stream_ms"] else None
        rows.append([row["streams"], geometry_cell(row["geometry"]), row["window"], HEADS_NAMES[row["heads"]],
                     num(row["ms_per_step"]), "" if ratio is None else f"{ratio:.2f}×", num(row["fps_total"], 1),
                     num(row["sequential_fps"], 1), num(row["processes_fps"], 1), gpu_cell(run), run_cell(run)])
    return table(["cameras", "input", "window", "heads", "ms a step", "× one camera", "FPS total",
                  "one after another FPS", "a process each FPS", "GPU", "run"], rows, "rlrlrrrrrll")


def readme_renderers(runs: list[Run]) -> dict[str, Callable[[], str]]:
    """The README regions this script owns, rendered from ``runs``."""
    return {"performance": lambda: render_readme(runs), "cameras-cost": lambda: render_readme_streams(runs)}


def problems(runs: list[Run], performance_text: str, readme_text: str) -> list[str]:
    """Why docs/performance.md or the README's region disagrees with the run files (unified diffs)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import readme_tables

    out = []
    want = render_performance(runs)
    if performance_text != want:
        diff = "".join(difflib.unified_diff(performance_text.splitlines(True), want.splitlines(True),
                                            "docs/performance.md", "generated", n=0))
        out.append(f"docs/performance.md is stale:\n{diff}")
    out += readme_tables.problems(readme_text, readme_renderers(runs))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Generate docs/performance.md and the README's performance table "
                                            "from docs/perf/runs/*.json.")
    p.add_argument("--check", action="store_true", help="only check; exit 1 and print a diff when stale")
    p.add_argument("--runs", type=Path, default=RUNS_DIR)
    args = p.parse_args(argv)
    try:
        runs = load_runs(args.runs)
    except RunFileError as e:
        print(f"bad run file: {e}", file=sys.stderr)
        return 2
    readme_path = REPO / "README.md"
    readme = readme_path.read_text(encoding="utf-8")
    current = PERFORMANCE_MD.read_text(encoding="utf-8") if PERFORMANCE_MD.exists() else ""
    if args.check:
        found = problems(runs, current, readme)
        for line in found:
            print(line)
        if found:
            print(f"run: .venv/bin/python scripts/{Path(__file__).name}")
        return 1 if found else 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import readme_tables

    from lingbot_map_ros.core.files import atomic_write_text

    missing = [name for name in readme_renderers(runs) if name not in readme_tables.regions(readme)]
    if missing:
        print("README.md lacks the regions " + ", ".join(f"<!-- generated: {n} --> ... <!-- end: {n} -->"
                                                          for n in missing), file=sys.stderr)
        return 1
    new_readme = readme_tables.update(readme, readme_renderers(runs))
    for path, old, new in ((PERFORMANCE_MD, current, render_performance(runs)), (readme_path, readme, new_readme)):
        if new != old:
            atomic_write_text(path, new)
            print(f"updated {path}")
        else:
            print(f"{path} is current")
    return 0


if __name__ == "__main__":
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    sys.exit(main())
