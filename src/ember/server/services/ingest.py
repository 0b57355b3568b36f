"""Idempotent writes: metric points and the cursors of every append-only file of a node.

A client sends complete lines of an append-only file together with the byte range they came
from. A cursor is keyed by the node's kind, its id and the file (``("run", id,
"metrics/train.jsonl")``): a run and an artifact never share one. The output log is stored by
:mod:`~ember.server.services.logs`, lineage by :mod:`~ember.server.services.edges`, images by
:mod:`~ember.server.services.run_images`, all through the cursors here. Rows are inserted with
``ON CONFLICT DO NOTHING`` on their natural key, and the file's cursor moves to the end of the
range in the same transaction. Sending a range again (a retry after a cut-off upload) therefore
adds nothing, and a range that starts past the cursor (a gap) is refused with 409 and the
cursor, from which the client sends again.

Metric points are one row per value (what the run listing and downloads query), inserted in one
statement per batch; the same transaction recomputes the block summaries (``metric_blocks``)
of the steps the batch touched, which the charts read (see ``series.py``), and adds what it
stored to the run's counters (``runs.metric_points``, ``runs.metric_names``): a batch that would
take the run past its distinct metrics (``--max-run-metrics``) or its owner past the quota is
refused whole (413), and no check counts the stored points.

Locks, in the order of :mod:`ember.server.services.perms`: the owner's row first when the quota is
checked (the caller's ``blobs.hold``), then the stream's cursor (:func:`lock_cursor`), then the
run's row (:func:`check_metrics`, the counters' update).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Table, and_, case, delete, func, literal, select, text, true, update
from sqlalchemy.orm import Session, aliased

from ember.server.storage.domain_errors import Conflict, Invalid, TooLarge
from ember.server.storage.models import BLOCK, Cursor, MetricBlock, MetricPoint, Run
from ember.server.storage.schemas import Columns, MetricBatch

_NONFINITE = {"NaN": None, "Infinity": math.inf, "-Infinity": -math.inf}


def _dialect_insert(session: Session) -> Callable[..., Any]:
    """The ``insert`` construct with ``ON CONFLICT`` support for the session's database."""
    if session.get_bind().dialect.name == "sqlite":
        from sqlalchemy.dialects import sqlite

        return sqlite.insert
    from sqlalchemy.dialects import postgresql

    return postgresql.insert


def insert_ignore(session: Session, table: Any, rows: list[dict[str, Any]], keys: list[str]) -> None:
    """``INSERT ... ON CONFLICT (keys) DO NOTHING`` for many rows, on SQLite or PostgreSQL."""
    if not rows:
        return
    target: Table = table.__table__
    session.connection().execute(_dialect_insert(session)(target).on_conflict_do_nothing(index_elements=keys), rows)


def cursors(session: Session, kind: str, node_id: str) -> dict[str, int]:
    """Every stream's cursor of a run or artifact: ``{'metrics/train.jsonl': 12345, ...}``."""
    rows = session.execute(
        select(Cursor.stream, Cursor.offset).where(Cursor.node_kind == kind, Cursor.node_id == node_id)
    ).all()
    return {stream: int(offset) for stream, offset in rows}


def _mine(kind: str, node_id: str, stream: str) -> Any:
    return and_(Cursor.node_kind == kind, Cursor.node_id == node_id, Cursor.stream == stream)


def _create(session: Session, kind: str, node_id: str, stream: str) -> None:
    row = {"node_kind": kind, "node_id": node_id, "stream": stream, "offset": 0}
    insert_ignore(session, Cursor, [row], ["node_kind", "node_id", "stream"])


def lock_cursor(session: Session, kind: str, node_id: str, stream: str) -> None:
    """Create a stream's cursor row if missing and lock it until the transaction ends.

    Concurrent uploads of the same stream (on PostgreSQL; SQLite has one writer anyway) then
    take turns, so each sees the cursor the other left and block summaries stay exact.
    """
    _create(session, kind, node_id, stream)
    if session.get_bind().dialect.name != "sqlite":
        session.execute(select(Cursor.id).where(_mine(kind, node_id, stream)).with_for_update())


def check_start(session: Session, kind: str, node_id: str, stream: str, start: int, end: int) -> int:
    """The stream's cursor; 409 when ``start`` lies past it (the client skipped a range)."""
    if end < start:
        raise Invalid(f"{stream}: end {end} is before start {start}")
    current = cursors(session, kind, node_id).get(stream, 0)
    if start > current:
        raise Conflict(
            f"{stream}: the server has bytes up to {current}, this range starts at {start}; resend from {current}"
        )
    return current


def advance(session: Session, kind: str, node_id: str, stream: str, end: int) -> int:
    """Move a cursor forward to ``end`` (never back); return the new value."""
    _create(session, kind, node_id, stream)
    session.execute(
        update(Cursor)
        .where(_mine(kind, node_id, stream))
        .values(offset=case((Cursor.offset < end, end), else_=Cursor.offset))
    )
    return max(cursors(session, kind, node_id)[stream], end)


def drop_cursors(session: Session, kind: str, node_id: str) -> None:
    """Delete the cursors of a run or artifact that is deleted (and only of that kind of node)."""
    session.execute(delete(Cursor).where(Cursor.node_kind == kind, Cursor.node_id == node_id))


def store_metrics(
    session: Session,
    run_pk: int,
    run_id: str,
    batch: MetricBatch,
    max_points: int,
    max_metrics: int | None = None,
    quota: Callable[[int], None] | None = None,
) -> int:
    """Insert a batch of lines of one metric type, refresh the block summaries they touch and
    count what was stored on the run.

    Args:
        session: the request's session, inside its transaction.
        run_pk: the run's primary key; ``run_id`` its id (the cursor's key).
        batch: the lines, as points or columns.
        max_points: the most cells (lines times metric names) one batch may hold (413 above).
        max_metrics: the most distinct metrics (type and name) the run may hold; None: no limit.
        quota: called with the number of points stored, after they are counted, when the batch
            stored any (it raises :class:`TooLarge` past the owner's quota; the caller locked the
            owner before calling this, ``blobs.hold``); None: no quota.

    Returns:
        The file's new cursor.

    Raises:
        TooLarge: 413 past ``max_points``, ``max_metrics`` or the quota; the caller's transaction
            is rolled back, so nothing of the batch is kept.
    """
    stream = f"metrics/{batch.type}.jsonl"
    lock_cursor(session, "run", run_id, stream)
    check_start(session, "run", run_id, stream, batch.start, batch.end)
    cols = batch.columns()
    rows = metric_rows(run_pk, batch.type, cols, max_points)
    if rows:
        new = new_metrics(session, run_pk, batch.type, {row[3] for row in rows})
        if new and max_metrics is not None:
            check_metrics(session, run_pk, run_id, batch.type, len(new), max_metrics)
        stored = insert_points(session, rows)
        summarize(session, run_pk, batch.type, cols.metrics, min(cols.step), max(cols.step))
        count_points(session, run_pk, stored, len(new))
        if stored and quota is not None:
            quota(stored)
    return advance(session, "run", run_id, stream, batch.end)


_HELD_SQLITE = text(
    "SELECT w.value FROM json_each(:names) AS w WHERE EXISTS (SELECT 1 FROM metric_points p "
    "WHERE p.run_pk = :pk AND p.type = :type AND p.name = w.value)"
)
_HELD_POSTGRESQL = text(
    "SELECT w FROM unnest(CAST(:names AS text[])) AS w WHERE EXISTS (SELECT 1 FROM metric_points p "
    "WHERE p.run_pk = :pk AND p.type = :type AND p.name = w)"
)


_COUNT = text(
    "UPDATE runs SET metric_points = metric_points + :points, metric_names = metric_names + :names WHERE pk = :pk"
)


def new_metrics(session: Session, run_pk: int, type_: str, names: set[str]) -> set[str]:
    """Those of ``names`` the run holds no point of in ``type_`` (one key look-up each, in one
    statement whose text is the same for any names: no SQL is built per batch)."""
    wanted = sorted(names)
    if session.get_bind().dialect.name == "sqlite":
        held = session.scalars(_HELD_SQLITE, {"names": json.dumps(wanted), "pk": run_pk, "type": type_})
    else:
        held = session.scalars(_HELD_POSTGRESQL, {"names": wanted, "pk": run_pk, "type": type_})
    return names - set(held)


def check_metrics(session: Session, run_pk: int, run_id: str, type_: str, new: int, limit: int) -> None:
    """413 when ``new`` more distinct metrics take the run past ``limit`` (its row is locked until
    commit on PostgreSQL, so two types' batches cannot both pass)."""
    query = select(Run.metric_names).where(Run.pk == run_pk)
    if session.get_bind().dialect.name != "sqlite":
        query = query.with_for_update()
    held = int(session.scalar(query) or 0)
    if held + new > limit:
        raise TooLarge(
            f"run {run_id}: {new} new {type_} metrics would make {held + new} distinct metrics, over the server's "
            f"limit of {limit} per run: log fewer names (per-item values belong in an artifact), or ask an admin to "
            "raise `ember server --max-run-metrics`"
        )


def count_points(session: Session, run_pk: int, points: int, names: int) -> None:
    """Add stored points and new distinct metrics to the run's counters (one atomic update)."""
    if points or names:
        session.execute(_COUNT, {"points": points, "names": names, "pk": run_pk})


def metric_rows(run_pk: int, type_: str, cols: Columns, max_points: int) -> list[tuple[Any, ...]]:
    """The ``metric_points`` rows of a batch's columns (``_POINT_COLUMNS`` order; NaN as NULL, missing values left out).

    Raises:
        TooLarge: 413 when the batch holds more than ``max_points`` cells (lines times metrics).
    """
    cells = len(cols.step) * len(cols.metrics)
    if cells > max_points:
        raise TooLarge(
            f"{len(cols.step)} lines x {len(cols.metrics)} metrics in one request; the server takes at most "
            f"{max_points} values: send fewer lines per batch",
        )
    return [
        (run_pk, type_, step, name, epoch, time, _stored(value))
        for name, column in cols.metrics.items()
        for step, epoch, time, value in zip(cols.step, cols.epoch, cols.time, column, strict=True)
        if value is not None
    ]


def _stored(value: float | str) -> float | None:
    """A sent value as the column stores it: NaN as NULL, the strings as floats."""
    if value.__class__ is float:
        return value if value == value else None
    return _NONFINITE[value]  # type: ignore[index]


_POINT_COLUMNS = "run_pk, type, step, name, epoch, time, value"


def insert_points(session: Session, rows: list[tuple[Any, ...]]) -> int:
    """Insert points of one run and type (tuples in ``_POINT_COLUMNS`` order), skipping those already
    stored; how many were stored.

    SQLite gets one ``executemany`` of the tuples; PostgreSQL one statement that unnests
    arrays sent in binary (a single round trip, no per-row statement, no text to parse).
    """
    connection = session.connection()
    on_conflict = "ON CONFLICT (run_pk, type, step, name) DO NOTHING"
    if connection.dialect.name == "sqlite":
        done = connection.exec_driver_sql(
            f"INSERT INTO metric_points ({_POINT_COLUMNS}) VALUES (?,?,?,?,?,?,?) {on_conflict}", rows
        )
        return int(done.rowcount)
    _, _, steps, names, epochs, times, stored = (list(part) for part in zip(*rows, strict=True))
    done = connection.exec_driver_sql(
        f"INSERT INTO metric_points ({_POINT_COLUMNS}) SELECT %(run_pk)s, %(type)s, * FROM unnest("
        "%(step)b::bigint[], %(name)b::text[], %(epoch)b::float8[], %(time)b::float8[], %(value)b::float8[]) "
        f"{on_conflict}",
        {
            "run_pk": rows[0][0],
            "type": rows[0][1],
            "step": steps,
            "name": names,
            "epoch": epochs,
            "time": times,
            "value": stored,
        },
    )
    return int(done.rowcount)


def extremes(where: Iterable[Any], group: Callable[[Any], Any], *lead: Any) -> Any:
    """Per metric and group of points: what a block summary and a chart bucket keep of them.

    The select's columns: ``*lead``, name, group, first/last step, min/max epoch, min/max value,
    count, then the step, epoch and time of the first point holding the minimum, and the same of
    the maximum (NULL when every value is NaN), so a chart draws each extreme where it happened
    without reading the points again. ``where``: conditions on the points; ``group(step)``: a
    point's group.
    """
    p = MetricPoint
    grp = group(p.step).label("grp")
    stats = (
        select(
            p.run_pk,
            p.type,
            p.name,
            grp,
            func.min(p.step).label("first"),
            func.max(p.step).label("last"),
            func.min(p.epoch).label("min_epoch"),
            func.max(p.epoch).label("max_epoch"),
            func.min(p.value).label("lo"),
            func.max(p.value).label("hi"),
            func.count().label("count"),
        )
        .where(*where)
        .group_by(p.run_pk, p.type, p.name, grp)
        .subquery()
    )
    c = stats.c
    q = aliased(MetricPoint)

    def first_holding(value: Any) -> Any:  # one key range of the group's points
        return (
            select(func.min(q.step))
            .where(q.run_pk == c.run_pk, q.type == c.type, q.name == c.name)
            .where(q.step.between(c.first, c.last), q.value == value)
            .scalar_subquery()
        )

    found = select(stats, first_holding(c.lo).label("at_lo"), first_holding(c.hi).label("at_hi")).subquery()
    d, lo, hi = found.c, aliased(MetricPoint), aliased(MetricPoint)

    def point_at(point: Any, step: Any) -> Any:  # the extreme's point, by key
        return and_(point.run_pk == d.run_pk, point.type == d.type, point.name == d.name, point.step == step)

    return (
        select(
            *lead,
            d.name,
            d.grp,
            d.first,
            d.last,
            d.min_epoch,
            d.max_epoch,
            d.lo,
            d.hi,
            d.count,
            d.at_lo,
            lo.epoch,
            lo.time,
            d.at_hi,
            hi.epoch,
            hi.time,
        )
        .select_from(found.outerjoin(lo, point_at(lo, d.at_lo)).outerjoin(hi, point_at(hi, d.at_hi)))
        .where(true())  # SQLite parses INSERT ... SELECT ... FROM t ON CONFLICT only with a WHERE
    )


def summarize(
    session: Session,
    run_pk: int,
    type_: str,
    names: Iterable[str] | None,
    first_step: int,
    last_step: int | None = None,
) -> None:
    """Recompute the :class:`MetricBlock` rows of every block holding a step in ``first_step..last_step``.

    Recomputed from the stored points rather than added to, so sending a batch twice (or two
    batches sharing a block) leaves exact summaries. ``names``: the metrics to summarise (each
    one range of the points' key); ``None`` for all of the type's. ``last_step=None``: to the end.
    """
    where = [MetricPoint.run_pk == run_pk, MetricPoint.type == type_, MetricPoint.step >= first_step // BLOCK * BLOCK]
    if names is not None:
        where.append(MetricPoint.name.in_(list(names)))
    if last_step is not None:
        where.append(MetricPoint.step < (last_step // BLOCK + 1) * BLOCK)
    summary = extremes(where, lambda step: step // BLOCK, literal(run_pk), literal(type_))
    keys = ["run_pk", "type", "name", "block"]
    stats = ["first_step", "last_step", "min_epoch", "max_epoch", "min_value", "max_value", "count"]
    stats += ["min_at_step", "min_at_epoch", "min_at_time", "max_at_step", "max_at_epoch", "max_at_time"]
    insert = _dialect_insert(session)(MetricBlock).from_select(keys + stats, summary)
    session.execute(insert.on_conflict_do_update(index_elements=keys, set_={c: insert.excluded[c] for c in stats}))


def encode_value(value: float | None) -> float | str:
    """A stored value as the local store writes it (NaN and infinities as strings)."""
    if value is None:
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value
