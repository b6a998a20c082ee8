"""``package.xml`` declares every runtime dependency rosdep can install, and the README's install line
installs the rest with pip: so ``rosdep install`` + that line give a robot everything the node and
the tools import.

The imports are read from the sources themselves (every ``import``/``from`` in ``lingbot_map_ros/``
and ``launch/``, function-level ones included), so a new dependency without a ``package.xml`` entry
fails here.
"""
from __future__ import annotations

import ast
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Python modules -> their rosdep keys (names as in rosdistro's rosdep/base.yaml and python.yaml).
ROSDEP_KEYS = {
    "numpy": "python3-numpy",
    "cv2": "python3-opencv",
    "PIL": "python3-pil",
    "yaml": "python3-yaml",
    "matplotlib": "python3-matplotlib",
    "rosbags": "python3-rosbags-pip",
    "scipy": "python3-scipy",
}
# ROS packages imported as Python modules of the same name (their rosdep key is that name).
ROS_PACKAGES = {"rclpy", "launch", "launch_ros", "ament_index_python", "cv_bridge", "tf2_ros", "message_filters"}
# From pip, not rosdep: required ones must be in the README's install line, optional ones named there.
PIP_REQUIRED = {"torch": "torch", "safetensors": "safetensors", "evo": "evo"}
PIP_OPTIONAL = {"flashinfer": "flashinfer-python", "triton": "triton", "ray": "ray"}
OPTIONAL_SUBMODULES = {"rosbags.image": "rosbags-image"}  # a fallback where cv_bridge is missing


def imported_modules() -> dict[str, set[str]]:
    """{top-level module: {files importing it}} over the package and the launch file (absolute imports)."""
    found: dict[str, set[str]] = {}
    files = sorted((REPO / "lingbot_map_ros").rglob("*.py")) + sorted((REPO / "launch").glob("*.py"))
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name in OPTIONAL_SUBMODULES:
                    continue
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(REPO)))
    return found


def package_xml_keys() -> set[str]:
    root = ET.parse(REPO / "package.xml").getroot()
    return {e.text.strip() for tag in ("depend", "exec_depend") for e in root.iter(tag) if e.text}


def is_ros_message_package(name: str) -> bool:
    return re.fullmatch(r"[a-z0-9_]+_(msgs|srvs|interfaces)", name) is not None


def third_party(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: f for m, f in modules.items() if m not in sys.stdlib_module_names and m != "lingbot_map_ros"}


def test_every_import_has_a_rosdep_key_or_the_pip_line():
    unknown = {m: sorted(f) for m, f in third_party(imported_modules()).items()
               if m not in ROSDEP_KEYS and m not in ROS_PACKAGES and m not in PIP_REQUIRED and m not in PIP_OPTIONAL
               and not is_ros_message_package(m)}
    assert not unknown, (f"imports with no rosdep key or pip entry here: {unknown}; add the key to package.xml "
                         "(and ROSDEP_KEYS/ROS_PACKAGES above) or the package to the README's pip line")


def test_package_xml_declares_each_rosdep_dependency():
    declared = package_xml_keys()
    needed = {}
    for module, files in third_party(imported_modules()).items():
        key = ROSDEP_KEYS.get(module) or (module if module in ROS_PACKAGES or is_ros_message_package(module) else None)
        if key and key not in declared:
            needed[key] = sorted(files)
    assert not needed, f"package.xml lacks <exec_depend> for {needed}"


def test_rosbags_and_matplotlib_are_declared():
    """The tools need both at run time (bags, plots): rosdep must install them on a robot."""
    assert {"python3-rosbags-pip", "python3-matplotlib"} <= package_xml_keys()


def test_readme_install_line_has_the_pip_dependencies():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    lines = [ln for ln in readme.splitlines() if re.search(r"\bpip3? install\b", ln)]
    assert lines, "README.md has no pip install line"
    words = set(re.split(r"[\s#:;,]+", " ".join(lines)))
    assert set(PIP_REQUIRED.values()) <= words, (lines, PIP_REQUIRED)
    for dist in list(PIP_OPTIONAL.values()) + list(OPTIONAL_SUBMODULES.values()):
        assert dist in readme, f"README.md does not name the optional pip package {dist}"
    comment = (REPO / "package.xml").read_text(encoding="utf-8")
    for dist in list(PIP_REQUIRED.values()) + list(PIP_OPTIONAL.values()):
        assert dist in comment, f"package.xml's pip comment does not name {dist}"


def test_the_scan_sees_function_level_imports():
    """It can fail: the scan finds an import made inside a function (evo, matplotlib are)."""
    modules = imported_modules()
    assert "evo" in modules and "matplotlib" in modules and "torch" in modules
    assert is_ros_message_package("sensor_msgs") and not is_ros_message_package("numpy")
