"""Helpers for the tests that drive the real ROS 2 tools (``ros2 run/launch/param/topic/...``, colcon).

Every command runs the way a user types it: in ``bash``, after ``source .venv/bin/activate`` (and,
for the colcon workspace, ``source ws/install/setup.bash``), with an environment from which the
test's own ROS/venv variables were removed, so the activation script is what makes it work.

Isolation rules (README.md, "Two commands"): discovery on loopback, one ROS_DOMAIN_ID
per test, ROS_LOG_DIR / ROS_HOME / TMPDIR in the test's temporary folder, ``--no-daemon`` where the
verb has it and ``ros2 daemon stop`` at the end, a timeout on every command, and every process
stopped by its own PID (its process group for ``ros2 run``, as Ctrl-C does), never by name.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("LINGBOT_VENV", REPO / ".venv"))
# What activating the venv or sourcing a workspace sets: removed from the base environment so the
# scripts have to do their job (a test that passes only because pytest's environment leaked into
# the child would prove nothing about the user's shell).
_ACTIVATION_VARS = ("VIRTUAL_ENV", "AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH", "COLCON_PREFIX_PATH", "PYTHONPATH",
                    "ROS_DISTRO", "ROS_VERSION", "ROS_PYTHON_VERSION", "PYTHONHOME",
                    # the ROS wheels' start-up hook re-execs Python with LD_LIBRARY_PATH and marks it done
                    "LD_LIBRARY_PATH", "_ROS_WHEELS_BOOTSTRAP_COMPLETE")


def ros_tools_missing() -> Optional[str]:
    """Why the ROS tool tests cannot run here (None when they can): the only reason to skip them."""
    if not (VENV / "bin" / "activate").is_file():
        return f"no virtual environment at {VENV} (run scripts/setup_env.sh)"
    if not (VENV / "bin" / "ros2").is_file():
        return "the ros2 CLI is not installed in the venv (the ros_cli wheels were not installed at set-up)"
    for module in ("launch", "launch_ros", "ros2cli"):
        spec = _find_spec(module)
        if spec is None:
            return f"{module} is not importable (the ros_cli wheels were not installed at set-up)"
    return None


def _find_spec(module: str):
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    # the repository's own launch/ folder is a namespace package named `launch`: not the library
    if spec is None or spec.origin in (None, "namespace"):
        return None
    return spec


def require_ros_tools() -> None:
    """Skip the calling module, with the reason, where the tools are not installed."""
    reason = ros_tools_missing()
    if reason:
        pytest.skip(reason, allow_module_level=True)


DISCOVERY_S = 60.0  # how long a ros2 verb is retried while the node is not discovered yet
CLI_FLAGS = "--no-daemon --spin-time 2"  # test-only: no daemon left behind, 2 s of discovery per verb
# What a ros2 verb prints (and exits non-zero with) when discovery was too slow for it, not the node wrong:
DISCOVERY_MISSES = ("Node not found", "Unable to find node", "Exception while calling service of node",
                    "does not appear to be published yet")


def discovery_missed(res: "Result") -> bool:
    """A verb's failure that only says the node (or its topic/services) was not discovered in time."""
    return res.returncode != 0 and any(m in res.output for m in DISCOVERY_MISSES)


@dataclass
class RosShell:
    """A user's shell for one test: its own domain id and temporary folders, the venv activated."""

    domain_id: int
    tmp: Path
    sources: list[Path] = field(default_factory=list)  # extra scripts sourced after the venv (workspaces)
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for sub in ("log", "home", "tmp"):
            (self.tmp / sub).mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        """The environment of a fresh login shell on this machine, plus the isolation variables."""
        env = {k: v for k, v in os.environ.items() if k not in _ACTIVATION_VARS and not k.startswith("PYTEST_")}
        venv_bin = str(VENV / "bin")
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep)
                                      if p and p != venv_bin)
        env.update(
            ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
            ROS_DOMAIN_ID=str(self.domain_id),
            ROS_LOG_DIR=str(self.tmp / "log"),
            ROS_HOME=str(self.tmp / "home"),
            TMPDIR=str(self.tmp / "tmp"),
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env

    def script(self, command: str) -> str:
        """``command`` preceded by what the user sources; ``exec`` keeps the PID for signals."""
        lines = ["set -e", f"source {shlex.quote(str(VENV / 'bin' / 'activate'))}"]
        lines += [f"source {shlex.quote(str(s))}" for s in self.sources]
        lines += ["set +e", f"exec {command}"]
        return "\n".join(lines)

    def ros2(self, command: str, timeout: float = 30.0, discovery: float = DISCOVERY_S) -> "Result":
        """A ``ros2`` verb that needs the node discovered first: while it fails because discovery was
        slower than its spin time ("Node not found", the node's services not seen yet), run it again
        after a short pause, as a user would, for at most ``discovery`` seconds; then return the last
        answer (the caller's check fails on it with the output).

        Why: on a busy 2-core machine DDS discovery sometimes takes longer than ``--spin-time 2``
        (seen: ``ros2 lifecycle set ... activate`` answered "Node not found" with the node up), and a
        red test must mean a real failure. A verb that reports "Node not found" has changed nothing
        (it checks the node list before any call), so running it again is safe."""
        deadline = time.monotonic() + discovery
        pause = 0.5
        while True:
            res = self.run(command, timeout=timeout)
            if not discovery_missed(res) or time.monotonic() + pause >= deadline:
                return res
            time.sleep(pause)
            pause = min(2 * pause, 4.0)

    def wait_for_node(self, node: str, timeout: float = DISCOVERY_S) -> bool:
        """Until ``ros2 node list`` shows ``node`` (True), or ``timeout`` s have gone (False)."""
        return wait_until(lambda: node in self.run(f"ros2 node list {CLI_FLAGS}", timeout=30).output.split(),
                          timeout, interval=0.5)

    def run(self, command: str, timeout: float = 60.0, cwd: Optional[Path] = None) -> "Result":
        """Run ``command`` to completion (killed with its process group after ``timeout`` s)."""
        t0 = time.monotonic()
        proc = subprocess.Popen(["bash", "-c", self.script(command)], env=self.env(), cwd=str(cwd or self.tmp),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, _ = proc.communicate(timeout=10)
            raise AssertionError(f"`{command}` did not finish within {timeout:.0f} s; output:\n{out[-4000:]}")
        return Result(command, proc.returncode, out, time.monotonic() - t0)

    def start(self, command: str, name: str, cwd: Optional[Path] = None) -> "Background":
        """Start ``command`` in the background (its own session, so a group signal reaches only it)."""
        return Background(command, self, name, cwd or self.tmp)

    def stop_daemon(self) -> None:
        """``ros2 daemon stop`` for this domain: the daemon outlives the commands that started it."""
        self.run("ros2 daemon stop", timeout=30)


@dataclass
class Result:
    command: str
    returncode: int
    output: str
    seconds: float

    def ok(self) -> "Result":
        assert self.returncode == 0, f"`{self.command}` exited {self.returncode}:\n{self.output[-4000:]}"
        return self


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of a child we started (its PID is the group id: start_new_session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Background:
    """A long-running command (``ros2 launch``, ``ros2 run``) with its output collected line by line."""

    def __init__(self, command: str, shell: RosShell, name: str, cwd: Path):
        self.command, self.name = command, name
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._log = open(shell.tmp / f"{name}.log", "w")
        self.proc = subprocess.Popen(["bash", "-c", shell.script(command)], env=shell.env(), cwd=str(cwd),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._log.write(line)
                self._log.flush()
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        """Wait until a line matches the regex ``pattern``; fails with the output when it does not."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    m = rx.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    break
                self._cond.wait(min(left, 0.5))
        raise AssertionError(f"{self.name}: no line matching {pattern!r} within {timeout:.0f} s "
                             f"(exit code {self.proc.poll()}); output:\n{self.output()[-5000:]}")

    def interrupt(self, group: bool = False, timeout: float = 45.0) -> int:
        """SIGINT, as Ctrl-C does, and wait for the exit code.

        ``group=False`` signals only the process (``ros2 launch`` forwards SIGINT to its nodes when
        stdin is not a terminal); ``group=True`` signals its process group, which is what a terminal
        does and what ``ros2 run`` needs (it forwards nothing). After ``timeout`` the group is killed
        and the test fails on the exit code.
        """
        if self.proc.poll() is None:
            if group:
                os.killpg(self.proc.pid, signal.SIGINT)
            else:
                self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill_group(self.proc)
                self.proc.wait(10)
                self._reader.join(5)
                raise AssertionError(f"{self.name} did not stop within {timeout:.0f} s of SIGINT; "
                                     f"output:\n{self.output()[-5000:]}")
        self._reader.join(10)
        return self.proc.returncode

    def close(self) -> None:
        """Make sure nothing is left running (fixture teardown after a failed test)."""
        if self.proc.poll() is None:
            try:
                self.interrupt(group=True, timeout=20)
            except AssertionError:
                pass
        self._reader.join(5)
        self._log.close()


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def tiny_params(path: Path, **overrides) -> Path:
    """A user's parameter file (``/**`` like the shipped one): small, fast, counted exactly.

    tiny preset on the CPU, 2 scale frames, a window of 3, 2 camera iterations (what test_node.py
    uses: finite outputs with the random weights), reliable QoS so no frame is lost in DDS.
    """
    import yaml

    params = dict(model_preset="tiny", device="cpu", scale_frames=2, sliding_window=3, camera_iterations=2,
                  keyframe_interval=1, qos_reliability="reliable", diagnostics_period=0.5)
    params.update(overrides)
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": params}}))
    return path


class FrameStreamer:
    """A test node in this process: streams synthetic frames to the node and collects its outputs.

    Uses the demo's ``Listener`` (poses, odom, cache stats, frame statuses, /tf, /diagnostics) in its
    own rclpy context on the test's domain; a thread publishes one frame every ``period`` s while
    ``streaming`` is set.
    """

    def __init__(self, domain_id: int, image_topic: str, node_ns: str = "/lingbot_map", width: int = 64,
                 height: int = 48, period: float = 0.25, name: str = "lingbot_tools_test"):
        import rclpy
        from rclpy.context import Context

        from lingbot_map_ros.tools.node_client import Listener, SyntheticCamera

        self._rclpy = rclpy
        self.ctx = Context()
        rclpy.init(context=self.ctx, domain_id=domain_id)
        self.listener = Listener(node_ns, image_topic, context=self.ctx, name=name)
        self.rx = self.listener.rx
        self.camera = SyntheticCamera(width, height, seed=5)
        self.period = period
        self.sent: list[int] = []
        self.streaming = threading.Event()
        self._closing = threading.Event()
        self._index = 0
        self._stamp = 1_700_000_000 * 10**9
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from lingbot_map_ros.tools.node_client import image_message

        while not self._closing.is_set():
            if self.streaming.wait(0.1) and not self._closing.is_set():
                self._stamp += 50_000_000
                msg = image_message(self.camera.render(self._index), self._stamp, "tools_test_cam")
                self._index += 1
                self.sent.append(self._stamp)
                self.listener.pub.publish(msg)
                time.sleep(self.period)

    def wait_for(self, predicate, timeout: float) -> bool:
        return self.listener.wait_for(predicate, timeout)

    def poses_after(self, stamp: int) -> list[int]:
        with self.listener.lock:
            return sorted(s for s in self.rx.poses if s > stamp)

    def close(self) -> None:
        self._closing.set()
        self.streaming.clear()
        self._thread.join(5)
        self.listener.close()
        self._rclpy.shutdown(context=self.ctx)


def copy_tracked_tree(src: Path, dst: Path) -> int:
    """Copy what a fresh clone holds (``git ls-files``; plus new files not yet committed but not
    ignored, so a working tree with work in progress builds what it will commit) into ``dst``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=src,
                            capture_output=True, check=True, timeout=60).stdout.split(b"\0")
    count = 0
    for raw in listed:
        if not raw:
            continue
        rel = raw.decode()
        path = src / rel
        if not path.is_file():  # deleted in the working tree
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        count += 1
    return count


def python_of(script: Path) -> str:
    """The interpreter a generated executable runs with (its shebang)."""
    first = script.read_text().splitlines()[0]
    assert first.startswith("#!"), f"{script} has no shebang: {first!r}"
    return first[2:].strip()


__all__ = ["REPO", "VENV", "RosShell", "Result", "Background", "FrameStreamer", "require_ros_tools",
           "ros_tools_missing", "tiny_params", "wait_until", "copy_tracked_tree", "python_of"]
