"""What the streaming session hands out per frame. Plain data: no torch, no rclpy.

The node reads these and publishes; the offline tool writes them to ``.npz``/TUM.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np


@dataclass(frozen=True)
class SessionInfo:
    """What runs: the model and the resolved runtime, with the reasons (logs, /diagnostics, CacheStats)."""

    backend: str  # attention backend family: flashinfer | sdpa
    backend_reason: str  # why that backend was chosen
    attention: str  # the resolved one-frame attention path, e.g. sdpa:split+graph+compiled
    runtime_reasons: tuple[str, ...]  # one line per runtime decision (kernel, graphs, fusion, autocast)
    dtype: str  # compute dtype of the aggregator
    device: str
    model_preset: str
    depth_available: bool
    random_weights: bool


@dataclass(frozen=True)
class CacheSnapshot:
    """KV-cache state right after a frame was processed (docs/model.md §9.6)."""

    frames_stored: int = 0  # F: scale + window + evicted stored frames of this session
    scale_frames: int = 0
    window_frames: int = 0
    frames_evicted: int = 0
    page_size: int = 0  # patch tokens per frame
    patch_pages_total: int = 0
    scale_pages: int = 0
    window_pages: int = 0
    free_pages: int = 0
    special_pages: int = 0
    special_pages_capacity: int = 0
    special_tokens: int = 0
    visible_keys: int = 0  # keys the last frame attended to per global block
    camera_cache_frames: int = 0  # camera-head cache length (tokens per iteration and block)
    camera_cache_capacity: int = 0
    max_frame_num: int = 0
    kv_bytes: int = 0  # bytes preallocated for K/V pages (all blocks) + camera cache


@dataclass(frozen=True)
class FrameResult:
    """One processed frame: pose, intrinsics, bookkeeping."""

    frame_index: int  # index of the frame inside its session (0-based, every pushed frame counts)
    session_id: int  # increments on reset; a new session has a new world frame
    stamp: Any  # opaque value handed to ``push`` (the ROS header stamp in the node)
    pose_enc: np.ndarray  # [9] float32 raw model output (t xyz, q xyzw, fov_h, fov_w)
    c2w: np.ndarray  # [4, 4] float64 camera(optical)-to-world in the session's world frame
    intrinsics: np.ndarray  # [3, 3] float64 for the model input size (H x W)
    image_hw: tuple[int, int]  # model input size (H, W)
    is_keyframe: bool  # stored in the KV cache (scale frames count as stored)
    is_scale_frame: bool
    rope_frame_index: int  # RoPE time index f used for this frame
    cache: CacheSnapshot = field(default_factory=CacheSnapshot)
    latency_ms: float = 0.0  # model time of this frame (phase 1: joint call / frames)
    depth: Optional[np.ndarray] = None  # [H, W] float32 when the depth head ran
    depth_conf: Optional[np.ndarray] = None  # [H, W] float32
    window_index: int = 0  # long-run windows chained inside one world frame
    frame_extra: dict = field(default_factory=dict)

    def non_finite_fields(self) -> list[str]:
        """Names of the outputs that hold NaN or Inf (empty: the frame may be published).

        A bad or fp16-overflowing checkpoint, or a hardware fault, shows up here first; nothing of
        such a frame may reach /tf or any other topic. ``intrinsics`` is not judged: the camera head's
        ReLU'd FoV can be exactly 0 (an infinite focal length) on finite inputs, and published
        intrinsics are guarded (``geometry.intrinsics_for_camera``); a NaN there always comes with
        a NaN in ``pose_enc``, which is judged.
        """
        arrays = {"pose_enc": self.pose_enc, "c2w": self.c2w, "depth": self.depth, "depth_conf": self.depth_conf}
        return [name for name, a in arrays.items() if a is not None and not np.isfinite(a).all()]
