"""The on-disk format of a saved session (docs/sessions.md): one folder, a JSON manifest and safetensors.

For a feed-forward streaming model the KV cache is the map: the scale frames, the window of
keyframes and the special tokens of every frame seen. A saved session is that cache plus the state
that makes the next frame continue exactly (page table, RoPE/frame counters, the long-run policy's
Sim(3) chain and overlap frames) and whatever the caller adds (``extra``: the node's trajectory,
world frame, metric scale state). Layout::

    <session>/manifest.json            format + version, identity, states, per-file size + CRC-32
    <session>/global_000.safetensors   block 0 of the global cache: its pages in use + special stream
    ...
    <session>/camera.safetensors       the camera-head cache's stored frames
    <session>/policy.safetensors       the long-run policy's tensors (the window's overlap frames)

Only pages in use are written, never the preallocated pools; tensors are written from host copies,
so a folder saved on a GPU loads on a CPU and the reverse.

Saving and loading are each cut in two, so that the stream pauses only for a copy in device memory
where the device has room for one (``SessionManager`` decides, it owns the memory budget): a save
is ``capture`` (between two frames: the session copied on the device, milliseconds, or to the
host) then ``SessionCapture.write`` (any thread: off the device on a copy stream of its own, to
disk); a load is ``read_session`` (any thread: checked, read, staged on the device) then the
manager's commit (between two frames: a copy inside device memory). The files are written here
rather than by ``safetensors.torch.save``, which holds the interpreter lock for the whole
serialisation (1.5 s per GB measured: the inference thread would stop with it); the layout is
safetensors' own (an 8-byte header length, the JSON header, the raw tensors), read back with
``safetensors.torch.load_file``, and the CRC-32 is taken while the bytes go out. The folder is written as a whole
(``files.atomic_directory``): a reader sees the previous session or the complete new one. Every file
carries its size and CRC-32 in the manifest, so a truncated or damaged file is refused before
anything is loaded. This module knows the format only; what goes in it is each class's own
``state_dict`` (``SessionManager.save`` / ``load`` put it together).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Optional

import torch

from .files import atomic_directory, atomic_open, atomic_write_text, recover_directory
from .settings import SESSION_FIELDS

FORMAT = "lingbot_map_session"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SUFFIX = ".safetensors"
_READ_CHUNK = 1 << 24  # 16 MiB per read while checking a file's CRC (and per write)
_SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
                       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                       torch.uint8: "U8", torch.bool: "BOOL"}


class SessionFileError(ValueError):
    """A path that cannot be loaded as a session (or written as one); the message says why."""


@dataclass(frozen=True)
class SaveReport:
    """What a save wrote (``SessionCapture.write``, ``SessionManager.save``)."""

    path: str
    frames: int  # frames handed out in the saved world frame (the next frame's index)
    stored: int  # frames stored in the KV cache of the current window
    bytes: int
    seconds: float
    capture_seconds: float = 0.0  # of which the copy between two frames (the stream's pause)

    def message(self) -> str:
        return (f"saved session to {self.path}: {self.frames} frames ({self.stored} stored in the cache), "
                f"{self.bytes / 2**20:.1f} MiB in {self.seconds:.2f} s (the stream paused "
                f"{self.capture_seconds:.2f} s)")


@dataclass
class SessionCapture:
    """A session's memory at one instant (``SessionManager.capture``): what a save writes.

    The tensors are copies, on the host or (``ready`` set) on the device: then ``write`` waits for
    the event recorded after the copies and moves one file's tensors at a time to the host on a
    stream of its own, so the frames that run meanwhile are not queued behind it, and each file's
    device copy is released once it is on disk. A capture is written once."""

    manifest: dict
    groups: Optional[list[tuple[str, dict[str, torch.Tensor]]]]  # one safetensors file each; None once written
    frames: int
    stored: int
    capture_seconds: float  # the copy: the only part that has to pause the stream
    ready: Optional[torch.cuda.Event] = None  # recorded after the copies on the device (None: host copies)
    device: Optional[torch.device] = None  # where the copies are

    def write(self, path: str) -> SaveReport:
        """Write it to the folder ``path`` atomically (any thread); ``SessionFileError`` with the reason."""
        if self.groups is None:
            raise SessionFileError("this capture was written already: capture the session again")
        start = time.perf_counter()
        groups, self.groups = self.groups, None
        copy_stream = None
        if self.ready is not None:
            copy_stream = torch.cuda.Stream(self.device)
            copy_stream.wait_event(self.ready)

        def to_host(index: int) -> dict[str, torch.Tensor]:
            tensors = groups[index][1]
            groups[index] = (groups[index][0], {})  # the device copy goes once this file is written
            if copy_stream is None:
                return tensors
            with torch.cuda.stream(copy_stream):
                return {k: v.to("cpu") for k, v in tensors.items()}  # waits for this copy only

        files = [(name, lambda i=i: to_host(i)) for i, (name, _) in enumerate(groups)]
        size = write_session(path, self.manifest, files)
        return SaveReport(str(path), self.frames, self.stored, size,
                          self.capture_seconds + time.perf_counter() - start, self.capture_seconds)


def write_tensors(f: BinaryIO, tensors: dict[str, torch.Tensor]) -> tuple[int, int]:
    """``tensors`` (on the host) as one safetensors file into ``f``; returns (bytes, CRC-32).

    Header then each tensor's bytes, in slices of 16 MiB: file writes and CRC-32 both release the
    interpreter lock, so other threads run on while gigabytes go out."""
    header: dict[str, Any] = {}
    offset = 0
    names = sorted(tensors)
    for name in names:
        t = tensors[name]
        if t.dtype not in _SAFETENSORS_DTYPES:
            raise TypeError(f"tensor {name!r}: dtype {t.dtype} has no safetensors name")
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the tensors start 8-byte aligned
    first = len(head).to_bytes(8, "little") + head
    f.write(first)
    crc, size = zlib.crc32(first), len(first)
    for name in names:
        flat = tensors[name].contiguous().reshape(-1)
        raw = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)  # [bytes]
        data = memoryview(raw.numpy())
        for begin in range(0, len(data), _READ_CHUNK):
            chunk = data[begin:begin + _READ_CHUNK]
            f.write(chunk)
            crc = zlib.crc32(chunk, crc)
        size += len(data)
    return size, crc


def write_session(path: str | os.PathLike, manifest: dict, groups: Iterable[tuple[str, Callable[[], dict]]],
                  writer: Optional[Callable[..., Any]] = None) -> int:
    """Write ``manifest`` and one safetensors file per group (``groups``: name, and a function that
    returns that file's tensors, called one at a time so that only one file is in host memory).
    Returns the bytes written. Raises ``SessionFileError`` with the reason (disk full, read-only, ...);
    the previous folder at ``path`` is then left as it was. ``writer``: the file opener (tests)."""
    path = Path(path)
    writer = writer or atomic_open
    files: dict[str, dict] = {}
    try:
        with atomic_directory(path) as tmp:
            for name, make in groups:
                tensors = make()
                with writer(tmp / (name + SUFFIX), "wb") as f:
                    size, crc = write_tensors(f, tensors)
                files[name] = {"bytes": size, "crc32": crc}
                del tensors
            manifest = {**manifest, "format": FORMAT, "format_version": FORMAT_VERSION, "files": files}
            atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        raise SessionFileError(f"cannot write session {str(path)!r}: {exc.strerror or exc}") from None
    return sum(f["bytes"] for f in files.values()) + (path / MANIFEST).stat().st_size


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of the session at ``path``; ``SessionFileError`` when it is not one, is damaged,
    or was written by a newer format version."""
    path = Path(path)
    try:
        recover_directory(path)  # a save killed between its two renames
    except OSError:
        pass
    if not path.is_dir():
        raise SessionFileError(f"{str(path)!r} is not a session (no such folder)")
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SessionFileError(f"{str(path)!r} is not a session (no {MANIFEST})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SessionFileError(f"{str(path / MANIFEST)!r} is damaged: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SessionFileError(f"{str(path)!r} is not a session ({MANIFEST} is not a {FORMAT} manifest)")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise SessionFileError(f"{str(path)!r} has format version {version!r}; this package reads up to "
                               f"{FORMAT_VERSION} (a newer package wrote it)")
    for key in ("identity", "session", "policy", "files"):
        if key not in manifest:
            raise SessionFileError(f"{str(path / MANIFEST)!r} is damaged: no {key!r}")
    return manifest


def verify_files(path: str | os.PathLike, manifest: dict) -> None:
    """Every file of the manifest present, of its size and CRC-32; ``SessionFileError`` naming the first
    one that is not (read in chunks: nothing is kept in memory)."""
    for name, meta in manifest["files"].items():
        file = Path(path) / (name + SUFFIX)
        try:
            size = file.stat().st_size
            if size != meta["bytes"]:
                raise SessionFileError(f"session file {file.name} is truncated or damaged: {size} bytes, "
                                       f"the manifest says {meta['bytes']}")
            crc = 0
            with open(file, "rb") as f:
                while chunk := f.read(_READ_CHUNK):
                    crc = zlib.crc32(chunk, crc)
        except OSError as exc:
            raise SessionFileError(f"session file {file.name}: {exc.strerror or exc}") from None
        if crc != meta["crc32"]:
            raise SessionFileError(f"session file {file.name} is damaged (CRC-32 {crc:08x}, the manifest "
                                   f"says {meta['crc32']:08x})")


def read_group(path: str | os.PathLike, manifest: dict, name: str) -> dict[str, torch.Tensor]:
    """The tensors of one file, on the host (the caller moves them where they go); after ``verify_files``.

    The file is memory-mapped (``load_file``), not read into a bytes object and parsed: the pages
    ``verify_files`` just read are still in the page cache, and the copy into the pools reads them
    once (about 10× the rate of parsing a bytes object, 6.8 GB for the full model at 8 + 64 frames)."""
    from safetensors.torch import load_file

    meta = manifest["files"].get(name)
    if meta is None:
        raise SessionFileError(f"the session has no file {name + SUFFIX}")
    file = Path(path) / (name + SUFFIX)
    try:
        if file.stat().st_size != meta["bytes"]:  # its CRC was checked by verify_files: the size suffices here
            raise SessionFileError(f"session file {name + SUFFIX} changed while it was loaded")
        return load_file(str(file))
    except OSError as exc:
        raise SessionFileError(f"session file {file.name}: {exc.strerror or exc}") from None


@dataclass
class PreparedSession:
    """A saved session read and checked (``SessionManager.prepare_load``): what its commit copies in."""

    path: str
    manifest: dict
    groups: dict[str, dict[str, torch.Tensor]]  # file name -> its tensors
    staged_on: str  # "cuda:0" when the tensors were copied to the device, "host" (memory-mapped files)
    seconds: float  # reading, checking and staging


def read_session(path: str | os.PathLike, manifest: dict,
                 device: Optional[torch.device] = None) -> dict[str, dict[str, torch.Tensor]]:
    """Every file's tensors (after ``verify_files``), memory-mapped on the host, or with ``device``
    copied there on a stream of their own (frames running meanwhile are not queued behind the
    copies) and complete when this returns."""
    names = list(manifest["files"])
    if device is None or device.type != "cuda":
        return {name: read_group(path, manifest, name) for name in names}
    stream = torch.cuda.Stream(device)
    groups: dict[str, dict[str, torch.Tensor]] = {}
    with torch.cuda.stream(stream):
        for name in names:
            groups[name] = {k: v.to(device) for k, v in read_group(path, manifest, name).items()}
    stream.synchronize()
    return groups


# the StreamConfig fields a saved cache is bound to (keyframe_interval and the depth head are not)
SESSION_GEOMETRY = SESSION_FIELDS  # the settings table says which fields a session is bound to


def session_identity(weights: str, cfg: Any, stream: Any, dtype: torch.dtype) -> dict:
    """What a saved session is bound to: the weights (``weights_identity``), the model's shapes
    (``ModelConfig``), the cache geometry (the ``SESSION_GEOMETRY`` fields of ``StreamConfig``), the dtype;
    as it reads back from a manifest (tuples are lists)."""
    identity = {"weights": weights, "model": dataclasses.asdict(cfg),
                "geometry": {k: getattr(stream, k) for k in SESSION_GEOMETRY},
                "dtype": str(dtype).replace("torch.", "")}
    return json.loads(json.dumps(identity))


def checked_manifest(path: str, identity: dict, state_problems: Callable[[dict], list[str]]) -> dict:
    """The manifest at ``path`` once its identity equals ``identity`` and ``state_problems`` (the
    session's ``check_state``) finds nothing; else ``SessionFileError`` naming what differs."""
    manifest = read_manifest(path)
    kind, problems = fit_problems(manifest, identity, state_problems)
    if kind:
        what = "was made with other settings" if kind == "identity" else "does not fit this session"
        raise SessionFileError(f"session {path!r} {what}: " + "; ".join(problems))
    return manifest


def fit_problems(manifest: dict, identity: dict, state_problems: Callable[[dict], list[str]]) -> tuple[str, list[str]]:
    """What keeps a read manifest out of this session: ``("identity", fields that differ)``, else
    ``("state", reasons of state_problems)``, else ``("", [])``. The state is only checked once the
    identity holds (a state of another geometry says nothing useful). Checked when a load is
    prepared and again when it is committed: settings may change in between."""
    problems = identity_problems(manifest["identity"], identity)
    if problems:
        return "identity", problems
    problems = state_problems(manifest["session"])
    return ("state", problems) if problems else ("", [])


def identity_problems(saved: dict, current: dict) -> list[str]:
    """Each field of the identity (checkpoint, model shape, stream geometry, dtype) that differs."""
    problems: list[str] = []
    for section in sorted(set(saved) | set(current)):
        a, b = saved.get(section), current.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    problems.append(f"{section}.{key}: saved {a.get(key)!r}, this node {b.get(key)!r}")
        elif a != b:
            problems.append(f"{section}: saved {a!r}, this node {b!r}")
    return problems


_HASHES: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str) -> str:
    """SHA-256 of a checkpoint's content (hashed once per file version in this process)."""
    real = os.path.realpath(os.path.expanduser(path))
    st = os.stat(real)
    key = (real, st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        with open(real, "rb") as f:
            while chunk := f.read(_READ_CHUNK):
                h.update(chunk)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def weights_identity(checkpoint: str, preset: str, seed: int, random_weights: Optional[bool] = None) -> str:
    """What the weights are: ``sha256:<hex>`` of the checkpoint file, or ``random:<preset>:seed=<n>``."""
    if checkpoint and random_weights is not True:
        return "sha256:" + file_sha256(checkpoint)
    return f"random:{preset}:seed={seed}"


__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST", "SESSION_GEOMETRY", "PreparedSession", "SaveReport",
           "SessionCapture", "SessionFileError", "checked_manifest", "file_sha256", "fit_problems", "identity_problems",
           "read_group",
           "read_manifest", "read_session", "session_identity", "verify_files", "weights_identity", "write_session",
           "write_tensors"]
