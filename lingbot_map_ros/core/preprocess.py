"""One camera frame -> the model's input tensor, exactly as the official demo builds it (docs/model.md §2).

Why this module insists on PIL: the official pipeline resizes the uint8 RGB image with
``PIL.Image.resize(..., BICUBIC)`` (antialiased, a = -0.5, rounded back to uint8) and then divides by
255. OpenCV and torch resizes use other kernel coefficients and no uint8 rounding, so the model would
see slightly different pixels and the poses would no longer match the official numbers bit for bit.
``fast_resize=True`` trades that exactness for speed and says so.

Colour handling (``to_rgb``) follows PIL too: RGBA is alpha-composited over opaque white (the demo does
``Image.alpha_composite(white, img)`` before ``convert("RGB")``), grey is replicated to three channels.
"""
from __future__ import annotations

from typing import Optional

import cv2
import numpy as np
import torch
from PIL import Image

from .config import MODEL_WIDTH_PX, PATCH_SIZE, model_input_height

# Encodings ``to_rgb`` understands (ROS ``sensor_msgs/Image`` names): name -> (dtype, channels, layout).
RGB_ENCODINGS: dict[str, tuple[type, int, str]] = {
    "rgb8": (np.uint8, 3, "rgb"),
    "bgr8": (np.uint8, 3, "bgr"),
    "rgba8": (np.uint8, 4, "rgba"),
    "bgra8": (np.uint8, 4, "bgra"),
    "mono8": (np.uint8, 1, "mono"),
    "8UC1": (np.uint8, 1, "mono"),  # one 8-bit channel is unambiguous: treated as mono8
    "rgb16": (np.uint16, 3, "rgb"),
    "bgr16": (np.uint16, 3, "bgr"),
    "rgba16": (np.uint16, 4, "rgba"),
    "bgra16": (np.uint16, 4, "bgra"),
    "mono16": (np.uint16, 1, "mono"),
}


class ResolutionChanged(ValueError):
    """A frame's size differs from the session's first frame.

    The model input height, the crop and the published intrinsics all derive from the first frame's
    size, so a silent change would corrupt the session. The caller decides: drop the frame or start a
    new session (``FramePreprocessor.reset()`` plus a model reset).
    """

    def __init__(self, old_wh: tuple[int, int], new_wh: tuple[int, int]) -> None:
        self.old_wh = old_wh
        self.new_wh = new_wh
        super().__init__(
            f"frame size changed from {old_wh[0]}x{old_wh[1]} to {new_wh[0]}x{new_wh[1]} (WxH); "
            "the session's input size is fixed by its first frame: drop the frame or start a new session"
        )


def model_size(width0: int, height0: int, width: int = MODEL_WIDTH_PX,
               max_height: int = 0) -> tuple[int, int, int]:
    """Model input ``(H, W, crop_offset_y)`` for a ``width0 x height0`` camera image (docs/model.md §2.1)
    at model width ``width`` (a multiple of 14; 518 is the official size).

    ``H`` is the resized height (``config.model_input_height``) capped at ``width`` (or at ``max_height``,
    the height the memory budget planned for: ``config.planned_height``) by a centre crop whose first
    kept row is ``crop_offset_y`` (0 without crop). ``W`` is always ``width``.
    """
    if width <= 0 or width % PATCH_SIZE:
        raise ValueError(f"model width must be a positive multiple of {PATCH_SIZE} (got {width})")
    new_h = model_input_height(width0, height0, width)
    if new_h < PATCH_SIZE:
        # Extremely wide images round to 0 patch rows; the model cannot take an empty image.
        raise ValueError(
            f"image {width0}x{height0} is too wide: resized to width {width} it would be "
            f"{new_h} px high (< one {PATCH_SIZE}-px patch row)"
        )
    cap = min(width, max_height) if max_height > 0 else width
    if new_h > cap:
        return cap, width, (new_h - cap) // 2
    return new_h, width, 0


def _cv_ready(a: np.ndarray) -> np.ndarray:
    """``a`` itself when OpenCV can read it in place (rows may be padded), else a C-contiguous copy.

    OpenCV takes any row stride but needs the pixels of one row packed; padded ROS rows qualify.
    """
    packed = a.strides[1] == a.itemsize * (a.shape[2] if a.ndim == 3 else 1)
    if packed and (a.ndim == 2 or a.strides[2] == a.itemsize) and a.strides[0] > 0:
        return a
    return np.ascontiguousarray(a)


def _scale16_to8(array: np.ndarray) -> np.ndarray:
    """uint16 -> uint8 by ``round(v * 255 / 65535)`` = ``round(v / 257)``: full range maps to full range.

    This is cv_bridge's 16->8 bit rule (``convertTo`` with 255/65535, rounding). ``v / 257`` is never
    exactly halfway between integers, so the rounding mode cannot matter.
    """
    return cv2.convertScaleAbs(array, alpha=1.0 / 257.0)


def _composite_over_white(rgba: np.ndarray) -> np.ndarray:
    """RGBA uint8 [H,W,4] -> RGB uint8 [H,W,3] composited over opaque white, PIL's exact arithmetic."""
    h, w = rgba.shape[:2]
    fg = Image.fromarray(np.ascontiguousarray(rgba))  # uint8 [H,W,4] -> mode RGBA
    white = Image.new("RGBA", (w, h), (255, 255, 255, 255))
    return np.asarray(Image.alpha_composite(white, fg).convert("RGB")).copy()


def to_rgb(array: np.ndarray, encoding: str) -> np.ndarray:
    """Any supported colour layout -> a new C-contiguous RGB uint8 array [H, W, 3].

    ``array`` is [H, W] or [H, W, 1] for mono, [H, W, 3|4] otherwise; its dtype must match the
    encoding (uint8 for ``*8``, uint16 for ``*16``, native byte order). 16-bit data is scaled to
    8 bits over its full range (``round(v/257)``) before the 8-bit rule applies; alpha is scaled too.
    The result never aliases ``array``.
    """
    if encoding not in RGB_ENCODINGS:
        raise ValueError(f"to_rgb: unsupported encoding {encoding!r}; supported: {sorted(RGB_ENCODINGS)}")
    dtype, channels, layout = RGB_ENCODINGS[encoding]
    a = np.asarray(array)
    if a.dtype != dtype:
        raise ValueError(f"to_rgb: encoding {encoding!r} needs {np.dtype(dtype).name} data, got {a.dtype}")
    if channels == 1 and a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    expected_ndim = 2 if channels == 1 else 3
    if a.ndim != expected_ndim or (channels > 1 and a.shape[2] != channels):
        raise ValueError(f"to_rgb: encoding {encoding!r} needs {channels} channel(s), got array shape {a.shape}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"to_rgb: empty image of shape {a.shape}")
    a = _cv_ready(a)
    if a.dtype != np.uint8:
        a = _scale16_to8(a)  # new uint8 array, same layout
    if layout == "mono":
        return cv2.cvtColor(a, cv2.COLOR_GRAY2RGB)  # PIL's L -> RGB replicates
    if layout == "rgb":
        return np.array(a, order="C", copy=True)
    if layout == "bgr":
        return cv2.cvtColor(a, cv2.COLOR_BGR2RGB)
    if cv2.extractChannel(a, 3).min() == 255:
        # Opaque (the usual camera case): compositing is the identity, drop alpha without PIL.
        return cv2.cvtColor(a, cv2.COLOR_RGBA2RGB if layout == "rgba" else cv2.COLOR_BGRA2RGB)
    if layout == "bgra":
        a = cv2.cvtColor(a, cv2.COLOR_BGRA2RGBA)
    return _composite_over_white(a)


def _to_unit_float(chw: torch.Tensor) -> torch.Tensor:
    """uint8 [3, H, W] -> contiguous float32 in [0, 1]. True division by 255 in float32, as the
    official ToTensor-style conversion does (x * (1/255) differs by one ulp for some values)."""
    return chw.contiguous().to(torch.float32).div_(255.0)


def exact_size_tensor(rgb: np.ndarray) -> torch.Tensor:
    """An RGB uint8 [H, W, 3] image already at a model input size -> float32 [3, H, W] in [0, 1].

    The official benchmark's path: each dataset's own resize and the area budget have fixed the size
    (574x434 for 640x480 images, 504x280 for KITTI), and the model runs at it, wider than the node's
    518 where the budget allows; nothing is resized or cropped here. Both sides must be multiples of
    the 14-px patch (``ValueError`` otherwise)."""
    if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        desc = f"{rgb.dtype} {rgb.shape}" if isinstance(rgb, np.ndarray) else type(rgb).__name__
        raise ValueError(f"expected an RGB uint8 array [H, W, 3], got {desc}")
    h, w = rgb.shape[:2]
    if h % PATCH_SIZE or w % PATCH_SIZE or not h or not w:
        raise ValueError(f"image {w}x{h} is not a model input size (both sides multiples of {PATCH_SIZE})")
    if not (rgb.flags.writeable and rgb.flags.c_contiguous):  # torch wraps only writable arrays
        rgb = np.array(rgb, order="C")
    return _to_unit_float(torch.from_numpy(rgb).permute(2, 0, 1))  # [3, H, W]


class FramePreprocessor:
    """Session-scoped frame -> ``[3, H, 518]`` float32 tensor in [0, 1] (docs/model.md §2.1 steps 3-6).

    The input size is fixed by the first frame because the model input height, the crop and the
    intrinsics mapping all follow from it; another size raises ``ResolutionChanged``.

    ``fast_resize=False`` (default) is bit-compatible with the official demo. ``fast_resize=True`` uses
    OpenCV (INTER_AREA when shrinking, INTER_CUBIC otherwise): several times faster on large frames but
    NOT bit-compatible (different kernel, no antialias coupling to PIL) - poses then differ slightly
    from the official ones.
    """

    def __init__(self, fast_resize: bool = False, width: int = MODEL_WIDTH_PX, max_height: int = 0) -> None:
        """``width``: the model input width (``image_width``; 518 is the official size); ``max_height``:
        the tallest model input the memory budget planned for (``camera_aspect``; 0: the width)."""
        self.fast_resize = fast_resize
        self.width = width
        self.max_height = max_height
        self._input_wh: Optional[tuple[int, int]] = None
        self._new_h = 0
        self._hw_crop: tuple[int, int, int] = (0, 0, 0)

    # -- session state -----------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the input size: the next frame starts a new session's geometry."""
        self._input_wh = None
        self._new_h = 0
        self._hw_crop = (0, 0, 0)

    @property
    def input_wh(self) -> Optional[tuple[int, int]]:
        """Camera image size ``(W0, H0)`` of this session, None before the first frame."""
        return self._input_wh

    @property
    def resized_height(self) -> int:
        """Height after the resize and before the crop (``new_h``), 0 before the first frame."""
        return self._new_h

    @property
    def model_hw(self) -> Optional[tuple[int, int]]:
        """Model input ``(H, W)``, None before the first frame."""
        return None if self._input_wh is None else self._hw_crop[:2]

    @property
    def crop_offset_y(self) -> int:
        """First kept row of the resized image (0 without crop)."""
        return self._hw_crop[2]

    def fix_size(self, width0: int, height0: int) -> None:
        """Adopt ``width0 x height0`` as the session size, or raise ``ResolutionChanged`` if it differs.

        Separate from ``__call__`` so a caller can validate a frame's size before paying for decoding.
        """
        wh = (int(width0), int(height0))
        if self._input_wh is None:
            self._hw_crop = model_size(*wh, self.width, self.max_height)  # raises for impossible sizes first
            self._new_h = model_input_height(*wh, self.width)
            self._input_wh = wh
        elif wh != self._input_wh:
            raise ResolutionChanged(self._input_wh, wh)

    # -- the conversion ----------------------------------------------------------------------
    def __call__(self, rgb: np.ndarray) -> torch.Tensor:
        """RGB uint8 [H0, W0, 3] -> float32 [3, H, 518] in [0, 1], contiguous, on the CPU."""
        if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            desc = f"{rgb.dtype} {rgb.shape}" if isinstance(rgb, np.ndarray) else type(rgb).__name__
            raise ValueError(f"expected an RGB uint8 array [H, W, 3], got {desc} (use to_rgb first)")
        h0, w0 = rgb.shape[:2]
        self.fix_size(w0, h0)
        resized = self._resize(np.ascontiguousarray(rgb))  # [new_h, 518, 3] uint8
        h, _, oy = self._hw_crop
        return _to_unit_float(torch.from_numpy(resized).permute(2, 0, 1)[:, oy : oy + h, :])  # [3, H, 518]

    def _resize(self, rgb: np.ndarray) -> np.ndarray:
        """[H0, W0, 3] uint8 -> [new_h, 518, 3] uint8, a fresh writable array."""
        h0, w0 = rgb.shape[:2]
        size = (self.width, self._new_h)  # (width, height) for PIL and OpenCV alike
        if self.fast_resize:
            if size == (w0, h0):
                return rgb.copy()
            shrink = size[0] <= w0 and size[1] <= h0
            return cv2.resize(rgb, size, interpolation=cv2.INTER_AREA if shrink else cv2.INTER_CUBIC)
        img = Image.fromarray(rgb).resize(size, Image.Resampling.BICUBIC)  # same size -> copy
        return np.array(img, dtype=np.uint8, copy=True)


__all__ = [
    "FramePreprocessor",
    "exact_size_tensor",
    "ResolutionChanged",
    "RGB_ENCODINGS",
    "model_size",
    "to_rgb",
]
