#!/usr/bin/env python3
"""The README's reference tables, generated from the code's own tables.

    .venv/bin/python scripts/readme_tables.py           # rewrite the generated regions of README.md
    .venv/bin/python scripts/readme_tables.py --check   # exit 1 (with a diff) when README.md is stale

A region is the text between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->`` in README.md:

* ``parameters``: ``lingbot_map_ros/core/settings.py`` ``SETTINGS`` (what ``ros2 param describe``
  and the tools' ``--help`` say, from the same rows);
* ``launch-arguments``: the arguments the launch file declares (what ``ros2 launch ... --show-args``
  prints, read through the same ``ros2launch`` function);
* ``fits``, ``fits-cameras``: ``lingbot_map_ros/core/sizing.py`` (the window configure picks per budget,
  width and heads; for 2 and 4 cameras on one node);
* ``topics``, ``services``, ``tf``: ``lingbot_map_ros/ros/interfaces.py`` (checked against a running
  node by ``test/test_interfaces.py``);
* ``performance``, ``cameras-cost``: the runs of record in ``docs/perf/runs/`` (rendered by
  ``scripts/perf_tables.py``, which also writes ``docs/performance.md``).

``test/test_readme_tables.py`` fails when a region differs from what this script writes, and compares
the launch table with the real ``--show-args`` output.
"""
from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path
from typing import Callable, NamedTuple, Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

README = REPO / "README.md"
LAUNCH_FILE = REPO / "launch" / "lingbot_map.launch.py"
REGION = re.compile(r"(<!-- generated: (?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- end: (?P=name) -->)", re.S)

# What a change at runtime needs (core/settings.py APPLIES), as a table cell.
APPLIES_CELL = {
    "model": "new model + new session",
    "session": "new session",
    "budget": "budget re-checked (new session if the fitted window changes)",
    "next_frame": "next frame",
    "subscription": "re-subscribes",
    "timer": "at once",
    "startup": "read-only (set at start)",
    "configure": "next configure",
}
DIRECTION = {"subscription": "in", "publisher": "out"}


def cell(text: str) -> str:
    """``text`` safe in a Markdown table cell: ``|`` escaped, and ``<`` outside code spans (else it
    may open an HTML tag that GitHub hides)."""
    parts = str(text).replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def table(header: list[str], rows: list[list[str]], align: Optional[list[str]] = None) -> str:
    align = align or ["---"] * len(header)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def code(text: str) -> str:
    return f"`{text}`"


# ------------------------------------------------------------------------------------ parameters


def value_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    return repr(value)


def limits_text(setting) -> str:
    if setting.choices is not None:
        return ", ".join(value_text(c) for c in setting.choices)
    if setting.range is not None:
        return f"{value_text(setting.range[0])}..{value_text(setting.range[1])}"
    return ""


def render_parameters() -> str:
    from lingbot_map_ros.core.settings import SETTINGS

    rows = [[code(s.name), code(value_text(s.default)), limits_text(s), APPLIES_CELL[s.applies], s.description]
            for s in SETTINGS]
    return table(["parameter", "default", "range / values", "a change applies", "meaning"], rows)


# ------------------------------------------------------------------------------------ launch arguments


class LaunchArgument(NamedTuple):
    name: str
    default: str  # as ``ros2 launch --show-args`` prints it (each substitution's describe(), joined by " + ")
    default_cell: str  # the same for a reader: text as is, $(find-pkg-share PKG) and / for path joins
    description: str


def _readable(substitution) -> str:
    """A launch substitution the way launch XML writes it."""
    from launch.substitutions import PathJoinSubstitution, TextSubstitution
    from launch_ros.substitutions import FindPackageShare

    if isinstance(substitution, TextSubstitution):
        return substitution.text
    if isinstance(substitution, FindPackageShare):
        return "$(find-pkg-share " + "".join(_readable(s) for s in substitution.package) + ")"
    if isinstance(substitution, PathJoinSubstitution):
        return "/".join(_readable(s) for s in substitution.substitutions)
    return substitution.describe()


def launch_arguments(launch_file: Path = LAUNCH_FILE) -> list[LaunchArgument]:
    """The declared arguments of the launch file, read as ``ros2 launch --show-args`` reads them."""
    from launch.launch_description_sources import get_launch_description_from_any_launch_file

    description = get_launch_description_from_any_launch_file(str(launch_file))
    out = []
    for arg in description.get_launch_arguments():
        subs = arg.default_value or []
        out.append(LaunchArgument(arg.name, " + ".join(s.describe() for s in subs),
                                  "".join(_readable(s) for s in subs), arg.description))
    return out


def render_launch_arguments() -> str:
    rows = [[code(a.name), code(a.default_cell or '""'), a.description]
            for a in launch_arguments()]
    return table(["argument", "default", "meaning"], rows)


# ------------------------------------------------------------------------------------ interfaces


def _type_cell(ros_type: str) -> str:
    return code(ros_type.replace("/msg/", "/").replace("/srv/", "/"))


def render_topics() -> str:
    from lingbot_map_ros.ros.interfaces import ENDPOINTS, QOS_TEXT

    rows = []
    for e in ENDPOINTS:
        if e.kind == "service":
            continue
        mark = " ¹" if e.configured_only else ""
        rows.append([DIRECTION[e.kind], code(e.name) + mark, _type_cell(e.type), QOS_TEXT[e.qos], e.when, e.what])
    text = table(["", "topic", "type", "QoS", "when", "what"], rows)
    return text + "\n¹ exists from `configure` to `cleanup` (the node's configured states); the others always.\n"


def render_services() -> str:
    from lingbot_map_ros.ros.interfaces import ENDPOINTS, LIFECYCLE

    rows = [[code(e.name) + (" ¹" if e.configured_only else ""), _type_cell(e.type), e.when, e.what]
            for e in ENDPOINTS if e.kind == "service"]
    text = table(["service", "type", "when", "what"], rows)
    lifecycle = ", ".join(code(e.name) for e in LIFECYCLE if e.kind == "service")
    return (text + "\n¹ exists from `configure` to `cleanup`.\n\nThe managed node's lifecycle services "
            f"({lifecycle}) are what `ros2 lifecycle` and a lifecycle manager call; the parameter services "
            "are those of every node.\n")


def render_tf() -> str:
    from lingbot_map_ros.core.settings import SETTINGS_BY_NAME
    from lingbot_map_ros.ros.interfaces import TF_EDGES

    def frame(name: str) -> str:
        default = SETTINGS_BY_NAME[name].default
        return code(name) + (f" (default `{default}`)" if default else "")

    rows = [[frame(e.parent), code(e.child) + (f", when empty {e.child_fallback}" if e.child_fallback != "-" else ""),
             e.when, e.stamp] for e in TF_EDGES]
    return table(["parent", "child", "when", "stamp"], rows)


def render_fits() -> str:
    """"What fits in N GB": the window configure picks (``fit_window``) for each budget x width x heads, from
    the footprint model (the full model, bf16, the node's default kernels on CUDA, default settings)."""
    import torch

    from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig, model_config
    from lingbot_map_ros.core.footprint import assumed_runtime
    from lingbot_map_ros.core.sizing import fits_table

    return fits_table(model_config("full"), assumed_runtime("cuda", torch.bfloat16), RuntimeConfig(), StreamConfig())


def render_fits_cameras() -> str:
    """The same for several cameras on one node: 8 / 16 / 24 GB x 2 and 4 cameras (one window for all)."""
    import torch

    from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig, model_config
    from lingbot_map_ros.core.footprint import assumed_runtime
    from lingbot_map_ros.core.sizing import cameras_fits_table

    return cameras_fits_table(model_config("full"), assumed_runtime("cuda", torch.bfloat16), RuntimeConfig(),
                              StreamConfig())


def render_cameras_cost() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import perf_tables

    return perf_tables.render_readme_streams(perf_tables.load_runs())


def render_performance() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import perf_tables

    return perf_tables.render_readme(perf_tables.load_runs())


RENDERERS: dict[str, Callable[[], str]] = {
    "parameters": render_parameters,
    "launch-arguments": render_launch_arguments,
    "topics": render_topics,
    "services": render_services,
    "tf": render_tf,
    "fits": render_fits,
    "fits-cameras": render_fits_cameras,
    "performance": render_performance,
    "cameras-cost": render_cameras_cost,
}


# ------------------------------------------------------------------------------------ regions


def regions(text: str) -> dict[str, list[str]]:
    """Every generated region's body, by name (a list: a name may wrongly appear twice)."""
    found: dict[str, list[str]] = {}
    for m in REGION.finditer(text):
        found.setdefault(m.group("name"), []).append(m.group("body"))
    return found


def update(text: str, renderers: Optional[dict[str, Callable[[], str]]] = None) -> str:
    """``text`` with every region's body replaced by its renderer's output."""
    renderers = renderers or RENDERERS
    rendered = {name: fn() for name, fn in renderers.items()}
    return REGION.sub(lambda m: m.group(1) + rendered.get(m.group("name"), m.group("body")) + m.group(4), text)


def problems(text: str, renderers: Optional[dict[str, Callable[[], str]]] = None) -> list[str]:
    """Why ``text`` (README.md) disagrees with the code's tables: a missing, doubled, unknown or stale
    region (with a unified diff). Empty: it agrees."""
    renderers = renderers or RENDERERS
    found = regions(text)
    out = [f"region {name!r} is missing (add <!-- generated: {name} --> ... <!-- end: {name} -->)"
           for name in renderers if name not in found]
    out += [f"region {name!r} appears {len(bodies)} times" for name, bodies in found.items() if len(bodies) > 1]
    out += [f"region {name!r} has no generator" for name in found if name not in RENDERERS]
    for name, fn in renderers.items():
        if name in found and len(found[name]) == 1 and found[name][0] != fn():
            diff = "".join(difflib.unified_diff(found[name][0].splitlines(True), fn().splitlines(True),
                                                "README.md", "generated", n=0))
            out.append(f"region {name!r} is stale:\n{diff}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Generate README.md's reference tables from the code's tables.")
    p.add_argument("--check", action="store_true", help="only check; exit 1 and print a diff when stale")
    p.add_argument("--readme", type=Path, default=README)
    args = p.parse_args(argv)
    text = args.readme.read_text(encoding="utf-8")
    if args.check:
        found = problems(text)
        for line in found:
            print(line)
        if found:
            print(f"run: .venv/bin/python scripts/{Path(__file__).name}")
        return 1 if found else 0
    missing = [name for name in RENDERERS if name not in regions(text)]
    if missing:
        print(f"README.md lacks the regions {missing}", file=sys.stderr)
        return 1
    new = update(text)
    if new != text:
        from lingbot_map_ros.core.files import atomic_write_text

        atomic_write_text(args.readme, new)
        print(f"updated {args.readme}")
    else:
        print(f"{args.readme} is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
