"""What changed in a local store, found at a cost that does not grow with the store (``ember ui``).

:class:`Folders` follows the folders of ``runs/`` or ``artifacts/``. Each pass:

- the parent folder's modification time: a folder created or removed (its names are listed
  again only then, without opening anything);
- every file of the *hot* folders: a live run (Running, until its heartbeat is 2 minutes old)
  and any folder that changed in the last :data:`HOT_S` seconds;
- the modification time of the next :data:`SWEEP` folders in rotation: a run resumed replaces
  its ``run.json``, which touches its folder;
- every file of the next :data:`DEEP_SWEEP` folders in rotation: anything else, such as a file
  edited by hand.

A folder's :func:`signature` (its files' names, kinds, sizes, inodes and modification times)
is taken when it is indexed; it is indexed again only when the signature differs.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SWEEP = 1000
"""Folders whose modification time one pass checks, in rotation."""
DEEP_SWEEP = 50
"""Folders whose every file one pass checks, in rotation."""
HOT_S = 30.0
"""A folder that changed this recently is checked file by file on every pass."""
_STAMP = re.compile(r"_(\d{6})_(\d{6})_[a-z0-9]{6}$")


def signature(folder: Path) -> tuple[Any, ...] | None:
    """Names, kinds, sizes, inodes and modification times of a folder's files and of ``metrics/``'s.

    Changes whenever a file is written, appended to, replaced, added or removed. None when the
    folder is gone. A linked folder is not entered (its link is described instead).
    """
    try:
        st = os.stat(folder, follow_symlinks=False)
        if os.path.islink(folder):
            return (st.st_mtime_ns, "link", st.st_ino)
        out: list[Any] = [st.st_mtime_ns]
        for parent, prefix in ((folder, ""), (folder / "metrics", "metrics/")):
            try:
                entries = sorted(os.scandir(parent), key=lambda e: e.name)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for e in entries:
                s = e.stat(follow_symlinks=False)
                out.append((prefix + e.name, s.st_mode, s.st_size, s.st_ino, s.st_mtime_ns))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return tuple(out)


def newest_first(name: str) -> tuple[str, str]:
    """A sort key of folder names, oldest first: 'mnist_260520_101500_a1b2c3' by '260520101500'.

    The time in a folder's name is when it was created (names without one sort first).
    """
    match = _STAMP.search(name)
    return (match.group(1) + match.group(2) if match else "", name)


@dataclass
class Entry:
    """One run or artifact folder, and what it was when last indexed.

    Attributes:
        signature: its :func:`signature` then (None: not indexed yet, or listed with its points
            still to read).
        node_id: the id it is indexed under; error: why it is listed Damaged (or was refused).
        hot_until: checked file by file on every pass until then (``time.monotonic()``).
        listed: its metadata is in the database (it is listed and counted), its points perhaps not yet.
    """

    path: Path
    signature: tuple[Any, ...] | None = None
    node_id: str | None = None
    hot_until: float = 0.0
    error: str | None = None
    listed: bool = False


@dataclass
class Folders:
    """The folders of ``root/folder`` holding ``meta_file`` (see the module).

    Example:
        >>> runs = Folders(Path(".ember"), "runs", "run.json")
        >>> gone = runs.discover()          # new folders join runs.pending, newest last
        >>> # listed (metadata only): they join runs.points, whose files are read after every folder is listed
        >>> changed = runs.changed(time.monotonic())
    """

    root: Path
    folder: str
    meta_file: str
    entries: dict[str, Entry] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)  # not indexed yet; the next one last
    points: list[str] = field(default_factory=list)  # listed, their points not read yet; the next one first
    big: list[str] = field(default_factory=list)  # the same for runs of many points: read after the others
    waiting: set[str] = field(default_factory=set)  # folders without their metadata file yet
    hot: set[str] = field(default_factory=set)
    order: list[str] = field(default_factory=list)  # the rotation
    sweep: int = 0
    deep: int = 0
    indexed: int = 0
    dir_mtime: int | None = None

    def discover(self) -> list[Entry]:
        """New folders join ``pending``; return the entries of folders that are gone."""
        parent = self.root / self.folder
        try:
            mtime = os.stat(parent).st_mtime_ns
        except FileNotFoundError:
            mtime = -1
        if mtime == self.dir_mtime:
            ready = [n for n in self.waiting if (parent / n / self.meta_file).is_file()]
            self.waiting.difference_update(ready)
            self._add(ready)
            return []
        # A change within the file system's clock tick could follow this listing unseen: list again next pass.
        self.dir_mtime = mtime if time.time_ns() - mtime > 2_000_000_000 else None
        try:
            names = {e.name for e in os.scandir(parent) if not e.name.startswith(".")}
        except FileNotFoundError:
            names = set()
        gone = [self.entries.pop(n) for n in list(self.entries) if n not in names]
        if gone:
            self.pending = [n for n in self.pending if n in self.entries]
            self.points = [n for n in self.points if n in self.entries]
            self.big = [n for n in self.big if n in self.entries]
            self.hot = {n for n in self.hot if n in self.entries}
            self.indexed -= sum(1 for e in gone if e.listed)
        self.waiting &= names
        new = sorted(names - self.entries.keys() - self.waiting)
        ready = [n for n in new if (parent / n / self.meta_file).is_file()]
        self.waiting.update(set(new) - set(ready))
        self._add(ready, force=bool(gone))
        return gone

    def _add(self, names: list[str], force: bool = False) -> None:
        for name in names:
            self.entries[name] = Entry(self.root / self.folder / name)
        self.pending += names
        if names or force:
            self.order = sorted(self.entries)
            self.pending.sort(key=newest_first)

    def changed(self, now: float) -> list[str]:
        """Indexed folders whose files changed: the hot ones, then a slice of the rotation."""
        out: dict[str, None] = {}
        for name in list(self.hot):
            entry = self.entries[name]
            if entry.hot_until < now:
                self.hot.discard(name)
            elif signature(entry.path) != entry.signature:
                out[name] = None
        count = len(self.order)
        for i in range(min(SWEEP, count)):
            entry = self.entries[self.order[(self.sweep + i) % count]]
            if entry.signature is not None and _dir_mtime(entry.path) != entry.signature[0]:
                out[entry.path.name] = None
        for i in range(min(DEEP_SWEEP, count)):
            entry = self.entries[self.order[(self.deep + i) % count]]
            if entry.signature is not None and signature(entry.path) != entry.signature:
                out[entry.path.name] = None
        if count:
            self.sweep, self.deep = (self.sweep + SWEEP) % count, (self.deep + DEEP_SWEEP) % count
        return list(out)

    def watch(self, name: str, seconds: float) -> None:
        """Check ``name`` file by file on every pass for the next ``seconds``."""
        self.entries[name].hot_until = time.monotonic() + seconds
        self.hot.add(name)


def _dir_mtime(path: Path) -> int | None:
    try:
        return os.stat(path, follow_symlinks=False).st_mtime_ns
    except FileNotFoundError:
        return None
