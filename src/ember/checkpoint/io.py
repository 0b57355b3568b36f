"""Checkpoint files on disk: atomic writes, the ``last_checkpoint`` pointer, listing, reading.

A checkpoint is written to a temporary name in the same directory, flushed and fsynced, then
renamed over its final name with :func:`os.replace`; the pointer file is updated the same way
afterwards. A crash at any instant therefore leaves either the old or the new file, never a
half-written one under a name that :func:`find_checkpoints` returns.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import shutil
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ember.errors import CheckpointError

POINTER = "last_checkpoint"
BEST_POINTER = "best_checkpoint"
SUFFIX = ".ckpt"
_NAME = re.compile(r"^(?P<prefix>[A-Za-z0-9_.-]*?)-?e(?P<epoch>\d+)-s(?P<step>\d+)" + re.escape(SUFFIX) + "$")


def checkpoint_name(epoch: int, step: int, prefix: str = "ckpt") -> str:
    """The file name of the checkpoint taken at ``epoch`` / ``step`` (sorts by step)."""
    return f"{prefix}-e{epoch:04d}-s{step:09d}{SUFFIX}"


def _fsync_dir(directory: Path) -> None:
    # Make the rename itself durable (POSIX); directories cannot be opened on Windows.
    if os.name == "posix":
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path next to ``path`` to write; on success it becomes ``path`` atomically.

    The temporary name starts with a dot (``.NAME.tmp-PID-THREAD``) so that listings ignore it.
    When the block ends the file is fsynced, renamed over ``path`` with :func:`os.replace`, and
    the directory is fsynced so that the rename survives a power loss. If the block raises, the
    temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def save_file(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` with ``torch.save`` to a temporary file, then rename it to ``path`` atomically.

    The cost over a plain ``torch.save`` is the flush to disk (fsync), which makes the file
    survive a power loss. Starting that flush early, from a thread calling Linux's
    ``sync_file_range`` while ``torch.save`` was still writing, was tried and dropped: the
    typical save got faster, but some took 2–4× longer, and on average it lost (docs/performance.md).
    """
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)  # a path, not a file object: torch's C++ writer is the fast one


def load_file(
    path: str | os.PathLike[str], map_location: Any = "cpu", weights_only: bool = True, mmap: bool = False
) -> Any:
    """Read a checkpoint file, with an ember error naming it when it is missing or damaged.

    Args:
        path: the file.
        map_location: where tensors go (``"cpu"`` by default).
        weights_only: refuse pickled code objects (torch's safe loader). ember's own checkpoints
            need nothing else; pass False only for a file you trust that holds custom objects.
        mmap: map the file instead of reading it: tensors are read only when touched.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    try:
        return torch.load(path, map_location=map_location, weights_only=weights_only, mmap=mmap)
    except pickle.UnpicklingError as exc:
        if weights_only and "weights_only" in str(exc):
            why = next((line.strip() for line in str(exc).splitlines() if "Unsupported" in line), "")
            raise CheckpointError(
                f"checkpoint {str(path)!r} holds objects torch's safe loader refuses ({why or 'see torch.load'}); "
                "if you trust the file, load it with weights_only=False"
            ) from None
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {exc}") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is truncated or corrupt ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
            "use an earlier checkpoint"
        ) from None


def write_pointer(directory: str | os.PathLike[str], name: str, pointer: str = POINTER) -> None:
    """Point ``directory/<pointer>`` (``last_checkpoint``) at the checkpoint file ``name``, atomically."""
    atomic_write_bytes(Path(directory) / pointer, (name + "\n").encode())


def read_pointer(directory: str | os.PathLike[str], pointer: str = POINTER) -> str | None:
    """The file name ``directory/<pointer>`` names, or None when there is no such pointer."""
    pointer_file = Path(directory) / pointer
    if not pointer_file.is_file():
        return None
    return pointer_file.read_text().strip() or None


@dataclass(frozen=True, order=True)
class CheckpointFile:
    """A checkpoint found in a directory: a file, or a sharded checkpoint's directory."""

    step: int
    epoch: int
    path: Path


def find_checkpoints(directory: str | os.PathLike[str]) -> list[CheckpointFile]:
    """The checkpoints in ``directory``, oldest (lowest step) first: complete files, and sharded
    checkpoints' directories (renamed into place only when complete).

    Temporary files and directories of an interrupted write never match: they start with a dot.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        m = _NAME.match(entry.name)
        if m and (entry.is_file() or entry.is_dir()):
            found.append(CheckpointFile(int(m["step"]), int(m["epoch"]), entry))
    return sorted(found)


def remove_stale_temporaries(directory: str | os.PathLike[str]) -> None:
    """Delete temporary files (and sharded checkpoints' directories) left by writes that a crash interrupted."""
    directory = Path(directory)
    if directory.is_dir():
        for entry in directory.glob(".*.tmp-*"):
            remove_checkpoint(entry)


def remove_checkpoint(path: str | os.PathLike[str]) -> None:
    """Delete a checkpoint file, or a sharded checkpoint's directory; nothing if it is gone."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=False)
    else:
        path.unlink(missing_ok=True)


class AsyncWriter:
    """Writes checkpoints in a background thread; the next write waits for the previous one.

    The caller hands over a state already copied to CPU memory, so training may change its
    tensors while the file is being written.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, obj: Any, path: str | os.PathLike[str], then: Any = None) -> None:
        """Write ``obj`` to ``path`` in the background, then call ``then()`` (if given)."""
        self.wait()

        def work() -> None:
            try:
                save_file(obj, path)
                if then is not None:
                    then()
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread by wait()
                self._error = exc

        self._thread = threading.Thread(target=work, name="ember-checkpoint-writer", daemon=False)
        self._thread.start()

    def wait(self) -> None:
        """Block until the pending write (if any) finished; re-raise its error here."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"a background checkpoint write failed: {error}") from error
