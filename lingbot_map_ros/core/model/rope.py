"""Rotary position embeddings of LingBot-Map (docs/model.md §7).

Two different RoPEs are used and they must not be confused:

* 2D RoPE (frame blocks, §7.1): rotate-half pairing inside two 32-channel halves (row, column),
  base 100, tables computed in fp32 exactly as the official code does so an fp32 run is bit-exact.
* 3D RoPE (global blocks, §7.2): interleaved pairs ``(2j, 2j+1)`` in three bands (time, height,
  width), tables computed in float64 and rounded to the dtype of q.

Tables are built on the CPU (so the values do not depend on the accelerator's trig library), cast to
the dtype of q and moved to q's device once, then cached: repeated frames of the same size never
rebuild them. A :class:`RopeApplier` is made once per forward call and shared by all blocks of
that call; it picks the table for the dtype q actually arrives in (fp32 under autocast, because
LayerNorm returns fp32 there; the model dtype otherwise).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from .table_cache import TableCache

SIZES_KEPT = 4  # frame sizes whose tables stay cached (least recently used dropped first)

DEFAULT_MAX_POSITIONS = 1024  # rows of the official 3D-RoPE table (max_frame_num)

TableKey = tuple[int, int, str, torch.dtype]


def positions_2d(ph: int, pw: int, num_special: int = 6) -> Tensor:
    """(row, column) RoPE positions of one frame's tokens, ``[P, 2]`` long.

    Special tokens sit at (0, 0); patch (y, x) at (y + 1, x + 1) so that no patch shares the
    specials' position.
    """
    ys = torch.arange(ph).repeat_interleave(pw) + 1  # [Np] row-major
    xs = torch.arange(pw).repeat(ph) + 1  # [Np]
    special = torch.zeros(num_special, 2, dtype=torch.long)  # [6, 2]
    return torch.cat([special, torch.stack([ys, xs], dim=1)], dim=0)  # [P, 2]


def positions_3d(rope_frames: Tensor, ph: int, pw: int, num_special: int = 6) -> Tensor:
    """(time, height, width) RoPE positions of every token of a call, ``[S, P, 3]`` long.

    Special token s of frame f -> (f, s, s); patch (y, x) -> (f, 6 + y, 6 + x). The spatial offset
    6 keeps patches clear of the special-token rows of the shared table.
    """
    s_idx = torch.arange(num_special)
    spatial_special = torch.stack([s_idx, s_idx], dim=1)  # [6, 2]
    ys = torch.arange(ph).repeat_interleave(pw) + num_special  # [Np]
    xs = torch.arange(pw).repeat(ph) + num_special  # [Np]
    spatial = torch.cat([spatial_special, torch.stack([ys, xs], dim=1)], dim=0)  # [P, 2]
    frames = rope_frames.detach().to("cpu", torch.long)  # [S]
    S, P = frames.shape[0], spatial.shape[0]
    time = frames[:, None, None].expand(S, P, 1)  # [S, P, 1]
    return torch.cat([time, spatial[None].expand(S, P, 2)], dim=2)  # [S, P, 3]


def _rotate_halves(x: Tensor) -> Tensor:
    """``rot`` of §7.1 applied independently to both 32-channel halves: [a,b,c,d] -> [-b,a,-d,c]."""
    a, b, c, d = x.chunk(4, dim=-1)
    return torch.cat((-b, a, -d, c), dim=-1)


def apply_rope_2d(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half 2D RoPE: ``x·cos + rot(x)·sin`` (two products, one sum, in x's dtype).

    x: ``[..., P, H, D]``; cos/sin broadcastable, normally ``[P, 1, D]``.
    """
    return x * cos + _rotate_halves(x) * sin


def apply_rope_3d(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Interleaved-pair 3D RoPE.

    x: ``[T, H, D]``; cos/sin ``[T, 1, D/2]`` (one value per pair). Pair j of x is (x[2j], x[2j+1]);
    ``x'[2j] = x[2j]c - x[2j+1]s``, ``x'[2j+1] = x[2j]s + x[2j+1]c``.
    """
    pairs = x.unflatten(-1, (-1, 2))  # [T, H, D/2, 2]
    x0, x1 = pairs[..., 0], pairs[..., 1]  # [T, H, D/2]
    out0 = x0 * cos - x1 * sin
    out1 = x0 * sin + x1 * cos
    return torch.stack((out0, out1), dim=-1).flatten(-2)  # [T, H, D]


class Rope2D:
    """Tables of the frame-block RoPE, cached per (ph, pw, device, dtype)."""

    def __init__(self, head_dim: int = 64, base: float = 100.0, num_special: int = 6) -> None:
        if head_dim % 4 != 0:
            raise ValueError(f"2D RoPE needs a head dim divisible by 4 (got {head_dim})")
        self.head_dim = head_dim
        self.base = float(base)
        self.num_special = num_special
        self._cache: TableCache[tuple[Tensor, Tensor]] = TableCache(SIZES_KEPT)

    def frequencies(self) -> Tensor:
        """``ω_i = 1 / base^(2i/half)`` in fp32, evaluated exactly as the official table does."""
        half = self.head_dim // 2
        exponents = torch.arange(0, half, 2, dtype=torch.float32) / half  # [half/2]
        return 1.0 / (self.base**exponents)  # [half/2]

    def tables(self, ph: int, pw: int, device: torch.device | str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin ``[P, 1, D]`` laid out ``[c_row, c_row, c_col, c_col]`` (16 values each for D=64)."""
        device = torch.device(device)
        return self._cache.get_or_build((ph, pw, str(device), dtype), lambda: self._build(ph, pw, device, dtype))

    def _build(self, ph: int, pw: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        pos = positions_2d(ph, pw, self.num_special).to(torch.float32)  # [P, 2]
        omega = self.frequencies()  # [D/4]
        ang_y = pos[:, 0:1] * omega[None, :]  # [P, D/4] one fp32 multiply
        ang_x = pos[:, 1:2] * omega[None, :]  # [P, D/4]
        cos = torch.cat([ang_y.cos(), ang_y.cos(), ang_x.cos(), ang_x.cos()], dim=-1)  # [P, D]
        sin = torch.cat([ang_y.sin(), ang_y.sin(), ang_x.sin(), ang_x.sin()], dim=-1)  # [P, D]
        out = (
            cos[:, None, :].to(device=device, dtype=dtype),  # [P, 1, D]
            sin[:, None, :].to(device=device, dtype=dtype),  # [P, 1, D]
        )
        return out

    def applier(self, ph: int, pw: int, device: torch.device | str) -> "RopeApplier":
        """A per-call rotation for ``[N, P, H, D]`` tensors (frame blocks)."""
        return RopeApplier(lambda dtype: self.tables(ph, pw, device, dtype), apply_rope_2d)


class Rope3D:
    """Tables of the global-block RoPE (time, height, width bands over one position range)."""

    def __init__(
        self,
        head_dim: int = 64,
        base: float = 10000.0,
        bands: tuple[int, int, int] = (20, 22, 22),
        num_special: int = 6,
    ) -> None:
        if sum(bands) != head_dim or any(b % 2 for b in bands):
            raise ValueError(f"3D RoPE bands {bands} must be even and sum to the head dim {head_dim}")
        self.head_dim = head_dim
        self.base = float(base)
        self.bands = bands
        self.num_special = num_special
        self._spatial_cache: TableCache[tuple[Tensor, Tensor]] = TableCache(SIZES_KEPT)
        self._time_cache: TableCache[tuple[Tensor, Tensor]] = TableCache(SIZES_KEPT)

    def band_frequencies(self, d: int) -> Tensor:
        """``ω_k = 1 / base^(2k/d)`` in float64 (k = 0..d/2-1)."""
        return 1.0 / (self.base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))  # [d/2]

    def _band(self, d: int, positions: Tensor) -> tuple[Tensor, Tensor]:
        """float64 cos/sin of ``n·ω`` for integer positions ``n`` ``[M]`` -> ``[M, d/2]`` each."""
        ang = positions.to(torch.float64)[:, None] * self.band_frequencies(d)[None, :]  # [M, d/2]
        return ang.cos(), ang.sin()

    def check_range(self, max_frame: int, ph: int, pw: int, max_positions: int) -> None:
        """Refuse positions the official 1024-row table does not have (§7.2, §16 #3)."""
        if max_frame >= max_positions:
            raise ValueError(
                f"3D RoPE frame index {max_frame} >= max_positions {max_positions}: reset or start a new "
                "window before the stored-frame counter reaches the limit"
            )
        if self.num_special + max(ph, pw) > max_positions:
            raise ValueError(
                f"3D RoPE spatial position {self.num_special + max(ph, pw) - 1} >= max_positions {max_positions} "
                f"(patch grid {ph}x{pw})"
            )

    def spatial_tables(self, ph: int, pw: int, device: torch.device | str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos/sin of the height and width bands, ``[P, (dh + dw)/2]``, cached per size/device/dtype."""
        device = torch.device(device)
        return self._spatial_cache.get_or_build(
            (ph, pw, str(device), dtype), lambda: self._build_spatial(ph, pw, device, dtype))

    def _build_spatial(self, ph: int, pw: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        pos = positions_3d(torch.zeros(1, dtype=torch.long), ph, pw, self.num_special)[0]  # [P, 3]
        ch, sh = self._band(self.bands[1], pos[:, 1])  # [P, dh/2]
        cw, sw = self._band(self.bands[2], pos[:, 2])  # [P, dw/2]
        out = (
            torch.cat([ch, cw], dim=1).to(dtype).to(device),  # [P, (dh+dw)/2], rounded from float64
            torch.cat([sh, sw], dim=1).to(dtype).to(device),
        )
        return out

    def time_table(self, max_positions: int, device: torch.device | str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos/sin of the time band for every frame index ``0..max_positions-1``, ``[max_positions, dt/2]``."""
        device = torch.device(device)

        def build() -> tuple[Tensor, Tensor]:
            c, s = self._band(self.bands[0], torch.arange(max_positions))  # [M, dt/2] float64
            return c.to(dtype).to(device), s.to(dtype).to(device)

        return self._time_cache.get_or_build((max_positions, str(device), dtype), build)

    def tables(
        self,
        rope_frames: Tensor,
        ph: int,
        pw: int,
        device: torch.device | str,
        dtype: torch.dtype,
        max_positions: int = DEFAULT_MAX_POSITIONS,
    ) -> tuple[Tensor, Tensor]:
        """Per-token cos/sin ``[S·P, 1, D/2]`` for frames ``rope_frames`` ``[S]`` (frame-major tokens)."""
        frames = rope_frames.to(device=device, dtype=torch.long)  # [S]
        ct, st = self.time_table(max_positions, device, dtype)
        cs, ss = self.spatial_tables(ph, pw, device, dtype)
        S, P = frames.shape[0], cs.shape[0]
        nt, nsp = ct.shape[1], cs.shape[1]
        cos = torch.cat([ct[frames][:, None, :].expand(S, P, nt), cs[None].expand(S, P, nsp)], dim=2)  # [S, P, D/2]
        sin = torch.cat([st[frames][:, None, :].expand(S, P, nt), ss[None].expand(S, P, nsp)], dim=2)  # [S, P, D/2]
        return cos.reshape(S * P, 1, nt + nsp), sin.reshape(S * P, 1, nt + nsp)

    def applier(
        self,
        rope_frames: Tensor,
        ph: int,
        pw: int,
        device: torch.device | str,
        max_positions: int = DEFAULT_MAX_POSITIONS,
        check: bool = True,
    ) -> "RopeApplier":
        """Validate the positions now (before any compute) and return a per-call rotation for ``[T, H, D]``.

        ``check=False`` skips the range check, which reads the indices back to the host; the caller
        then guarantees ``0 <= rope_frames < max_positions`` (CUDA-graph replay).
        """
        if rope_frames.dim() != 1:
            raise ValueError(f"rope_frames must be a 1-D LongTensor [S] (got shape {tuple(rope_frames.shape)})")
        if check and rope_frames.numel() > 0:
            lo, hi = int(rope_frames.min()), int(rope_frames.max())
            if lo < 0:
                raise ValueError(f"3D RoPE frame index must be >= 0 (got {lo})")
            self.check_range(hi, ph, pw, max_positions)
        return RopeApplier(
            lambda dtype: self.tables(rope_frames, ph, pw, device, dtype, max_positions), apply_rope_3d
        )


class RopeApplier:
    """Rotation of one forward call: tables built lazily for the dtype q arrives in, then reused."""

    def __init__(
        self,
        build: Callable[[torch.dtype], tuple[Tensor, Tensor]],
        apply: Callable[[Tensor, Tensor, Tensor], Tensor],
    ) -> None:
        self._build = build
        self._apply = apply
        self._tables: dict[torch.dtype, tuple[Tensor, Tensor]] = {}

    def tables(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        hit = self._tables.get(dtype)
        if hit is None:
            hit = self._build(dtype)
            self._tables[dtype] = hit
        return hit

    @property
    def apply_fn(self) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        """The rotation ``(x, cos, sin) -> x'`` (for the fused blocks, which pass the tables explicitly)."""
        return self._apply

    def __call__(self, x: Tensor) -> Tensor:
        cos, sin = self.tables(x.dtype)
        return self._apply(x, cos, sin)
