"""tf2's answer for a moving transform whose parent is the lookup's target, computed from a copy of its samples.

The node looks ``odom -> base_link`` up at every image stamp of every camera. ``tf2_py`` answers with a whole
``geometry_msgs/TransformStamped`` built field by field in Python, which costs the inference thread more than
the arithmetic of the answer. ``EdgeSamples`` keeps what tf2's ``TimeCache`` keeps for one child frame (fed
with the same transforms, in the same order, under the same rules: old data refused, samples older than the
cache time pruned) and computes the lookup the way tf2 0.36 does, operation for operation in float64:

* the stored rotation is the message's quaternion through ``Matrix3x3::setRotation`` and back through
  ``getRotation`` (``BufferCore::setTransform`` stores a ``tf2::Transform``);
* the two samples around the stamp (``TimeCache::findClosest``), translation ``setInterpolate3``, rotation
  ``Quaternion::slerp``; a stamp that is a sample's own goes through the same interpolation (ratio 0), except
  the newest sample, which is returned as stored;
* ``walkToTopParent`` for a source whose parent is the target and a target without a parent of its own ends
  in ``FullPath``: the source's accumulated transform, then the inverse of the target's identity applied;
* ``lookupTransform`` hands the result through a ``tf2::Transform`` again (rotation as a matrix and back).

Anything outside that case answers None, and the caller asks tf2: a stamp at or before the oldest known
sample, after the newest, a parent change between the two samples, a target with a parent of its own, a
child sent as static, frame ids tf2 would not accept, two different samples at one stamp. A stamp that
two different samples share is known to be one (tf2 keeps both, in its own order), and no answer comes from a
sample there. A transform tf2 may refuse (not finite, a quaternion far from unit length, an empty or
self-referencing frame) leaves tf2's newest stamp unknown, and with it what tf2 prunes: the copy answers
nothing from then on (tf2 answers every lookup of that child). ``math`` is libm as in
tf2, and Python evaluates these expressions in C++'s order, so the answers are tf2's to the bit
(``test/test_tf_samples.py`` compares them with a ``tf2_ros.Buffer``).
"""
from __future__ import annotations

import bisect
import math
from typing import Optional

Quaternion = tuple[float, float, float, float]
Vector = tuple[float, float, float]
Sample = list  # [stamp ns, parent, translation, the message's quaternion, the stored rotation or None (not yet)]
_IDENTITY_INVERSE: Quaternion = (-0.0, -0.0, -0.0, 1.0)  # Quaternion(0, 0, 0, 1).inverse()


def _matrix(q: Quaternion) -> tuple[float, ...]:
    """``Matrix3x3::setRotation(q)``, row by row."""
    x, y, z, w = q
    d = x * x + y * y + z * z + w * w
    s = 2.0 / d
    xs, ys, zs = x * s, y * s, z * s
    wx, wy, wz = w * xs, w * ys, w * zs
    xx, xy, xz = x * xs, x * ys, x * zs
    yy, yz, zz = y * ys, y * zs, z * zs
    return (1.0 - (yy + zz), xy - wz, xz + wy,
            xy + wz, 1.0 - (xx + zz), yz - wx,
            xz - wy, yz + wx, 1.0 - (xx + yy))


def _quaternion(m: tuple[float, ...]) -> Quaternion:
    """``Matrix3x3::getRotation`` of the row-major ``m``."""
    trace = m[0] + m[4] + m[8]
    if trace > 0.0:
        s = math.sqrt(trace + 1.0)
        w = s * 0.5
        s = 0.5 / s
        return (m[7] - m[5]) * s, (m[2] - m[6]) * s, (m[3] - m[1]) * s, w
    i = (2 if m[4] < m[8] else 1) if m[0] < m[4] else (2 if m[0] < m[8] else 0)
    j, k = (i + 1) % 3, (i + 2) % 3
    s = math.sqrt(m[4 * i] - m[4 * j] - m[4 * k] + 1.0)
    temp = [0.0, 0.0, 0.0, 0.0]
    temp[i] = s * 0.5
    s = 0.5 / s
    temp[3] = (m[3 * k + j] - m[3 * j + k]) * s
    temp[j] = (m[3 * j + i] + m[3 * i + j]) * s
    temp[k] = (m[3 * k + i] + m[3 * i + k]) * s
    return temp[0], temp[1], temp[2], temp[3]


def _times(a: Quaternion, b: Quaternion) -> Quaternion:
    """``operator*(Quaternion, Quaternion)``."""
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return (aw * bx + ax * bw + ay * bz - az * by,
            aw * by + ay * bw + az * bx - ax * bz,
            aw * bz + az * bw + ax * by - ay * bx,
            aw * bw - ax * bx - ay * by - az * bz)


def _rotate(q: Quaternion, v: Vector) -> Vector:
    """``quatRotate``: ``(q * v) *= q.inverse()``."""
    qx, qy, qz, qw = q
    vx, vy, vz = v
    px, py, pz, pw = (qw * vx + qy * vz - qz * vy,
                      qw * vy + qz * vx - qx * vz,
                      qw * vz + qx * vy - qy * vx,
                      -qx * vx - qy * vy - qz * vz)
    ix, iy, iz, iw = -qx, -qy, -qz, qw
    return (pw * ix + px * iw + py * iz - pz * iy,
            pw * iy + py * iw + pz * ix - px * iz,
            pw * iz + pz * iw + px * iy - py * ix)


def _dot(a: Quaternion, b: Quaternion) -> float:
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3]


def _acos(x: float) -> float:
    """``tf2Acos``: clamped to [-1, 1]."""
    return math.acos(-1.0 if x < -1.0 else 1.0 if x > 1.0 else x)


def _slerp(a: Quaternion, b: Quaternion, t: float) -> Quaternion:
    """``Quaternion::slerp`` (with ``angleShortestPath``)."""
    s = math.sqrt(_dot(a, a) * _dot(b, b))
    ab = _dot(a, b)
    flip = ab < 0
    if flip:
        theta = _acos(_dot(a, (-b[0], -b[1], -b[2], -b[3])) / s) * 2.0 / 2.0
    else:
        theta = _acos(ab / s) * 2.0 / 2.0
    if theta == 0.0:
        return a
    d = 1.0 / math.sin(theta)
    s0 = math.sin((1.0 - t) * theta)
    s1 = math.sin(t * theta)
    if flip:
        return ((a[0] * s0 + -b[0] * s1) * d, (a[1] * s0 + -b[1] * s1) * d,
                (a[2] * s0 + -b[2] * s1) * d, (a[3] * s0 + -b[3] * s1) * d)
    return ((a[0] * s0 + b[0] * s1) * d, (a[1] * s0 + b[1] * s1) * d,
            (a[2] * s0 + b[2] * s1) * d, (a[3] * s0 + b[3] * s1) * d)


def _stored(sample: Sample) -> Quaternion:
    """The rotation tf2 stores for ``sample``: its quaternion through ``tf2::Transform``'s matrix."""
    if sample[4] is None:
        sample[4] = _quaternion(_matrix(sample[3]))
    return sample[4]


def _plain(values: tuple[float, ...]) -> bool:
    """Whether tf2 certainly stores a transform with these (x, y, z, qx, qy, qz, qw): finite, and a quaternion
    whose length leaves the stored rotation (through a rotation matrix) a unit quaternion."""
    if not all(math.isfinite(v) for v in values):
        return False
    d = values[3] * values[3] + values[4] * values[4] + values[5] * values[5] + values[6] * values[6]
    return 0.5 < d < 2.0


class EdgeSamples:
    """The moving transforms tf2 holds for one child frame (one per stamp), and the newest stamp tf2 holds
    (``latest``), which decides what tf2 prunes and refuses. Fed from the Buffer's creation on."""

    def __init__(self, cache_ns: int):
        self._cache_ns = cache_ns
        self._stamps: list[int] = []
        self._samples: list[Sample] = []
        self._raw: dict[int, tuple] = {}  # stamp -> (parent, values) as received: tf2 drops an exact repeat
        self._shared: set[int] = set()  # stamps of two different samples: tf2 keeps both, the copy one
        self.latest: Optional[int] = None
        self.lost = False  # a transform tf2 may have refused or kept: nothing is answered any more

    def insert(self, stamp: int, parent: str, child: str, values: tuple[float, ...]) -> None:
        """A transform tf2 was given (``TimeCache::insertData`` after ``setTransformImpl``'s checks)."""
        if self.lost:
            return
        if not (parent and child and parent != child and _plain(values)):
            self.lost = True
            self._stamps, self._samples, self._raw = [], [], {}
            return
        latest = self.latest
        if latest is not None:  # tf2 prunes first, then refuses data older than it keeps
            cut = latest - self._cache_ns
            drop = bisect.bisect_left(self._stamps, cut)
            if drop:
                for old in self._stamps[:drop]:
                    self._raw.pop(old, None)
                    self._shared.discard(old)
                del self._stamps[:drop], self._samples[:drop]
            if stamp < cut:
                return
            if stamp > latest:
                self.latest = stamp
        else:
            self.latest = stamp
        i = bisect.bisect_left(self._stamps, stamp)
        if i < len(self._stamps) and self._stamps[i] == stamp:
            if self._raw.get(stamp) != (parent, values):  # a second sample at this stamp: tf2 keeps both
                self._shared.add(stamp)
            return
        self._stamps.insert(i, stamp)  # its stored rotation is worked out when a lookup first needs it
        self._samples.insert(i, [stamp, parent, values[:3], values[3:], None])
        self._raw[stamp] = (parent, values)

    def lookup(self, stamp: int, target: str) -> Optional[tuple[float, ...]]:
        """(x, y, z, qx, qy, qz, qw) that tf2 answers for ``target <- child`` at ``stamp`` (ns), when the child's
        parent there is ``target`` and ``target`` has no parent; None: ask tf2."""
        stamps = self._stamps
        if self.lost or not target or target[0] == "/" or len(stamps) < 2 or stamp <= stamps[0] or stamp > stamps[-1]:
            return None
        if stamp == stamps[-1]:
            if stamp != self.latest:
                return None
            newest = self._samples[-1]
            if stamp in self._shared:
                return None
            parent, translation, rotation = newest[1], newest[2], _stored(newest)
        else:
            i = bisect.bisect_right(stamps, stamp) - 1
            one, two = self._samples[i], self._samples[i + 1]
            if one[0] in self._shared or two[0] in self._shared:
                return None
            parent = one[1]
            if two[1] != parent:
                translation, rotation = one[2], _stored(one)
            else:
                ratio = float(stamp - one[0]) / float(two[0] - one[0])
                s = 1.0 - ratio
                (ax, ay, az), (bx, by, bz) = one[2], two[2]
                translation = (s * ax + ratio * bx, s * ay + ratio * by, s * az + ratio * bz)
                rotation = _slerp(_stored(one), _stored(two), ratio)
        if parent != target:
            return None
        # walkToTopParent: the source's transform accumulated onto the identity, then FullPath's inverse target
        to_top = _rotate(rotation, (0.0, 0.0, 0.0))
        vec = (to_top[0] + translation[0], to_top[1] + translation[1], to_top[2] + translation[2])
        quat = _times(rotation, (0.0, 0.0, 0.0, 1.0))
        moved = _rotate(_IDENTITY_INVERSE, vec)
        out = _quaternion(_matrix(_times(_IDENTITY_INVERSE, quat)))  # through tf2::Transform
        inverse_vec = _INVERSE_TARGET_VEC
        return (moved[0] + inverse_vec[0], moved[1] + inverse_vec[1], moved[2] + inverse_vec[2], *out)


_INVERSE_TARGET_VEC = _rotate(_IDENTITY_INVERSE, (-0.0, -0.0, -0.0))  # FullPath's quatRotate(inverse, -0)

__all__ = ["EdgeSamples"]
