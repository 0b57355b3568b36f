"""Idempotent writes: metric points, log chunks and lineage edges, each with its cursor.

A client sends complete lines of an append-only file together with the byte range they came
from. Rows are inserted with ``ON CONFLICT DO NOTHING`` on their natural key, and the file's
cursor moves to the end of the range in the same transaction. Sending a range again (a retry
after a cut-off upload) therefore adds nothing, and a range that starts past the cursor (a gap)
is refused with 409 and the cursor, from which the client sends again.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import HTTPException
from sqlalchemy import Table, case, select, update
from sqlalchemy.orm import Session

from ember.server import naming
from ember.server.models import Cursor, Edge, LogChunk, MetricPoint
from ember.server.schemas import EdgeIn, MetricBatch

_NONFINITE = {"NaN": None, "Infinity": math.inf, "-Infinity": -math.inf}


def insert_ignore(session: Session, table: Any, rows: list[dict[str, Any]], keys: list[str]) -> None:
    """``INSERT ... ON CONFLICT (keys) DO NOTHING`` for many rows, on SQLite or PostgreSQL."""
    if not rows:
        return
    if session.get_bind().dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert
    target: Table = table.__table__
    session.connection().execute(insert(target).on_conflict_do_nothing(index_elements=keys), rows)


def cursors(session: Session, node_id: str) -> dict[str, int]:
    """Every stream's cursor of a run or artifact: ``{'metrics/train.jsonl': 12345, ...}``."""
    rows = session.execute(select(Cursor.stream, Cursor.offset).where(Cursor.node_id == node_id)).all()
    return {stream: int(offset) for stream, offset in rows}


def check_start(session: Session, node_id: str, stream: str, start: int, end: int) -> int:
    """The stream's cursor; 409 when ``start`` lies past it (the client skipped a range)."""
    if end < start:
        raise HTTPException(422, f"{stream}: end {end} is before start {start}")
    current = cursors(session, node_id).get(stream, 0)
    if start > current:
        raise HTTPException(
            409, f"{stream}: the server has bytes up to {current}, this range starts at {start}; resend from {current}"
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
    """Insert a batch of points of one type; return the file's new cursor."""
    stream = f"metrics/{batch.type}.jsonl"
    check_start(session, run_id, stream, batch.start, batch.end)
    rows: list[dict[str, Any]] = []
    for point in batch.points:
        common = {"run_pk": run_pk, "type": batch.type, "step": point.step, "epoch": point.epoch, "time": point.time}
        for name, value in point.metrics.items():
            number = _NONFINITE[value] if isinstance(value, str) else float(value)
            if number is not None and math.isnan(number):
                number = None
            rows.append({**common, "name": name, "value": number})
    if len(rows) > max_points:
        raise HTTPException(413, f"{len(rows)} metric values in one request; the server takes at most {max_points}")
    insert_ignore(session, MetricPoint, rows, ["run_pk", "type", "step", "name"])
    return advance(session, run_id, stream, batch.end)


def store_log(session: Session, run_pk: int, run_id: str, start: int, end: int, text: str) -> int:
    """Store the text of bytes ``start``..``end`` of stdout.log; return the new cursor."""
    current = check_start(session, run_id, "stdout.log", start, end)
    if end <= current or not text:
        return current
    if start < current:
        raise HTTPException(
            409, f"stdout.log: the server has bytes up to {current}; send the text from byte {current}, not {start}"
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
    rows = []
    for edge in edges:
        naming.node_id(edge.source.id, "lineage source id")
        naming.node_id(edge.target.id, "lineage target id")
        if node_id not in (edge.source.id, edge.target.id):
            raise HTTPException(422, f"a lineage edge sent for {node_id} must have it as its source or target")
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
    insert_ignore(session, Edge, rows, ["source_id", "target_id"])
    return advance(session, node_id, "lineage.jsonl", end)


def edges_of(session: Session, node_id: str) -> list[dict[str, Any]]:
    """The lineage edges a node takes part in, oldest first."""
    rows = session.scalars(
        select(Edge).where((Edge.source_id == node_id) | (Edge.target_id == node_id)).order_by(Edge.time, Edge.id)
    ).all()
    return [
        {
            "time": e.time,
            "source": {"kind": e.source_kind, "id": e.source_id, "name": e.source_name},
            "target": {"kind": e.target_kind, "id": e.target_id, "name": e.target_name},
        }
        for e in rows
    ]


def encode_value(value: float | None) -> float | str:
    """A stored value as the local store writes it (NaN and infinities as strings)."""
    if value is None:
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value
