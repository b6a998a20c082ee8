"""``lingbot_map_offline --bag B --topic /front/image --topic /rear/image``: several cameras of one bag.

The reference of each camera is the same tool run on that topic alone (one ``--topic``: the single-camera
path, itself checked against the session in ``test_offline.py``). The bag holds two cameras at different
rates (10 and 7 frames over the same second, not synchronised), so ticks batch both cameras, then one
alone; each camera's poses must equal its lone run to 1e-6 while the batched step really ran. The node's
camera streams equal the same lone runs (with its anchoring), ``test_cameras_node.py``; with
``--base-frame`` the tool places the cameras in one world as that node does, ``test_offline_cameras_rig.py``.
"""
from __future__ import annotations

import numpy as np
import pytest
from replay_node import frames

from lingbot_map_ros.core.stream_group import StreamGroup
from lingbot_map_ros.core.trajectory import read_tum
from lingbot_map_ros.tools import offline
from lingbot_map_ros.tools.bag_io import write_cameras_bag
from lingbot_map_ros.tools.offline_cameras import camera_output, default_camera_name

COMMON = ["--model-preset", "tiny", "--device", "cpu", "--dtype", "float32", "--attention-backend", "sdpa",
          "--scale-frames", "2", "--sliding-window", "3", "--keyframe-interval", "2", "--camera-iterations", "2",
          "--seed", "11", "--quiet"]
FRONT = [100.0 + 0.1 * i for i in range(10)]
REAR = [100.03 + i / 7 for i in range(7)]


@pytest.fixture(scope="module")
def bag(tmp_path_factory):
    return write_cameras_bag(tmp_path_factory.mktemp("cameras") / "bag",
                             {"/front/image": (frames(10, 1), FRONT), "/rear/image": (frames(7, 2), REAR)})


def test_each_camera_equals_its_topic_run_alone(bag, tmp_path, monkeypatch):
    batched = []
    run_batch = StreamGroup._run_batch

    def counting(self, entries):
        batched.append(len(entries))
        return run_batch(self, entries)

    monkeypatch.setattr(StreamGroup, "_run_batch", counting)
    out, tum = tmp_path / "run.npz", tmp_path / "run.tum"
    rc = offline.main(["--bag", str(bag), "--topic", "/front/image", "--topic", "/rear/image",
                       "--out", str(out), "--tum", str(tum), *COMMON])
    assert rc == 0
    assert batched and all(b == 2 for b in batched)  # both cameras in one model call, several times
    monkeypatch.undo()
    assert not out.exists() and not tum.exists()  # only the per-camera files
    for name, topic, stamps in (("front", "/front/image", FRONT), ("rear", "/rear/image", REAR)):
        alone = tmp_path / f"{name}_alone.npz"
        assert offline.main(["--bag", str(bag), "--topic", topic, "--out", str(alone), *COMMON]) == 0
        got, want = np.load(tmp_path / f"run.{name}.npz"), np.load(alone)
        assert got["pose_enc"].shape == (len(stamps), 9)
        np.testing.assert_allclose(got["pose_enc"], want["pose_enc"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(got["c2w"], want["c2w"], rtol=0, atol=1e-5)
        np.testing.assert_array_equal(got["stamp"], want["stamp"])
        np.testing.assert_array_equal(got["is_keyframe"], want["is_keyframe"])
        tum_stamps, positions, _ = read_tum(tmp_path / f"run.{name}.tum")
        np.testing.assert_allclose(tum_stamps, stamps, atol=1e-6)
        np.testing.assert_allclose(positions, got["c2w"][:, :3, 3], atol=1e-9)
    # a negative control: the cameras' streams are not the same numbers
    assert not np.allclose(np.load(tmp_path / "run.front.npz")["pose_enc"][:7],
                           np.load(tmp_path / "run.rear.npz")["pose_enc"], atol=1e-3)


def test_camera_names_and_outputs():
    assert default_camera_name("/front/image") == "front"
    assert default_camera_name("rear/image/compressed") == "rear"
    assert camera_output("out/run.npz", "front") == "out/run.front.npz"
    assert camera_output("t.tum", "rear") == "t.rear.tum"


@pytest.mark.parametrize("extra, reason", [
    (["--camera-name", "a"], "1 names for 2 --topic"),
    (["--camera-name", "a", "--camera-name", "a"], "given more than once"),
    (["--camera-name", "a", "--camera-name", "2b"], "not camera names"),
    (["--ply", "m.ply"], "--ply goes with one --topic"),
    (["--save-session", "s"], "--save-session goes with one --topic"),
    (["--camera-frame", "cam"], "--camera-frame goes with one --topic"),
    (["--primary-camera", "rear"], "several cameras in one world need --base-frame"),
    (["--odom-frame", "odom"], "several cameras in one world need --base-frame"),
    (["--base-frame", "base_link", "--primary-camera", "side"], "'side' is not one of the cameras"),
    (["--base-frame", "base_link", "--scale-source", "depth"], "--scale-source depth goes with one --topic"),
    (["--base-frame", "base_link", "--camera-timeout", "0"], "--camera-timeout must be in"),
])
def test_several_topics_refuse_what_they_cannot_do(bag, tmp_path, capsys, extra, reason):
    rc = offline.main(["--bag", str(bag), "--topic", "/front/image", "--topic", "/rear/image",
                       "--out", str(tmp_path / "x.npz"), *COMMON, *extra])
    assert rc == 2
    err = capsys.readouterr().err
    assert reason in err and len(err.strip().splitlines()) == 1


def test_unknown_topic_and_lone_camera_name_are_refused(bag, tmp_path, capsys):
    rc = offline.main(["--bag", str(bag), "--topic", "/front/image", "--topic", "/side/image",
                       "--out", str(tmp_path / "x.npz"), *COMMON])
    assert rc == 2 and "/side/image" in capsys.readouterr().err
    rc = offline.main(["--bag", str(bag), "--topic", "/front/image", "--camera-name", "front",
                       "--out", str(tmp_path / "x.npz"), *COMMON])
    assert rc == 2 and "--camera-name names the cameras of several --topic" in capsys.readouterr().err
    rc = offline.main(["--bag", str(bag), "--topic", "/front/image", "--primary-camera", "front",
                       "--out", str(tmp_path / "x.npz"), *COMMON])
    assert rc == 2 and "--primary-camera chooses among the cameras of several --topic" in capsys.readouterr().err
