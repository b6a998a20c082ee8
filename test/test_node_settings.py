"""The node's typed settings: ``NodeSettings`` matches the settings table field for field, the node's
parts read one ``LiveSettings`` (no part keeps a dict of parameter values), a parameter change is
swapped in whole while the inference thread reads, and the revert of a failed model build goes through
the same owner."""
from __future__ import annotations

import dataclasses
import threading
import typing

import pytest

from lingbot_map_ros.core.config import RuntimeConfig
from lingbot_map_ros.core.settings import RUNTIME_FIELDS, SETTINGS, defaults, validate_values
from lingbot_map_ros.ros.node_settings import LiveSettings, NodeSettings, OverriddenSettings


def _field_type(default) -> object:
    """The type a field of ``NodeSettings`` must have for a setting with this default: its Python type,
    a list as a tuple of its elements' type (an empty list holds names: str)."""
    if isinstance(default, list):
        return tuple[type(default[0]) if default else str, ...]
    return type(default)


def test_the_settings_object_has_one_typed_field_per_row_of_the_table_in_its_order():
    hints = typing.get_type_hints(NodeSettings)
    fields = [f.name for f in dataclasses.fields(NodeSettings)]
    assert fields == [s.name for s in SETTINGS]
    wrong = {s.name: (hints[s.name], _field_type(s.default)) for s in SETTINGS
             if hints[s.name] != _field_type(s.default)}
    assert not wrong, f"fields whose type differs from the table's default (field, table): {wrong}"
    settings = NodeSettings.defaults()
    for s in SETTINGS:  # the defaults come from the table, lists frozen as tuples
        value = getattr(settings, s.name)
        assert value == (tuple(s.default) if isinstance(s.default, list) else s.default), s.name
        assert isinstance(value, typing.get_origin(hints[s.name]) or hints[s.name]), s.name
    assert validate_values(settings.values(), resolve=False) == validate_values(defaults(), resolve=False) == []
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.world_frame = "elsewhere"  # type: ignore[misc]


def test_a_change_is_a_new_object_and_the_snapshot_a_reader_holds_stays_as_it_was():
    live = LiveSettings(NodeSettings.defaults())
    before = live.current
    assert live.update({"world_frame": "map", "cameras": ["front"], "not_a_setting": 1}) == ("world_frame", "cameras")
    after = live.current
    assert after is not before and before.world_frame == "lingbot_world" and before.cameras == ()
    assert after.world_frame == "map" and after.cameras == ("front",)
    assert live.update({"world_frame": "map", "cameras": ("front",)}) == () and live.current is after
    without_tf = OverriddenSettings(live, publish_tf=False)
    assert without_tf.current.publish_tf is False and without_tf.current.world_frame == "map"
    live.update({"world_frame": "odom_map"})
    assert without_tf.current.world_frame == "odom_map" and without_tf.current.publish_tf is False


@pytest.fixture
def idle_node(ros_domain_id):
    """A real node, unconfigured (no model), with its parameter callbacks."""
    import rclpy
    from rclpy.context import Context

    from lingbot_map_ros.ros.node import LingBotMapNode

    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    node = LingBotMapNode(context=ctx, cli_args=["--ros-args", "-p", "autostart:=false"])
    try:
        yield node
    finally:
        node.destroy_node()
        rclpy.shutdown(context=ctx)


def _parts(obj, seen: set, depth: int = 0):
    """``obj`` and every object of this package reachable from its attributes (a few levels deep)."""
    if id(obj) in seen or depth > 4:
        return
    seen.add(id(obj))
    yield obj
    for value in vars(obj).values() if hasattr(obj, "__dict__") else ():
        if type(value).__module__.startswith("lingbot_map_ros.ros"):
            yield from _parts(value, seen, depth + 1)


def test_no_part_of_the_node_keeps_a_dict_of_parameter_values_and_all_read_one_owner(idle_node):
    holders, sources = [], []
    for part in _parts(idle_node, set()):
        for name, value in vars(part).items():
            # a mapping name -> value (rclpy's own maps hold Parameter objects and descriptors)
            if isinstance(value, typing.Mapping) and isinstance(value.get("world_frame"), str):
                holders.append(f"{type(part).__name__}.{name}")
            if isinstance(value, (LiveSettings, OverriddenSettings)):
                sources.append(value)
    assert not holders, f"parts that keep the parameter values as a dict: {holders}"
    owners = {id(s) for s in sources if isinstance(s, LiveSettings)}
    assert owners == {id(idle_node.settings)} and len(sources) >= 8, "every part reads the node's one LiveSettings"


def test_a_parameter_change_is_swapped_in_whole_while_another_thread_reads(idle_node):
    """The inference thread takes ``settings.current`` once per frame: it must never see half of a
    change. Two parameters changed together (``world_frame`` and ``camera_frame``) always come as a pair."""
    from rclpy.parameter import Parameter

    live = idle_node.settings
    stop = threading.Event()
    seen: list[tuple[str, str]] = []
    torn: list[tuple[str, str]] = []

    def read() -> None:
        while not stop.is_set():
            s = live.current  # one snapshot per "frame"
            pair = (s.world_frame, s.camera_frame)
            if s.camera_frame and s.camera_frame != s.world_frame + "_camera":
                torn.append(pair)
            seen.append(pair)

    reader = threading.Thread(target=read, name="inference")
    reader.start()
    try:
        for i in range(60):
            result = idle_node.set_parameters_atomically([Parameter("world_frame", value=f"world_{i}"),
                                                          Parameter("camera_frame", value=f"world_{i}_camera")])
            assert result.successful, result.reason
    finally:
        stop.set()
        reader.join(10)
    assert not torn, f"a reader saw half of a change: {torn[:3]}"
    assert len({p for p in seen if p[1]}) > 1, "the reader never saw a change: the test proves nothing"
    assert (live.current.world_frame, live.current.camera_frame) == ("world_59", "world_59_camera")
    assert idle_node.get_parameter("world_frame").value == "world_59"


def test_reverting_a_failed_model_build_goes_through_the_one_owner(idle_node):
    """``revert_model_parameters`` (inference thread) swaps the settings through ``LiveSettings`` and
    sets the parameters back, while the executor thread changes another parameter: neither change is lost."""
    from rclpy.parameter import Parameter

    assert idle_node.set_parameters([Parameter("seed", value=7)])[0].successful
    assert idle_node.settings.current.seed == 7
    running = RuntimeConfig(**{k: getattr(idle_node.settings.current, k) for k in RUNTIME_FIELDS})
    running = dataclasses.replace(running, seed=3)  # the model that runs was built with seed 3
    reverter = threading.Thread(target=idle_node._params.revert_model_parameters, args=(running,), name="inference")
    reverter.start()
    for i in range(20):
        assert idle_node.set_parameters([Parameter("path_max_length", value=100 + i)])[0].successful
    reverter.join(10)
    current = idle_node.settings.current
    assert current.seed == 3 and idle_node.get_parameter("seed").value == 3
    assert current.path_max_length == 119 and idle_node.get_parameter("path_max_length").value == 119
