"""Writing an output file atomically: a reader sees the old file or the whole new one, never half.

Every file the package writes for a user (TUM trajectories, ``.npz``/``.json`` results, PLY maps,
COLMAP text, figures) goes through ``atomic_open``: the data goes to a temporary file in the same
folder, is flushed and fsynced, and is renamed over the target (``os.replace``, atomic on POSIX).
A crash, a full disk or a SIGTERM in the middle leaves the previous file intact and no temporary
file behind.

Why not ``tempfile.mkstemp``: it creates the file with mode 0600 whatever the umask, so a map
written that way is unreadable to the other users a plain ``open`` would have let read it. The
temporary file here is created with ``os.open(..., 0o666)``, so the kernel applies the umask exactly
as for a normal ``open``; when the target exists already, its permission bits are kept (as an
``open(path, "w")`` over it would keep them).
"""
from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Iterator, Optional, Union

PathLike = Union[str, os.PathLike]
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_NAME_ATTEMPTS = 16  # random temporary names tried before giving up (a collision is already unlikely)


def temporary_name(path: Path) -> Path:
    """A hidden name next to ``path`` for its temporary file: same folder (so the rename stays on one
    file system), unique per process and attempt, ending in ``.tmp``."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _create_temporary(path: Path) -> tuple[int, Path]:
    """Create and open the temporary file (umask applied by the kernel); retry on a name clash."""
    for _ in range(_NAME_ATTEMPTS):
        tmp = temporary_name(path)
        try:
            return os.open(tmp, _CREATE_FLAGS, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a temporary file next to {path}")


def _existing_mode(path: Path) -> Optional[int]:
    try:
        st = path.stat()
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable; best effort (not every file system lets a folder be fsynced)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: PathLike, mode: str = "w", *, encoding: Optional[str] = None,
                parents: bool = False) -> Iterator[IO]:
    """``with atomic_open(path, "w") as f: f.write(...)``: ``path`` appears, complete, when the block
    ends without an exception; on any exception (``KeyboardInterrupt`` included) the temporary file
    is removed, ``path`` is left as it was and the exception goes on.

    ``mode`` is ``"w"`` (text; ``encoding`` default UTF-8) or ``"wb"``. ``parents`` creates missing
    folders first (the node's service paths); the tools check their output folders before any work
    and leave it False.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes a whole file: mode 'w' or 'wb', not {mode!r}")
    path = Path(path)
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    keep_mode = _existing_mode(path)
    fd, tmp = _create_temporary(path)
    try:
        if keep_mode is not None:
            os.fchmod(fd, keep_mode)
        binary = mode == "wb"
        with os.fdopen(fd, mode, encoding=None if binary else (encoding or "utf-8")) as f:
            fd = -1  # the file object owns the descriptor now
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(path.parent)


def atomic_write_bytes(path: PathLike, *chunks: bytes, parents: bool = False) -> None:
    """Write ``chunks`` one after the other as the whole content of ``path`` (see ``atomic_open``)."""
    with atomic_open(path, "wb", parents=parents) as f:
        for chunk in chunks:
            f.write(chunk)


def atomic_write_text(path: PathLike, text: str, *, encoding: str = "utf-8", parents: bool = False) -> None:
    """Write ``text`` as the whole content of ``path`` (see ``atomic_open``)."""
    with atomic_open(path, "w", encoding=encoding, parents=parents) as f:
        f.write(text)


__all__ = ["atomic_open", "atomic_write_bytes", "atomic_write_text", "temporary_name"]
