"""Reading the local store: finding runs and artifacts, their status, their metrics.

Everything here only reads, so it is safe while runs are being written: metadata files are
replaced atomically and a metrics line is used only once its newline is on disk.

A run whose ``run.json`` says ``Running`` is shown as ``Crashed`` when its process is gone:
its host is this machine and no process has its pid, or its heartbeat (rewritten every
``HEARTBEAT_INTERVAL_S`` seconds while the run is open) is older than ``STALE_AFTER_S``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember.errors import TrackingError
from ember.track._fs import (
    ARTIFACTS_DIR,
    RUNS_DIR,
    hostname,
    parse_iso,
    pid_alive,
    read_json,
)
from ember.track._values import Point, last_point, read_points

RUN_FILE = "run.json"
PLATFORM_FILE = "platform.json"
HEARTBEAT_INTERVAL_S = 10.0
STALE_AFTER_S = 120.0
STATUSES = ("Running", "Complete", "Failed", "Interrupted")


def effective_status(meta: dict[str, Any], now: float | None = None) -> str:
    """The status to show: ``run.json``'s, or ``Crashed`` for a Running run whose process died."""
    status = str(meta.get("status", "?"))
    if status != "Running":
        return status
    pid = meta.get("pid")
    if meta.get("hostname") == hostname() and isinstance(pid, int) and not pid_alive(pid):
        return "Crashed"
    beat = parse_iso(meta.get("heartbeat"))
    now = time.time() if now is None else now
    if beat is not None and now - beat > STALE_AFTER_S:
        return "Crashed"
    return status


def is_live(meta: dict[str, Any]) -> bool:
    """Whether a process may still be writing this run."""
    return effective_status(meta) == "Running"


def _entries(parent: Path, meta_file: str) -> list[Path]:
    try:
        children = list(parent.iterdir())
    except FileNotFoundError:
        return []
    return sorted(p for p in children if not p.name.startswith(".") and (p / meta_file).is_file())


def resolve(ref: str | os.PathLike[str], home: Path, kind_dir: str = RUNS_DIR, meta_file: str = RUN_FILE) -> Path:
    """Find a run (or artifact) folder from its path, its folder name or a unique prefix.

    Raises:
        TrackingError: nothing matches, or a prefix matches several (they are listed).
    """
    kind = "run" if kind_dir == RUNS_DIR else "artifact"
    path = Path(ref)
    if (path / meta_file).is_file():
        return path.absolute()
    text = os.fspath(ref)
    parent = home / kind_dir
    if not text or "/" in text or os.sep in text:
        raise TrackingError(f"{text!r} is not a {kind} folder: it has no {meta_file}")
    names = [p.name for p in _entries(parent, meta_file)]
    if text in names:
        return parent / text
    matches = [n for n in names if n.startswith(text)]
    if len(matches) == 1:
        return parent / matches[0]
    if not matches:
        raise TrackingError(
            f"no {kind} matches {text!r} in {parent}; `ember runs ls --store {home}` lists "
            "the runs (pass a folder path, a folder name or a unique prefix of one)"
        )
    shown = "\n  ".join(matches[:20]) + ("\n  ..." if len(matches) > 20 else "")
    raise TrackingError(f"{text!r} matches {len(matches)} {kind}s in {parent}; give more of the name:\n  {shown}")


@dataclass
class RunInfo:
    """What listing a run needs: its folder, its run.json and its effective status."""

    path: Path
    meta: dict[str, Any] = field(default_factory=dict)
    status: str = "?"
    error: str | None = None

    @property
    def folder(self) -> str:
        """The folder name (``<name>_<YYMMDD>_<HHMMSS>_<6 chars>``)."""
        return self.path.name

    def duration(self, now: float | None = None) -> float | None:
        """Seconds from start to end (or to now while running, to the last heartbeat if crashed)."""
        start = parse_iso(self.meta.get("start_time"))
        if start is None:
            return None
        end: float | None
        if self.status == "Running":
            end = time.time() if now is None else now
        elif self.status == "Crashed":
            end = parse_iso(self.meta.get("heartbeat"))
        else:
            end = parse_iso(self.meta.get("end_time"))
        return None if end is None else max(0.0, end - start)


def run_info(path: Path) -> RunInfo:
    """Read one run's metadata; a bad ``run.json`` gives status ``Unreadable`` and the error."""
    try:
        meta = read_json(path / RUN_FILE)
    except TrackingError as e:
        return RunInfo(path, status="Unreadable", error=str(e))
    return RunInfo(path, meta, effective_status(meta))


def list_runs(home: Path) -> list[RunInfo]:
    """Every run under ``home/runs``, oldest first."""
    infos = [run_info(p) for p in _entries(home / RUNS_DIR, RUN_FILE)]
    return sorted(infos, key=lambda i: (str(i.meta.get("start_time", "")), i.folder))


def list_artifacts(home: Path) -> list[Path]:
    """Every artifact folder under ``home/artifacts``."""
    return _entries(home / ARTIFACTS_DIR, "artifact.json")


def metric_types(run_path: Path) -> list[str]:
    """The metric types a run has files for, sorted (train, val, test first)."""
    try:
        names = [p.stem for p in (run_path / "metrics").glob("*.jsonl")]
    except FileNotFoundError:
        return []
    order = {"train": 0, "val": 1, "test": 2}
    return sorted(names, key=lambda n: (order.get(n, 3), n))


def read_metrics(run_path: Path, type_: str) -> list[Point]:
    """Every complete point of one metric type, in file order."""
    points, _ = read_points(run_path / "metrics" / f"{type_}.jsonl")
    return points


def last_metrics(run_path: Path) -> dict[str, Point]:
    """The last complete point of each metric type, reading only the files' tails."""
    out: dict[str, Point] = {}
    for type_ in metric_types(run_path):
        point = last_point(run_path / "metrics" / f"{type_}.jsonl")
        if point is not None:
            out[type_] = point
    return out
