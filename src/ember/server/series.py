"""Downsampled metric series for charts: min and max per bucket, so spikes survive.

A series of at most ``2 * buckets`` points is sent whole. A longer one is cut into about
``buckets`` equal step ranges and each range gives its minimum and its maximum (placed at the
range's first and last step): a one-point spike in a million still shows.

Long series are read from their block summaries (``metric_blocks``: min, max and count per
:data:`~ember.server.models.BLOCK` steps), which ingest writes in the same transaction as the
points. A chart of 3 metrics x 1,000,000 points therefore reads about 23,000 summary rows, the
same on a cold server process as on a warm one, and every server process sees the same data.
Medium series (too long to send whole, spanning too few blocks to fill the buckets) are
bucketed in one SQL query over their points, at most ``buckets * BLOCK`` steps of each.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ember.server import ingest
from ember.server.models import BLOCK, MetricBlock, MetricPoint

# One block: [first step, last step, min epoch, max epoch, min value, max value, count].
Block = list[Any]


def metric_counts(session: Session, run_pk: int) -> list[dict[str, Any]]:
    """Every metric of a run with its number of points and last step, from the block summaries.

    Example:
        >>> metric_counts(session, run.pk)
        [{'type': 'train', 'name': 'loss', 'count': 1000000, 'last_step': 999999}]
    """
    rows = session.execute(
        select(MetricBlock.type, MetricBlock.name, func.sum(MetricBlock.count), func.max(MetricBlock.last_step))
        .where(MetricBlock.run_pk == run_pk)
        .group_by(MetricBlock.type, MetricBlock.name)
        .order_by(MetricBlock.type, MetricBlock.name)
    ).all()
    return [{"type": t, "name": n, "count": int(c), "last_step": int(s)} for t, n, c, s in rows]


class SeriesReader:
    """Chart series of runs, read from the stored block summaries (nothing is kept in memory).

    :meth:`refresh` rebuilds the stored summaries for points written around the API (by hand,
    or by an older server).

    Example:
        >>> series = SeriesReader(app.state.sessions)
        >>> series.series(session, run.pk, run.id, "train", buckets=1000)
    """

    def __init__(self, sessions: Callable[[], Session] | None = None) -> None:
        self._sessions = sessions

    def refresh(self, session: Session, run_pk: int, run_id: str, type_: str) -> None:
        """Summarise a series' points from its last summarised block on, and commit ``session``.

        Ingest keeps the summaries current; this is for points inserted directly into the table.
        """
        last = session.scalar(
            select(func.max(MetricBlock.block)).where(MetricBlock.run_pk == run_pk, MetricBlock.type == type_)
        )
        ingest.summarize(session, run_pk, type_, None, 0 if last is None else int(last) * BLOCK)
        session.commit()

    def series(self, session: Session, run_pk: int, run_id: str, type_: str, buckets: int = 1000) -> dict[str, Any]:
        """Every metric of a type, each at most about ``2 * buckets`` points.

        Returns:
            ``{"type", "metrics": {name: {"count", "downsampled", "step", "epoch", "value"}}}``;
            NaN and infinities are ``None`` (a gap in the chart).
        """
        rows = session.execute(
            select(
                MetricBlock.name,
                MetricBlock.block,
                MetricBlock.first_step,
                MetricBlock.last_step,
                MetricBlock.min_epoch,
                MetricBlock.max_epoch,
                MetricBlock.min_value,
                MetricBlock.max_value,
                MetricBlock.count,
            ).where(MetricBlock.run_pk == run_pk, MetricBlock.type == type_)
        ).all()
        names: dict[str, dict[int, Block]] = {}
        for name, block, *stats in rows:
            names.setdefault(name, {})[int(block)] = stats
        out: dict[str, Any] = {}
        for name in sorted(names):
            blocks = names[name]
            count = sum(b[6] for b in blocks.values())
            if count <= 2 * buckets:
                out[name] = _raw(session, run_pk, type_, name, count)
            elif len(blocks) >= buckets:
                out[name] = _merge(blocks, buckets, count)
            else:
                first = min(b[0] for b in blocks.values())
                last = max(b[1] for b in blocks.values())
                out[name] = _bucketed(session, run_pk, type_, name, first, last, buckets, count)
        return {"type": type_, "metrics": out}


def _raw(session: Session, run_pk: int, type_: str, name: str, count: int) -> dict[str, Any]:
    rows = session.execute(
        select(MetricPoint.step, MetricPoint.epoch, MetricPoint.value)
        .where(MetricPoint.run_pk == run_pk, MetricPoint.type == type_, MetricPoint.name == name)
        .order_by(MetricPoint.step)
    ).all()
    return {
        "count": count,
        "downsampled": False,
        "step": [r[0] for r in rows],
        "epoch": [r[1] for r in rows],
        "value": [_finite(r[2]) for r in rows],
    }


def _bucketed(
    session: Session, run_pk: int, type_: str, name: str, lo: int, hi: int, buckets: int, count: int
) -> dict[str, Any]:
    width = max(1, math.ceil((hi - lo + 1) / buckets))
    bucket = ((MetricPoint.step - lo) // width).label("bucket")
    rows = session.execute(
        select(
            bucket,
            *ingest.point_aggregates(),
        )
        .where(
            MetricPoint.run_pk == run_pk,
            MetricPoint.type == type_,
            MetricPoint.name == name,
            MetricPoint.step.between(lo, hi),
        )
        .group_by(bucket)
        .order_by(bucket)
    ).all()
    return _pairs([list(r[1:]) for r in rows], count)


def _merge(blocks: dict[int, Block], buckets: int, count: int) -> dict[str, Any]:
    keys = sorted(blocks)
    per = math.ceil((keys[-1] - keys[0] + 1) / buckets)
    merged: dict[int, Block] = {}
    for k in keys:
        b = blocks[k]
        m = merged.get((k - keys[0]) // per)
        if m is None:
            merged[(k - keys[0]) // per] = list(b)
            continue
        m[1] = max(m[1], b[1])
        m[2], m[3] = _lo(m[2], b[2]), _hi(m[3], b[3])
        m[4], m[5] = _lo(m[4], b[4]), _hi(m[5], b[5])
        m[6] += b[6]
    return _pairs([merged[k] for k in sorted(merged)], count)


def _lo(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _hi(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _pairs(rows: list[Block], count: int) -> dict[str, Any]:
    """Two points per bucket: its minimum at its first step, its maximum at its last."""
    steps: list[int] = []
    epochs: list[float | None] = []
    values: list[float | None] = []
    for s0, s1, e0, e1, v0, v1, _ in rows:
        steps += [s0, s1]
        epochs += [e0, e1]
        values += [_finite(v0), _finite(v1)]
    return {"count": count, "downsampled": True, "step": steps, "epoch": epochs, "value": values}


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
