"""Every runtime decision in one place: device, dtype, attention backend and kernel, CUDA graphs,
block fusion, autocast — resolved once, with a reason for each, into a ``ResolvedRuntime``.

Users see the choices and their reasons in the log and in the diagnostics, so "why is it slow" has
an answer: e.g. "sdpa (flashinfer is not installed)". ``cache/factory.py`` builds the attention
backends and caches from a ``ResolvedRuntime`` and nothing else; the session only carries it.

Which attention kernel runs (docs/benchmarks.md has the measurements behind these defaults):

* multi-frame steps (phase 1, eager): SDPA over gathered visible slots (``SdpaBackend``) or
  FlashInfer's paged prefill (``fa2``/``fa3``);
* one-frame steps (phase 2, captured in a CUDA graph): ``sdpa`` + ``split`` = cuDNN fused attention
  over the contiguous, fixed-length patch prefix unmasked plus a short masked tail (the spare page
  and the specials), merged by log-sum-exp (``SplitPrefixBackend``); ``sdpa`` + ``cudnn`` = cuDNN
  over the whole fixed-size page storage with a visibility mask (``MaskedDenseBackend``);
  ``sdpa`` + ``flash`` = gather into fixed buffers + varlen flash (``StaticSdpaBackend``);
  ``flashinfer`` = FlashInfer's CUDA-graph wrapper (fa3 over exact token pages on Hopper).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

import torch

from .config import FLASHINFER_KERNELS, SDPA_KERNELS, SWITCHES, RuntimeConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ResolvedRuntime:
    """Concrete runtime settings; built only by ``resolve_for`` / ``resolve_runtime``."""

    device: torch.device
    dtype: torch.dtype
    backend: str  # flashinfer | sdpa
    backend_reason: str
    flashinfer_kernel: str = "fa2"  # fa2 | fa3; used when backend == flashinfer
    sdpa_kernel: str = "flash"  # split | cudnn | flash; one-frame CUDA-graph steps when backend == sdpa
    cuda_graphs: bool = False  # one-frame steps replayed as CUDA graphs
    compile_blocks: bool = False  # torch.compile-fused block bodies inside the graph step
    autotune: bool = False  # the fused blocks' GEMMs autotuned by Inductor (max-autotune; minutes to compile)
    autocast: bool = True  # official mixed precision (False: pure dtype, opt-in)
    kv_splits: int = 0  # split kernel: key ranges its unmasked prefix is read as (0: chosen per frame size)
    prefix_kernel: str = "sdpa"  # split kernel: sdpa = cuDNN prefix + masked tail | triton = one Triton call over runs
    parallel_heads: bool = False  # graph step: the depth head on a side stream beside the camera head (resolve_for: on)
    depth_channels_last: bool = False  # the depth head's conv weights channels-last (resolve_for: on with CUDA)
    step_kernels: str = "torch"  # graph step's small kernels (camera decode, K/V write, q/k-norm+RoPE): torch|triton
    encoder_graph: bool = False  # graph step: the image encoder a graph of its own, queued before the host plans
    compile_depth: bool = False  # graph step: the depth head's arithmetic compiled with the fused blocks
    reasons: tuple[str, ...] = field(default=())  # one line per decision, for logs and diagnostics

    @property
    def attention(self) -> str:
        """The one-frame attention path in words, e.g. ``sdpa:cudnn+graph+compiled``."""
        kernel = self.flashinfer_kernel if self.backend == "flashinfer" else self.sdpa_kernel
        mode = "+graph" if self.cuda_graphs else "+eager"
        ranges = f"+kv{self.kv_splits}" if kernel == "split" and self.cuda_graphs and self.kv_splits > 1 else ""
        heads = "+serialheads" if self.cuda_graphs and not self.parallel_heads else ""
        heads += "+nchwdepth" if self.device.type == "cuda" and not self.depth_channels_last else ""
        heads += "+torchstep" if self.cuda_graphs and self.step_kernels == "torch" else ""
        heads += "+onegraph" if self.cuda_graphs and not self.encoder_graph else ""
        heads += "+eagerdepth" if self.compile_blocks and not self.compile_depth else ""
        split = kernel == "split" and self.cuda_graphs
        prefix = "+cudnnprefix" if split and self.prefix_kernel == "sdpa" else ""
        return f"{self.backend}:{kernel}{mode}{'+compiled' if self.compile_blocks else ''}{ranges}{prefix}{heads}"

    def summary(self) -> str:
        return f"{self.attention}, {str(self.dtype).replace('torch.', '')} on {self.device}: " + "; ".join(self.reasons)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        # The official recipe: bf16 on compute capability >= 8, fp16 below.
        major, _ = torch.cuda.get_device_capability(device)
        return torch.bfloat16 if major >= 8 else torch.float16
    return _DTYPES[name]


def flashinfer_unusable_reason(device: torch.device, dtype: torch.dtype) -> str:
    """Why FlashInfer cannot serve this configuration ("" when it can)."""
    if device.type != "cuda":
        return f"device is {device.type}, FlashInfer needs CUDA"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"dtype is {str(dtype).replace('torch.', '')}, FlashInfer needs float16 or bfloat16"
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer is not installed (pip install '.[gpu]')"
    return ""


def cudnn_attention_unusable_reason(device: torch.device, dtype: torch.dtype) -> str:
    """Why the masked cuDNN one-frame path cannot run ("" when it can)."""
    if device.type != "cuda":
        return f"device is {device.type}"
    if dtype not in (torch.bfloat16, torch.float16):
        return "cuDNN attention needs float16 or bfloat16"
    if not torch.backends.cudnn.is_available():
        return "cuDNN is not available"
    if torch.cuda.get_device_capability(device)[0] < 8:
        return "cuDNN fused attention needs compute capability >= 8"
    return ""


def resolve_backend(name: str, device: torch.device, dtype: torch.dtype) -> tuple[str, str]:
    """``auto``: on Hopper (where it was measured) SDPA with the ``split`` one-frame kernel — cuDNN over
    the contiguous patch prefix + a masked tail, 766 us/layer on an H200 against 949 for FlashInfer
    fa3 over token pages; elsewhere FlashInfer where it runs, else SDPA."""
    if name == "sdpa":
        return "sdpa", "requested"
    reason = flashinfer_unusable_reason(device, dtype)
    if name == "flashinfer":
        if reason:
            raise ValueError(f"attention_backend 'flashinfer' cannot run: {reason}")
        return "flashinfer", "requested"
    if name != "auto":
        raise ValueError(f"attention_backend must be auto, flashinfer or sdpa (got {name!r})")
    if (
        not cudnn_attention_unusable_reason(device, dtype)
        and torch.cuda.get_device_capability(device)[0] in AUTO_SPLIT_ON_CAPABILITY
    ):
        return "sdpa", "auto: cuDNN over the contiguous patch prefix + masked tail (fastest measured on Hopper)"
    if reason:
        return "sdpa", f"auto: {reason}"
    return "flashinfer", "auto: CUDA with a half-precision dtype and flashinfer importable"


# Set by measurement (docs/benchmarks.md, the split kernel's run of record): the compute capabilities
# (major) on which ``auto`` picks SDPA's split kernel over FlashInfer (measured on an H200 only), and
# which one-frame SDPA kernel ``auto`` means where cuDNN runs.
AUTO_SPLIT_ON_CAPABILITY = (9,)
AUTO_SDPA_KERNEL = "split"


def triton_prefix_unusable_reason(device: torch.device) -> str:
    """Why the split backend's Triton prefix kernel cannot run ("" when it can): it needs Triton and
    TMA (CUDA, compute capability >= 9)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if device.type != "cuda":
        return "it runs on CUDA"
    if torch.cuda.get_device_capability(device)[0] < 9:
        return "it needs TMA (compute capability >= 9)"
    return ""


def gluon_runs_unusable_reason(device: torch.device) -> str:
    """Why the Gluon version of the runs kernel cannot run ("" when it can): on top of the Triton
    kernel's needs, Gluon (Triton >= 3.5) and Hopper's wgmma (compute capability 9 exactly)."""
    reason = triton_prefix_unusable_reason(device)
    if reason:
        return reason
    if importlib.util.find_spec("triton.experimental.gluon") is None:
        return "this Triton has no Gluon"
    if torch.cuda.get_device_capability(device)[0] != 9:
        return "it needs Hopper's wgmma (compute capability 9)"
    return ""


PREFIX_KERNELS = ("auto", "sdpa", "triton", "gluon")


def resolve_prefix_kernel(name: str, device: torch.device) -> tuple[str, str]:
    """The split backend's kernel and why. ``auto``: our kernel over the visible runs in Gluon on Hopper
    (27.93 against 28.83 ms a frame with the Triton version on the H200; its warp-specialised layout
    another -0.8 to -1.1 ms), else in Triton where Triton
    and TMA run (28.66 against 31.36 ms with cuDNN's prefix, docs/benchmarks.md), else cuDNN's unmasked
    prefix + masked tail (``sdpa``)."""
    if name not in PREFIX_KERNELS:
        raise ValueError(f"prefix_kernel must be one of {PREFIX_KERNELS} (got {name!r})")
    reason = gluon_runs_unusable_reason(device) if name == "gluon" else triton_prefix_unusable_reason(device)
    if name in ("triton", "gluon"):
        if reason:
            raise ValueError(f"prefix_kernel {name!r} cannot run: {reason}")
        return name, "requested"
    if name == "sdpa":
        return "sdpa", "requested"
    if reason:
        return "sdpa", f"auto: cuDNN, the Triton kernel cannot run ({reason})"
    gluon_reason = gluon_runs_unusable_reason(device)
    if gluon_reason:
        return "triton", f"auto: the Triton kernel (TMA loads, two programs per SM; not in Gluon: {gluon_reason})"
    return "gluon", ("auto: the Gluon kernel (the softmax beside the wgmma, TMA loads; two consumer warpgroups "
                     "sharing each K/V block where its programs fit one wave)")


STEP_KERNELS = ("auto", "torch", "triton")


def resolve_step_kernels(name: str, device: torch.device, graphs: bool) -> tuple[str, str]:
    """Who runs the graph step's small memory-bound pieces, and why: ``triton``, kernels of our own (the
    camera head's split-key decode, ``camera_decode.py``; the K/V write into the pages, ``kv_write.py``)
    wherever Triton runs on CUDA; ``torch``, the PyTorch ops (masked SDPA over the camera cache's
    capacity, stack + ``index_copy_``). Outside the graph step: ``torch``."""
    if name not in STEP_KERNELS:
        raise ValueError(f"step_kernels must be one of {STEP_KERNELS} (got {name!r})")
    if not graphs:
        return "torch", "they serve the CUDA-graph step, which is off"
    reason = "triton is not installed" if importlib.util.find_spec("triton") is None else (
        "" if device.type == "cuda" else "it runs on CUDA")
    if name == "triton" and reason:
        raise ValueError(f"step_kernels 'triton' cannot run: {reason}")
    if name == "torch":
        return "torch", "requested"
    if reason:
        return "torch", f"auto: {reason}"
    return "triton", ("auto: ours in Triton (the camera decode: 16 heads x 11 parts instead of SDPA's 16 thread "
                      "blocks; the K/V write: one kernel instead of a stack and a scatter)")


def resolve_flashinfer_kernel(name: str, device: torch.device) -> str:
    """``auto``: fa3 on Hopper (compute capability 9.x, where FlashInfer has it), fa2 elsewhere.

    fa3 is used over exact one-token pages, so it attends exactly the visible keys (unlike the
    official fa3 mode, which pads pages with zero slots).
    """
    if name not in FLASHINFER_KERNELS:
        raise ValueError(f"flashinfer kernel must be auto, fa2 or fa3 (got {name!r})")
    if name != "auto":
        return name
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9:
        return "fa3"
    return "fa2"


def _switch(name: str, label: str) -> str:
    value = {True: "on", False: "off"}.get(name, name) if isinstance(name, bool) else name
    if value not in SWITCHES:
        raise ValueError(f"{label} must be auto, on or off (got {name!r})")
    return value


def resolve_for(
    device: torch.device,
    dtype: torch.dtype,
    *,
    backend: str = "auto",
    flashinfer_kernel: str = "auto",
    sdpa_kernel: str = "auto",
    cuda_graphs: bool = True,
    compile_blocks: str | bool = "auto",
    autocast: bool = True,
    autotune: bool = False,
    kv_splits: int = 0,
    parallel_heads: bool = True,
    prefix_kernel: str = "auto",
    depth_channels_last: bool = True,
    step_kernels: str = "auto",
    encoder_graph: bool = True,
    compile_depth: bool = True,
) -> ResolvedRuntime:
    """The one function that decides, for a concrete device and dtype. Raises ``ValueError`` (with
    the reason) for a combination that cannot run."""
    reasons: list[str] = []
    chosen, backend_reason = resolve_backend(backend, device, dtype)
    reasons.append(f"backend {chosen}: {backend_reason}")
    graphs = bool(cuda_graphs) and device.type == "cuda" and dtype != torch.float32
    if cuda_graphs and not graphs:
        reasons.append("CUDA graphs off: they need CUDA and a half-precision dtype")
    else:
        reasons.append(f"CUDA graphs {'on' if graphs else 'off (requested)'}")
    fi_kernel = resolve_flashinfer_kernel(flashinfer_kernel, device)
    if chosen == "flashinfer":
        fi_why = "requested" if flashinfer_kernel != "auto" else "auto: fa3 on Hopper"
        reasons.append(f"FlashInfer {fi_kernel} ({fi_why})")
    if sdpa_kernel not in SDPA_KERNELS:
        raise ValueError(f"sdpa_kernel must be one of {SDPA_KERNELS} (got {sdpa_kernel!r})")
    cudnn_reason = cudnn_attention_unusable_reason(device, dtype)
    if sdpa_kernel == "cudnn" and cudnn_reason:
        raise ValueError(f"sdpa_kernel 'cudnn' cannot run: {cudnn_reason}")
    if sdpa_kernel == "split" and cudnn_reason:
        raise ValueError(f"sdpa_kernel 'split' cannot run: {cudnn_reason}")
    sk = sdpa_kernel if sdpa_kernel != "auto" else ("flash" if cudnn_reason else AUTO_SDPA_KERNEL)
    if chosen == "sdpa" and graphs:
        sk_why = "requested" if sdpa_kernel != "auto" else cudnn_reason or "auto"
        reasons.append(f"one-frame SDPA kernel {sk} ({sk_why})")
    if kv_splits < 0:
        raise ValueError(f"kv_splits must be >= 0 (0: auto; got {kv_splits})")
    if chosen == "sdpa" and graphs and sk == "split":
        reasons.append(f"split prefix read as {kv_splits} key ranges (requested)" if kv_splits else
                       "split prefix key ranges per frame size: the fewest waves of thread blocks on the SMs")
    prefix, prefix_why = resolve_prefix_kernel(prefix_kernel, device)
    if chosen == "sdpa" and graphs and sk == "split":
        reasons.append(f"split prefix kernel {prefix} ({prefix_why})")
    else:
        prefix = "sdpa"  # only the split backend has a prefix
    switch = _switch(compile_blocks, "compile_blocks")
    compile_reason = ""
    if not graphs:
        compile_reason = "the fused blocks run inside the CUDA-graph step, which is off"
    elif importlib.util.find_spec("triton") is None:
        compile_reason = "triton is not installed"
    if switch == "on" and compile_reason:
        raise ValueError(f"compile_blocks 'on' cannot run: {compile_reason}")
    fused = switch == "on" or (switch == "auto" and not compile_reason)
    fusion_why = f": {compile_reason}" if compile_reason and switch != "off" else ""
    reasons.append(f"block fusion {'on' if fused else 'off'} ({switch}{fusion_why})")
    if autotune and not fused:
        raise ValueError("GEMM autotuning needs the fused blocks (compile_blocks)")
    if autotune:
        reasons.append("fused blocks' GEMMs autotuned (Inductor max-autotune)")
    # With the fused blocks (CUDA graphs, Triton): the depth head's elementwise work fused around its
    # convolutions (docs/benchmarks.md, eleventh session); ``compile_depth=False`` (``+eagerdepth``) keeps it eager.
    depth_fused = fused and bool(compile_depth)
    if depth_fused:
        reasons.append("depth head compiled with the fused blocks (its upsamplings and elementwise work fused)")
    elif fused:
        reasons.append("depth head eager (requested)")
    # On by default since its measurement (docs/benchmarks.md: depth+camera 31.95 -> 31.00 ms on the
    # H200, poses bit for bit equal); ``parallel_heads=False`` (bench ``+serialheads``) is the old order.
    heads_side_by_side = graphs and bool(parallel_heads)
    if parallel_heads and not graphs:
        reasons.append("depth head after the camera head: the second stream lives in the CUDA-graph step")
    elif heads_side_by_side:
        reasons.append("depth head beside the camera head on a second stream")
    elif graphs:
        reasons.append("depth head after the camera head (requested)")
    if not autocast:
        reasons.append("autocast off: pure low-precision aggregator (opt-in, moves poses)")
    # CUDA only: the depth head's feature maps are NHWC already, and cuDNN converted its NCHW filters on
    # every call; on the CPU the layout would change oneDNN's algorithms, and the CPU is where parity is checked.
    nhwc = bool(depth_channels_last) and device.type == "cuda"
    if nhwc:
        reasons.append("depth head weights channels-last, as its feature maps (no filter conversion per call)")
    step, step_why = resolve_step_kernels(step_kernels, device, graphs)
    if graphs:
        reasons.append(f"graph step's small kernels: {step} ({step_why})")
    # On by default since its measurement (docs/benchmarks.md, eleventh session); ``encoder_graph=False``
    # (bench ``+onegraph``) captures the whole step as one graph, launched after the host's plan.
    split_encoder = graphs and bool(encoder_graph)
    if split_encoder:
        reasons.append("image encoder a graph of its own, queued before the host plans the step (the device "
                       "encodes the frame meanwhile)")
    elif graphs:
        reasons.append("one graph per step, launched after the host's plan (requested)")
    return ResolvedRuntime(
        device=device, dtype=dtype, backend=chosen, backend_reason=backend_reason, flashinfer_kernel=fi_kernel,
        sdpa_kernel=sk, cuda_graphs=graphs, compile_blocks=fused, autotune=bool(autotune), autocast=bool(autocast),
        kv_splits=kv_splits, prefix_kernel=prefix, parallel_heads=heads_side_by_side, depth_channels_last=nhwc,
        step_kernels=step, encoder_graph=split_encoder, compile_depth=depth_fused, reasons=tuple(reasons),
    )


def resolve_runtime(cfg: RuntimeConfig) -> ResolvedRuntime:
    """``RuntimeConfig`` (user settings, ``auto`` allowed) -> ``ResolvedRuntime``."""
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    return resolve_for(
        device, dtype, backend=cfg.attention_backend, flashinfer_kernel=cfg.flashinfer_kernel,
        sdpa_kernel=cfg.sdpa_kernel, cuda_graphs=cfg.cuda_graphs, compile_blocks=cfg.compile_blocks,
        autocast=cfg.autocast,
    )


__all__ = [
    "ResolvedRuntime", "resolve_runtime", "resolve_for", "resolve_device", "resolve_dtype", "resolve_backend",
    "resolve_flashinfer_kernel", "flashinfer_unusable_reason", "cudnn_attention_unusable_reason",
    "resolve_prefix_kernel", "resolve_step_kernels", "STEP_KERNELS", "triton_prefix_unusable_reason",
    "gluon_runs_unusable_reason", "PREFIX_KERNELS",
]
