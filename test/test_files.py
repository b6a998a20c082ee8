"""The one atomic writer (``core/files.py``) and every output that goes through it.

The reference for permissions is a plain ``open(path, "w")`` in the same folder under the same
umask: an output must be readable by exactly whom such a file would be (``mkstemp`` gave 0600).
Failures (an exception in the middle, Ctrl-C, a rename that cannot happen) must leave the previous
file intact and no temporary file behind.
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import numpy as np
import pytest

from lingbot_map_ros.core.files import atomic_open, atomic_write_bytes, atomic_write_text

PKG = Path(__file__).resolve().parents[1] / "lingbot_map_ros"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def plain_open_mode(folder: Path) -> int:
    """What ``open(path, "w")`` gives a new file here, now (the independent reference)."""
    ref = folder / "reference_plain_open.txt"
    with open(ref, "w") as f:
        f.write("x")
    m = mode(ref)
    ref.unlink()
    return m


@pytest.fixture(params=[0o022, 0o027, 0o002], ids=lambda m: f"umask{m:03o}")
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def test_new_file_gets_the_mode_of_a_plain_open(tmp_path, umask):
    target = tmp_path / "out.bin"
    atomic_write_bytes(target, b"abc", b"def")
    assert target.read_bytes() == b"abcdef"
    assert mode(target) == plain_open_mode(tmp_path) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_existing_file_keeps_its_mode_like_a_plain_open(tmp_path):
    target = tmp_path / "private.txt"
    target.write_text("old")
    os.chmod(target, 0o640)
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and mode(target) == 0o640


@pytest.mark.parametrize("error", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_failure_in_the_middle_keeps_the_old_file_and_leaves_no_temporary(tmp_path, error):
    target = tmp_path / "traj.tum"
    target.write_text("previous content\n")
    with pytest.raises(type(error)):
        with atomic_open(target, "w") as f:
            f.write("half of the new")
            raise error
    assert target.read_text() == "previous content\n"
    assert [p.name for p in tmp_path.iterdir()] == ["traj.tum"]


def test_failed_rename_leaves_no_temporary(tmp_path):
    target = tmp_path / "a_folder"
    target.mkdir()  # os.replace of a file onto a folder fails
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"data")
    assert target.is_dir() and sorted(p.name for p in tmp_path.iterdir()) == ["a_folder"]


def test_parents_and_modes(tmp_path):
    nested = tmp_path / "a" / "b" / "c.txt"
    with pytest.raises(FileNotFoundError):
        atomic_write_text(nested, "x")
    assert not (tmp_path / "a").exists()
    atomic_write_text(nested, "x", parents=True)
    assert nested.read_text() == "x"
    with pytest.raises(ValueError, match="mode"):
        with atomic_open(tmp_path / "y", "a"):
            pass


def test_every_package_output_gets_the_mode_of_a_plain_open(tmp_path, umask):
    """PLY, COLMAP text, TUM, the offline tool's .npz/.json and the figure: one rule for all."""
    from lingbot_map_ros.core.reconstruction import write_colmap_text, write_ply
    from lingbot_map_ros.core.trajectory import write_tum

    rng = np.random.default_rng(3)
    expected = plain_open_mode(tmp_path)
    write_ply(tmp_path / "map.ply", rng.random((10, 3)), rng.integers(0, 255, (10, 3)), rng.random(10))
    c2w = np.stack([np.eye(4)] * 2)
    k = np.stack([np.array([[100.0, 0, 50], [0, 100, 40], [0, 0, 1]])] * 2)
    write_colmap_text(tmp_path / "colmap", c2w, k, (80, 100), ["a.png", "b.png"], rng.random((5, 3)))
    write_tum(tmp_path / "t.tum", [0.0, 1.0], c2w)
    outputs = [tmp_path / "map.ply", tmp_path / "t.tum"] + [tmp_path / "colmap" / n for n in
                                                            ("cameras.txt", "images.txt", "points3D.txt")]
    from lingbot_map_ros.core.results import CacheSnapshot, FrameResult
    from lingbot_map_ros.tools.offline import save_results

    results = [FrameResult(frame_index=i, session_id=1, stamp=float(i), pose_enc=np.zeros(9, np.float32),
                           c2w=np.eye(4), intrinsics=np.eye(3), image_hw=(80, 100), is_keyframe=True,
                           is_scale_frame=False, rope_frame_index=i, cache=CacheSnapshot())
               for i in range(2)]
    save_results(results, str(tmp_path / "r.npz"), str(tmp_path / "r.tum"))
    save_results(results, str(tmp_path / "r.json"))
    outputs += [tmp_path / "r.npz", tmp_path / "r.tum", tmp_path / "r.json"]
    from lingbot_map_ros.tools.plotting import RunSeries, plot_run

    plot_run(tmp_path / "p.png", RunSeries.from_results(results))
    outputs.append(tmp_path / "p.png")
    for path in outputs:
        assert path.is_file() and path.stat().st_size > 0, path
        assert mode(path) == expected, (path.name, oct(mode(path)), oct(expected))
    leftovers = [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


# a rename over the target, a temporary file: the two halves of an atomic write done by hand
HAND_WRITTEN = re.compile(r"\bos\.(replace|rename)\(|\bmkstemp\(|NamedTemporaryFile\(|\btmp\w*\.(replace|rename)\(")


def test_one_atomic_writer_in_the_package():
    """Renames and temporary files are written in one place only (hand-written copies drifted: one
    gave 0600, one left its temporary file behind on failure)."""
    offenders = [f"{path.relative_to(PKG)}:{n}: {line.strip()}"
                 for path in sorted(PKG.rglob("*.py")) if path != PKG / "core" / "files.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1) if HAND_WRITTEN.search(line)]
    assert offenders == [], offenders
