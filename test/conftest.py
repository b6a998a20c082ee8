"""Test set-up shared by every test of the package.

* DDS discovery stays on loopback, ROS logs go to a temporary folder: set here, at import, before
  any test module can import rclpy (and inherited by every node process a test starts).
* Each ROS test gets its own ROS_DOMAIN_ID (``ros_domain_id`` fixture) from a per-run base, so two
  test runs on one machine, or two tests of one run, never see each other's nodes.
* The sources are imported from the repository root (pytest.ini's ``pythonpath``); the generated
  messages come from the installed package (``lingbot_map_ros/__init__.py`` extends its path).
  rclpy is never imported here: tests that need no ROS run where ROS is missing.
"""
from __future__ import annotations

import itertools
import os
import random
import tempfile
from pathlib import Path

import pytest

os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
if not os.environ.get("ROS_LOG_DIR"):
    os.environ["ROS_LOG_DIR"] = tempfile.mkdtemp(prefix="lingbot_test_ros_log_")

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the repository root = the ROS package (package.xml, launch/)

# Domain ids: valid ones are 0..101 (above that they collide with ephemeral ports). One base per run
# (LINGBOT_TEST_DOMAIN_BASE, else ROS_DOMAIN_ID, else random), then one id per test, wrapping in 1..101.
_base = os.environ.get("LINGBOT_TEST_DOMAIN_BASE") or os.environ.get("ROS_DOMAIN_ID")
_base_id = int(_base) if _base and _base.isdigit() else random.SystemRandom().randint(1, 101)
os.environ.setdefault("ROS_DOMAIN_ID", str(_base_id))
_domain_ids = (1 + (_base_id - 1 + k) % 101 for k in itertools.count(1))


def next_domain_id() -> int:
    return next(_domain_ids)


@pytest.fixture
def ros_domain_id() -> int:
    """A ROS_DOMAIN_ID no other test of this run uses."""
    return next_domain_id()


@pytest.fixture(scope="session")
def package_dir() -> Path:
    return PACKAGE_DIR


@pytest.fixture(scope="session")
def new_domain_id():
    """For module-scoped fixtures: call it to get a fresh ROS_DOMAIN_ID."""
    return next_domain_id


@pytest.fixture
def one_torch_thread():
    """Tiny matrices: torch's threads only add contention on the 2-core CI machine (10x slower with 2)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model():
    """``tiny_model(seed=0, depth=True)`` -> ``(cfg, model)``: the tiny preset with seeded random weights,
    fp32 on the CPU, built once per seed and run. Shared: a test that changes weights builds its own."""
    cache: dict = {}

    def build(seed: int = 0, depth: bool = True):
        if (seed, depth) not in cache:
            from lingbot_map_ros.core.config import model_config
            from lingbot_map_ros.core.model import build_model

            cfg = model_config("tiny")
            model, _ = build_model(cfg, seed=seed, enable_depth=depth)
            cache[(seed, depth)] = (cfg, model.eval())
        return cache[(seed, depth)]

    return build


@pytest.fixture
def tiny_manager(tiny_model):
    """``tiny_manager(stream, seed=0, depth=True, **resolve)`` -> a ``SessionManager`` over the shared tiny
    model on the CPU in fp32 (``resolve``: ``runtime.resolve_for`` choices; default SDPA, the reference)."""
    import torch

    from lingbot_map_ros.core.runtime import resolve_for
    from lingbot_map_ros.core.session_manager import SessionManager

    def make(stream, seed: int = 0, depth: bool = True, **resolve):
        cfg, model = tiny_model(seed, depth)
        runtime = resolve_for(torch.device("cpu"), torch.float32, **{"backend": "sdpa", **resolve})
        return SessionManager.around(model, cfg, stream, runtime, log=lambda m: None)

    return make
