"""Long runs: window chaining, policies, limits, bounded memory - through the session manager, which
drives the long-run policy from outside the session.

Two kinds of model stand behind the session here:

* the ``tiny`` random-weight model (real caches, real limits) for the soak, the policies and the
  limit bookkeeping - its poses are meaningless, so it cannot test alignment;
* ``TrajectoryModel``, a stand-in that behaves like a perfect LingBot-Map: for every frame it
  returns the TRUE pose expressed in the current window's own first frame, with a random scale per
  window (each window is normalised on its own, exactly the ambiguity the alignment must undo).
  The continuity tests run it with alignment on (must match ground truth up to one Sim(3)) and
  with alignment removed (must fail the same check), so they can fail.
"""
from __future__ import annotations

import gc
import time

import numpy as np
import pytest
import torch

from lingbot_map_ros.core import long_run
from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig, model_config
from lingbot_map_ros.core.geometry import quaternion_xyzw_from_matrix, se3, se3_inverse, umeyama_sim3
from lingbot_map_ros.core.long_run import Sim3, WindowPolicy, validate_window
from lingbot_map_ros.core.model import ModelOutput
from lingbot_map_ros.core.runtime import resolve_for
from lingbot_map_ros.core.session_errors import SessionStopped
from lingbot_map_ros.core.session_manager import InferenceFailed, SessionCause, SessionManager

H, W = 28, 42  # 2 x 3 patches: the smallest sensible frame
SMALL = dict(scale_frames=2, sliding_window=3, max_stored_frames=12, overlap_frames=4)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


TINY = RuntimeConfig(device="cpu", model_preset="tiny", seed=1)
CPU = resolve_for(torch.device("cpu"), torch.float32)


def tiny_session(**stream) -> SessionManager:
    cfg = StreamConfig(**{**SMALL, **stream})
    return SessionManager.open(TINY, cfg, log=lambda m: None)


def random_frames(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, H, W, generator=g) for _ in range(n)]


# ------------------------------------------------------------------------------- a perfect model
def true_trajectory(n: int, still: tuple[int, int] = (0, 0)) -> np.ndarray:
    """c2w [n, 4, 4] of a camera on a wavy loop that yaws and pitches; optionally standing still."""
    k = np.arange(n, dtype=np.float64)
    if still[1] > still[0]:
        k = np.where((k >= still[0]) & (k < still[1]), still[0], np.where(k >= still[1], k - (still[1] - still[0]), k))
    a = 0.04 * k
    pos = np.stack([3.0 * np.sin(a), 0.3 * np.sin(3 * a), 3.0 * (1 - np.cos(a)) + 0.02 * k], 1)
    yaw, pitch = 0.04 * k, 0.1 * np.sin(0.05 * k)
    cy, sy, cp, sp = np.cos(yaw), np.sin(yaw), np.cos(pitch), np.sin(pitch)
    r_yaw = np.zeros((n, 3, 3))
    r_yaw[:, 0, 0], r_yaw[:, 0, 2], r_yaw[:, 1, 1], r_yaw[:, 2, 0], r_yaw[:, 2, 2] = cy, sy, 1, -sy, cy
    r_pitch = np.zeros((n, 3, 3))
    r_pitch[:, 0, 0], r_pitch[:, 1, 1], r_pitch[:, 1, 2], r_pitch[:, 2, 1], r_pitch[:, 2, 2] = 1, cp, -sp, sp, cp
    return se3(r_yaw @ r_pitch, pos)


def true_depth(index: int) -> np.ndarray:
    """A depth map that changes with the frame (metres of the ground-truth world)."""
    yy, xx = np.mgrid[0:14, 0:28]
    return (2.0 + 0.5 * np.sin(0.1 * index) + 0.01 * xx + 0.02 * yy).astype(np.float32)


def encode_index(index: int) -> torch.Tensor:
    """A frame that tells the stand-in model which ground-truth frame it is."""
    img = torch.zeros(3, 14, 28)
    img[0, 0, 0] = (index % 1000) / 1000.0
    img[1, 0, 0] = (index // 1000) / 1000.0
    return img


class TrajectoryModel:
    """Returns each frame's true pose in its window's first frame, scaled per window.

    A window starts where the session starts one: the frame fed with camera variant 0 (the first
    frame of phase 1) becomes the reference, and a new random scale applies from there on.
    """

    def __init__(self, gt_c2w: np.ndarray, with_depth: bool, seed: int = 0) -> None:
        self.gt = gt_c2w
        self.depth_head = object() if with_depth else None
        self.rng = np.random.default_rng(seed)
        self.ref = 0
        self.scale = 1.0
        self.windows = 0

    def __call__(self, images, *, camera_variant, with_depth=False, **_):
        idx = [int(round(float(im[0, 0, 0]) * 1000)) + 1000 * int(round(float(im[1, 0, 0]) * 1000)) for im in images]
        if int(camera_variant[0]) == 0:
            self.ref, self.scale, self.windows = idx[0], float(self.rng.uniform(0.4, 2.5)), self.windows + 1
        local = se3_inverse(self.gt[self.ref]) @ self.gt[idx]  # [S, 4, 4]
        pose = np.zeros((len(idx), 9))
        pose[:, :3] = self.scale * local[:, :3, 3]
        pose[:, 3:7] = quaternion_xyzw_from_matrix(local[:, :3, :3])
        pose[:, 7:] = 1.0
        out = ModelOutput(pose_enc=torch.tensor(pose, dtype=torch.float32))
        if with_depth and self.depth_head is not None:
            d = np.stack([true_depth(i) * self.scale for i in idx])
            out.depth, out.depth_conf = torch.from_numpy(d), torch.ones_like(torch.from_numpy(d))
        return out


def run_trajectory(n: int, *, with_depth=False, kf=1, still=(0, 0), disable_alignment=False, **stream):
    gt = true_trajectory(n, still)
    model = TrajectoryModel(gt, with_depth)
    cfg = StreamConfig(**{**dict(SMALL, max_stored_frames=10, overlap_frames=4), "keyframe_interval": kf,
                          "with_depth": with_depth, **stream})
    session = SessionManager.around(model, model_config("tiny"), cfg, CPU, log=lambda m: None)
    if disable_alignment:  # the new window's raw frame is published as if it were the world frame
        session.policy._fit_alignment = lambda overlap, raw, previous, start: long_run.WindowAlignment(  # type: ignore
            session.policy.window_index, Sim3(), "disabled", 1.0, 0, 0, len(overlap), 0.0)
    results = []
    for i in range(n):
        results += session.push(encode_index(i), float(i))
    return gt, results, session, model


def continuity_errors(gt: np.ndarray, results) -> tuple[float, float, float]:
    """(ATE after one Sim(3) fitted on the FIRST window only, worst jump at a window change, local motion).

    Fitting on the first window alone means a later window's misalignment cannot be absorbed by the fit.
    """
    est = np.stack([r.c2w[:3, 3] for r in results])
    ref = gt[[int(r.stamp) for r in results], :3, 3]
    first = np.array([r.window_index == 0 for r in results])
    s, rot, t = umeyama_sim3(est[first], ref[first])
    aligned = s * est @ rot.T + t
    ate = float(np.sqrt(((aligned - ref) ** 2).sum(1).mean()))
    switch = [k for k in range(1, len(results)) if results[k].window_index != results[k - 1].window_index]
    step_est = aligned[1:] - aligned[:-1]
    step_ref = ref[1:] - ref[:-1]
    jump = max(float(np.linalg.norm(step_est[k - 1] - step_ref[k - 1])) for k in switch)
    local = float(np.median(np.linalg.norm(step_ref, axis=1)))
    return ate, jump, local


# ------------------------------------------------------------------------------- continuity
@pytest.mark.parametrize("with_depth,kf", [(False, 1), (False, 2), (True, 1), (True, 2)])
def test_windows_continue_the_trajectory(with_depth, kf):
    gt, results, session, model = run_trajectory(160, with_depth=with_depth, kf=kf)
    assert len(results) == 160 and [int(r.stamp) for r in results] == list(range(160))
    assert session.policy.window_switches >= 8 and model.windows == session.policy.window_switches + 1
    assert session.policy.last_alignment.method == ("depth-median" if with_depth else "pose-fit")
    ate, jump, local = continuity_errors(gt, results)
    assert ate < 1e-3 * local and jump < 1e-3 * local, (ate, jump, local)  # float32 pose_enc
    # rotations continue too: the published orientation equals the true one up to the world rotation
    rot0 = results[0].c2w[:3, :3] @ gt[0, :3, :3].T
    for r in results:
        assert np.allclose(r.c2w[:3, :3], rot0 @ gt[int(r.stamp), :3, :3], atol=1e-6)
    # pose_enc stays the window's own raw output; c2w carries the chain
    late = results[-1]
    assert late.window_index > 0 and not np.allclose(late.pose_enc[:3], late.c2w[:3, 3], atol=1e-3)


@pytest.mark.parametrize("with_depth", [False, True])
def test_without_alignment_the_same_check_fails(with_depth):
    gt, results, _, _ = run_trajectory(80, with_depth=with_depth, disable_alignment=True)
    ate, jump, local = continuity_errors(gt, results)
    assert jump > 2 * local and ate > local


@pytest.mark.parametrize("depth_every,method", [(2, "depth-median"), (1000, "pose-fit")])
def test_windows_continue_with_depth_on_some_frames(depth_every, method):
    """depth_every > 1: the scale comes from the overlap frames with a depth map in both windows; with
    none (only each window's scale frames have one), from the camera centres."""
    gt, results, session, _ = run_trajectory(120, with_depth=True, depth_every=depth_every)
    assert session.policy.window_switches >= 6
    assert session.policy.last_alignment.method == method
    assert any(r.depth is None for r in results) and any(r.depth is not None for r in results)
    ate, jump, local = continuity_errors(gt, results)
    assert ate < 1e-3 * local and jump < 1e-3 * local, (ate, jump, local)


def test_depth_scale_is_published_with_the_chain():
    _, results, session, _ = run_trajectory(60, with_depth=True)
    r = results[-1]
    # world-unit depth = true depth x the first window's scale, whatever the current window's scale
    s0 = results[0].depth[0, 0] / true_depth(0)[0, 0]
    assert np.allclose(r.depth, true_depth(int(r.stamp)) * s0, rtol=1e-5)
    assert session.policy.transform.scale != 1.0


def test_standing_still_over_the_overlap_keeps_the_scale_and_does_not_jump():
    # frames 40..59 do not move: windows whose overlap lies in there cannot measure a scale from poses
    gt, results, session, _ = run_trajectory(90, still=(40, 60))
    methods = [r.frame_extra["window_switch"]["method"] for r in results if "window_switch" in r.frame_extra]
    assert "pose-fallback" in methods and methods[-1] == "pose-fit"  # and the fit resumes with motion
    est = np.stack([r.c2w[:3, 3] for r in results])
    ref = gt[[int(r.stamp) for r in results], :3, 3]
    d_est = np.linalg.norm(np.diff(est, axis=0), axis=1)  # d_est[k-1]: step into frame k
    d_ref = np.linalg.norm(np.diff(ref, axis=0), axis=1)
    for k in range(1, len(results) - 1):
        if results[k].window_index == results[k - 1].window_index:
            continue
        if d_ref[k - 1] < 1e-12:  # standing still across the switch: no jump at all
            assert d_est[k - 1] < 1e-5, k
        else:  # moving: the step into the new window has the new window's scale, no extra jump
            later = [j for j in range(k, len(d_ref))
                     if d_ref[j] > 1e-12 and results[j + 1].window_index == results[k].window_index]
            if later:
                j = later[0]
                assert d_est[k - 1] / d_ref[k - 1] == pytest.approx(d_est[j] / d_ref[j], rel=1e-3), k
    warned = any("could not fix the scale" in w for w in session.warnings())
    assert warned == (session.policy.last_alignment.method == "pose-fallback")


def test_failed_window_switch_takes_the_failure_path_and_starts_a_new_world_frame():
    """A fault inside the window switch is a fault, not a refusal: InferenceFailed (the manager's one
    failure path: a new session, its cause recorded, the cause's traceback released), never a
    SessionError that a caller would file as refused by the policy."""
    gt = true_trajectory(40)
    cfg = StreamConfig(**{**SMALL, "max_stored_frames": 10})
    session = SessionManager.around(TrajectoryModel(gt, False), model_config("tiny"), cfg, CPU, log=lambda m: None)
    starts = []
    session.on_new_session = starts.append

    def broken(*args):
        raise RuntimeError("boom")

    session.policy._fit_alignment = broken  # type: ignore[assignment]
    got, failures = [], []
    for i in range(14):
        try:
            got += session.push(encode_index(i), float(i))
        except InferenceFailed as exc:
            failures.append((i, exc))
    assert [i for i, _ in failures] == [10] and "boom" in str(failures[0][1])
    assert failures[0][1].cause.__traceback__ is None and "boom" in failures[0][1].detail
    assert [s.cause for s in starts] == [SessionCause.FAILURE] and starts[0].discarded == ()
    assert session.session_id == 1 and session.policy.window_index == 0
    assert [r.session_id for r in got] == [0] * 10 + [1] * 3  # frames 11..13 in the new world frame
    assert len(got) + session.session.buffered + len(failures) == 14


def test_centre_scale_fallbacks():
    src = np.random.default_rng(0).normal(size=(20, 3))
    assert long_run._centre_scale(src, 2 * src + 1, 1.0)[0] == pytest.approx(2.0)
    assert long_run._centre_scale(src * 1e-4, src, 1.0)[0] is None  # no motion in the new window
    assert long_run._centre_scale(src[:1], src[:1], 1.0)[0] is None  # one frame
    assert long_run._centre_scale(src, 50 * src, 1.0)[0] is None  # implausible jump of scale
    assert long_run._centre_scale(src, 50 * src, 10.0)[0] == pytest.approx(50.0)  # relative to the previous
    noisy = np.random.default_rng(1).normal(size=(20, 3))
    assert long_run._centre_scale(src, noisy, 1.0)[0] is None  # no similarity explains it


# ------------------------------------------------------------------------------- real caches
def test_validation_messages():
    problems = validate_window(StreamConfig(**{**SMALL, "overlap_frames": 1}))
    assert "overlap_frames (1) must be >= scale_frames (2)" in problems[0]
    assert "must be < max_stored_frames" in validate_window(StreamConfig(**{**SMALL, "overlap_frames": 12}))[0]
    with pytest.raises(ValueError, match="overlap_frames"):
        tiny_session(overlap_frames=12)
    assert type(tiny_session(long_run_policy="reset").policy) is long_run.ResetPolicy
    session = tiny_session()
    with pytest.raises(ValueError, match="overlap_frames"):
        session.apply(TINY, StreamConfig(**{**SMALL, "overlap_frames": 1}))


def test_window_switch_bookkeeping_and_user_reset():
    session = tiny_session(keyframe_interval=2)
    assert isinstance(session.policy, WindowPolicy)
    results = []
    for i, frame in enumerate(random_frames(70)):
        results += session.push(frame, float(i))
        assert session.session.frames_stored <= SMALL["max_stored_frames"]
        assert session.policy.overlap_buffered <= SMALL["overlap_frames"]
    assert [r.frame_index for r in results] == list(range(70))
    assert {r.session_id for r in results} == {0}
    assert session.policy.window_index >= 3 and session.policy.window_switches == session.policy.window_index
    windows = [r.window_index for r in results]
    assert windows == sorted(windows)
    for r in results:
        assert r.rope_frame_index < r.cache.max_frame_num
        assert r.cache.frames_stored <= SMALL["max_stored_frames"]
        assert r.cache.camera_cache_frames <= r.cache.camera_cache_capacity
        assert r.cache.special_pages <= r.cache.special_pages_capacity
        assert np.isfinite(r.c2w).all() and np.allclose(r.c2w[:3, :3] @ r.c2w[:3, :3].T, np.eye(3), atol=1e-9)
    first_new = [r for r in results if "window_switch" in r.frame_extra]
    assert len(first_new) == session.policy.window_switches
    assert not any(w.startswith("stored frames") for w in session.warnings())

    session.reset()  # the user's ~/reset: a new world frame, chain cleared
    assert session.session_id == 1 and session.policy.window_index == 0 and session.policy.overlap_buffered == 0
    assert session.policy.transform.is_identity
    out = []
    for i, frame in enumerate(random_frames(3, seed=5)):
        out += session.push(frame, float(100 + i))
    assert [r.frame_index for r in out] == [0, 1, 2] and {r.window_index for r in out} == {0}
    assert np.allclose(out[0].c2w[:3, 3], out[0].pose_enc[:3], atol=1e-6)  # window 0 publishes raw poses


def test_depth_head_alignment_with_real_model():
    session = tiny_session(with_depth=True)
    results = []
    for i, frame in enumerate(random_frames(30)):
        results += session.push(frame, float(i))
    assert len(results) == 30 and session.policy.window_switches >= 2
    assert session.policy.last_alignment.method == "depth-median"
    assert all(np.isfinite(r.c2w).all() and r.depth is not None and np.isfinite(r.depth).all() for r in results)


def test_policies_reset_and_stop():
    session = tiny_session(long_run_policy="reset")
    ids = []
    for i, frame in enumerate(random_frames(40)):
        ids += [r.session_id for r in session.push(frame, float(i))]
    assert ids == sorted(ids) and ids[-1] >= 2
    assert len(ids) + session.session.buffered == 40  # one result per frame (the last may wait for its scale partner)
    stop = tiny_session(long_run_policy="stop")
    done, reasons = 0, []
    for i, frame in enumerate(random_frames(20)):
        try:
            done += len(stop.push(frame, float(i)))
        except SessionStopped as exc:
            reasons.append(str(exc))
    assert done == 12 and len(reasons) == 8
    assert "max_stored_frames=12" in reasons[0] and all("reset" in r for r in reasons)
    assert any("'stop' reached" in w for w in stop.warnings())
    stop.reset()
    assert len(stop.push(random_frames(1)[0], 0.0)) == 0 and len(stop.push(random_frames(1)[0], 1.0)) == 2


# ------------------------------------------------------------------------------- soak
def _soak(n: int, kf: int, warmup: int = 300) -> dict:
    import psutil

    proc = psutil.Process()
    session = tiny_session(keyframe_interval=kf)
    frames = random_frames(16, seed=kf)
    counted, next_index, rss0 = 0, 0, 0
    start = time.perf_counter()
    for i in range(n):
        for r in session.push(frames[i % len(frames)], float(i)):
            assert r.frame_index == next_index and int(r.stamp) == next_index  # exactly one result per frame
            assert np.isfinite(r.c2w).all()
            next_index += 1
            counted += 1
        if i == warmup:
            gc.collect()
            rss0 = proc.memory_info().rss
    counted += len(session.flush())
    gc.collect()
    return dict(counted=counted, switches=session.policy.window_switches,
                growth_mb=(proc.memory_info().rss - rss0) / 2**20,
                seconds=time.perf_counter() - start)


@pytest.mark.slow
@pytest.mark.parametrize("n,kf", [(3000, 1), (1200, 2)])
def test_soak_windows_bounded_memory(n, kf):
    stats = _soak(n, kf)
    print(f"soak kf={kf}: {stats}")
    assert stats["counted"] == n
    assert stats["switches"] >= n // (12 * kf)  # several windows, not a single long session
    assert stats["growth_mb"] < 50, stats
