"""The benchmark's dataset readers on synthetic sequences written in each dataset's published layout:
they find every sequence, its frames in order with their stamps, and the ground truth of each frame
in the optical camera-to-world convention (from TUM quaternions, 7-Scenes matrices, Neural RGB-D's
OpenGL cameras, KITTI's 3x4 rows, ETH3D's world-to-camera COLMAP and npz files, Tanks and Temples'
logs, EuRoC's body poses and T_BS, TartanAir's NED cameras); the official image steps give the
official sizes; bad input fails with one line naming the file."""
from __future__ import annotations

import numpy as np
import pytest
from benchmark_layouts import (
    image,
    save,
    write_7scenes,
    write_droid_w,
    write_eth3d_prepared,
    write_eth3d_published,
    write_euroc,
    write_kitti,
    write_nrgbd,
    write_oxford,
    write_tartanair,
    write_tnt,
    write_tum,
    write_vbr,
)

from lingbot_map_ros.core.trajectory import pose_matrices, read_tum
from lingbot_map_ros.tools.datasets import READERS, DatasetError

ATOL = 1e-8  # the files hold 9 to 17 significant digits


def check(seq, written, every: int = 1) -> None:
    assert seq.images == written.images[::every]
    np.testing.assert_allclose(seq.stamps, written.stamps[::every], rtol=0, atol=1e-6)
    np.testing.assert_allclose(seq.gt_c2w, written.c2w[::every], rtol=0, atol=ATOL)


def test_every_cli_dataset_has_a_reader_with_a_protocol():
    assert {"tum", "7scenes", "eth3d", "nrgbd", "kitti", "oxford", "vbr", "droid_w", "euroc", "tartanair"} \
        <= set(READERS)
    for name, reader in READERS.items():
        p = reader.protocol
        assert reader.name == name and p.stride >= 1 and p.title
        assert (p.official is None) == (not p.source), name  # official numbers always name their source files


def test_tum(tmp_path):
    a = write_tum(tmp_path, "rgbd_dataset_freiburg1_xyz", n=9, seed=0)
    b = write_tum(tmp_path, "rgbd_dataset_freiburg1_desk", n=7, seed=1)
    (tmp_path / "not_a_sequence").mkdir()
    reader = READERS["tum"]
    assert reader.find(tmp_path) == ["rgbd_dataset_freiburg1_desk", "rgbd_dataset_freiburg1_xyz"]
    check(reader.load(tmp_path, "rgbd_dataset_freiburg1_xyz", 1), a)
    check(reader.load(tmp_path, "rgbd_dataset_freiburg1_desk", 2), b, every=2)
    # a sequence folder itself is a dataset of one
    assert reader.find(tmp_path / "rgbd_dataset_freiburg1_xyz") == ["."]
    assert reader.load(tmp_path / "rgbd_dataset_freiburg1_xyz", ".", 1).name == "rgbd_dataset_freiburg1_xyz"


def test_tum_frames_without_ground_truth_stay_in_the_stream(tmp_path):
    w = write_tum(tmp_path, n=8)
    gt = tmp_path / "rgbd_dataset_freiburg1_xyz" / "groundtruth.txt"
    lines = gt.read_text().splitlines()
    cut = float(w.stamps[5]) - 0.03  # the motion capture lost the camera after frame 4
    gt.write_text("\n".join(ln for ln in lines if ln.startswith("#") or float(ln.split()[0]) < cut) + "\n")
    seq = READERS["tum"].load(tmp_path, "rgbd_dataset_freiburg1_xyz", 1)
    assert len(seq.images) == 8 and seq.frames_with_gt == 5
    assert np.isnan(seq.gt_c2w[5:]).all() and "3 of 8 frames" in seq.notes[0]


def test_7scenes_test_split_and_stride(tmp_path):
    written = write_7scenes(tmp_path, "chess", (3, 5), n=12)
    write_7scenes(tmp_path, "fire", (2,), n=6)
    reader = READERS["7scenes"]
    assert reader.find(tmp_path) == ["chess/seq-03", "chess/seq-05", "fire/seq-02"]
    assert reader.protocol.stride == 5
    check(reader.load(tmp_path, "chess/seq-05", 5), written["chess/seq-05"], every=5)
    assert reader.load(tmp_path, "chess/seq-03", 5).safe_name == "chess_seq-03"


def test_nrgbd_opengl_poses_become_optical(tmp_path):
    w = write_nrgbd(tmp_path, n=12)
    reader = READERS["nrgbd"]
    assert reader.find(tmp_path) == ["breakfast_room"] and reader.protocol.stride == 5
    check(reader.load(tmp_path, "breakfast_room", 5), w, every=5)


def test_kitti(tmp_path):
    w = write_kitti(tmp_path, "05", n=8)
    (tmp_path / "sequences" / "13" / "image_2").mkdir(parents=True)  # test set: no public ground truth
    reader = READERS["kitti"]
    assert reader.find(tmp_path) == ["05"]
    check(reader.load(tmp_path, "05", 1), w)


def test_eth3d_both_layouts_and_the_official_selection(tmp_path):
    published = write_eth3d_published(tmp_path, "courtyard", n=6)
    prepared = write_eth3d_prepared(tmp_path, "delivery_area")
    write_eth3d_published(tmp_path, "meadow", n=3)  # left out by the official protocol
    reader = READERS["eth3d"]
    found = reader.find(tmp_path)
    assert found == ["courtyard", "delivery_area", "meadow"]
    assert [n for n in found if reader.protocol.is_official_scene(n)] == ["courtyard", "delivery_area"]
    check(reader.load(tmp_path, "courtyard", 1), published)
    check(reader.load(tmp_path, "delivery_area", 1), prepared)  # DSC_0711 dropped


def test_tnt(tmp_path):
    w = write_tnt(tmp_path, "Barn", n=6)
    write_tnt(tmp_path, "Courtroom", n=3)  # not an official scene, but a scene all the same
    reader = READERS["tnt"]
    assert reader.find(tmp_path) == ["Barn", "Courtroom"]
    assert not reader.protocol.is_official_scene("Courtroom") and reader.protocol.is_official_scene("Barn")
    check(reader.load(tmp_path, "Barn", 1), w)


def test_euroc_body_poses_times_t_bs(tmp_path):
    w = write_euroc(tmp_path, "MH_01_easy", n=8)
    reader = READERS["euroc"]
    assert reader.find(tmp_path) == ["MH_01_easy"] and reader.protocol.official is None
    check(reader.load(tmp_path, "MH_01_easy", 1), w)


def test_tartanair_ned_cameras_become_optical(tmp_path):
    w = write_tartanair(tmp_path, "abandonedfactory/Easy/P001", n=8)
    write_tartanair(tmp_path, "abandonedfactory/Hard/P000", n=3)
    reader = READERS["tartanair"]
    assert reader.find(tmp_path) == ["abandonedfactory/Easy/P001", "abandonedfactory/Hard/P000"]
    check(reader.load(tmp_path, "abandonedfactory/Easy/P001", 1), w)


def test_oxford_spires_stride_12_and_the_excluded_scenes(tmp_path):
    w = write_oxford(tmp_path, "keble-college-02", n=26)
    write_oxford(tmp_path, "christ-church-01", n=3)  # excluded by the official protocol
    reader = READERS["oxford"]
    assert reader.protocol.stride == 12
    assert reader.find(tmp_path) == ["christ-church-01", "keble-college-02"]
    assert not reader.protocol.is_official_scene("christ-church-01")
    seq = reader.load(tmp_path, "keble-college-02", 12)
    assert len(seq.images) == 3  # frames 0, 12, 24
    check(seq, w, every=12)


def test_vbr_ground_truth_keyed_by_frame_index(tmp_path):
    w = write_vbr(tmp_path, "campus_train0", n=8, gt_frames=(0, 1, 2, 4, 5, 7))  # 3 and 6 have no pose
    write_vbr(tmp_path, "spagna_train0", n=3)
    reader = READERS["vbr"]
    assert reader.find(tmp_path) == ["campus_train0", "spagna_train0"]
    seq = reader.load(tmp_path, "campus_train0", 1)
    assert seq.images == w.images and seq.frames_with_gt == 6
    assert np.isnan(seq.gt_c2w[[3, 6]]).all()
    np.testing.assert_allclose(seq.gt_c2w[[0, 1, 2, 4, 5, 7]], w.c2w[[0, 1, 2, 4, 5, 7]], rtol=0, atol=ATOL)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_droid_w_nearest_ground_truth_within_50_ms_against_brute_force(tmp_path, seed):
    w, gt_stamps, _ = write_droid_w(tmp_path, "downtown1", n=24, seed=seed)
    reader = READERS["droid_w"]
    assert reader.find(tmp_path) == ["downtown1"]  # videos_mp4/ is not a scene
    seq = reader.load(tmp_path, "downtown1", 1)
    assert seq.images == w.images
    np.testing.assert_array_equal(seq.stamps, w.stamps)
    # brute force over the file as written: every image against every line, nearest first, <= 0.05 s
    stamps, pos, quat = read_tum(tmp_path / "downtown1" / "traj_gt.txt")
    hits = 0
    for k, s in enumerate(w.stamps):
        d = [abs(g - s) for g in stamps]
        j = min(range(len(d)), key=lambda i: (d[i], i))
        if d[j] <= 0.05:
            hits += 1
            np.testing.assert_allclose(seq.gt_c2w[k], pose_matrices(pos[j:j + 1], quat[j:j + 1])[0], rtol=0, atol=0)
        else:
            assert np.isnan(seq.gt_c2w[k]).all(), k
    assert seq.frames_with_gt == hits and 0 < hits < len(w.stamps)  # the gap leaves some frames without
    assert "have no ground-truth pose within 0.05 s" in seq.notes[0]


def test_droid_w_reads_the_fastlivo_ground_truth_when_it_is_the_one_there(tmp_path):
    write_droid_w(tmp_path, "downtown4", n=8, pose_file="traj_gt_fastlivo.txt")
    seq = READERS["droid_w"].load(tmp_path, "downtown4", 2)
    assert len(seq.images) == 4 and seq.ground_truth.endswith("traj_gt_fastlivo.txt")


# ------------------------------------------------------------------------ the official image steps
@pytest.mark.parametrize("dataset, size_wh, expect_wh", [
    ("tum", (640, 480), (518, 378)),
    ("7scenes", (640, 480), (574, 434)),
    ("nrgbd", (640, 480), (574, 434)),
    ("kitti", (1241, 376), (504, 280)),
    ("eth3d", (1512, 1008), (518, 336)),  # ETH3D's 6048x4032, quartered
    ("tnt", (1920, 1080), (518, 280)),
    ("oxford", (1440, 1080), (518, 378)),
    ("vbr", (1388, 700), (504, 280)),
    ("droid_w", (1600, 1200), (518, 378)),
    ("euroc", (752, 480), (752, 480)),  # no official protocol: the node's preprocessing only
])
def test_official_image_sizes(dataset, size_wh, expect_wh):
    w, h = size_wh
    out = READERS[dataset].protocol.prepare(image(1, (h, w)))
    assert out.dtype == np.uint8 and out.shape == (expect_wh[1], expect_wh[0], 3)


def test_kitti_crop_keeps_the_centre():
    rgb = np.zeros((376, 1241, 3), np.uint8)
    rgb[:, 620] = 255  # one bright column in the middle, one at the far left
    rgb[:, 5] = 255
    out = READERS["kitti"].protocol.prepare(rgb)
    bright = np.nonzero(out[:, :, 0].max(0))[0]
    assert bright.size and abs(bright.mean() - 252) < 2  # the centre column survives, the left one is cut


# ------------------------------------------------------------------------------------- bad input
def test_wrong_layout_names_the_folder(tmp_path):
    save(tmp_path / "pictures" / "a.png", image(0))
    for name in READERS:
        with pytest.raises(DatasetError, match=str(tmp_path)):
            READERS[name].find(tmp_path)


def test_missing_ground_truth_names_the_file(tmp_path):
    cases = {
        "tum": (write_tum, "rgbd_dataset_freiburg1_xyz", "rgbd_dataset_freiburg1_xyz/groundtruth.txt"),
        "7scenes": (lambda r: write_7scenes(r, "chess", (3,), n=6), "chess/seq-03",
                    "chess/seq-03/frame-000000.pose.txt"),
        "nrgbd": (write_nrgbd, "breakfast_room", "breakfast_room/poses.txt"),
        "kitti": (write_kitti, "05", "poses/05.txt"),
        "eth3d": (write_eth3d_published, "courtyard", "courtyard/images/dslr_images_undistorted/DSC_0300.JPG"),
        "tnt": (write_tnt, "Barn", "Barn/Barn_COLMAP_SfM.log"),
        "euroc": (write_euroc, "MH_01_easy", "MH_01_easy/mav0/state_groundtruth_estimate0/data.csv"),
        "tartanair": (lambda r: write_tartanair(r, "env/Easy/P000"), "env/Easy/P000", "env/Easy/P000/pose_left.txt"),
        "oxford": (write_oxford, "keble-college-02", "keble-college-02/images/000003.png"),
        "vbr": (write_vbr, "campus_train0", "processed_gt/campus_train0_gt.txt"),
    }
    for dataset, (write, name, gone) in cases.items():
        root = tmp_path / dataset
        write(root)
        (root / gone).unlink()
        assert name in READERS[dataset].find(root), dataset
        with pytest.raises(DatasetError, match=f"{root / gone}: no such"):
            READERS[dataset].load(root, name, 1)
    # DROID-W: a scene without its ground truth is not a scene; a ground truth of another recording
    write_droid_w(tmp_path / "droid", "downtown2")
    (tmp_path / "droid" / "downtown2" / "traj_gt.txt").unlink()
    with pytest.raises(DatasetError, match="no DROID-W scene"):
        READERS["droid_w"].find(tmp_path / "droid")
    write_droid_w(tmp_path / "droid", "downtown2")
    gt = tmp_path / "droid" / "downtown2" / "traj_gt.txt"
    stamps, pos, quat = read_tum(gt)
    gt.write_text("".join(f"{s + 100.0} {' '.join(map(str, p))} {' '.join(map(str, q))}\n"
                          for s, p, q in zip(stamps, pos, quat)))
    with pytest.raises(DatasetError, match=r"traj_gt.txt: no pose within 0.05 s of any image"):
        READERS["droid_w"].load(tmp_path / "droid", "downtown2", 1)


def test_mismatched_stamps_and_counts_name_the_file(tmp_path):
    write_tum(tmp_path / "tum", gt_offset=100.0)  # ground truth of another recording
    with pytest.raises(DatasetError, match=r"groundtruth.txt: no pose within 0.02 s of any image"):
        READERS["tum"].load(tmp_path / "tum", "rgbd_dataset_freiburg1_xyz", 1)
    write_kitti(tmp_path / "kitti", n=6)
    poses = tmp_path / "kitti" / "poses" / "05.txt"
    poses.write_text("".join(poses.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(DatasetError, match=r"poses/05.txt: 5 poses for 6 images"):
        READERS["kitti"].load(tmp_path / "kitti", "05", 1)
    times = tmp_path / "kitti" / "sequences" / "05" / "times.txt"
    times.write_text(times.read_text() + "9.9\n")
    with pytest.raises(DatasetError, match=r"times.txt: 7 stamps for 6 images"):
        READERS["kitti"].load(tmp_path / "kitti", "05", 1)
    write_tartanair(tmp_path / "tartan", "e/Easy/P000", n=4)
    save(tmp_path / "tartan" / "e/Easy/P000/image_left/000004_left.png", image(9))
    with pytest.raises(DatasetError, match=r"pose_left.txt: 4 poses for 5 images"):
        READERS["tartanair"].load(tmp_path / "tartan", "e/Easy/P000", 1)


def test_unreadable_lines_name_file_and_line(tmp_path):
    write_kitti(tmp_path, n=4)
    poses = tmp_path / "poses" / "05.txt"
    rows = poses.read_text().splitlines()
    rows[2] = rows[2] + " 1.0"
    poses.write_text("\n".join(rows) + "\n")
    with pytest.raises(DatasetError, match=r"poses/05.txt:3: expected 12 numbers, got 13"):
        READERS["kitti"].load(tmp_path, "05", 1)
    write_7scenes(tmp_path / "7s", "chess", (3,), n=3)
    (tmp_path / "7s" / "chess" / "TestSplit.txt").write_text("sequence3\nseq4\n")
    with pytest.raises(DatasetError, match=r"TestSplit.txt:2: expected 'sequenceN'"):
        READERS["7scenes"].find(tmp_path / "7s")
