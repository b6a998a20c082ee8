"""The node's ROS interfaces as one table: every topic it subscribes to or publishes, every service it
offers and every TF edge it broadcasts, with the type, the QoS, when it is used and what it carries.

Why a table of its own: the README's topic, service and TF tables are generated from it
(``scripts/readme_tables.py``), and ``test/test_interfaces.py`` starts the real node and checks that
its publishers, subscriptions and services are exactly these rows (names, types, reliability,
durability), so the documentation cannot drift from the node. The publishers themselves are created
where they are used (``outputs.py``, ``reconstruction.py``, ``frames.py``, ``node.py``,
``services.py``, ``intake.py``); this module only describes them.

Plain data: no rclpy, so the README generator runs anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

NODE_NAME = "lingbot_map"
CAMERA = "<name>"  # a per-camera row's placeholder for each name of the setting ``cameras``

# QoS of a row, as the README shows it. "qos_reliability": the image subscription follows that parameter.
QOS_TEXT = {
    "reliable": "reliable",
    "latched": "reliable, transient local (latched)",
    "qos_reliability": "`qos_reliability`: best effort (sensor data, default) or reliable",
    "": "",
}


@dataclass(frozen=True)
class Endpoint:
    """One topic or service of the node."""

    kind: str  # "subscription", "publisher" or "service"
    name: str  # as the node names it: relative ("image"), private ("~/pose") or absolute ("/tf")
    type: str  # ROS type, e.g. "sensor_msgs/msg/Image"
    qos: str  # a key of QOS_TEXT ("" for services)
    when: str  # when it carries something
    what: str
    # The endpoint exists only while every (setting, value) pair holds (empty: whatever the settings).
    only_if: tuple[tuple[str, object], ...] = ()
    # True: created by configure and removed by cleanup (the model's outputs and the image input);
    # False: from the node's start to its end, in every lifecycle state.
    configured_only: bool = False
    # True: one per camera of the setting ``cameras`` (``<name>`` in ``name`` stands for each camera's
    # name); the row exists only when ``cameras`` is set.
    per_camera: bool = False
    # True: the single camera's input, which the per-camera rows replace when ``cameras`` is set.
    without_cameras: bool = False
    # True: a large message, published by the node's second participant ``<node>_large_outputs`` so that it
    # cannot delay the node's poses and /tf (``large_outputs.py``).
    large: bool = False

    def exists_with(self, values: Mapping[str, object]) -> bool:
        if (self.per_camera and not values.get("cameras")) or (self.without_cameras and values.get("cameras")):
            return False
        return all(values.get(name) == value for name, value in self.only_if)

    def names_with(self, values: Mapping[str, object]) -> list[str]:
        """The endpoint's names with these settings: one per camera for a per-camera row (none when it does
        not exist)."""
        if not self.exists_with(values):
            return []
        if self.per_camera:
            return [self.name.replace(CAMERA, str(camera)) for camera in values.get("cameras") or []]
        return [self.name]


ENDPOINTS: tuple[Endpoint, ...] = (
    # --- in
    Endpoint("subscription", "image", "sensor_msgs/msg/Image", "qos_reliability",
             "`image_transport: raw` (default), `cameras` empty",
             "the camera: rgb8, bgr8, rgba8, bgra8, mono8 and their 16-bit forms; bayer and yuv422 through "
             "cv_bridge. Remap it: `-r image:=/camera/color/image_raw`",
             only_if=(("image_transport", "raw"),), configured_only=True,
             without_cameras=True),
    Endpoint("subscription", "image/compressed", "sensor_msgs/msg/CompressedImage", "qos_reliability",
             "`image_transport: compressed`, `cameras` empty",
             "JPEG or PNG. Remapping `image` also moves `image/compressed`, as image_transport does",
             only_if=(("image_transport", "compressed"),), configured_only=True,
             without_cameras=True),
    Endpoint("subscription", "depth", "sensor_msgs/msg/Image", "qos_reliability",
             "`scale_source: depth` with `image_transport: raw`, `cameras` empty",
             "a depth image registered to the colour image (16UC1 mm or 32FC1 m), paired by stamp "
             "(`depth_sync_slop`): the metric scale. Remap it to the camera's aligned depth",
             only_if=(("scale_source", "depth"), ("image_transport", "raw")), configured_only=True,
             without_cameras=True),
    Endpoint("subscription", "depth/compressed", "sensor_msgs/msg/CompressedImage", "qos_reliability",
             "`scale_source: depth` with `image_transport: compressed`, `cameras` empty",
             "the same as compressedDepth PNG",
             only_if=(("scale_source", "depth"), ("image_transport", "compressed")), configured_only=True,
             without_cameras=True),
    # --- in, per camera (cameras set: these instead of image, depth and their compressed forms)
    Endpoint("subscription", "<name>/image", "sensor_msgs/msg/Image", "qos_reliability",
             "`cameras` set, `image_transport: raw`",
             "camera `<name>`, the encodings of `image`. Remap it: `-r front/image:=/front_camera/color/image_raw`",
             only_if=(("image_transport", "raw"),), configured_only=True, per_camera=True),
    Endpoint("subscription", "<name>/image/compressed", "sensor_msgs/msg/CompressedImage", "qos_reliability",
             "`cameras` set, `image_transport: compressed`",
             "camera `<name>`, JPEG or PNG; remapping `<name>/image` also moves it",
             only_if=(("image_transport", "compressed"),), configured_only=True, per_camera=True),
    Endpoint("subscription", "<name>/depth", "sensor_msgs/msg/Image", "qos_reliability",
             "`cameras` set, `scale_source: depth` with `image_transport: raw`",
             "camera `<name>`'s registered depth, paired by stamp: that stream's metric scale",
             only_if=(("scale_source", "depth"), ("image_transport", "raw")), configured_only=True,
             per_camera=True),
    Endpoint("subscription", "<name>/depth/compressed", "sensor_msgs/msg/CompressedImage", "qos_reliability",
             "`cameras` set, `scale_source: depth` with `image_transport: compressed`",
             "the same as compressedDepth PNG",
             only_if=(("scale_source", "depth"), ("image_transport", "compressed")), configured_only=True,
             per_camera=True),
    Endpoint("subscription", "/tf", "tf2_msgs/msg/TFMessage", "reliable", "always",
             "the robot's transforms (tf2 listener): `base_frame` -> camera at the image stamp, `odom_frame` -> "
             "`base_frame`, and the parents the one-parent check looks at"),
    Endpoint("subscription", "/tf_static", "tf2_msgs/msg/TFMessage", "latched", "always",
             "the robot's static transforms (the camera's mounting)"),
    Endpoint("subscription", "/diagnostics", "diagnostic_msgs/msg/DiagnosticArray", "reliable", "always",
             "other lingbot_map nodes' `tf` status: which edge each publishes, to name another publisher of "
             "this node's edge"),
    # --- out, per frame
    Endpoint("publisher", "~/pose", "geometry_msgs/msg/PoseStamped", "reliable",
             "every processed frame (after the scale frames)",
             "the camera (optical frame) pose, or with `base_frame` the body pose, in `world_frame`, stamped with "
             "the image's stamp; metric once the scale is locked (`scale_source`)"),
    Endpoint("publisher", "~/odom", "nav_msgs/msg/Odometry", "reliable", "with `~/pose`",
             "the same pose; `child_frame_id` = `base_frame` (else the camera frame); covariance "
             "`pose_covariance_diagonal` / `twist_covariance_diagonal` (default unknown, -1); a twist from "
             "consecutive poses when the scale is metric"),
    Endpoint("publisher", "~/path", "nav_msgs/msg/Path", "reliable",
             "with every pose up to 1000 poses, then at most twice a second",
             "the current session's poses, at most `path_max_length`", large=True),
    Endpoint("publisher", "/tf", "tf2_msgs/msg/TFMessage", "reliable", "with `~/pose`, when `publish_tf`; with "
             "`base_frame` also every `transform_publish_period` s",
             "one edge, `world_frame` -> camera, base or odometry frame (see the TF table), at the image stamp; "
             "with `base_frame` the correction is re-sent stamped now + `transform_tolerance`; never a second "
             "parent for a frame"),
    Endpoint("publisher", "~/frame_status", "lingbot_map_ros/msg/FrameStatus", "reliable",
             "once per received frame (BUFFERED before it while the scale frames are collected)",
             "the frame's final status and its reason: PROCESSED, DROPPED_QUEUE, REJECTED_INPUT, REFUSED_POLICY, "
             "DROPPED_RESET, DROPPED_INACTIVE, NON_FINITE_OUTPUT, FAILED_INFERENCE, NO_TRANSFORM; the raw 9-number "
             "pose encoding"),
    Endpoint("publisher", "~/cache_stats", "lingbot_map_ros/msg/CacheStats", "reliable",
             "every processed frame",
             "frame counters (received = processed + dropped + pending), KV-cache pages and frames, RoPE index, "
             "latency, backend"),
    Endpoint("publisher", "/diagnostics", "diagnostic_msgs/msg/DiagnosticArray", "reliable",
             "every `diagnostics_period` s, in every lifecycle state",
             "six statuses: `lingbot_map: input`, `inference`, `kv cache`, `backend`, `tf`, `scale`"),
    # --- out, reconstruction (the depth head runs when any of publish_depth/points/map is on)
    Endpoint("publisher", "~/depth", "sensor_msgs/msg/Image", "reliable", "`publish_depth`",
             "32FC1 depth (z along the optical axis) at the model input size, camera frame, image stamp",
             large=True),
    Endpoint("publisher", "~/depth_confidence", "sensor_msgs/msg/Image", "reliable", "`publish_depth`",
             "32FC1 confidence of `~/depth` (>= 1)", configured_only=True, large=True),
    Endpoint("publisher", "~/camera_info", "sensor_msgs/msg/CameraInfo", "reliable", "`publish_depth`",
             "the intrinsics estimated for the frame at the depth image's size (no distortion)",
             configured_only=True),
    Endpoint("publisher", "~/points", "sensor_msgs/msg/PointCloud2", "reliable",
             "`publish_points`, while someone subscribes",
             "the frame's depth in `world_frame`: x y z, rgb, confidence (every `points_stride`-th pixel)",
             configured_only=True, large=True),
    Endpoint("publisher", "~/map_points", "sensor_msgs/msg/PointCloud2", "latched",
             "`publish_map`, every `map_period` s",
             "the session's bounded voxel map in `world_frame` (same fields)", configured_only=True, large=True),
    # --- out, per camera (cameras set; ~/pose, ~/odom, ~/path and /tf are then the body's, one stream)
    Endpoint("publisher", "~/<name>/pose", "geometry_msgs/msg/PoseStamped", "reliable",
             "`cameras` set: every processed frame of camera `<name>` (withheld while its unit is estimated)",
             "the camera's (optical frame) pose in the one `world_frame`, at the image's stamp",
             configured_only=True, per_camera=True),
    Endpoint("publisher", "~/<name>/frame_status", "lingbot_map_ros/msg/FrameStatus", "reliable",
             "`cameras` set: once per received frame of camera `<name>`",
             "that frame's final status and its reason (the statuses of `~/frame_status`)",
             configured_only=True, per_camera=True),
    Endpoint("publisher", "~/<name>/cache_stats", "lingbot_map_ros/msg/CacheStats", "reliable",
             "`cameras` set: every processed frame of camera `<name>`",
             "that camera's counters, its stream's KV-cache pages and frames, RoPE index, latency",
             configured_only=True, per_camera=True),
    Endpoint("publisher", "~/<name>/depth", "sensor_msgs/msg/Image", "reliable", "`cameras` set, `publish_depth`",
             "camera `<name>`'s 32FC1 depth at the model input size, in the world's unit", configured_only=True,
             per_camera=True, large=True),
    Endpoint("publisher", "~/<name>/depth_confidence", "sensor_msgs/msg/Image", "reliable",
             "`cameras` set, `publish_depth`", "32FC1 confidence of `~/<name>/depth`", configured_only=True,
             per_camera=True, large=True),
    Endpoint("publisher", "~/<name>/camera_info", "sensor_msgs/msg/CameraInfo", "reliable",
             "`cameras` set, `publish_depth`", "camera `<name>`'s estimated intrinsics at the depth image's size",
             configured_only=True, per_camera=True),
    Endpoint("publisher", "~/<name>/points", "sensor_msgs/msg/PointCloud2", "reliable",
             "`cameras` set, `publish_points`, while someone subscribes",
             "camera `<name>`'s depth in the one `world_frame`; `~/map_points` fuses every camera's",
             configured_only=True, per_camera=True, large=True),
    # --- services
    Endpoint("service", "~/reset", "std_srvs/srv/Trigger", "", "configured (else it answers why not)",
             "start a new session: KV cache emptied, new world frame from the next frame, path and trajectory "
             "restart"),
    Endpoint("service", "~/save_trajectory", "std_srvs/srv/Trigger", "", "any time",
             "write the current session's poses to `trajectory_path` (TUM: stamp tx ty tz qx qy qz qw), "
             "atomically"),
    Endpoint("service", "~/save_map", "std_srvs/srv/Trigger", "", "any time",
             "write the voxel map (`publish_map`) to `map_path` as binary PLY, atomically", configured_only=True),
    Endpoint("service", "~/save_session", "std_srvs/srv/Trigger", "", "configured (else it answers why not)",
             "write the session (the KV cache's map, counters, long-run chain, trajectory) to the folder "
             "`session_path`, atomically, while frames go on (the stream pauses for a copy: milliseconds in GPU "
             "memory where it has room); the message says where, how many frames and bytes, and the pause"),
    Endpoint("service", "~/load_session", "std_srvs/srv/Trigger", "", "configured (else it answers why not)",
             "replace the session by the one in `session_path`: poses, `~/path` and `~/save_trajectory` continue "
             "in its world; refused with the reason (the current session kept) when it is not a session, is "
             "damaged or was made with other settings; read and checked while frames go on, then committed "
             "between two frames"),
)

# The managed node's lifecycle interface (rclpy's LifecycleNode): what `ros2 lifecycle` and a
# lifecycle manager use.
LIFECYCLE: tuple[Endpoint, ...] = (
    Endpoint("service", "~/change_state", "lifecycle_msgs/srv/ChangeState", "", "always", "trigger a transition"),
    Endpoint("service", "~/get_state", "lifecycle_msgs/srv/GetState", "", "always", "the current state"),
    Endpoint("service", "~/get_available_states", "lifecycle_msgs/srv/GetAvailableStates", "", "always", ""),
    Endpoint("service", "~/get_available_transitions", "lifecycle_msgs/srv/GetAvailableTransitions", "",
             "always", ""),
    Endpoint("service", "~/get_transition_graph", "lifecycle_msgs/srv/GetAvailableTransitions", "", "always", ""),
    Endpoint("publisher", "~/transition_event", "lifecycle_msgs/msg/TransitionEvent", "reliable", "each transition",
             ""),
)

# What every rclpy node has (parameter services, type descriptions, logging, parameter events).
STANDARD: tuple[Endpoint, ...] = tuple(
    Endpoint("service", f"~/{name}", f"rcl_interfaces/srv/{srv}", "", "always", "")
    for name, srv in (("describe_parameters", "DescribeParameters"), ("get_parameter_types", "GetParameterTypes"),
                      ("get_parameters", "GetParameters"), ("list_parameters", "ListParameters"),
                      ("set_parameters", "SetParameters"), ("set_parameters_atomically", "SetParametersAtomically"))
) + (
    Endpoint("service", "~/get_type_description", "type_description_interfaces/srv/GetTypeDescription", "",
             "always", ""),
    Endpoint("publisher", "/rosout", "rcl_interfaces/msg/Log", "latched", "always", ""),
    Endpoint("publisher", "/parameter_events", "rcl_interfaces/msg/ParameterEvent", "reliable", "always", ""),
)


@dataclass(frozen=True)
class TfEdge:
    """One transform the node broadcasts. ``parent``/``child`` name settings; ``child_fallback`` is what
    the child is when its setting is empty."""

    parent: str  # a setting name
    child: str  # a setting name
    child_fallback: str  # used when the child setting is empty
    when: str
    stamp: str
    # The edge is the one the node broadcasts while each (setting, is set) pair holds.
    only_if: tuple[tuple[str, bool], ...] = ()

    def exists_with(self, values: Mapping[str, object]) -> bool:
        return all(bool(values.get(name)) == is_set for name, is_set in self.only_if)


TF_EDGES: tuple[TfEdge, ...] = (
    TfEdge("world_frame", "camera_frame", "the image header's `frame_id` (`lingbot_camera` when that is empty too)",
           "`publish_tf` (default true), `base_frame` empty", "the image's stamp", only_if=(("base_frame", False),)),
    TfEdge("world_frame", "base_frame", "-", "`publish_tf`, `base_frame` set, `odom_frame` empty: the body pose",
           "the image's stamp; re-sent every `transform_publish_period` s stamped now + `transform_tolerance`",
           only_if=(("base_frame", True), ("odom_frame", False))),
    TfEdge("world_frame", "odom_frame", "-", "`publish_tf`, `base_frame` and `odom_frame` set: the map -> odom "
           "correction over the robot's own odometry (REP 105)",
           "the image's stamp; re-sent every `transform_publish_period` s stamped now + `transform_tolerance`",
           only_if=(("base_frame", True), ("odom_frame", True))),
)


def resolve(name: str, namespace: str = "/", node_name: str = NODE_NAME,
            remaps: Optional[Mapping[str, str]] = None) -> str:
    """The absolute name of a row's ``name`` for a node ``node_name`` in ``namespace``, after ``remaps``
    (``{"image": "/camera/image_raw"}``; as image_transport does, a remapped ``image`` also moves
    ``image/compressed``)."""
    remaps = dict(remaps or {})
    ns = "/" + namespace.strip("/") if namespace.strip("/") else ""
    if name in remaps:
        return remaps[name]
    if name.endswith("/compressed") and name[: -len("/compressed")] in remaps:
        return remaps[name[: -len("/compressed")]] + "/compressed"
    if name.startswith("/"):
        return name
    if name.startswith("~/"):
        return f"{ns}/{node_name}/{name[2:]}"
    return f"{ns}/{name}"


__all__ = ["CAMERA", "ENDPOINTS", "LIFECYCLE", "NODE_NAME", "QOS_TEXT", "STANDARD", "TF_EDGES", "Endpoint", "TfEdge",
           "resolve"]
