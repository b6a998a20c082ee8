"""The package's structure as the design card fixes it: one ROS package at the root, the core/ROS
boundary as a folder boundary, and no import cycles.

* Nothing under ``lingbot_map_ros/core/`` imports rclpy, a ROS message package or the ROS layer
  (checked statically on every import statement, and dynamically by importing every core module in
  a fresh interpreter and looking at ``sys.modules``).
* The module-level import graph of the package has no cycle (late imports inside functions are
  allowed: they are how optional, heavy or circular-by-nature pieces load).
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lingbot_map_ros"
CORE = PACKAGE / "core"
ROS_MESSAGE_PACKAGES = ("builtin_interfaces", "diagnostic_msgs", "geometry_msgs", "nav_msgs", "sensor_msgs",
                        "std_msgs", "std_srvs", "tf2_msgs", "rcl_interfaces", "lifecycle_msgs")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, module_level_only: bool) -> list[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rsplit(".", 1)[0]
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    out: list[str] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            if node.module:
                out.append(prefix)
            # `from . import x` imports the submodule x (or a name of the package)
            out += [f"{prefix}.{a.name}" for a in node.names]
    return out


def _forbidden(name: str) -> bool:
    head = name.split(".")[0]
    return (head == "rclpy" or head in ROS_MESSAGE_PACKAGES or name.startswith("lingbot_map_ros.ros")
            or name.startswith("lingbot_map_ros.msg") or name.startswith("lingbot_map_ros.tools"))


def test_root_is_one_ros_package():
    for name in ("package.xml", "CMakeLists.txt", "setup.py", "README.md"):
        assert (ROOT / name).is_file(), name
    for name in ("lingbot_map_ros", "launch", "config", "msg", "test", "scripts", "docs", ".ci"):
        assert (ROOT / name).is_dir(), name
    manifests = [p for p in ROOT.rglob("package.xml") if ".venv" not in p.parts and "build" not in p.parts]
    assert manifests == [ROOT / "package.xml"], f"a second ROS package: {manifests}"
    assert not (PACKAGE / "msg").exists(), "msg/ is generated into the installed package, not kept in the sources"


def test_core_imports_no_ros_statically():
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        for name in _imports(path, module_level_only=False):
            if _forbidden(name):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.slow
def test_core_imports_no_ros_at_run_time():
    modules = [_module_name(p) for p in sorted(CORE.rglob("*.py"))]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except ImportError as exc:\n"
        "        if 'flashinfer' not in str(exc) and 'triton' not in str(exc):\n"
        "            raise\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {('rclpy',) + ROS_MESSAGE_PACKAGES!r} "
        "or m.startswith('lingbot_map_ros.ros') or m.startswith('lingbot_map_ros.msg'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "", f"importing the core loaded: {out.stdout.strip()}"


def test_static_check_catches_a_ros_import(tmp_path):
    """The checker itself can fail: a core-like file importing rclpy is reported."""
    fake = ROOT / "lingbot_map_ros" / "core" / "_layout_probe.py"
    tree_text = "from ..ros import node\nimport rclpy\n"
    names = []
    try:
        fake.write_text(tree_text)
        names = _imports(fake, module_level_only=False)
    finally:
        fake.unlink()
    assert [n for n in names if _forbidden(n)] == ["lingbot_map_ros.ros", "lingbot_map_ros.ros.node", "rclpy"]


def _cycles(module_level_only: bool, within: str = "") -> list[list[str]]:
    """Import cycles among the package's modules (``within``: only modules under that prefix)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = {n: p for n, p in modules.items() if n.startswith(within)}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for imported in _imports(path, module_level_only=module_level_only):
            # the deepest package module this name refers to
            while imported and imported not in modules:
                imported = imported.rsplit(".", 1)[0] if "." in imported else ""
            if imported and imported != name:
                deps.add(imported)
        graph[name] = deps
    # Tarjan-free cycle search: DFS with colours
    colour: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        colour[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if colour.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in colour:
                visit(dep, stack)
        stack.pop()
        colour[node] = 2

    for node in sorted(graph):
        if node not in colour:
            visit(node, [])
    return cycles


def test_no_module_level_import_cycles():
    cycles = _cycles(module_level_only=True)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_core_is_a_straight_chain():
    """core/ has no import circle at all: not through late imports inside functions, not through
    type-checking imports (the session signals, the manager decides: nothing imports upwards)."""
    cycles = _cycles(module_level_only=False, within="lingbot_map_ros.core")
    assert not cycles, "import cycles in core/:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.slow
def test_every_import_the_documentation_shows_works() -> None:
    """The README's and docs' Python examples import real modules and names (they once named paths that
    did not exist): each ``from lingbot_map_ros... import ...`` line in them is run."""
    import re

    root = Path(__file__).resolve().parents[1]
    lines = set()
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for line in doc.read_text().splitlines():
            m = re.match(
                r"\s*((from lingbot_map_ros[\w.]* import [\w, ]+)|(import lingbot_map_ros[\w.]*))\s*(#.*)?$", line
            )
            if m:
                lines.add(m.group(1).strip())
    assert lines, "no import lines found in the documentation"
    for line in sorted(lines):
        run = subprocess.run([sys.executable, "-c", line], cwd=root, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, f"{line!r} from the documentation fails: {run.stderr.strip().splitlines()[-1:]}"


@pytest.mark.slow
def test_the_readme_core_example_runs() -> None:
    """The "core without ROS" example (docs/reference.md), with the tiny preset and random frames in place
    of the checkpoint and the user's frames: it must run and print one line per frame."""
    import re

    reference = (Path(__file__).resolve().parents[1] / "docs" / "reference.md").read_text()
    section = reference[reference.index("## The core without ROS"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 'RuntimeConfig(checkpoint="/models/lingbot-map.pt")' in code and "my_frames" in code
    code = code.replace(
        'RuntimeConfig(checkpoint="/models/lingbot-map.pt")', 'RuntimeConfig(model_preset="tiny", device="cpu")'
    )
    setup = (
        "import numpy as _np\n"
        "my_frames = [_np.random.default_rng(i).integers(0, 255, (60, 80, 3), dtype=_np.uint8) for i in range(10)]\n"
    )
    run = subprocess.run([sys.executable, "-c", setup + code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    printed = [line.split()[0] for line in run.stdout.splitlines() if re.match(r"\d+ (True|False) \[", line)]
    assert printed == [str(i) for i in range(10)], run.stdout


def test_architecture_doc_names_every_module_and_only_modules_that_exist():
    """docs/architecture.md is the map of the package: every module is in its tables, and every module
    path it names exists (a renamed or removed module makes this fail)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    missing = sorted(m for m in modules if f"`{m}`" not in doc)
    assert not missing, f"modules missing from docs/architecture.md: {missing}"
    named = set(re.findall(r"`((?:core|ros|tools)/[\w/]+\.py)`", doc))
    stale = sorted(n for n in named if n not in modules)
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"
