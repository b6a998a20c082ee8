"""Reading official checkpoints and putting them into a :class:`LingBotMap` with checks (docs/model.md §3).

The official demo loads with ``strict=False`` and never looks at the result, so a prefixed or
truncated file silently runs on random weights (§16 #15). Here every ``aggregator.*`` and
``camera_head.*`` tensor must be present with its exact shape; a missing depth head only disables
depth; extra keys are reported. Pickles are opened with ``weights_only=True`` first and code-running
pickles are refused unless the user opts in (``allow_unsafe_checkpoint``).

Memory: ``build_model`` constructs the model on the meta device and *assigns* the loaded tensors
(``.pt`` files are memory-mapped when possible), so the full 4.6 GB model never exists twice.
"""
from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from .lingbot_map import LingBotMap

REQUIRED_PREFIXES = ("aggregator.", "camera_head.")
DEPTH_PREFIX = "depth_head."
WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DataParallel/DDP and torch.compile wrappers
MAX_NAMED = 5


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message says why and what to do."""


@dataclass
class LoadReport:
    source: str = ""  # checkpoint path, or "random(seed=N)"
    loaded: int = 0  # tensors put into the model
    depth_available: bool = False
    depth_reason: str = ""  # why depth is unavailable ("" when it is)
    missing_depth_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)  # keys the model as built does not declare
    skipped_keys: list[str] = field(default_factory=list)  # known depth keys not loaded (depth off)
    stripped_prefix: str = ""
    checkpoint_dtypes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"{self.source or 'state dict'}: {self.loaded} tensors loaded"]
        if self.stripped_prefix:
            parts.append(f"prefix {self.stripped_prefix!r} stripped")
        if self.checkpoint_dtypes:
            parts.append("stored as " + "/".join(self.checkpoint_dtypes))
        parts.append("depth head " + ("available" if self.depth_available else f"disabled ({self.depth_reason})"))
        if self.unexpected_keys:
            parts.append(f"{len(self.unexpected_keys)} unexpected keys ignored: {_name_some(self.unexpected_keys)}")
        return "; ".join(parts)


def _name_some(keys: list[str], n: int = MAX_NAMED) -> str:
    shown = ", ".join(keys[:n])
    return shown + (f", ... ({len(keys) - n} more)" if len(keys) > n else "")


def _torch_load(path: Path, weights_only: bool) -> object:
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only, mmap=True)
    except RuntimeError as exc:
        if "mmap" not in str(exc):  # legacy (non-zip) files cannot be memory-mapped
            raise
    return torch.load(path, map_location="cpu", weights_only=weights_only)


ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default (zip) format
PICKLE_PROTOCOL_2_PLUS = b"\x80"  # torch.save's legacy format: pickles of protocol >= 2
LFS_POINTER = b"version https://git-lfs"  # a Git LFS pointer checked out instead of the file
SNIFF_BYTES = 64


def _looks_like_safetensors(head: bytes) -> bool:
    """safetensors: an 8-byte little-endian header length, then the JSON header itself."""
    return len(head) > 9 and 0 < int.from_bytes(head[:8], "little") < 100_000_000 and head[8:9] == b"{"


def sniff_format(path: Path) -> str:
    """``"zip"``, ``"pickle"`` or ``"safetensors"`` from the first bytes of ``path``, else
    ``CheckpointError`` saying what the file is instead.

    Why: ``torch.load`` on a file that is no checkpoint at all (a text file, an HTML error page
    saved as ``.pt``, a Git LFS pointer) fails deep inside its unpickler with a bare ``KeyError: 101``
    or ``pop from empty list``, or is taken for an unsafe pickle; one look at the magic bytes gives
    the real reason."""
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {str(path)!r}: {exc.strerror or exc}") from None
    if not head:
        raise CheckpointError(f"checkpoint {str(path)!r} is empty (0 bytes): an interrupted download?")
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if _looks_like_safetensors(head):
        return "safetensors"
    if head.startswith(PICKLE_PROTOCOL_2_PLUS):
        return "pickle"
    if head.startswith(LFS_POINTER):
        raise CheckpointError(f"checkpoint {str(path)!r} is a Git LFS pointer, not the weights: run "
                              "`git lfs pull` where it was cloned, or download the file itself")
    start = head[:16]
    kind = "a text file" if all(32 <= b < 127 or b in (9, 10, 13) for b in head) else "an unknown binary file"
    raise CheckpointError(f"checkpoint {str(path)!r} is not a PyTorch or safetensors checkpoint: {kind} "
                          f"(starts with {start!r}; a checkpoint is a zip archive from torch.save, a pickle, "
                          "or a .safetensors file)")


def _reason(exc: BaseException) -> str:
    """The first line of a loader's error, with its type where the text alone says nothing."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, (RuntimeError, OSError, ValueError)) and len(text) > 12:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def load_state_dict_file(path: str | Path, allow_unsafe: bool = False) -> dict[str, Tensor]:
    """Tensors of a ``.pt``/``.pth``/``.safetensors`` checkpoint (``ckpt["model"]`` when present), on the CPU.

    Every failure is one ``CheckpointError`` line naming the file and the reason."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a file")
    kind = sniff_format(path)
    if path.suffix == ".safetensors" or kind == "safetensors":
        if kind != "safetensors":
            raise CheckpointError(f"checkpoint {str(path)!r} is named .safetensors but is not a safetensors file "
                                  f"(it looks like a {kind} file from torch.save: rename it to .pt)")
        try:
            from safetensors.torch import load_file
        except ImportError as exc:  # pragma: no cover - safetensors is a dependency
            raise CheckpointError("reading .safetensors needs the 'safetensors' package") from exc
        try:
            obj: object = load_file(str(path), device="cpu")
        except Exception as exc:
            raise CheckpointError(f"cannot read safetensors checkpoint {str(path)!r}: {_reason(exc)}") from exc
    else:
        try:
            obj = _torch_load(path, weights_only=True)
        except pickle.UnpicklingError as exc:
            if not allow_unsafe:
                raise CheckpointError(
                    f"checkpoint {str(path)!r} cannot be loaded safely (weights_only=True): it contains objects "
                    "whose unpickling runs arbitrary code (or it is corrupt). Only if you trust the file, set "
                    f"allow_unsafe_checkpoint:=true (allow_unsafe=True). Loader said: {_reason(exc)}"
                ) from exc
            try:
                obj = _torch_load(path, weights_only=False)
            except Exception as exc2:
                raise CheckpointError(f"cannot read checkpoint {str(path)!r}: {_reason(exc2)}") from exc2
        except Exception as exc:
            raise CheckpointError(f"cannot read checkpoint {str(path)!r} ({kind} file, corrupt or truncated?): "
                                  f"{_reason(exc)}") from exc
    return _extract_state_dict(obj, str(path))


def _extract_state_dict(obj: object, where: str) -> dict[str, Tensor]:
    if isinstance(obj, Mapping) and "model" in obj:
        obj = obj["model"]
    if isinstance(obj, nn.Module):
        obj = obj.state_dict()
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"checkpoint {where!r} holds a {type(obj).__name__}, not a state dict")
    sd = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, Tensor)}
    if not sd:
        raise CheckpointError(f"checkpoint {where!r} contains no tensors")
    return sd


def _strip_wrappers(sd: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], str]:
    """Remove wrapper prefixes shared by *every* key (``module.``, ``_orig_mod.``, possibly nested)."""
    stripped = ""
    keys = list(sd)
    changed = True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if keys and all(k.startswith(prefix) for k in keys):
                keys = [k[len(prefix) :] for k in keys]
                stripped += prefix
                changed = True
    return dict(zip(keys, sd.values())), stripped


def _check_required(sd: Mapping[str, Tensor], expected: Mapping[str, Tensor]) -> None:
    """Every aggregator/camera-head tensor of the model present in ``sd`` with its exact shape."""
    missing, mismatched = [], []
    for key, target in expected.items():
        if key.startswith(DEPTH_PREFIX):
            continue
        if key not in sd:
            missing.append(key)
        elif tuple(sd[key].shape) != tuple(target.shape):
            mismatched.append(f"{key} (checkpoint {list(sd[key].shape)}, model {list(target.shape)})")
    if missing or mismatched:
        lines = ["checkpoint does not match the model (wrong file, or wrong model_preset?)"]
        if missing:
            lines.append(f"missing {len(missing)} required keys: {_name_some(missing)}")
        if mismatched:
            lines.append(f"{len(mismatched)} keys with the wrong shape: {_name_some(mismatched)}")
        raise CheckpointError("; ".join(lines))


def check_checkpoint(cfg: ModelConfig, checkpoint: str | Path, *, allow_unsafe: bool = False) -> None:
    """Raise ``CheckpointError`` unless ``checkpoint`` would load into a model of ``cfg``: readable,
    safe to unpickle, every required key with its shape. Nothing is allocated (the file is memory-
    mapped where possible and the model lives on the meta device), so a node can check a
    ``ros2 param set checkpoint`` before accepting it."""
    sd, _ = _strip_wrappers(load_state_dict_file(checkpoint, allow_unsafe=allow_unsafe))
    with torch.device("meta"):
        expected = LingBotMap(cfg, enable_depth=True).state_dict()
    _check_required(sd, expected)


def model_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of the model's tensors as ``build_model`` places them (aggregator in ``dtype``, heads fp32)."""
    with torch.device("meta"):
        model = LingBotMap(cfg, enable_depth=True)
    total = 0
    for name, t in model.state_dict().items():
        itemsize = torch.empty((), dtype=dtype).element_size() if name.startswith("aggregator.") else 4
        total += t.numel() * itemsize
    return total


def apply_state_dict(
    model: LingBotMap, sd: Mapping[str, Tensor], *, device: torch.device | str | None = None
) -> LoadReport:
    """Validate ``sd`` against ``model`` and load it; returns what happened.

    Works on a materialised model (values copied in place) and on one built on the meta device
    (tensors assigned after moving to ``device``, default CPU, and casting to each parameter's dtype).
    """
    sd, stripped = _strip_wrappers(sd)
    expected = model.state_dict(keep_vars=True)
    report = LoadReport(stripped_prefix=stripped)
    report.checkpoint_dtypes = sorted({str(t.dtype).replace("torch.", "") for t in sd.values()})
    _check_required(sd, expected)

    known_depth = {k for k in sd if k.startswith(DEPTH_PREFIX)}
    if model.depth_head is None:
        report.depth_reason = "not enabled"
        report.skipped_keys = sorted(known_depth)
    else:
        depth_expected = {k: t for k, t in expected.items() if k.startswith(DEPTH_PREFIX)}
        report.missing_depth_keys = sorted(k for k in depth_expected if k not in sd)
        bad_depth = sorted(k for k, t in depth_expected.items() if k in sd and tuple(sd[k].shape) != tuple(t.shape))
        if report.missing_depth_keys or bad_depth:
            report.depth_reason = (
                f"checkpoint lacks {len(report.missing_depth_keys)} depth_head keys"
                if report.missing_depth_keys
                else f"depth_head keys with the wrong shape: {_name_some(bad_depth)}"
            )
            report.skipped_keys = sorted(known_depth & set(depth_expected))
            model.depth_head = None
        else:
            report.depth_available = True
    expected = model.state_dict(keep_vars=True)
    skipped = set(report.skipped_keys)
    report.unexpected_keys = sorted(k for k in sd if k not in expected and k not in skipped)

    meta = any(t.is_meta for t in expected.values())
    target_device = torch.device(device) if device is not None else torch.device("cpu")
    to_load: dict[str, Tensor] = {}
    for key, target in expected.items():
        value = sd[key]
        if meta:
            # cast on the CPU, then move, one tensor at a time: an fp32 checkpoint loaded into a bf16
            # aggregator never puts an fp32 copy of the weights on the GPU (docs/memory.md)
            value = value.to(dtype=target.dtype).to(device=target_device)
        to_load[key] = value
    model.load_state_dict(to_load, strict=True, assign=meta)
    if meta:
        model.aggregator.reset_buffers(target_device)
    report.loaded = len(to_load)
    report.depth_available = model.depth_head is not None
    return report


def build_model(
    cfg: ModelConfig,
    *,
    checkpoint: str = "",
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    enable_depth: bool = True,
    allow_unsafe: bool = False,
) -> tuple[LingBotMap, LoadReport]:
    """Model in eval mode with checkpoint weights (validated) or seeded random weights.

    ``dtype`` applies to the aggregator; the camera and depth heads stay fp32 (they run in fp32 with
    autocast off, docs/model.md §14). Built on the meta device first, so no throw-away random init is
    allocated when a checkpoint is given.
    """
    device = torch.device(device)
    with torch.device("meta"):
        model = LingBotMap(cfg, enable_depth=enable_depth)
    model.aggregator.to(dtype)
    if checkpoint:
        sd = load_state_dict_file(checkpoint, allow_unsafe=allow_unsafe)
        report = apply_state_dict(model, sd, device=device)
        del sd
        report.source = str(checkpoint)
    else:
        model.to_empty(device=device)
        model.init_weights(seed)
        report = LoadReport(
            source=f"random(seed={seed})",
            loaded=len(model.state_dict()),
            depth_available=model.depth_head is not None,
            depth_reason="" if model.depth_head is not None else "not enabled",
        )
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, report
