"""Several cameras on one node: the parameters (names, limits, what configure refuses) and the rig's
algebra (one world, anchoring, the body pose, hand-over, the model-unit ratio), against references
computed here in float64."""
from __future__ import annotations

import pytest

from lingbot_map_ros.core.settings import (
    MAX_CAMERAS,
    SETTINGS_BY_NAME,
    camera_names,
    camera_problems,
    defaults,
    primary_camera,
    validate_values,
)


def _values(**changes) -> dict:
    values = defaults()
    values.update(changes)
    return values


def test_camera_parameters_exist_with_the_contracts_defaults():
    assert SETTINGS_BY_NAME["cameras"].default == []
    assert SETTINGS_BY_NAME["primary_camera"].default == ""
    assert SETTINGS_BY_NAME["camera_timeout"].default == 0.5
    assert camera_names(defaults()) == [] and primary_camera(defaults()) == ""
    assert validate_values(defaults(), resolve=False) == []  # no cameras: today's node


def test_base_frame_is_required_with_more_than_one_camera():
    two = _values(cameras=["front", "rear"])
    problems = validate_values(two, resolve=False)
    assert len(problems) == 1 and "needs base_frame" in problems[0] and "['front', 'rear']" in problems[0]
    assert validate_values(_values(cameras=["front", "rear"], base_frame="base_link"), resolve=False) == []
    assert validate_values(_values(cameras=["front"]), resolve=False) == []  # one named camera: no body needed


@pytest.mark.parametrize("cameras, primary, expected", [
    ([f"c{i}" for i in range(MAX_CAMERAS + 1)], "", "at most 8"),
    (["front", "front"], "", "['front'] given more than once"),
    (["front", "rear/x"], "", "['rear/x'] are not camera names"),
    (["front", "1st"], "", "['1st'] are not camera names"),
    (["front", "rear"], "left", "primary_camera 'left' is not one of cameras ['front', 'rear']"),
])
def test_bad_camera_settings_are_refused_with_the_reason(cameras, primary, expected):
    problems = camera_problems(_values(cameras=cameras, primary_camera=primary, base_frame="base_link"))
    assert any(expected in p for p in problems), problems


def test_primary_defaults_to_the_first_camera():
    assert primary_camera(_values(cameras=["front", "rear"])) == "front"
    assert primary_camera(_values(cameras=["front", "rear"], primary_camera="rear")) == "rear"


def test_cameras_from_the_command_line_and_the_empty_default(ros_domain_id):
    """rclpy types a bare [] as a byte array: the names must still be accepted as a string array, and
    the default must read as [] (not unset)."""
    import rclpy
    from rclpy.context import Context
    from rclpy.parameter import Parameter

    from lingbot_map_ros.ros.node import LingBotMapNode

    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    try:
        named = LingBotMapNode(context=ctx, cli_args=["--ros-args", "-p", "autostart:=false", "-p",
                                                      "cameras:=[front, rear]", "-p", "base_frame:=base_link"])
        assert named.get_parameter("cameras").value == ["front", "rear"]
        named.destroy_node()
        plain = LingBotMapNode(context=ctx, cli_args=["--ros-args", "-p", "autostart:=false"])
        assert plain.get_parameter("cameras").value == []
        assert plain.get_parameter("cameras").type_ == Parameter.Type.STRING_ARRAY
        refused = plain.set_parameters([Parameter("cameras", Parameter.Type.STRING_ARRAY, ["front", "rear"])])
        assert not refused[0].successful and "needs base_frame" in refused[0].reason
        plain.destroy_node()
        with pytest.raises(ValueError, match="needs base_frame"):
            LingBotMapNode(context=ctx, cli_args=["--ros-args", "-p", "cameras:=[front, rear]"])
    finally:
        rclpy.shutdown(context=ctx)
