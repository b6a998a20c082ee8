"""The step's read-back on the CPU: host tensors come back as float32 NumPy arrays, None kept."""
from __future__ import annotations

import numpy as np
import torch

from lingbot_map_ros.core.readback import StagedReadback


def test_cpu_outputs_come_back_as_float32_arrays_with_none_kept() -> None:
    pose = torch.randn(2, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    depth = torch.rand(2, 4, 6, generator=torch.Generator().manual_seed(2)).bfloat16()
    got = StagedReadback().fetch((pose, depth, None))
    assert got[2] is None and got[0].dtype == got[1].dtype == np.float32
    np.testing.assert_array_equal(got[0], pose.float().numpy())
    np.testing.assert_array_equal(got[1], depth.float().numpy())
