"""The command-line tools a user touches first and real recording formats.

Every tool runs as the user runs it: its console script in a child process. Errors must be one
line on stderr naming the file, exit 2, no traceback; stamps must survive from file names to the
TUM output and associate with a ground truth; progress must show on a terminal (a pseudo-terminal
here) and not in a pipe; Ctrl-C must leave what was done; plots must hold the panels' data; ROS 1
and rosbag2 recordings (raw, JPEG, PNG) must go through the offline tool, depth ones be refused.
Images are 148x4 pixels (a 14x518 model input, the cheapest the real pipeline accepts).
"""
from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lingbot_map_ros.core.geometry import quaternion_to_matrix, se3
from lingbot_map_ros.core.trajectory import read_tum, write_tum
from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.frame_sources import stamp_from_name

BIN = Path(sys.executable).parent
TINY = ["--model-preset", "tiny", "--scale-frames", "2", "--sliding-window", "3", "--camera-iterations", "1"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
TUM_STAMPS = ["1305031102.175304", "1305031102.211214", "1305031102.243211", "1305031102.275326",
              "1305031102.311267", "1305031102.343321"]


def run(tool: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / tool), *args], env=ENV, capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str, code: int = 2) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def strip(h: int = 4, w: int = 148, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def write_images(folder: Path, names: list[str], suffix: str = ".png") -> Path:
    import cv2

    folder.mkdir(parents=True, exist_ok=True)
    for i, n in enumerate(names):
        assert cv2.imwrite(str(folder / f"{n}{suffix}"), strip(seed=i))
    return folder


def gt_trajectory(n: int) -> np.ndarray:
    t = np.linspace(0, 2, n)
    q = np.stack([0.1 * np.sin(t), 0.2 * np.cos(t), 0.05 * t, np.ones(n)], 1)
    return se3(quaternion_to_matrix(q), np.stack([np.sin(t), np.cos(2 * t), 0.3 * t], 1))


# ----------------------------------------------------------------------------------- stamps


def test_stamps_from_names():
    assert stamp_from_name("1305031102.175304") == float("1305031102.175304")
    assert stamp_from_name("1403636579763555584") == pytest.approx(1403636579.763555584, abs=1e-6)
    assert stamp_from_name("000123") is None and stamp_from_name("frame_01") is None


@pytest.mark.slow
def test_tum_sequence_offline_then_eval_associates_every_pose(tmp_path):
    """A folder named like a TUM RGB-D sequence -> TUM stamps = file-name stamps ->
    evaluation against a ground truth with the same stamps associates every pose."""
    seq = tmp_path / "rgbd_dataset_freiburg1_xyz"
    rgb = write_images(seq / "rgb", TUM_STAMPS)
    out, tum, plot = tmp_path / "r.npz", tmp_path / "traj.tum", tmp_path / "run.png"
    proc = run("lingbot_map_offline", "--images", str(rgb), "--out", str(out), "--tum", str(tum),
               "--plot", str(plot), *TINY)
    assert proc.returncode == 0, proc.stderr
    assert "stamps from file names" in proc.stderr
    stamps, _, _ = read_tum(tum)
    assert stamps.tolist() == [float(s) for s in TUM_STAMPS]
    assert np.load(out)["stamp"].tolist() == [float(s) for s in TUM_STAMPS]
    assert plot.is_file() and plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"

    gt = tmp_path / "groundtruth.txt"
    write_tum(gt, [float(s) for s in TUM_STAMPS], gt_trajectory(len(TUM_STAMPS)))
    ev = run("lingbot_map_eval", str(tum), str(gt))
    assert ev.returncode == 0, ev.stderr
    assert f"associated {len(TUM_STAMPS)} poses (estimated {len(TUM_STAMPS)}, reference {len(TUM_STAMPS)}" in ev.stdout
    assert "warning" not in ev.stderr


@pytest.mark.slow
def test_stamps_file_rgb_txt_and_fps_and_jpeg(tmp_path):
    names = [f"frame_{i:03d}" for i in range(4)]
    folder = write_images(tmp_path / "imgs", names, suffix=".jpeg")  # *.jpeg counts
    # TUM rgb.txt form: 'stamp path' lines choose the images and give their stamps
    rgb_txt = tmp_path / "rgb.txt"
    rgb_txt.write_text("# color images\n# timestamp filename\n"
                       + "".join(f"{100.5 + i * 0.25:.6f} imgs/{n}.jpeg\n" for i, n in enumerate(names)))
    out, tum = tmp_path / "a.json", tmp_path / "a.txt"
    proc = run("lingbot_map_offline", "--images", str(folder), "--stamps", str(rgb_txt), "--out", str(out),
               "--tum", str(tum), "--quiet", *TINY)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and not (tmp_path / "a.json.npz").exists()
    assert read_tum(tum)[0].tolist() == [100.5 + i * 0.25 for i in range(4)]
    # one stamp per line, in name order; then --fps
    plain = tmp_path / "stamps.txt"
    plain.write_text("".join(f"{7 + i}\n" for i in range(4)))
    out2, tum2 = tmp_path / "b.npz", tmp_path / "b.tum"
    assert run("lingbot_map_offline", "--images", str(folder), "--stamps", str(plain), "--out", str(out2),
               "--tum", str(tum2), "--quiet", *TINY).returncode == 0
    assert read_tum(tum2)[0].tolist() == [7.0, 8.0, 9.0, 10.0]
    tum3 = tmp_path / "c.tum"
    assert run("lingbot_map_offline", "--images", str(folder), "--fps", "4", "--out", str(tmp_path / "c.npz"),
               "--tum", str(tum3), "--quiet", *TINY).returncode == 0
    assert read_tum(tum3)[0].tolist() == [0.0, 0.25, 0.5, 0.75]
    # a stamps file that does not fit the folder: one line, before any work
    plain.write_text("1\n2\n")
    assert_one_line_error(run("lingbot_map_offline", "--images", str(folder), "--stamps", str(plain), "--out",
                              str(tmp_path / "d.npz"), *TINY), "2 stamps for 4 images", "--stamps")


@pytest.mark.slow
def test_video_stamps_are_the_container_timestamps(tmp_path):
    import cv2

    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 8, (148, 8))
    for i in range(5):
        writer.write(np.ascontiguousarray(np.concatenate([strip(seed=i), strip(seed=i + 9)])[:, :, ::-1]))
    writer.release()
    tum = tmp_path / "v.tum"
    proc = run("lingbot_map_offline", "--video", str(path), "--out", str(tmp_path / "v.npz"), "--tum", str(tum),
               "--quiet", *TINY)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(read_tum(tum)[0], [i / 8 for i in range(5)], atol=1e-6)


@pytest.mark.slow
def test_eval_warns_on_duplicate_and_backward_stamps_and_takes_a_tolerance(tmp_path):
    poses = gt_trajectory(8)
    st = np.arange(8) * 0.1
    write_tum(tmp_path / "gt.tum", st, poses)
    bad = st.copy()
    bad[3] = bad[2]  # a duplicate
    bad[6], bad[7] = bad[7], bad[6]  # out of order
    write_tum(tmp_path / "est.tum", bad, poses)
    proc = run("lingbot_map_eval", str(tmp_path / "est.tum"), str(tmp_path / "gt.tum"))
    assert proc.returncode == 0, proc.stderr
    assert "1 duplicate stamps" in proc.stderr and "1 going backwards" in proc.stderr
    # stamps 30 ms off: nothing within the default 20 ms, everything within --tolerance 0.05
    write_tum(tmp_path / "late.tum", st + 0.03, poses)
    assert_one_line_error(run("lingbot_map_eval", str(tmp_path / "late.tum"), str(tmp_path / "gt.tum")),
                          "only 0 poses associated")
    ok = run("lingbot_map_eval", str(tmp_path / "late.tum"), str(tmp_path / "gt.tum"), "--tolerance", "0.05")
    assert ok.returncode == 0 and "associated 8 poses" in ok.stdout, ok.stderr


def test_eval_warns_about_a_recording_played_twice(tmp_path):
    """Every stamp twice, never twice in a row (a bag replayed into one file): 8 duplicates, one step back."""
    poses = gt_trajectory(16)
    st = np.arange(8) * 0.1
    write_tum(tmp_path / "gt.tum", st, poses[:8])
    write_tum(tmp_path / "est.tum", np.concatenate([st, st]), poses)
    proc = run("lingbot_map_eval", str(tmp_path / "est.tum"), str(tmp_path / "gt.tum"))
    assert proc.returncode == 0, proc.stderr
    warning = next(ln for ln in proc.stderr.splitlines() if "est.tum" in ln)
    assert "warning:" in warning and "8 duplicate stamps" in warning and "1 going backwards" in warning


# ----------------------------------------------------------------------------------- errors


@pytest.mark.slow
def test_every_tool_answers_bad_input_in_one_line(tmp_path):
    folder = write_images(tmp_path / "imgs", TUM_STAMPS[:2])
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "1.5.png").write_bytes(b"not a png at all")
    not_video = tmp_path / "clip.mp4"
    not_video.write_bytes(b"\x00" * 100)
    still = write_images(tmp_path / "still", ["photo"]) / "photo.png"  # FFmpeg reads it as a 1-frame video
    still_named_mp4 = tmp_path / "photo.mp4"
    still_named_mp4.write_bytes(still.read_bytes())
    text_checkpoint = tmp_path / "notes.pt"
    text_checkpoint.write_text("these are my notes, not weights\n" * 20)
    import torch

    class Evil:
        def __reduce__(self):
            return (print, ("this ran code from a checkpoint",))

    torch.save({"model": Evil()}, tmp_path / "evil.pt")
    off = ["lingbot_map_offline", *TINY]
    out = ["--out", str(tmp_path / "x.npz")]
    cases = [
        (off + ["--images", str(tmp_path / "missing")] + out, ["--images", "no such folder"]),
        (off + ["--images", str(tmp_path / "broken")] + out, ["1.5.png", "not a readable image"]),
        (off + ["--video", str(tmp_path / "missing.mp4")] + out, ["--video", "no such file"]),
        (off + ["--video", str(not_video)] + out, ["clip.mp4", "cannot decode"]),
        (off + ["--video", str(still)] + out, ["photo.png", "a still image (PNG), not a video", "--images"]),
        (off + ["--video", str(still_named_mp4)] + out, ["photo.mp4", "a still image (PNG)"]),
        (off + ["--images", str(folder), "--checkpoint", str(text_checkpoint)] + out,
         ["notes.pt", "not a PyTorch or safetensors checkpoint: a text file"]),
        (off + ["--bag", str(tmp_path / "missing_bag")] + out, ["missing_bag", "no such bag"]),
        (off + ["--bag", str(folder)] + out, ["not a rosbag2 folder"]),
        (off + ["--images", str(folder), "--checkpoint", str(tmp_path / "none.pt")] + out, ["none.pt"]),
        (off + ["--images", str(folder), "--checkpoint", str(tmp_path / "evil.pt")] + out,
         ["evil.pt", "--allow-unsafe-checkpoint"]),
        (off + ["--images", str(folder), "--out", str(tmp_path / "no" / "dir" / "x.npz")], ["mkdir -p"]),
        (off + ["--images", str(folder), "--out", str(tmp_path / "x.txt")], ["unknown extension '.txt'", ".npz"]),
        (off + ["--images", str(folder), "--plot", str(tmp_path / "nodir" / "p.png")] + out, ["--plot"]),
        (off + ["--images", str(folder), "--sliding-window", "0"] + out, ["sliding_window"]),
        (off + ["--images", str(folder)], ["--out"]),  # argparse's own error, one line too
        (["lingbot_map_eval", str(tmp_path / "nope.tum"), str(tmp_path / "gt.tum")], ["nope.tum", "no such file"]),
        (["lingbot_map_replay", str(tmp_path / "missing_bag")], ["missing_bag", "no such bag"]),
        (["lingbot_map_replay", str(folder)], ["not a rosbag2 folder"]),
        (["lingbot_map_demo", "--checkpoint", str(tmp_path / "none.pt")], ["none.pt"]),
        (["lingbot_map_demo", "--tum", str(tmp_path / "nodir" / "t.tum")], ["--tum", "does not exist"]),
    ]
    for argv, needles in cases:
        proc = run(argv[0], *argv[1:])
        line = assert_one_line_error(proc, *needles)
        assert line.startswith(f"{argv[0]}: error: "), line
    assert not (tmp_path / "x.npz").exists()


def test_help_documents_every_option():
    for tool in ("lingbot_map_offline", "lingbot_map_eval", "lingbot_map_replay", "lingbot_map_demo"):
        proc = run(tool, "--help")
        assert proc.returncode == 0
        # every option line has text after its name (argparse puts bare options alone on a line)
        opts = [line for line in proc.stdout.splitlines() if line.strip().startswith("--")]
        assert opts, tool
        text = proc.stdout
        for line in opts:
            name = line.split()[0].rstrip(",")
            assert len(line.split()) > 2 or text.split(line, 1)[1].lstrip("\n").startswith("   "), (tool, name)
    offline = run("lingbot_map_offline", "--help").stdout
    for needle in ("--stamps", "--plot", "(default: 0", "ROS 1 .bag", "(default: 'window'"):
        assert needle in offline, needle


# ----------------------------------------------------------------------------------- progress, Ctrl-C


def _read_pty(master: int, proc: subprocess.Popen, timeout: float, until=None) -> str:
    """What the child prints on the terminal until it closes it or exits, or until ``until(text)``."""
    text = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            text += chunk
            if until is not None and until(text.decode(errors="replace")):
                break
        elif proc.poll() is not None:
            break
    return text.decode(errors="replace")


def _run_on_pty(argv: list[str], until=None, timeout: float = 240) -> tuple[subprocess.Popen, str, int]:
    """Run with stdout/stderr on a pseudo-terminal; return (process, everything it printed, fd).
    With ``until`` (a function of the text so far), return as soon as it is true (the process still runs)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, env=ENV, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    return proc, _read_pty(master, proc, timeout, until), master


def _drain(master: int, proc: subprocess.Popen, timeout: float = 120) -> str:
    text = _read_pty(master, proc, timeout)
    proc.wait(timeout=30)
    os.close(master)
    return text


@pytest.mark.slow
def test_progress_on_a_terminal_quiet_in_a_pipe_and_ctrl_c_writes_what_was_done(tmp_path):
    n = 400
    frames = np.random.default_rng(1).random((n, 3, 14, 518), dtype=np.float32)
    np.save(tmp_path / "f.npy", frames)
    out, tum = tmp_path / "part.npz", tmp_path / "part.tum"
    argv = [str(BIN / "lingbot_map_offline"), "--frames", str(tmp_path / "f.npy"), "--out", str(out),
            "--tum", str(tum), *TINY]
    # the bar is redrawn a few times a second, not per frame: wait for any count of at least 5 done
    # (a substring like "5/400" would also match "345/400", by which time the run is nearly over)
    proc, text, master = _run_on_pty(
        argv, until=lambda t: any(int(k) >= 5 for k in re.findall(rf"\] (\d+)/{n}", t)))
    assert proc.poll() is None, text
    assert "frames/s" in text and "ETA" in text and "\r" in text, text
    os.kill(proc.pid, signal.SIGINT)  # Ctrl-C
    text += _drain(master, proc)
    assert proc.returncode == 130, text
    assert "interrupted: wrote the" in text and "Traceback" not in text, text
    done = np.load(out)["pose_enc"].shape[0]
    assert 5 <= done < n
    assert len(read_tum(tum)[0]) == done

    # the same tool in a pipe: no bar, no carriage returns
    np.save(tmp_path / "g.npy", frames[:4])
    piped = run("lingbot_map_offline", "--frames", str(tmp_path / "g.npy"), "--out", str(tmp_path / "g.npz"), *TINY)
    assert piped.returncode == 0, piped.stderr
    assert "ETA" not in piped.stderr and "\r" not in piped.stderr and "4 frames (0 dropped)" in piped.stderr


def test_progress_bar_text():
    import io

    from lingbot_map_ros.tools.progress import Progress, format_seconds

    buf = io.StringIO()
    bar = Progress(10, "x", stream=buf, enabled=True, min_interval=0.0)
    bar._start -= 2.0  # two seconds in
    bar.update(4)
    assert "4/10" in bar.line() and "ETA 0:03" in bar.line() and "2.00 frames/s" in bar.line()
    bar.close()
    assert buf.getvalue().endswith("\n")
    assert format_seconds(3725) == "1:02:05"
    silent = io.StringIO()
    Progress(10, "x", stream=silent).update(3)  # StringIO is not a terminal
    assert silent.getvalue() == ""


def test_plot_has_the_panels_data(tmp_path):
    from lingbot_map_ros.tools.plotting import RunSeries, plot_run

    n = 20
    series = RunSeries(frame=np.arange(n), position=np.random.default_rng(0).random((n, 3)),
                       latency_ms=np.linspace(10, 30, n),
                       cache={k: np.arange(n) + i for i, k in enumerate(("scale", "window", "free", "special"))})
    drawn = plot_run(tmp_path / "p.png", series)
    assert (tmp_path / "p.png").stat().st_size > 10_000
    assert drawn["axes"] == ["trajectory (top view)", "model latency per frame", "KV-cache occupancy"]
    np.testing.assert_array_equal(drawn["top_view"][1], series.position[:, 2])
    np.testing.assert_array_equal(drawn["latency"][1], series.latency_ms)
    assert sorted(drawn["cache"]) == ["free", "scale", "special", "window"]
    np.testing.assert_array_equal(drawn["cache"]["special"][1], np.arange(n) + 3)


def _label_boxes_overlap(axis, renderer) -> list[tuple[str, str]]:
    """Pairs of visible tick labels of ``axis`` whose rendered boxes touch or overlap (brute force)."""
    labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:]
            if ba.x0 <= bb.x1 and bb.x0 <= ba.x1 and ba.y0 <= bb.y1 and bb.y0 <= ba.y1]


@pytest.mark.parametrize("scale", [1e-3, 1.0, 2.5e5])
def test_plot_tick_labels_never_overlap(tmp_path, scale):
    """The demo's top view spans millimetres in a narrow equal-aspect panel: its x labels
    ("-0.0035-0.0030-0.0025...") ran into each other. Checked on the rendered figure."""
    from lingbot_map_ros.tools.plotting import RunSeries, plot_run

    rng = np.random.default_rng(int(scale * 1000) % 2**32)
    n = 40
    walk = np.cumsum(rng.normal(size=(n, 3)), 0)
    walk[:, 0] *= 4  # wide and flat: the worst case for the x labels of an equal-aspect panel
    position = -0.0035 + scale * walk / np.abs(walk).max()
    series = RunSeries(frame=np.arange(n), position=position, latency_ms=rng.uniform(600, 900, n),
                       cache={"scale": np.full(n, 2), "window": np.minimum(np.arange(n), 8)})
    drawn = plot_run(tmp_path / "p.png", series)
    fig = drawn["figure"]
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            assert len([t for t in axis.get_ticklabels() if t.get_text()]) >= 2, ax.get_title()
            assert _label_boxes_overlap(axis, renderer) == [], (ax.get_title(), scale)


# ----------------------------------------------------------------------------------- recordings


def _depth(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 5000, (4, 148), dtype=np.uint16)


def recordings(tmp_path: Path, storage: str) -> dict:
    """One recording per kind, all written by rosbags: ROS 1 (``storage='ros1'``) or rosbag2."""
    ext = ".bag" if storage == "ros1" else ""
    st = [50.0 + 0.1 * i for i in range(5)]
    colour = [strip(seed=i) for i in range(5)]
    return {
        "raw": (bag_io.write_image_bag(tmp_path / f"{storage}_raw{ext}", colour, st, storage=storage,
                                       encoding="bgr8"), st, colour),
        "jpeg": (bag_io.write_image_bag(tmp_path / f"{storage}_jpeg{ext}", colour, st, storage=storage,
                                        compressed="jpeg", topic="/cam/image_raw/compressed"), st, colour),
        "png": (bag_io.write_image_bag(tmp_path / f"{storage}_png{ext}", colour, st, storage=storage,
                                       compressed="png", topic="/cam/image_raw/compressed"), st, colour),
        "depth_raw": (bag_io.write_image_bag(tmp_path / f"{storage}_depth{ext}", [_depth(i) for i in range(5)], st,
                                             storage=storage, encoding="16UC1", topic="/depth"), st, None),
        "depth_png": (bag_io.write_image_bag(tmp_path / f"{storage}_depth_png{ext}", [_depth(i) for i in range(5)],
                                             st, storage=storage, compressed="png", topic="/depth/compressed",
                                             compressed_format="16UC1; png compressed"), st, None),
        "depth_cd": (bag_io.write_image_bag(tmp_path / f"{storage}_depth_cd{ext}", [_depth(i) for i in range(5)],
                                            st, storage=storage, compressed="png", topic="/depth/compressedDepth",
                                            compressed_format="16UC1; compressedDepth png"), st, None),
    }


@pytest.mark.parametrize("storage", ["ros1", "mcap"])
def test_recordings_read_back_and_depth_refused_with_one_reason(tmp_path, storage):
    from lingbot_map_ros.ros.image_io import UnsupportedImage

    recs = recordings(tmp_path, storage)
    for kind in ("raw", "png"):
        bag, st, colour = recs[kind]
        got = list(bag_io.iter_bag_images(bag))
        assert [s for _, s in got] == pytest.approx(st, abs=1e-9)
        assert all(np.array_equal(a, b) for (a, _), b in zip(got, colour)), kind  # lossless
    jpeg = [rgb for rgb, _ in bag_io.iter_bag_images(recs["jpeg"][0])]
    # JPEG of noise is lossy: same size, same overall brightness
    assert len(jpeg) == 5 and jpeg[0].shape == (4, 148, 3)
    assert abs(float(jpeg[0].mean()) - float(recs["jpeg"][2][0].mean())) < 10
    # ROS 1 messages become ROS 2 CDR for the replay tool: the Jazzy types read them back
    store = bag_io._typestore()
    msgtype, raw, t_ns = next(bag_io.iter_bag_messages(recs["raw"][0]))
    msg = store.deserialize_cdr(raw, msgtype)
    assert msg.encoding == "bgr8" and msg.width == 148 and bag_io.stamp_seconds(msg.header) == pytest.approx(50.0)
    reasons = set()
    for kind in ("depth_raw", "depth_png", "depth_cd"):
        with pytest.raises(UnsupportedImage) as exc:
            next(bag_io.iter_bag_images(recs[kind][0]))
        reasons.add(str(exc.value).split(": ", 1)[-1])
        assert "a depth image (16UC1), not a camera image" in str(exc.value)
    assert len(reasons) == 1, reasons  # raw and compressed depth: the same reason


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["ros1", "sqlite3"])
def test_offline_takes_both_bag_formats_and_refuses_depth(tmp_path, storage):
    recs = recordings(tmp_path, storage)
    for kind in ("raw", "jpeg", "png"):
        bag, st, _ = recs[kind]
        tum = tmp_path / f"{kind}.tum"
        proc = run("lingbot_map_offline", "--bag", str(bag), "--out", str(tmp_path / f"{kind}.npz"), "--tum",
                   str(tum), "--quiet", *TINY)
        assert proc.returncode == 0, (kind, proc.stderr)
        np.testing.assert_allclose(read_tum(tum)[0], st, atol=1e-6)
    for kind in ("depth_raw", "depth_png", "depth_cd"):
        bag = recs[kind][0]
        proc = run("lingbot_map_offline", "--bag", str(bag), "--out", str(tmp_path / "d.npz"), *TINY)
        assert_one_line_error(proc, bag.name, "/depth", "a depth image (16UC1), not a camera image", "--topic")
        proc = run("lingbot_map_replay", str(bag), "--wait-subscriber", "0")
        assert_one_line_error(proc, bag.name, "a depth image (16UC1), not a camera image")
    assert not (tmp_path / "d.npz").exists()


@pytest.mark.slow
def test_test_script_says_loudly_when_nothing_was_collected():
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(["bash", str(root / "scripts" / "test.sh"), "-k", "zz_no_such_test_typo_zz"], env=ENV,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr  # CI's exit code is kept
    assert "NO TESTS RAN" in proc.stderr and "NOTHING WAS TESTED" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_eval_into_a_pipe_that_closes_early_ends_quietly(tmp_path):
    """`lingbot_map_eval est gt | head`: a reader that leaves early; no traceback, exit 0."""
    import subprocess
    import sys

    import numpy as np

    from lingbot_map_ros.core.trajectory import write_tum

    stamps = np.arange(200, dtype=np.float64) * 0.1
    poses = np.tile(np.eye(4), (200, 1, 1))
    poses[:, 0, 3] = np.sin(stamps)
    poses[:, 2, 3] = stamps
    write_tum(str(tmp_path / "gt.tum"), stamps, poses)
    write_tum(str(tmp_path / "est.tum"), stamps, poses * 1.0)
    cmd = (f"{sys.executable} -m lingbot_map_ros.tools.evaluate {tmp_path / 'est.tum'} "
           f"{tmp_path / 'gt.tum'} | true")  # the reader is gone before the first line
    out = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
    assert out.returncode == 0, (out.returncode, out.stderr)
