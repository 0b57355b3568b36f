"""One writing process per folder: an exclusive ``flock`` on the folder itself; whether a process lives.

Tracking runs (``ember.track``) and checkpoint folders (``ember.checkpoint.folder``) are locked
this way while a process writes them. No lock file: the lock is on the folder's own inode, which
lives as long as the folder. The operating system releases it when the process ends, however it
ends (``kill -9`` included), so a lock is never stale.

A low-level utility: it imports nothing of ember's but its errors; the caller says what to raise.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

from ember.errors import EmberError

__all__ = ["lock_folder", "pid_alive", "unlock_folder"]

_HELD = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES)


def lock_folder(folder: Path, refusal: Callable[[], EmberError], follow_links: bool = False) -> int | None:
    """Lock ``folder`` for this process's writing, without waiting; returns the descriptor that holds it.

    :func:`unlock_folder` releases it, and so does the end of the process. None where there are
    no ``flock`` locks (Windows, or a file system that refuses them, as some network mounts do):
    the folder is then written unlocked.

    Args:
        folder: the folder.
        refusal: builds the error to raise when another process holds the lock (it may read the
            folder to name that process).
        follow_links: lock the folder a link named ``folder`` points to; by default a link is
            refused (``O_NOFOLLOW``: a run folder of a store is never a link).

    Raises:
        EmberError: ``refusal()``, when another process (or another open of this process) holds it.

    Example:
        >>> fd = lock_folder(Path("ckpt"), lambda: CheckpointError("ckpt is in use"))
        >>> ...; unlock_folder(fd)
    """
    try:
        import fcntl
    except ImportError:  # Windows
        return None
    no_follow = 0 if follow_links else getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | no_follow)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno not in _HELD:
            return None  # no locks on this file system
        raise refusal() from None
    return fd


def unlock_folder(fd: int | None, release: bool = True) -> None:
    """Close a descriptor from :func:`lock_folder`; ``release=False`` in a forked child: the parent keeps the lock."""
    if fd is None:
        return
    if release:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists on this machine (a run's writer, a launcher's worker)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
