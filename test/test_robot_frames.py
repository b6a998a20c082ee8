"""RobotFrames (ros/robot_frames.py) on real results of a long run, without a ROS graph.

A tiny-model session with the window policy switches windows every few frames. The depth camera
is played by the test: its depth is K times the published (chained-world) depth in the first
window. After the first switch it is K2 times, as if the chain's Sim(3) fit had been off by K2/K.
The scale must lock at K, re-estimate at every switch (state "re-estimating", the locked scale
still applied), re-lock at K2, and keep the new window's first position where the old scale had
put it. Poses after the re-lock must be ``K2 (x - anchor) + K anchor``.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("tf2_ros")
torch = pytest.importorskip("torch")
from std_msgs.msg import Header  # noqa: E402

from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig  # noqa: E402
from lingbot_map_ros.core.preprocess import FramePreprocessor  # noqa: E402
from lingbot_map_ros.core.scale import DEPTH_SAMPLE_STRIDE, LOCKED, RE_ESTIMATING  # noqa: E402
from lingbot_map_ros.core.session_manager import SessionManager  # noqa: E402
from lingbot_map_ros.core.settings import defaults  # noqa: E402
from lingbot_map_ros.ros.depth_io import RefusedDepth  # noqa: E402
from lingbot_map_ros.ros.node_settings import FixedSettings, NodeSettings  # noqa: E402
from lingbot_map_ros.ros.robot_frames import Placement, RobotFrames, Withheld  # noqa: E402
from lingbot_map_ros.tools.node_client import SyntheticCamera  # noqa: E402

K, K2 = 2.5, 2.75


class _Log:
    def __init__(self):
        self.lines = []

    def warning(self, text, **_):
        self.lines.append(("warning", text))

    def info(self, text, **_):
        self.lines.append(("info", text))

    def error(self, text, **_):
        self.lines.append(("error", text))


class _Node:
    def __init__(self):
        self.log = _Log()

    def get_logger(self):
        return self.log


class _Tree:
    """No robot transforms are needed in camera mode; nothing has a parent."""

    def parent_of(self, child):
        return None

    def claim(self, parent, child):
        pass


class _Depth:
    def __init__(self):
        self.grids = {}

    def take(self, header):
        return self.grids.pop((header.stamp.sec, header.stamp.nanosec), None)

    def report(self):
        return {}, ""


def test_window_switches_re_estimate_the_scale_without_a_jump(one_torch_thread):
    values = dict(defaults(), scale_source="depth", scale_min_samples=2, publish_tf=False)
    depth = _Depth()
    node = _Node()
    robot = RobotFrames(node, FixedSettings(NodeSettings.from_values(values)), _Tree(), depth)
    stream = StreamConfig(scale_frames=2, sliding_window=3, camera_iterations=1, with_depth=True,
                          long_run_policy="window", max_stored_frames=6, overlap_frames=2)
    session = SessionManager.open(RuntimeConfig(model_preset="tiny", device="cpu"), stream, log=lambda m: None)
    cam = SyntheticCamera(64, 48, seed=2)
    pre = FramePreprocessor()
    robot.begin_session()
    placed: list[tuple[object, object]] = []
    states = []
    for i in range(22):
        header = Header()
        header.stamp.sec, header.stamp.nanosec = 1000 + i // 10, (i % 10) * 100_000_000
        for r in session.push(pre(cam.render(i)), stamp=header):
            h = r.stamp
            s = DEPTH_SAMPLE_STRIDE
            grid = r.depth[s // 2 :: s, s // 2 :: s] * (K if r.window_index == 0 else K2)
            depth.grids[(h.stamp.sec, h.stamp.nanosec)] = grid.astype(np.float32)
            out = robot.place(r, h, "cam", session_id=1)
            placed.append((r, out))
            states.append((r.window_index, robot.scale.status().state))
    windows = sorted({r.window_index for r, _ in placed})
    assert len(windows) >= 3, windows
    assert isinstance(placed[0][1], Withheld) and isinstance(placed[1][1], Placement)  # locked at the 2nd keyframe
    assert (1, RE_ESTIMATING) in states and states[-1][1] == LOCKED
    status = robot.scale.status()
    assert status.value == pytest.approx(K2) and status.relocks >= 1

    first_w1 = next(k for k, (r, _) in enumerate(placed) if r.window_index == 1)
    anchor = placed[first_w1][0].c2w[:3, 3]
    for k, (r, out) in enumerate(placed):
        assert isinstance(out, Placement) or k == 0
        if k == 0:
            continue
        x = r.c2w[:3, 3]
        if r.window_index == 0 or k == first_w1:  # the old scale, from the origin
            np.testing.assert_allclose(out.pose[:3, 3], K * x, rtol=1e-9, atol=1e-12)
            assert out.depth_factor == pytest.approx(K)
        elif r.window_index == 1 and out.depth_factor == pytest.approx(K2):  # re-locked: continuous at the anchor
            np.testing.assert_allclose(out.pose[:3, 3], K2 * (x - anchor) + K * anchor, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(out.pose[:3, :3], r.c2w[:3, :3], atol=1e-12)
    # the window-1 frames after its second keyframe carry K2
    assert any(r.window_index == 1 and out.depth_factor == pytest.approx(K2) for r, out in placed[first_w1 + 1:])
    assert not [line for line in node.log.lines if line[0] == "error"]


def test_a_refused_depth_partner_ends_the_keyframes_wait_at_once(one_torch_thread):
    """A keyframe waits up to tf_timeout for a depth partner that has not arrived (the middleware may
    deliver a large image late), but not for one that came and was refused: its sample is a miss at
    once, with the refusal's reason. Then the next keyframes still lock the scale."""
    values = dict(defaults(), scale_source="depth", scale_min_samples=2, publish_tf=False, tf_timeout=30.0)
    depth = _Depth()
    robot = RobotFrames(_Node(), FixedSettings(NodeSettings.from_values(values)), _Tree(), depth)
    stream = StreamConfig(scale_frames=2, sliding_window=3, camera_iterations=1, with_depth=True)
    session = SessionManager.open(RuntimeConfig(model_preset="tiny", device="cpu"), stream, log=lambda m: None)
    cam = SyntheticCamera(64, 48, seed=2)
    pre = FramePreprocessor()
    robot.begin_session()
    outcomes, waits = [], []
    for i in range(3):
        header = Header()
        header.stamp.sec = 1000 + i
        for r in session.push(pre(cam.render(i)), stamp=header):
            key = (r.stamp.stamp.sec, r.stamp.stamp.nanosec)
            s = DEPTH_SAMPLE_STRIDE
            grid = (r.depth[s // 2 :: s, s // 2 :: s] * K).astype(np.float32)
            depth.grids[key] = RefusedDepth("depth encoding '8UC1' is not supported") if key[0] == 1000 else grid
            start = time.monotonic()
            outcomes.append(robot.place(r, r.stamp, "cam", session_id=1))
            waits.append(time.monotonic() - start)
    assert max(waits) < 10.0, waits  # far below the 30 s a missing partner would be awaited
    assert robot.scale.rejected["depth image refused"] == 1, robot.scale.rejected
    assert [type(o) for o in outcomes] == [Withheld, Withheld, Placement]  # frames 1 and 2 lock it
    assert robot.scale.status().value == pytest.approx(K)
