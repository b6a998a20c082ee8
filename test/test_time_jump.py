"""``ros/time_jump.py``: stamps that go back in time are found, once, with the size of the jump.

The detector is checked against a brute-force reference on random stamp sequences (replays,
clock resets, repeated stamps, session changes); the node's use of it (a new session, every frame
with one final status) is tested in test_node_pipeline.py and, through ``ros2 launch`` with
``use_sim_time``, in test_ros_tools.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from lingbot_map_ros.ros.time_jump import TIME_JUMP_COUNTER, TimeJumpDetector


def reference(stamps, sessions, tolerance):
    """The jump (previous - stamp) for each frame that went back within its session, else None. A
    jump starts a new session (the caller's), and the frame after the jump's frame is compared with
    it."""
    out = []
    for i, (t, sid) in enumerate(zip(stamps, sessions)):
        same = i > 0 and (sessions[i - 1] == sid or out[i - 1] is not None)
        back = same and t < stamps[i - 1] - tolerance
        out.append(stamps[i - 1] - t if back else None)
    return out


def run_like_the_worker(det, stamps, resets):
    """Frames through ``det`` as the inference thread sends them: session ids move on at a reset
    (``resets[i]``: a ~/reset before frame i) and after every jump (the worker's new session)."""
    session, got = 0, []
    for t, reset in zip(stamps, resets):
        session += int(reset)
        reason = det.check(float(t), session)
        got.append(reason)
        session += reason is not None
    return got


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("tolerance", [0.0, 0.05])
def test_matches_a_brute_force_reference(seed, tolerance):
    rng = np.random.default_rng(seed)
    n = 200
    stamps = np.cumsum(rng.uniform(0.0, 0.1, n)) + 1.7e9  # a camera clock at epoch times
    for _ in range(rng.integers(1, 5)):  # a replay / a clock reset: everything after it earlier
        at = rng.integers(1, n)
        stamps[at:] -= rng.uniform(0.001, 100.0)
    stamps[rng.integers(1, n, 5)] = stamps[rng.integers(0, n - 1, 5)]  # some repeats and odd ones
    resets = rng.random(n) < 0.03  # ~/reset in between
    det = TimeJumpDetector(tolerance)
    got = run_like_the_worker(det, stamps, resets)
    want = reference(stamps.tolist(), np.cumsum(resets).tolist(), tolerance)
    assert [g is None for g in got] == [w is None for w in want]
    for g, w in zip(got, want):
        if w is not None:
            assert g == f"time jumped back by {w:.3f} s"
    assert det.jumps == sum(w is not None for w in want)


def test_the_replay_of_a_bag_reports_its_length_once():
    det = TimeJumpDetector()
    bag = [100.0 + 0.1 * i for i in range(50)]
    first = [det.check(t, 1) for t in bag]
    assert first == [None] * 50
    second = [det.check(t, 1) for t in bag]  # played again from the start
    assert second[0] == "time jumped back by 4.900 s" and second[1:] == [None] * 49
    # a new session (the one the jump started, or a ~/reset) compares afresh: no second report
    assert det.check(10.0, 2) is None and det.check(10.0, 2) is None  # equal stamps are no jump
    assert det.check(9.0, 2) == "time jumped back by 1.000 s"


def test_two_jumps_in_a_row_are_two_jumps():
    """The jump's frame is the first of the session the caller starts: the next frame is compared
    with it even though the session id changed (a simulation reset twice in a row)."""
    det = TimeJumpDetector()
    assert det.check(100.0, 1) is None and det.check(100.3, 1) is None
    assert det.check(50.0, 1) == "time jumped back by 50.300 s"  # the worker starts session 2
    assert det.check(20.0, 2) == "time jumped back by 30.000 s"  # the worker starts session 3
    assert det.check(20.1, 3) is None and det.check(20.2, 3) is None
    assert det.check(5.0, 4) is None  # session 4 started by a ~/reset: compared afresh
    assert det.jumps == 2


def test_tolerance_and_arguments():
    det = TimeJumpDetector(tolerance_s=0.5)
    assert det.check(10.0, 0) is None and det.check(9.6, 0) is None  # jitter within the tolerance
    assert det.check(9.0, 0) == "time jumped back by 0.600 s"
    with pytest.raises(ValueError, match="tolerance_s"):
        TimeJumpDetector(-1.0)
    assert TIME_JUMP_COUNTER == "time_jump_sessions"
