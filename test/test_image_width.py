"""``image_width``: the model input at any multiple of 14 in 224..518, preprocessed as the official
pipeline does at that size (resize to the width keeping the aspect, height rounded to a multiple of
14, centre crop to at most square), checked against a reference written here from PIL and NumPy;
the model runs at each width (patch-position and RoPE tables follow the grid); a change of
``image_width`` applies as a new session (cause PARAMETERS)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig, validate_stream
from lingbot_map_ros.core.preprocess import FramePreprocessor, model_size
from lingbot_map_ros.core.scale import depth_grid_indices
from lingbot_map_ros.core.session_manager import Change, SessionCause, SessionManager


def reference(rgb: np.ndarray, width: int) -> np.ndarray:
    """The official demo's steps at target size ``width``, in float64: [3, H, width]."""
    h0, w0 = rgb.shape[:2]
    new_h = int(round(h0 * (width / w0) / 14.0) * 14)
    img = np.asarray(Image.fromarray(rgb).resize((width, new_h), Image.Resampling.BICUBIC), dtype=np.float64)
    if new_h > width:
        top = (new_h - width) // 2
        img = img[top:top + width]
    return img.transpose(2, 0, 1) / 255.0


@pytest.mark.parametrize("width", [224, 280, 392, 504, 518])
@pytest.mark.parametrize("w0,h0", [(640, 480), (1241, 376), (480, 640), (1920, 1080)])
def test_preprocessing_matches_the_reference_at_each_width(width: int, w0: int, h0: int) -> None:
    rgb = np.random.default_rng(width * 7 + w0).integers(0, 256, (h0, w0, 3), dtype=np.uint8)
    out = FramePreprocessor(width=width)(rgb)
    want = reference(rgb, width)
    assert tuple(out.shape) == want.shape and out.shape[2] == width and out.shape[1] % 14 == 0
    assert out.shape[1] <= width
    np.testing.assert_allclose(out.numpy().astype(np.float64), want, rtol=0, atol=1e-7)


def test_model_size_at_the_official_benchmark_size() -> None:
    """The aspect-keeping rule at a few sizes (a KITTI frame, 1241x376, at width 504 is 504x154; the
    official benchmark's 504x280 for KITTI is its dataset loader's own size, not this rule)."""
    assert model_size(1241, 376, 504) == (154, 504, 0)
    assert model_size(640, 480, 280) == (210, 280, 0)
    assert model_size(480, 640, 392) == (392, 392, 63)  # resized to 392x518, 63 rows off the top
    with pytest.raises(ValueError, match="multiple of 14"):
        model_size(640, 480, 300)


def test_image_width_limits() -> None:
    assert not validate_stream(StreamConfig(image_width=224))
    assert any("multiple of the 14-px patch" in p for p in validate_stream(StreamConfig(image_width=300)))
    assert any("image_width must be in [224, 518]" in p for p in validate_stream(StreamConfig(image_width=210)))


def test_depth_grid_follows_the_width() -> None:
    rows, cols = depth_grid_indices((640, 480), (640, 480), stride=4, width=280)
    assert len(cols) == len(range(2, 280, 4)) and len(rows) == len(range(2, 210, 4))
    assert cols[-1] == int((278 + 0.5) * 640 / 280)


def test_the_model_runs_at_each_width_and_a_change_is_a_new_session() -> None:
    runtime = RuntimeConfig(model_preset="tiny", device="cpu")
    stream = StreamConfig(scale_frames=2, sliding_window=3, long_run_policy="reset", max_frame_num=64,
                          max_stored_frames=40, camera_iterations=1, image_width=224)
    manager = SessionManager.open(runtime, stream, log=lambda m: None)
    starts = []
    manager.on_new_session = starts.append
    rgb = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    for width in (224, 280, 392):
        if width != 224:
            result = manager.apply(runtime, StreamConfig(**{**stream.__dict__, "image_width": width}))
            assert result.change is Change.NEW_SESSION and "image_width" in result.fields
            assert starts[-1].cause is SessionCause.PARAMETERS
        frame = FramePreprocessor(width=width)(rgb)
        out = [r for _ in range(4) for r in manager.push(frame)]
        assert len(out) == 4 and all(np.isfinite(r.pose_enc).all() for r in out)
        assert out[0].image_hw == (frame.shape[1], width)
        assert manager.session._kv.page_size == (frame.shape[1] // 14) * (width // 14)
    assert torch.is_tensor(frame)
