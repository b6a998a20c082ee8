"""Two RealSense cameras (front and rear) on one lingbot_map_node: one model, one body pose, one map.

    # the cameras (realsense2_camera), one per serial number:
    ros2 launch realsense2_camera rs_launch.py camera_namespace:=front camera_name:=front serial_no:="'<front serial>'"
    ros2 launch realsense2_camera rs_launch.py camera_namespace:=rear camera_name:=rear serial_no:="'<rear serial>'"
    # the node, the robot's static mounts and (rviz:=true) RViz:
    ros2 launch lingbot_map_ros two_realsense.launch.py rviz:=true

Each camera driver publishes its own ``<name>_link -> ... -> <name>_color_optical_frame``; what it
cannot know is where it sits on the robot: ``base_link -> <name>_link``, which a robot description
(robot_state_publisher) publishes. This file publishes those two mounts as static transforms
(``front_mount`` / ``rear_mount``: x y z yaw pitch roll, metres and radians); drop them when your
URDF already has the cameras. The node subscribes to ``front/image`` and ``rear/image`` (remapped
to the drivers' colour topics) and, with ``scale_source:=depth``, ``front/depth`` and ``rear/depth``
(their aligned depth). ``odom_frame`` is left to the robot: set it when odometry publishes
``odom -> base_link``.
"""
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from launch import LaunchDescription

PACKAGE = "lingbot_map_ros"
CAMERAS = ("front", "rear")


def _mount(name: str, context) -> Node:
    """base_link -> <name>_link from the ``<name>_mount`` argument (x y z yaw pitch roll)."""
    x, y, z, yaw, pitch, roll = (float(v) for v in LaunchConfiguration(f"{name}_mount").perform(context).split())
    base = LaunchConfiguration("base_frame").perform(context)
    return Node(package="tf2_ros", executable="static_transform_publisher", name=f"{name}_mount",
                arguments=["--x", str(x), "--y", str(y), "--z", str(z), "--yaw", str(yaw), "--pitch", str(pitch),
                           "--roll", str(roll), "--frame-id", base, "--child-frame-id", f"{name}_link"])


def _actions(context):
    remappings = []
    for name in CAMERAS:
        remappings += [(f"{name}/image", f"/{name}/{name}/color/image_raw"),
                       (f"{name}/depth", f"/{name}/{name}/aligned_depth_to_color/image_raw")]
    parameters = [LaunchConfiguration("params_file").perform(context), {
        "cameras": list(CAMERAS), "primary_camera": "front",
        "base_frame": LaunchConfiguration("base_frame").perform(context),
        "world_frame": LaunchConfiguration("world_frame").perform(context),
        "scale_source": LaunchConfiguration("scale_source").perform(context),
        "qos_reliability": "reliable",
    }]
    odom = LaunchConfiguration("odom_frame").perform(context)
    if odom:
        parameters[1]["odom_frame"] = odom
    node = Node(package=PACKAGE, executable="lingbot_map_node", name="lingbot_map", parameters=parameters,
                remappings=remappings, output="screen", emulate_tty=True)
    return [_mount(name, context) for name in CAMERAS] + [node]


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument("params_file",
                              default_value=PathJoinSubstitution([FindPackageShare(PACKAGE), "config",
                                                                  "lingbot_map.yaml"]),
                              description="ROS 2 parameter file for the node (checkpoint, image_width, ...)"),
        DeclareLaunchArgument("base_frame", default_value="base_link", description="the robot body frame"),
        DeclareLaunchArgument("odom_frame", default_value="",
                              description="the robot's odometry frame (e.g. odom); empty: the node publishes "
                                          "world -> base_frame"),
        DeclareLaunchArgument("world_frame", default_value="map", description="the node's world frame"),
        DeclareLaunchArgument("scale_source", default_value="depth",
                              description="depth (each RealSense's aligned depth), odometry, fixed or model"),
        DeclareLaunchArgument("front_mount", default_value="0.25 0.0 0.40 0.0 0.0 0.0",
                              description="base_frame -> front_link: x y z yaw pitch roll (m, rad)"),
        DeclareLaunchArgument("rear_mount", default_value="-0.25 0.0 0.40 3.14159265 0.0 0.0",
                              description="base_frame -> rear_link: x y z yaw pitch roll (m, rad)"),
        DeclareLaunchArgument("rviz", default_value="false",
                              description="true: also start rviz2 with config/lingbot_map_cameras.rviz"),
        OpaqueFunction(function=_actions),
        Node(package="rviz2", executable="rviz2", name="rviz2", output="screen",
             arguments=["-d", PathJoinSubstitution([FindPackageShare(PACKAGE), "config", "lingbot_map_cameras.rviz"])],
             condition=IfCondition(LaunchConfiguration("rviz"))),
    ])
