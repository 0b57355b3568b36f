"""Checkpoint files on disk: atomic writes, the ``last_checkpoint`` pointer, listing, reading.

A checkpoint is written to a temporary name in the same directory, flushed and fsynced, then
renamed over its final name with :func:`os.replace` (:mod:`ember._atomic`, the one atomic
write of ember); the pointer file is updated the same way afterwards. A crash at any instant
therefore leaves either the old or the new file, never a half-written one under a name that
:func:`find_checkpoints` returns.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import os
import pickle
import re
import shutil
import sys
import threading
import warnings
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import torch

from ember import _atomic
from ember._atomic import TEMPORARY_GLOB, atomic_write
from ember.errors import CheckpointError

POINTER = "last_checkpoint"
BEST_POINTER = "best_checkpoint"
SUFFIX = ".ckpt"
_NAME = re.compile(r"^(?P<prefix>[A-Za-z0-9_.-]*?)-?e(?P<epoch>\d+)-s(?P<step>\d+)" + re.escape(SUFFIX) + "$")


def checkpoint_name(epoch: int, step: int, prefix: str = "ckpt") -> str:
    """The file name of the checkpoint taken at ``epoch`` / ``step`` (sorts by step)."""
    return f"{prefix}-e{epoch:04d}-s{step:09d}{SUFFIX}"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """:func:`ember._atomic.atomic_path` (temporary file next to ``path``, fsync, rename, folder
    fsync), with a failed write raised as the CheckpointError that names the folder and the fix."""
    try:
        with _atomic.atomic_path(path) as tmp:
            yield tmp
    except BaseException as exc:
        cause = _os_error(exc)
        if cause is not None:
            raise write_error(path, cause) from exc
        raise


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc``: itself, or the one torch's writer hit (it raises "unexpected pos")."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def write_error(path: str | os.PathLike[str], cause: OSError) -> CheckpointError:
    """The CheckpointError for a write of ``path`` that failed with ``cause``: the folder, the reason, the fix."""
    folder = Path(path).parent
    return CheckpointError(
        f"cannot write checkpoint {str(path)!r} in folder {str(folder)!r}: {_atomic.why_write_failed(cause)}"
    )


def save_file(obj: Any, path: str | os.PathLike[str], skip_zip_crc: bool = False) -> None:
    """Write ``obj`` with ``torch.save`` to a temporary file, then rename it to ``path`` atomically.

    Durable and, on Linux, about as fast as a plain ``torch.save`` that stops at the page cache:
    the disk writes while torch serialises: every ~1 MB written, the write-back of that range is
    started without waiting (:class:`_WriteBehind`), so the fsync at the end finds little left
    to write. The file is a valid zip whose records carry their CRC-32s (``unzip -t`` passes).

    Args:
        obj: what to save (``torch.save``'s object).
        path: the file to write; its parent is created.
        skip_zip_crc: opt-in: write the zip records without CRC-32s. ``torch.load`` never checks
            them and computing them is a share of a save's time (docs/performance.md), but zip
            tools that test CRCs (``unzip -t``, Python's ``zipfile`` reading a member) then
            report every member as damaged. torch's option for it is process-wide: it is off
            only until this save's first write, under a lock that other saves wait on.

    Example:
        >>> save_file({"w": torch.ones(3)}, "ckpt/a.ckpt")
        >>> save_file(big_state, "ckpt/b.ckpt", skip_zip_crc=True)   # faster, fails unzip -t
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(path, exc) from None
    # A sharded checkpoint's directory of that name (saved by more processes) is replaced as a
    # whole once the file is complete: a rename cannot put a file over a directory.
    over_directory = target.is_dir() and not target.is_symlink()
    staged = target.with_name(f".{target.name}.tmp-file") if over_directory else target
    with atomic_path(staged) as tmp, open(tmp, "wb", buffering=0) as raw:
        writer = _WriteBehind(raw)
        with _zip_crc_until_first_write(writer, skip=skip_zip_crc):
            torch.save(obj, cast("IO[bytes]", writer))  # torch needs only write() and flush()
    if over_directory:
        try:
            replace_checkpoint(staged, target)
        except OSError as exc:
            raise write_error(path, exc) from None


_WRITE_BEHIND_BYTES = 1 << 20
"""Bytes written between two requests to start their write-back. Measured on a virtio disk:
1 MB saved ~100 MB in 32 ms; 256–512 kB cost more requests (37–45 ms); 4 MB and more made the
first saves of a process 3× slower (100–150 ms), for reasons the kernel did not show."""
_PAGE = 4096
_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start the write-back of dirty pages in the range, do not wait


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """Linux's ``sync_file_range`` (not in :mod:`os`), or None where the C library has none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


class _WriteBehind:
    """The file object ``torch.save`` writes a checkpoint through: it writes sequentially, and
    after every ~1 MB starts the write-back of the range just written.

    ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` queues the range's dirty pages for the disk and
    returns at once; the pages stay cached. Only ranges that are complete are flushed, once
    each, in order, so no page is written again while the disk holds it (a thread that flushed
    the whole file every few ms was tried before and some saves took 2–4× longer). Where the
    call does not exist or fails (another OS, a file system without it) the final fsync simply
    does all the work.
    """

    def __init__(self, raw: io.FileIO) -> None:
        self._raw = raw
        self._fd = raw.fileno()
        self._written = self._flushed = 0
        self._start_writeback = _sync_file_range()
        self.on_first_write: Callable[[], None] | None = None

    def write(self, data: bytes | memoryview) -> int:
        """Write all of ``data`` (torch ignores a short count, so this never returns one).

        A large tensor arrives as one call; it is written in ~1 MB slices so that its own
        write-back starts while the rest of it is still being copied.
        """
        if self.on_first_write is not None:
            self.on_first_write()
            self.on_first_write = None
        view = memoryview(data).cast("B")
        done, size = 0, len(view)
        while done < size:
            start, end = done, min(size, done + _WRITE_BEHIND_BYTES)
            while done < end:  # a raw write may be short
                done += self._raw.write(view[done:end]) or 0
            self._after_write(end - start)
        return done

    def _after_write(self, n: int) -> None:
        """Count ``n`` more bytes written; start the write-back of the unflushed range when it is large."""
        self._written += n
        if self._start_writeback is not None and self._written - self._flushed >= _WRITE_BEHIND_BYTES:
            end = self._written - self._written % _PAGE  # the last page is not complete yet
            if self._start_writeback(self._fd, self._flushed, end - self._flushed, _SYNC_FILE_RANGE_WRITE):
                self._start_writeback = None  # unsupported here: the final fsync writes everything
            self._flushed = end

    def flush(self) -> None:
        """Nothing is buffered here; durability comes from the fsync in :func:`atomic_path`."""


_CRC32_LOCK = threading.Lock()


@contextlib.contextmanager
def _zip_crc_until_first_write(writer: _WriteBehind, skip: bool) -> Iterator[None]:
    """Run ``torch.save`` into ``writer`` with CRC-32s, or without when ``skip``; torch's option is left as it was.

    The option is global, and torch reads it once, when it opens the zip writer, before the
    first write. A save that skips them switches it off only until ``writer``'s first write;
    every save holds a lock until then, so that a save with CRCs never opens its zip writer
    inside another's window, and two skipping saves cannot restore the option out of order. A
    ``torch.save`` outside ember that starts in that window of a few milliseconds also skips its
    CRCs, which ``torch.load`` does not check. Torch versions without the option keep their CRCs.
    """
    get = getattr(torch.serialization, "get_crc32_options", None)
    set_ = getattr(torch.serialization, "set_crc32_options", None)
    if get is None or set_ is None:
        yield
        return
    _CRC32_LOCK.acquire()  # released by restore(), at the first write, so saves overlap after it
    try:
        previous = get()
    except BaseException:
        _CRC32_LOCK.release()
        raise
    restored = False

    def restore() -> None:
        nonlocal restored
        if restored:
            return
        restored = True
        try:
            if skip:
                set_(previous)
        finally:
            _CRC32_LOCK.release()

    writer.on_first_write = restore
    try:
        if skip:
            set_(False)
        yield
    finally:
        restore()


@contextlib.contextmanager
def crc32_kept() -> Iterator[None]:
    """Run a ``torch.save`` that keeps torch's CRC-32s (files meant for sharing): it waits until
    no save of ember's with ``skip_zip_crc`` has the option switched off."""
    with _CRC32_LOCK:
        yield


def load_file(path: str | os.PathLike[str], map_location: Any = "cpu", mmap: bool = False) -> Any:
    """Read a checkpoint file with torch's safe loader, with an ember error naming it when it cannot.

    ``weights_only=True`` always: tensors, numbers, strings and containers of them load; nothing
    in the file can name a function to run. ember's own checkpoints need nothing else.

    Args:
        path: the file.
        map_location: where tensors go (``"cpu"`` by default).
        mmap: map the file instead of reading it: tensors are read only when touched (files in
            torch's legacy, pre-zip format are read whole: torch maps only zip files).

    Raises:
        CheckpointError: the file is missing, is not a file, is damaged, or holds more than
            the safe loader admits.
    """
    path = Path(path)
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise CheckpointError(f"checkpoint {str(path)!r} {what}")
    if mmap and not zipfile.is_zipfile(path):
        mmap = False
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol: the refusal below says enough
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        why = safe_loader_reason(exc)
        raise CheckpointError(
            f"checkpoint {str(path)!r} is truncated or corrupt, or not an ember checkpoint: torch's safe loader "
            f"refuses it ({why}; ember reads checkpoints only with weights_only=True, which runs no code from the "
            "file); use an earlier checkpoint"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, OverflowError, MemoryError, RecursionError) as exc:  # fmt: skip
        if path.stat().st_size == 0:
            raise CheckpointError(
                f"checkpoint {str(path)!r} is empty (0 bytes: a copy cut short, a full disk?); "
                "use an earlier checkpoint"
            ) from None
        detail = f"{type(exc).__name__}: {first_line(exc)}" if first_line(exc) else type(exc).__name__
        raise CheckpointError(
            f"checkpoint {str(path)!r} is truncated or corrupt ({detail}); use an earlier checkpoint"
        ) from None


_ADVICE = ("weights_only", "safe_globals", "allowlist", "trust", "Weights only load failed", "two options",
           "Alternatively", "Check the documentation", "Please file an issue", "Re-running")  # fmt: skip
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def safe_loader_reason(exc: BaseException) -> str:
    """Why torch's safe loader refused a file, without torch's advice around it.

    torch wraps the reason ("Unsupported global: GLOBAL builtins.exec was not an allowed global
    by default") in advice to retry with ``weights_only=False``, or to allowlist the global with
    ``torch.serialization.add_safe_globals``: either would run the file's code. Every sentence
    of advice, and the pointer to torch's documentation, is left out.
    """
    text = _ANSI.sub("", str(exc))
    sentences = [part.strip(" .\t") for line in text.splitlines() for part in re.split(r"(?<=\.)\s+", line)]
    reasons = [s for s in sentences if s and not any(word in s for word in _ADVICE)]
    reasons = [r.removeprefix("WeightsUnpickler error:").strip() for r in reasons]
    reasons = [r for r in reasons if r]
    return reasons[0] if reasons else "it holds objects that are not tensors, numbers, strings or containers of them"


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message ('' when it has none)."""
    text = str(exc)
    return text.splitlines()[0] if text.strip() else ""


def write_pointer(directory: str | os.PathLike[str], name: str, pointer: str = POINTER) -> None:
    """Point ``directory/<pointer>`` (``last_checkpoint``) at the checkpoint file ``name``, atomically."""
    path = Path(directory) / pointer
    try:
        atomic_write(path, name + "\n")
    except OSError as exc:
        raise write_error(path, exc) from None


def read_pointer(directory: str | os.PathLike[str], pointer: str = POINTER) -> str | None:
    """The file name ``directory/<pointer>`` names, or None when there is no such pointer."""
    pointer_file = Path(directory) / pointer
    if not pointer_file.is_file():
        return None
    with open(pointer_file, "rb") as f:  # a name is short: a pointer grown huge is not read whole
        text = f.read(4096).decode("utf-8", "replace")
    return text.strip().splitlines()[0] if text.strip() else None


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
        for entry in directory.glob(TEMPORARY_GLOB):
            remove_checkpoint(entry)


def replace_checkpoint(new: Path, final: Path) -> None:
    """Rename the complete checkpoint ``new`` (a file or a sharded checkpoint's directory) to
    ``final``, replacing the checkpoint of that name in whichever form it has.

    A file over a file is one atomic rename. A directory is involved (a rename cannot put one
    over a non-empty directory, nor over a file): the old checkpoint is renamed to a temporary
    name first and removed after, so a crash in between leaves ``new`` complete and the old
    one among the temporaries that the next start removes.
    """
    old = final.with_name(f".{final.name}.tmp-old")
    swap = final.exists() and (new.is_dir() or (final.is_dir() and not final.is_symlink()))
    if swap:
        remove_checkpoint(old)
        os.replace(final, old)
    os.replace(new, final)
    _atomic.fsync_dir(final.parent)
    if swap:
        remove_checkpoint(old)


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
    tensors while the file is being written; or a state whose last copies ``prepare`` makes
    first, in the same thread (see :meth:`submit`).

    Args:
        skip_zip_crc: write the files' zip records without CRC-32s (:func:`save_file`).
    """

    def __init__(self, skip_zip_crc: bool = False) -> None:
        self.skip_zip_crc = bool(skip_zip_crc)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(
        self, obj: Any, path: str | os.PathLike[str], then: Any = None, prepare: Callable[[], None] | None = None
    ) -> None:
        """Write ``obj`` to ``path`` in the background, then call ``then()`` (if given).

        ``prepare()``, if given, runs first in the background thread (the copies that complete
        ``obj``, :class:`~ember.checkpoint.state.DeferredCopy`); if it raises, nothing is
        written and :meth:`wait` raises its error.
        """
        self.wait()

        def work() -> None:
            try:
                if prepare is not None:
                    prepare()
                save_file(obj, path, skip_zip_crc=self.skip_zip_crc)
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
            if isinstance(error, CheckpointError):
                raise error
            raise CheckpointError(f"a background checkpoint write failed: {error}") from error
