"""The GPU's SM clock, power draw and clock-limit reasons while a benchmark phase runs (``nvidia-smi``).

Why: a card at its power limit lowers its clock. A batched step of several cameras keeps the card busier
than one camera's step (twice the attention back to back, no idle between frames), so it can run at a
lower clock than the one-stream step it is compared with. A ratio of the two step times is then partly
the card's power budget, not the code: the benchmark prints each phase's clock beside its time so that
the ratio can be read for what it is (docs/performance.md, "Several streams").

Sampled by ``nvidia-smi --loop-ms`` in a child process (the driver's own tool, there wherever the GPU
is; no Python binding needed), stopped by its PID when the sampler closes. Each sample carries the
tool's own timestamp, so a phase is cut by wall time however the pipe buffers the lines.
"""
from __future__ import annotations

import datetime
import shutil
import statistics
import subprocess
import threading
from dataclasses import dataclass
from typing import Optional

QUERY = "timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active"
# nvidia-smi's clock-limit reasons (``clocks_throttle_reasons.active``), the bits a benchmark can meet
REASONS = {0x1: "idle", 0x2: "application clocks", 0x4: "power cap", 0x8: "hardware slowdown",
           0x20: "thermal (software)", 0x40: "thermal (hardware)", 0x80: "power brake"}
TIME_FORMAT = "%Y/%m/%d %H:%M:%S.%f"


@dataclass(frozen=True)
class ClockSample:
    time: float  # seconds since the epoch (the sample's own timestamp, the host's local time zone)
    sm_mhz: float
    power_w: float
    reasons: int  # bit mask, ``REASONS``


@dataclass(frozen=True)
class ClockWindow:
    """Medians over the samples of one phase and every limit reason seen in it."""

    samples: int
    sm_mhz: float
    power_w: float
    reasons: int

    def reason_names(self) -> str:
        return describe_reasons(self.reasons)


def describe_reasons(mask: int) -> str:
    """``0x4`` -> ``power cap``; several joined by ``+``; ``none`` for 0."""
    names = [name for bit, name in REASONS.items() if mask & bit]
    unknown = mask & ~sum(REASONS)
    if unknown:
        names.append(hex(unknown))
    return "+".join(names) or "none"


def parse_sample(line: str) -> Optional[ClockSample]:
    """One line of ``--query-gpu=QUERY --format=csv,noheader,nounits``; None for a line that is not one
    (a header, an error, ``[N/A]`` or ``[Not Supported]`` in a field)."""
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != 4:
        return None
    try:
        when = datetime.datetime.strptime(fields[0], TIME_FORMAT).timestamp()
        return ClockSample(when, float(fields[1]), float(fields[2]), int(fields[3], 16))
    except ValueError:
        return None


def window(samples: list[ClockSample], start: float, end: float) -> Optional[ClockWindow]:
    """The samples taken in ``[start, end]`` (seconds since the epoch); None when there are none."""
    inside = [s for s in samples if start <= s.time <= end]
    if not inside:
        return None
    reasons = 0
    for s in inside:
        reasons |= s.reasons
    return ClockWindow(len(inside), statistics.median(s.sm_mhz for s in inside),
                       statistics.median(s.power_w for s in inside), reasons)


class ClockSampler:
    """``with ClockSampler(gpu) as clocks: ...; clocks.between(t0, t1)``. ``gpu``: what ``nvidia-smi -i``
    takes (an index or the device's UUID, ``device_id``); None (a CPU run, ``of``), or no ``nvidia-smi``
    on the host: it samples nothing and ``between`` gives None."""

    def __init__(self, gpu: Optional[str], period_ms: int = 100, executable: str = "nvidia-smi") -> None:
        self.gpu = gpu
        self.period_ms = period_ms
        self.executable = shutil.which(executable) if gpu is not None else None
        self.samples: list[ClockSample] = []
        self._proc: Optional[subprocess.Popen] = None
        self._reader: Optional[threading.Thread] = None

    @classmethod
    def of(cls, device) -> "ClockSampler":
        """The sampler of a torch device (one that samples nothing for a CPU)."""
        import torch

        return cls(device_id(device) if torch.device(device).type == "cuda" else None)

    def __enter__(self) -> "ClockSampler":
        if self.executable is not None and self.gpu is not None:
            self._proc = subprocess.Popen(
                [self.executable, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                 f"--loop-ms={self.period_ms}", "-i", self.gpu],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._reader = threading.Thread(target=self._read, name="clock-sampler", daemon=True)
            self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            sample = parse_sample(line)
            if sample is not None:
                self.samples.append(sample)

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def between(self, start: float, end: float) -> Optional[ClockWindow]:
        return window(list(self.samples), start, end)


def device_id(device) -> str:
    """``nvidia-smi -i``'s name of a torch CUDA device: its UUID (the index can differ under
    ``CUDA_VISIBLE_DEVICES``), else its index."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid:
        text = str(uuid)
        return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"
    return str(torch.device(device).index or 0)


__all__ = ["ClockSample", "ClockSampler", "ClockWindow", "describe_reasons", "device_id", "parse_sample", "window"]
