"""Launch lingbot_map_node on a camera topic.

    ros2 launch lingbot_map_ros lingbot_map.launch.py image_topic:=/camera/color/image_raw
    ros2 launch lingbot_map_ros lingbot_map.launch.py image_topic:=/camera/color/image_raw \
        image_transport:=compressed checkpoint:=/models/lingbot-map.pt namespace:=robot1 log_level:=debug
    ros2 launch lingbot_map_ros lingbot_map.launch.py autostart:=false   # then: ros2 lifecycle set /lingbot_map configure

Arguments left empty leave the value of the parameter file alone (so a checkpoint or transport set
in your own params_file is not overridden by the launch defaults).
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

PACKAGE = "lingbot_map_ros"
EXECUTABLE = "lingbot_map_node"
NODE_NAME = "lingbot_map"
PARAMS_FILE = "config/lingbot_map.yaml"  # relative to the package share folder


def _node(context):
    params_file = LaunchConfiguration("params_file").perform(context)
    overrides = {}
    checkpoint = LaunchConfiguration("checkpoint").perform(context)
    if checkpoint:
        overrides["checkpoint"] = checkpoint
    transport = LaunchConfiguration("image_transport").perform(context)
    if transport:
        overrides["image_transport"] = transport
    # the managed node configures and activates itself unless autostart is false
    overrides["autostart"] = LaunchConfiguration("autostart").perform(context).lower() in ("true", "1", "yes")
    parameters = [params_file] + ([overrides] if overrides else [])
    return [
        Node(
            package=PACKAGE,
            executable=EXECUTABLE,
            name=NODE_NAME,
            namespace=LaunchConfiguration("namespace"),
            parameters=parameters,
            # The node follows image_transport's naming: remapping `image` also moves `image/compressed`.
            remappings=[("image", LaunchConfiguration("image_topic"))],
            ros_arguments=["--log-level", LaunchConfiguration("log_level")],
            output="screen",
            emulate_tty=True,
        )
    ]


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
        OpaqueFunction(function=_node),
    ])
