"""Every runtime decision in one place: device, dtype, attention backend and kernel, CUDA graphs,
block fusion, autocast — resolved once, with a reason for each, into a ``ResolvedRuntime``.

Users see the choices and their reasons in the log and in the diagnostics, so "why is it slow" has
an answer: e.g. "sdpa (flashinfer is not installed)". ``cache/factory.py`` builds the attention
backends and caches from a ``ResolvedRuntime`` and nothing else; the session only carries it.

Which attention kernel runs (docs/performance.md has the measurements behind these defaults; docs/hardware.md
says which path each compute capability gets):

* multi-frame steps (phase 1, eager): SDPA over gathered visible slots (``SdpaBackend``) or
  FlashInfer's paged prefill (``fa2``/``fa3``);
* one-frame steps (phase 2, captured in a CUDA graph): ``sdpa`` + ``split`` = cuDNN fused attention
  over the contiguous, fixed-length patch prefix unmasked plus a short masked tail (the spare page
  and the specials), merged by log-sum-exp (``SplitPrefixBackend``); ``sdpa`` + ``cudnn`` = cuDNN
  over the whole fixed-size page storage with a visibility mask (``MaskedDenseBackend``);
  ``sdpa`` + ``flash`` = gather into fixed buffers + varlen flash (``StaticSdpaBackend``);
  ``flashinfer`` = FlashInfer's CUDA-graph wrapper (fa3 over exact token pages on Hopper).

Every decision that depends on the GPU reads its compute capability through ``capability``: a stand-in
(e.g. ``(8, 7)`` for an Orin) resolves what that GPU would get, so the resolution of GPUs we do not
have is pinned by tests and the portable path can be forced on a Hopper card to be measured.
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
    cuda_graphs: bool = False  # one-frame steps replayed as CUDA graphs (the image encoder a graph of its own)
    compile_blocks: bool = False  # torch.compile-fused block bodies and depth head inside the graph step
    autocast: bool = True  # official mixed precision (False: pure dtype, opt-in)
    prefix_kernel: str = "sdpa"  # split kernel: sdpa = cuDNN prefix + masked tail | triton | gluon = our runs kernel
    step_kernels: str = "torch"  # graph step's small kernels (camera decode, K/V write, q/k-norm+RoPE): torch|triton
    reasons: tuple[str, ...] = field(default=())  # one line per decision, for logs and diagnostics

    @property
    def attention(self) -> str:
        """The one-frame attention path in words, e.g. ``sdpa:cudnn+graph+compiled``."""
        kernel = self.flashinfer_kernel if self.backend == "flashinfer" else self.sdpa_kernel
        mode = "+graph" if self.cuda_graphs else "+eager"
        split = kernel == "split" and self.cuda_graphs
        prefix = "+cudnnprefix" if split and self.prefix_kernel == "sdpa" else ""
        step = "+torchstep" if self.cuda_graphs and self.step_kernels == "torch" else ""
        return f"{self.backend}:{kernel}{mode}{'+compiled' if self.compile_blocks else ''}{prefix}{step}"

    @property
    def depth_beside_camera(self) -> bool:
        """The depth head on a second stream beside the camera head: the graph step has that stream."""
        return self.cuda_graphs

    @property
    def depth_channels_last(self) -> bool:
        """The depth head's convolution weights channels-last, as its feature maps, on CUDA (cuDNN converted
        NCHW filters on every call); the CPU keeps NCHW, where parity with the official code is checked."""
        return self.device.type == "cuda"

    def summary(self) -> str:
        return f"{self.attention}, {str(self.dtype).replace('torch.', '')} on {self.device}: " + "; ".join(self.reasons)


Capability = tuple[int, int]  # (major, minor), e.g. (9, 0) for Hopper, (8, 7) for Orin, (11, 0) for Thor


def device_capability(device: torch.device, capability: Capability | None = None) -> Capability | None:
    """The compute capability that decides for ``device``: ``capability`` when given (a stand-in), the
    GPU's own on CUDA, None off CUDA."""
    if capability is not None:
        return tuple(capability)  # type: ignore[return-value]
    if device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def concrete_device(device: torch.device | str) -> torch.device:
    """``device`` written as a tensor on it reports it: ``cuda`` becomes the current CUDA device
    (``cuda:0``), ``cpu:0`` becomes ``cpu``.

    Why: torch compares devices as written, so ``torch.device("cuda") != torch.device("cuda:0")``, while
    every CUDA tensor reports the indexed form (and every CPU tensor the plain one). An object that checks
    a tensor's device against its own (the shared page pool's storage) must hold the form tensors report."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():  # else: a stand-in's name
        return torch.device("cuda", torch.cuda.current_device())
    if device.type == "cpu" and device.index is not None:
        return torch.device("cpu")
    return device


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return concrete_device(device)


def resolve_dtype(name: str, device: torch.device, capability: Capability | None = None) -> torch.dtype:
    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        # The official recipe: bf16 on compute capability >= 8, fp16 below.
        major = device_capability(device, capability)[0]
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


def cudnn_attention_unusable_reason(device: torch.device, dtype: torch.dtype,
                                    capability: Capability | None = None) -> str:
    """Why the masked cuDNN one-frame path cannot run ("" when it can)."""
    if device.type != "cuda":
        return f"device is {device.type}"
    if dtype not in (torch.bfloat16, torch.float16):
        return "cuDNN attention needs float16 or bfloat16"
    if not torch.backends.cudnn.is_available():
        return "cuDNN is not available"
    if device_capability(device, capability)[0] < 8:
        return "cuDNN fused attention needs compute capability >= 8"
    return ""


def resolve_backend(name: str, device: torch.device, dtype: torch.dtype,
                    capability: Capability | None = None) -> tuple[str, str]:
    """``auto``: on Hopper (where it was measured) SDPA with the ``split`` one-frame kernel — cuDNN over
    the contiguous patch prefix + a masked tail (docs/performance.md, attention per layer: faster than
    FlashInfer fa3 over token pages); elsewhere FlashInfer where it runs, else SDPA."""
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
        not cudnn_attention_unusable_reason(device, dtype, capability)
        and device_capability(device, capability)[0] in AUTO_SPLIT_ON_CAPABILITY
    ):
        return "sdpa", "auto: cuDNN over the contiguous patch prefix + masked tail (fastest measured on Hopper)"
    if reason:
        return "sdpa", f"auto: {reason}"
    return "flashinfer", "auto: CUDA with a half-precision dtype and flashinfer importable"


# Set by measurement (docs/performance.md, attention per layer): the compute capabilities
# (major) on which ``auto`` picks SDPA's split kernel over FlashInfer (measured on an H200 only), and
# which one-frame SDPA kernel ``auto`` means where cuDNN runs.
AUTO_SPLIT_ON_CAPABILITY = (9,)
AUTO_SDPA_KERNEL = "split"


def triton_installed() -> bool:
    """Whether Triton can be imported (every kernel of ours and ``torch.compile`` need it); asked each
    time, so that a test can hide it."""
    return importlib.util.find_spec("triton") is not None


def triton_prefix_unusable_reason(device: torch.device, capability: Capability | None = None) -> str:
    """Why the split backend's Triton prefix kernel cannot run ("" when it can): it needs Triton and
    TMA (CUDA, compute capability >= 9)."""
    if not triton_installed():
        return "triton is not installed"
    if device.type != "cuda":
        return "it runs on CUDA"
    if device_capability(device, capability)[0] < 9:
        return "it needs TMA (compute capability >= 9)"
    return ""


def gluon_runs_unusable_reason(device: torch.device, capability: Capability | None = None) -> str:
    """Why the Gluon version of the runs kernel cannot run ("" when it can): on top of the Triton
    kernel's needs, Gluon (Triton >= 3.5) and Hopper's wgmma (compute capability 9 exactly)."""
    reason = triton_prefix_unusable_reason(device, capability)
    if reason:
        return reason
    if importlib.util.find_spec("triton.experimental.gluon") is None:
        return "this Triton has no Gluon"
    if device_capability(device, capability)[0] != 9:
        return "it needs Hopper's wgmma (compute capability 9)"
    return ""


PREFIX_KERNELS = ("auto", "sdpa", "triton", "gluon")


def resolve_prefix_kernel(name: str, device: torch.device, capability: Capability | None = None) -> tuple[str, str]:
    """The split backend's kernel and why. ``auto``: our kernel over the visible runs in Gluon on Hopper
    (faster than the Triton version, which is faster than cuDNN's prefix: docs/performance.md, attention
    per layer), else in Triton where Triton and TMA run, else cuDNN's unmasked prefix + masked tail
    (``sdpa``)."""
    if name not in PREFIX_KERNELS:
        raise ValueError(f"prefix_kernel must be one of {PREFIX_KERNELS} (got {name!r})")
    reason = (gluon_runs_unusable_reason(device, capability) if name == "gluon"
              else triton_prefix_unusable_reason(device, capability))
    if name in ("triton", "gluon"):
        if reason:
            raise ValueError(f"prefix_kernel {name!r} cannot run: {reason}")
        return name, "requested"
    if name == "sdpa":
        return "sdpa", "requested"
    if reason:
        return "sdpa", f"auto: cuDNN, the Triton kernel cannot run ({reason})"
    gluon_reason = gluon_runs_unusable_reason(device, capability)
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
    reason = "triton is not installed" if not triton_installed() else (
        "" if device.type == "cuda" else "it runs on CUDA")
    if name == "triton" and reason:
        raise ValueError(f"step_kernels 'triton' cannot run: {reason}")
    if name == "torch":
        return "torch", "requested"
    if reason:
        return "torch", f"auto: {reason}"
    return "triton", ("auto: ours in Triton (the camera decode: 16 heads x 11 parts instead of SDPA's 16 thread "
                      "blocks; the K/V write: one kernel instead of a stack and a scatter)")


def resolve_flashinfer_kernel(name: str, device: torch.device, capability: Capability | None = None) -> str:
    """``auto``: fa3 on Hopper (compute capability 9.x, where FlashInfer has it), fa2 elsewhere.

    fa3 is used over exact one-token pages, so it attends exactly the visible keys (unlike the
    official fa3 mode, which pads pages with zero slots).
    """
    if name not in FLASHINFER_KERNELS:
        raise ValueError(f"flashinfer kernel must be auto, fa2 or fa3 (got {name!r})")
    if name != "auto":
        return name
    if device.type == "cuda" and device_capability(device, capability)[0] == 9:
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
    prefix_kernel: str = "auto",
    step_kernels: str = "auto",
    capability: Capability | None = None,
) -> ResolvedRuntime:
    """The one function that decides, for a concrete device and dtype. Raises ``ValueError`` (with
    the reason) for a combination that cannot run. ``capability``: a stand-in compute capability (the
    resolution another GPU would get); ``prefix_kernel`` / ``step_kernels``: a kernel other than the
    capability's choice (the benchmark and the tests ask for them; no user setting does)."""
    device = concrete_device(device)
    if capability is not None and device.type != "cuda":
        raise ValueError("a stand-in compute capability needs a CUDA device")
    reasons: list[str] = []
    cap = device_capability(device, capability)
    if capability is not None:
        reasons.append(f"resolved for compute capability {cap[0]}.{cap[1]} (a stand-in for this GPU's)")
    chosen, backend_reason = resolve_backend(backend, device, dtype, capability)
    reasons.append(f"backend {chosen}: {backend_reason}")
    graphs = bool(cuda_graphs) and device.type == "cuda" and dtype != torch.float32
    if cuda_graphs and not graphs:
        reasons.append("CUDA graphs off: they need CUDA and a half-precision dtype")
    elif graphs:
        reasons.append("CUDA graphs on: the image encoder a graph of its own, queued before the host plans the "
                       "step; the depth head beside the camera head on a second stream")
    else:
        reasons.append("CUDA graphs off (requested)")
    fi_kernel = resolve_flashinfer_kernel(flashinfer_kernel, device, capability)
    if chosen == "flashinfer":
        fi_why = ("requested" if flashinfer_kernel != "auto"
                  else "auto: fa3 on Hopper" if fi_kernel == "fa3" else "auto: fa2 off Hopper")
        reasons.append(f"FlashInfer {fi_kernel} ({fi_why})")
    if sdpa_kernel not in SDPA_KERNELS:
        raise ValueError(f"sdpa_kernel must be one of {SDPA_KERNELS} (got {sdpa_kernel!r})")
    cudnn_reason = cudnn_attention_unusable_reason(device, dtype, capability)
    if sdpa_kernel == "cudnn" and cudnn_reason:
        raise ValueError(f"sdpa_kernel 'cudnn' cannot run: {cudnn_reason}")
    if sdpa_kernel == "split" and cudnn_reason:
        raise ValueError(f"sdpa_kernel 'split' cannot run: {cudnn_reason}")
    sk = sdpa_kernel if sdpa_kernel != "auto" else ("flash" if cudnn_reason else AUTO_SDPA_KERNEL)
    if chosen == "sdpa" and graphs:
        sk_why = "requested" if sdpa_kernel != "auto" else cudnn_reason or "auto"
        reasons.append(f"one-frame SDPA kernel {sk} ({sk_why})")
    prefix, prefix_why = resolve_prefix_kernel(prefix_kernel, device, capability)
    if chosen == "sdpa" and graphs and sk == "split":
        reasons.append(f"split prefix kernel {prefix} ({prefix_why}); key ranges per frame size: the fewest "
                       "waves of thread blocks on the SMs")
    else:
        prefix = "sdpa"  # only the split backend has a prefix
    switch = _switch(compile_blocks, "compile_blocks")
    compile_reason = ""
    if not graphs:
        compile_reason = "the fused blocks run inside the CUDA-graph step, which is off"
    elif not triton_installed():
        compile_reason = "triton is not installed"
    if switch == "on" and compile_reason:
        raise ValueError(f"compile_blocks 'on' cannot run: {compile_reason}")
    fused = switch == "on" or (switch == "auto" and not compile_reason)
    fusion_why = f": {compile_reason}" if compile_reason and switch != "off" else ""
    reasons.append(f"block fusion {'on' if fused else 'off'} ({switch}{fusion_why})"
                   + (", the depth head's upsamplings and elementwise work fused with it" if fused else ""))
    if not autocast:
        reasons.append("autocast off: pure low-precision aggregator (opt-in, moves poses)")
    if device.type == "cuda":
        reasons.append("depth head weights channels-last, as its feature maps (no filter conversion per call)")
    step, step_why = resolve_step_kernels(step_kernels, device, graphs)
    if graphs:
        reasons.append(f"graph step's small kernels: {step} ({step_why})")
    return ResolvedRuntime(
        device=device, dtype=dtype, backend=chosen, backend_reason=backend_reason, flashinfer_kernel=fi_kernel,
        sdpa_kernel=sk, cuda_graphs=graphs, compile_blocks=fused, autocast=bool(autocast), prefix_kernel=prefix,
        step_kernels=step, reasons=tuple(reasons),
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
    "gluon_runs_unusable_reason", "PREFIX_KERNELS", "Capability", "device_capability",
]
