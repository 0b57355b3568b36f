"""Idempotent writes: metric points, log chunks and lineage edges, each with its cursor.

A client sends complete lines of an append-only file together with the byte range they came
from. Rows are inserted with ``ON CONFLICT DO NOTHING`` on their natural key, and the file's
cursor moves to the end of the range in the same transaction. Sending a range again (a retry
after a cut-off upload) therefore adds nothing, and a range that starts past the cursor (a gap)
is refused with 409 and the cursor, from which the client sends again.

Metric points are one row per value (what the run listing and downloads query), inserted in one
statement per batch; the same transaction recomputes the block summaries (``metric_blocks``)
of the steps the batch touched, which the charts read (see ``series.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Table, and_, case, func, literal, select, true, update
from sqlalchemy.orm import Session, aliased

from ember.server import naming
from ember.server.domain_errors import Conflict, Invalid, TooLarge
from ember.server.models import BLOCK, Artifact, Cursor, Edge, LogChunk, MetricBlock, MetricPoint, Run, User
from ember.server.perms import Level, level
from ember.server.schemas import Columns, EdgeIn, MetricBatch

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


def cursors(session: Session, node_id: str) -> dict[str, int]:
    """Every stream's cursor of a run or artifact: ``{'metrics/train.jsonl': 12345, ...}``."""
    rows = session.execute(select(Cursor.stream, Cursor.offset).where(Cursor.node_id == node_id)).all()
    return {stream: int(offset) for stream, offset in rows}


def lock_cursor(session: Session, node_id: str, stream: str) -> None:
    """Create a stream's cursor row if missing and lock it until the transaction ends.

    Concurrent uploads of the same stream (on PostgreSQL; SQLite has one writer anyway) then
    take turns, so each sees the cursor the other left and block summaries stay exact.
    """
    insert_ignore(session, Cursor, [{"node_id": node_id, "stream": stream, "offset": 0}], ["node_id", "stream"])
    if session.get_bind().dialect.name != "sqlite":
        session.execute(select(Cursor.id).where(Cursor.node_id == node_id, Cursor.stream == stream).with_for_update())


def check_start(session: Session, node_id: str, stream: str, start: int, end: int) -> int:
    """The stream's cursor; 409 when ``start`` lies past it (the client skipped a range)."""
    if end < start:
        raise Invalid(f"{stream}: end {end} is before start {start}")
    current = cursors(session, node_id).get(stream, 0)
    if start > current:
        raise Conflict(
            f"{stream}: the server has bytes up to {current}, this range starts at {start}; resend from {current}"
        )
    return current


def advance(session: Session, node_id: str, stream: str, end: int) -> int:
    """Move a cursor forward to ``end`` (never back); return the new value."""
    insert_ignore(session, Cursor, [{"node_id": node_id, "stream": stream, "offset": 0}], ["node_id", "stream"])
    session.execute(
        update(Cursor)
        .where(Cursor.node_id == node_id, Cursor.stream == stream)
        .values(offset=case((Cursor.offset < end, end), else_=Cursor.offset))
    )
    return max(cursors(session, node_id)[stream], end)


def store_metrics(session: Session, run_pk: int, run_id: str, batch: MetricBatch, max_points: int) -> int:
    """Insert a batch of lines of one metric type, and refresh the block summaries they touch.

    Args:
        session: the request's session, inside its transaction.
        run_pk: the run's primary key; ``run_id`` its id (the cursor's key).
        batch: the lines, as points or columns.
        max_points: the most cells (lines times metric names) one batch may hold (413 above).

    Returns:
        The file's new cursor.
    """
    stream = f"metrics/{batch.type}.jsonl"
    lock_cursor(session, run_id, stream)
    check_start(session, run_id, stream, batch.start, batch.end)
    cols = batch.columns()
    rows = metric_rows(run_pk, batch.type, cols, max_points)
    if rows:
        insert_points(session, rows)
        summarize(session, run_pk, batch.type, cols.metrics, min(cols.step), max(cols.step))
    return advance(session, run_id, stream, batch.end)


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


def insert_points(session: Session, rows: list[tuple[Any, ...]]) -> None:
    """Insert points of one run and type (tuples in ``_POINT_COLUMNS`` order), skipping those already stored.

    SQLite gets one ``executemany`` of the tuples; PostgreSQL one statement that unnests
    arrays sent in binary (a single round trip, no per-row statement, no text to parse).
    """
    connection = session.connection()
    on_conflict = "ON CONFLICT (run_pk, type, step, name) DO NOTHING"
    if connection.dialect.name == "sqlite":
        connection.exec_driver_sql(
            f"INSERT INTO metric_points ({_POINT_COLUMNS}) VALUES (?,?,?,?,?,?,?) {on_conflict}", rows
        )
        return
    _, _, steps, names, epochs, times, values = (list(column) for column in zip(*rows, strict=True))
    connection.exec_driver_sql(
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
            "value": values,
        },
    )


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


def store_log(session: Session, run_pk: int, run_id: str, start: int, end: int, text: str) -> int:
    """Store the text of bytes ``start``..``end`` of stdout.log; return the new cursor."""
    current = check_start(session, run_id, "stdout.log", start, end)
    if end <= current or not text:
        return current
    if start < current:
        raise Conflict(
            f"stdout.log: the server has bytes up to {current}; send the text from byte {current}, not {start}"
        )
    insert_ignore(
        session, LogChunk, [{"run_pk": run_pk, "start": start, "end": end, "text": text}], ["run_pk", "start"]
    )
    return advance(session, run_id, "stdout.log", end)


def read_log(session: Session, run_pk: int, offset: int = 0) -> str:
    """The stored stdout.log text from byte ``offset`` (whole chunks)."""
    chunks = session.scalars(
        select(LogChunk.text).where(LogChunk.run_pk == run_pk, LogChunk.end > offset).order_by(LogChunk.start)
    ).all()
    return "".join(chunks)


def store_edges(session: Session, node_id: str, edges: list[EdgeIn], start: int, end: int) -> int:
    """Insert lineage edges read from a node's ``lineage.jsonl``; each must touch that node."""
    check_start(session, node_id, "lineage.jsonl", start, end)
    insert_ignore(session, Edge, edge_rows(node_id, edges), ["source_id", "target_id"])
    return advance(session, node_id, "lineage.jsonl", end)


def edge_rows(node_id: str, edges: list[EdgeIn]) -> list[dict[str, Any]]:
    """The ``edges`` rows of lineage lines sent for a node (422 for a bad id or an edge not touching it)."""
    rows = []
    for edge in edges:
        naming.node_id(edge.source.id, "lineage source id")
        naming.node_id(edge.target.id, "lineage target id")
        if node_id not in (edge.source.id, edge.target.id):
            raise Invalid(f"a lineage edge sent for {node_id} must have it as its source or target")
        rows.append(
            {
                "source_kind": edge.source.kind,
                "source_id": edge.source.id,
                "source_name": edge.source.name[:100],
                "target_kind": edge.target.kind,
                "target_id": edge.target.id,
                "target_name": edge.target.name[:100],
                "time": edge.time,
            }
        )
    return rows


def edges_of(session: Session, node_id: str, user: User) -> list[dict[str, Any]]:
    """The lineage edges a node takes part in, oldest first, as ``user`` may see them.

    An end the user cannot view is given exactly as one that was never uploaded: its kind and
    id (which the edge's writer sent), no name, ``visible: false``. So the graph tells nobody
    whether a private run or artifact exists, nor its name.
    """
    rows = session.scalars(
        select(Edge).where((Edge.source_id == node_id) | (Edge.target_id == node_id)).order_by(Edge.time, Edge.id)
    ).all()
    names: dict[str, str | None] = {}

    def end(kind: str, id_: str) -> dict[str, Any]:
        if id_ not in names:
            names[id_] = _viewable_name(session, user, kind, id_)
        name = names[id_]
        return {"kind": kind, "id": id_, "name": name or "", "visible": name is not None}

    return [
        {
            "time": e.time,
            "source": end(e.source_kind, e.source_id),
            "target": end(e.target_kind, e.target_id),
        }
        for e in rows
    ]


def _viewable_name(session: Session, user: User, kind: str, node_id: str) -> str | None:
    """A run's or artifact's name when it is on the server and ``user`` may view it, else None."""
    node: Run | Artifact | None
    if kind == "run":
        node = session.scalar(select(Run).where(Run.id == node_id))
    else:
        node = session.scalar(select(Artifact).where(Artifact.id == node_id))
    if node is None or level(session, user, node) < Level.VIEW:
        return None
    return str(node.name)


def encode_value(value: float | None) -> float | str:
    """A stored value as the local store writes it (NaN and infinities as strings)."""
    if value is None:
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value
