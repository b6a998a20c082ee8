"""Launch lingbot_map_node on a camera topic.

    ros2 launch lingbot_map_ros lingbot_map.launch.py image_topic:=/camera/color/image_raw
    ros2 launch lingbot_map_ros lingbot_map.launch.py image_topic:=/camera/color/image_raw \
        image_transport:=compressed checkpoint:=/models/lingbot-map.pt namespace:=robot1 log_level:=debug
    # then: ros2 lifecycle set /lingbot_map configure
    ros2 launch lingbot_map_ros lingbot_map.launch.py autostart:=false
    # with ros2 bag play --clock, or a simulator
    ros2 launch lingbot_map_ros lingbot_map.launch.py use_sim_time:=true
    # + RViz with config/lingbot_map.rviz
    ros2 launch lingbot_map_ros lingbot_map.launch.py rviz:=true
    # + /diagnostics_agg for rqt_robot_monitor
    ros2 launch lingbot_map_ros lingbot_map.launch.py diagnostics_aggregator:=true
    # on a robot (README, "On a robot")
    ros2 launch lingbot_map_ros lingbot_map.launch.py image_topic:=/camera/camera/color/image_raw \
        depth_topic:=/camera/camera/aligned_depth_to_color/image_raw scale_source:=depth \
        base_frame:=base_link odom_frame:=odom world_frame:=map

Arguments left empty leave the value of the parameter file alone (so a checkpoint or transport set
in your own params_file is not overridden by the launch defaults).
"""
import os

from launch.actions import DeclareLaunchArgument, LogInfo, OpaqueFunction
from launch.condition import Condition
from launch.conditions import IfCondition
from launch.launch_context import LaunchContext
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from launch import LaunchDescription

PACKAGE = "lingbot_map_ros"
EXECUTABLE = "lingbot_map_node"
NODE_NAME = "lingbot_map"
PARAMS_FILE = "config/lingbot_map.yaml"  # relative to the package share folder
# launch arguments that set the node parameter of the same name when given (empty: the params file's),
# with the parameter's type: what a robot user sets (README: On a robot, Saving, resuming and
# localizing, Fitting a small GPU). Any other parameter goes through params_file:= (a copy of
# config/lingbot_map.yaml), e.g. the covariance diagonals of ~/odom.
PARAMETER_ARGUMENTS: dict[str, type] = {
    "base_frame": str, "odom_frame": str, "scale_source": str, "world_frame": str,
    "qos_reliability": str, "publish_depth": bool, "transform_publish_period": float,
    "transform_tolerance": float, "initial_session": str, "mapping": bool, "session_path": str,
    "gpu_memory_budget": float, "fit_window": bool, "image_width": int, "camera_aspect": float,
    "primary_camera": str, "camera_timeout": float,
}
TRUE_WORDS = ("true", "1", "yes")
# diagnostics_aggregator:=true starts diagnostic_aggregator's aggregator_node with this analyzer file
# (rqt_robot_monitor shows its /diagnostics_agg); it is not a dependency, so only where it is installed.
AGGREGATOR_PACKAGE = "diagnostic_aggregator"
AGGREGATOR_EXECUTABLE = "aggregator_node"
AGGREGATOR_CONFIG = "config/diagnostic_aggregator.yaml"  # relative to this package's share folder


def package_installed(name: str) -> bool:
    """Whether ``name`` is in the ament index (AMENT_PREFIX_PATH), as ``ros2 run`` would find it."""
    from ament_index_python.packages import PackageNotFoundError, get_package_prefix

    try:
        get_package_prefix(name)
    except PackageNotFoundError:
        return False
    return True


def _aggregator_requested(context: LaunchContext) -> bool:
    return IfCondition(LaunchConfiguration("diagnostics_aggregator")).evaluate(context)


def aggregator_actions() -> list:
    """The aggregator node when asked for and installed; else, when asked for, a log line saying why not.

    Both carry conditions evaluated at launch time, so the node is part of the description either way
    (``ros2 launch -p`` shows it) and the ament index is consulted only when the argument is true.
    """
    return [
        Node(
            package=AGGREGATOR_PACKAGE,
            executable=AGGREGATOR_EXECUTABLE,
            # no name=: the aggregator's node is called `analyzers`, the key of the parameter file
            parameters=[PathJoinSubstitution([FindPackageShare(PACKAGE), *AGGREGATOR_CONFIG.split("/")])],
            output="screen",
            condition=Condition(predicate=lambda c: _aggregator_requested(c) and package_installed(AGGREGATOR_PACKAGE)),
        ),
        LogInfo(
            msg=f"diagnostics_aggregator:=true, but {AGGREGATOR_PACKAGE} is not installed: no /diagnostics_agg "
                f"(raw /diagnostics is still published; install ros-$ROS_DISTRO-diagnostic-aggregator for "
                f"rqt_robot_monitor)",
            condition=Condition(predicate=lambda c: _aggregator_requested(c)
                                and not package_installed(AGGREGATOR_PACKAGE)),
        ),
    ]


def node_settings(context) -> tuple[list, list]:
    """The node's ``parameters`` (the params file, then what the launch arguments override) and its
    ``remappings``, from the launch arguments."""
    params_file = LaunchConfiguration("params_file").perform(context)
    overrides = {}
    checkpoint = LaunchConfiguration("checkpoint").perform(context)
    if checkpoint:
        overrides["checkpoint"] = checkpoint
    transport = LaunchConfiguration("image_transport").perform(context)
    if transport:
        overrides["image_transport"] = transport
    use_sim_time = LaunchConfiguration("use_sim_time").perform(context)
    if use_sim_time:  # a bag played with --clock, a simulator: the node's clock follows /clock
        overrides["use_sim_time"] = use_sim_time.lower() in ("true", "1", "yes")
    for name, kind in PARAMETER_ARGUMENTS.items():  # only when given: else the params file's value stays
        value = LaunchConfiguration(name).perform(context)
        if value:
            overrides[name] = parameter_value(name, value, kind)
    cameras = camera_list(LaunchConfiguration("cameras").perform(context))
    if cameras:  # several cameras: <name>/image and <name>/depth each (remap them in your own launch file)
        overrides["cameras"] = cameras
    # the managed node configures and activates itself unless autostart is false
    overrides["autostart"] = LaunchConfiguration("autostart").perform(context).lower() in ("true", "1", "yes")
    # The node follows image_transport's naming: remapping `image` also moves `image/compressed`.
    remappings = [("image", LaunchConfiguration("image_topic").perform(context))]
    depth_topic = LaunchConfiguration("depth_topic").perform(context)
    if depth_topic:  # registered depth for scale_source depth (depth/compressed moves with it, as image does)
        remappings.append(("depth", depth_topic))
    return [params_file, overrides], remappings


def camera_list(text: str) -> list[str]:
    """``cameras:=front,rear`` or ``cameras:="[front, rear]"`` -> ["front", "rear"] ("" -> [])."""
    return [n for n in text.strip().strip("[]").replace(",", " ").split() if n]


def parameter_value(name: str, text: str, kind: type):
    """A launch argument's text as the parameter's type (the node refuses a wrong type at start)."""
    if kind is bool:
        if text.lower() not in TRUE_WORDS + ("false", "0", "no"):
            raise ValueError(f"launch argument {name}:={text}: expected true or false")
        return text.lower() in TRUE_WORDS
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"launch argument {name}:={text}: expected {'a number' if kind is float else 'an integer'}"
                         ) from None


def _node(context):
    parameters, remappings = node_settings(context)
    return [
        Node(
            package=PACKAGE,
            executable=EXECUTABLE,
            name=NODE_NAME,
            namespace=LaunchConfiguration("namespace"),
            parameters=parameters,
            remappings=remappings,
            ros_arguments=["--log-level", LaunchConfiguration("log_level")],
            output="screen",
            emulate_tty=True,
        )
    ]


RVIZ_CONFIG = "config/lingbot_map.rviz"  # relative to the package share folder
RVIZ_FIXED_FRAME = "lingbot_world"  # the Fixed Frame written in RVIZ_CONFIG: the node's default world_frame


def parameter_from_file(path: str, name: str):
    """The value of parameter ``name`` for this node in a ROS 2 parameter file (``/**``, the node's
    name or a namespaced one), or None."""
    import yaml

    try:
        with open(path) as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError):
        return None
    for key, section in doc.items():
        if not isinstance(section, dict) or str(key).split("/")[-1] not in ("**", NODE_NAME):
            continue
        params = section.get("ros__parameters") or {}
        if name in params:
            return params[name]
    return None


def world_frame(context) -> str:
    """The node's world_frame: the launch argument, else the parameter file's, else the default."""
    value = LaunchConfiguration("world_frame").perform(context)
    if not value:
        value = parameter_from_file(LaunchConfiguration("params_file").perform(context), "world_frame") or ""
    return str(value) or RVIZ_FIXED_FRAME


def rviz_config_for(world: str, share_config: str) -> str:
    """RVIZ_CONFIG with its Fixed Frame set to ``world`` (written to a temporary file when it differs),
    so RViz shows the node's world whatever world_frame is."""
    import tempfile

    if world == RVIZ_FIXED_FRAME:
        return share_config
    with open(share_config) as f:
        text = f.read()
    text = text.replace(f"Fixed Frame: {RVIZ_FIXED_FRAME}", f"Fixed Frame: {world}")
    path = os.path.join(tempfile.mkdtemp(prefix="lingbot_map_rviz_"), os.path.basename(share_config))
    with open(path, "w") as f:
        f.write(text)
    return path


def _rviz(context):
    """rviz2 with the package's display config (its Fixed Frame = the node's world_frame) when
    ``rviz:=true`` and rviz2 is in the ament index; otherwise (asked for but missing) a log line saying
    so. RViz is optional: no dependency."""
    from ament_index_python.packages import PackageNotFoundError, get_package_share_directory
    from launch.actions import LogInfo
    from launch.conditions import IfCondition

    if not IfCondition(LaunchConfiguration("rviz")).evaluate(context):
        return []
    try:
        get_package_share_directory("rviz2")
    except PackageNotFoundError:
        return [LogInfo(msg="rviz:=true, but rviz2 is not installed (install ros-$ROS_DISTRO-rviz2); "
                            f"the node runs without it. Later: rviz2 -d <share>/{RVIZ_CONFIG}")]
    config = rviz_config_for(world_frame(context),
                             os.path.join(get_package_share_directory(PACKAGE), *RVIZ_CONFIG.split("/")))
    return [Node(package="rviz2", executable="rviz2", name="rviz2", output="screen", arguments=["-d", config])]


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument("image_topic", default_value="/camera/image_raw",
                              description="camera image topic (sensor_msgs/Image); with compressed input the node "
                                          "subscribes to <image_topic>/compressed"),
        DeclareLaunchArgument("image_transport", default_value="",
                              description="raw or compressed; empty = as in params_file (default raw)"),
        DeclareLaunchArgument("params_file",
                              default_value=PathJoinSubstitution([FindPackageShare(PACKAGE), *PARAMS_FILE.split("/")]),
                              description="ROS 2 parameter file for the node"),
        DeclareLaunchArgument("checkpoint", default_value="",
                              description="official LingBot-Map checkpoint; empty = as in params_file "
                                          "(default: tiny random weights, poses not meaningful)"),
        DeclareLaunchArgument("namespace", default_value="", description="namespace of the node and its topics"),
        DeclareLaunchArgument("autostart", default_value="true",
                              description="true: the managed node configures and activates itself; false: it "
                                          "waits unconfigured for `ros2 lifecycle set` or a lifecycle manager"),
        DeclareLaunchArgument("log_level", default_value="info", description="debug, info, warn, error or fatal"),
        DeclareLaunchArgument("use_sim_time", default_value="",
                              description="true: the node's clock follows /clock (ros2 bag play --clock, a "
                                          "simulator); empty = as in params_file (default false)"),
        DeclareLaunchArgument("base_frame", default_value="",
                              description="robot body frame (e.g. base_link): the node publishes the body pose and "
                                          "world -> base_frame; empty = as in params_file (default: the camera pose)"),
        DeclareLaunchArgument("odom_frame", default_value="",
                              description="with base_frame: the robot's odometry frame (e.g. odom); the node then "
                                          "publishes world -> odom_frame (REP 105); empty = as in params_file"),
        DeclareLaunchArgument("scale_source", default_value="",
                              description="model, depth, odometry or fixed: the unit of the world (metres from a "
                                          "depth camera or odometry); empty = as in params_file (default model)"),
        DeclareLaunchArgument("world_frame", default_value="",
                              description="the node's world frame (e.g. map); empty = as in params_file; RViz's "
                                          "fixed frame follows it"),
        DeclareLaunchArgument("qos_reliability", default_value="",
                              description="best_effort or reliable (the image subscription; reliable keeps every "
                                          "frame of a loaded host); empty = as in params_file (default best_effort)"),
        DeclareLaunchArgument("publish_depth", default_value="",
                              description="true: run the depth head and publish ~/depth; empty = as in params_file"),
        DeclareLaunchArgument("transform_publish_period", default_value="",
                              description="s between re-sends of the world -> odom correction (0: only when a frame "
                                          "is placed); empty = as in params_file (default 0.05)"),
        DeclareLaunchArgument("transform_tolerance", default_value="",
                              description="s ahead of now that re-sent corrections are stamped; empty = as in "
                                          "params_file (default 0.1)"),
        DeclareLaunchArgument("initial_session", default_value="",
                              description="a saved session loaded at configure (the node resumes in its world); "
                                          "empty = as in params_file (default: a new session)"),
        DeclareLaunchArgument("mapping", default_value="",
                              description="false: localization only in the (loaded) map; empty = as in params_file "
                                          "(default true)"),
        DeclareLaunchArgument("session_path", default_value="",
                              description="folder ~/save_session writes and ~/load_session reads; empty = as in "
                                          "params_file"),
        DeclareLaunchArgument("gpu_memory_budget", default_value="",
                              description="GB the session may allocate (0: the free memory at configure minus a "
                                          "margin); empty = as in params_file"),
        DeclareLaunchArgument("fit_window", default_value="",
                              description="true: shrink sliding_window to the largest that fits the budget; empty = "
                                          "as in params_file"),
        DeclareLaunchArgument("image_width", default_value="",
                              description="model input width (a multiple of 14, 224..518); empty = as in params_file"),
        DeclareLaunchArgument("camera_aspect", default_value="",
                              description="the camera's height / width (0.75 for 640x480): configure checks the "
                                          "memory budget for that frame; empty = as in params_file (0: a square)"),
        DeclareLaunchArgument("cameras", default_value="",
                              description="camera names, e.g. front,rear: one stream each on <name>/image (and "
                                          "<name>/depth), one model, one body pose (README: Several cameras); "
                                          "empty = as in params_file (default: one camera on image_topic)"),
        DeclareLaunchArgument("primary_camera", default_value="",
                              description="the camera that drives the body pose while it tracks; empty = as in "
                                          "params_file (default: the first of cameras)"),
        DeclareLaunchArgument("camera_timeout", default_value="",
                              description="s without a processed frame before a camera counts as stalled and the "
                                          "next one drives; empty = as in params_file (default 0.5)"),
        DeclareLaunchArgument("depth_topic", default_value="",
                              description="registered depth image topic for scale_source depth (e.g. "
                                          "/camera/camera/aligned_depth_to_color/image_raw); empty = `depth`"),
        DeclareLaunchArgument("rviz", default_value="false",
                              description=f"true: also start rviz2 with <share>/{RVIZ_CONFIG} (TF, path, pose, "
                                          "points, map, depth), where rviz2 is installed"),
        DeclareLaunchArgument("diagnostics_aggregator", default_value="false",
                              description="true: also start diagnostic_aggregator's aggregator_node with "
                                          f"<share>/{AGGREGATOR_CONFIG} (/diagnostics_agg for rqt_robot_monitor), "
                                          "where that package is installed"),
        OpaqueFunction(function=_node),
        OpaqueFunction(function=_rviz),
        *aggregator_actions(),
    ])
