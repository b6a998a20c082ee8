"""README.md's reference tables agree with the code's own tables.

* Every generated region (``<!-- generated: NAME -->`` ... ``<!-- end: NAME -->``) is what
  ``scripts/readme_tables.py`` writes now from ``core/settings.py`` (parameters), the launch file's
  declared arguments and ``ros/interfaces.py`` (topics, services, TF).
* The launch table equals what the real ``ros2 launch lingbot_map_ros lingbot_map.launch.py
  --show-args`` prints (names, order, descriptions, defaults).
* The check can fail: a changed setting, a dropped interface row, an extra launch argument, or a cell
  edited by hand in the README is each reported.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load_generator():
    spec = importlib.util.spec_from_file_location("readme_tables", REPO / "scripts" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_generator()
README_TEXT = (REPO / "README.md").read_text(encoding="utf-8")
HAS_LAUNCH = importlib.util.find_spec("launch_ros") is not None


def renderers_without_launch() -> dict:
    """Where the launch library is missing, the launch region cannot be rendered (tested elsewhere)."""
    return {k: v for k, v in gen.RENDERERS.items() if HAS_LAUNCH or k != "launch-arguments"}


def test_readme_regions_are_what_the_generator_writes():
    problems = gen.problems(README_TEXT, renderers_without_launch())
    assert not problems, ("README.md disagrees with the code's tables; run "
                          "`.venv/bin/python scripts/readme_tables.py`:\n" + "\n".join(problems))


def test_every_region_is_present_once():
    found = gen.regions(README_TEXT)
    assert set(found) == set(gen.RENDERERS), (sorted(found), sorted(gen.RENDERERS))
    assert all(len(v) == 1 for v in found.values())


def test_every_setting_and_interface_row_is_in_the_readme():
    """Independent of the renderer: each name appears in its region's first column."""
    from lingbot_map_ros.core.settings import SETTINGS
    from lingbot_map_ros.ros.interfaces import ENDPOINTS

    def first_column(region: str) -> list[str]:
        rows = [line for line in gen.regions(README_TEXT)[region][0].splitlines() if line.startswith("| `")]
        return [re.match(r"\| `([^`]+)`", row).group(1) for row in rows]

    assert first_column("parameters") == [s.name for s in SETTINGS]
    topics = [e.name for e in ENDPOINTS if e.kind != "service"]
    assert [re.match(r"\| (?:in|out) \| `([^`]+)`", line).group(1)
            for line in gen.regions(README_TEXT)["topics"][0].splitlines() if re.match(r"\| (in|out) ", line)] == topics
    assert first_column("services") == [e.name for e in ENDPOINTS if e.kind == "service"]


# ------------------------------------------------------------------------------------ it can fail


def test_a_changed_setting_is_reported(monkeypatch):
    from lingbot_map_ros.core import settings

    changed = tuple(dataclasses.replace(s, default=7) if s.name == "scale_frames" else s for s in settings.SETTINGS)
    monkeypatch.setattr(settings, "SETTINGS", changed)
    problems = gen.problems(README_TEXT, {"parameters": gen.render_parameters})
    assert len(problems) == 1 and "'parameters' is stale" in problems[0] and "`scale_frames` | `7`" in problems[0]


def test_a_dropped_or_added_interface_row_is_reported(monkeypatch):
    from lingbot_map_ros.ros import interfaces

    monkeypatch.setattr(interfaces, "ENDPOINTS", tuple(e for e in interfaces.ENDPOINTS if e.name != "~/odom"))
    problems = gen.problems(README_TEXT, {"topics": gen.render_topics, "services": gen.render_services})
    assert len(problems) == 1 and "'topics' is stale" in problems[0] and "-| out | `~/odom`" in problems[0]
    extra = interfaces.Endpoint("service", "~/save_session", "std_srvs/srv/Trigger", "", "any time", "x")
    monkeypatch.setattr(interfaces, "ENDPOINTS", interfaces.ENDPOINTS + (extra,))
    problems = gen.problems(README_TEXT, {"services": gen.render_services})
    assert len(problems) == 1 and "+| `~/save_session`" in problems[0]


def test_a_hand_edited_cell_and_a_missing_region_are_reported():
    edited = README_TEXT.replace("| `sliding_window` | `64` |", "| `sliding_window` | `32` |", 1)
    assert edited != README_TEXT
    problems = gen.problems(edited, {"parameters": gen.render_parameters})
    assert len(problems) == 1 and "-| `sliding_window` | `32` |" in problems[0]
    cut = re.sub(r"<!-- generated: tf -->.*?<!-- end: tf -->", "", README_TEXT, flags=re.S)
    assert any("'tf' is missing" in p for p in gen.problems(cut, {"tf": gen.render_tf}))


def test_update_rewrites_only_the_regions():
    stale = README_TEXT.replace("| `sliding_window` | `64` |", "| `sliding_window` | `32` |", 1)
    fixed = gen.update(stale, {"parameters": gen.render_parameters})
    assert fixed == README_TEXT


# ------------------------------------------------------------------------------------ --show-args

SHOW_ARG = re.compile(r"^    '(?P<name>[^']+)':\*?\n        (?P<description>.*)\n        \(default: (?P<default>.*)\)$",
                      re.M)


def parse_show_args(text: str) -> list[tuple[str, str, str]]:
    return [(m["name"], m["description"], m["default"]) for m in SHOW_ARG.finditer(text)]


def test_show_args_parser_reads_a_sample():
    sample = ("Arguments (pass arguments as '<name>:=<value>'):\n\n    'a':\n        first\n        (default: 'x')\n\n"
              "    'b':\n        second one\n        (default: PathJoin('FindPackageShare(pkg='p') + 'c''))\n")
    assert parse_show_args(sample) == [("a", "first", "'x'"),
                                       ("b", "second one", "PathJoin('FindPackageShare(pkg='p') + 'c'')")]


def launch_disagreements(cli: list[tuple[str, str, str]], generated: list, readme_names: list[str]) -> list[str]:
    """Why the --show-args output, the generator's rows and the README's launch table disagree."""
    out = []
    rows = [(a.name, a.description, a.default) for a in generated]
    if cli != rows:
        out.append(f"--show-args {cli} != the launch description read by the generator {rows}")
    if readme_names != [name for name, _, _ in cli]:
        out.append(f"README launch arguments {readme_names} != --show-args {[n for n, _, _ in cli]}")
    return out


def test_launch_disagreements_are_reported():
    arg = gen.LaunchArgument("a", "'x'", "x", "first")
    assert launch_disagreements([("a", "first", "'x'")], [arg], ["a"]) == []
    assert len(launch_disagreements([("a", "first", "'y'")], [arg], ["a"])) == 1  # another default
    assert len(launch_disagreements([("a", "first", "'x'"), ("b", "", "''")], [arg], ["a"])) == 2  # a new argument


@pytest.mark.slow
@pytest.mark.ros
def test_launch_table_equals_ros2_launch_show_args(tmp_path, ros_domain_id):
    from rostools import RosShell, require_ros_tools

    require_ros_tools()
    out = RosShell(ros_domain_id, tmp_path).run("ros2 launch lingbot_map_ros lingbot_map.launch.py --show-args",
                                                timeout=90).ok().output
    cli = parse_show_args(out)
    assert len(cli) == out.count("\n    '"), out  # every argument block parsed
    readme_names = re.findall(r"^\| `([^`]+)` \|", gen.regions(README_TEXT)["launch-arguments"][0], re.M)
    problems = launch_disagreements(cli, gen.launch_arguments(), readme_names)
    assert not problems, "\n".join(problems)
