"""What an upload reads from a run or artifact folder, and the error it raises.

Files are opened without following a symbolic link, and only when they are regular files;
append-only files (metrics, logs, images) are read a batch of complete lines at a time. The
HTTP client (:mod:`ember.track.client`) and the upload of a run's images
(:mod:`ember.track.images`, which the client calls) both read through here, so neither imports
the other for it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ember.errors import TrackingError
from ember.track._fs import file_kind

__all__ = ["BATCH_BYTES", "UploadError", "lines_from", "no_follow", "read_from"]

BATCH_BYTES = 4 << 20
"""Bytes of an append-only file read for one request at most."""


class UploadError(TrackingError):
    """The server refused an upload or could not be reached (the local copy is untouched)."""


def no_follow(path: str, flags: int) -> int:
    """An ``open`` opener for the files of a run or artifact folder: a symbolic link is refused
    (in case one appears after the check), and so is a pipe or a device, without waiting on it."""
    fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UploadError(f"{path} is {file_kind(mode)}, not a regular file: nothing of it is sent")
    return fd


def read_from(path: Path, offset: int, size: int = BATCH_BYTES) -> bytes:
    """Up to ``size`` bytes of an append-only file from ``offset`` (nothing when missing)."""
    try:
        with open(path, "rb", opener=no_follow) as f:
            f.seek(offset)
            return f.read(size)
    except FileNotFoundError:
        return b""


def lines_from(path: Path, offset: int, max_lines: int) -> tuple[list[bytes], int]:
    """Complete lines of an append-only file from ``offset`` (one batch at most: ``max_lines``,
    :data:`BATCH_BYTES`), and their end.

    A last line without its newline is still being written (or was torn by a crash and will be
    cut when the run resumes): it is left for a later upload.
    """
    data = read_from(path, offset)
    lines = data[: data.rfind(b"\n") + 1].split(b"\n")[:-1][:max_lines]
    return lines, offset + sum(len(line) + 1 for line in lines)
