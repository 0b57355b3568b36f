"""Whether a run is still alive, and how long it ran: the status and duration every page shows.

A run whose process died without finishing stays ``Running`` in its run.json; it is shown as
``Crashed`` (:func:`shown_status`) and lasted until its last record, its last metric point or its
heartbeat, the later (:func:`last_records`): one rule for the runs table, the API and the run
page.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ember.server.storage.db import json_item
from ember.server.storage.models import MetricBlock, MetricPoint, Run


def duration_s(start: str | None, end: str | None, running: bool = False) -> float | None:
    """Seconds between two ISO 8601 times (None when either is missing or unreadable).

    ``running``: the run is Running (its process alive), and without an end it has lasted until
    now: its elapsed time, not None (the console showed "—" for every running run).

    Example:
        >>> duration_s("2026-01-02T10:00:00+00:00", "2026-01-02T10:01:30+00:00")
        90.0
    """
    try:
        a = datetime.fromisoformat(start) if start else None
        b = datetime.fromisoformat(end) if end else None
    except ValueError:
        return None
    if b is None and running and a is not None:
        b = datetime.now(timezone.utc) if a.tzinfo else datetime.now(timezone.utc).replace(tzinfo=None)
    if a is None or b is None or (a.tzinfo is None) != (b.tzinfo is None):
        return None
    return max(0.0, (b - a).total_seconds())


def shown_status(status: str, meta: dict[str, Any] | None, now: float | None = None) -> str:
    """The status to show for a run: the stored one, or ``Crashed`` for a Running run whose process is gone.

    The same rule as the local store (:func:`ember.track.store.effective_status`): a run stays
    ``Running`` in its run.json when its process dies without finishing (SIGKILL, OOM kill, power
    loss). It is shown as ``Crashed`` (W&B's word for a run that stopped sending heartbeats) when
    its heartbeat, rewritten every 10 s while it is open, is over 2 minutes old, or when it ran on
    this machine and no process has its pid any more. Nothing is written: when the run is resumed
    and uploaded again it shows as Running again.

    Example:
        >>> shown_status("Running", {"heartbeat": "2020-01-01T00:00:00+00:00"})
        'Crashed'
    """
    if status != "Running":
        return status
    from ember.track.store import effective_status

    return effective_status({**(meta or {}), "status": status}, now)


def crashed_runs(session: Session, running: list[int]) -> dict[int, tuple[str, Any]]:
    """Running runs whose process is gone, by primary key: ``("Crashed", last record)``.

    The pair replaces the candidate row's status and end time: a crashed run lasted until its last
    record (:func:`last_records`), as its run page says.
    """
    out: dict[int, tuple[str, Any]] = {}
    for i in range(0, len(running), 500):
        chunk = running[i : i + 500]
        keys = ("heartbeat", "pid", "hostname")
        found = session.execute(
            select(Run.pk, Run.start_time, *(json_item(session, Run.meta, k) for k in keys)).where(Run.pk.in_(chunk))
        )
        crashed = {
            pk: (start, heartbeat)
            for pk, start, heartbeat, pid, host in found
            if shown_status("Running", {"heartbeat": heartbeat, "pid": pid, "hostname": host}) == "Crashed"
        }
        out.update((pk, ("Crashed", end)) for pk, end in last_records(session, crashed).items())
    return out


def last_records(session: Session, runs: dict[int, tuple[Any, Any]]) -> dict[int, str | None]:
    """When each run last recorded anything: its last metric point or its heartbeat, the later.

    Where a Crashed run's time ends, on the runs table and on its run page alike. One query for
    all the runs: each series' last point is found by one probe of the points' primary key from
    the block summaries (no scan). The time is given with a zone when the run's start has one,
    without one when it has none (so that the two can be subtracted).

    Args:
        runs: ``{run pk: (start_time, heartbeat)}``, both ISO 8601 text (or None).

    Returns:
        ``{run pk: ISO time}``, None for a run with neither points nor a readable heartbeat.

    Example:
        >>> last_records(session, {run.pk: (run.start_time, run.meta.get("heartbeat"))})
        {7: '2026-01-02T11:30:00+00:00'}
    """
    found: dict[int, list[datetime]] = {pk: [] for pk in runs}
    pks = list(runs)
    b, pt = MetricBlock, MetricPoint
    for i in range(0, len(pks), 500):
        series = (  # each series' last step, from the block summaries
            select(b.run_pk, b.type, b.name, func.max(b.last_step).label("step"))
            .where(b.run_pk.in_(pks[i : i + 500]))
            .group_by(b.run_pk, b.type, b.name)
            .subquery()
        )
        c = series.c
        at = (pt.run_pk == c.run_pk, pt.type == c.type, pt.name == c.name, pt.step == c.step)  # one key probe
        for pk, t in session.execute(select(c.run_pk, select(pt.time).where(*at).scalar_subquery())):
            if t is not None:
                found[pk].append(datetime.fromtimestamp(t, tz=timezone.utc))
    out: dict[int, str | None] = {}
    for pk, (start, heartbeat) in runs.items():
        beat = _iso(heartbeat)
        times = found[pk] + ([beat if beat.tzinfo else beat.replace(tzinfo=timezone.utc)] if beat else [])
        last = max(times) if times else None
        start_at = _iso(start)
        if last is not None and start_at is not None and start_at.tzinfo is None:
            last = last.astimezone(timezone.utc).replace(tzinfo=None)  # a start without a zone: read as UTC
        out[pk] = None if last is None else last.isoformat()
    return out


def _iso(value: Any) -> datetime | None:
    """ISO 8601 text as a datetime; None for anything else."""
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
