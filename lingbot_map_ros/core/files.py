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
import shutil
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


def _previous_name(path: Path) -> Path:
    """Where ``atomic_directory`` parks the old folder for the instant between its two renames."""
    return path.with_name(f".{path.name}.previous")


def recover_directory(path: PathLike) -> bool:
    """Undo an ``atomic_directory`` that was killed between its two renames: ``path`` is missing and
    the previous folder is parked next to it. Returns True when it put the previous folder back."""
    path = Path(path)
    parked = _previous_name(path)
    if path.exists() or not parked.is_dir():
        return False
    os.rename(parked, path)
    return True


def _remove_stale_temporaries(path: Path) -> None:
    """Temporary folders of writers that were killed (their pid is gone): removed before a new write."""
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        try:
            pid = int(tmp.name[len(path.name) + 2:].split(".")[0])
        except ValueError:
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass  # alive (another user's process, say): left alone


@contextlib.contextmanager
def atomic_directory(path: PathLike) -> Iterator[Path]:
    """``with atomic_directory(d) as tmp: write files into tmp``: the folder ``d`` is replaced by
    ``tmp``, complete, when the block ends without an exception; on any exception the temporary
    folder is removed and ``d`` is left as it was.

    A folder cannot be renamed over a non-empty one, so an existing ``d`` is first parked as
    ``.d.previous``, the new folder renamed to ``d``, then the parked one removed. A kill between
    those two renames leaves no ``d`` and the complete old folder parked: ``recover_directory``
    (called here first, and by readers) puts it back. The files inside are written with
    ``atomic_open`` too, so a kill during the writing leaves only a hidden ``.tmp`` folder, which the
    next write removes (its writer's pid is gone).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_directory(path)
    _remove_stale_temporaries(path)
    tmp = temporary_name(path)
    tmp.mkdir(mode=0o777)
    try:
        yield tmp
        parked = _previous_name(path)
        if parked.exists():
            shutil.rmtree(parked)
        if path.exists():
            os.rename(path, parked)
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            recover_directory(path)  # the second rename failed: the old folder goes back
        raise
    shutil.rmtree(_previous_name(path), ignore_errors=True)
    _fsync_folder(path.parent)


__all__ = ["atomic_directory", "atomic_open", "atomic_write_bytes", "atomic_write_text", "recover_directory",
           "temporary_name"]
