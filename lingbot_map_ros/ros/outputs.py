"""What the node publishes for a frame that produced a pose, and the session's trajectory.

Runs on the inference thread, after the session returned a finite ``FrameResult``. First the
robot's frames and the scale decide where the result goes (``robot_frames.RobotFrames.place``): a
missing transform ends the frame NO_TRANSFORM, a scale still being estimated withholds its pose
outputs. Then ``~/pose``, ``~/odom``, ``~/path`` (throttled once it is long), ``/tf`` (one edge,
through tf2), ``~/depth``, the reconstruction outputs, all in ``world_frame`` and in the world's unit
(metres once a metric scale is locked), then the frame's PROCESSED status (through the ledger) and
its ``~/cache_stats``. The trajectory it keeps is what ``~/save_trajectory`` writes; both it and the
path restart with every session.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import threading
import time
from typing import TYPE_CHECKING, Optional

import numpy as np
from geometry_msgs.msg import PoseStamped
from nav_msgs.msg import Odometry, Path
from rclpy.qos import QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import Image
from std_msgs.msg import Header

from lingbot_map_ros.msg import CacheStats, FrameStatus

from ..core.settings import covariance_matrix
from . import messages as rosmsg
from .edge_publishers import EdgePublishers
from .frames import Frame, FrameLedger, stamp_sec
from .large_outputs import large_publisher
from .node_settings import SettingsSource
from .outbox import deferred, send_built, sending_batch
from .robot_frames import RobotFrames, Withheld
from .transforms import FrameTree, NoTransform

if TYPE_CHECKING:
    from ..core.results import FrameResult

FALLBACK_CAMERA_FRAME = "lingbot_camera"
PATH_EVERY_FRAME = 1000  # ~/path is sent with every pose while it holds at most this many poses,
PATH_MIN_PERIOD = 0.5  # then at most every this many seconds
# how long a "yes" to "does anyone read ~/path?" is reused: asking the middleware every frame costs the
# inference thread tens of microseconds. A "no" is asked again at the next frame (a reader that joins gets
# that frame's path); a reader that leaves is noticed this much later (the path meanwhile goes to nobody).
PATH_READERS_PERIOD = 0.5


def _path_message_of(stamp, world: str, poses: list) -> Path:
    """``~/path`` as a ``Path`` message from (frame id, ``pose_values``) pairs: where its bytes are not kept."""
    return rosmsg.path_message(Header(stamp=stamp, frame_id=world),
                               [rosmsg.pose_from_row(row, frame) for frame, row in poses])


@functools.lru_cache(maxsize=8)
def _covariance(diagonal: tuple) -> tuple:
    """``covariance_matrix`` of a ``*_covariance_diagonal`` parameter, once per value (it rarely changes)."""
    return tuple(covariance_matrix(diagonal))


def _pose_values(row) -> tuple:
    """A saved session's ``pose_row`` as ``rosmsg.pose_values`` gives it."""
    return (int(row[0]), int(row[1]), *(float(v) for v in row[2:9]))


class ResultPublisher:
    """The per-frame output topics, the bounded path and trajectory of the current session.

    ``recon`` (a ``ReconstructionPublisher``, set by the node between configure and cleanup)
    publishes depth confidence, camera info, points and the map after the pose. ``robot`` places
    each result in the TF tree and the world's unit (``depth``: the depth topic's pairing).
    """

    def __init__(self, node, settings: SettingsSource, ledger: FrameLedger, depth=None):
        self._node = node
        self._settings = settings
        self._ledger = ledger
        self.recon = None
        values = settings.current
        tree = FrameTree(node, repeat_period=float(values.transform_publish_period),
                         tolerance=lambda: float(settings.current.transform_tolerance))
        self.robot = RobotFrames(node, settings, tree, depth, publishers=EdgePublishers(node))
        reliable10 = QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE)
        # sent on the node's outbox thread (outbox.py), each frame's messages together and in order
        self._pose_pub = deferred(node, node.create_publisher(PoseStamped, "~/pose", reliable10))
        self._odom_pub = deferred(node, node.create_publisher(Odometry, "~/odom", reliable10))
        # the path grows past Fast DDS's 512 kB shared-memory segment (~6000 poses): see large_outputs
        self._path_pub = deferred(node, large_publisher(node, Path, "~/path", reliable10))
        self._stats_pub = deferred(node, node.create_publisher(CacheStats, "~/cache_stats", reliable10))
        self._depth_pub = deferred(node, large_publisher(node, Image, "~/depth", reliable10))  # large_outputs
        self._lock = threading.Lock()  # path and trajectory (inference thread <-> ~/save_trajectory)
        # the poses of ~/path: (frame id, rosmsg.pose_values) each
        self._path: collections.deque = collections.deque(maxlen=int(values.path_max_length))
        # each pose of _path serialized once (rosmsg.pose_bytes): a send joins them, it does not convert
        # every pose again (None: this middleware's bytes cannot be joined, Path messages are sent)
        self._path_bytes: Optional[collections.deque] = (collections.deque(maxlen=self._path.maxlen)
                                                         if rosmsg.path_bytes_agree() else None)
        # (stamp seconds, c2w) of the current session, bounded: a window-policy session never ends
        self._trajectory: collections.deque = collections.deque(maxlen=int(values.trajectory_max_length))
        self._path_last_pub = -1e9
        self._path_read_at = -1e9  # time.monotonic() when the middleware last said someone reads ~/path
        self._published_session: Optional[int] = None
        self._warned_no_frame_id = False

    def clear(self) -> None:
        """A new session (new world frame): the path and the trajectory start empty, the robot's world
        and scale start over."""
        with self._lock:
            self._path.clear()
            if self._path_bytes is not None:
                self._path_bytes.clear()
            self._trajectory.clear()
        self.robot.begin_session()

    def trajectory(self) -> tuple[list, Optional[int]]:
        """A copy of the current session's (stamp seconds, c2w) list and that session's id."""
        with self._lock:
            return list(self._trajectory), self._published_session

    def session_state(self) -> dict:
        """The trajectory and the path so far, the world frame and the robot's state, for a saved
        session (``~/save_session``)."""
        with self._lock:
            trajectory = [[float(t), np.asarray(m, np.float64).reshape(-1).tolist()] for t, m in self._trajectory]
            path = [list(row) for _, row in self._path]
        return {"world_frame": str(self._settings.current.world_frame), "trajectory": trajectory, "path": path,
                "robot": self.robot.session_state()}

    def restore_session(self, state: dict, session_id: int) -> None:
        """After a loaded session's start: ``~/path`` and ``~/save_trajectory`` continue from its poses."""
        poses = [(float(t), np.asarray(m, np.float64).reshape(4, 4)) for t, m in state.get("trajectory", [])]
        world = str(self._settings.current.world_frame)
        with self._lock:
            self._trajectory = collections.deque(poses, maxlen=int(self._settings.current.trajectory_max_length))
            self._path = collections.deque(((world, _pose_values(row)) for row in state.get("path", [])),
                                           maxlen=int(self._settings.current.path_max_length))
            if self._path_bytes is not None:
                self._path_bytes = collections.deque((rosmsg.pose_bytes(rosmsg.pose_from_row(row, frame))
                                                      for frame, row in self._path), maxlen=self._path.maxlen)
            self._published_session = session_id
        if state.get("robot"):
            self.robot.restore_session(state["robot"], session_id)

    def camera_frame(self, header: Header) -> str:
        if self._settings.current.camera_frame:
            return self._settings.current.camera_frame
        if header.frame_id:
            return header.frame_id
        if not self._warned_no_frame_id:
            self._warned_no_frame_id = True
            self._node.get_logger().warning(
                f"image header has no frame_id and camera_frame is empty: using '{FALLBACK_CAMERA_FRAME}'")
        return FALLBACK_CAMERA_FRAME

    def publish(self, r: FrameResult, manager) -> None:
        """Every output of the finite result ``r`` (its stamp is the ``Frame``), then PROCESSED: handed to the
        node's outbox thread as one piece (``outbox.py``)."""
        with sending_batch(self._node, ""):
            self._publish_frame(r, manager)

    def _publish_frame(self, r: FrameResult, manager) -> None:
        t0 = time.perf_counter()
        frame: Frame = r.stamp
        header = frame.header
        note = (r.frame_extra or {}).get("window_switch")
        if note:
            self._node.get_logger().info(f"long-run window {r.window_index}: {note}")
        values = self._settings.current
        session_id = manager.session_id
        if session_id != self._published_session:
            self.clear()
            self._published_session = session_id
        world = values.world_frame
        camera_frame = self.camera_frame(header)
        # what placing costs the inference thread: wall time and its own CPU time (the latter is not
        # inflated by other threads or processes taking the core or the GIL meanwhile)
        t_place, c_place = time.perf_counter(), time.thread_time()
        placed = self.robot.place(r, header, camera_frame, session_id)
        place_ms, place_cpu_ms = (time.perf_counter() - t_place) * 1e3, (time.thread_time() - c_place) * 1e3
        if isinstance(placed, NoTransform):  # the model has processed it; nothing of it can be placed
            frame.model_image = None
            self._ledger.finish(header, FrameStatus.NO_TRANSFORM, str(placed))
            return
        if isinstance(placed, Withheld):  # processed, no metric scale yet: its pose outputs are held back
            self.robot.record_cost(place_ms, place_cpu_ms)
            frame.model_image = None
            self._finish_processed(r, frame, session_id, manager, world, t0, note=placed.reason)
            return
        self.publish_body(placed.pose, header, placed.child, placed.twist, placed.tf)

        recon = self.recon
        depth = r.depth
        t_scale, c_scale = time.perf_counter(), time.thread_time()
        depth_wanted = any(bool(getattr(values, k)) for k in ("publish_depth", "publish_points", "publish_map"))
        if depth is not None and placed.depth_factor != 1.0 and depth_wanted:
            depth = (depth * np.float32(placed.depth_factor)).astype(np.float32)  # metres when metric
        self.robot.record_cost(place_ms + (time.perf_counter() - t_scale) * 1e3,
                               place_cpu_ms + (time.thread_time() - c_scale) * 1e3)
        if values.publish_depth and depth is not None:
            self._depth_pub.publish(rosmsg.depth_image(depth, header.stamp, camera_frame))
        if recon is not None:  # depth confidence, camera info, points, map (after the pose), in the world's unit
            recon.publish(dataclasses.replace(r, c2w=placed.camera, depth=depth), frame.model_image, header,
                          camera_frame, world)
        frame.model_image = None
        self._finish_processed(r, frame, session_id, manager, world, t0)

    def publish_body(self, pose_matrix: np.ndarray, header: Header, child: str, twist, tf) -> None:
        """``~/pose``, ``~/odom``, ``~/path``, the trajectory and the /tf edge of one placed pose (several
        cameras: the rig's body pose, from the driving camera)."""
        values = self._settings.current
        world = values.world_frame
        row = rosmsg.pose_values(pose_matrix, header.stamp)
        encoded = rosmsg.POSES.encode(world, row)
        self._pose_pub.publish(encoded)
        send_built(self._odom_pub, rosmsg.odometry_encoded, row, world, child, twist,
                   _covariance(tuple(values.pose_covariance_diagonal)),
                   _covariance(tuple(values.twist_covariance_diagonal)))

        with self._lock:
            if self._path.maxlen != int(values.path_max_length):
                self._path = collections.deque(self._path, maxlen=int(values.path_max_length))
                if self._path_bytes is not None:
                    self._path_bytes = collections.deque(self._path_bytes, maxlen=self._path.maxlen)
            self._path.append((world, row))
            if self._path_bytes is not None:
                self._path_bytes.append(encoded[rosmsg.ENCAPSULATION:] if isinstance(encoded, bytes)
                                        else rosmsg.pose_bytes(encoded))
            if self._trajectory.maxlen != int(values.trajectory_max_length):
                self._trajectory = collections.deque(self._trajectory, maxlen=int(values.trajectory_max_length))
            self._trajectory.append((stamp_sec(header.stamp), pose_matrix.copy()))
            path_build = None
            now = time.monotonic()
            # Sent with every pose up to PATH_EVERY_FRAME poses, then at most every PATH_MIN_PERIOD seconds
            # (and only when someone listens): the join of a long path's bytes is cheap, but its transport
            # (about 90 bytes a pose) is not, nor a Path message's conversion without them. Either is made on
            # the sending thread, from a copy of the list.
            if ((len(self._path) <= PATH_EVERY_FRAME or now - self._path_last_pub >= PATH_MIN_PERIOD)
                    and self._path_read(now)):
                if self._path_bytes is not None:
                    path_build = (rosmsg.path_bytes_of, header.stamp, world, self._path[0],
                                  list(self._path_bytes)[1:])
                else:
                    path_build = (_path_message_of, header.stamp, world, list(self._path))
                self._path_last_pub = now
        if path_build is not None:
            send_built(self._path_pub, *path_build)

        if tf is not None:
            # a correction (with base_frame) is re-sent between frames; a camera pose is not (it is a
            # measurement at its image stamp, not a transform that holds until the next frame)
            self.robot.tree.send(tf[0], tf[1], header.stamp, tf[2], repeat=bool(values.base_frame))

    def _path_read(self, now: float) -> bool:
        """Whether anyone reads ``~/path``: a "yes" of the middleware is reused for ``PATH_READERS_PERIOD`` s."""
        if now - self._path_read_at < PATH_READERS_PERIOD:
            return True
        if self._path_pub.get_subscription_count() > 0:
            self._path_read_at = now
            return True
        return False

    def _finish_processed(self, r: FrameResult, frame: Frame, session_id: int, manager, world: str, t0: float,
                          note: str = "") -> None:
        """PROCESSED (through the ledger, with ``note`` when outputs were withheld), then ~/cache_stats."""
        header = frame.header
        publish_ms = (time.perf_counter() - t0) * 1e3
        counts, overhead_ms = self._ledger.processed(r, frame, session_id, publish_ms, note)
        send_built(self._stats_pub, rosmsg.cache_stats_encoded, r, header.stamp, world, session_id, counts,
                   overhead_ms, manager.host.info)
