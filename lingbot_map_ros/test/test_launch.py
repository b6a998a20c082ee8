"""The launch file and the parameter file: what they reference exists and matches the node.

``launch``/``launch_ros`` are not installable from PyPI here, so the launch file is imported only
where they exist (a ROS install); everywhere else it is checked by reading its source: the package
and executable it starts, the arguments it declares, the parameter file it defaults to, and that
setup.py installs both files where ``ros2 launch`` looks for them.
"""
from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

PKG = Path(__file__).resolve().parents[1]
LAUNCH = PKG / "launch" / "lingbot_map.launch.py"
PARAMS = PKG / "config" / "lingbot_map.yaml"
SETUP = PKG / "setup.py"
LAUNCH_ARGS = {"image_topic", "image_transport", "params_file", "checkpoint", "namespace", "log_level"}


def _module_constants(path: Path) -> dict:
    tree = ast.parse(path.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def _console_scripts() -> dict:
    """name -> 'module:function' from setup.py's entry_points, read without running setup()."""
    text = SETUP.read_text()
    consts = _module_constants(SETUP)
    scripts = {}
    for m in re.finditer(r'f?"(\w+)\s*=\s*([\w{}.]+):(\w+)"', text):
        module = m.group(2).replace("{PACKAGE}", consts.get("PACKAGE", "lingbot_map_ros"))
        scripts[m.group(1)] = f"{module}:{m.group(3)}"
    return scripts


def _yaml_parameters() -> dict:
    doc = yaml.safe_load(PARAMS.read_text())
    assert isinstance(doc, dict) and len(doc) == 1, "one node section expected"
    (key, section), = doc.items()
    assert key in ("/**", "lingbot_map", "/lingbot_map", "/**/lingbot_map"), key
    params = section["ros__parameters"]
    flat = {}

    def walk(prefix, d):
        for k, v in d.items():
            if isinstance(v, dict):
                walk(prefix + k + ".", v)
            else:
                flat[prefix + k] = v

    walk("", params)
    return flat


def test_launch_file_references_exist():
    consts = _module_constants(LAUNCH)
    assert consts["PACKAGE"] == "lingbot_map_ros"
    scripts = _console_scripts()
    assert consts["EXECUTABLE"] in scripts, f"{consts['EXECUTABLE']} is not a console script of setup.py"
    module, func = scripts[consts["EXECUTABLE"]].split(":")
    assert module == "lingbot_map_ros.node" and func == "main"
    assert (PKG / consts["PARAMS_FILE"]) == PARAMS and PARAMS.is_file()
    declared = set(re.findall(r'DeclareLaunchArgument\(\s*"(\w+)"', LAUNCH.read_text()))
    assert LAUNCH_ARGS <= declared, LAUNCH_ARGS - declared
    # the default params_file is <share>/PARAMS_FILE, installed there by setup.py
    assert "FindPackageShare(PACKAGE), *PARAMS_FILE.split" in LAUNCH.read_text()
    setup_text = SETUP.read_text()
    assert 'glob("launch/*.launch.py")' in setup_text and 'glob("config/*.yaml")' in setup_text
    assert (PKG / "resource" / "lingbot_map_ros").is_file(), "ament index marker missing"


def test_console_scripts_of_interface_exist():
    scripts = _console_scripts()
    for name in ("lingbot_map_node", "lingbot_map_demo", "lingbot_map_offline", "lingbot_map_bench"):
        assert name in scripts
    for name, target in scripts.items():
        module = target.split(":")[0]
        path = PKG / (module.replace(".", "/") + ".py")
        if name in ("lingbot_map_node", "lingbot_map_demo"):
            assert path.is_file(), f"{name}: {path} missing"


def test_yaml_parameters_are_declared_by_the_node_and_documented():
    pytest.importorskip("rclpy")
    from lingbot_map_ros.node import PARAMETERS

    specs = {p.name: p for p in PARAMETERS}
    params = _yaml_parameters()
    assert set(params) <= set(specs), f"not declared by the node: {set(params) - set(specs)}"
    assert set(specs) <= set(params), f"declared but missing from the YAML: {set(specs) - set(params)}"
    for name, value in params.items():
        default = specs[name].default
        # a YAML value of another type makes declare_parameter fail at start (1 vs 1.0, "" vs null)
        assert type(value) is type(default), f"{name}: YAML {value!r} vs declared default {default!r}"
        assert value == default, f"{name}: the shipped YAML should hold the default ({default!r}), has {value!r}"
    lines = PARAMS.read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\s+(\w+):\s*\S", line)
        if m and m.group(1) in specs:
            assert "#" in line or lines[i - 1].strip().startswith("#"), f"{m.group(1)} has no comment"


def test_launch_file_imports_where_launch_exists():
    launch = pytest.importorskip("launch")
    if not hasattr(launch, "LaunchDescription"):  # only this package's launch/ folder (a namespace package)
        pytest.skip("ROS 2 launch is not installed")
    pytest.importorskip("launch_ros")
    spec = importlib.util.spec_from_file_location("lingbot_map_launch", LAUNCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    description = mod.generate_launch_description()
    from launch.actions import DeclareLaunchArgument

    names = {a.name for a in description.entities if isinstance(a, DeclareLaunchArgument)}
    assert LAUNCH_ARGS <= names
