"""``lingbot_map_benchmark`` end to end with the tiny random model (CPU) on synthetic sequences in
TUM RGB-D's layout: one command prints the table in the official columns (with the official row)
and the per-sequence results, and writes the trajectories, the metrics JSON and a plot per sequence;
a broken sequence fails with one line naming its file while the others run; a second run resumes;
command-line mistakes are one line, exit 2, before any work."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from benchmark_layouts import write_kitti, write_tnt, write_tum

from lingbot_map_ros.core.geometry import se3_inverse
from lingbot_map_ros.core.trajectory import associate, pose_matrices, read_tum, trajectory_metrics

BIN = Path(sys.executable).parent
TINY = ["--model-preset", "tiny", "--scale-frames", "2", "--sliding-window", "3", "--camera-iterations", "1",
        "--device", "cpu"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def brute_force_pair_errors(c2w_est: np.ndarray, c2w_gt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every pair i < j: the relative pose W_i W_j^-1 of the world-to-camera matrices, formed one by one;
    rotation error from the relative rotations' angle, translation error the sign-free angle between
    the relative translations (the official auc.py's definitions, without its eps clamps)."""
    w_est, w_gt = np.linalg.inv(c2w_est), np.linalg.inv(c2w_gt)
    rot, trans = [], []
    for i in range(len(w_est)):
        for j in range(i + 1, len(w_est)):
            a, b = w_est[i] @ np.linalg.inv(w_est[j]), w_gt[i] @ np.linalg.inv(w_gt[j])
            cos_r = np.clip((np.trace(a[:3, :3].T @ b[:3, :3]) - 1) / 2, -1, 1)
            rot.append(np.degrees(np.arccos(cos_r)))
            ta, tb = a[:3, 3] / np.linalg.norm(a[:3, 3]), b[:3, 3] / np.linalg.norm(b[:3, 3])
            ang = np.degrees(np.arccos(np.clip(abs(ta @ tb), 0, 1)))
            trans.append(ang)
    return np.array(rot), np.array(trans)


def auc_percent(errors_deg: np.ndarray, threshold: int) -> float:
    hist, _ = np.histogram(errors_deg, bins=np.arange(threshold + 1))
    return float(np.mean(np.cumsum(hist) / errors_deg.size) * 100)


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "lingbot_map_benchmark"), *args], env=ENV, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """Two good TUM sequences and one without its groundtruth.txt; a KITTI sequence of KITTI's image size;
    a Neural RGB-D folder of the wrong layout."""
    root = tmp_path_factory.mktemp("bench")
    data = root / "TUM-RGBD"
    write_tum(data, "rgbd_dataset_freiburg1_xyz", n=7, seed=0)
    write_tum(data, "rgbd_dataset_freiburg1_desk", n=6, seed=1)
    write_tum(data, "rgbd_dataset_freiburg1_room", n=5, seed=2)
    (data / "rgbd_dataset_freiburg1_room" / "groundtruth.txt").unlink()
    write_kitti(root / "kitti", "07", n=6, hw=(376, 1241))
    (root / "nrgbd" / "breakfast_room").mkdir(parents=True)  # no images/ and poses.txt
    out = root / "results"
    proc = run("--dataset", "tum", str(data), "--dataset", "kitti", str(root / "kitti"), "--dataset", "nrgbd",
               str(root / "nrgbd"), "--out", str(out), *TINY)
    return root, data, out, proc


def test_one_command_prints_the_tables_and_writes_every_file(first_run):
    root, data, out, proc = first_run
    assert proc.returncode == 1, proc.stderr  # some sequences failed, the others ran
    lines = proc.stdout.splitlines()
    assert "## TUM RGB-D (--dataset tum): 2 of 3 sequences" in lines
    assert "| Dataset | #Scenes | ATE | RPE-trans | RPE-rot (deg) |" in lines
    ours = next(ln for ln in lines if ln.startswith("| TUM RGB-D (this run) | 2 |"))
    assert "| TUM RGB-D (official lingbot-map.pt) | 9 | 0.045 | 0.013 | 0.513 |" in lines
    summary = json.loads((out / "summary.json").read_text())
    tum = next(d for d in summary["datasets"] if d["dataset"] == "tum")
    per_seq = {}
    for name, frames in (("rgbd_dataset_freiburg1_xyz", 7), ("rgbd_dataset_freiburg1_desk", 6)):
        folder = out / "tum" / name
        m = json.loads((folder / "metrics.json").read_text())
        per_seq[name] = m
        assert m["frames"] == frames and m["evaluated"] == frames and m["sequence"] == name
        assert (folder / "plot.png").stat().st_size > 10_000 and (folder / "plot.png").read_bytes()[:4] == b"\x89PNG"
        row = next(ln for ln in lines if ln.startswith(f"| {name} | {frames} | {frames} |"))
        assert f"| {m['ate']:.4f} |" in row
        # the stored trajectory and ground truth give the JSON's numbers again (evo, associated by stamp)
        se, pe, qe = read_tum(folder / "traj.tum")
        sg, pg, qg = read_tum(folder / "gt.tum")
        assert len(se) == frames and len(sg) == frames
        pairs = associate(se, sg, 1e-6)
        again = trajectory_metrics(pose_matrices(pe[pairs[:, 0]], qe[pairs[:, 0]]),
                                   pose_matrices(pg[pairs[:, 1]], qg[pairs[:, 1]]))
        assert again.ate_rmse == pytest.approx(m["ate"], abs=1e-9)
        assert again.rpe_trans_rmse == pytest.approx(m["rpe_trans"], abs=1e-9)
        assert again.rpe_rot_rmse_deg == pytest.approx(m["rpe_rot"], abs=1e-7)
        # the model was fed the official TUM size: width 518, this synthetic camera's 4 px -> 14 px
        assert m["model_input_hw"] == [14, 518] and m["config"]["settings"]["model_preset"] == "tiny"
        assert 0 <= m["auc"]["auc@30"] <= 100 and m["auc"]["pairs"] == frames * (frames - 1) // 2
        # both AUC conventions: the official W_i W_j^-1 and the inverse one, from the stored poses again
        est_w2c, gt_w2c = se3_inverse(pose_matrices(pe, qe)), se3_inverse(pose_matrices(pg, qg))
        for key, est_c, gt_c in (("auc", pose_matrices(pe, qe), pose_matrices(pg, qg)),
                                 ("auc_inverse_convention", est_w2c, gt_w2c)):
            rot, trans = brute_force_pair_errors(est_c, gt_c)
            assert m[key]["auc@30"] == pytest.approx(auc_percent(np.maximum(rot, trans), 30), abs=1e-9)
    assert tum["ate"] == pytest.approx(np.mean([m["ate"] for m in per_seq.values()]))
    assert f"| {tum['ate']:.3f} |" in ours
    assert [f["sequence"] for f in tum["failed"]] == ["rgbd_dataset_freiburg1_room"]


def test_bad_input_fails_that_sequence_in_one_line_naming_the_file(first_run):
    root, data, out, proc = first_run
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    gone = data / "rgbd_dataset_freiburg1_room" / "groundtruth.txt"
    assert any(f"tum/rgbd_dataset_freiburg1_room: {gone}: no such file" in ln for ln in errors), proc.stderr
    assert any(f"--dataset nrgbd: {root / 'nrgbd'}: no Neural RGB-D scene" in ln for ln in errors), proc.stderr
    assert "Traceback" not in proc.stderr
    assert "| rgbd_dataset_freiburg1_room | failed: " in proc.stdout
    assert not (out / "tum" / "rgbd_dataset_freiburg1_room" / "metrics.json").exists()


def test_kitti_runs_at_the_official_image_size(first_run):
    root, data, out, proc = first_run
    m = json.loads((out / "kitti" / "07" / "metrics.json").read_text())
    # 1241x376 -> the official 504x280, and the model runs at that size (no node preprocessing after it)
    assert m["model_input_hw"] == [280, 504] and m["evaluated"] == 6
    assert m["config"]["image_size"] == "official" and m["config"]["settings"]["image_width"] is None
    assert m["config"]["precision"] == "official"
    assert "| KITTI (504x280) (official lingbot-map.pt) | 11 | 24.046 | 2.861 | 0.696 |" in proc.stdout
    assert "## KITTI (504x280) (--dataset kitti): 1 of 1 sequences" in proc.stdout


def test_a_second_run_resumes_and_reruns_only_what_is_missing(first_run):
    root, data, out, proc = first_run
    before = {p: p.stat().st_mtime_ns for p in out.glob("tum/*/metrics.json")}
    write_tum(data, "rgbd_dataset_freiburg1_room", n=5, seed=2)  # the ground truth is back
    again = run("--dataset", "tum", str(data), "--out", str(out), *TINY)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("done before") == 2 and "[2/3] tum/rgbd_dataset_freiburg1_room: ATE" in again.stderr
    assert {p: p.stat().st_mtime_ns for p in before} == before  # kept, not rewritten
    assert "## TUM RGB-D (--dataset tum): 3 of 3 sequences" in again.stdout
    # other settings: the stored results do not count
    other = run("--dataset", "tum", str(data), "--out", str(out), "--sequences", "rgbd_dataset_freiburg1_desk",
                *TINY, "--seed", "3")
    assert other.returncode == 0 and "done before" not in other.stderr, other.stderr
    assert "## TUM RGB-D (--dataset tum): 1 of 1 sequences" in other.stdout


def test_command_line_mistakes_are_one_line_before_any_work(tmp_path):
    for args, needle in (
        (["--dataset", "tum2", str(tmp_path)], "--dataset tum2: unknown dataset; use one of tum, 7scenes"),
        (["--dataset", "tum", str(tmp_path / "nowhere")], f"--dataset tum {tmp_path / 'nowhere'}: no such folder"),
        (["--dataset", "tum", str(tmp_path), "--keyframe-interval", "often"], "--keyframe-interval must be 'auto'"),
        (["--dataset", "tum", str(tmp_path), "--image-width", "280"], "--image-width needs --image-size node"),
        (["--dataset", "tum", str(tmp_path), "--precision", "half"], "--precision: invalid choice"),
    ):
        proc = run(*args, "--out", str(tmp_path / "out"), *TINY, timeout=60)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
        assert not (tmp_path / "out").exists()


def test_an_interrupted_run_keeps_the_finished_sequences(tmp_path):
    """SIGTERM (a job scheduler, Ctrl-C alike) during the second sequence: exit 130, the first one kept."""
    import signal

    data = tmp_path / "TUM-RGBD"
    write_tum(data, "rgbd_dataset_freiburg1_a", n=4, seed=0)
    write_tum(data, "rgbd_dataset_freiburg1_b", n=400, seed=1)
    out = tmp_path / "out"
    proc = subprocess.Popen([str(BIN / "lingbot_map_benchmark"), "--dataset", "tum", str(data), "--out", str(out),
                             *TINY], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "[1/2] tum/rgbd_dataset_freiburg1_a: ATE" in line:
                proc.send_signal(signal.SIGTERM)
                break
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 130, rest
    finally:
        proc.kill()
    assert "interrupted with 1 of 2 sequences done" in rest and "the same command again resumes" in rest
    assert (out / "tum" / "rgbd_dataset_freiburg1_a" / "metrics.json").is_file()
    assert not (out / "tum" / "rgbd_dataset_freiburg1_b").exists()
    assert json.loads((out / "summary.json").read_text())["datasets"][0]["sequences_done"] == 1


def test_official_scene_lists_and_the_node_image_width(tmp_path):
    """An extra Tanks and Temples scene is not run (nor averaged in) unless --all-scenes asks, and then the
    table marks it; --image-size node runs the node's preprocessing at --image-width and records it."""
    data = tmp_path / "TanksAndTemples"
    write_tnt(data, "Barn", n=4)
    write_tnt(data, "Courthouse", n=4)
    out = tmp_path / "out"
    proc = run("--dataset", "tnt", str(data), "--out", str(out), *TINY)
    assert proc.returncode == 0, proc.stderr
    assert "1 sequence(s) outside the official scene list not run (Courthouse); --all-scenes runs them" in proc.stderr
    assert "## Tanks and Temples (--dataset tnt): 1 of 1 sequences" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())["datasets"][0]
    barn = json.loads((out / "tnt" / "Barn" / "metrics.json").read_text())
    assert summary["ate"] == pytest.approx(barn["ate"]) and summary["outside_official_scenes"] == []
    assert not (out / "tnt" / "Courthouse").exists()
    assert barn["model_input_hw"] == [14, 518]  # the official PIL Lanczos resize to width 518

    again = run("--dataset", "tnt", str(data), "--out", str(out), "--all-scenes", "--image-size", "node",
                "--image-width", "280", *TINY)
    assert again.returncode == 0, again.stderr
    assert "| Courthouse * |" in again.stdout and "1 of them outside the official scenes: *" in again.stdout
    summary = json.loads((out / "summary.json").read_text())["datasets"][0]
    assert summary["outside_official_scenes"] == ["Courthouse"] and summary["sequences_done"] == 2
    for scene in ("Barn", "Courthouse"):
        m = json.loads((out / "tnt" / scene / "metrics.json").read_text())
        assert m["model_input_hw"] == [14, 280] and m["config"]["settings"]["image_width"] == 280
        assert m["config"]["image_size"] == "node"
