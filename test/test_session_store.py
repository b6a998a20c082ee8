"""Saved sessions (core/session_store.py, SessionManager.save/load, mapping off): a loaded session
continues exactly, bad folders are refused with their reason and the current session is kept.

The reference is always an uninterrupted run on the same random frames: the resumed run (loaded in
a NEW process) must give bit-identical pose_enc, c2w, depth and cache statistics on CPU fp32, with
evictions and long-run window switches both before and after the save.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lingbot_map_ros.core import session_store
from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig
from lingbot_map_ros.core.session_errors import SessionError
from lingbot_map_ros.core.session_manager import SessionCause, SessionManager
from lingbot_map_ros.core.session_store import SessionFileError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

H, W = 28, 42  # 2 x 3 patches
SCENARIOS = {
    # window switches every ~7 stored frames; keyframe_interval 2; eviction once the window (3) is full
    "tiny": dict(runtime=dict(model_preset="tiny", seed=1),
                 stream=dict(scale_frames=2, sliding_window=3, max_stored_frames=9, overlap_frames=4,
                             keyframe_interval=2, with_depth=True),
                 frames=56, save_at=28),
    "full": dict(runtime=dict(model_preset="full", seed=2),
                 stream=dict(scale_frames=2, sliding_window=2, max_stored_frames=6, overlap_frames=3,
                             keyframe_interval=1, camera_iterations=1, with_depth=False),
                 frames=16, save_at=8),
}


def manager_for(name: str, **stream) -> SessionManager:
    sc = SCENARIOS[name]
    runtime = RuntimeConfig(device="cpu", dtype="float32", attention_backend="sdpa", **sc["runtime"])
    return SessionManager.open(runtime, StreamConfig(**{**sc["stream"], **stream}), log=lambda m: None)


def frames_for(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, H, W, generator=g) for _ in range(n)]


def push_all(manager: SessionManager, frames) -> list:
    return [r for f in frames for r in manager.push(f)]


def summary(results) -> dict[str, np.ndarray]:
    """Everything compared bit for bit: outputs, poses in the world frame, numbering, cache statistics."""
    cache_fields = ("frames_stored", "scale_frames", "window_frames", "frames_evicted", "free_pages",
                    "special_tokens", "visible_keys", "camera_cache_frames")
    out = {
        "pose_enc": np.stack([r.pose_enc for r in results]),
        "c2w": np.stack([r.c2w for r in results]),
        "frame_index": np.array([r.frame_index for r in results]),
        "window_index": np.array([r.window_index for r in results]),
        "keyframe": np.array([r.is_keyframe for r in results]),
        "cache": np.array([[getattr(r.cache, f) for f in cache_fields] for r in results]),
    }
    if results and results[0].depth is not None:
        out["depth"] = np.stack([r.depth for r in results])
    return out


def _child_resume(name: str, session: str, out: str) -> None:
    """In a new process: load the session, push the remaining frames, write their summary."""
    torch.set_num_threads(1)
    sc = SCENARIOS[name]
    manager = manager_for(name)
    report = manager.load(session)
    results = push_all(manager, frames_for(sc["frames"])[sc["save_at"]:])
    np.savez(out, switches=manager.policy.window_switches, loaded_frames=report.frames, **summary(results))


def run_child(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_session_store as t; "
            "getattr(t, sys.argv[2])(*sys.argv[3:])")
    return subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), *args], capture_output=True,
                          text=True, timeout=timeout)


def check_resume_in_new_process(name: str, tmp_path: Path) -> None:
    sc = SCENARIOS[name]
    frames = frames_for(sc["frames"])
    manager = manager_for(name)
    first = push_all(manager, frames[:sc["save_at"]])
    switches_before = manager.policy.window_switches
    assert switches_before >= 1 and first[-1].cache.frames_evicted > 0  # both happened before the save
    report = manager.save(str(tmp_path / "s"))
    assert report.frames == sc["save_at"] and report.bytes > 0
    rest = push_all(manager, frames[sc["save_at"]:])  # the uninterrupted run goes on in this process
    assert manager.policy.window_switches > switches_before  # and a switch happens after the save too

    proc = run_child("_child_resume", name, str(tmp_path / "s"), str(tmp_path / "resumed.npz"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = np.load(tmp_path / "resumed.npz")
    assert int(resumed["switches"]) == manager.policy.window_switches
    expected = summary(rest)
    assert expected["frame_index"][0] == sc["save_at"]  # numbering continues
    for key, value in expected.items():
        np.testing.assert_array_equal(resumed[key], value, err_msg=key)


def test_tiny_resumes_bit_identical_in_a_new_process(tmp_path):
    check_resume_in_new_process("tiny", tmp_path)


@pytest.mark.slow
def test_full_preset_resumes_bit_identical_in_a_new_process(tmp_path):
    check_resume_in_new_process("full", tmp_path)


# ------------------------------------------------------------------------------- refusals
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny session saved after 20 frames, and the next frame's result of the uninterrupted run
    (one torch thread, as the tests that compare with it: a module fixture is set up before their
    ``one_torch_thread``, and another thread count may round differently)."""
    root = tmp_path_factory.mktemp("saved")
    frames = frames_for(24, seed=5)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        manager = manager_for("tiny")
        push_all(manager, frames[:20])
        manager.save(str(root / "good"))
        following = push_all(manager, frames[20:])
    finally:
        torch.set_num_threads(threads)
    return root / "good", frames, following


def copy_session(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def edit_manifest(path: Path, change) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def truncate(path: Path) -> None:
    f = path / "global_001.safetensors"
    f.write_bytes(f.read_bytes()[:-100])


def flip_byte(path: Path) -> None:
    f = path / "camera.safetensors"
    data = bytearray(f.read_bytes())
    data[-7] ^= 0x40
    f.write_bytes(bytes(data))


def newer(m): m["format_version"] = session_store.FORMAT_VERSION + 1  # noqa: E704
def other_model(m): m["identity"]["model"]["depth"] = 5  # noqa: E704
def other_dtype(m): m["identity"]["dtype"] = "bfloat16"  # noqa: E704


DAMAGE = {
    "missing folder": (lambda p: None, "no such folder", True),
    "not a session": (lambda p: (p / "manifest.json").unlink(), "is not a session", False),
    "manifest not json": (lambda p: (p / "manifest.json").write_text("{"), "damaged", False),
    "truncated tensor file": (truncate, "truncated", False),
    "flipped byte": (flip_byte, "CRC-32", False),
    "newer format version": (lambda p: edit_manifest(p, newer), "format version", False),
    "another model shape": (lambda p: edit_manifest(p, other_model), "model.depth", False),
    "another dtype": (lambda p: edit_manifest(p, other_dtype), "dtype", False),
}


def assert_session_kept(manager: SessionManager, frames, expected) -> None:
    """The refused load changed nothing: the next frames equal the uninterrupted run's."""
    got = push_all(manager, frames[20:])
    np.testing.assert_array_equal(summary(got)["pose_enc"], summary(expected)["pose_enc"])


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damaged_sessions_are_refused_and_the_session_kept(case, saved, tmp_path):
    good, frames, following = saved
    damage, reason, missing = DAMAGE[case]
    path = tmp_path / "bad"
    if not missing:
        copy_session(good, path)
        damage(path)
    manager = manager_for("tiny")
    push_all(manager, frames[:20])
    with pytest.raises(SessionFileError, match=reason):
        manager.load(str(path))
    assert manager.session_id == 0
    assert_session_kept(manager, frames, following)


@pytest.mark.parametrize("other, field", [(dict(runtime_seed=9), "weights"),
                                          (dict(sliding_window=4), "geometry.sliding_window")])
def test_a_session_of_other_weights_or_geometry_is_refused(other, field, saved):
    good, frames, _ = saved
    sc = SCENARIOS["tiny"]
    runtime = RuntimeConfig(device="cpu", dtype="float32", attention_backend="sdpa", model_preset="tiny",
                            seed=other.pop("runtime_seed", sc["runtime"]["seed"]))
    manager = SessionManager.open(runtime, StreamConfig(**{**sc["stream"], **other}), log=lambda m: None)
    with pytest.raises(SessionFileError, match=field.replace(".", r"\.")):
        manager.load(str(good))


def test_nothing_to_save_before_the_scale_frames(tmp_path):
    manager = manager_for("tiny")
    manager.push(frames_for(1)[0])  # 1 of 2 scale frames buffered
    with pytest.raises(SessionError, match="no map yet"):
        manager.save(str(tmp_path / "s"))
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------------------- writing
def test_a_failed_write_leaves_the_previous_session(saved, tmp_path, monkeypatch):
    """Disk full half way (ENOSPC from the writer after two files): the folder keeps the old
    session, which still loads; no temporary folder is left."""
    good, frames, following = saved
    path = copy_session(good, tmp_path / "s")
    before = {f.name: f.read_bytes() for f in path.iterdir()}
    real = session_store.atomic_open
    calls = []

    def full_disk(target, mode="w", **kw):
        calls.append(target)
        if len(calls) > 2:
            raise OSError(28, "No space left on device")
        return real(target, mode, **kw)

    monkeypatch.setattr(session_store, "atomic_open", full_disk)
    manager = manager_for("tiny")
    push_all(manager, frames[:12])
    with pytest.raises(SessionFileError, match="No space left on device"):
        manager.save(str(path))
    monkeypatch.undo()
    assert {f.name: f.read_bytes() for f in path.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
    loaded = manager_for("tiny")
    assert loaded.load(str(path)).frames == 20
    assert_session_kept(loaded, frames, following)


def test_a_read_only_folder_is_refused_with_the_reason(tmp_path, monkeypatch):
    """A read-only folder (as root, whom permissions do not stop, a read-only file system is simulated)."""
    manager = manager_for("tiny")
    push_all(manager, frames_for(4))
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    reason = "Permission denied"
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        def read_only(self, *args, **kwargs):
            raise OSError(errno.EROFS, "Read-only file system")

        monkeypatch.setattr(Path, "mkdir", read_only)
        reason = "Read-only file system"
    try:
        with pytest.raises(SessionFileError, match=reason):
            manager.save(str(folder / "s"))
    finally:
        monkeypatch.undo()
        folder.chmod(0o755)
    assert list(folder.iterdir()) == []


def _child_slow_save(session: str) -> None:
    """Save a session whose writer stalls after the first file (the parent kills us there)."""
    torch.set_num_threads(1)
    manager = manager_for("tiny")
    push_all(manager, frames_for(30, seed=7))
    real = session_store.atomic_open
    written = []

    def stalling(target, mode="w", **kw):
        if written:
            print("WRITING", flush=True)
            time.sleep(60)
        written.append(target)
        return real(target, mode, **kw)

    session_store.atomic_open = stalling
    manager.save(session)


def test_a_save_killed_half_way_leaves_the_previous_session_loadable(saved, tmp_path):
    good, frames, following = saved
    path = copy_session(good, tmp_path / "s")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_session_store as t; "
            "t._child_slow_save(sys.argv[2])")
    proc = subprocess.Popen([sys.executable, "-c", code, str(Path(__file__).parent), str(path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "WRITING"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    manager = manager_for("tiny")
    assert manager.load(str(path)).frames == 20  # the old session, not the 30 frames of the killed save
    assert_session_kept(manager, frames, following)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # the killed writer's folder
    manager.save(str(path))  # the next save removes it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_a_save_killed_between_its_renames_is_recovered(saved, tmp_path):
    """The one instant without the folder: the old one is parked next to it and put back on read."""
    good, frames, following = saved
    parked = copy_session(good, tmp_path / ".s.previous")
    assert parked.is_dir() and not (tmp_path / "s").exists()
    manager = manager_for("tiny")
    assert manager.load(str(tmp_path / "s")).frames == 20
    assert (tmp_path / "s").is_dir() and not parked.exists()
    assert_session_kept(manager, frames, following)


def test_only_pages_in_use_are_written(tmp_path):
    manager = manager_for("tiny")
    push_all(manager, frames_for(12))
    manager.save(str(tmp_path / "s"))
    from safetensors.torch import load_file

    block = load_file(str(tmp_path / "s" / "global_000.safetensors"))
    kv = manager.session._kv
    stored = len(kv.table.scale_pages) + len(kv.table.window_pages)
    assert block["patch"].shape[1] == stored < kv.table.num_patch_pages
    assert block["special"].shape[1] == kv.table.special_tokens
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["format_version"] == session_store.FORMAT_VERSION
    assert manifest["identity"]["weights"] == "random:tiny:seed=1"
    assert manifest["session"]["global_cache"]["table"]["window"] == kv.table.window_pages


# ------------------------------------------------------------------------------- localization
def map_hash(manager: SessionManager) -> str:
    """Every byte of the map: each block's pages in use and special stream, the camera cache's stored
    frames, the page table (free-list order included) and the session's counters."""
    session = manager.session
    state = session.state_dict()
    for counter in ("frame_index", "last_visible_keys"):  # frames seen, and the last step's key count
        state.pop(counter)
    h = hashlib.sha256(json.dumps(state, sort_keys=True).encode())
    for b in range(session.num_cache_blocks):
        for name, t in sorted(session.block_tensors(b).items()):
            h.update(name.encode())
            h.update(t.contiguous().numpy().tobytes())
    h.update(session.camera_tensor().contiguous().numpy().tobytes())
    return h.hexdigest()


def test_mapping_off_stores_nothing_and_every_frame_gets_a_pose(tmp_path):
    frames = frames_for(130, seed=9)
    manager = manager_for("tiny")
    push_all(manager, frames[:12])
    manager.save(str(tmp_path / "map"))
    localizer = manager_for("tiny")
    localizer.load(str(tmp_path / "map"))
    localizer.session.mapping = False
    before = map_hash(localizer)
    results = push_all(localizer, frames[12:112])
    assert len(results) == 100
    assert [r.frame_index for r in results] == list(range(12, 112))  # numbering continues
    assert all(np.isfinite(r.c2w).all() and not r.is_keyframe for r in results)
    assert map_hash(localizer) == before
    # each localized pose is what the map alone gives: the same frame pushed right after the load
    fresh = manager_for("tiny")
    fresh.load(str(tmp_path / "map"))
    fresh.session.mapping = False
    np.testing.assert_array_equal(fresh.push(frames[111])[0].pose_enc, results[-1].pose_enc)
    # mapping on again: the map grows from the next keyframe
    localizer.session.mapping = True
    stored = localizer.session.frames_stored
    push_all(localizer, frames[112:116])
    assert localizer.session.frames_stored > stored


def test_mapping_off_without_a_map_refuses_frames():
    manager = manager_for("tiny")
    manager.session.mapping = False
    with pytest.raises(SessionError, match="no map yet"):
        manager.push(frames_for(1)[0])


def test_load_starts_a_session_the_listener_hears(saved):
    good, _, _ = saved
    manager = manager_for("tiny")
    heard = []
    manager.on_new_session = heard.append
    report = manager.load(str(good))
    assert [s.cause for s in heard] == [SessionCause.LOADED] and report.session_id == 1 == manager.session_id
    assert "20 frames" in report.message()


# ------------------------------------------------------------------------------- other pools
def test_a_cache_loads_into_other_pools_with_the_same_attention():
    """Saved with the official pools and LIFO order, loaded into tight pools with the ``lowest``
    order (what the GPU's dense backends use) and the reverse: the next step attends identically."""
    from lingbot_map_ros.core.cache import PagedKVCache

    g = torch.Generator().manual_seed(3)
    common = dict(num_blocks=2, num_heads=2, head_dim=8, page_size=4, scale_frames=2, sliding_window=3,
                  max_frame_num=40, dtype=torch.float32, device="cpu")
    official = PagedKVCache(**common)
    tight = PagedKVCache(**common, num_patch_pages=6, special_pages=12, allocation="lowest")
    tokens = official.tokens_per_frame

    def step(cache, frames, store, qkv=None):
        cache.begin_step(frames, store=store)
        n = frames * tokens
        q, k, v = qkv if qkv is not None else (torch.randn(n, 2, 8, generator=g) for _ in range(3))
        out = [cache(b, q, k, v) for b in range(2)]
        cache.end_step()
        return out

    for source, target in ((official, tight), (tight, official)):
        source.reset()
        step(source, 2, True)
        for i in range(7):  # keyframes and non-keyframes, evictions
            step(source, 1, i % 3 != 2)
        target.load_state(source.state_dict(), source.block_tensors)
        assert target.stats().frames_evicted == source.stats().frames_evicted > 0
        qkv = tuple(torch.randn(tokens, 2, 8, generator=g) for _ in range(3))
        for a, b in zip(step(source, 1, True, qkv), step(target, 1, True, qkv)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_session_of_another_frame_size_loads_and_a_refusal_keeps_the_current_caches(saved, tmp_path):
    """Loading a session made at another frame size checks it without building caches for it: a
    refusal leaves the running session's caches, and a good one replaces them."""
    good, frames, following = saved
    big = manager_for("tiny")
    push_all(big, [torch.rand(3, 2 * H, W) for _ in range(6)])
    big.save(str(tmp_path / "big"))
    damaged = copy_session(tmp_path / "big", tmp_path / "damaged")
    edit_manifest(damaged, lambda m: m["session"]["global_cache"]["table"].update(frames_stored=1))
    manager = manager_for("tiny")
    push_all(manager, frames[:20])
    with pytest.raises(SessionFileError, match="inconsistent page table"):
        manager.load(str(damaged))
    assert_session_kept(manager, frames, following)
    manager.load(str(tmp_path / "big"))
    assert manager.push(torch.rand(3, 2 * H, W))[0].image_hw == (2 * H, W)


# ------------------------------------------------------------------------------- offline tool
def test_offline_second_recording_continues_in_the_world_of_the_first(tmp_path, capsys):
    """``--save-session`` after recording 1, ``--load-session`` for recording 2 = one run over both;
    ``--no-mapping`` localizes recording 2 without storing a frame."""
    from lingbot_map_ros.tools import offline

    g = torch.Generator().manual_seed(11)
    first, second = (torch.rand(n, 3, H, W, generator=g).numpy() for n in (12, 8))
    for name, frames in (("first", first), ("second", second), ("both", np.concatenate([first, second]))):
        np.save(tmp_path / f"{name}.npy", frames)
    common = ["--model-preset", "tiny", "--device", "cpu", "--dtype", "float32", "--attention-backend", "sdpa",
              "--scale-frames", "2", "--sliding-window", "3", "--keyframe-interval", "2",
              "--max-stored-frames", "8", "--overlap-frames", "3", "--seed", "4", "--quiet"]
    run = lambda *args: offline.main(common + list(args))  # noqa: E731
    assert run("--frames", str(tmp_path / "both.npy"), "--out", str(tmp_path / "both.npz")) == 0
    assert run("--frames", str(tmp_path / "first.npy"), "--out", str(tmp_path / "1.npz"),
               "--save-session", str(tmp_path / "s")) == 0
    assert run("--frames", str(tmp_path / "second.npy"), "--out", str(tmp_path / "2.npz"),
               "--load-session", str(tmp_path / "s")) == 0
    both, resumed = np.load(tmp_path / "both.npz"), np.load(tmp_path / "2.npz")
    for key in ("pose_enc", "c2w", "frame_index", "is_keyframe", "window_index"):
        np.testing.assert_array_equal(resumed[key], both[key][12:], err_msg=key)
    assert run("--frames", str(tmp_path / "second.npy"), "--out", str(tmp_path / "3.npz"),
               "--load-session", str(tmp_path / "s"), "--no-mapping") == 0
    local = np.load(tmp_path / "3.npz")
    assert not local["is_keyframe"].any() and np.isfinite(local["c2w"]).all()
    assert local["frame_index"].tolist() == list(range(12, 20))
    assert run("--frames", str(tmp_path / "second.npy"), "--out", str(tmp_path / "4.npz"),
               "--load-session", str(tmp_path / "nothing")) == 2
    assert "--load-session: " in capsys.readouterr().err and not (tmp_path / "4.npz").exists()


# ------------------------------------------------------------------------------- metric scale
def test_a_locked_and_a_re_estimating_scale_continue_after_a_load():
    """ScaleEstimator.state_dict through JSON: the lock (map, relocks) and an open round's anchor come
    back, so the next lock continues from the same anchor as without the save."""
    from lingbot_map_ros.core.scale import LOCKED, RE_ESTIMATING, DepthSample, ScaleEstimator

    est = ScaleEstimator("depth", min_samples=2)
    for _ in range(2):
        est.add_depth(DepthSample(2.0, 1.0))
    est.start_window(np.array([0.3, -1.0, 4.0]))
    copy = ScaleEstimator("depth", min_samples=2)
    copy.load_state(json.loads(json.dumps(est.state_dict())))
    assert copy.status().state == RE_ESTIMATING and copy.map.factor == est.map.factor
    for e in (est, copy):
        for _ in range(2):
            e.add_depth(DepthSample(2.2, 1.0))
    assert copy.status().state == LOCKED and copy.status().relocks == est.status().relocks == 1
    np.testing.assert_array_equal(copy.map.offset, est.map.offset)
    other = ScaleEstimator("odometry")
    other.load_state(est.state_dict())  # another source decides its own unit: nothing taken
    assert other.map is None


def test_a_capture_is_the_session_at_that_instant_while_frames_go_on(tmp_path):
    """A save copies the session between two frames (``SessionCapture``) and writes the copy later:
    the frames pushed before the write - pages rewritten, a window switch - must not reach the file
    (on the CPU a pool's ``.cpu()`` is the pool itself; without the copy this test fails)."""
    frames = frames_for(40)
    at = 22  # the next frames still read the captured cache before the policy switches windows
    manager = manager_for("tiny")
    push_all(manager, frames[:at])
    capture = manager.capture()
    switches = manager.policy.window_switches
    rest = push_all(manager, frames[at:at + 12])  # the pools change under the capture
    assert manager.policy.window_switches > switches
    report = capture.write(str(tmp_path / "s"))
    assert report.frames == at and 0 < report.capture_seconds <= report.seconds
    resumed = manager_for("tiny")
    resumed.load(str(tmp_path / "s"))
    expected, got = summary(rest), summary(push_all(resumed, frames[at:at + 12]))
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_the_writer_makes_safetensors_files_and_takes_their_crc(tmp_path):
    """``write_tensors`` (the writer that leaves the interpreter lock to other threads) against the
    library's reader, on fresh random tensors of every dtype a session holds, and the CRC-32 and
    size against the file's bytes."""
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(int(time.time()) % 10_000)
    tensors = {
        "patch": torch.randn(2, 3, 5, 2, 4, generator=g).to(torch.bfloat16),
        "special": torch.randn(2, 7, 2, 4, generator=g, dtype=torch.float64).to(torch.float16),
        "a_f32": torch.randn(3, 1, generator=g),
        "overlap_depth": torch.randn(11, generator=g, dtype=torch.float64),
        "steps": torch.randint(-5, 5, (4,), generator=g),
        "mask": torch.rand(6, generator=g) > 0.5,
        "image": torch.randint(0, 255, (3, 2, 2), generator=g, dtype=torch.uint8),
        "strided": torch.randn(4, 6, generator=g)[:, ::2],  # not contiguous
        "empty": torch.zeros(0, 3),
    }
    path = tmp_path / "x.safetensors"
    with open(path, "wb") as f:
        size, crc = session_store.write_tensors(f, tensors)
    data = path.read_bytes()
    assert size == len(data) and crc == __import__("zlib").crc32(data)
    assert (8 + int.from_bytes(data[:8], "little")) % 8 == 0  # tensors start 8-byte aligned
    back = load_file(str(path))
    assert sorted(back) == sorted(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
        torch.testing.assert_close(back[name], t, rtol=0, atol=0)


def test_a_capture_is_written_once(tmp_path):
    manager = manager_for("tiny")
    push_all(manager, frames_for(6))
    capture = manager.capture()
    capture.write(str(tmp_path / "a"))
    with pytest.raises(SessionFileError, match="written already"):
        capture.write(str(tmp_path / "b"))
    assert not (tmp_path / "b").exists()


def test_a_prepared_load_commits_between_frames_and_the_session_continues(saved):
    """``prepare_load`` reads and checks while the current session goes on (the node does it off the
    inference thread); ``commit_load`` then replaces the session between two frames: the next frames
    equal the uninterrupted run of the saved session."""
    good, frames, following = saved
    manager = manager_for("tiny")
    push_all(manager, frames[:5])
    prepared = manager.prepare_load(str(good))
    assert prepared.staged_on == "host" and manager.session_id == 0
    push_all(manager, frames[5:9])  # the current session runs on between the two halves
    report = manager.commit_load(prepared)
    assert report.staged_on == "host" and 0 <= report.pause_seconds <= report.seconds
    assert report.frames == 20 and manager.session_id == 1 and prepared.groups == {}
    assert_session_kept(manager, frames, following)


def test_a_commit_after_the_settings_changed_is_refused_and_the_session_kept(saved):
    good, frames, following = saved
    manager = manager_for("tiny")
    prepared = manager.prepare_load(str(good))
    manager.commit_load(prepared)  # the session of the fixture
    again = manager.prepare_load(str(good))
    sc = SCENARIOS["tiny"]
    manager.apply(manager.host.settings, StreamConfig(**{**sc["stream"], "sliding_window": 4}))  # a new session
    session_id = manager.session_id
    push_all(manager, frames[:3])
    with pytest.raises(SessionFileError, match=r"no longer fits.*geometry\.sliding_window"):
        manager.commit_load(again)
    assert manager.session_id == session_id and manager.stream_cfg.sliding_window == 4
    assert manager.session.snapshot().frames_stored == 3
