"""Several cameras on one node: the parameters (names, limits, what configure refuses) and the rig's
algebra (one world, anchoring, the body pose, hand-over, the model-unit ratio), against references
computed here in float64."""
from __future__ import annotations

import numpy as np
import pytest

from lingbot_map_ros.core.geometry import se3, se3_inverse
from lingbot_map_ros.core.rig import Rig, scaled
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


# ------------------------------------------------------------------------------------ the rig's algebra
def _truth(t: float) -> np.ndarray:
    """The body in odom: a constant-rate turn about one axis and a straight line (both exact under
    the rig's interpolation), so any error below comes from the rig, not from the motion."""
    axis = np.array([0.2, 0.1, 1.0]) / np.linalg.norm([0.2, 0.1, 1.0])
    angle = 0.3 * t
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    rot = np.eye(3) + np.sin(angle) * k + (1 - np.cos(angle)) * k @ k
    return se3(rot, [0.8 * t, 0.1 * t, 0.02 * t])


EXTRINSICS = {"front": se3(np.eye(3), [0.3, 0.0, 0.2]),
              "rear": se3(np.diag([-1.0, -1.0, 1.0]), [-0.25, 0.05, 0.3])}


def _observed(first_t: float, t: float, unit: float = 1.0, bias: np.ndarray = np.eye(4)) -> np.ndarray:
    """A stream's body pose in its own world (its first body pose), in its own unit."""
    return scaled(bias @ se3_inverse(_truth(first_t)) @ _truth(t), unit)


def _place(rig: Rig, name: str, first_t: float, t: float, unit: float = 1.0, bias=np.eye(4), odom=True):
    body = _observed(first_t, t, unit, bias)
    return rig.place(name, t, body, body @ EXTRINSICS[name], now=t, base_in_odom=_truth(t) if odom else None)


def test_rig_one_world_late_start_and_unit_from_the_primary():
    rig = Rig(["front", "rear"], "front", timeout=0.5, unit_from_primary=True, min_travel=0.5)
    world = se3_inverse(_truth(0.0))  # the world: the body at the first stream's first frame
    rear_first, placed = None, {"front": [], "rear": []}
    for i in range(40):
        t = 0.1 * i
        out = _place(rig, "front", 0.0, t)
        placed["front"].append((t, out))
        if t >= 1.0 and i % 3 == 0:  # the rear camera starts later, at its own rate, in its own unit
            rear_first = t if rear_first is None else rear_first
            placed["rear"].append((t, _place(rig, "rear", rear_first, t + 0.013, unit=0.37)))
    for t, out in placed["front"]:
        np.testing.assert_allclose(out.published_body, world @ _truth(t), atol=1e-9)
        np.testing.assert_allclose(out.camera, world @ _truth(t) @ EXTRINSICS["front"], atol=1e-9)
    withheld = [out for _, out in placed["rear"] if isinstance(out, str)]
    used = [(t, out) for t, out in placed["rear"] if not isinstance(out, str)]
    assert withheld and "scale_min_travel" in withheld[0] and used  # withheld until the body travelled 0.5
    assert rig.report(4.0)["rear"].unit == pytest.approx(1 / 0.37, rel=1e-9)
    for t, out in used:  # the rear camera lands in the same world, in the world's unit
        assert not out.drives
        np.testing.assert_allclose(out.body, world @ _truth(t + 0.013), atol=1e-9)
        np.testing.assert_allclose(out.camera, world @ _truth(t + 0.013) @ EXTRINSICS["rear"], atol=1e-9)


def test_rig_hand_over_is_continuous_and_the_primary_takes_the_drive_back():
    rig = Rig(["front", "rear"], "front", timeout=0.5, unit_from_primary=False, min_travel=0.5)
    world = se3_inverse(_truth(0.0))
    disagreement = se3(np.eye(3), [0.03, -0.02, 0.0])  # the rear camera's error of its world
    published = []
    for i in range(80):
        t = 0.05 * i
        if not 1.5 <= t < 2.6 and i % 2 == 0:  # the front camera stalls from 1.5 s to 2.6 s
            out = _place(rig, "front", 0.0, t, odom=False)
            if out.drives:
                published.append((t, "front", out.published_body))
        if i % 3 == 1:
            out = _place(rig, "rear", 0.15, t, bias=disagreement, odom=False)
            if out.drives:
                published.append((t, "rear", out.published_body, out.handed_over))
            if 1.4 + 0.55 < t < 2.6:
                assert rig.report(t)["front"].state == "stalled"
    drivers = [p[1] for p in published]
    first_rear = drivers.index("rear")
    assert published[first_rear][3] == "rear drives: front stalled"
    assert 1.5 + 0.5 <= published[first_rear][0] <= 1.5 + 0.5 + 0.15  # within the timeout plus one frame
    back = drivers.index("front", first_rear)
    assert rig.handovers == 2
    for entry in published:  # every published pose is the true body: the offset carried the disagreement
        np.testing.assert_allclose(entry[2], world @ _truth(entry[0]), atol=1e-9)
    assert all(d == "front" for d in drivers[back:])


def test_rig_new_session_of_one_stream_is_anchored_again():
    rig = Rig(["front", "rear"], "front", timeout=0.5, unit_from_primary=False, min_travel=0.5)
    world = se3_inverse(_truth(0.0))
    rear_first = 0.05
    for i in range(30):
        t = 0.1 * i
        _place(rig, "front", 0.0, t)
        if i == 15:  # the rear stream starts a new session: a new world of its own
            rig.begin_stream("rear")
            rear_first = t + 0.05
        out = _place(rig, "rear", rear_first, t + 0.05)
        np.testing.assert_allclose(out.body, world @ _truth(t + 0.05), atol=1e-9)


def test_a_session_of_other_cameras_is_refused_with_the_names(tmp_path):
    import json

    from lingbot_map_ros.core.session_store import SessionFileError
    from lingbot_map_ros.ros.camera_sessions import RIG_FILE, prepare

    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / RIG_FILE).write_text(json.dumps({"names": ["left", "right"]}))
    with pytest.raises(SessionFileError, match=r"saved with cameras \['left', 'right'\]; this node has cameras "
                                               r"\['front', 'rear'\]"):
        prepare(str(tmp_path / "saved"), ["front", "rear"], {}, None)
    (tmp_path / "single").mkdir()
    with pytest.raises(SessionFileError, match="not a session of several cameras"):
        prepare(str(tmp_path / "single"), ["front", "rear"], {}, None)
