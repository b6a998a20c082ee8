"""2D / 3D RoPE against float64 evaluations of docs/model.md §7 written out here with explicit loops."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lingbot_map_ros.core.model.rope import (
    Rope2D,
    Rope3D,
    apply_rope_2d,
    apply_rope_3d,
    positions_2d,
    positions_3d,
)

NUM_SPECIAL = 6


def token_layout(t: int, pw: int) -> tuple[str, int, int]:
    """('special', s, s) or ('patch', y, x) for token index t of one frame."""
    if t < NUM_SPECIAL:
        return "special", t, t
    return "patch", (t - NUM_SPECIAL) // pw, (t - NUM_SPECIAL) % pw


def spec_omega_2d() -> list[float]:
    """ω_i of §7.1 exactly as the spec defines them (fp32 exponent, fp32 pow, fp32 reciprocal)."""
    e = torch.tensor([2.0 * i for i in range(16)], dtype=torch.float32) / 32.0
    return [float(w) for w in (1.0 / torch.pow(torch.tensor(100.0, dtype=torch.float32), e))]


def reference_rope_2d(x: np.ndarray, ph: int, pw: int) -> np.ndarray:
    """x [P, H, 64] float64. Channels 0..31 rotated by the row position, 32..63 by the column, rotate-half pairs."""
    omega = spec_omega_2d()
    out = np.empty_like(x)
    for t in range(x.shape[0]):
        kind, a, b = token_layout(t, pw)
        py, px = (0, 0) if kind == "special" else (a + 1, b + 1)
        for half, p in ((0, py), (1, px)):
            base = 32 * half
            for i in range(16):
                ang = float(np.float32(np.float32(p) * np.float32(omega[i])))  # one fp32 multiply (spec)
                c, s = math.cos(ang), math.sin(ang)
                u0 = x[t, :, base + i]
                u1 = x[t, :, base + i + 16]
                out[t, :, base + i] = u0 * c - u1 * s
                out[t, :, base + i + 16] = u1 * c + u0 * s
    return out


def reference_rope_3d(x: np.ndarray, frames: list[int], ph: int, pw: int) -> np.ndarray:
    """x [S*P, H, 64] float64; interleaved pairs, bands time(0..9, d=20) height(10..20, d=22) width(21..31, d=22)."""
    P = NUM_SPECIAL + ph * pw
    out = np.empty_like(x)
    for f_idx, f in enumerate(frames):
        for t in range(P):
            kind, a, b = token_layout(t, pw)
            hpos, wpos = (a, b) if kind == "special" else (6 + a, 6 + b)
            row = f_idx * P + t
            for j in range(32):
                if j < 10:
                    pos, d, k = f, 20, j
                elif j < 21:
                    pos, d, k = hpos, 22, j - 10
                else:
                    pos, d, k = wpos, 22, j - 21
                ang = pos * 10000.0 ** (-2.0 * k / d)
                c, s = math.cos(ang), math.sin(ang)
                x0, x1 = x[row, :, 2 * j], x[row, :, 2 * j + 1]
                out[row, :, 2 * j] = x0 * c - x1 * s
                out[row, :, 2 * j + 1] = x0 * s + x1 * c
    return out


@pytest.mark.parametrize("ph,pw", [(1, 1), (2, 3), (4, 2), (21, 37)])
def test_rope_2d_matches_float64_formula(ph: int, pw: int) -> None:
    gen = torch.Generator().manual_seed(1000 * ph + pw)
    P, H = NUM_SPECIAL + ph * pw, 3
    x = torch.randn(2, P, H, 64, generator=gen)  # [N, P, H, D]
    cos, sin = Rope2D(64, 100.0).tables(ph, pw, "cpu", torch.float32)
    got = apply_rope_2d(x, cos, sin)
    for n in range(2):
        ref = reference_rope_2d(x[n].double().numpy(), ph, pw)
        np.testing.assert_allclose(got[n].numpy(), ref, atol=1e-6, rtol=0)


def test_rope_2d_tables_bit_exact_recipe() -> None:
    ph, pw = 5, 7
    cos, sin = Rope2D(64, 100.0).tables(ph, pw, "cpu", torch.float32)
    omega = torch.tensor(spec_omega_2d(), dtype=torch.float32)
    for t in range(NUM_SPECIAL + ph * pw):
        kind, a, b = token_layout(t, pw)
        py, px = (0, 0) if kind == "special" else (a + 1, b + 1)
        ay = torch.tensor(float(py)) * omega
        ax = torch.tensor(float(px)) * omega
        assert torch.equal(cos[t, 0], torch.cat([ay.cos(), ay.cos(), ax.cos(), ax.cos()]))
        assert torch.equal(sin[t, 0], torch.cat([ay.sin(), ay.sin(), ax.sin(), ax.sin()]))


@pytest.mark.parametrize("frames,ph,pw", [([0], 1, 2), ([0, 1, 2], 2, 3), ([7, 300, 1023], 3, 2), ([5, 5], 2, 2)])
def test_rope_3d_matches_float64_formula(frames: list[int], ph: int, pw: int) -> None:
    gen = torch.Generator().manual_seed(sum(frames) + 17 * ph + pw)
    T = len(frames) * (NUM_SPECIAL + ph * pw)
    x = torch.randn(T, 2, 64, generator=gen)  # [T, H, D]
    rope = Rope3D(64, 10000.0, (20, 22, 22))
    cos, sin = rope.tables(torch.tensor(frames), ph, pw, "cpu", torch.float32)
    got = apply_rope_3d(x, cos, sin)
    ref = reference_rope_3d(x.double().numpy(), frames, ph, pw)
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-6, rtol=0)
    # The applier (what the model uses) gives the same values.
    got2 = rope.applier(torch.tensor(frames), ph, pw, "cpu")(x)
    assert torch.equal(got, got2)


def test_rope_3d_tables_are_rounded_float64() -> None:
    """Each cos/sin value is the float64 value rounded once to fp32 (not computed in fp32)."""
    rope = Rope3D()
    frames = [0, 1, 513, 1023]
    ph, pw = 3, 4
    cos, sin = rope.tables(torch.tensor(frames), ph, pw, "cpu", torch.float32)
    P = NUM_SPECIAL + ph * pw
    for fi, f in enumerate(frames):
        for t in (0, 5, 6, P - 1):
            kind, a, b = token_layout(t, pw)
            hpos, wpos = (a, b) if kind == "special" else (6 + a, 6 + b)
            for j in range(32):
                pos, d, k = (f, 20, j) if j < 10 else ((hpos, 22, j - 10) if j < 21 else (wpos, 22, j - 21))
                exponent = torch.tensor(2.0 * k / d, dtype=torch.float64)
                w = 1.0 / torch.pow(torch.tensor(10000.0, dtype=torch.float64), exponent)
                ang = torch.tensor(float(pos), dtype=torch.float64) * w
                assert cos[fi * P + t, 0, j] == ang.cos().float()
                assert sin[fi * P + t, 0, j] == ang.sin().float()


def test_position_layouts() -> None:
    ph, pw = 3, 4
    p2 = positions_2d(ph, pw)
    assert p2.shape == (NUM_SPECIAL + ph * pw, 2)
    assert p2[:NUM_SPECIAL].eq(0).all()
    for t in range(NUM_SPECIAL, NUM_SPECIAL + ph * pw):
        _, y, x = token_layout(t, pw)
        assert p2[t].tolist() == [y + 1, x + 1]
    p3 = positions_3d(torch.tensor([4, 9]), ph, pw)
    assert p3.shape == (2, NUM_SPECIAL + ph * pw, 3)
    for fi, f in enumerate([4, 9]):
        for s in range(NUM_SPECIAL):
            assert p3[fi, s].tolist() == [f, s, s]
        for t in range(NUM_SPECIAL, NUM_SPECIAL + ph * pw):
            _, y, x = token_layout(t, pw)
            assert p3[fi, t].tolist() == [f, 6 + y, 6 + x]


def test_rope_3d_limits() -> None:
    rope = Rope3D()
    rope.applier(torch.tensor([1023]), 2, 2, "cpu")  # last valid row
    with pytest.raises(ValueError, match="1024"):
        rope.applier(torch.tensor([3, 1024]), 2, 2, "cpu")
    rope.applier(torch.tensor([9]), 2, 2, "cpu", max_positions=10)
    with pytest.raises(ValueError):
        rope.applier(torch.tensor([10]), 2, 2, "cpu", max_positions=10)
    # Spatial rows: 6 + max(ph, pw) must not exceed max_positions.
    rope.applier(torch.tensor([0]), 4, 1, "cpu", max_positions=10)
    with pytest.raises(ValueError, match="spatial"):
        rope.applier(torch.tensor([0]), 1, 5, "cpu", max_positions=10)
    with pytest.raises(ValueError):
        rope.applier(torch.tensor([-1]), 1, 1, "cpu")


def test_tables_cached_per_size_and_dtype() -> None:
    r2, r3 = Rope2D(), Rope3D()
    a = r2.tables(2, 3, "cpu", torch.float32)
    assert r2.tables(2, 3, "cpu", torch.float32)[0] is a[0]
    assert r2.tables(3, 2, "cpu", torch.float32)[0] is not a[0]
    b = r2.tables(2, 3, "cpu", torch.bfloat16)
    assert b[0].dtype == torch.bfloat16 and torch.equal(b[0], a[0].bfloat16())
    s = r3.spatial_tables(2, 3, "cpu", torch.float32)
    assert r3.spatial_tables(2, 3, "cpu", torch.float32)[0] is s[0]
    t = r3.time_table(1024, "cpu", torch.float32)
    assert r3.time_table(1024, "cpu", torch.float32)[0] is t[0]


def test_size_tables_are_bounded_and_keep_the_size_in_use():
    """Tables of many frame sizes never pile up (hostile or changing sizes across sessions), and the
    size used most recently (a running session's, read by its CUDA graph) is never the one dropped."""
    from lingbot_map_ros.core.model.rope import SIZES_KEPT, Rope2D
    from lingbot_map_ros.core.model.table_cache import TableCache

    cache = TableCache(3)
    built = []
    for key in ["a", "b", "c", "a", "d", "e"]:
        cache.get_or_build(key, lambda k=key: built.append(k) or k)
    assert built == ["a", "b", "c", "d", "e"] and cache.keys() == ["a", "d", "e"]
    rope = Rope2D()
    in_use = rope.tables(4, 5, "cpu", torch.float32)
    for ph in range(6, 6 + 3 * SIZES_KEPT):
        rope.tables(ph, 5, "cpu", torch.float32)
        assert rope.tables(4, 5, "cpu", torch.float32) is in_use  # touched every "frame": never evicted
    assert len(rope._cache) == SIZES_KEPT
