"""Merge the parts of a run of record into one results file (docs/perf/runs/<date>-<name>.json).

Each part is a JSON file with ``rows`` (``lingbot_map_bench --json``, ``bench/official_bench.py --json``,
``bench/first_pose.py --json``); the set-up comes from the first part that has one (the bench's), the
commit from ``--commit``. Parts of several device calls of one run can be merged the same way.

    python3 bench/record.py --run h200-geometries --commit abc1234 --out docs/perf/runs/2026-12-04-h200.json \
        part1.json part2.json ...
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

TABLES = ("latency", "long_run", "attention", "memory", "first_pose", "streams", "step_profile")


def merge(parts: list[dict], run: str, commit: str, date: str, notes: str = "") -> dict:
    setup = next((p["setup"] for p in parts if p.get("setup")), None)
    if setup is None:  # scripts/perf_tables.py refuses a run without one: say so here, where it can be fixed
        raise ValueError("no part carries a set-up: add a part written by `lingbot_map_bench --json` or "
                         "`bench/first_pose.py --json`")
    if notes:
        setup = {**setup, "notes": notes}
    rows = [row for p in parts for row in p.get("rows", [])]
    unknown = sorted({row.get("table") for row in rows} - set(TABLES), key=str)
    if unknown:
        raise ValueError(f"rows of unknown tables {unknown}: one of {TABLES}")
    return {"run": run, "date": date, "commit": commit, "setup": setup, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("parts", nargs="+", help="JSON files with rows")
    p.add_argument("--run", required=True, help="the run's short name")
    p.add_argument("--commit", required=True, help="short hash of the code measured")
    p.add_argument("--date", default=datetime.date.today().isoformat())
    p.add_argument("--notes", default="", help="the set-up's notes (replaces the parts')")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    parts = []
    for name in args.parts:
        try:
            parts.append(json.loads(Path(name).read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            print(f"skipped {name}: {exc}", file=sys.stderr)
    try:
        doc = merge(parts, args.run, args.commit, args.date, args.notes)
    except ValueError as exc:
        print(f"record: {exc}", file=sys.stderr)
        return 2
    from lingbot_map_ros.core.files import atomic_write_text

    atomic_write_text(args.out, json.dumps(doc, indent=1) + "\n")
    print(f"{args.out}: {len(doc['rows'])} rows from {len(parts)} parts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
