"""Every ```bash block of README.md runs here, in order, as a user would type it: in bash, with the venv
activated (``source .venv/bin/activate``, nothing of the test's own environment leaking in), DDS
discovery on loopback, a ROS_DOMAIN_ID of its own and ROS_LOG_DIR / ROS_HOME / TMPDIR in a temporary
folder (``rostools.RosShell``). Blocks share one scratch working folder, so a file one block writes
is there for the next. So the README cannot go stale: a command that stops working, an option that
is renamed or a sample output that changes fails this test.

Annotation language
-------------------
An HTML comment on the line right above a block's opening fence says how to run it:

    <!-- readme-test: DIRECTIVE DIRECTIVE ... -->

Directives are shell words (quote a value with spaces):

``skip="REASON"``
    Not run here (a system ROS install: apt, rosdep, a robot's drivers); reported as a skip with the
    reason. ``MAX_SKIPS`` bounds how many blocks may say so.
``needs=NAME[,NAME]``
    Create these inputs in the scratch folder first (once): ``tum`` = a TUM RGB-D sequence,
    ``TUM-RGBD/rgbd_dataset_freiburg1_xyz/`` with ``rgb/<stamp>.png`` and ``groundtruth.txt`` (the
    demo's synthetic camera, 12 frames, its true poses); ``bag`` = ``recording/``, a rosbag2 (mcap) of the same
    frames on ``/camera/color/image_raw``.
``cwd=repo``
    Run in the repository root instead of the scratch folder.
``background=NAME``
    Start the block (one command) in its own process group and go on while it runs.
``wait=REGEX``
    With ``background``: wait until a line of its output matches REGEX.
``stop=NAME[,NAME]``
    After the block: SIGINT to each NAME's process group (what Ctrl-C does); it must exit 0.
``each-line``
    Run every command line on its own. A ``ros2`` verb that answers that it did not discover the
    node in time ("Node not found") is run again after a pause, for at most 60 s, as a user would.
``timeout=SECONDS``
    For the block, or each line (default 240).
``exit=N``
    The exit code the block must end with (default 0).

In a block, a comment ``# -> TEXT`` at the end of a command line is a sample of its output: the
output (of that line with ``each-line``, else of the whole block) must contain TEXT.

Blocks without an annotation run in the foreground in the scratch folder and must exit 0.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rostools import REPO, VENV, Background, RosShell, discovery_missed, ros_tools_missing

README = REPO / "README.md"
MAX_SKIPS = 6  # blocks that truly cannot run here; keep them few
DEFAULT_TIMEOUT = 240.0
DIRECTIVES = {"skip", "needs", "cwd", "background", "wait", "stop", "each-line", "timeout", "exit"}
FIXTURES = {"tum", "bag"}
ANNOTATION = re.compile(r"^<!--\s*readme-test:(.*?)-->\s*$")
SAMPLE = re.compile(r"\s#\s->\s(?P<text>.*?)\s*$")
TUM_SEQUENCE = "TUM-RGBD/rgbd_dataset_freiburg1_xyz"
BAG = "recording"
BAG_TOPIC = "/camera/color/image_raw"
FIXTURE_FRAMES = 12


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    code: str
    options: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        first = next((ln for ln in self.code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
        words = re.sub(r"[^A-Za-z0-9_.:/=-]+", " ", first).split()[:4]
        return f"L{self.line}-" + "-".join(words)

    def commands(self) -> list[str]:
        """Logical command lines: backslash continuations joined, blank and comment-only lines left out."""
        out, current = [], ""
        for raw in self.code.splitlines():
            if not current and (not raw.strip() or raw.lstrip().startswith("#")):
                continue
            if raw.rstrip().endswith("\\"):
                current += raw.rstrip()[:-1] + " "
                continue
            out.append(current + raw)
            current = ""
        if current:
            out.append(current)
        return out


def parse_annotation(text: str) -> dict:
    """``<!-- readme-test: ... -->`` words -> {directive: value}; an unknown directive is an error."""
    options: dict = {}
    for word in shlex.split(text):
        key, _, value = word.partition("=")
        if key not in DIRECTIVES:
            raise ValueError(f"unknown readme-test directive {key!r} (known: {sorted(DIRECTIVES)})")
        options[key] = value if value else True
    return options


def parse_blocks(text: str) -> list[Block]:
    """The ```bash blocks of ``text`` with the annotation right above each."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            start, body = i, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            options = {}
            if start > 0:
                m = ANNOTATION.match(lines[start - 1].strip())
                if m:
                    options = parse_annotation(m.group(1))
            blocks.append(Block(start + 1, "\n".join(body), options))
        i += 1
    return blocks


BLOCKS = parse_blocks(README.read_text(encoding="utf-8"))


def samples(code: str) -> list[str]:
    return [m.group("text") for line in code.splitlines() if (m := SAMPLE.search(line))]


# ------------------------------------------------------------------------------------ static checks (fast)


def test_readme_has_bash_blocks_and_valid_annotations():
    assert len(BLOCKS) >= 10, "README.md has (almost) no bash blocks"
    started: set[str] = set()
    for b in BLOCKS:
        o = b.options
        assert set(o.get("needs", "").split(",")) - {""} <= FIXTURES, (b.id, o)
        assert o.get("cwd", "repo") == "repo", (b.id, o)
        if "skip" in o:
            assert isinstance(o["skip"], str) and len(o["skip"]) > 10, f"{b.id}: a skip needs its reason"
            assert set(o) == {"skip"}, f"{b.id}: skip takes no other directive"
        if "wait" in o:
            assert "background" in o, f"{b.id}: wait needs background"
        if "background" in o:
            assert len(b.commands()) == 1, f"{b.id}: a background block is one command"
            assert o["background"] not in started, f"{b.id}: {o['background']} started twice"
            started.add(o["background"])
        for name in filter(None, str(o.get("stop", "")).split(",")):
            assert name in started, f"{b.id}: stops {name}, which no earlier block started"
            started.discard(name)
    assert not started, f"background blocks never stopped: {started}"


def test_skips_are_few_and_say_why():
    skipped = [b for b in BLOCKS if "skip" in b.options]
    assert len(skipped) <= MAX_SKIPS, [b.id for b in skipped]


def test_parser_reads_annotations_continuations_and_samples():
    text = ("x\n<!-- readme-test: background=node wait='ready: active' -->\n```bash\nros2 run a b \\\n"
            "    --ros-args -p x:=1   # -> hello there\n```\n```bash\n# comment\necho hi\n```\n")
    first, second = parse_blocks(text)
    assert first.options == {"background": "node", "wait": "ready: active"} and first.line == 3
    assert first.commands() == ["ros2 run a b      --ros-args -p x:=1   # -> hello there"]
    assert samples(first.code) == ["hello there"]
    assert second.options == {} and second.commands() == ["echo hi"]
    with pytest.raises(ValueError, match="unknown readme-test directive"):
        parse_annotation("bakground=x")


# ------------------------------------------------------------------------------------ running the blocks


def write_fixtures(names: set[str], folder: Path) -> None:
    """The inputs ``needs=`` asks for (see the module docstring)."""
    import numpy as np

    from lingbot_map_ros.core.geometry import quaternion_xyzw_from_matrix
    from lingbot_map_ros.tools.node_client import SyntheticCamera

    camera = SyntheticCamera(320, 240, seed=3)
    stamps = 1305031102.175304 + np.arange(FIXTURE_FRAMES) / 10.0
    frames = [camera.render(i) for i in range(FIXTURE_FRAMES)]
    if "tum" in names:
        import cv2

        seq = folder / TUM_SEQUENCE
        (seq / "rgb").mkdir(parents=True, exist_ok=True)
        lines = ["# ground truth trajectory (the synthetic camera's true poses)", "# timestamp tx ty tz qx qy qz qw"]
        for i, (stamp, rgb) in enumerate(zip(stamps, frames)):
            assert cv2.imwrite(str(seq / "rgb" / f"{stamp:.6f}.png"), rgb[:, :, ::-1])
            c2w = camera.pose(i)
            pose = (*c2w[:3, 3], *quaternion_xyzw_from_matrix(c2w[:3, :3]))
            lines.append(f"{stamp:.6f} " + " ".join(f"{v:.9f}" for v in pose))
        (seq / "groundtruth.txt").write_text("\n".join(lines) + "\n")
    if "bag" in names:
        from lingbot_map_ros.tools.bag_io import write_image_bag

        write_image_bag(folder / BAG, frames, list(stamps), storage="mcap", topic=BAG_TOPIC,
                        frame_id="camera_color_optical_frame")


@dataclass
class Result:
    returncode: int
    output: str
    seconds: float


class Runner:
    """The state the blocks share: one shell, one scratch folder, the background processes."""

    def __init__(self, shell: RosShell):
        self.shell = shell
        self.scratch = shell.tmp
        self.background: dict[str, Background] = {}
        self.made: set[str] = set()
        self.timings: list[tuple[str, float]] = []

    def script(self, code: str) -> str:
        return "\n".join(["set -e", f"source {shlex.quote(str(VENV / 'bin' / 'activate'))}", code])

    def foreground(self, code: str, cwd: Path, timeout: float) -> Result:
        t0 = time.monotonic()
        proc = subprocess.Popen(["bash", "-c", self.script(code)], env=self.shell.env(), cwd=str(cwd),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate(timeout=10)
            pytest.fail(f"did not finish within {timeout:.0f} s:\n{code}\n--- output:\n{out[-4000:]}")
        return Result(proc.returncode, out, time.monotonic() - t0)

    def line_with_discovery_retry(self, command: str, cwd: Path, timeout: float) -> Result:
        """One command line; a ros2 verb that missed the node in discovery is asked again (60 s at most)."""
        deadline, pause = time.monotonic() + 60.0, 0.5
        while True:
            res = self.foreground(command, cwd, timeout)
            missed = discovery_missed(res)  # type: ignore[arg-type]
            # a list verb that has not discovered the node yet exits 0 with its line missing
            listed = " list" in command and res.returncode == 0
            missed = missed or (listed and not all(text in res.output for text in samples(command)))
            if not (command.lstrip().startswith("ros2 ") and missed) or time.monotonic() + pause >= deadline:
                return res
            time.sleep(pause)
            pause = min(2 * pause, 4.0)

    def run(self, block: Block) -> None:
        o = block.options
        cwd = REPO if o.get("cwd") == "repo" else self.scratch
        timeout = float(o.get("timeout", DEFAULT_TIMEOUT))
        needs = set(filter(None, str(o.get("needs", "")).split(","))) - self.made
        if needs:
            write_fixtures(needs, self.scratch)
            self.made |= needs
        t0 = time.monotonic()
        try:
            if "background" in o:
                name = o["background"]
                proc = Background(block.commands()[0], self.shell, name, cwd)
                self.background[name] = proc
                if "wait" in o:
                    proc.wait_for(o["wait"], timeout)
            elif "each-line" in o or len(block.commands()) == 1:  # one line: a ros2 verb may miss discovery
                for command in block.commands():
                    res = self.line_with_discovery_retry(command, cwd, timeout)
                    self.check(command, res, int(o.get("exit", 0)))
            else:
                self.check(block.code, self.foreground(block.code, cwd, timeout), int(o.get("exit", 0)))
        finally:
            # a failed block still stops what it names: a node left running would answer the next
            # block's commands under the same name (a second failure that is only this one's echo)
            for name in filter(None, str(o.get("stop", "")).split(",")):
                if name in self.background:
                    self.stop(name)
        self.timings.append((block.id, time.monotonic() - t0))

    def check(self, code: str, res: Result, exit_code: int) -> None:
        assert res.returncode == exit_code, (f"exit code {res.returncode} (README expects {exit_code}):\n{code}\n"
                                             f"--- output:\n{res.output[-4000:]}")
        for text in samples(code):
            assert text in res.output, (f"the README's sample output {text!r} is not in what it printed:\n{code}\n"
                                        f"--- output:\n{res.output[-4000:]}")

    def stop(self, name: str) -> None:
        proc = self.background.pop(name)
        rc = proc.interrupt(group=True)
        try:
            assert rc == 0, f"{name} exited {rc} on SIGINT:\n{proc.output()[-4000:]}"
        finally:
            proc.close()

    def close(self) -> None:
        for name in list(self.background):
            proc = self.background.pop(name)
            proc.close()
        self.shell.stop_daemon()


@pytest.fixture(scope="module")
def runner(tmp_path_factory, new_domain_id):
    reason = ros_tools_missing()
    if reason:
        pytest.skip(reason)
    r = Runner(RosShell(new_domain_id(), tmp_path_factory.mktemp("readme")))
    yield r
    r.close()
    total = sum(s for _, s in r.timings)
    times = ", ".join(f"{name} {s:.0f}s" for name, s in r.timings)
    print(f"\n[readme] block times: {times}; total {total:.0f} s")


@pytest.mark.slow
@pytest.mark.ros
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block(runner: Runner, block: Block):
    if "skip" in block.options:
        pytest.skip(f"README line {block.line}: {block.options['skip']}")
    runner.run(block)


# ------------------------------------------------------------------------------------ ros2 CLI flags


def ros2_lines() -> list[str]:
    return [c for b in BLOCKS if "skip" not in b.options for c in b.commands() if c.lstrip().startswith("ros2 ")]


@pytest.mark.slow
@pytest.mark.ros
def test_ros2_verbs_carry_no_daemon_and_spin_time(runner: Runner):
    """Each README ``ros2 VERB SUB`` has ``--no-daemon --spin-time 2`` when the verb has those options
    (``ros2 VERB SUB --help``): what the tests run is what the README says."""
    checked: dict[str, tuple[bool, bool]] = {}
    for line in ros2_lines():
        words = line.split()
        verb = " ".join(words[:3])
        if verb not in checked:
            help_text = runner.foreground(f"{verb} --help", runner.scratch, 60).output
            checked[verb] = ("--no-daemon" in help_text, "--spin-time" in help_text)
        has_daemon, has_spin = checked[verb]
        if has_daemon:
            assert "--no-daemon" in words, f"README: {line!r} lacks --no-daemon"
        if has_spin:
            assert re.search(r"--spin-time 2\b", line), f"README: {line!r} lacks --spin-time 2"
    assert checked, "no ros2 command in the README"
