"""Downsampled metric series for charts: min and max per bucket, so spikes survive.

A series of at most ``2 * buckets`` points is sent whole. A longer one is cut into about
``buckets`` equal step ranges and each range gives its minimum and its maximum, each at the exact
step (epoch, time) of the first point holding it: a one-point spike in a million still shows,
where it happened. ``start``/``end`` narrow the series to a step range (a zoomed chart asks
again for its visible range, and gets it finer: whole once few enough points are in it).

Long series are read from their block summaries (``metric_blocks``: min, max, the points holding
them and count per :data:`~ember.server.storage.models.BLOCK` steps), which ingest writes in the same
transaction as the points. A chart of 3 metrics x 1,000,000 points therefore reads about 23,000
summary rows and no point, the same on a cold server process as on a warm one, and every server
process sees the same data. A range (a zoomed chart) is answered the same way: the blocks
inside it from their summaries, and the points of the two blocks it cuts at its ends (at most
``BLOCK`` each) read raw. Points are read otherwise only when few: a range of at most
``2 * buckets`` points is sent whole, one of at most :data:`RAW_POINTS` is bucketed exactly in
SQL over its points; past that, each bucket is one or more whole blocks (a range spanning fewer
blocks than ``buckets`` gets a bucket per block). ``buckets`` is at most :data:`MAX_BUCKETS`.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ember.server.services import codec, ingest
from ember.server.storage.models import BLOCK, MetricBlock, MetricPoint

MAX_BUCKETS = 4_000
"""The most buckets a request may ask for (a chart is a few thousand pixels wide)."""
RAW_POINTS = 16_384
"""The most points of one series a request reads to bucket them exactly; past it, blocks are buckets."""

# One block or bucket: [first step, last step, min epoch, max epoch, min value, max value, count,
# then the step, epoch and time of the first point holding the min, and the same of the max].
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


COMPARE_IDS = 100
"""Runs in one ``/ui/compare/series`` request (:meth:`SeriesReader.series_json_many`): the compare page asks
for 500 runs in 5 requests."""
KEEP_BYTES = 64 << 20
"""The last answers' JSON kept per server process, at most this many bytes: a compare page of 500
runs x 2 metric types (100 points a metric) or 250 run pages of 3 x 1,000,000 points. Kept by
bytes, not by count: before, 64 answers, and a 60-run compare page (120 answers) read every one
again at each view."""


_VERSION = (func.count(), func.sum(MetricBlock.count), func.max(MetricBlock.last_step))
"""What a series' blocks hold (blocks, points, last step): any new point changes it."""


class SeriesReader:
    """Chart series of runs, read from the stored block summaries (nothing is kept in memory).

    :meth:`refresh` rebuilds the stored summaries for points written around the API (by hand,
    or by an older server).

    Example:
        >>> series = SeriesReader(app.state.sessions)
        >>> series.series(session, run.pk, run.id, "train", buckets=1000)
    """

    def __init__(self, sessions: Callable[[], Session] | None = None, keep_bytes: int = KEEP_BYTES) -> None:
        self._sessions = sessions
        self._keep_bytes = keep_bytes
        self._kept_bytes = 0
        self._answers: OrderedDict[tuple[Any, ...], tuple[Any, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def refresh(self, session: Session, run_pk: int, run_id: str, type_: str) -> None:
        """Summarise a series' points from its last summarised block on, and commit ``session``.

        Ingest keeps the summaries current; this is for points inserted directly into the table.
        """
        last = session.scalar(
            select(func.max(MetricBlock.block)).where(MetricBlock.run_pk == run_pk, MetricBlock.type == type_)
        )
        ingest.summarize(session, run_pk, type_, None, 0 if last is None else int(last) * BLOCK)
        session.commit()

    def series(
        self,
        session: Session,
        run_pk: int,
        run_id: str,
        type_: str,
        buckets: int = 1000,
        start: int | None = None,
        end: int | None = None,
    ) -> dict[str, Any]:
        """Every metric of a type, each at most about ``2 * buckets`` points.

        The last answers are kept in memory with what their blocks held (count, last step,
        number of blocks: any new point changes one), so a page viewed again, by anyone, costs
        one small query; a series that grows is read again.

        Args:
            start, end: only the steps in ``start..end`` (both included; None: unbounded).

        Returns:
            ``{"type", "metrics": {name: {"count", "downsampled", "step", "epoch", "time",
            "value", "nonfinite"}}}``; ``count``: the points in the range. NaN and infinities are
            ``None`` in ``value`` (a gap in the chart) and listed in ``nonfinite`` as ``[step,
            "NaN" | "Infinity" | "-Infinity"]`` (every one for a series sent whole; the infinite
            extremes of a downsampled one).
        """
        answer: dict[str, Any] = json.loads(self._kept(session, run_pk, type_, buckets, start, end))
        return answer

    def series_json(
        self,
        session: Session,
        run_pk: int,
        type_: str,
        head: dict[str, Any],
        buckets: int = 1000,
        start: int | None = None,
        end: int | None = None,
    ) -> bytes:
        """:meth:`series` as JSON, with ``head``'s keys first (``{"id": ..., "status": ...}``).

        The series' JSON is kept with the answer: encoding 3 x 2,000 points costs more than the
        rest of a repeated request.
        """
        body = self._kept(session, run_pk, type_, buckets, start, end)
        return codec.encode(head)[:-1] + b"," + body[1:] if head else body

    def series_json_many(
        self, session: Session, type_: str, heads: dict[int, dict[str, Any]], buckets: int = 1000
    ) -> dict[int, bytes]:
        """:meth:`series_json` of many runs (by primary key), whole: what a compare page draws.

        The kept answers are checked against their blocks with one query for all the runs, not one a run.
        """
        found = session.execute(
            select(MetricBlock.run_pk, *_VERSION)
            .where(MetricBlock.run_pk.in_(list(heads)), MetricBlock.type == type_)
            .group_by(MetricBlock.run_pk)
        ).all()
        versions = {int(pk): tuple(version) for pk, *version in found}
        out = {}
        for pk, head in heads.items():
            body = self._kept(session, pk, type_, buckets, None, None, versions.get(pk, (0, None, None)))
            out[pk] = codec.encode(head)[:-1] + b"," + body[1:] if head else body
        return out

    def _kept(
        self,
        session: Session,
        run_pk: int,
        type_: str,
        buckets: int,
        start: int | None,
        end: int | None,
        version: tuple[Any, ...] | None = None,
    ) -> bytes:
        """The answer's JSON, kept while ``version`` (what the series' blocks hold; read when None) is unchanged."""
        if version is None:
            where = (MetricBlock.run_pk == run_pk, MetricBlock.type == type_)
            version = tuple(session.execute(select(*_VERSION).where(*where)).one())
        key = (run_pk, type_, buckets, start, end)
        with self._lock:
            kept = self._answers.get(key)
            if kept is not None and kept[0] == version:
                self._answers.move_to_end(key)
                return kept[1]
        body = codec.encode(self._read(session, run_pk, type_, buckets, start, end))
        with self._lock:
            old = self._answers.pop(key, None)
            self._kept_bytes += len(body) - (len(old[1]) if old else 0)
            self._answers[key] = (version, body)
            while self._kept_bytes > self._keep_bytes and len(self._answers) > 1:
                self._kept_bytes -= len(self._answers.popitem(last=False)[1][1])
        return body

    def _read(
        self, session: Session, run_pk: int, type_: str, buckets: int, start: int | None, end: int | None
    ) -> dict[str, Any]:
        lo, hi = -1 if start is None else start, 2**62 if end is None else end
        query = select(
            MetricBlock.name,
            MetricBlock.block,
            MetricBlock.first_step,
            MetricBlock.last_step,
            MetricBlock.min_epoch,
            MetricBlock.max_epoch,
            MetricBlock.min_value,
            MetricBlock.max_value,
            MetricBlock.count,
            MetricBlock.min_at_step,
            MetricBlock.min_at_epoch,
            MetricBlock.min_at_time,
            MetricBlock.max_at_step,
            MetricBlock.max_at_epoch,
            MetricBlock.max_at_time,
        ).where(MetricBlock.run_pk == run_pk, MetricBlock.type == type_)
        if start is not None or end is not None:
            query = query.where(MetricBlock.last_step >= lo, MetricBlock.first_step <= hi)
        names: dict[str, dict[int, Block]] = {}
        for name, block, *stats in session.connection().execute(query).all():  # Core: no ORM rows
            names.setdefault(name, {})[int(block)] = stats
        out: dict[str, Any] = {}
        key = (run_pk, type_)
        for name in sorted(names):
            blocks = names[name]
            inner = {k: b for k, b in blocks.items() if lo <= b[0] and b[1] <= hi}
            # The blocks the range cuts (one at each end at most): their points in the range, read raw.
            cut: dict[int, Block] = {}
            for k, b in blocks.items():
                edge = None if k in inner else _summary(_edge(session, key, name, max(lo, b[0]), min(hi, b[1])))
                if edge is not None:
                    cut[k] = edge
            count = sum(b[6] for b in inner.values()) + sum(b[6] for b in cut.values())
            first = min(b[0] for b in (*inner.values(), *cut.values())) if count else lo
            last = max(b[1] for b in (*inner.values(), *cut.values())) if count else lo
            if count <= 2 * buckets:
                out[name] = _raw(session, key, name, lo, hi, count)
            elif count <= RAW_POINTS:
                out[name] = _bucketed(session, key, name, first, last, buckets, count)
            else:
                ends = sorted(cut)
                head = [cut[k] for k in ends if not inner or k < min(inner)]
                tail = [cut[k] for k in ends if inner and k > max(inner)]
                merged = _merge(inner, max(1, buckets - len(head) - len(tail))) if inner else []
                out[name] = _exact([*head, *merged, *tail], count)
        return {"type": type_, "metrics": out}


def _points(key: tuple[int, str], name: str, lo: int, hi: int) -> Any:
    """The select of one series' points in ``lo..hi``."""
    point = MetricPoint
    return select(point.step).where(
        point.run_pk == key[0], point.type == key[1], point.name == name, point.step.between(lo, hi)
    )


def _edge(session: Session, key: tuple[int, str], name: str, lo: int, hi: int) -> list[Any]:
    """The points of one series in ``lo..hi`` (a block the range cuts: at most ``BLOCK`` of them)."""
    if hi < lo:
        return []
    return list(
        session.execute(
            _points(key, name, lo, hi)
            .add_columns(MetricPoint.epoch, MetricPoint.time, MetricPoint.value)
            .order_by(MetricPoint.step)
        ).all()
    )


def _summary(points: list[Any]) -> Block | None:
    """A :data:`Block` of points ``(step, epoch, time, value)`` in step order (None when there are none)."""
    if not points:
        return None
    epochs = [p[1] for p in points if p[1] is not None]
    valued = [p for p in points if p[3] is not None]
    low = min(valued, key=lambda p: p[3]) if valued else None  # min/max keep the first point holding it
    high = max(valued, key=lambda p: p[3]) if valued else None
    return [
        points[0][0],
        points[-1][0],
        min(epochs) if epochs else None,
        max(epochs) if epochs else None,
        low[3] if low else None,
        high[3] if high else None,
        len(points),
        *(low[:3] if low else (None, None, None)),
        *(high[:3] if high else (None, None, None)),
    ]


def _raw(session: Session, key: tuple[int, str], name: str, lo: int, hi: int, count: int) -> dict[str, Any]:
    rows = session.execute(
        _points(key, name, lo, hi)
        .add_columns(MetricPoint.epoch, MetricPoint.time, MetricPoint.value)
        .order_by(MetricPoint.step)
    ).all()
    return {
        "count": count,
        "downsampled": False,
        "step": [r[0] for r in rows],
        "epoch": [r[1] for r in rows],
        "time": [r[2] for r in rows],
        "value": [_finite(r[3]) for r in rows],
        "nonfinite": [[r[0], _name(r[3])] for r in rows if _finite(r[3]) is None],
    }


def _bucketed(
    session: Session, key: tuple[int, str], name: str, lo: int, hi: int, buckets: int, count: int
) -> dict[str, Any]:
    run_pk, type_ = key
    width = max(1, math.ceil((hi - lo + 1) / buckets))
    where = [
        MetricPoint.run_pk == run_pk,
        MetricPoint.type == type_,
        MetricPoint.name == name,
        MetricPoint.step.between(lo, hi),
    ]
    rows = session.connection().execute(ingest.extremes(where, lambda step: (step - lo) // width)).all()
    return _exact([list(r[2:]) for r in sorted(rows, key=lambda r: r[1])], count)


def _merge(blocks: dict[int, Block], buckets: int) -> list[Block]:
    keys = sorted(blocks)
    per = math.ceil((keys[-1] - keys[0] + 1) / buckets)
    merged: dict[int, Block] = {}
    for k in keys:  # in step order: on a tie, the earlier block keeps the extreme
        b = blocks[k]
        m = merged.get((k - keys[0]) // per)
        if m is None:
            merged[(k - keys[0]) // per] = list(b)
            continue
        m[1] = max(m[1], b[1])
        m[2], m[3] = _lo(m[2], b[2]), _hi(m[3], b[3])
        if b[4] is not None and (m[4] is None or b[4] < m[4]):
            m[4], m[7:10] = b[4], b[7:10]
        if b[5] is not None and (m[5] is None or b[5] > m[5]):
            m[5], m[10:13] = b[5], b[10:13]
        m[6] += b[6]
    return [merged[k] for k in sorted(merged)]


def _lo(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _hi(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _exact(rows: list[Block], count: int) -> dict[str, Any]:
    """Two points per bucket, its minimum and its maximum, each at the first point holding it.

    ``rows``: blocks (or SQL buckets) in step order, each with where its extremes are.
    """
    points: list[tuple[int, float | None, float | None, float | None]] = []
    for s0, _s1, e0, _e1, v0, v1, _, *at in rows:
        pair = {(at[0], at[1], at[2], v0), (at[3], at[4], at[5], v1)}
        points += sorted(p for p in pair if p[0] is not None) or [(s0, e0, None, None)]  # all NaN: a gap
    return {
        "count": count,
        "downsampled": True,
        "step": [p[0] for p in points],
        "epoch": [p[1] for p in points],
        "time": [p[2] for p in points],
        "value": [_finite(p[3]) for p in points],
        "nonfinite": [[p[0], _name(p[3])] for p in points if p[3] is not None and not math.isfinite(p[3])],
    }


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _name(value: float | None) -> str:
    """How JSON-ish text names a value that is not finite (NULL is a stored NaN)."""
    return "NaN" if value is None or math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
