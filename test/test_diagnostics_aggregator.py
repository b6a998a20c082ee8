"""config/diagnostic_aggregator.yaml and the launch argument that starts diagnostic_aggregator with it.

diagnostic_aggregator (C++) has no wheel, so ``aggregator_node`` cannot run here. What is checked:

* the file has the shape aggregator_node reads (node ``analyzers``, GenericAnalyzers with list-typed
  matching values, see ``diagnostic_analyzers.py``), and GenericAnalyzer's documented matching takes
  every status name the node builds (``DIAG_PREFIX`` + the six parts) and nothing of other nodes,
  showing them as ``/LingBot-Map/<part>``; ``test_ros_tools.py`` does the same on the live names;
* the launch description, loaded with the real launch library: argument ``diagnostics_aggregator``
  (default false), an ``aggregator_node`` Node of ``diagnostic_aggregator`` with the installed copy
  of the file as its parameters, started only when the argument is true *and* the package is in the
  ament index (a stand-in index entry plays the installed package), else the log line.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from diagnostic_analyzers import GENERIC, check_jazzy_types, load_analyzers, route

PKG = Path(__file__).resolve().parents[1]
CONFIG = PKG / "config" / "diagnostic_aggregator.yaml"
LAUNCH = PKG / "launch" / "lingbot_map.launch.py"
PARTS = ("input", "inference", "kv cache", "backend", "tf", "scale")


def test_file_has_the_shape_aggregator_node_reads():
    top, analyzers = load_analyzers(CONFIG)
    assert [a.key for a in analyzers] == ["lingbot_map"]
    a = analyzers[0]
    assert a.params["type"] == GENERIC and a.path == "/LingBot-Map"
    assert check_jazzy_types(a) == []
    assert isinstance(top.get("pub_rate", 1.0), float)
    assert float(a.params["timeout"]) > 0


def test_documented_matching_takes_the_node_statuses_only():
    from lingbot_map_ros.ros.diagnostics import DIAG_PREFIX

    _, analyzers = load_analyzers(CONFIG)
    names = [DIAG_PREFIX + part for part in PARTS]
    for name in names:
        taken = route(analyzers, name)
        assert [a.key for a in taken] == ["lingbot_map"], name
        assert taken[0].output_name(name) == "/LingBot-Map/" + name[len(DIAG_PREFIX):]
    assert set(analyzers[0].values("expected")) == set(names)  # a missing status shows as missing
    for other in ("lingbot_map_demo: camera", "camera_driver: lingbot_map: x", "lingbot_mapper: input",
                  "/lingbot_map/input"):
        assert route(analyzers, other) == [], other


def test_matching_rules_as_documented():
    """The matcher itself, on the rules' own terms (so the checks above can fail for the right reason)."""
    from diagnostic_analyzers import Analyzer

    a = Analyzer("x", "/G", {"type": GENERIC, "path": "G", "regex": ["cam[0-9]+: .*"], "name": ["exact"],
                             "contains": ["motor"], "startswith": ["/arm"], "remove_prefix": ["/arm"]})
    assert a.matches("cam12: rate") and not a.matches("xcam12: rate")  # regex: whole name
    assert a.matches("exact") and not a.matches("exact2")
    assert a.matches("left motor temp") and a.matches("/arm/joint")
    assert not a.matches("leg")
    # '/' becomes ' ' in the item name and in the prefix to remove (upstream's fix of ros/diagnostics#17)
    assert a.output_name("/arm/joint: temp") == "/G/joint: temp"
    assert a.output_name("cam1: rate") == "/G/cam1: rate"  # no prefix to remove
    b = Analyzer("y", "/G", {"type": GENERIC, "path": "G", "find_and_remove_prefix": ["node:"]})
    assert b.matches("node: part") and b.output_name("node: part") == "/G/part"
    assert check_jazzy_types(Analyzer("z", "/G", {"type": GENERIC, "path": "G", "startswith": "node"})) \
        == ["z.startswith must be a list of strings (as_string_array)"]


def _launch_description():
    launch = pytest.importorskip("launch")
    if not hasattr(launch, "LaunchDescription"):  # only the repository's launch/ folder
        pytest.skip("ROS 2 launch is not installed")
    pytest.importorskip("launch_ros")
    from launch.launch_description_sources import get_launch_description_from_python_launch_file

    return get_launch_description_from_python_launch_file(str(LAUNCH))


def _context(value: str):
    from launch import LaunchContext

    ctx = LaunchContext()
    ctx.launch_configurations["diagnostics_aggregator"] = value
    return ctx


@pytest.fixture
def fake_aggregator_prefix(tmp_path, monkeypatch):
    """An install prefix whose ament index lists diagnostic_aggregator, first on AMENT_PREFIX_PATH."""
    marker = tmp_path / "share" / "ament_index" / "resource_index" / "packages" / "diagnostic_aggregator"
    marker.parent.mkdir(parents=True)
    marker.write_text("")
    monkeypatch.setenv("AMENT_PREFIX_PATH", os.pathsep.join([str(tmp_path), os.environ.get("AMENT_PREFIX_PATH", "")]))
    return tmp_path


def test_launch_argument_and_aggregator_node_in_the_description(fake_aggregator_prefix):
    from launch.actions import DeclareLaunchArgument, LogInfo
    from launch.utilities import perform_substitutions
    from launch_ros.actions import Node

    description = _launch_description()
    args = {a.name: a for a in description.entities if isinstance(a, DeclareLaunchArgument)}
    assert "diagnostics_aggregator" in args
    assert perform_substitutions(_context(""), args["diagnostics_aggregator"].default_value) == "false"
    aggregators = [e for e in description.entities if isinstance(e, Node) and e.node_package == "diagnostic_aggregator"]
    assert len(aggregators) == 1
    node = aggregators[0]
    assert node.node_executable == "aggregator_node"
    logs = [e for e in description.entities if isinstance(e, LogInfo)]
    assert len(logs) == 1

    # installed (the stand-in index entry): the node runs exactly when the argument is true
    assert node.condition.evaluate(_context("true")) and not node.condition.evaluate(_context("false"))
    assert not logs[0].condition.evaluate(_context("true"))
    # its parameters: this package's installed copy of the analyzer file
    ctx = _context("true")
    node._perform_substitutions(ctx)
    cmd = []
    for part in node.cmd[1:]:  # [0] is the executable, which does not exist here
        try:
            cmd.append(perform_substitutions(ctx, part))
        except Exception:  # ros_specific_arguments placeholders, filled in at execute time
            cmd.append("<local>")
    params = [cmd[i + 1] for i, c in enumerate(cmd) if c == "--params-file"]
    assert len(params) == 1
    installed = Path(params[0])
    assert installed.name == CONFIG.name and installed.parent.name == "config"
    assert installed.parent.parent.name == "lingbot_map_ros" and installed.read_text() == CONFIG.read_text()


def test_without_the_package_the_argument_gives_a_log_line(monkeypatch):
    from launch.actions import LogInfo
    from launch.utilities import perform_substitutions
    from launch_ros.actions import Node

    description = _launch_description()
    ament = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep)
             if p and not (Path(p) / "share/ament_index/resource_index/packages/diagnostic_aggregator").exists()]
    monkeypatch.setenv("AMENT_PREFIX_PATH", os.pathsep.join(ament))
    node = next(e for e in description.entities if isinstance(e, Node) and e.node_package == "diagnostic_aggregator")
    log = next(e for e in description.entities if isinstance(e, LogInfo))
    assert not node.condition.evaluate(_context("true")) and not node.condition.evaluate(_context("false"))
    assert log.condition.evaluate(_context("true")) and not log.condition.evaluate(_context("false"))
    text = "".join(perform_substitutions(_context("true"), [s]) for s in log.msg)
    assert "diagnostic_aggregator is not installed" in text and "/diagnostics" in text
