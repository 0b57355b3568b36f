"""``ember ui`` over a metrics file with a damaged line: the line is skipped, the rest of the run shown.

``ember upload`` stops at a line that is not a metric point (a crash mid-write on a file system
that does not keep appends in order, an edit by hand): the batch that holds it and everything
after it stay unsent, so the console showed a run cut short, listed Damaged. Here the index
sends what can be read instead: :func:`upload` runs the upload as usual and, when it stops at a
metrics file, sends every metrics file's unsent lines itself, a damaged line left out of the
batch but inside its byte range (so the cursor moves past it and it is not read again), then
lets the upload finish the log and the lineage. What was skipped is kept in the run's row
(``meta[SKIPPED]``, a list of sentences) across later uploads and restarts; the run page shows it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import select

from ember.server.services import ingest
from ember.server.services.runs import SKIPPED
from ember.server.services.upload import Uploads
from ember.server.storage.models import Run
from ember.track.client import BATCH_VALUES, UploadError, upload_run
from ember.track.receiver import MetricColumns

MAX_NOTES = 20
"""Skipped lines named per run (the count of the others is kept)."""


def upload(path: Path, run_id: str, uploads: Uploads, points: bool = True) -> None:
    """Upload a run folder in process, skipping damaged metrics lines (noted on the run) instead of stopping.

    Args:
        path: the run folder; run_id: the id it is indexed under; uploads: the receiver in process.
        points: False sends its ``run.json`` only (the notes of lines skipped before are kept).

    Raises:
        TrackingError: what the upload raises when the damage is not a metrics line (a bad
            run.json, lineage line, a body the server refuses whole...): the run is listed Damaged.
    """
    notes = _notes(uploads, run_id)
    try:
        upload_run(path, None, True, "new", uploads, artifacts=False, points=points)
    except UploadError:
        if not points:
            raise
        found = _salvage(path, run_id, uploads)
        if not found:
            raise
        notes += found
        upload_run(path, None, True, "new", uploads, artifacts=False)
    finally:
        _keep(uploads, run_id, notes)


def _notes(uploads: Uploads, run_id: str) -> list[str]:
    """What the run's row says was skipped before (a re-upload replaces its meta with run.json)."""
    meta = uploads.session.scalar(select(Run.meta).where(Run.id == run_id))
    notes = meta.get(SKIPPED) if isinstance(meta, dict) else None
    return [str(n) for n in notes] if isinstance(notes, list) else []


def _keep(uploads: Uploads, run_id: str, notes: list[str]) -> None:
    run = uploads.session.scalar(select(Run).where(Run.id == run_id))
    if run is None or not notes or (run.meta or {}).get(SKIPPED) == notes:
        return
    if len(notes) > MAX_NOTES:
        notes = [*notes[: MAX_NOTES - 1], f"... and {len(notes) - MAX_NOTES + 1} more lines skipped"]
    run.meta = {**(run.meta or {}), SKIPPED: notes}
    uploads.session.flush()


def _salvage(path: Path, run_id: str, uploads: Uploads) -> list[str]:
    """Send every metrics file's unsent complete lines, damaged ones left out; what was skipped."""
    if uploads.session.scalar(select(Run.pk).where(Run.id == run_id)) is None:
        return []  # refused at its PUT: nothing to continue
    cursors = ingest.cursors(uploads.session, "run", run_id)
    skipped: list[str] = []
    folder = path / "metrics"
    for file in sorted(folder.glob("*.jsonl")) if folder.is_dir() and not folder.is_symlink() else []:
        if file.is_symlink() or not file.is_file():
            continue
        stream = f"metrics/{file.name}"
        try:
            skipped += _send_file(uploads, run_id, file, stream, cursors.get(stream, 0))
        except UploadError:
            return []  # the server refuses something else about it: listed Damaged, as before
    return skipped


def _send_file(uploads: Uploads, run_id: str, file: Path, stream: str, cursor: int) -> list[str]:
    """Send ``file`` from ``cursor`` to its last complete line, in batches; the damaged lines, named."""
    with open(file, "rb") as f:
        f.seek(cursor)
        data = f.read()
    data = data[: data.rfind(b"\n") + 1]  # a last line without its newline is still being written
    skipped: list[str] = []
    batch: list[dict[str, Any]] = []
    start = offset = cursor
    names: set[str] = set()
    for line in data.split(b"\n")[:-1]:
        end = offset + len(line) + 1
        record, why = _point(line)
        if why is not None:
            skipped.append(f"{stream}: the line at byte {offset} {why}; skipped")
        elif record is not None:
            batch.append(record)
            names.update(record["metrics"])
        offset = end
        if len(batch) * max(1, len(names)) >= BATCH_VALUES // 2:
            skipped += _send(uploads, run_id, file.stem, stream, start, offset, batch)
            batch, names, start = [], set(), offset
    if offset > start:
        skipped += _send(uploads, run_id, file.stem, stream, start, offset, batch)
    return skipped


def _point(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """A metrics line as a point, or why it is not one (a blank line is neither)."""
    if not line.strip():
        return None, None
    try:
        record = json.loads(line)
    except ValueError as e:
        return None, f"is not JSON ({e})"
    if not (
        isinstance(record, dict)
        and isinstance(record.get("step"), int)
        and isinstance(record.get("time"), int | float)
        and isinstance(record.get("metrics"), dict)
    ):
        return None, f"is not a metric point ({line[:80].decode('utf-8', 'replace')!r})"
    return record, None


def _send(
    uploads: Uploads, run_id: str, type_: str, stream: str, start: int, end: int, batch: list[dict[str, Any]]
) -> list[str]:
    """Send one batch covering bytes ``start``-``end``; line by line when the server refuses it whole."""
    try:
        uploads.put_metrics(run_id, _body(type_, start, end, batch))
        return []
    except UploadError:
        pass
    skipped = []
    for record in batch:  # each its own request; a refused one is sent as an empty range at the end
        try:
            uploads.put_metrics(run_id, _body(type_, start, start, [record]))
        except UploadError as e:
            skipped.append(f"{stream}: the point at step {record['step']} was refused ({e}); skipped")
    uploads.put_metrics(run_id, _body(type_, start, end, []))
    return skipped


def _body(type_: str, start: int, end: int, records: list[dict[str, Any]]) -> MetricColumns:
    """A metrics request in columns, as ``ember.track.client`` sends it."""
    names = dict.fromkeys(name for r in records for name in r["metrics"])
    return {
        "type": type_,
        "start": start,
        "end": end,
        "step": [r["step"] for r in records],
        "epoch": [r.get("epoch") for r in records],
        "time": [r["time"] for r in records],
        "metrics": {name: [r["metrics"].get(name) for r in records] for name in names},
    }
