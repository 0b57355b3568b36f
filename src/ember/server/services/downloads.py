"""Every point of a metric type as CSV or JSON, streamed in constant memory.

A download of a million points used to read them all into one list (840 MB of server memory).
Here each metric's series is read in key order a few thousand rows at a time, each batch in a
short transaction of its own (so a slow download never holds SQLite's lock), and the series are
merged by step as the answer is written. Memory stays at a few batches whatever the run's size.

Example:
    >>> StreamingResponse(csv_text(app.state.sessions, run.pk, "train"), media_type="text/csv")
"""

from __future__ import annotations

import csv
import heapq
import io
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ember.server.services import codec
from ember.server.services.ingest import encode_value
from ember.server.storage.models import MetricBlock, MetricPoint

BATCH = 5_000
"""Rows read per query (per metric) and points written per piece of the answer."""

# One point: (step, name, epoch, time, value).
Point = tuple[int, str, Any, float, Any]


def _names(sessions: Callable[[], Session], run_pk: int, type_: str) -> list[str]:
    # The block summaries name every series (ingest writes them with the points): no point scan.
    with sessions() as session, session.begin():
        found = session.scalars(
            select(MetricBlock.name).where(MetricBlock.run_pk == run_pk, MetricBlock.type == type_).distinct()
        )
        return sorted(found)


def _series(sessions: Callable[[], Session], run_pk: int, type_: str, name: str) -> Iterator[Point]:
    """One metric's points in step order, one range of the points' primary key per query."""
    after = -1  # steps are >= 0
    while True:
        with sessions() as session, session.begin():
            rows = session.execute(
                select(MetricPoint.step, MetricPoint.epoch, MetricPoint.time, MetricPoint.value)
                .where(
                    MetricPoint.run_pk == run_pk,
                    MetricPoint.type == type_,
                    MetricPoint.name == name,
                    MetricPoint.step > after,
                )
                .order_by(MetricPoint.step)
                .limit(BATCH)
            ).all()
        for step, epoch, time, value in rows:
            yield step, name, epoch, time, value
        if len(rows) < BATCH:
            return
        after = rows[-1][0]


def points(sessions: Callable[[], Session], run_pk: int, type_: str) -> Iterator[Point]:
    """Every point of a run's metric type, ordered by step, then name."""
    series = [_series(sessions, run_pk, type_, name) for name in _names(sessions, run_pk, type_)]
    return heapq.merge(*series, key=lambda p: (p[0], p[1]))


def csv_text(sessions: Callable[[], Session], run_pk: int, type_: str) -> Iterator[str]:
    """The points as CSV (``step,epoch,time,name,value``), a few thousand lines per piece."""
    yield "step,epoch,time,name,value\n"
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for count, (step, name, epoch, time, value) in enumerate(points(sessions, run_pk, type_), 1):
        writer.writerow((step, "" if epoch is None else epoch, time, name, encode_value(value)))
        if count % BATCH == 0:
            yield codec.safe(out.getvalue())
            out.seek(0)
            out.truncate()
    yield codec.safe(out.getvalue())


def json_text(sessions: Callable[[], Session], run_pk: int, type_: str) -> Iterator[str]:
    """``{"type", "points": [{"step", "epoch", "time", "metrics"}...]}``, as the local store writes them."""
    yield codec.dumps({"type": type_})[:-1] + ',"points":['
    pieces: list[str] = []
    current: dict[str, Any] | None = None
    for step, name, epoch, time, value in points(sessions, run_pk, type_):
        if current is None or current["step"] != step:
            if current is not None:
                pieces.append(codec.dumps(current))
                if len(pieces) >= BATCH:
                    yield ",".join(pieces) + ","
                    pieces.clear()
            current = {"step": step, "epoch": epoch, "time": time, "metrics": {}}
        current["metrics"][name] = encode_value(value)
    if current is not None:
        pieces.append(codec.dumps(current))
    yield ",".join(pieces) + "]}"
