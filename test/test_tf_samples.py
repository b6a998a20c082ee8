"""``EdgeSamples`` and ``FrameTree.lookup`` against a real ``tf2_ros.Buffer``: the same transforms in, tf2's
own answer out, to the bit, at many stamps (between samples, on them, at the ends, outside them), through
out-of-order arrivals, repeats, parent changes, pruning, refused data and static switches. Where the copy
answers None the tree asks tf2; a case where tf2 refuses a lookup must never be answered by the copy."""
from __future__ import annotations

import math
import random
import struct

import numpy as np
import pytest

pytest.importorskip("tf2_ros")

from geometry_msgs.msg import TransformStamped  # noqa: E402
from rclpy.duration import Duration  # noqa: E402
from tf2_ros import Buffer, TransformException  # noqa: E402

from lingbot_map_ros.core.geometry import transform_matrix  # noqa: E402
from lingbot_map_ros.ros.tf_samples import EdgeSamples  # noqa: E402
from lingbot_map_ros.ros.transforms import FrameTree  # noqa: E402

SEC = 10**9
T0 = 1_700_000_000 * SEC


def _tf(parent: str, child: str, stamp: int, values) -> TransformStamped:
    t = TransformStamped()
    t.header.frame_id, t.child_frame_id = parent, child
    t.header.stamp.sec, t.header.stamp.nanosec = divmod(stamp, SEC)
    tr, q = t.transform.translation, t.transform.rotation
    tr.x, tr.y, tr.z, q.x, q.y, q.z, q.w = (float(v) for v in values)
    return t


def _stamp(ns: int):
    return _tf("a", "b", ns, (0, 0, 0, 0, 0, 0, 1)).header.stamp


def _bits(values) -> tuple:
    """Exact comparison, signed zeros included."""
    return tuple(struct.pack("<d", float(v)) for v in values)


def _random_values(rng: random.Random, unit: bool = False) -> tuple:
    q = [rng.gauss(0, 1) for _ in range(4)]
    n = math.sqrt(sum(v * v for v in q))
    wobble = 1.0 if unit else 1.0 + rng.uniform(-4e-3, 4e-3)  # tf2 accepts a slightly non-unit quaternion
    q = [v / n * wobble for v in q]
    if rng.random() < 0.15:  # exact zeros and axis rotations: the signed-zero paths
        q = [0.0, 0.0, math.sin(0.3), math.cos(0.3)] if rng.random() < 0.5 else [0.0, 0.0, 0.0, 1.0]
    if rng.random() < 0.1:
        q = [-v for v in q]
    t = [rng.uniform(-5, 5) if rng.random() > 0.1 else rng.choice((0.0, -0.0)) for _ in range(3)]
    return (*t, *q)


def _tf2_answer(buffer: Buffer, target: str, source: str, ns: int):
    try:
        t = buffer.lookup_transform_core(target, source, _stamp(ns))
    except TransformException:
        return None
    tr, q = t.transform.translation, t.transform.rotation
    return (tr.x, tr.y, tr.z, q.x, q.y, q.z, q.w)


def _feed(rng: random.Random, count: int, cache_s: float, parents=("odom",), unit_only: bool = False):
    """A random stream of odom -> base_link samples (some out of order, repeated, at a stamp already used,
    under another parent), fed to a Buffer and an EdgeSamples alike; their stamps."""
    buffer = Buffer(cache_time=Duration(seconds=cache_s))
    edge = EdgeSamples(Duration(seconds=cache_s).nanoseconds)
    stamps: list[int] = []
    sent: list[tuple] = []
    now = T0
    for _ in range(count):
        roll = rng.random()
        if sent and roll < 0.05:  # the same transform again
            parent, stamp, values = rng.choice(sent)
        elif sent and roll < 0.06:  # another transform at a recent stamp already used
            parent, stamp, values = rng.choice(parents), rng.choice(stamps[-4:]), _random_values(rng, unit_only)
        else:
            now += rng.choice((1, 7, 33_000_000, 33_000_000, 50_000_000, 400_000_001))
            stamp = now - (rng.choice((0, 0, 0, 20_000_000, 3 * SEC)) if rng.random() < 0.2 else 0)
            parent, values = rng.choice(parents), _random_values(rng, unit_only)
        buffer.set_transform(_tf(parent, "base_link", stamp, values), "test")
        edge.insert(stamp, parent, "base_link", values)
        stamps.append(stamp)
        sent.append((parent, stamp, values))
    return buffer, edge, stamps


def _queries(rng: random.Random, stamps: list[int]) -> list[int]:
    """Every sample's stamp, one either side, points between neighbours, and outside the span."""
    out = set()
    for s in stamps:
        out.update((s, s - 1, s + 1))
    ordered = sorted(set(stamps))
    for a, b in zip(ordered, ordered[1:]):
        out.update(a + int(f * (b - a)) for f in (rng.random(), rng.random(), 0.5))
    out.update((ordered[0] - SEC, ordered[-1] + SEC, 0))
    return sorted(x for x in out if x >= 0)


def _compare(rng, buffer, edge, stamps) -> tuple[int, int]:
    """Every query stamp asked of the copy and of tf2: each answer of the copy is tf2's to the bit; returns
    (the copy's answers, tf2's answers)."""
    answered = by_tf2 = 0
    for ns in _queries(rng, stamps):
        ours = edge.lookup(ns, "odom")
        theirs = _tf2_answer(buffer, "odom", "base_link", ns)
        by_tf2 += theirs is not None
        if ours is None:
            continue
        assert theirs is not None, f"tf2 refuses the lookup at {ns}, the copy answered {ours}"
        assert _bits(ours) == _bits(theirs), (ns, ours, theirs)
        answered += 1
    return answered, by_tf2


@pytest.mark.parametrize("seed", range(6))
def test_answers_are_tf2_s_to_the_bit(seed):
    rng = random.Random(seed)
    buffer, edge, stamps = _feed(rng, 400, cache_s=10.0)
    answered, by_tf2 = _compare(rng, buffer, edge, stamps)
    assert answered > 0.7 * by_tf2 > 200  # the comparison covers the copy's arithmetic, not only its refusals


@pytest.mark.parametrize("seed", range(3))
def test_pruning_and_old_data_as_tf2(seed):
    """A short cache (1.5 s) with stamps seconds apart: what tf2 pruned or refused is never answered."""
    rng = random.Random(100 + seed)
    buffer, edge, stamps = _feed(rng, 300, cache_s=1.5)
    answered, by_tf2 = _compare(rng, buffer, edge, stamps)
    assert answered > 0.7 * by_tf2 > 40


def test_a_parent_change_between_samples_is_tf2_s():
    rng = random.Random(7)
    buffer, edge, stamps = _feed(rng, 300, cache_s=10.0, parents=("odom", "odom", "map"))
    answered = 0
    for ns in _queries(rng, stamps):
        for target in ("odom", "map"):
            ours = edge.lookup(ns, target)
            if ours is None:
                continue
            theirs = _tf2_answer(buffer, target, "base_link", ns)
            assert theirs is not None and _bits(ours) == _bits(theirs), (ns, target, ours, theirs)
            answered += 1
    assert answered > 300


def test_the_newest_sample_and_the_ends():
    buffer = Buffer(cache_time=Duration(seconds=10.0))
    edge = EdgeSamples(Duration(seconds=10.0).nanoseconds)
    values = [(0.1 * k, -0.2, 0.3, 0.0, 0.0, math.sin(0.1 * k), math.cos(0.1 * k)) for k in range(3)]
    for k, v in enumerate(values):
        buffer.set_transform(_tf("odom", "base_link", T0 + k * SEC, v), "test")
        edge.insert(T0 + k * SEC, "odom", "base_link", v)
    newest = edge.lookup(T0 + 2 * SEC, "odom")
    assert newest is not None and _bits(newest) == _bits(_tf2_answer(buffer, "odom", "base_link", T0 + 2 * SEC))
    assert edge.lookup(T0 + 2 * SEC + 1, "odom") is None  # future: tf2 raises
    assert _tf2_answer(buffer, "odom", "base_link", T0 + 2 * SEC + 1) is None
    assert edge.lookup(T0, "odom") is None  # the oldest: left to tf2
    assert edge.lookup(T0 - 1, "odom") is None and _tf2_answer(buffer, "odom", "base_link", T0 - 1) is None
    assert edge.lookup(0, "odom") is None  # "latest": left to tf2
    assert edge.lookup(T0 + SEC, "/odom") is None  # tf2 refuses a frame id with a leading slash


def test_a_transform_tf2_may_refuse_stops_the_copy():
    edge = EdgeSamples(10 * SEC)
    for k in range(3):
        edge.insert(T0 + k * SEC, "odom", "base_link", (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0))
    assert edge.lookup(T0 + SEC // 2, "odom") is not None
    edge.insert(T0 + 5 * SEC, "odom", "base_link", (math.nan, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0))
    assert edge.lost and edge.lookup(T0 + SEC // 2, "odom") is None


def _tree_and_buffer(cache_s: float = 10.0):
    tree = FrameTree(None, buffer_seconds=cache_s)
    reference = Buffer(cache_time=Duration(seconds=cache_s))
    return tree, reference


def _both(tree: FrameTree, reference: Buffer, transforms, static: bool = False) -> None:
    tree.take(transforms, static=static)
    for t in transforms:
        (reference.set_transform_static if static else reference.set_transform)(t, "test")


def _matrix_or_none(fn):
    try:
        return fn()
    except Exception:  # noqa: BLE001 - NoTransform from the tree, TransformException from tf2
        return None


def test_frame_tree_lookup_equals_tf2_through_static_switches_and_a_parented_target():
    """The tree's lookup (copy or tf2) is tf2's matrix at every stamp: while the copy answers, after
    base_link is sent static and moving again, and once odom gets a parent (then tf2 answers)."""
    rng = random.Random(11)
    tree, reference = _tree_and_buffer()
    _both(tree, reference, [_tf("base_link", "cam_link", 0, (0.2, 0.0, 0.4, 0, 0, 0, 1))], static=True)
    stamps = []
    now = T0
    phases = ("moving", "static", "moving", "odom parented")
    answered_by_copy = 0
    for phase in phases:
        if phase == "static":
            _both(tree, reference, [_tf("odom", "base_link", now, _random_values(rng, True))], static=True)
        if phase == "odom parented":
            _both(tree, reference, [_tf("map", "odom", now - 5 * SEC, (1, 2, 3, 0, 0, 0, 1)),
                                    _tf("map", "odom", now + 5 * SEC, (1, 2, 3, 0, 0, 0, 1))])
        for _ in range(40):
            now += 33_000_000
            if phase != "static":
                _both(tree, reference, [_tf("odom", "base_link", now, _random_values(rng, True))])
            stamps.append(now)
        for ns in _queries(rng, stamps[-40:]):
            edge = tree._samples.get("base_link")
            copy = edge.lookup(ns, "odom") if edge is not None and "odom" not in tree._parents else None
            answered_by_copy += copy is not None
            ours = _matrix_or_none(lambda: tree.lookup("odom", "base_link", _stamp(ns), 0.0))
            theirs = _tf2_answer(reference, "odom", "base_link", ns)
            if theirs is None:
                assert ours is None, (phase, ns)
                continue
            expected = transform_matrix(theirs[:3], theirs[3:])
            assert ours is not None and np.array_equal(ours, expected), (phase, ns)
            if phase in ("static", "odom parented"):
                assert copy is None  # tf2 answers these
    assert answered_by_copy > 150


def test_the_cache_time_boundaries_to_the_nanosecond():
    """Samples exactly at, one nanosecond inside and outside tf2's pruning and old-data limits (newest minus the
    cache time), compared with tf2 at every stamp around them after each arrival."""
    cache = SEC
    buffer = Buffer(cache_time=Duration(nanoseconds=cache))
    edge = EdgeSamples(cache)
    rng = random.Random(5)
    arrivals = [T0, T0 + SEC // 2, T0 + SEC, T0 + SEC + 1, T0 + SEC // 2 + 3, T0 + 2 * SEC + 1,
                T0 + SEC + 1 - 1, T0 + SEC + 1, T0 + SEC, T0 + 2 * SEC + 2, T0 + SEC + 2, T0 + SEC + 1 + 7,
                T0 + 3 * SEC + 2, T0 + 2 * SEC + 2, T0 + 2 * SEC + 1,
                T0 + 3 * SEC + 7, T0 + 2 * SEC + 6, T0 + 2 * SEC + 7, T0 + 2 * SEC + 9]  # the last: new stamps
    seen: list[int] = []
    answered = 0
    for stamp in arrivals:
        values = _random_values(rng, True)
        buffer.set_transform(_tf("odom", "base_link", stamp, values), "test")
        edge.insert(stamp, "odom", "base_link", values)
        seen.append(stamp)
        for ns in sorted({s + d for s in seen for d in (-2, -1, 0, 1, 2)} | {(a + b) // 2 for a in seen for b in seen}):
            ours = edge.lookup(ns, "odom")
            theirs = _tf2_answer(buffer, "odom", "base_link", ns)
            if ours is not None:
                assert theirs is not None and _bits(ours) == _bits(theirs), (stamp, ns, ours, theirs)
                answered += 1
    assert answered > 100


def test_a_cleared_buffer_empties_the_copy():
    """tf2_ros clears its Buffer on a jump back in time: nothing from before is answered, by tf2 or the copy,
    and the copy answers again from the samples that come after."""
    tree, reference = _tree_and_buffer()
    values = [(0.1 * k, 0.0, 0.0, 0.0, 0.0, math.sin(0.05 * k), math.cos(0.05 * k)) for k in range(6)]
    for k in range(3):
        _both(tree, reference, [_tf("odom", "base_link", T0 + k * SEC, values[k])])
    assert tree._samples["base_link"].lookup(T0 + SEC // 2, "odom") is not None
    tree.buffer.clear()
    reference.clear()
    assert _tf2_answer(reference, "odom", "base_link", T0 + SEC // 2) is None
    assert tree._samples["base_link"].lookup(T0 + SEC // 2, "odom") is None
    with pytest.raises(Exception):
        tree.lookup("odom", "base_link", _stamp(T0 + SEC // 2), 0.0)
    for k in range(3, 6):
        _both(tree, reference, [_tf("odom", "base_link", T0 + k * SEC, values[k])])
    ns = T0 + 4 * SEC + 123
    ours = tree._samples["base_link"].lookup(ns, "odom")
    assert ours is not None and _bits(ours) == _bits(_tf2_answer(reference, "odom", "base_link", ns))
