"""A metric scale for the model's world: from a depth camera, from the robot's odometry, or fixed.

LingBot-Map's poses and depths are in its own normalised unit (scene depths of order 1). A robot
needs metres. ``scale_source`` picks where they come from:

* ``model``: none; everything stays in the model's unit (and ``/diagnostics`` says so);
* ``fixed``: ``scale_factor`` from the start;
* ``depth``: a depth camera registered to the colour image. Per stored keyframe the ratio of sensor
  depth to model depth is taken robustly (``depth_ratio``: the sensor image sampled onto the model's
  depth map, zero/NaN/out-of-range pixels dropped, a minimum valid fraction required, the median of
  the per-pixel ratios). The scale locks once the last ``scale_min_samples`` keyframe ratios agree
  (all within ``SCALE_AGREEMENT`` of their median); their median is the scale;
* ``odometry``: the camera's travel in the robot's odometry over the camera's travel in the model's
  world (path lengths, frame to frame), locked once the body has travelled ``scale_min_travel`` m.

What is published while the scale is estimated: **nothing metric** (the node withholds its pose,
TF, depth and point outputs and says so in ``/diagnostics``), never model units under a metric name.

Long runs: the window policy chains its windows into the first window's unit by a Sim(3) fitted on
the overlap, so a locked scale stays valid across a switch as far as that fit is right. At every
window switch the scale is estimated again from the new window's frames while the locked one keeps
being applied; when the new estimate locks, it applies from the new window's first frame on,
continuously there (``MetricMap``: ``x -> factor x + offset``, the offset chosen so that the point
where the window began keeps its metric position). So the world does not jump at the switch, and a
scale error of the chain's fit is corrected for the frames that follow.

Plain numpy (no rclpy): the node and offline tools share it, and it is tested without ROS.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .config import MODEL_WIDTH_PX, model_input_height
from .geometry import scale_pose

SCALE_SOURCES = ("model", "depth", "odometry", "fixed")
# The last scale_min_samples keyframe ratios agree when all lie within this fraction of their median
# (a depth camera's noise moves a median ratio by far less; a model whose depth scale drifts between
# keyframes by more than this gives no single scale).
SCALE_AGREEMENT = 0.05
MIN_VALID_FRACTION = 0.2  # of a keyframe's sampled pixels with usable sensor and model depth
SENSOR_DEPTH_RANGE_M = (0.1, 30.0)  # sensor depths outside this are dropped (saturated, too near)
MIN_MODEL_DEPTH = 1e-6  # model depths at or below this are dropped (the ratio would explode)
DEPTH_SAMPLE_STRIDE = 4  # model-depth pixels sampled in x and y (518x378: ~12 000 per keyframe, < 0.3 ms)
ASPECT_TOLERANCE = 0.02  # a depth image of another aspect ratio than the colour is not registered to it
ODOM_JUMP_M = 1.0  # a camera step in odom larger than this between two frames is a jump (odometry reset)
MIN_MODEL_TRAVEL = 1e-9  # model travel at or below this cannot give a ratio
ROUND_ATTEMPTS = 10  # depth: keyframes (at least 2 x scale_min_samples) before a round says why it has not locked
ODOMETRY_ROUND_FRAMES = 100  # odometry: frames before a round says why it has not locked

# ScaleStatus.state
MODEL_UNITS = "model units"
ESTIMATING = "estimating"
LOCKED = "locked"
RE_ESTIMATING = "re-estimating"  # locked (and applied) while the window after a switch estimates anew


def _median(values) -> float:
    """The median (mean of the two middle values for an even count), by ``np.partition``: np.median
    imports numpy.ma on its first call (~40 ms), which would land on the inference thread."""
    a = np.asarray(values, dtype=np.float64).reshape(-1)
    n = a.size
    if n == 0:
        return math.nan
    k = n // 2
    part = np.partition(a, [k - 1, k] if n % 2 == 0 else [k])
    return float(part[k]) if n % 2 else 0.5 * (float(part[k - 1]) + float(part[k]))


# ------------------------------------------------------------------------------------------- depth
def depth_grid_indices(colour_wh: tuple[int, int], depth_wh: tuple[int, int],
                       stride: int = DEPTH_SAMPLE_STRIDE, width: int = MODEL_WIDTH_PX,
                       max_height: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows and columns of a sensor depth image (``depth_wh``, registered to a ``colour_wh`` camera
    image) under the model depth map's pixels ``[stride // 2 :: stride]`` in y and x.

    The model image is the colour image resized to the model width ``width`` (518 unless
    ``image_width`` says otherwise; ``model_input_height`` rows), then centre-cropped to at most
    ``width`` rows (``preprocess.model_size``); a model pixel centre ``(i, j)`` sits at colour
    ``((j + 0.5) W0 / width, (i + crop + 0.5) H0 / new_h)``. Nearest sensor pixel, no
    interpolation: a hole stays a hole instead of being averaged into its neighbours.
    Raises ``ValueError`` for a depth image of another aspect ratio (not registered to the colour).
    """
    w0, h0 = (int(v) for v in colour_wh)
    wd, hd = (int(v) for v in depth_wh)
    if min(w0, h0, wd, hd) <= 0:
        raise ValueError(f"empty image: colour {w0}x{h0}, depth {wd}x{hd}")
    if abs((wd / hd) / (w0 / h0) - 1.0) > ASPECT_TOLERANCE:
        raise ValueError(f"depth image {wd}x{hd} has another aspect ratio than the colour image {w0}x{h0}: "
                         "it is not registered to it (use the depth topic aligned to the colour camera)")
    from .preprocess import model_size  # late: preprocess imports torch and PIL

    new_h = model_input_height(w0, h0, width)
    model_h, _, crop = model_size(w0, h0, width, max_height)  # max_height: the preprocessor's cap (camera_aspect)
    i = np.arange(stride // 2, model_h, stride)
    j = np.arange(stride // 2, width, stride)
    rows = np.minimum(((i + crop + 0.5) * hd / new_h).astype(np.int64), hd - 1)
    cols = np.minimum(((j + 0.5) * wd / width).astype(np.int64), wd - 1)
    return rows, cols


def model_depth_grid(depth: np.ndarray, stride: int = DEPTH_SAMPLE_STRIDE) -> np.ndarray:
    """The model depth map [H, W] at the pixels ``depth_grid_indices`` samples: [H', W'] (a view)."""
    return depth[stride // 2 :: stride, stride // 2 :: stride]


@dataclass(frozen=True)
class DepthSample:
    """One keyframe's sensor/model depth ratio, or why there is none."""

    ratio: Optional[float]  # None: not usable (``reason`` says why)
    valid_fraction: float
    reason: str = ""


def depth_ratio(sensor_grid: np.ndarray, model_grid: np.ndarray, *, min_valid_fraction: float = MIN_VALID_FRACTION,
                sensor_range: tuple[float, float] = SENSOR_DEPTH_RANGE_M) -> DepthSample:
    """Median of ``sensor / model`` over the pixels where both are usable ([H', W'] each, metres and
    model units): sensor depth finite and within ``sensor_range``, model depth finite and positive.
    Fewer usable pixels than ``min_valid_fraction`` give no ratio (a keyframe looking at the sky or a
    wall closer than the sensor's range says nothing reliable about the scale)."""
    s = np.asarray(sensor_grid, dtype=np.float32)
    m = np.asarray(model_grid, dtype=np.float32)
    if s.shape != m.shape:
        raise ValueError(f"sensor grid {s.shape} and model grid {m.shape} differ")
    with np.errstate(invalid="ignore"):
        valid = (s >= sensor_range[0]) & (s <= sensor_range[1]) & (m > MIN_MODEL_DEPTH)  # NaN compares False
    valid &= np.isfinite(m)
    fraction = float(valid.mean()) if valid.size else 0.0
    if fraction < min_valid_fraction:
        return DepthSample(None, fraction,
                           f"{100 * fraction:.0f} % valid depth pixels (< {100 * min_valid_fraction:.0f} %)")
    ratio = float(_median(s[valid].astype(np.float64) / m[valid]))
    return DepthSample(ratio, fraction)


# ------------------------------------------------------------------------------------------- the map
@dataclass(frozen=True, eq=False)
class MetricMap:
    """``x_metric = factor x + offset`` for positions in the session's (chained) world; depths scale
    by ``factor``. The first lock of a session has no offset: translations are ``factor`` times the
    model's."""

    factor: float = 1.0
    offset: np.ndarray = field(default_factory=lambda: np.zeros(3))

    def pose(self, c2w: np.ndarray) -> np.ndarray:
        """A [4, 4] pose of the model's world in the metric world (rotation unchanged)."""
        return scale_pose(c2w, self.factor, self.offset)

    def continued(self, factor: float, anchor: np.ndarray) -> "MetricMap":
        """The map with a new ``factor`` that keeps ``anchor`` (a world position) where it is."""
        a = np.asarray(anchor, dtype=np.float64)
        return MetricMap(float(factor), (self.factor - factor) * a + self.offset)


@dataclass(frozen=True)
class ScaleStatus:
    """What ``/diagnostics`` shows of the scale (``scale`` status)."""

    source: str
    state: str  # MODEL_UNITS | ESTIMATING | LOCKED | RE_ESTIMATING
    value: float  # the scale applied now (nan while nothing metric is published)
    spread: float  # relative spread of the samples that locked it / of the current round (nan: none)
    samples: int  # samples in the current round (depth: keyframe ratios; odometry: frame steps)
    needed: int  # depth: scale_min_samples
    travel_m: float  # odometry: body travel in the current round
    needed_travel_m: float
    relocks: int  # re-estimates locked after window switches in this session
    problem: str  # why the current round has not locked yet ("" when nothing is known to be wrong)
    rejected: dict  # reason -> count of samples not used, since the node started

    @property
    def metric(self) -> bool:
        """Translations, depth and points are in metres now."""
        return self.state in (LOCKED, RE_ESTIMATING)


class ScaleEstimator:
    """The scale of the current session: estimation rounds, the lock, the map applied to outputs.

    Rounds: a session's first one starts with the session (nothing metric until it locks); each
    window switch starts another while the locked map keeps being applied. Feed it with
    ``add_depth`` (depth, per stored keyframe), ``add_positions`` (odometry, per frame) or
    ``miss`` (a sample that could not be taken); read ``map`` (None: publish nothing metric).
    """

    def __init__(self, source: str, factor: float = 1.0, min_samples: int = 5, min_travel: float = 0.5,
                 agreement: float = SCALE_AGREEMENT) -> None:
        if source not in SCALE_SOURCES:
            raise ValueError(f"scale_source must be one of {SCALE_SOURCES} (got {source!r})")
        if source == "fixed" and not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"scale_factor must be positive and finite (got {factor})")
        self.source = source
        self.factor = float(factor)
        self.min_samples = int(min_samples)
        self.min_travel = float(min_travel)
        self.agreement = float(agreement)
        self.rejected: collections.Counter = collections.Counter()
        self.start_session()

    # ------------------------------------------------------------------ rounds
    def set_limits(self, min_samples: int, min_travel: float) -> None:
        """``scale_min_samples`` / ``scale_min_travel`` changed: they apply to the current round."""
        self.min_samples, self.min_travel = int(min_samples), float(min_travel)

    def start_session(self) -> None:
        """A new session: a new world, so a new unit; nothing metric until the first lock."""
        self._map: Optional[MetricMap] = {"model": MetricMap(), "fixed": MetricMap(self.factor)}.get(self.source)
        self._spread = 0.0 if self._map is not None else math.nan
        self.relocks = 0
        self._start_round(anchor=None)

    def start_window(self, anchor: np.ndarray) -> None:
        """A long-run window switch: estimate again; the locked map stays until the new round locks,
        which then applies from ``anchor`` (the new window's first published position, world units)."""
        if self.source in ("depth", "odometry"):
            self._start_round(anchor=np.asarray(anchor, dtype=np.float64))

    def _start_round(self, anchor: Optional[np.ndarray]) -> None:
        self._anchor = anchor
        self._round_open = self.source in ("depth", "odometry")
        self._ratios: collections.deque = collections.deque(maxlen=max(4 * self.min_samples, 16))
        self._attempts = 0
        self._last_reason = ""
        self._model_travel = self._odom_travel = self._base_travel = 0.0
        self._previous: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]] = None
        self._steps: collections.deque = collections.deque(maxlen=256)  # per-step odom/model ratios

    @property
    def wants_depth(self) -> bool:
        """A round of the depth source is open: keyframes' depth pairs are worth decoding."""
        return self.source == "depth" and self._round_open

    @property
    def wants_travel(self) -> bool:
        return self.source == "odometry" and self._round_open

    @property
    def map(self) -> Optional[MetricMap]:
        """What is applied to the outputs now; None while nothing metric may be published."""
        return self._map

    # ------------------------------------------------------------------ samples
    def miss(self, reason: str) -> None:
        """A sample that could not be taken (no depth partner, bad depth image, a TF jump)."""
        if self._round_open:
            self._attempts += 1
            self._last_reason = reason
        self.rejected[reason.split(":")[0]] += 1

    def add_depth(self, sample: DepthSample) -> None:
        """One stored keyframe's ratio (or why there is none)."""
        if not self.wants_depth:
            return
        if sample.ratio is None:
            self.miss("too few valid pixels: " + sample.reason)
            return
        self._attempts += 1
        self._ratios.append(sample.ratio)
        n = self.min_samples
        if len(self._ratios) >= n:
            last = np.asarray(list(self._ratios)[-n:])
            median = float(_median(last))
            spread = float(np.max(np.abs(last - median)) / median) if median > 0 else math.inf
            if median > 0 and spread <= self.agreement:
                self._lock(median, spread)
            else:
                self._last_reason = f"keyframe ratios do not agree (spread {100 * spread:.1f} % > " \
                                    f"{100 * self.agreement:.0f} %)"

    def add_positions(self, model_camera: np.ndarray, odom_camera: np.ndarray, odom_base: np.ndarray) -> None:
        """One frame: the camera centre in the model's world (world units) and in ``odom`` (m), and the
        body's position in ``odom`` (m). Travel is summed frame to frame; a step longer than
        ``ODOM_JUMP_M`` in odom is an odometry jump and is left out (counted)."""
        if not self.wants_travel:
            return
        now = (np.asarray(model_camera, np.float64), np.asarray(odom_camera, np.float64),
               np.asarray(odom_base, np.float64))
        previous, self._previous = self._previous, now
        self._attempts += 1
        if previous is None:
            return
        dm, dc, db = (float(np.linalg.norm(a - b)) for a, b in zip(now, previous))
        if dc > ODOM_JUMP_M:
            self.miss(f"odometry jump: the camera moved {dc:.2f} m in odom between two frames")
            return
        self._model_travel += dm
        self._odom_travel += dc
        self._base_travel += db
        if dm > MIN_MODEL_TRAVEL:
            self._steps.append(dc / dm)
        if self._base_travel >= self.min_travel:
            if self._model_travel <= MIN_MODEL_TRAVEL:
                self._last_reason = (f"the model's camera did not move while the robot travelled "
                                     f"{self._base_travel:.2f} m")
                return
            value = self._odom_travel / self._model_travel
            steps = np.asarray(self._steps) if self._steps else np.asarray([value])
            mad = float(_median(np.abs(steps - _median(steps))))
            self._lock(value, mad / value if value > 0 else math.nan)

    def _lock(self, value: float, spread: float) -> None:
        if self._map is None or self._anchor is None:
            self._map = MetricMap(value)
        else:
            self._map = self._map.continued(value, self._anchor)
            self.relocks += 1
        self._spread = spread
        self._round_open = False
        self._last_reason = ""

    # ------------------------------------------------------------------ saved sessions
    def state_dict(self) -> dict:
        """The lock (map, spread, relocks) as JSON data, for a saved session. An open round's samples
        are not kept: a resumed round starts afresh (while a locked map keeps being applied)."""
        m = self._map
        return {"source": self.source, "map": None if m is None else {"factor": m.factor, "offset": m.offset.tolist()},
                "spread": None if math.isnan(self._spread) else self._spread, "relocks": self.relocks,
                "round_open": self._round_open,
                "anchor": None if self._anchor is None else np.asarray(self._anchor).tolist()}

    def load_state(self, state: dict) -> None:
        """Continue a saved session's scale; a saved state of another ``scale_source`` is ignored (the
        node's source decides what the world's unit is)."""
        if state.get("source") != self.source:
            return
        m = state["map"]
        self._map = None if m is None else MetricMap(float(m["factor"]), np.asarray(m["offset"], np.float64))
        self._spread = math.nan if state["spread"] is None else float(state["spread"])
        self.relocks = int(state["relocks"])
        anchor = state.get("anchor")
        self._start_round(anchor=None if anchor is None else np.asarray(anchor, np.float64))
        self._round_open = bool(state["round_open"]) and self.source in ("depth", "odometry")

    # ------------------------------------------------------------------ report
    def problem(self) -> str:
        """Why the open round has not locked, once it has tried long enough to tell; "" otherwise."""
        if not self._round_open:
            return ""
        if self.source == "depth":
            if self._attempts < max(2 * self.min_samples, ROUND_ATTEMPTS):
                return ""
            return self._last_reason or "no keyframe ratio yet"
        if self._attempts < ODOMETRY_ROUND_FRAMES:
            return ""
        return self._last_reason or (f"the robot travelled {self._base_travel:.2f} m of the "
                                     f"{self.min_travel:.2f} m needed (scale_min_travel)")

    def status(self) -> ScaleStatus:
        if self.source == "model":
            state = MODEL_UNITS
        elif self._map is None:
            state = ESTIMATING
        else:
            state = RE_ESTIMATING if self._round_open else LOCKED
        spread = self._spread
        if self._round_open and self.source == "depth" and self._ratios:
            last = np.asarray(list(self._ratios)[-self.min_samples:])
            spread = float(np.max(np.abs(last - _median(last))) / _median(last))
        return ScaleStatus(
            source=self.source, state=state, value=self._map.factor if self._map is not None else math.nan,
            spread=spread, samples=len(self._ratios) if self.source == "depth" else len(self._steps),
            needed=self.min_samples, travel_m=self._base_travel, needed_travel_m=self.min_travel,
            relocks=self.relocks, problem=self.problem(), rejected=dict(self.rejected),
        )


__all__ = [
    "DEPTH_SAMPLE_STRIDE", "DepthSample", "ESTIMATING", "LOCKED", "MODEL_UNITS", "MetricMap", "RE_ESTIMATING",
    "SCALE_AGREEMENT", "SCALE_SOURCES", "ScaleEstimator", "ScaleStatus", "depth_grid_indices", "depth_ratio",
    "model_depth_grid",
]
