"""Parameter changes with several cameras, over real ROS 2 on loopback (README "Several cameras").

A two-camera node (tiny random weights, CPU) takes a few frames per camera, then:

* ``sliding_window`` 3 -> 4 (a field that starts a new session): accepted; every camera's stream
  restarts (its session id moves on, its next frames are buffered for the scale frames again) over a
  pool cut for the new window (one more patch page per camera);
* ``keyframe_interval`` 1 -> 2 (applies from the next frame): accepted; no stream restarts;
* a ``gpu_memory_budget`` that one camera's footprint fits but two cameras' do not: the node answers
  that it did not apply, and the parameter is back at the value in use (``ros2 param get`` never shows
  a value the streams do not run with); the streams go on untouched.

Every frame of both cameras ends with exactly one final status.
"""
from __future__ import annotations

import os
import time

import pytest
import yaml

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
tf2_ros = pytest.importorskip("tf2_ros")
pytestmark = pytest.mark.ros

from geometry_msgs.msg import TransformStamped  # noqa: E402
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue  # noqa: E402
from rcl_interfaces.srv import GetParameters, SetParameters  # noqa: E402
from rclpy.context import Context  # noqa: E402

from lingbot_map_ros.tools.node_client import Listener, NodeProcess, SyntheticCamera, image_message  # noqa: E402

PROCESSED, BUFFERED = 0, 4
W = 224
NS = "/lingbot_map"
NAMES = ("front", "rear")
PARAMS = dict(model_preset="tiny", device="cpu", scale_frames=2, sliding_window=3, keyframe_interval=1,
              camera_iterations=1, image_width=W, qos_reliability="reliable", world_frame="map",
              base_frame="base_link", scale_source="fixed", cameras=list(NAMES), camera_timeout=30.0,
              diagnostics_period=0.5)
STAMP0 = 1_700_000_000 * 10**9


def _static(parent: str, child: str, x: float) -> TransformStamped:
    t = TransformStamped()
    t.header.frame_id, t.child_frame_id = parent, child
    t.transform.translation.x = x
    q = t.transform.rotation
    q.x, q.y, q.z, q.w = -0.5, 0.5, -0.5, 0.5  # REP 103: the optical frame of a forward-looking camera
    return t


def _value(name: str, value) -> Parameter:
    if isinstance(value, float):
        return Parameter(name=name, value=ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=value))
    return Parameter(name=name, value=ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=value))


@pytest.fixture(scope="module")
def rig(tmp_path_factory, new_domain_id):
    tmp = tmp_path_factory.mktemp("camera_params")
    domain = new_domain_id()
    params = tmp / "params.yaml"
    params.write_text(yaml.safe_dump({"/**": {"ros__parameters": PARAMS}}))
    node = NodeProcess(["--params-file", str(params)], echo=False, env=dict(os.environ, ROS_DOMAIN_ID=str(domain)),
                       log_path=str(tmp / "node.log"))
    ctx = Context()
    rclpy.init(context=ctx, domain_id=domain)
    cams = {n: Listener(f"{NS}/{n}", f"/{n}/image", context=ctx, name=f"client_{n}") for n in NAMES}
    static = tf2_ros.StaticTransformBroadcaster(cams["front"].node)
    static.sendTransform([_static("base_link", "front_optical", 0.2), _static("base_link", "rear_optical", -0.2)])
    try:
        assert node.wait_ready(120), f"node did not start: {node.why_not_ready()}\n{node.output()[-3000:]}"
        for lst in cams.values():
            assert lst.wait_connected(30), "no connection to the node"
        yield {"node": node, "cams": cams, "render": {n: SyntheticCamera(W, 168, seed=i) for i, n in enumerate(NAMES)},
               "sent": {n: [] for n in NAMES}}
    finally:
        for lst in cams.values():
            lst.close()
        rclpy.shutdown(context=ctx)
        rc = node.stop()
        assert rc == 0 and "stopped cleanly" in node.output(), f"exit {rc}:\n{node.output()[-3000:]}"


def _send(rig, frames: int) -> dict[str, list]:
    """``frames`` frames per camera, alternating, each after the previous one's status; the statuses."""
    got: dict[str, list] = {n: [] for n in NAMES}
    for _ in range(frames):
        for i, name in enumerate(NAMES):
            lst = rig["cams"][name]
            ns = STAMP0 + (len(rig["sent"][name]) * 2 + i) * 50_000_000
            lst.pub.publish(image_message(rig["render"][name].render(len(rig["sent"][name]) % 20), ns,
                                          f"{name}_optical"))
            rig["sent"][name].append(ns)
            assert lst.wait_for(lambda rx: ns in rx.status, 60), f"no status for {name} {ns}"
            with lst.lock:
                got[name].append((ns, [s.status for s in lst.rx.status[ns]]))
    return got


def _stats(rig, name: str, ns: int):
    lst = rig["cams"][name]
    assert lst.wait_for(lambda rx: ns in rx.stats, 30), f"no cache_stats for {name} {ns}"
    with lst.lock:
        return lst.rx.stats[ns]


def _set(rig, **values) -> list:
    lst = rig["cams"]["front"]
    req = SetParameters.Request(parameters=[_value(k, v) for k, v in values.items()])
    res = lst.call(SetParameters, f"{NS}/set_parameters", req, timeout=60)
    assert res is not None, "no answer from set_parameters"
    return res.results


def _get(rig, name: str):
    res = rig["cams"]["front"].call(GetParameters, f"{NS}/get_parameters", GetParameters.Request(names=[name]))
    value = res.values[0]
    return value.integer_value if value.type == ParameterType.PARAMETER_INTEGER else value.double_value


def _wait_log(node, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in node.output():
        assert time.monotonic() < deadline, f"the node never logged {text!r}:\n{node.output()[-3000:]}"
        time.sleep(0.1)


def test_window_change_restarts_every_stream_and_next_frame_fields_do_not(rig):
    first = _send(rig, 4)
    before = {n: _stats(rig, n, first[n][-1][0]) for n in NAMES}
    [pages] = {s.patch_pages_total for s in before.values()}

    [result] = _set(rig, sliding_window=4)
    assert result.successful, result.reason
    _wait_log(rig["node"], "parameters ['sliding_window'] changed")
    after = _send(rig, 4)
    for name in NAMES:
        statuses = [s for _, s in after[name]]
        assert statuses[0][0] == BUFFERED, statuses  # the new session's scale frames again
        last = _stats(rig, name, after[name][-1][0])
        assert last.session_id > before[name].session_id
        assert last.patch_pages_total == pages + 1  # one more window page in every camera's share

    [result] = _set(rig, keyframe_interval=2)
    assert result.successful, result.reason
    later = _send(rig, 3)
    for name in NAMES:
        assert all(s == [PROCESSED] for _, s in later[name]), later[name]
        stats = [_stats(rig, name, ns) for ns, _ in later[name]]
        assert {s.session_id for s in stats} == {_stats(rig, name, after[name][-1][0]).session_id}
        assert [s.is_keyframe for s in stats].count(True) < len(stats)  # every second frame is stored


def test_a_budget_two_cameras_do_not_fit_is_reverted_and_changes_nothing(rig):
    import torch

    from lingbot_map_ros.core.config import model_config, planned_height
    from lingbot_map_ros.core.footprint import footprint
    from lingbot_map_ros.core.runtime import resolve_runtime
    from lingbot_map_ros.core.settings import configs_from_values, defaults

    values = defaults()
    values.update({k: v for k, v in PARAMS.items() if k in values})
    values.update(sliding_window=_get(rig, "sliding_window"), keyframe_interval=_get(rig, "keyframe_interval"))
    runtime, stream = configs_from_values(values)
    cfg, rt = model_config(runtime.resolved_preset()), resolve_runtime(runtime)
    h = planned_height(stream.image_width, stream.camera_aspect)
    one, two = (footprint(cfg, rt, stream, h, W, n).total for n in (1, 2))
    assert rt.dtype == torch.float32 and one < two
    window = _get(rig, "sliding_window")
    before = _send(rig, 1)
    session = {n: _stats(rig, n, before[n][-1][0]).session_id for n in NAMES}

    [result] = _set(rig, gpu_memory_budget=(one + two) / 2 / 1e9)  # one camera fits, two do not
    _wait_log(rig["node"], "not applied")
    assert "for 2 cameras needs" in rig["node"].output()  # refused for both cameras, with the numbers
    assert _get(rig, "gpu_memory_budget") == 0.0  # back at the value in use
    assert _get(rig, "sliding_window") == window
    after = _send(rig, 2)
    for name in NAMES:
        assert all(s == [PROCESSED] for _, s in after[name]), after[name]
        assert _stats(rig, name, after[name][-1][0]).session_id == session[name]
    for name in NAMES:
        lst = rig["cams"][name]
        assert lst.wait_for(lambda rx: all(lst.final_status(s) is not None for s in rig["sent"][name]), 30)
        with lst.lock:
            finals = [[s for s in lst.rx.status[ns] if s.status != BUFFERED] for ns in rig["sent"][name]]
        assert all(len(f) == 1 for f in finals), finals
