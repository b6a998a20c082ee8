"""StagedUpload: what lands in the device buffer is exactly what was uploaded, step after step."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lingbot_map_ros.core.cache.staged_upload import StagedUpload

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_uploads_of_varying_size_land_in_order(device: str) -> None:
    rng = np.random.default_rng()
    target = torch.full((64,), -1, dtype=torch.long, device=device)
    upload = StagedUpload(target)
    for n in (64, 7, 33, 1):
        values = rng.integers(0, 1 << 40, size=n, dtype=np.int64)
        written = upload.upload(values)
        assert written.data_ptr() == target.data_ptr()  # a view of the fixed buffer (graphs read it)
        np.testing.assert_array_equal(written.cpu().numpy(), values)
    np.testing.assert_array_equal(target[:1].cpu().numpy(), values)


@pytest.mark.parametrize("device", DEVICES)
def test_two_dimensional_int32_table(device: str) -> None:
    target = torch.zeros(4, 2, dtype=torch.int32, device=device)
    table = np.arange(8, dtype=np.int32).reshape(4, 2) * 3
    StagedUpload(target).upload(table)
    np.testing.assert_array_equal(target.cpu().numpy(), table)


def test_rejects_too_many_values_and_strided_targets() -> None:
    upload = StagedUpload(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="do not fit"):
        upload.upload(np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError, match="contiguous"):
        StagedUpload(torch.zeros(4, 4, dtype=torch.long)[:, 0])
