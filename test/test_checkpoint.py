"""Checkpoint reading and validation (docs/model.md §3): layouts, prefixes, formats, errors, unsafe pickles."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lingbot_map_ros.core.config import model_config
from lingbot_map_ros.core.model import (
    CheckpointError,
    DenseCameraAttention,
    DenseGlobalAttention,
    LingBotMap,
    apply_state_dict,
    build_model,
    load_state_dict_file,
)

TINY = model_config("tiny")


class NotATensor:
    """An object whose unpickling needs this module: weights_only=True must refuse it."""

    def __init__(self, value: int = 3) -> None:
        self.value = value


def forward(model: LingBotMap, x: torch.Tensor, with_depth: bool = True):
    S = x.shape[0]
    return model(
        x,
        rope_frames=torch.arange(S),
        camera_variant=(torch.arange(S) > 0).long(),
        scale_variant=torch.zeros(S, dtype=torch.long),
        global_attention=DenseGlobalAttention(),
        camera_attention=DenseCameraAttention(),
        with_depth=with_depth,
    )


@pytest.fixture(scope="module")
def source():
    model, report = build_model(TINY, seed=123)
    assert report.depth_available and report.source == "random(seed=123)"
    x = torch.rand(2, 3, 28, 42, generator=torch.Generator().manual_seed(9))
    out = forward(model, x)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    return sd, x, out


def _save(path: Path, obj) -> str:
    torch.save(obj, path)
    return str(path)


@pytest.mark.parametrize("layout", ["plain", "wrapped", "module_prefix", "compiled_ddp", "safetensors"])
def test_round_trip_gives_identical_outputs(tmp_path: Path, source, layout: str) -> None:
    sd, x, ref = source
    if layout == "plain":
        path = _save(tmp_path / "m.pt", sd)
    elif layout == "wrapped":
        path = _save(tmp_path / "m.pth", {"model": sd, "epoch": 7, "optimizer": {"lr": 1e-4}})
    elif layout == "module_prefix":
        path = _save(tmp_path / "m.pt", {"model": {"module." + k: v for k, v in sd.items()}})
    elif layout == "compiled_ddp":
        path = _save(tmp_path / "m.pt", {"module._orig_mod." + k: v for k, v in sd.items()})
    else:
        path = str(tmp_path / "m.safetensors")
        save_file({k: v.contiguous() for k, v in sd.items()}, path)
    model, report = build_model(TINY, checkpoint=path, seed=999)
    assert report.loaded == len(sd) and report.depth_available and report.unexpected_keys == []
    assert report.source == path
    if layout == "module_prefix":
        assert report.stripped_prefix == "module."
    if layout == "compiled_ddp":
        assert report.stripped_prefix == "module._orig_mod."
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd[k]), k
    out = forward(model, x)
    assert torch.equal(out.pose_enc, ref.pose_enc)
    assert torch.equal(out.depth, ref.depth) and torch.equal(out.depth_conf, ref.depth_conf)
    assert not any(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())
    assert not model.training


def test_apply_into_materialised_model(source) -> None:
    sd, x, ref = source
    model, _ = build_model(TINY, seed=5)
    assert not torch.equal(forward(model, x).pose_enc, ref.pose_enc)
    report = apply_state_dict(model, sd)
    assert report.loaded == len(sd)
    assert torch.equal(forward(model, x).pose_enc, ref.pose_enc)


def test_missing_required_key_names_it(tmp_path: Path, source) -> None:
    sd, _, _ = source
    bad = dict(sd)
    del bad["aggregator.global_blocks.1.attn.k_norm.weight"]
    del bad["camera_head.pose_branch.fc2.bias"]
    path = _save(tmp_path / "m.pt", bad)
    with pytest.raises(CheckpointError) as exc:
        build_model(TINY, checkpoint=path)
    msg = str(exc.value)
    assert "aggregator.global_blocks.1.attn.k_norm.weight" in msg and "camera_head.pose_branch.fc2.bias" in msg
    assert "missing 2" in msg


def test_many_missing_keys_are_summarised(source) -> None:
    sd, _, _ = source
    bad = {k: v for k, v in sd.items() if not k.startswith("aggregator.frame_blocks.")}
    with torch.device("meta"):
        model = LingBotMap(TINY)
    with pytest.raises(CheckpointError, match=r"missing 72 required keys: .*more\)"):
        apply_state_dict(model, bad, device="cpu")


def test_wrong_shape_names_it(tmp_path: Path, source) -> None:
    sd, _, _ = source
    bad = dict(sd)
    bad["camera_head.embed_pose.weight"] = torch.zeros(3, 9)
    path = _save(tmp_path / "m.pt", bad)
    with pytest.raises(CheckpointError, match=r"camera_head\.embed_pose\.weight \(checkpoint \[3, 9\]"):
        build_model(TINY, checkpoint=path)


def test_missing_depth_head_disables_depth(tmp_path: Path, source) -> None:
    sd, x, ref = source
    no_depth = {k: v for k, v in sd.items() if not k.startswith("depth_head.")}
    path = _save(tmp_path / "m.pt", no_depth)
    model, report = build_model(TINY, checkpoint=path)
    assert not report.depth_available and model.depth_head is None and not model.has_depth
    assert len(report.missing_depth_keys) == sum(k.startswith("depth_head.") for k in sd)
    assert report.depth_reason
    out = forward(model, x, with_depth=True)
    assert out.depth is None and out.depth_conf is None
    assert torch.equal(out.pose_enc, ref.pose_enc)
    # a single missing depth tensor also disables depth (and is named)
    partial = dict(sd)
    del partial["depth_head.scratch.output_conv2.2.bias"]
    model2, report2 = build_model(TINY, checkpoint=_save(tmp_path / "p.pt", partial))
    assert model2.depth_head is None and report2.missing_depth_keys == ["depth_head.scratch.output_conv2.2.bias"]
    assert report2.unexpected_keys == []


def test_depth_not_enabled_skips_depth_keys(tmp_path: Path, source) -> None:
    sd, x, ref = source
    model, report = build_model(TINY, checkpoint=_save(tmp_path / "m.pt", sd), enable_depth=False)
    assert model.depth_head is None and not report.depth_available
    assert report.unexpected_keys == [] and len(report.skipped_keys) > 0
    assert torch.equal(forward(model, x).pose_enc, ref.pose_enc)


def test_unexpected_keys_reported_not_fatal(tmp_path: Path, source) -> None:
    sd, x, ref = source
    extra = dict(sd)
    extra["point_head.scratch.output_conv2.2.bias"] = torch.zeros(4)
    extra["training_step_counter"] = torch.tensor(5)
    model, report = build_model(TINY, checkpoint=_save(tmp_path / "m.pt", extra))
    assert report.unexpected_keys == ["point_head.scratch.output_conv2.2.bias", "training_step_counter"]
    assert "unexpected" in report.summary()
    assert torch.equal(forward(model, x).pose_enc, ref.pose_enc)


def test_code_running_pickle_refused_unless_allowed(tmp_path: Path, source) -> None:
    sd, x, ref = source
    path = _save(tmp_path / "unsafe.pt", {"model": sd, "meta": NotATensor()})
    with pytest.raises(CheckpointError, match="allow_unsafe"):
        load_state_dict_file(path)
    with pytest.raises(CheckpointError, match="allow_unsafe"):
        build_model(TINY, checkpoint=path)
    loaded = load_state_dict_file(path, allow_unsafe=True)
    assert set(loaded) == set(sd)
    model, _ = build_model(TINY, checkpoint=path, allow_unsafe=True)
    assert torch.equal(forward(model, x).pose_enc, ref.pose_enc)


def test_legacy_format_and_bad_files(tmp_path: Path, source) -> None:
    sd, x, ref = source
    legacy = tmp_path / "legacy.pt"
    torch.save({"model": sd}, legacy, _use_new_zipfile_serialization=False)
    assert set(load_state_dict_file(legacy)) == set(sd)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_state_dict_file(tmp_path / "nope.pt")
    with pytest.raises(CheckpointError, match="not a state dict"):
        load_state_dict_file(_save(tmp_path / "list.pt", [1, 2, 3]))
    with pytest.raises(CheckpointError, match="no tensors"):
        load_state_dict_file(_save(tmp_path / "empty.pt", {"model": {}}))
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError):
        load_state_dict_file(garbage)


@pytest.mark.parametrize("content, needle", [
    (b"hello world, not a checkpoint\n" * 40, "is not a PyTorch or safetensors checkpoint: a text file"),
    (b"e" * 200, "is not a PyTorch or safetensors checkpoint: a text file"),  # torch: IndexError, pop from empty list
    (b'{"model": {"weight": [1, 2, 3]}}', "a text file (starts with b'{\"model\": {\"weig'"),  # torch: "unsafe"
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 4600000000\n", "Git LFS pointer"),
    (b"", "is empty (0 bytes)"),
    (bytes(range(1, 200)), "an unknown binary file"),
])
def test_a_file_that_is_no_checkpoint_gets_one_clear_line(tmp_path: Path, content: bytes, needle: str) -> None:
    """torch.load on such files fails deep in its unpickler (``KeyError: 101``, ``pop from empty
    list``) or calls them unsafe pickles; the reason must say what the file is, in one line."""
    path = tmp_path / "model.pt"
    path.write_bytes(content)
    for call in (lambda: load_state_dict_file(path), lambda: build_model(TINY, checkpoint=str(path))):
        with pytest.raises(CheckpointError) as exc:
            call()
        text = str(exc.value)
        assert needle in text and "model.pt" in text, text
        assert "\n" not in text and "allow_unsafe" not in text and "KeyError" not in text, text


def test_format_is_read_from_the_content_not_the_name(tmp_path: Path, source) -> None:
    sd, x, ref = source
    misnamed = tmp_path / "weights.pt"  # a safetensors file with a .pt name loads as safetensors
    save_file({k: v.contiguous() for k, v in sd.items()}, str(misnamed))
    assert set(load_state_dict_file(misnamed)) == set(sd)
    pickled = tmp_path / "weights.safetensors"  # a torch.save zip named .safetensors: the fix is said
    torch.save({"model": sd}, pickled)
    with pytest.raises(CheckpointError, match=r"named \.safetensors but is not a safetensors file .*zip.*rename"):
        load_state_dict_file(pickled)
    truncated = tmp_path / "truncated.pt"
    torch.save({"model": sd}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match=r"\(zip file, corrupt or truncated\?\)") as exc:
        load_state_dict_file(truncated)
    assert "\n" not in str(exc.value)


def test_dtype_cast_aggregator_only(tmp_path: Path, source) -> None:
    sd, _, _ = source
    path = _save(tmp_path / "m.pt", {k: v.half() for k, v in sd.items()})  # stored fp16
    model, report = build_model(TINY, checkpoint=path, dtype=torch.bfloat16)
    assert report.checkpoint_dtypes == ["float16"]
    assert all(p.dtype == torch.bfloat16 for p in model.aggregator.parameters())
    assert all(p.dtype == torch.float32 for p in model.camera_head.parameters())
    assert all(p.dtype == torch.float32 for p in model.depth_head.parameters())
    assert model.aggregator._resnet_mean.dtype == torch.float32
    k = "camera_head.embed_pose.weight"
    assert torch.equal(model.state_dict()[k], sd[k].half().float())


def test_full_preset_validation_on_meta() -> None:
    """Key/shape validation of the full model without allocating it (meta model, meta state dict)."""
    with torch.device("meta"):
        model = LingBotMap(model_config("full"))
        sd = LingBotMap(model_config("full")).state_dict()
    bad = dict(sd)
    bad["aggregator.patch_embed.pos_embed"] = torch.empty(1, 1025, 1024, device="meta")
    with pytest.raises(
        CheckpointError,
        match=r"aggregator\.patch_embed\.pos_embed \(checkpoint \[1, 1025, 1024\], model \[1, 1370, 1024\]\)",
    ):
        apply_state_dict(model, bad, device="meta")
    missing = {k: v for k, v in sd.items() if k != "aggregator.scale_token"}
    with pytest.raises(CheckpointError, match=r"aggregator\.scale_token"):
        apply_state_dict(model, missing, device="meta")
    tiny_sd = LingBotMap(TINY).state_dict()
    with pytest.raises(CheckpointError, match="model_preset"):
        apply_state_dict(model, tiny_sd, device="meta")
    report = apply_state_dict(model, {"module." + k: v for k, v in sd.items()}, device="meta")
    assert report.loaded == 1342 and report.depth_available and report.stripped_prefix == "module."
