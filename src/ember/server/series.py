"""Downsampled metric series for charts: min and max per bucket, so spikes survive.

A series of at most ``2 * buckets`` points is sent whole. A longer one is cut into about
``buckets`` equal step ranges and each range gives its minimum and its maximum (placed at the
range's first and last step): a one-point spike in a million still shows.

Scanning a million points takes seconds on SQLite, so long series are summarised in blocks of
:data:`BLOCK` steps that each server process keeps in memory (:class:`SeriesCache`). A summary
is brought up to date incrementally: only points at or after the last block already summarised
are read again (an index range scan), and the upload route refreshes it in the background after
each metrics batch, so a chart of a run that was uploaded or is streaming answers from memory.
Medium series (too long to send whole, too short for blocks) are bucketed in one SQL query.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Integer, cast, func, select
from sqlalchemy.orm import Session

from ember.server.models import MetricPoint

BLOCK = 128
"""Steps per cached block: a series spanning fewer than ``buckets * BLOCK`` steps is bucketed in SQL."""
log = logging.getLogger("ember.server")
# One block per name: [first step, last step, min epoch, max epoch, min value, max value, count].
Block = list[Any]


def _bucket_stats() -> tuple[Any, ...]:
    """Per bucket: step range, epoch range, value range (min and max keep spikes), point count."""
    return (
        func.min(MetricPoint.step),
        func.max(MetricPoint.step),
        func.min(MetricPoint.epoch),
        func.max(MetricPoint.epoch),
        func.min(MetricPoint.value),
        func.max(MetricPoint.value),
        func.count(),
    )


@dataclass
class _Summary:
    next_start: int = 0  # the first step of the last block: it is read again on refresh
    names: dict[str, dict[int, Block]] = field(default_factory=dict)


class SeriesCache:
    """Per-process block summaries of long series, keyed by (run id, metric type).

    Example:
        >>> cache = SeriesCache(app.state.sessions)
        >>> cache.touch(run.pk, run.id, "train")      # after a batch: refresh in the background
        >>> cache.series(session, run.pk, run.id, "train", buckets=1000)
    """

    def __init__(self, sessions: Callable[[], Session], max_entries: int = 64) -> None:
        self._sessions = sessions
        self._entries: dict[tuple[str, str], _Summary] = {}
        self._lock = threading.Lock()
        self._max = max_entries
        self._pending: queue.SimpleQueue[tuple[int, str, str]] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None

    def touch(self, run_pk: int, run_id: str, type_: str) -> None:
        """Schedule a background refresh of a run's summary (new points arrived)."""
        self._pending.put((run_pk, run_id, type_))
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._drain, name="ember-series", daemon=True)
            self._worker.start()

    def forget(self, run_id: str) -> None:
        """Drop a deleted run's summaries."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == run_id]:
                del self._entries[key]

    def _drain(self) -> None:
        while True:
            try:
                run_pk, run_id, type_ = self._pending.get(timeout=5)
            except queue.Empty:
                return
            try:
                with self._sessions() as session, session.begin():
                    self.refresh(session, run_pk, run_id, type_)
            except Exception:
                log.exception("refreshing the chart summary of run %s failed", run_id)

    def refresh(self, session: Session, run_pk: int, run_id: str, type_: str) -> _Summary:
        """Bring one summary up to date, reading only points from its last block on."""
        with self._lock:
            summary = self._entries.pop((run_id, type_), None) or _Summary()
            self._entries[(run_id, type_)] = summary  # most recently used last
            while len(self._entries) > self._max:
                del self._entries[next(iter(self._entries))]
            block = cast(MetricPoint.step / BLOCK, Integer).label("block")
            rows = session.execute(
                select(
                    MetricPoint.name,
                    block,
                    *_bucket_stats(),
                )
                .where(MetricPoint.run_pk == run_pk, MetricPoint.type == type_, MetricPoint.step >= summary.next_start)
                .group_by(MetricPoint.name, block)
            ).all()
            for name, b, *values in rows:
                summary.names.setdefault(name, {})[int(b)] = values
            last = max((max(blocks) for blocks in summary.names.values() if blocks), default=None)
            summary.next_start = 0 if last is None else last * BLOCK
            return summary

    def series(self, session: Session, run_pk: int, run_id: str, type_: str, buckets: int = 1000) -> dict[str, Any]:
        """Every metric of a type, each at most about ``2 * buckets`` points.

        Returns:
            ``{"type", "metrics": {name: {"count", "downsampled", "step", "epoch", "value"}}}``;
            NaN and infinities are ``None`` (a gap in the chart).
        """
        summary = self.refresh(session, run_pk, run_id, type_)
        out: dict[str, Any] = {}
        for name in sorted(summary.names):
            blocks = summary.names[name]
            count = sum(b[6] for b in blocks.values())
            if count <= 2 * buckets:
                out[name] = _raw(session, run_pk, type_, name, count)
            elif len(blocks) >= buckets:
                out[name] = _merge(blocks, buckets, count)
            else:
                first = min(blocks) * BLOCK
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
    bucket = cast((MetricPoint.step - lo) / width, Integer).label("bucket")
    rows = session.execute(
        select(
            bucket,
            *_bucket_stats(),
        )
        .where(MetricPoint.run_pk == run_pk, MetricPoint.type == type_, MetricPoint.name == name)
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
