"""Atomic file writes: a temporary file in the same folder, fsynced, renamed over the target.

The one way ember replaces a file: the run store's metadata and exports, artifacts' copies,
checkpoints and their pointer. A crash at any instant leaves either the old file or the new one
under the target's name, never a half-written one; once the call returns the new file and its
name survive a power loss (the file, then the folder, are fsynced). Temporary names start with a
dot, ``.NAME.tmp-PID-THREAD``, so that listings skip them and a cleaner can find them.

A low-level utility: it imports nothing of ember's, and callers turn its ``OSError`` into their
own error (a CheckpointError, a TrackingError) naming what they were writing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["TEMPORARY_GLOB", "atomic_open", "atomic_path", "atomic_write", "fsync_dir", "why_write_failed"]

TEMPORARY_GLOB = ".*.tmp-*"
"""What the names of the temporary files this module writes match (``Path.glob``)."""


_WHY: dict[int, str] = {
    errno.ENOSPC: "the disk is full: free space there, or write to another folder",
    errno.EDQUOT: "the disk quota is used up: free space there, or write to another folder",
    errno.EFBIG: "the file-size limit of this process (ulimit -f) is below the file's size: raise it",
    errno.EROFS: "the folder is on a read-only file system: write to a writable folder",
    errno.EACCES: "this process may not write there: write to a writable folder",
    errno.EPERM: "this process may not write there: write to a writable folder",
}


def why_write_failed(exc: OSError) -> str:
    """A failed write's reason and what to do, for the caller's error: "File too large (the
    file-size limit of this process (ulimit -f) ...: raise it)"; the bare reason when no fix is known."""
    reason = exc.strerror or str(exc)
    why = _WHY.get(exc.errno or 0)
    return f"{reason} ({why})" if why else reason


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make the entries of ``directory`` (a rename into it) durable; nothing on Windows (folders cannot be opened)."""
    if os.name == "posix":
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")


def _commit(tmp: Path, path: Path) -> None:
    """Rename the written and fsynced ``tmp`` over ``path``, then fsync the folder."""
    os.replace(tmp, path)
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path next to ``path`` for the block to write; on success it becomes ``path``.

    For writers that open the file themselves (``torch.save`` into a raw file, a folder's
    files copied in). When the block ends the file is fsynced, renamed over ``path`` with
    :func:`os.replace`, and the folder is fsynced. If the block raises, the temporary file is
    removed and ``path`` is untouched.

    Example:
        >>> with atomic_path("ckpt/model.pt") as tmp:
        ...     torch.save(state, tmp)
    """
    path = Path(path)
    tmp = _temporary(path)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        _commit(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a read-only folder may not let it be removed either
            tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """A file opened for writing (``open(tmp, mode, **kwargs)``) that becomes ``path`` when the block ends.

    As :func:`atomic_path`, for callers that write through one file object: on an error ``path``
    is left as it was.

    Example:
        >>> with atomic_open("runs.csv", "w", encoding="utf-8", newline="") as f:
        ...     f.write("name,loss\\n")
    """
    if not mode.startswith(("w", "x")):
        raise ValueError(f"atomic_open writes a new file: mode must start with 'w' or 'x', got {mode!r}")
    with atomic_path(path) as tmp, open(tmp, mode, **kwargs) as f:
        yield f


def atomic_write(path: str | os.PathLike[str], data: bytes | str, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``data`` (str is encoded with ``encoding``) atomically and durably.

    Example:
        >>> atomic_write("run.json", json.dumps(meta))
    """
    with atomic_open(path, "wb") as f:
        f.write(data.encode(encoding) if isinstance(data, str) else data)
