"""Where the compiled kernels live, so that a robot compiles them once, not at every boot.

The CUDA-graph step compiles the fused blocks and the depth head with ``torch.compile`` (Inductor) and
JIT-compiles our Triton/Gluon kernels on their first call. Both keep what they built on disk: Inductor
under ``TORCHINDUCTOR_CACHE_DIR`` (PyTorch's default is ``/tmp/torchinductor_<user>``, which a reboot
empties on most systems), Triton under ``TRITON_CACHE_DIR`` (default ``~/.triton/cache``).

One environment variable, ``LINGBOT_MAP_CACHE_DIR``, moves both into one folder that survives reboots
(``$XDG_CACHE_HOME/lingbot_map``, else ``~/.cache/lingbot_map``, when it is unset). An environment
variable, not a ROS parameter: the compilers read it before any node exists, it applies to every tool
of the package alike (the node, ``lingbot_map_bench --warm-cache``), and a robot's launch or systemd
unit sets it once. A ``TORCHINDUCTOR_CACHE_DIR`` or ``TRITON_CACHE_DIR`` of the user's own wins.
"""
from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "LINGBOT_MAP_CACHE_DIR"


def cache_root() -> Path:
    """The package's kernel-cache folder: ``LINGBOT_MAP_CACHE_DIR``, else the user's cache folder."""
    explicit = os.environ.get(CACHE_ENV, "")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lingbot_map"


def use_kernel_cache() -> dict[str, str]:
    """Point Inductor and Triton at the package's folder (unless the user named theirs) and return the
    folders in use. Called before anything is compiled (``BlockFusion``, the benchmark)."""
    root = cache_root()
    folders = {"TORCHINDUCTOR_CACHE_DIR": root / "inductor", "TRITON_CACHE_DIR": root / "triton"}
    used = {}
    for name, folder in folders.items():
        if not os.environ.get(name):
            os.environ[name] = str(folder)
        used[name] = os.environ[name]
    return used


__all__ = ["CACHE_ENV", "cache_root", "use_kernel_cache"]
