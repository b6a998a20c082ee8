"""A robot's recording offline: ``lingbot_map_offline --bag --base-frame ... --depth-topic ...``.

The bag's ``/tf`` and ``/tf_static`` fill a ``transforms.FrameTree`` (without a node: nothing is
published) and its depth topic answers the depth scale's ``take(header)``, so each result goes through
the node's own ``robot_frames.RobotFrames.place``: the same frames, the same scale estimator, the same
algebra as ``lingbot_map_node`` on the robot (one path; ``lingbot_map_replay`` feeds the node the same
bag). Several cameras of one recording (``--topic A --topic B --base-frame ...``): ``BagRig``, each
camera's ``RobotFrames`` then the node's ``core.rig.Rig``, the one world and the one body pose of
``ros/cameras.py``. Nothing here needs a ROS graph.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Optional

import numpy as np
from builtin_interfaces.msg import Time as TimeMsg
from rclpy.serialization import deserialize_message
from std_msgs.msg import Header
from tf2_msgs.msg import TFMessage

from ..core.config import planned_height
from ..core.rig import Rig, RigPlacement
from ..ros.depth_io import BadDepth, GridCache, compressed_depth_grid, image_depth_grid
from ..ros.node_settings import FixedSettings, NodeSettings
from ..ros.robot_frames import Placement, RobotFrames, Withheld
from ..ros.transforms import FrameTree, NoTransform
from .bag_io import iter_robot_messages, message_cdr, tf_topics

TREE_MARGIN_S = 60.0  # the tree keeps every transform of the recording (tf2 drops what is older than its cache)


class _Log:
    """``node.get_logger()`` for RobotFrames: its warnings and errors go to the tool's ``say``."""

    def __init__(self, say: Callable[[str], None]):
        self._say = say

    def info(self, text, **_):
        self._say(text)

    warning = error = info

    def get_logger(self):
        return self


def _header(stamp_ns: int, frame_id: str) -> Header:
    sec, nanosec = divmod(int(stamp_ns), 10**9)
    return Header(stamp=TimeMsg(sec=sec, nanosec=nanosec), frame_id=frame_id)


class BagDepth:
    """The depth topic of the bag, paired with colour stamps as the node pairs them (within
    ``depth_sync_slop``), decoded to the scale's grid by the node's ``depth_io``. Results come in stamp
    order, so the depth messages are read once, in order, keeping only those not yet passed."""

    def __init__(self, bag: str, topic: str, values: Mapping, colour_wh: Callable[[], tuple[int, int]]):
        self._messages: Iterator = iter_robot_messages(bag, {topic: "depth"})
        self._pending: list = []  # (stamp ns, message) read but not yet paired
        self._slop_ns = int(float(values["depth_sync_slop"]) * 1e9)
        self._grid = GridCache(width=lambda: int(values.get("image_width", 518)),
                               max_height=lambda: planned_height(int(values.get("image_width", 518)),
                                                                 float(values.get("camera_aspect", 0.0))))
        self._colour_wh = colour_wh
        self.counts: dict[str, int] = {}
        self.problem = ""

    def take(self, header) -> Optional[object]:
        ns = int(header.stamp.sec) * 10**9 + int(header.stamp.nanosec)
        while not self._pending or self._pending[-1][0] <= ns + self._slop_ns:
            item = next(self._messages, None)
            if item is None:
                break
            self._pending.append((item[5], item[3]))
        self._pending = [p for p in self._pending if p[0] >= ns - self._slop_ns]
        near = [p for p in self._pending if abs(p[0] - ns) <= self._slop_ns]
        if not near:
            return None
        stamp, msg = min(near, key=lambda p: abs(p[0] - ns))
        self._pending.remove((stamp, msg))
        try:
            if hasattr(msg, "format"):
                return compressed_depth_grid(msg, self._colour_wh(), self._grid)
            return image_depth_grid(msg, self._colour_wh(), self._grid)
        except BadDepth as exc:
            self.counts[f"bad_{exc.kind}"] = self.counts.get(f"bad_{exc.kind}", 0) + 1
            self.problem = str(exc)
            return None

    def report(self) -> tuple[dict, str]:
        return dict(self.counts), self.problem


def bag_tree(bag: str, duration_s: float) -> FrameTree:
    """The recording's ``/tf`` and ``/tf_static`` in a node-less ``FrameTree`` that keeps all of it."""
    tree = FrameTree(None, buffer_seconds=duration_s + TREE_MARGIN_S)
    topics = {t: ("tf_static" if t == "/tf_static" else "tf") for t in tf_topics(bag)}
    for kind, _, msgtype, msg, raw, _ in iter_robot_messages(bag, topics):  # as the node's listener gets them
        tf = deserialize_message(message_cdr(msg, msgtype, raw), TFMessage)
        tree.take(tf.transforms, static=kind == "tf_static")
    return tree


class BagRobot:
    """Places offline results in the recording's TF tree and unit, through ``RobotFrames``."""

    def __init__(self, bag: str, values: Mapping, camera_frame: str, depth_topic: str,
                 colour_wh: Callable[[], tuple[int, int]], say: Callable[[str], None], duration_s: float):
        self.values = values
        self.camera_frame = camera_frame
        self.tree = bag_tree(bag, duration_s)
        self.depth = BagDepth(bag, depth_topic, values, colour_wh) if depth_topic else None
        self.robot = RobotFrames(_Log(say), FixedSettings(NodeSettings.from_values(values)), self.tree, self.depth)
        self.placed: dict[int, Placement] = {}  # stamp ns -> what the node would publish
        self.withheld: dict[int, str] = {}  # stamp ns -> why not (scale estimating, missing transform)

    def place(self, r) -> None:
        ns = r.stamp.ns
        out = self.robot.place(r, _header(ns, self.camera_frame), self.camera_frame, r.session_id)
        if isinstance(out, Placement):
            self.placed[ns] = out
        else:
            self.withheld[ns] = out.reason if isinstance(out, Withheld) else str(out)

    def scale(self):
        return self.robot.scale.status()


@dataclass(frozen=True)
class BodyPose:
    """One body pose of the rig: what ``~/pose`` carries for the frame of ``camera`` at ``stamp_ns``."""

    stamp_ns: int
    pose: np.ndarray  # [4, 4] T_world_base
    camera: str  # the camera that drove it


class BagRig:
    """Several cameras of a recording placed as the several-camera node places them (``ros/cameras.py``):
    each camera's result through its own ``RobotFrames`` (``base_frame -> its camera frame`` at the image
    stamp from the bag's TF, its own world and scale, no /tf edge of its own), then through one
    ``core.rig.Rig`` (the one world, the anchoring of later streams by the held body pose, the primary
    camera driving the body pose, the hand-over). The rig's clock is the image stamp: a camera counts as
    stalled when ``camera_timeout`` seconds of stamps pass without a placed frame of it (the node counts
    wall time, which only agrees with stamps when it keeps up with every camera)."""

    def __init__(self, bag: str, values: Mapping, camera_frames: Mapping[str, str], primary: str,
                 say: Callable[[str], None], duration_s: float):
        self.values = values
        self.camera_frames = dict(camera_frames)
        self.tree = bag_tree(bag, duration_s)
        mine = FixedSettings(NodeSettings.from_values({**values, "publish_tf": False}))  # the rig's body: one /tf edge
        self.frames = {n: RobotFrames(_Log(say), mine, self.tree) for n in self.camera_frames}
        self.rig = Rig(list(self.camera_frames), primary, float(values["camera_timeout"]),
                       unit_from_primary=str(values["scale_source"]) == "model",
                       min_travel=float(values["scale_min_travel"]))
        self._say = say
        self.placed: dict[str, dict[int, RigPlacement]] = {n: {} for n in self.camera_frames}
        self.withheld: dict[str, dict[int, str]] = {n: {} for n in self.camera_frames}
        self.body: list[BodyPose] = []  # ~/pose, in the order the node publishes it
        self.handovers: list[tuple[int, str]] = []  # (stamp ns, "rear drives: front stalled")

    def begin_stream(self, name: str) -> None:
        """Camera ``name`` started a new session: new robot frames, anchored again (the node's listener)."""
        self.frames[name].begin_session()
        self.rig.begin_stream(name)

    def place(self, name: str, r) -> None:
        """Camera ``name``'s result ``r`` (its stamp carries the header's ``ns``) into the one world."""
        ns = r.stamp.ns
        if r.non_finite_fields():  # the node publishes nothing of it
            self.withheld[name][ns] = "non-finite model output"
            return
        header = _header(ns, self.camera_frames[name])
        placed = self.frames[name].place(r, header, self.camera_frames[name], r.session_id)
        if isinstance(placed, (NoTransform, Withheld)):
            self.withheld[name][ns] = placed.reason if isinstance(placed, Withheld) else str(placed)
            return
        t = header.stamp.sec + header.stamp.nanosec * 1e-9  # seconds as the node's frames.stamp_sec
        out = self.rig.place(name, t, placed.pose, placed.camera, t, placed.base_in_odom)
        if isinstance(out, str):
            self.withheld[name][ns] = out
            return
        self.placed[name][ns] = out
        if out.handed_over:
            self.handovers.append((ns, out.handed_over))
            self._say(f"hand-over at {t:.9f}: {out.handed_over}")
        if out.drives and out.published_body is not None:
            self.body.append(BodyPose(ns, out.published_body, name))


__all__ = ["BagDepth", "BagRig", "BagRobot", "BodyPose", "NoTransform", "bag_tree"]
