"""Lineage: edges between runs and artifacts, stored from a node's ``lineage.jsonl``, read as a viewer may see them.

An edge joins two nodes by their kind and id (``("run", id)``, ``("artifact", id)``); either
end may not be uploaded (yet). A node sends the lines of its own ``lineage.jsonl``
(:func:`store_edges`), and every edge it sends must have that node, of that kind, as one end.

A viewer sees only the edges of a node whose *other* end is a run or artifact they may view
(:func:`edges_of`): an edge written by someone's private run onto yours, or one to a node never
uploaded, is left out, and only counted (``hidden``). So nobody writes into another user's view,
and the graph is no oracle of private nodes or their names. The visible edges are read in SQL,
at most :data:`MAX_EDGES` of them, however many edges name the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, exists, func, literal, or_, select, union_all
from sqlalchemy.orm import Session

from ember.server.services import ingest, listing, naming
from ember.server.storage.domain_errors import Invalid
from ember.server.storage.models import Artifact, Edge, Run, User
from ember.server.storage.schemas import EdgeIn

STREAM = "lineage.jsonl"
MAX_EDGES = 500
"""The most edges of one node answered (the oldest first); ``more`` counts the others."""


@dataclass(frozen=True)
class Lineage:
    """A node's edges as one viewer sees them.

    Attributes:
        edges: ``{"time", "source": {"kind", "id", "name", "visible"}, "target": {...}}``, oldest
            first, at most :data:`MAX_EDGES`.
        hidden: edges whose other end the viewer may not view, or that was never uploaded.
        more: visible edges past :data:`MAX_EDGES`.
    """

    edges: list[dict[str, Any]]
    hidden: int = 0
    more: int = 0


def store_edges(session: Session, kind: str, node_id: str, edges: list[EdgeIn], start: int, end: int) -> int:
    """Insert lineage edges read from a node's ``lineage.jsonl``; each must touch that node (422 otherwise)."""
    ingest.lock_cursor(session, kind, node_id, STREAM)
    ingest.check_start(session, kind, node_id, STREAM, start, end)
    keys = ["source_kind", "source_id", "target_kind", "target_id"]
    ingest.insert_ignore(session, Edge, edge_rows(kind, node_id, edges), keys)
    return ingest.advance(session, kind, node_id, STREAM, end)


def edge_rows(kind: str, node_id: str, edges: list[EdgeIn]) -> list[dict[str, Any]]:
    """The ``lineage`` rows of lines sent for a node (422 for a bad id, or an edge not touching that node)."""
    rows = []
    for edge in edges:
        naming.node_id(edge.source.id, "lineage source id")
        naming.node_id(edge.target.id, "lineage target id")
        if (kind, node_id) not in ((edge.source.kind, edge.source.id), (edge.target.kind, edge.target.id)):
            raise Invalid(f"a lineage edge sent for {kind} {node_id} must have that {kind} as its source or target")
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


def edges_of(session: Session, kind: str, node_id: str, name: str, user: User) -> Lineage:
    """The lineage of a node the caller may view (named ``name``), as they may see it (see the module)."""
    e = Edge
    inputs = select(e.id.label("edge"), e.time, e.source_kind.label("kind"), e.source_id.label("id"))
    outputs = select(e.id.label("edge"), e.time, e.target_kind.label("kind"), e.target_id.label("id"))
    ends = union_all(
        inputs.add_columns(literal("in").label("way")).where(e.target_kind == kind, e.target_id == node_id),
        outputs.add_columns(literal("out").label("way")).where(e.source_kind == kind, e.source_id == node_id),
    ).subquery("ends")
    folders = listing.visible_folders(user)  # a query: no list of ids however many folders one may view
    visible = or_(
        and_(
            ends.c.kind == "run",
            exists().where(Run.id == ends.c.id, listing.visible_condition(session, user, Run, folders)),
        ),
        and_(
            ends.c.kind == "artifact",
            exists().where(Artifact.id == ends.c.id, listing.visible_condition(session, user, Artifact, folders)),
        ),
    )
    total = int(session.scalar(select(func.count()).select_from(ends)) or 0)
    seen = int(session.scalar(select(func.count()).select_from(ends).where(visible)) or 0)
    rows = session.execute(
        select(ends.c.time, ends.c.kind, ends.c.id, ends.c.way)
        .where(visible)
        .order_by(ends.c.time, ends.c.edge, ends.c.way)
        .limit(MAX_EDGES)
    ).all()
    names = _names(session, "run", [r.id for r in rows if r.kind == "run"])
    names.update(_names(session, "artifact", [r.id for r in rows if r.kind == "artifact"]))
    me = {"kind": kind, "id": node_id, "name": name, "visible": True}
    out = []
    for row in rows:
        other = {"kind": row.kind, "id": row.id, "name": names.get((row.kind, row.id), ""), "visible": True}
        source, target = (other, me) if row.way == "in" else (me, other)
        out.append({"time": row.time, "source": source, "target": target})
    return Lineage(out, total - seen, seen - len(out))


def _names(session: Session, kind: str, ids: list[str]) -> dict[tuple[str, str], str]:
    if not ids:
        return {}
    model = Run if kind == "run" else Artifact
    return {(kind, i): n for i, n in session.execute(select(model.id, model.name).where(model.id.in_(set(ids))))}
