"""Paths, names, atomic JSON files, the run folder lock and the rank test shared by the tracking modules."""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import socket
import stat
import string
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from ember import _lock
from ember._atomic import atomic_write
from ember._exit import leave_process_group_at_exit
from ember._format import format_bytes
from ember.errors import TrackingError, describe, short_repr

RUNS_DIR = "runs"
ARTIFACTS_DIR = "artifacts"
DEFAULT_HOME = ".ember"
MAX_NAME_LENGTH = 100
_SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
_HOSTNAME = socket.gethostname()


def hostname() -> str:
    """This machine's host name, as recorded in run.json."""
    return _HOSTNAME


def get_rank() -> int:
    """The global rank: torch.distributed's when initialised, else ``$RANK``, else 0.

    Every tracking entry point asks this first, so it is also where a process group the user
    created is noticed: the exit guard of :mod:`ember._exit` is registered for it (once).
    """
    # torch.distributed cannot be initialised unless torch was imported: no import here.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        leave_process_group_at_exit()  # a group the user made: the same exit guard as ember.launch
        return int(dist.get_rank())
    raw = os.environ.get("RANK", "0")
    try:
        return int(raw)
    except ValueError:
        raise TrackingError(f"RANK={raw!r} is not an integer; unset it or set the rank") from None


def resolve_home(home: str | os.PathLike[str] | None) -> Path:
    """The store root: ``home`` when given, else ``$EMBER_HOME``, else ``./.ember``.

    Raises:
        TrackingError: the root, or its ``runs``/``artifacts`` folder, exists and is not a folder.
    """
    source = "home= / --store"
    if home is None:
        source = "$EMBER_HOME" if os.environ.get("EMBER_HOME") else "the default store ./.ember"
        home = os.environ.get("EMBER_HOME") or DEFAULT_HOME
    root = Path(home).expanduser().absolute()
    for path in (root, root / RUNS_DIR, root / ARTIFACTS_DIR):
        if os.path.lexists(path) and not path.is_dir():
            raise TrackingError(
                f"the tracking store's {'root' if path == root else path.name + ' folder'} {path} is not a folder "
                f"(from {source}): give a folder as home= / --store or $EMBER_HOME, or move that file away"
            )
    return root


def check_name(name: object, what: str = "name") -> str:
    """Return ``name`` when it can be part of a folder name; raise TrackingError otherwise."""
    if not isinstance(name, str):
        raise TrackingError(f"{what} must be a str, got {describe(name)}")
    bad = (
        not name
        or name in (".", "..")
        or ".." in name
        or any(c in name for c in "/\\\0")
        or any(ord(c) < 32 for c in name)
        or len(name) > MAX_NAME_LENGTH
    )
    if bad:
        raise TrackingError(
            f"{what} {short_repr(name)} cannot name a folder: use 1 to {MAX_NAME_LENGTH} characters "
            "without '/', '\\', '..', NUL or control characters, e.g. 'mnist-ddp'"
        )
    return name


def check_rel_path(path: object, what: str) -> str:
    """Return a safe relative POSIX path ('a/b.pt'); raise TrackingError for anything else."""
    if not isinstance(path, str):
        raise TrackingError(f"{what} must be a str, got {describe(path)}")
    parts = path.split("/")
    bad = (
        not path
        or path.startswith("/")
        or "\\" in path
        or "\0" in path
        or re.match(r"^[A-Za-z]:", path) is not None
        or any(p in ("", ".", "..") for p in parts)
    )
    if bad:
        raise TrackingError(
            f"{what} {short_repr(path)} is not a safe relative path: use '/'-separated names without "
            "'..', '.', empty parts, backslashes, NUL or a leading '/', e.g. 'weights/model.pt'"
        )
    return path


def check_folder(folder: object) -> str:
    """Validate the console folder a run belongs to ('default', 'team/mnist', '/alice/x')."""
    if not isinstance(folder, str):
        raise TrackingError(f"folder must be a str, got {describe(folder)}")
    try:
        check_rel_path(folder[1:] if folder.startswith("/") else folder, "folder")
    except TrackingError:
        raise TrackingError(
            f"folder {short_repr(folder)} is not a safe console folder: use '/'-separated names without "
            "'..', '.', empty parts, backslashes or NUL, e.g. 'default' or 'team/mnist'"
        ) from None
    return folder


def check_labels(labels: object) -> list[str]:
    """Validate labels: None or a list/tuple of non-empty str."""
    if labels is None:
        return []
    if isinstance(labels, str) or not isinstance(labels, (list, tuple)):
        raise TrackingError(f"labels must be a list of str, got {describe(labels)}, e.g. labels=['ddp', 'baseline']")
    for label in labels:
        if not isinstance(label, str) or not label:
            raise TrackingError(f"label {short_repr(label)} in {short_repr(labels)} must be a non-empty str")
    return list(labels)


def check_description(description: object) -> str:
    """Validate a description (a str)."""
    if not isinstance(description, str):
        raise TrackingError(f"description must be a str, got {type(description).__name__}")
    return description


def make_unique_dir(parent: Path, name: str) -> Path:
    """Create ``<parent>/<name>_<YYMMDD>_<HHMMSS>_<6 chars>`` exclusively and return it."""
    parent.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%y%m%d_%H%M%S")
    for _ in range(100):
        suffix = "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(6))
        path = parent / f"{name}_{stamp}_{suffix}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise TrackingError(f"could not create a unique folder for {name!r} under {parent}")


def now_iso() -> str:
    """The current UTC time as ISO 8601 with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def parse_iso(text: object) -> float | None:
    """Seconds since the epoch for an ISO 8601 string from :func:`now_iso`; None when missing or not one.

    Readers show a time they cannot parse as unknown rather than failing (the store's readers
    mark such a run Damaged first, see :func:`ember.track.store.run_damage`).
    """
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def write_json_atomic(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` as indented JSON, atomically and durably (:func:`ember._atomic.atomic_write`)."""
    atomic_write(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n")


unlock_folder = _lock.unlock_folder
pid_alive = _lock.pid_alive


def lock_folder(folder: Path, what: str, holder: Callable[[], str]) -> int | None:
    """Lock the run folder ``folder`` for this process's writing (:func:`ember._lock.lock_folder`).

    Raises:
        TrackingError: another process holds the lock; the message names ``what`` and
            ``holder()`` (who the folder's metadata says writes it).
    """

    def refusal() -> TrackingError:
        return TrackingError(
            f"{what} is open for writing in another process ({holder()}), which holds its lock: finish it "
            "there or wait for that process to end; two processes writing one run would interleave its files"
        )

    return _lock.lock_folder(folder, refusal)


MAX_JSON_BYTES = 64 << 20
"""The largest metadata file (run.json, platform.json, artifact.json) a reader accepts."""


def open_regular(path: Path) -> BinaryIO:
    """Open ``path`` for reading when it is a regular file and not a symbolic link.

    The store's readers open every file of a run or artifact folder this way, so a link placed
    there (``run.json`` pointing at a file elsewhere, a metrics file pointing at ``/dev/zero``)
    is never followed, and a pipe or device is refused without waiting on it.

    Raises:
        FileNotFoundError: ``path`` does not exist (callers decide what missing means).
        TrackingError: it is a link, a folder, or something else than a regular file.
    """
    link = (
        f"{path} is a symbolic link: the store reads only the regular files ember wrote into a run or "
        "artifact folder; replace the link by a copy"
    )
    try:
        mode = os.lstat(path).st_mode  # a pipe or a device is refused before anything opens it
    except FileNotFoundError:
        raise
    except OSError as e:
        raise TrackingError(f"{path} cannot be read: {e.strerror or e}") from None
    if stat.S_ISLNK(mode):
        raise TrackingError(link)
    if not stat.S_ISREG(mode):
        raise TrackingError(f"{path} is {file_kind(mode)}: the store expects a regular file there")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise TrackingError(link) from None
        raise TrackingError(f"{path} cannot be read: {e.strerror or e}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # replaced between the two looks
        os.close(fd)
        raise TrackingError(f"{path} is {file_kind(mode)}: the store expects a regular file there")
    return os.fdopen(fd, "rb")


def file_kind(mode: int) -> str:
    """What a file of ``mode`` (``os.stat``'s) is, in words: "a folder", "a named pipe (FIFO)"..."""
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):  # fmt: skip
        if test(mode):
            return kind
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (ember writes non-finite numbers as strings)")


def read_json(path: Path, *, follow_links: bool = True) -> Any:
    """Read a JSON file, raising TrackingError that names the file when it is missing or bad.

    Bare ``NaN``/``Infinity`` (which Python's json module accepts but JSON does not have) and
    files over :data:`MAX_JSON_BYTES` are refused. Pass ``follow_links=False`` for the files of
    a run or artifact folder (see :func:`open_regular`).
    """
    try:
        with open(path, "rb") if follow_links else open_regular(path) as f:
            if os.fstat(f.fileno()).st_size > MAX_JSON_BYTES:
                raise TrackingError(f"{path} is over {format_bytes(MAX_JSON_BYTES)}: it was not written by ember")
            data = f.read()
    except FileNotFoundError:
        raise TrackingError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise TrackingError(f"{path} is a folder: the store expects a file there") from None
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TrackingError(f"{path} is not valid JSON ({reason}); it was not written by ember") from None


def complete_lines(path: Path) -> list[tuple[int, bytes]]:
    """The numbered (from 1) non-blank complete lines of the append-only file ``path``, opened
    with :func:`open_regular`; a torn last line is left out, a missing file has none."""
    try:
        with open_regular(path) as f:
            data = f.read()
    except FileNotFoundError:
        return []
    lines = data[: data.rfind(b"\n") + 1].splitlines()
    return [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte of ``data`` is written."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def append_line(path: Path, line: str) -> None:
    """Append one newline-terminated line to ``path`` with a single write (O_APPEND)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        write_all(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def drop_torn_tail(path: Path) -> int:
    """Cut bytes after the last newline (a line torn by a crash); return how many were cut."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "r+b") as f:
        pos = size
        while pos > 0:
            step = min(65536, pos)
            f.seek(pos - step)
            chunk = f.read(step)
            idx = chunk.rfind(b"\n")
            if idx >= 0:
                keep = pos - step + idx + 1
                break
            pos -= step
        else:
            keep = 0
        if keep < size:
            f.truncate(keep)
        return size - keep
