"""Reading the local store: finding runs and artifacts, their status, their metrics.

Everything here only reads, so it is safe while runs are being written: metadata files are
replaced atomically and a metrics line is used only once its newline is on disk.

A run whose ``run.json`` says ``Running`` is shown as ``Crashed`` when its process is gone:
its host is this machine and no process has its pid, or its heartbeat (rewritten every
``HEARTBEAT_INTERVAL_S`` seconds while the run is open) is older than ``STALE_AFTER_S``.

A run folder ember could not have written — ``run.json`` missing keys, mistyped, not JSON, a
folder or a link where a file belongs — has the status ``Damaged`` and a reason
(:attr:`RunInfo.error`); readers list it with the others and never fail the whole store for it.
No reader follows a symbolic link inside a run folder (:func:`ember.track._fs.open_regular`).
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember.errors import TrackingError, describe, short_repr
from ember.track._fs import (
    ARTIFACTS_DIR,
    RUNS_DIR,
    file_kind,
    hostname,
    parse_iso,
    pid_alive,
    read_json,
)
from ember.track._values import Point, iter_point_batches, last_point, read_points

RUN_FILE = "run.json"
PLATFORM_FILE = "platform.json"
HEARTBEAT_INTERVAL_S = 10.0
STALE_AFTER_S = 120.0
STATUSES = ("Running", "Complete", "Failed", "Interrupted", "Preempted")
DAMAGED = "Damaged"
"""The status readers give a run folder that ember could not have written (never written to disk)."""
CRASHED = "Crashed"
METRICS_DIR = "metrics"


def effective_status(meta: dict[str, Any], now: float | None = None) -> str:
    """The status to show: ``run.json``'s, or ``Crashed`` for a Running run whose process died."""
    status = str(meta.get("status", "?"))
    if status != "Running":
        return status
    pid = meta.get("pid")
    if meta.get("hostname") == hostname() and type(pid) is int and pid > 0 and not pid_alive(pid):
        return CRASHED
    beat = parse_iso(meta.get("heartbeat"))
    now = time.time() if now is None else now
    if beat is not None and now - beat > STALE_AFTER_S:
        return CRASHED
    return status


def _is_time(value: Any, optional: bool) -> bool:
    return (optional and value is None) or parse_iso(value) is not None


_RUN_FIELDS: dict[str, tuple[str, Any]] = {
    "id": ("a non-empty string", lambda v: isinstance(v, str) and v != ""),
    "name": ("a string", lambda v: isinstance(v, str)),
    "folder": ("a string", lambda v: isinstance(v, str)),
    "status": (f"one of {', '.join(STATUSES)}", lambda v: v in STATUSES),
    "start_time": ("an ISO 8601 time", lambda v: _is_time(v, False)),
    "end_time": ("an ISO 8601 time or null", lambda v: _is_time(v, True)),
    "heartbeat": ("an ISO 8601 time or null", lambda v: _is_time(v, True)),
    "pid": ("an int or null", lambda v: v is None or type(v) is int),
    "hostname": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "hparams": ("an object", lambda v: isinstance(v, dict)),
    "labels": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "description": ("a string", lambda v: isinstance(v, str)),
}


def run_damage(meta: Any) -> str | None:
    """Why ``meta`` (a parsed ``run.json``) cannot be a run ember wrote, or None when it can be."""
    if not isinstance(meta, dict):
        return f"it holds {describe(meta)}, not an object"
    for key, (allowed, ok) in _RUN_FIELDS.items():
        if key not in meta:
            return f"it has no {key!r}"
        if not ok(meta[key]):
            return f"its {key!r} is {describe(meta[key])}, not {allowed}"
    if not isinstance(meta.get("reason"), str | None):
        return f"its 'reason' is {describe(meta['reason'])}, not a string or null"
    if not isinstance(meta.get("resumes", []), list):
        return f"its 'resumes' is {describe(meta['resumes'])}, not a list"
    return None


_ORDER = {"train": 0, "val": 1, "test": 2}


def _scan_metrics(path: Path) -> tuple[list[str], str | None]:
    """The metric types of the run folder ``path`` (sorted), and why its ``metrics`` folder is damaged (or None).

    One ``lstat`` and one listing: ``metrics`` must be a folder (not a link) of regular
    ``*.jsonl`` files; a missing one holds no types.
    """
    metrics = os.path.join(path, METRICS_DIR)
    try:
        mode = os.lstat(metrics).st_mode
    except FileNotFoundError:
        return [], None
    if not stat.S_ISDIR(mode):
        return [], f"{metrics} is not a folder (a link, or a file): the store does not follow it"
    names = []
    with os.scandir(metrics) as entries:
        for entry in entries:
            if not entry.name.endswith(".jsonl"):
                continue
            if not entry.is_file(follow_symlinks=False):
                kind = "a symbolic link" if entry.is_symlink() else "a folder" if entry.is_dir() else "not a file"
                return [], f"{entry.path} is {kind}: a metrics file must be a regular file"
            names.append(entry.name[: -len(".jsonl")])
    return sorted(names, key=lambda n: (_ORDER.get(n, 3), n)), None


def _entries(parent: Path, meta_file: str) -> list[Path]:
    """The entries of ``parent`` that are, or claim to be, run (or artifact) folders, by name.

    A folder holding ``meta_file`` in any form (a file, or a link, a pipe, a device, a folder:
    the readers then report it as damaged), and anything that is not a folder: a symbolic link
    (never followed: a link to a folder elsewhere is listed as damaged, not read), a pipe, a
    file. Nothing is opened here. A folder without ``meta_file`` is not a run (a run's folder
    gets its ``run.json`` as it is created).
    """
    try:
        children = list(os.scandir(parent))
    except FileNotFoundError:
        return []
    return sorted(Path(e.path) for e in children if not e.name.startswith(".") and _claims(e.path, meta_file))


def _claims(path: str | os.PathLike[str], meta_file: str) -> bool:
    """Whether ``path`` is, or claims to be, a run (artifact) folder: a link, anything but a folder
    (a pipe, a file), or a folder holding ``meta_file`` in any form (see :func:`_entries`)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    return not stat.S_ISDIR(mode) or os.path.lexists(os.path.join(path, meta_file))


def resolve(ref: str | os.PathLike[str], home: Path, kind_dir: str = RUNS_DIR, meta_file: str = RUN_FILE) -> Path:
    """Find a run (or artifact) folder from its path, its folder name or a unique prefix.

    A path or a whole folder name costs one look-up, whatever the size of the store; only a
    prefix lists the folder names (names only, without opening anything).

    Raises:
        TrackingError: nothing matches, or a prefix matches several (they are listed).
    """
    return resolve_many([ref], home, kind_dir, meta_file)[0]


def resolve_many(
    refs: list[str | os.PathLike[str]], home: Path, kind_dir: str = RUNS_DIR, meta_file: str = RUN_FILE
) -> list[Path]:
    """:func:`resolve` for several references, listing the folder names at most once (for prefixes)."""
    kind = "run" if kind_dir == RUNS_DIR else "artifact"
    parent = home / kind_dir
    names: list[str] | None = None
    found: list[Path] = []
    for ref in refs:
        path = Path(ref)
        if _claims(path, meta_file):  # a damaged one too: its readers say what is wrong
            found.append(path.absolute())
            continue
        text = os.fspath(ref)
        if not text or "/" in text or os.sep in text:
            raise TrackingError(f"{short_repr(text)} is not a {kind} folder: it has no {meta_file}")
        if not text.startswith(".") and _claims(parent / text, meta_file):
            found.append(parent / text)
            continue
        if names is None:  # a prefix: the names, once
            try:
                names = sorted(e.name for e in os.scandir(parent) if not e.name.startswith("."))
            except FileNotFoundError:
                names = []
        matches = [n for n in names if n.startswith(text) and _claims(parent / n, meta_file)]
        if len(matches) == 1:
            found.append(parent / matches[0])
            continue
        if not matches:
            raise TrackingError(
                f"no {kind} matches {short_repr(text)} in {parent}; `ember runs ls --store {home}` lists "
                "the runs (pass a folder path, a folder name or a unique prefix of one)"
            )
        shown = "\n  ".join(matches[:20]) + ("\n  ..." if len(matches) > 20 else "")
        raise TrackingError(
            f"{short_repr(text)} matches {len(matches)} {kind}s in {parent}; give more of the name:\n  {shown}"
        )
    return found


@dataclass
class RunInfo:
    """What listing a run needs: its folder, its run.json and its effective status."""

    path: Path
    meta: dict[str, Any] = field(default_factory=dict)
    status: str = "?"
    error: str | None = None
    types: list[str] | None = None
    """The run's metric types, as found when it was read (None for a damaged run)."""

    @property
    def folder(self) -> str:
        """The folder name (``<name>_<YYMMDD>_<HHMMSS>_<6 chars>``)."""
        return self.path.name

    def duration(self, now: float | None = None) -> float | None:
        """Seconds from start to end (to now while running; a Crashed run: to its :meth:`last_record`,
        the console's rule too)."""
        start = parse_iso(self.meta.get("start_time"))
        if start is None:
            return None
        end: float | None
        if self.status == "Running":
            end = time.time() if now is None else now
        elif self.status == "Crashed":
            end = self.last_record()
        else:
            end = parse_iso(self.meta.get("end_time"))
        return None if end is None else max(0.0, end - start)

    def last_record(self) -> float | None:
        """When the run last recorded anything: its last metric point (each type's file's last line,
        read from its tail) or its heartbeat, the later; None with neither. Where a Crashed run's
        time ends, as the console's ``ember.server.services.liveness.last_records`` says.

        Before, ``ember runs ls`` ended a Crashed run at its heartbeat while the console ended it at
        its last point (0.5 s against 2.9 s for a run whose heartbeat thread died first).
        """
        times = [parse_iso(self.meta.get("heartbeat"))]
        try:
            points = last_metrics(self.path, self.types)
        except TrackingError:  # a damaged metrics file: its time is not known (the run shows Damaged)
            points = {}
        times += [p.get("time") for p in points.values()]
        found = [t for t in times if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)]
        return max(found) if found else None


def run_info(path: Path) -> RunInfo:
    """Read one run's metadata; a damaged folder or ``run.json`` gives status ``Damaged`` and the reason.

    A link is not followed, and a ``run.json`` that is not a regular file (a pipe, a device, a
    link) is not opened (:func:`ember.track._fs.open_regular`).
    """
    try:
        mode = os.lstat(path).st_mode
    except OSError as e:
        return RunInfo(path, status=DAMAGED, error=f"{path} cannot be read: {e.strerror or e}")
    if stat.S_ISLNK(mode):
        return RunInfo(path, status=DAMAGED, error=f"{path} is a symbolic link: the store reads only folders inside it")
    if not stat.S_ISDIR(mode):
        return RunInfo(path, status=DAMAGED, error=f"{path} is {file_kind(mode)}, not a run folder")
    types, damage = _scan_metrics(path)
    if damage is not None:
        return RunInfo(path, status=DAMAGED, error=damage)
    try:
        meta = read_json(path / RUN_FILE, follow_links=False)
    except TrackingError as e:
        return RunInfo(path, status=DAMAGED, error=str(e))
    reason = run_damage(meta)
    if reason is not None:
        return RunInfo(path, meta if isinstance(meta, dict) else {}, DAMAGED, f"{path / RUN_FILE}: {reason}")
    return RunInfo(path, meta, effective_status(meta), types=types)


def read_platform(run_path: Path) -> dict[str, Any] | None:
    """The run's ``platform.json`` (None when it has none), which must hold an object.

    Raises:
        TrackingError: it is not a regular file, not JSON, or not a JSON object (``[]``, ``3``).
    """
    path = run_path / PLATFORM_FILE
    if not os.path.lexists(path):
        return None
    data = read_json(path, follow_links=False)
    if not isinstance(data, dict):
        raise TrackingError(f"{path} holds {describe(data)}, not an object: it was not written by ember")
    return data


def list_runs(home: Path) -> list[RunInfo]:
    """Every run under ``home/runs``, oldest first; damaged ones too (status ``Damaged``)."""
    infos = [run_info(p) for p in _entries(home / RUNS_DIR, RUN_FILE)]
    return sorted(infos, key=lambda i: (str(i.meta.get("start_time", "")), i.folder))


def list_artifacts(home: Path) -> list[Path]:
    """Every artifact folder under ``home/artifacts``."""
    return _entries(home / ARTIFACTS_DIR, "artifact.json")


def metric_types(run_path: Path) -> list[str]:
    """The metric types a run has files for, sorted (train, val, test first).

    Raises:
        TrackingError: ``metrics`` or one of its ``*.jsonl`` files is a link or not what it should be.
    """
    types, damage = _scan_metrics(run_path)
    if damage is not None:
        raise TrackingError(damage)
    return types


def read_metrics(run_path: Path, type_: str) -> list[Point]:
    """Every complete point of one metric type, in file order."""
    points, _ = read_points(run_path / "metrics" / f"{type_}.jsonl")
    return points


def metric_batches(run_path: Path, type_: str, end: int | None = None) -> Iterator[tuple[list[Point], int]]:
    """The points of one metric type a chunk at a time, with the byte cursor after each chunk
    (see :func:`ember.track._values.iter_point_batches`): memory stays bounded however long the run."""
    return iter_point_batches(run_path / METRICS_DIR / f"{type_}.jsonl", end=end)


def last_metrics(run_path: Path, types: list[str] | None = None) -> dict[str, Point]:
    """The last complete point of each metric type, reading only the files' tails.

    ``types``: the run's metric types when already known (:attr:`RunInfo.types`).
    """
    out: dict[str, Point] = {}
    for type_ in metric_types(run_path) if types is None else types:
        point = last_point(run_path / "metrics" / f"{type_}.jsonl")
        if point is not None:
            out[type_] = point
    return out
