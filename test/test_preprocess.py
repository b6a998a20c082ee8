"""preprocess.py against an independent PIL re-implementation of the demo pipeline (docs/model.md §2)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from lingbot_map_ros.core.preprocess import FramePreprocessor, ResolutionChanged, model_size, to_rgb


def reference(rgb: np.ndarray) -> np.ndarray:
    """The demo's steps 3-6 written out from the spec, in numpy: float32 [3, H, 518]."""
    h0, w0 = rgb.shape[:2]
    new_h = round(h0 * (518 / w0) / 14) * 14
    img = Image.fromarray(rgb).resize((518, new_h), Image.BICUBIC)
    arr = np.asarray(img).astype(np.float32) / np.float32(255.0)  # true division
    arr = arr.transpose(2, 0, 1)
    if new_h > 518:
        start = (new_h - 518) // 2
        arr = arr[:, start : start + 518, :]
    return arr


def random_image(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    return rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize(
    "w,h",
    [(1280, 720), (640, 480), (480, 640), (1920, 1080), (848, 480), (518, 294), (518, 518),
     (300, 200), (37, 23), (14, 14), (3, 2), (1, 1), (2, 9)],
)
def test_matches_pil_reference_bit_for_bit(w: int, h: int) -> None:
    rng = np.random.default_rng(w * 10007 + h)
    for _ in range(2):  # fresh images, same session
        pre = FramePreprocessor()
        img = random_image(rng, w, h)
        out = pre(img)
        ref = torch.from_numpy(np.ascontiguousarray(reference(img)))
        assert out.dtype == torch.float32 and out.is_contiguous()
        assert out.shape == ref.shape
        assert out.shape[2] == 518 and out.shape[1] % 14 == 0 and out.shape[1] <= 518
        assert torch.equal(out, ref)


def test_non_contiguous_input_same_result() -> None:
    rng = np.random.default_rng(1)
    big = random_image(rng, 1280, 1440)
    view = big[::2]  # [720, 1280, 3] with doubled row stride
    assert torch.equal(FramePreprocessor()(view), FramePreprocessor()(np.ascontiguousarray(view)))


@pytest.mark.parametrize(
    "w,h,expected",
    [
        (1280, 720, (294, 518, 0)),
        (1920, 1080, (294, 518, 0)),
        (848, 480, (294, 518, 0)),
        (640, 480, (392, 518, 0)),
        (1024, 768, (392, 518, 0)),
        (480, 640, (518, 518, 84)),  # 686 high -> centre crop
        (518, 294, (294, 518, 0)),
    ],
)
def test_height_rule_examples(w: int, h: int, expected: tuple[int, int, int]) -> None:
    assert model_size(w, h) == expected


def test_too_wide_image_rejected() -> None:
    with pytest.raises(ValueError, match="too wide"):
        model_size(5000, 10)
    with pytest.raises(ValueError):
        model_size(0, 10)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 8000), st.integers(1, 8000))
def test_model_size_properties(w0: int, h0: int) -> None:
    new_h = round(h0 * (518 / w0) / 14) * 14
    if new_h < 14:
        with pytest.raises(ValueError):
            model_size(w0, h0)
        return
    h, w, oy = model_size(w0, h0)
    assert w == 518 and h % 14 == 0 and 14 <= h <= 518
    assert h + 2 * oy == new_h  # crop is centred and symmetric
    assert (oy == 0) == (new_h <= 518)


def test_resolution_changed_and_reset() -> None:
    rng = np.random.default_rng(2)
    pre = FramePreprocessor()
    pre(random_image(rng, 640, 480))
    assert pre.input_wh == (640, 480) and pre.model_hw == (392, 518) and pre.crop_offset_y == 0
    with pytest.raises(ResolutionChanged) as info:
        pre(random_image(rng, 1280, 720))
    err = info.value
    assert isinstance(err, ValueError)
    assert "640x480" in str(err) and "1280x720" in str(err)
    assert err.old_wh == (640, 480) and err.new_wh == (1280, 720)
    # Same model height but another camera size must still be refused (intrinsics differ).
    with pytest.raises(ResolutionChanged):
        pre(random_image(rng, 1024, 768))
    assert pre.input_wh == (640, 480)  # a rejected frame changes nothing
    pre.reset()
    assert pre.input_wh is None and pre.model_hw is None
    out = pre(random_image(rng, 480, 640))
    assert out.shape == (3, 518, 518) and pre.crop_offset_y == 84 and pre.resized_height == 686


def test_divide_by_255_is_bit_exact() -> None:
    # 518 x 14 input: resize is the identity, so every value 0..255 reaches the division untouched.
    values = np.arange(518 * 14 * 3) % 256
    img = values.reshape(14, 518, 3).astype(np.uint8)
    out = FramePreprocessor()(img)
    expected = img.astype(np.float32).transpose(2, 0, 1) / np.float32(255.0)
    assert np.array_equal(out.numpy(), expected)
    # The check is sharp: multiplying by the reciprocal differs somewhere.
    by_mul = img.astype(np.float32).transpose(2, 0, 1) * (np.float32(1.0) / np.float32(255.0))
    assert not np.array_equal(out.numpy(), by_mul)
    assert out.min() == 0.0 and out.max() == 1.0


def test_rejects_non_rgb_input() -> None:
    pre = FramePreprocessor()
    with pytest.raises(ValueError, match="RGB uint8"):
        pre(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError, match="RGB uint8"):
        pre(np.zeros((4, 4, 4), np.uint8))
    with pytest.raises(ValueError, match="RGB uint8"):
        pre(np.zeros((4, 4), np.uint8))
    assert pre.input_wh is None


def test_fast_resize_shape_and_closeness() -> None:
    rng = np.random.default_rng(3)
    base = np.kron(random_image(rng, 64, 36), np.ones((20, 20, 1), np.uint8))  # smooth-ish 1280x720
    for w, h in ((1280, 720), (480, 640), (320, 180)):
        img = np.ascontiguousarray(base[:h, :w]) if h <= 720 else random_image(rng, w, h)
        fast = FramePreprocessor(fast_resize=True)(img)
        exact = FramePreprocessor()(img)
        assert fast.shape == exact.shape and fast.dtype == torch.float32
        assert float((fast - exact).abs().mean()) < 0.05


# -- to_rgb ------------------------------------------------------------------------------------
def test_to_rgb_channel_orders() -> None:
    rng = np.random.default_rng(4)
    rgb = random_image(rng, 7, 5)
    assert np.array_equal(to_rgb(rgb, "rgb8"), rgb)
    assert np.array_equal(to_rgb(rgb[..., ::-1], "bgr8"), rgb)
    mono = rng.integers(0, 256, (5, 7), dtype=np.uint8)
    pil = np.asarray(Image.fromarray(mono).convert("RGB"))
    assert np.array_equal(to_rgb(mono, "mono8"), pil)
    assert np.array_equal(to_rgb(mono[..., None], "mono8"), pil)
    assert np.array_equal(to_rgb(mono, "8UC1"), pil)
    out = to_rgb(rgb, "rgb8")
    assert out.flags.c_contiguous and not np.shares_memory(out, rgb)


def pil_over_white(rgba: np.ndarray) -> np.ndarray:
    h, w = rgba.shape[:2]
    white = Image.new("RGBA", (w, h), (255, 255, 255, 255))
    return np.asarray(Image.alpha_composite(white, Image.fromarray(rgba)).convert("RGB"))


def test_to_rgb_alpha_over_white_all_values() -> None:
    # Every (colour, alpha) pair, in all three channels with different colours.
    c, a = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    rgba = np.stack([c, 255 - c, (c * 7) % 256, a], -1).astype(np.uint8)
    expected = pil_over_white(rgba)
    assert np.array_equal(to_rgb(rgba, "rgba8"), expected)
    bgra = rgba[..., [2, 1, 0, 3]]
    assert np.array_equal(to_rgb(bgra, "bgra8"), expected)


def test_to_rgb_opaque_alpha_is_dropped() -> None:
    rng = np.random.default_rng(5)
    rgb = random_image(rng, 9, 4)
    rgba = np.concatenate([rgb, np.full((4, 9, 1), 255, np.uint8)], -1)
    assert np.array_equal(to_rgb(rgba, "rgba8"), rgb)


def test_to_rgb_16_bit_full_range_rounding() -> None:
    v = np.arange(65536, dtype=np.uint16).reshape(256, 256)
    expected8 = np.floor(v / 257.0 + 0.5).astype(np.uint8)  # round(v * 255 / 65535)
    out = to_rgb(v, "mono16")
    assert np.array_equal(out, np.repeat(expected8[..., None], 3, -1))
    rgb16 = np.stack([v, v[::-1], v.T], -1)
    exp = np.stack([expected8, expected8[::-1], expected8.T], -1)
    assert np.array_equal(to_rgb(rgb16, "rgb16"), exp)
    assert np.array_equal(to_rgb(rgb16[..., ::-1], "bgr16"), exp)
    opaque = np.concatenate([rgb16, np.full((256, 256, 1), 65535, np.uint16)], -1)
    assert np.array_equal(to_rgb(opaque, "rgba16"), exp)


def test_to_rgb_rejections() -> None:
    with pytest.raises(ValueError, match="unsupported encoding"):
        to_rgb(np.zeros((2, 2, 3), np.uint8), "hsv8")
    with pytest.raises(ValueError, match="uint16"):
        to_rgb(np.zeros((2, 2), np.uint8), "mono16")
    with pytest.raises(ValueError, match="channel"):
        to_rgb(np.zeros((2, 2, 4), np.uint8), "rgb8")
    with pytest.raises(ValueError, match="empty"):
        to_rgb(np.zeros((0, 2, 3), np.uint8), "rgb8")
