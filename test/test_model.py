"""Model structure (full preset, meta device) and numerics (tiny preset) against a plain float64 reference.

The reference below is written from docs/model.md only, with explicit LayerNorm/GELU/softmax, explicit
channel splits and explicit RoPE trigonometry; it shares no code with the model package.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lingbot_map_ros.core.config import model_config
from lingbot_map_ros.core.model import (
    DenseCameraAttention,
    DenseGlobalAttention,
    LingBotMap,
    ModelOutput,
    build_model,
)
from lingbot_map_ros.core.model.blocks import frame_attend, global_attend
from lingbot_map_ros.core.model.patch_embed import resample_pos_embed

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
NS = 6  # special tokens per frame


# ---------------------------------------------------------------------------------------------
# Full preset: key names, shapes, counts (meta device: no memory)
# ---------------------------------------------------------------------------------------------


def expected_full_keys() -> dict[str, tuple[int, ...]]:
    """The §3.2 key pattern, spelled out."""
    C, C2 = 1024, 2048
    k: dict[str, tuple[int, ...]] = {
        "aggregator.camera_token": (1, 2, 1, C),
        "aggregator.register_token": (1, 2, 4, C),
        "aggregator.scale_token": (1, 2, 1, C),
        "aggregator.patch_embed.cls_token": (1, 1, C),
        "aggregator.patch_embed.pos_embed": (1, 1370, C),
        "aggregator.patch_embed.register_tokens": (1, 4, C),
        "aggregator.patch_embed.mask_token": (1, C),
        "aggregator.patch_embed.patch_embed.proj.weight": (C, 3, 14, 14),
        "aggregator.patch_embed.patch_embed.proj.bias": (C,),
        "aggregator.patch_embed.norm.weight": (C,),
        "aggregator.patch_embed.norm.bias": (C,),
    }

    def block(prefix: str, d: int, qk: bool) -> None:
        for n in ("norm1", "norm2"):
            k[f"{prefix}.{n}.weight"] = (d,)
            k[f"{prefix}.{n}.bias"] = (d,)
        k[f"{prefix}.attn.qkv.weight"] = (3 * d, d)
        k[f"{prefix}.attn.qkv.bias"] = (3 * d,)
        if qk:
            for n in ("q_norm", "k_norm"):
                k[f"{prefix}.attn.{n}.weight"] = (64,)
                k[f"{prefix}.attn.{n}.bias"] = (64,)
        k[f"{prefix}.attn.proj.weight"] = (d, d)
        k[f"{prefix}.attn.proj.bias"] = (d,)
        k[f"{prefix}.ls1.gamma"] = (d,)
        k[f"{prefix}.ls2.gamma"] = (d,)
        k[f"{prefix}.mlp.fc1.weight"] = (4 * d, d)
        k[f"{prefix}.mlp.fc1.bias"] = (4 * d,)
        k[f"{prefix}.mlp.fc2.weight"] = (d, 4 * d)
        k[f"{prefix}.mlp.fc2.bias"] = (d,)

    for i in range(24):
        block(f"aggregator.patch_embed.blocks.{i}", C, False)
        block(f"aggregator.frame_blocks.{i}", C, True)
        block(f"aggregator.global_blocks.{i}", C, True)
    for i in range(4):
        block(f"camera_head.trunk.{i}", C2, False)
    for n in ("token_norm", "trunk_norm"):
        k[f"camera_head.{n}.weight"] = (C2,)
        k[f"camera_head.{n}.bias"] = (C2,)
    k["camera_head.empty_pose_tokens"] = (1, 1, 9)
    k["camera_head.embed_pose.weight"] = (C2, 9)
    k["camera_head.embed_pose.bias"] = (C2,)
    k["camera_head.poseLN_modulation.1.weight"] = (3 * C2, C2)
    k["camera_head.poseLN_modulation.1.bias"] = (3 * C2,)
    k["camera_head.pose_branch.fc1.weight"] = (1024, C2)
    k["camera_head.pose_branch.fc1.bias"] = (1024,)
    k["camera_head.pose_branch.fc2.weight"] = (9, 1024)
    k["camera_head.pose_branch.fc2.bias"] = (9,)
    k["depth_head.norm.weight"] = (C2,)
    k["depth_head.norm.bias"] = (C2,)
    for i, oc in enumerate((256, 512, 1024, 1024)):
        k[f"depth_head.projects.{i}.weight"] = (oc, C2, 1, 1)
        k[f"depth_head.projects.{i}.bias"] = (oc,)
    k["depth_head.resize_layers.0.weight"] = (256, 256, 4, 4)
    k["depth_head.resize_layers.0.bias"] = (256,)
    k["depth_head.resize_layers.1.weight"] = (512, 512, 2, 2)
    k["depth_head.resize_layers.1.bias"] = (512,)
    k["depth_head.resize_layers.3.weight"] = (1024, 1024, 3, 3)
    k["depth_head.resize_layers.3.bias"] = (1024,)
    for i, ic in enumerate((256, 512, 1024, 1024), start=1):
        k[f"depth_head.scratch.layer{i}_rn.weight"] = (256, ic, 3, 3)
    for r in (1, 2, 3, 4):
        units = ("resConfUnit1", "resConfUnit2") if r != 4 else ("resConfUnit2",)
        for u in units:
            for c in ("conv1", "conv2"):
                k[f"depth_head.scratch.refinenet{r}.{u}.{c}.weight"] = (256, 256, 3, 3)
                k[f"depth_head.scratch.refinenet{r}.{u}.{c}.bias"] = (256,)
        k[f"depth_head.scratch.refinenet{r}.out_conv.weight"] = (256, 256, 1, 1)
        k[f"depth_head.scratch.refinenet{r}.out_conv.bias"] = (256,)
    k["depth_head.scratch.output_conv1.weight"] = (128, 256, 3, 3)
    k["depth_head.scratch.output_conv1.bias"] = (128,)
    k["depth_head.scratch.output_conv2.0.weight"] = (32, 128, 3, 3)
    k["depth_head.scratch.output_conv2.0.bias"] = (32,)
    k["depth_head.scratch.output_conv2.2.weight"] = (2, 32, 1, 1)
    k["depth_head.scratch.output_conv2.2.bias"] = (2,)
    return k


def test_full_preset_keys_shapes_and_count_on_meta() -> None:
    with torch.device("meta"):
        model = LingBotMap(model_config("full"))
    sd = model.state_dict()
    got = {k: tuple(v.shape) for k, v in sd.items()}
    want = expected_full_keys()
    assert sorted(set(got) - set(want)) == []
    assert sorted(set(want) - set(got)) == []
    assert got == want
    assert len(sd) == 1342
    assert sum(v.numel() for v in sd.values()) == 1_157_943_540
    assert all(v.dtype == torch.float32 and v.is_meta for v in sd.values())
    groups = {
        "aggregator.patch_embed.blocks.": 302_358_528,
        "aggregator.frame_blocks.": 302_364_672,
        "aggregator.global_blocks.": 302_364_672,
        "camera_head.trunk.": 201_449_472,
        "depth_head.": 32_654_562,
    }
    for prefix, n in groups.items():
        assert sum(v.numel() for k, v in sd.items() if k.startswith(prefix)) == n, prefix
    with torch.device("meta"):
        no_depth = LingBotMap(model_config("full"), enable_depth=False)
    assert len(no_depth.state_dict()) == 1342 - 62 and no_depth.depth_head is None


# ---------------------------------------------------------------------------------------------
# float64 reference (spec formulas, plain ops)
# ---------------------------------------------------------------------------------------------


def ln(x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None, eps: float) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + eps)
    return y if w is None else y * w + b


def gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def lin(x: torch.Tensor, sd: dict, name: str) -> torch.Tensor:
    return x @ sd[name + ".weight"].T + sd[name + ".bias"]


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [Tq, H, D], k/v [Tk, H, D] -> [Tq, H, D]."""
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    scores = scores - scores.max(-1, keepdim=True).values
    p = torch.exp(scores)
    p = p / p.sum(-1, keepdim=True)
    return torch.einsum("hqk,khd->qhd", p, v)


def rot2d(x: torch.Tensor, pos: list[tuple[int, int]]) -> torch.Tensor:
    """x [T, H, 64]; channels 0..31 by row, 32..63 by column; pairs (i, i+16) inside each half."""
    out = x.clone()
    for t, (py, px) in enumerate(pos):
        for half, p in ((0, py), (1, px)):
            for i in range(16):
                a = p * 100.0 ** (-2.0 * i / 32.0)
                c, s = math.cos(a), math.sin(a)
                i0, i1 = 32 * half + i, 32 * half + i + 16
                out[t, :, i0] = x[t, :, i0] * c - x[t, :, i1] * s
                out[t, :, i1] = x[t, :, i1] * c + x[t, :, i0] * s
    return out


def rot3d(x: torch.Tensor, pos: list[tuple[int, int, int]]) -> torch.Tensor:
    """x [T, H, 64]; pair j=(2j, 2j+1): j<10 time (d=20), j<21 height (d=22), else width (d=22)."""
    out = x.clone()
    for t, (pf, ph_, pw_) in enumerate(pos):
        for j in range(32):
            p, d, kk = (pf, 20, j) if j < 10 else ((ph_, 22, j - 10) if j < 21 else (pw_, 22, j - 21))
            a = p * 10000.0 ** (-2.0 * kk / d)
            c, s = math.cos(a), math.sin(a)
            out[t, :, 2 * j] = x[t, :, 2 * j] * c - x[t, :, 2 * j + 1] * s
            out[t, :, 2 * j + 1] = x[t, :, 2 * j] * s + x[t, :, 2 * j + 1] * c
    return out


def frame_positions_2d(ph: int, pw: int) -> list[tuple[int, int]]:
    return [(0, 0)] * NS + [(y + 1, x + 1) for y in range(ph) for x in range(pw)]


def frame_positions_3d(f: int, ph: int, pw: int) -> list[tuple[int, int, int]]:
    return [(f, s, s) for s in range(NS)] + [(f, 6 + y, 6 + x) for y in range(ph) for x in range(pw)]


def ref_block(x, sd, pre, heads, eps, qk_norm, rope=None, attn=softmax_attention):
    """x [T, C]; pre-norm block with LayerScale; qkv channel c = s*C + h*D + j."""
    T, C = x.shape
    D = C // heads
    h = ln(x, sd[pre + ".norm1.weight"], sd[pre + ".norm1.bias"], eps)
    qkv = lin(h, sd, pre + ".attn.qkv")
    q = qkv[:, 0:C].reshape(T, heads, D)
    k = qkv[:, C : 2 * C].reshape(T, heads, D)
    v = qkv[:, 2 * C : 3 * C].reshape(T, heads, D)
    if qk_norm:
        q = ln(q, sd[pre + ".attn.q_norm.weight"], sd[pre + ".attn.q_norm.bias"], 1e-5)
        k = ln(k, sd[pre + ".attn.k_norm.weight"], sd[pre + ".attn.k_norm.bias"], 1e-5)
    if rope is not None:
        q, k = rope(q), rope(k)
    a = attn(q, k, v).reshape(T, C)
    y = x + sd[pre + ".ls1.gamma"] * lin(a, sd, pre + ".attn.proj")
    hidden = gelu(lin(ln(y, sd[pre + ".norm2.weight"], sd[pre + ".norm2.bias"], eps), sd, pre + ".mlp.fc1"))
    m = lin(hidden, sd, pre + ".mlp.fc2")
    return y + sd[pre + ".ls2.gamma"] * m


def ref_pos_embed(pe: torch.Tensor, ph: int, pw: int, H: int, W: int) -> torch.Tensor:
    """[1+Np, C] from the [1, 1370, C] table (f64 stand-in for the fp32 resampling)."""
    C = pe.shape[-1]
    if ph * pw == 1369 and H == W:
        return pe[0]
    grid = pe[0, 1:].reshape(37, 37, C).permute(2, 0, 1)[None]
    g = F.interpolate(grid, size=(ph, pw), mode="bicubic", antialias=True, align_corners=False)
    return torch.cat([pe[0, :1], g[0].permute(1, 2, 0).reshape(ph * pw, C)], dim=0)


def ref_aggregator(sd, cfg, images, frames, cam_var, scale_var):
    S, _, H, W = images.shape
    ph, pw = H // 14, W // 14
    C = cfg.embed_dim
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    x = (images - mean) / std
    pre = "aggregator.patch_embed."
    conv = F.conv2d(x, sd[pre + "patch_embed.proj.weight"], sd[pre + "patch_embed.proj.bias"], stride=14)
    patches = conv.reshape(S, C, ph * pw).permute(0, 2, 1)  # [S, Np, C]
    pe = ref_pos_embed(sd[pre + "pos_embed"], ph, pw, H, W)
    per_frame = []
    for f in range(S):
        cls = sd[pre + "cls_token"][0] + pe[:1]
        pt = patches[f] + pe[1:]
        t = torch.cat([cls, sd[pre + "register_tokens"][0], pt], dim=0)
        for i in range(cfg.dino_depth):
            t = ref_block(t, sd, f"{pre}blocks.{i}", cfg.dino_num_heads, 1e-6, False)
        t = ln(t, sd[pre + "norm.weight"], sd[pre + "norm.bias"], 1e-6)
        t = t[1 + cfg.num_register_tokens :]
        spec = torch.cat(
            [
                sd["aggregator.camera_token"][0, int(cam_var[f])],
                sd["aggregator.register_token"][0, int(cam_var[f])],
                sd["aggregator.scale_token"][0, int(scale_var[f])],
            ]
        )
        per_frame.append(torch.cat([spec, t], dim=0))  # [P, C]
    P = per_frame[0].shape[0]
    pos2 = frame_positions_2d(ph, pw)
    pos3 = [p for f in range(S) for p in frame_positions_3d(int(frames[f]), ph, pw)]
    outs = []
    for i in range(cfg.depth):
        per_frame = [
            ref_block(t, sd, f"aggregator.frame_blocks.{i}", cfg.num_heads, 1e-5, True, lambda z: rot2d(z, pos2))
            for t in per_frame
        ]
        frame_out = torch.stack(per_frame)
        g = ref_block(
            torch.cat(per_frame),
            sd,
            f"aggregator.global_blocks.{i}",
            cfg.num_heads,
            1e-5,
            True,
            lambda z: rot3d(z, pos3),
        )
        per_frame = list(g.reshape(S, P, C))
        if i in cfg.out_layers:
            outs.append(torch.cat([frame_out, g.reshape(S, P, C)], dim=-1))
    return outs


def ref_camera_head(sd, cfg, cam_tokens, K):
    C2 = cfg.camera_dim
    pre = "camera_head."
    c = ln(cam_tokens, sd[pre + "token_norm.weight"], sd[pre + "token_norm.bias"], 1e-5)
    cn = ln(c, None, None, 1e-6)
    raw = None
    for it in range(K):
        src = sd[pre + "empty_pose_tokens"][0].expand(c.shape[0], 9) if raw is None else raw
        e = lin(src, sd, pre + "embed_pose")
        mod = lin(e * torch.sigmoid(e), sd, pre + "poseLN_modulation.1")
        shift, scale, gate = mod[:, :C2], mod[:, C2 : 2 * C2], mod[:, 2 * C2 :]
        x = gate * (cn * (1 + scale) + shift) + c
        for b in range(cfg.camera_trunk_depth):
            x = ref_block(x, sd, f"{pre}trunk.{b}", cfg.camera_num_heads, 1e-5, False)
        x = ln(x, sd[pre + "trunk_norm.weight"], sd[pre + "trunk_norm.bias"], 1e-5)
        delta = lin(gelu(lin(x, sd, pre + "pose_branch.fc1")), sd, pre + "pose_branch.fc2")
        raw = delta if raw is None else raw + delta
    return torch.cat([raw[:, :7], torch.clamp(raw[:, 7:], min=0)], dim=1)


def ref_pe(Cf: int, h: int, w: int, H: int, W: int) -> torch.Tensor:
    a = W / H
    dlt = math.sqrt(a * a + 1)
    su, sv = (a / dlt) * (w - 1) / w, (1 / dlt) * (h - 1) / h
    n = Cf // 4
    out = torch.zeros(Cf, h, w, dtype=torch.float64)
    for row in range(h):
        v = -sv + 2 * sv * row / (h - 1) if h > 1 else 0.0
        for col in range(w):
            u = -su + 2 * su * col / (w - 1) if w > 1 else 0.0
            for m in range(n):
                om = 100.0 ** (-m / n)
                out[m, row, col] = math.sin(u * om)
                out[n + m, row, col] = math.cos(u * om)
                out[2 * n + m, row, col] = math.sin(v * om)
                out[3 * n + m, row, col] = math.cos(v * om)
    return out


def ref_depth_head(sd, outs, H, W):
    ph, pw = H // 14, W // 14
    p = "depth_head."

    def conv(x, name, stride=1, pad=0, bias=True):
        return F.conv2d(x, sd[name + ".weight"], sd[name + ".bias"] if bias else None, stride=stride, padding=pad)

    def rcu(x, name):
        r = torch.relu(x)  # the skip adds relu(x) (official in-place ReLU)
        return r + conv(torch.relu(conv(r, name + ".conv1", pad=1)), name + ".conv2", pad=1)

    def up(x, size):
        return F.interpolate(x, size=size, mode="bilinear", align_corners=True)

    def ffb(a, b, name, size):
        x = a if b is None else a + rcu(b, name + ".resConfUnit1")
        return conv(up(rcu(x, name + ".resConfUnit2"), size), name + ".out_conv")

    feats = []
    for level, t in enumerate(outs):
        x = ln(t[:, NS:], sd[p + "norm.weight"], sd[p + "norm.bias"], 1e-5)
        x = x.permute(0, 2, 1).reshape(x.shape[0], -1, ph, pw)
        x = conv(x, f"{p}projects.{level}")
        x = x + 0.1 * ref_pe(x.shape[1], ph, pw, H, W)
        if level == 0:
            x = F.conv_transpose2d(x, sd[p + "resize_layers.0.weight"], sd[p + "resize_layers.0.bias"], stride=4)
        elif level == 1:
            x = F.conv_transpose2d(x, sd[p + "resize_layers.1.weight"], sd[p + "resize_layers.1.bias"], stride=2)
        elif level == 3:
            x = conv(x, p + "resize_layers.3", stride=2, pad=1)
        feats.append(conv(x, f"{p}scratch.layer{level + 1}_rn", pad=1, bias=False))
    l1, l2, l3, l4 = feats
    s = p + "scratch."
    o = ffb(l4, None, s + "refinenet4", l3.shape[2:])
    o = ffb(o, l3, s + "refinenet3", l2.shape[2:])
    o = ffb(o, l2, s + "refinenet2", l1.shape[2:])
    o = ffb(o, l1, s + "refinenet1", (2 * l1.shape[2], 2 * l1.shape[3]))
    o = up(conv(o, s + "output_conv1", pad=1), (H, W))
    o = o + 0.1 * ref_pe(o.shape[1], H, W, H, W)
    o = conv(torch.relu(conv(o, s + "output_conv2.0", pad=1)), s + "output_conv2.2")
    return torch.exp(o[:, 0]), 1 + torch.exp(o[:, 1])


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def tiny_model(seed: int = 0, enable_depth: bool = True) -> LingBotMap:
    model, _ = build_model(model_config("tiny"), seed=seed, enable_depth=enable_depth)
    return model


@torch.no_grad()
def perturb(model: LingBotMap, seed: int) -> None:
    """Unit-gain random weights, O(1) LayerScale, non-trivial norms/biases/tokens: every wire matters."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        r = torch.randn(p.shape, generator=g)
        if name.endswith(".gamma"):
            p.copy_(0.3 + 0.4 * torch.rand(p.shape, generator=g))
        elif "norm" in name and name.endswith("weight") and p.dim() == 1:
            p.copy_(1 + 0.1 * r)
        elif name.endswith("bias") or p.dim() == 1:
            p.copy_(0.05 * r)
        elif name.endswith("weight"):
            fan_in = p.shape[1] * (p[0, 0].numel() if p.dim() > 2 else 1)
            if "resize_layers.0" in name or "resize_layers.1" in name:  # ConvTranspose: [in, out, k, k]
                fan_in = p.shape[0]
            p.copy_(r / math.sqrt(fan_in))
        else:  # tokens, pos_embed
            p.copy_(0.5 * r)


def run(model, images, frames, cam, scale, K=4, with_depth=False, **kw) -> ModelOutput:
    return model(
        images,
        rope_frames=torch.as_tensor(frames),
        camera_variant=torch.as_tensor(cam),
        scale_variant=torch.as_tensor(scale),
        global_attention=DenseGlobalAttention(),
        camera_attention=DenseCameraAttention(),
        num_iterations=K,
        with_depth=with_depth,
        **kw,
    )


def f64_state(model: LingBotMap) -> dict[str, torch.Tensor]:
    return {k: v.detach().double() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------


def test_tiny_forward_shapes_and_finite() -> None:
    model = tiny_model(seed=3)
    S, H, W = 3, 28, 42
    x = torch.rand(S, 3, H, W, generator=torch.Generator().manual_seed(5))
    out = run(model, x, [0, 1, 2], [0, 1, 1], [0, 0, 0], with_depth=True)
    assert out.pose_enc.shape == (S, 9) and out.pose_enc.dtype == torch.float32
    assert torch.isfinite(out.pose_enc).all()
    assert (out.pose_enc[:, 7:] >= 0).all()
    assert out.pose_enc.std() > 1e-3  # not degenerate
    assert out.depth.shape == (S, H, W) and out.depth_conf.shape == (S, H, W)
    assert out.depth.dtype == torch.float32 and out.depth_conf.dtype == torch.float32
    assert (out.depth > 0).all() and (out.depth_conf > 1).all()
    no_depth = run(model, x, [0, 1, 2], [0, 1, 1], [0, 0, 0])
    assert no_depth.depth is None and no_depth.depth_conf is None
    assert torch.equal(no_depth.pose_enc, out.pose_enc)


def test_seeded_init_is_deterministic() -> None:
    a, b, c = tiny_model(seed=7), tiny_model(seed=7), tiny_model(seed=8)
    for (k, va), vb, vc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(va, vb), k
    assert any(not torch.equal(va, vc) for va, vc in zip(a.state_dict().values(), c.state_dict().values()))
    assert torch.equal(a.aggregator._resnet_mean.flatten(), torch.tensor(MEAN))
    sd = a.state_dict()
    assert all(torch.all(v == a.cfg.layerscale_init) for k, v in sd.items() if k.endswith(".gamma"))
    assert all(torch.all(v == 0) for k, v in sd.items() if k.endswith(".bias"))
    assert all(torch.all(v == 1) for k, v in sd.items() if k.endswith("norm1.weight") or k.endswith("norm.weight"))
    w = sd["aggregator.frame_blocks.0.attn.qkv.weight"]
    assert 0.01 < w.std() < 0.025 and w.abs().max() <= 0.04 + 1e-7


@pytest.mark.parametrize(
    "S,H,W,frames,cam,scale", [(1, 28, 42, [0], [0], [0]), (3, 42, 28, [0, 1, 5], [0, 1, 1], [0, 0, 1])]
)
def test_tiny_model_matches_float64_reference(S, H, W, frames, cam, scale) -> None:
    model = tiny_model(seed=11)
    perturb(model, seed=12 + S)
    cfg = model.cfg
    x = torch.rand(S, 3, H, W, generator=torch.Generator().manual_seed(13 + S))
    out = run(model, x, frames, cam, scale, K=3, with_depth=True)
    sd = f64_state(model)
    outs = ref_aggregator(sd, cfg, x.double(), frames, cam, scale)
    pose = ref_camera_head(sd, cfg, outs[-1][:, 0], 3)
    assert pose.abs().max() > 0.1  # the comparison is meaningful
    torch.testing.assert_close(out.pose_enc.double(), pose, atol=1e-5, rtol=1e-5)
    depth, conf = ref_depth_head(sd, outs, H, W)
    assert torch.log(depth).std() > 0.05
    torch.testing.assert_close(out.depth.double(), depth, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.depth_conf.double(), conf, atol=1e-5, rtol=1e-5)


def test_single_blocks_match_float64_reference() -> None:
    """One frame block (2D RoPE) and one global block (3D RoPE, dense attention) on the same weights."""
    model = tiny_model(seed=21)
    perturb(model, seed=22)
    agg = model.aggregator
    sd = f64_state(model)
    ph, pw, S = 2, 3, 2
    P, C = NS + ph * pw, model.cfg.embed_dim
    x = torch.randn(S, P, C, generator=torch.Generator().manual_seed(23))
    frames = torch.tensor([4, 9])
    got_f = agg.frame_blocks[1](x, frame_attend(agg.rope2d.applier(ph, pw, "cpu")))
    pos2 = frame_positions_2d(ph, pw)
    for f in range(S):
        ref = ref_block(x[f].double(), sd, "aggregator.frame_blocks.1", 2, 1e-5, True, lambda z: rot2d(z, pos2))
        torch.testing.assert_close(got_f[f].double(), ref, atol=1e-5, rtol=1e-5)
    attend = global_attend(2, agg.rope3d.applier(frames, ph, pw, "cpu"), DenseGlobalAttention())
    got_g = agg.global_blocks[2](x.reshape(1, S * P, C), attend)
    pos3 = [p for f in frames.tolist() for p in frame_positions_3d(f, ph, pw)]
    ref = ref_block(
        x.reshape(S * P, C).double(), sd, "aggregator.global_blocks.2", 2, 1e-5, True, lambda z: rot3d(z, pos3)
    )
    torch.testing.assert_close(got_g[0].double(), ref, atol=1e-5, rtol=1e-5)


def test_pos_embed_resampling_rule() -> None:
    g = torch.Generator().manual_seed(31)
    pe = torch.randn(1, 1370, 32, generator=g)
    assert resample_pos_embed(pe, 37, 37, 518, 518) is pe  # unchanged only for 518x518
    # landscape 518 wide (height downsampled), tiny, square-but-smaller, and upsampled height
    for ph, pw in [(21, 37), (2, 3), (28, 28), (40, 10)]:
        got = resample_pos_embed(pe, ph, pw, 14 * ph, 14 * pw)
        grid = pe[:, 1:].reshape(1, 37, 37, 32).permute(0, 3, 1, 2)
        want = F.interpolate(grid, size=(ph, pw), mode="bicubic", antialias=True, align_corners=False)
        want = want.permute(0, 2, 3, 1).reshape(1, ph * pw, 32)
        assert got.shape == (1, 1 + ph * pw, 32)
        assert torch.equal(got[:, :1], pe[:, :1])
        assert torch.equal(got[:, 1:], want)
    # bf16 table: resampled in fp32 (caller casts afterwards)
    got16 = resample_pos_embed(pe.bfloat16(), 2, 3, 28, 42)
    assert got16.dtype == torch.float32


def test_pos_embed_used_unchanged_for_square_518() -> None:
    """A 518x518 frame through the backbone equals the backbone with the raw table added (tiny widths)."""
    model = tiny_model(seed=41)
    perturb(model, seed=42)
    pe_mod = model.aggregator.patch_embed
    x = torch.randn(1, 3, 518, 518, generator=torch.Generator().manual_seed(43))
    got = pe_mod(x)
    sd = f64_state(model)
    pre = "aggregator.patch_embed."
    conv = F.conv2d(x.double(), sd[pre + "patch_embed.proj.weight"], sd[pre + "patch_embed.proj.bias"], stride=14)
    t = conv.reshape(1, 128, 1369).permute(0, 2, 1)[0]
    pe = sd[pre + "pos_embed"][0]
    t = torch.cat([sd[pre + "cls_token"][0] + pe[:1], sd[pre + "register_tokens"][0], t + pe[1:]])
    for i in range(model.cfg.dino_depth):
        t = ref_block(t, sd, f"{pre}blocks.{i}", 2, 1e-6, False)
    t = ln(t, sd[pre + "norm.weight"], sd[pre + "norm.bias"], 1e-6)[5:]
    torch.testing.assert_close(got[0].double(), t, atol=1e-4, rtol=1e-4)


def test_variants_and_frames_change_the_output() -> None:
    model = tiny_model(seed=51)
    perturb(model, seed=52)
    x = torch.rand(2, 3, 28, 28, generator=torch.Generator().manual_seed(53))
    base = run(model, x, [0, 1], [0, 1], [0, 0]).pose_enc
    assert not torch.allclose(base, run(model, x, [0, 1], [1, 1], [0, 0]).pose_enc)
    assert not torch.allclose(base, run(model, x, [0, 1], [0, 1], [1, 1]).pose_enc)
    assert not torch.allclose(base, run(model, x, [0, 2], [0, 1], [0, 0]).pose_enc)
    assert torch.equal(base, run(model, x, [0, 1], [0, 1], [0, 0]).pose_enc)


def test_embedded_halves_equal_the_whole_forward() -> None:
    """``forward_embedded(embed(x))`` (the CUDA-graph step's two graphs) is ``forward(x)`` bit for bit:
    the same ops on the same values, with the depth head, for stream-like variants; and the encoder
    half really depends on the variants (a cut after the special tokens would not)."""
    model = tiny_model(seed=61)
    perturb(model, seed=62)
    x = torch.rand(3, 3, 28, 42, generator=torch.Generator().manual_seed(63))  # [S, 3, H, W]
    frames, cam, scale = torch.tensor([4, 5, 6]), torch.tensor([1, 1, 0]), torch.tensor([1, 0, 1])
    whole = run(model, x, frames, cam, scale, K=3, with_depth=True)
    tokens = model.embed(x, cam, scale)  # [S, P, C]
    assert tokens.shape == (3, 6 + 2 * 3, model.cfg.embed_dim)
    halves = model.forward_embedded(tokens, (28, 42), rope_frames=frames, global_attention=DenseGlobalAttention(),
                                    camera_attention=DenseCameraAttention(), num_iterations=3, with_depth=True)
    assert torch.equal(halves.pose_enc, whole.pose_enc)
    assert torch.equal(halves.depth, whole.depth) and torch.equal(halves.depth_conf, whole.depth_conf)
    assert not torch.equal(model.embed(x, 1 - cam, scale), tokens)


def test_seams_receive_expected_tensors_and_order() -> None:
    model = tiny_model(seed=61)
    cfg = model.cfg
    g_calls, c_calls = [], []
    dense_g, dense_c = DenseGlobalAttention(), DenseCameraAttention()

    def g_attn(block, q, k, v):
        g_calls.append((block, tuple(q.shape), q.dtype, k.dtype, v.dtype))
        return dense_g(block, q, k, v)

    def c_attn(it, block, q, k, v):
        c_calls.append((it, block, tuple(q.shape)))
        return dense_c(it, block, q, k, v)

    S, ph, pw = 2, 2, 3
    x = torch.rand(S, 3, 14 * ph, 14 * pw)
    model(x, rope_frames=torch.tensor([0, 1]), camera_variant=torch.tensor([0, 1]), scale_variant=torch.tensor([0, 0]),
          global_attention=g_attn, camera_attention=c_attn, num_iterations=2)
    T = S * (NS + ph * pw)
    assert [c[0] for c in g_calls] == list(range(cfg.depth))
    assert all(c[1] == (T, cfg.num_heads, 64) and c[2] == c[3] == c[4] == torch.float32 for c in g_calls)
    assert [(c[0], c[1]) for c in c_calls] == [(i, b) for i in range(2) for b in range(cfg.camera_trunk_depth)]
    assert all(c[2] == (S, cfg.camera_num_heads, cfg.camera_head_dim) for c in c_calls)


def test_autocast_keeps_k_in_v_dtype_and_heads_fp32() -> None:
    model = tiny_model(seed=71)
    seen = []
    dense_g = DenseGlobalAttention()

    def g_attn(block, q, k, v):
        seen.append((q.dtype, k.dtype, v.dtype))
        return dense_g(block, q, k, v)

    x = torch.rand(1, 3, 28, 28)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x, rope_frames=torch.tensor([0]), camera_variant=torch.tensor([0]), scale_variant=torch.tensor([0]),
                    global_attention=g_attn, camera_attention=DenseCameraAttention(), with_depth=True)
    assert all(q == k == v for q, k, v in seen)
    assert out.pose_enc.dtype == torch.float32 and out.depth.dtype == torch.float32
    assert torch.isfinite(out.pose_enc).all()


def test_bad_arguments_raise() -> None:
    model = tiny_model(seed=81, enable_depth=False)
    x = torch.rand(1, 3, 28, 28)
    with pytest.raises(ValueError, match="1024"):
        run(model, x, [1024], [1], [1])
    with pytest.raises(ValueError):
        run(model, x, [9], [1], [1], max_positions=8)
    with pytest.raises(ValueError):
        run(model, x, [0], [0], [0], K=5)
    with pytest.raises(ValueError):
        run(model, x, [0], [0], [0], K=0)
    with pytest.raises(ValueError):
        run(model, torch.rand(1, 3, 28, 30), [0], [0], [0])
    with pytest.raises(ValueError):
        run(model, x, [0, 1], [0], [0])
    with pytest.raises(ValueError):
        run(model, x, [0], [2], [0])
    out = run(model, x, [0], [0], [0], with_depth=True)  # no depth head: depth is None
    assert out.depth is None and torch.isfinite(out.pose_enc).all()


def test_layernorm_epsilons_and_affine() -> None:
    """The three epsilons of §14 (too small an effect for the numeric comparison to see)."""
    model = tiny_model(seed=91)
    eps = {n: (m.eps, m.elementwise_affine) for n, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)}
    for name, (e, affine) in eps.items():
        if name.startswith("aggregator.patch_embed."):
            want = (1e-6, True)
        elif name == "camera_head.adaln_norm":
            want = (1e-6, False)
        else:
            want = (1e-5, True)  # aggregator blocks, q/k norms, camera head, depth head
        assert (e, affine) == want, name
    assert "camera_head.adaln_norm" in eps and "aggregator.frame_blocks.0.attn.q_norm" in eps
    assert "depth_head.norm" in eps


@pytest.mark.parametrize("Cf,h,w,H,W", [(16, 2, 3, 28, 42), (128, 28, 42, 28, 42), (32, 5, 1, 70, 14)])
def test_depth_position_code(Cf, h, w, H, W) -> None:
    from lingbot_map_ros.core.model.depth_head import sincos_position_map

    got = sincos_position_map(Cf, h, w, H, W, torch.float32)
    torch.testing.assert_close(got.double(), ref_pe(Cf, h, w, H, W), atol=2e-7, rtol=0)
    from lingbot_map_ros.core.model.depth_head import _add_pe, sincos_position_codes

    x = torch.randn(2, Cf, h, w, generator=torch.Generator().manual_seed(Cf + h))
    code = tuple(c * 0.1 for c in sincos_position_codes(Cf, h, w, H, W, torch.float32))
    assert torch.equal(_add_pe(x, code), x + got[None] * 0.1)  # broadcast add == materialised add


def test_depth_head_position_codes_match_each_map_and_are_cached() -> None:
    """The head looks its five position codes up once per image size: the projected maps' (one per
    level, at the patch grid) and the output features' (at the image size), each 0.1·PE of its shape."""
    from lingbot_map_ros.core.model.depth_head import sincos_position_codes

    head = tiny_model(seed=95).depth_head
    H, W = 28, 42
    codes = head._pe_codes((H, W), torch.device("cpu"))
    shapes = [(p.out_channels, 2, 3) for p in head.projects] + [(head.scratch.output_conv1.out_channels, H, W)]
    assert len(codes) == 5
    for (cu, cv), (C, h, w) in zip(codes, shapes):
        ru, rv = sincos_position_codes(C, h, w, H, W, torch.float32)
        assert torch.equal(cu, ru * 0.1) and torch.equal(cv, rv * 0.1)
    again = head._pe_codes((H, W), torch.device("cpu"))
    assert all(a[0] is b[0] and a[1] is b[1] for a, b in zip(codes, again))  # cached, not rebuilt


def test_bfloat16_build_runs_and_tracks_fp32() -> None:
    m32 = tiny_model(seed=97)
    m16, _ = build_model(model_config("tiny"), seed=97, dtype=torch.bfloat16)
    assert next(m16.aggregator.parameters()).dtype == torch.bfloat16
    x = torch.rand(2, 3, 28, 42, generator=torch.Generator().manual_seed(98))
    a = run(m32, x, [0, 1], [0, 1], [0, 0], with_depth=True)
    b = run(m16, x, [0, 1], [0, 1], [0, 0], with_depth=True)
    assert b.pose_enc.dtype == torch.float32 and b.depth.dtype == torch.float32
    assert torch.isfinite(b.pose_enc).all() and torch.isfinite(b.depth).all()
    assert (a.pose_enc - b.pose_enc).abs().max() < 0.05 * a.pose_enc.abs().max() + 1e-3


def test_depth_head_weights_in_channels_last_layout_give_the_same_maps():
    """The head's feature maps are channels-last from the token maps on (a view, no copy);
    ``use_channels_last`` gives its convolution weights that layout too. Depth and confidence equal the
    NCHW weights' up to the convolutions' fp32 summation order, for a patch grid that is not square,
    and switching back restores the NCHW weights."""
    from lingbot_map_ros.core.model.depth_head import DPTDepthHead

    torch.manual_seed(0)
    head = DPTDepthHead(dim_in=64, features=16, out_channels=(8, 16, 32, 32)).eval()
    h, w = 3 * 14, 5 * 14
    tokens = [torch.randn(2, 6 + 3 * 5, 64) for _ in range(4)]  # [S, 6 + patches, 2C]
    inputs = []
    hook = head.projects[0].register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
    convs = [m for m in head.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))]
    with torch.no_grad():
        depth_nchw, conf_nchw = head(tokens, (h, w))
        head.use_channels_last(True)
        assert all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
        assert not all(c.weight.is_contiguous() for c in convs)
        depth_nhwc, conf_nhwc = head(tokens, (h, w))
        head.use_channels_last(False)
        assert all(c.weight.is_contiguous() for c in convs)
    hook.remove()
    assert all(x.is_contiguous(memory_format=torch.channels_last) for x in inputs)  # the maps, both times
    assert depth_nhwc.shape == depth_nchw.shape == (2, h, w)
    torch.testing.assert_close(depth_nhwc, depth_nchw, rtol=2e-5, atol=1e-6)
    torch.testing.assert_close(conf_nhwc, conf_nchw, rtol=2e-5, atol=1e-6)


def test_depth_head_arithmetic_traces_as_one_graph() -> None:
    """``dpt_chunk`` is what the graph step compiles with ``fullgraph=True``: Dynamo must trace it whole
    (no graph break: a break is an error on the GPU) and the traced function must give the eager
    values. The backend here is Dynamo's ``eager`` one (no code generation on the CPU); the GPU test
    compares Inductor's kernels with float64."""
    from lingbot_map_ros.core.model.depth_head import dpt_chunk
    from lingbot_map_ros.core.model.fusion import allow_recompiles

    allow_recompiles(64)
    head = tiny_model(seed=97).depth_head
    perturb_gen = torch.Generator().manual_seed(98)
    tokens = [torch.randn(1, 6 + 2 * 3, head.norm.normalized_shape[0], generator=perturb_gen) for _ in range(4)]
    codes = head._pe_codes((28, 42), torch.device("cpu"))
    traced = torch.compile(dpt_chunk, backend="eager", fullgraph=True, dynamic=False)
    with torch.inference_mode():
        want = dpt_chunk(head, tokens, codes, (28, 42))
        got = traced(head, tokens, codes, (28, 42))
    assert got[0].shape == (1, 28, 42) and all(torch.equal(a, b) for a, b in zip(got, want))


def test_position_table_is_built_once_per_size_and_follows_the_weights() -> None:
    """The DINO position table (resampled per frame size) is cached: the same values as resampling on
    the spot, the same tensor on the next call, and a new one after the weights change in place (a
    checkpoint load) or move to another dtype; a new size gets its own."""
    from lingbot_map_ros.core.model.patch_embed import resample_pos_embed

    dino = tiny_model(seed=71).aggregator.patch_embed
    first = dino.position_table(2, 3, 28, 42, torch.float32)
    assert torch.equal(first, resample_pos_embed(dino.pos_embed, 2, 3, 28, 42).float())
    assert dino.position_table(2, 3, 28, 42, torch.float32) is first
    with torch.no_grad():
        dino.pos_embed.add_(0.25)  # what loading a checkpoint does to the parameter
    changed = dino.position_table(2, 3, 28, 42, torch.float32)
    assert changed is not first and torch.equal(changed, resample_pos_embed(dino.pos_embed, 2, 3, 28, 42).float())
    other = dino.position_table(3, 3, 42, 42, torch.float32)
    assert other.shape[1] == 1 + 9 and dino.position_table(2, 3, 28, 42, torch.float32) is changed
    dino.double()
    assert dino.position_table(2, 3, 28, 42, torch.float64).dtype == torch.float64
    assert torch.equal(dino.position_table(2, 3, 28, 42, torch.float64),
                       resample_pos_embed(dino.pos_embed, 2, 3, 28, 42).double())
