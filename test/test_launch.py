"""The launch file and the parameter file: what they reference exists and matches the node.

Static checks (what the launch file names exists, CMakeLists.txt installs it where ``ros2 launch``
looks), the installed prefix as the ament index sees it, and the launch description itself where
``launch``/``launch_ros`` are installed. ``test_ros_tools.py`` starts it for real.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import re
from pathlib import Path

import pytest
import yaml

PKG = Path(__file__).resolve().parents[1]
LAUNCH = PKG / "launch" / "lingbot_map.launch.py"
PARAMS = PKG / "config" / "lingbot_map.yaml"
SETUP = PKG / "setup.py"
CMAKE = PKG / "CMakeLists.txt"
LAUNCH_ARGS = {"image_topic", "image_transport", "params_file", "checkpoint", "namespace", "log_level", "autostart",
               "base_frame", "odom_frame", "scale_source", "world_frame", "depth_topic"}


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


def _cmake_executables() -> dict:
    """name -> 'module:function' of the executables CMakeLists.txt generates (lib/<pkg> and bin/)."""
    return dict(re.findall(r'"(\w+)=([\w.]+:\w+)"', CMAKE.read_text()))


def _setup_py_scripts() -> dict:
    """name -> 'module:function' of setup.py's console scripts (the pip install of the core + tools)."""
    consts = _module_constants(SETUP)
    out = {}
    for m in re.finditer(r'f?"(\w+)\s*=\s*([\w{}.]+):(\w+)"', SETUP.read_text()):
        out[m.group(1)] = m.group(2).replace("{PACKAGE}", consts.get("PACKAGE", "lingbot_map_ros")) + ":" + m.group(3)
    return out


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
    scripts = _cmake_executables()
    assert consts["EXECUTABLE"] in scripts, f"{consts['EXECUTABLE']} is not an executable of CMakeLists.txt"
    module, func = scripts[consts["EXECUTABLE"]].split(":")
    assert module == "lingbot_map_ros.ros.node" and func == "main"
    assert (PKG / consts["PARAMS_FILE"]) == PARAMS and PARAMS.is_file()
    declared = set(re.findall(r'DeclareLaunchArgument\(\s*"(\w+)"', LAUNCH.read_text()))
    assert LAUNCH_ARGS <= declared, LAUNCH_ARGS - declared
    # the default params_file is <share>/PARAMS_FILE, installed there by CMakeLists.txt
    assert "FindPackageShare(PACKAGE), *PARAMS_FILE.split" in LAUNCH.read_text()
    assert "install(DIRECTORY launch config DESTINATION share/${PROJECT_NAME})" in CMAKE.read_text()


def test_executables_of_interface_exist_and_match_setup_py():
    scripts = _cmake_executables()
    for name in ("lingbot_map_node", "lingbot_map_demo", "lingbot_map_offline", "lingbot_map_bench"):
        assert name in scripts
    assert _setup_py_scripts() == scripts, "setup.py's console scripts and CMakeLists.txt's executables differ"
    for name, target in scripts.items():
        module, func = target.split(":")
        path = PKG / (module.replace(".", "/") + ".py")
        assert path.is_file(), f"{name}: {path} missing"
        assert re.search(rf"^def {func}\(", path.read_text(), re.M), f"{name}: no {func}() in {path}"


def test_installed_package_is_found_like_ros2_finds_it():
    """The prefix the tests run in (the venv, or a colcon install) holds what ros2 run/launch look up."""
    ament_index = pytest.importorskip("ament_index_python.packages")
    try:
        share = Path(ament_index.get_package_share_directory("lingbot_map_ros"))
    except ament_index.PackageNotFoundError:
        pytest.fail("lingbot_map_ros is not in the ament index: run scripts/setup_env.sh")
    prefix = share.parents[1]
    assert (share / "launch" / LAUNCH.name).is_file() and (share / "config" / PARAMS.name).is_file()
    assert (share / "package.xml").is_file()
    for name in _cmake_executables():
        exe = prefix / "lib" / "lingbot_map_ros" / name
        assert exe.is_file() and os.access(exe, os.X_OK), f"{exe} missing or not executable"


def test_yaml_parameters_are_declared_by_the_node_and_documented():
    pytest.importorskip("rclpy")
    from lingbot_map_ros.ros.node import PARAMETERS

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


def _launch_module():
    launch = pytest.importorskip("launch")
    if not hasattr(launch, "LaunchDescription"):
        pytest.skip("ROS 2 launch is not installed")
    pytest.importorskip("launch_ros")
    spec = importlib.util.spec_from_file_location("lingbot_map_launch_robot", LAUNCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _context(**arguments):
    from launch import LaunchContext

    mod = _launch_module()
    context = LaunchContext()
    for action in mod.generate_launch_description().entities:  # the declared defaults
        if hasattr(action, "default_value") and action.default_value is not None:
            context.launch_configurations[action.name] = "".join(s.perform(context) for s in action.default_value)
    context.launch_configurations.update(arguments)
    return mod, context


def test_robot_launch_arguments_set_the_parameters_and_the_depth_remap(tmp_path):
    mod, context = _context(params_file=str(PARAMS))
    parameters, remappings = mod.node_settings(context)
    assert parameters[0] == str(PARAMS)
    assert not {"base_frame", "odom_frame", "scale_source", "world_frame"} & set(parameters[1])  # the file's values
    assert remappings == [("image", "/camera/image_raw")]
    mod, context = _context(params_file=str(PARAMS), base_frame="base_link", odom_frame="odom",
                            scale_source="depth", world_frame="map",
                            depth_topic="/camera/camera/aligned_depth_to_color/image_raw")
    parameters, remappings = mod.node_settings(context)
    assert {k: parameters[1][k] for k in ("base_frame", "odom_frame", "scale_source", "world_frame")} == {
        "base_frame": "base_link", "odom_frame": "odom", "scale_source": "depth", "world_frame": "map"}
    assert ("depth", "/camera/camera/aligned_depth_to_color/image_raw") in remappings


def test_rviz_fixed_frame_follows_world_frame(tmp_path):
    rviz = PKG / "config" / "lingbot_map.rviz"
    own = tmp_path / "robot.yaml"
    own.write_text(yaml.safe_dump({"/**": {"ros__parameters": {"world_frame": "odom_world"}}}))
    for arguments, want in (({"params_file": str(PARAMS)}, "lingbot_world"),
                            ({"params_file": str(own)}, "odom_world"),
                            ({"params_file": str(own), "world_frame": "map"}, "map")):
        mod, context = _context(**arguments)
        assert mod.world_frame(context) == want
        config = Path(mod.rviz_config_for(want, str(rviz)))
        text = config.read_text()
        assert f"Fixed Frame: {want}" in text
        others = yaml.safe_load(text), yaml.safe_load(rviz.read_text())
        others[1]["Visualization Manager"]["Global Options"]["Fixed Frame"] = want
        assert others[0] == others[1]  # nothing else changed
