"""A checkpoint folder's housekeeping: one writing trainer at a time, damaged checkpoints set aside.

- :func:`lock` takes the folder for one writer. Two trainers saving into one folder would
  prune and repoint each other's checkpoints (retention counts every checkpoint in the folder),
  so the second is refused with an error naming the first's pid and host. The lock is an
  exclusive ``flock`` on the folder itself (:mod:`ember._lock`, as a tracking run's folder is
  locked): the operating system releases it when the holder ends, however it ends. Who holds it
  is written to the folder's ``.lock`` file while it holds it, for that message only.
- :func:`set_aside` renames a checkpoint that a resume found damaged to ``NAME.damaged`` in the
  same folder: kept for inspection, no longer a checkpoint (the name no longer ends in
  ``.ckpt``: listing, retention and resuming skip it), and no longer in the way of the save
  that will be written under its name once training gets back to its step.
"""

from __future__ import annotations

import datetime
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from ember import _lock
from ember._atomic import atomic_write
from ember.errors import CheckpointError

__all__ = ["DAMAGED_SUFFIX", "HOLDER_FILE", "FolderLock", "lock", "set_aside"]

HOLDER_FILE = ".lock"
"""The file of a locked checkpoint folder that names the process holding the lock."""

DAMAGED_SUFFIX = ".damaged"
"""What :func:`set_aside` appends to a damaged checkpoint's name."""

_HOLDER_BYTES = 4096


@dataclass
class FolderLock:
    """A checkpoint folder held by this process (:func:`lock`); :meth:`release` gives it back."""

    directory: Path
    fd: int | None
    """The descriptor holding the ``flock`` (None where the file system has no locks)."""

    def release(self) -> None:
        """Remove the holder file, then release the lock (once; later calls do nothing).

        In that order, so that a trainer that takes the folder next never loses its own holder
        file to this one. A holder that dies leaves its file, which the next holder replaces.
        """
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            (self.directory / HOLDER_FILE).unlink(missing_ok=True)
        finally:
            _lock.unlock_folder(fd)


def lock(directory: str | os.PathLike[str], who: str = "trainer") -> FolderLock:
    """Take the checkpoint folder ``directory`` (it must exist) for this process's writes.

    Args:
        directory: the checkpoint folder.
        who: what writes it, for the holder file and the refusal (``"CheckpointHook 'ckpt'"``).

    Returns:
        The lock; release it when the writing ends (the end of the process releases it too).

    Raises:
        CheckpointError: another process (or another trainer of this one) writes the folder:
            the message names its pid and host, or the folder cannot be opened.

    Example:
        >>> held = lock("ckpt")
        >>> ...
        >>> held.release()
    """
    directory = Path(directory)

    def refusal() -> CheckpointError:
        return CheckpointError(
            f"checkpoint folder {str(directory)!r} is being written by another trainer ({_holder(directory)}): "
            "two trainers in one folder would delete and repoint each other's checkpoints. Wait for it to end, "
            "stop it, or give this run a folder of its own"
        )

    try:
        fd = _lock.lock_folder(directory, refusal, follow_links=True)  # ckpt -> /mnt/big/ckpt is common
    except OSError as exc:
        raise CheckpointError(f"cannot lock the checkpoint folder {str(directory)!r}: {exc.strerror or exc}") from None
    held = FolderLock(directory, fd)
    if fd is not None:
        since = datetime.datetime.now().isoformat(sep=" ", timespec="seconds")
        try:
            atomic_write(directory / HOLDER_FILE, f"{who}, pid {os.getpid()} on host {socket.gethostname()}, "
                                                  f"since {since}\n")  # fmt: skip
        except OSError as exc:
            held.release()
            raise CheckpointError(
                f"cannot write {str(directory / HOLDER_FILE)!r} in the checkpoint folder: {exc.strerror or exc}"
            ) from None
    return held


def _holder(directory: Path) -> str:
    """Who the holder file says holds the lock (a regular file only, at most 4 KiB read)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(directory / HOLDER_FILE, flags)
    except OSError:
        return "its pid and host are not recorded"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "its pid and host are not recorded"
        text = os.read(fd, _HOLDER_BYTES).decode("utf-8", "replace").strip()
    except OSError:
        return "its pid and host are not recorded"
    finally:
        os.close(fd)
    return "".join(c if c.isprintable() else "?" for c in text)[:300] or "its pid and host are not recorded"


def set_aside(path: str | os.PathLike[str]) -> Path | None:
    """Rename the damaged checkpoint ``path`` (a file or a sharded checkpoint's directory) to ``NAME.damaged``.

    ``NAME.damaged-2``, ``-3``... when that name is taken. Returns the new path, or None when
    ``path`` is gone (another process removed it).

    Raises:
        CheckpointError: the rename failed (the folder is read-only...): the name stays blocked.

    Example:
        >>> set_aside("ckpt/ckpt-e0002-s000000009.ckpt")
        PosixPath('ckpt/ckpt-e0002-s000000009.ckpt.damaged')
    """
    path = Path(path)
    for n in range(1, 1000):
        target = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{'' if n == 1 else f'-{n}'}")
        if not os.path.lexists(target):
            break
    try:
        os.rename(path, target)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(
            f"cannot set the damaged checkpoint {str(path)!r} aside as {target.name!r}: {exc.strerror or exc}; "
            "move it out of the folder, or a save under its name will fail"
        ) from None
    return target
